package transfer

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/pd"
)

func TestAdvertise(t *testing.T) {
	cases := []struct{ endpoint, host, want string }{
		{"tcp://127.0.0.1:7000", "", ""},
		{"tcp://10.1.2.3:7000", "0.0.0.0", ""},
		{"tcp://0.0.0.0:7000", "decode-1.example", "decode-1.example:7000"},
		{"tcp://[::]:7000", "10.0.0.9", "10.0.0.9:7000"},
	}
	for _, c := range cases {
		if got := advertise(c.endpoint, c.host); got != c.want {
			t.Errorf("advertise(%q, %q) = %q, want %q", c.endpoint, c.host, got, c.want)
		}
	}
	// Wildcard everywhere: some dialable address with the same port.
	if got := advertise("tcp://0.0.0.0:7001", "0.0.0.0"); !strings.HasSuffix(got, ":7001") || strings.HasPrefix(got, "0.0.0.0") {
		t.Errorf("wildcard advertise %q", got)
	}
}

func TestUnknownEngine(t *testing.T) {
	for _, f := range []func() error{
		func() error { _, err := NewReceiver(config.Transfer{Engine: "rdma"}, "", pd.Security{}); return err },
		func() error { _, err := NewSender(config.Transfer{Engine: "rdma"}, nil); return err },
	} {
		err := f()
		var ec interface{ ExitCode() int }
		if err == nil || !strings.Contains(err.Error(), `unknown transfer engine "rdma"`) || !errors.As(err, &ec) || ec.ExitCode() != cliutil.ExitUsage {
			t.Errorf("got %v, want a usage error naming the engine", err)
		}
	}
}

func TestNIXLLibMissing(t *testing.T) {
	_, err := NewSender(config.Transfer{Engine: "nixl", NixlLib: "/nonexistent/libnixl_capi.so"}, nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/libnixl_capi.so") {
		t.Errorf("got %v, want an error naming the library path", err)
	}
}
