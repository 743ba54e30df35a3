package prefillshim

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard/floodtest"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

// Finding: the sidecar adopted a pre-existing staging directory that
// another user had created world-writable. It creates its own 0700 and
// refuses one that is wider, a link, or another user's.
func TestStagingDirPrivate(t *testing.T) {
	root := t.TempDir()
	fresh := filepath.Join(root, "fresh")
	if err := PrivateDir(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(fresh); fi.Mode().Perm() != 0o700 {
		t.Fatalf("created with mode %v", fi.Mode().Perm())
	}
	if err := PrivateDir(fresh); err != nil {
		t.Fatalf("its own dir again: %v", err)
	}
	wide := filepath.Join(root, "wide")
	_ = os.Mkdir(wide, 0o777)
	_ = os.Chmod(wide, 0o777)
	if err := PrivateDir(wide); err == nil || !strings.Contains(err.Error(), "wider than 0700") {
		t.Fatalf("world-writable dir: %v", err)
	}
	link := filepath.Join(root, "link")
	_ = os.Symlink(fresh, link)
	if err := PrivateDir(link); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("symlink: %v", err)
	}
	if os.Getuid() == 0 {
		theirs := filepath.Join(root, "theirs")
		_ = os.Mkdir(theirs, 0o700)
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := PrivateDir(theirs); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Fatalf("another user's dir: %v", err)
		}
	}
	// Run refuses to start on a planted staging dir.
	cfg := config.Default()
	cfg.Sidecar.Socket = filepath.Join(root, "planted.sock")
	cfg.Sidecar.MetricsPort = 0
	planted := StagingDirFor(cfg.Sidecar.Socket)
	_ = os.RemoveAll(planted)
	if err := os.Mkdir(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(planted, 0o777)
	defer os.RemoveAll(planted)
	if err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "wider than 0700") {
		t.Fatalf("Run on a planted staging dir: %v", err)
	}
}

// Finding: the metrics listener always bound all interfaces. Without a
// secret it binds loopback; sidecar.metrics_host picks another.
func TestMetricsBindsLoopback(t *testing.T) {
	root, _ := os.MkdirTemp("", "tsm")
	defer os.RemoveAll(root)
	cfg := config.Default()
	cfg.Sidecar.Socket = filepath.Join(root, "m.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	cfg.Sidecar.MetricsPort = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ctx, stop := context.WithCancel(context.Background())
	readyc := make(chan Ready, 1)
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, cfg, func(r Ready) { readyc <- r }) }()
	select {
	case r := <-readyc:
		defer os.RemoveAll(r.StagingDir)
		if !strings.HasPrefix(r.Metrics, "127.0.0.1:") {
			t.Errorf("metrics listen on %s, want loopback", r.Metrics)
		}
	case err := <-errc:
		t.Fatal(err)
	}
	stop()
	<-errc
}

// A bounded flood on the plugin socket: half-open connections, slowloris
// frames and half-sent 16 MiB frames. The plugin is served throughout,
// memory stays small, every flooding connection is cut within the
// deadlines, and connections past max_conns are closed at once.
func TestSocketFloodsBounded(t *testing.T) {
	h := newHarness(t, Options{Socket: pd.Security{ReadTimeout: time.Second, IdleTimeout: 1500 * time.Millisecond, MaxConns: 91}})
	before := floodtest.HeapInUse()
	var conns []net.Conn
	tr := floodtest.NewTrickler()
	for i := range 90 {
		c, err := net.Dial("unix", h.socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 1:
			tr.Start(c, []byte{0}, true)
		case 2:
			_, _ = c.Write(append(binary.BigEndian.AppendUint32(nil, pd.MaxFrame), `{"type":"stage","rid":"`...))
		}
	}
	p := h.dialPlugin(t) // the 91st: within the cap
	if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["type"] != TypeHello {
		t.Fatalf("plugin during the flood: %v", hello)
	}
	defer func() {
		// The plugin's connection outlives the flood and the idle timeout:
		// once it has spoken it may wait as long as vLLM does.
		time.Sleep(1600 * time.Millisecond)
		if hello := p.roundTrip(map[string]any{"type": "hello"}); hello["type"] != TypeHello {
			t.Fatalf("plugin after the flood: %v", hello)
		}
	}()
	for deadline := time.Now().Add(time.Second); h.s.guard.Load().Open() < 91; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections held, want 91", h.s.guard.Load().Open())
		}
	}
	extra, err := net.Dial("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	// Closed at once, long before the 1.5 s idle timeout would close it.
	_ = extra.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := extra.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("connection past max_conns: %d %v, want closed", n, err)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection past max_conns still open")
	}
	floodtest.HeapBounded(t, len(conns), before, floodtest.HeapInUse(), 32<<20)
	floodtest.AllClosed(t, conns, 5*time.Second)
	tr.Stop()
}

// With a secret, the sidecar authenticates to the node's ctrl port and
// transfer streams and the state arrives; a sidecar with another secret is
// refused (connect_failed) and nothing of its state is decodable.
func TestShipWithSecret(t *testing.T) {
	dir := t.TempDir()
	secret := []byte("a-shared-secret-of-32-bytes-long")
	sf := filepath.Join(dir, "secret")
	if err := os.WriteFile(sf, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	a := nodeWith(t, 1, sf)
	token := auth.DerivedToken(secret)
	pf := prefill(t, []int{5, 17, 300, 42, 9, 77}, 8)

	wrong := []byte("not-the-secret-but-32-bytes-long")
	trw, _ := rdma.NewTCP(rdma.TCPConfig{Secret: wrong})
	defer trw.Close()
	hw := newHarness(t, Options{Secret: wrong, Transfer: trw})
	pw := hw.dialPlugin(t)
	if rep := pw.roundTrip(hw.stage(t, pf, "w-1", a)); rep["type"] != TypeQueued {
		t.Fatalf("stage: %v", rep)
	}
	hw.waitOutcome(t, OutcomeConnectFailed, 1)
	// The outcome is counted just before its log line is written.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(hw.logs(), "authentication"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the refusal does not say why:\n%s", hw.logs())
		}
	}

	tr, _ := rdma.NewTCP(rdma.TCPConfig{Secret: secret})
	defer tr.Close()
	h := newHarness(t, Options{Secret: secret, Transfer: tr})
	p := h.dialPlugin(t)
	if rep := p.roundTrip(h.stage(t, pf, "s-1", a)); rep["type"] != TypeQueued {
		t.Fatalf("stage: %v", rep)
	}
	got, done := decodeStreamAs(t, a.HTTP, token, "s-1", pf.first, 8)
	if !slices.Equal(got, pf.want) || done.Finish != "length" {
		t.Fatalf("decoded %v, want %v", got, pf.want)
	}
	h.waitOutcome(t, OutcomeOK, 1)
}
