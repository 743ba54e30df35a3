package pd

import (
	"bytes"
	"os"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma/nixl"
)

// The same handoff over NIXL (UCX over loopback TCP): accept carries each
// region's registration metadata, the sender loads it and writes.
func TestHandoffOverNIXL(t *testing.T) {
	if os.Getenv("UCX_TLS") == "" {
		if err := nixl.Setenv("UCX_TLS", "tcp"); err != nil {
			t.Fatal(err)
		}
	}
	recv, err := nixl.New(nixl.Config{Name: "pd-test-decode"})
	if errors.Is(err, nixl.ErrUnavailable) {
		t.Skipf("NIXL C API not available: %v", err)
	}
	if err != nil {
		t.Skipf("NIXL installed (%s) but its UCX backend did not start here (NIXL issue #838?): %v", nixl.LibraryPath(), err)
	}
	send, err := nixl.New(nixl.Config{Name: "pd-test-prefill"})
	if err != nil {
		_ = recv.Close()
		t.Fatal(err)
	}
	r := newRigWith(t, 1, recv, nil)
	s := newSenderWith(t, r, send, 11)
	if s.c.Hello().Transport.Kind != "nixl" {
		t.Fatalf("hello transport %+v", s.c.Hello().Transport)
	}
	for i, rid := range []string{"n1", "n2", "n3"} { // the slot is re-registered per accept
		a := s.admit(rid, 16+i*8)
		ack, err := s.c.Send(ctxT(t), a, s.sources(a))
		if err != nil {
			t.Fatal(err)
		}
		rd, err := r.table.WaitReady(ctxT(t), rid)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Generation != ack.Generation {
			t.Fatalf("ready gen %d, ack gen %d", rd.Generation, ack.Generation)
		}
		mla, idx := r.landed(t, rd)
		if !bytes.Equal(mla, s.mla[:len(mla)]) || !bytes.Equal(idx, s.idx[:len(idx)]) {
			t.Fatalf("%s: landed state differs", rid)
		}
		if err := r.table.Release(rd.Slot, rd.Generation); err != nil {
			t.Fatal(err)
		}
	}
}
