package nixl

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

// newEngine skips the test, saying exactly why, where NIXL cannot run.
func newEngine(t *testing.T, name string) *Engine {
	t.Helper()
	if os.Getenv("UCX_TLS") == "" {
		// Loopback TCP only: no RDMA NIC or GPU needed.
		if err := Setenv("UCX_TLS", "tcp"); err != nil {
			t.Fatal(err)
		}
	}
	e, err := New(Config{Name: name})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("NIXL C API not available (%v); install it with `pip install --no-deps nixl-cu12` or set %s", err, libEnvVar)
	}
	if err != nil {
		t.Skipf("NIXL is installed (%s) but its UCX backend did not start on this machine "+
			"(NIXL issue #838: the wheel's UCX may need a GPU driver): %v", LibraryPath(), err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func mmap(t *testing.T, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}

func TestNIXLWriteOverUCXTCP(t *testing.T) {
	recv := newEngine(t, "tilert-test-recv")
	send := newEngine(t, "tilert-test-send")
	t.Logf("library %s, UCX_TLS=%s", LibraryPath(), os.Getenv("UCX_TLS"))

	const size = 4 << 20
	src, dst := mmap(t, size), mmap(t, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	if err := send.Register(rdma.Region{ID: 1, Host: src}); err != nil {
		t.Fatal(err)
	}
	if err := recv.Register(rdma.Region{ID: 7, Host: dst}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	peer, err := send.Connect(ctx, recv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	for gen := uint64(1); gen <= 3; gen++ { // a slot's cycle: open, write, revoke
		rem, err := recv.Open(7, 1000+gen)
		if err != nil {
			t.Fatal(err)
		}
		if len(rem.Meta) == 0 || rem.Addr == 0 {
			t.Fatalf("open returned no metadata/address: %+v", rem)
		}
		clear(dst)
		ops := []rdma.WriteOp{
			{Local: 1, LocalOff: 0, Remote: rem, RemoteOff: 0, Len: 1 << 20},
			{Local: 1, LocalOff: 3 << 20, Remote: rem, RemoteOff: 2<<20 + 17, Len: 1<<20 - 17},
		}
		if err := peer.Write(ctx, ops); err != nil {
			t.Fatalf("gen %d: %v", gen, err)
		}
		if !bytes.Equal(dst[:1<<20], src[:1<<20]) || !bytes.Equal(dst[2<<20+17:3<<20], src[3<<20:4<<20-17]) {
			t.Fatalf("gen %d: written bytes differ", gen)
		}
		if dst[1<<20] != 0 || dst[2<<20+16] != 0 {
			t.Fatalf("gen %d: bytes outside the writes changed", gen)
		}
		// The notification arrives and names this generation's key.
		var got map[rdma.RegionID]uint64
		for deadline := time.Now().Add(30 * time.Second); got == nil && time.Now().Before(deadline); {
			ns, err := recv.Notifs()
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if n.Agent != send.Name() {
					t.Fatalf("notification from %q, want %q", n.Agent, send.Name())
				}
				if got, err = ParseNotif(n.Msg); err != nil {
					t.Fatal(err)
				}
			}
			if got == nil {
				time.Sleep(time.Millisecond)
			}
		}
		if got[7] != 1000+gen {
			t.Fatalf("gen %d: notification keys %v", gen, got)
		}
		if err := recv.Revoke(7); err != nil {
			t.Fatal(err)
		}
	}
	// Range checks happen before anything is posted.
	rem := rdma.Remote{ID: 7, Key: 1, Len: size}
	if err := peer.Write(ctx, []rdma.WriteOp{{Local: 1, LocalOff: size - 10, Remote: rem, Len: 20}}); err == nil {
		t.Fatal("local out-of-range write accepted")
	}
	if err := peer.Write(ctx, []rdma.WriteOp{{Local: 1, Remote: rem, RemoteOff: size - 10, Len: 20}}); err == nil {
		t.Fatal("remote out-of-range write accepted")
	}
}

func TestNIXLUnavailableLibrary(t *testing.T) {
	t.Setenv(libEnvVar, "/nonexistent/libnixl_capi.so")
	if _, err := FindLibrary(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("want ErrUnavailable, got %v", err)
	}
}

func TestParseNotif(t *testing.T) {
	cases := []struct {
		in   string
		want map[rdma.RegionID]uint64
		ok   bool
	}{
		{"tilert:7:99", map[rdma.RegionID]uint64{7: 99}, true},
		{"tilert:1:2:3:4", map[rdma.RegionID]uint64{1: 2, 3: 4}, true},
		{"tilert:1", nil, false},
		{"other:1:2", nil, false},
		{"tilert:x:2", nil, false},
	}
	for _, tc := range cases {
		got, err := ParseNotif([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Fatalf("%q: err %v", tc.in, err)
		}
		if tc.ok && len(got) != len(tc.want) {
			t.Fatalf("%q: %v", tc.in, got)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Fatalf("%q: %v", tc.in, got)
			}
		}
	}
}

// BenchmarkNIXLWrite measures one 64 MiB WRITE over UCX (UCX_TLS=tcp
// unless set) between two agents in this process.
func BenchmarkNIXLWrite(b *testing.B) {
	if os.Getenv("UCX_TLS") == "" {
		if err := Setenv("UCX_TLS", "tcp"); err != nil {
			b.Fatal(err)
		}
	}
	recv, err := New(Config{Name: "bench-recv"})
	if err != nil {
		b.Skipf("NIXL not usable here: %v", err)
	}
	defer recv.Close()
	send, err := New(Config{Name: "bench-send"})
	if err != nil {
		b.Fatal(err)
	}
	defer send.Close()
	const size = 64 << 20
	src, _ := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	dst, _ := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	defer syscall.Munmap(src)
	defer syscall.Munmap(dst)
	if err := send.Register(rdma.Region{ID: 1, Host: src}); err != nil {
		b.Fatal(err)
	}
	if err := recv.Register(rdma.Region{ID: 2, Host: dst}); err != nil {
		b.Fatal(err)
	}
	rem, err := recv.Open(2, 1)
	if err != nil {
		b.Fatal(err)
	}
	peer, err := send.Connect(context.Background(), recv.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	ops := []rdma.WriteOp{{Local: 1, Remote: rem, Len: size}}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if err := peer.Write(context.Background(), ops); err != nil {
			b.Fatal(err)
		}
	}
}
