package cuda

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/errors"
)

// TestGatherDtoH reads random spans of device memory back to back (the
// connector sidecar's zero-copy reads) and checks them against the bytes
// uploaded; then exports the allocation as an IPC handle (opening it needs
// another process: roles/prefillshim's GPU test does that with PyTorch).
func TestGatherDtoH(t *testing.T) {
	d := openTestDevice(t)
	rng := rand.New(rand.NewPCG(11, 12))
	src := make([]byte, 3<<20)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	err := d.Do(func(c *Ctx) error {
		p, err := c.memAlloc(int64(len(src)))
		if err != nil {
			return err
		}
		defer c.memFree(p)
		if err := c.Upload(p, src); err != nil {
			return err
		}
		var srcs []DevPtr
		var lens []int64
		var want []byte
		for i := 0; i < 200; i++ {
			off := rng.IntN(len(src) - 50000)
			n := rng.IntN(50000) + 1
			srcs, lens = append(srcs, p.Add(int64(off))), append(lens, int64(n))
			want = append(want, src[off:off+n]...)
		}
		hb, err := c.HostAlloc(len(want))
		if err != nil {
			return err
		}
		defer c.FreeHost(hb)
		if err := c.GatherDtoH(hb.Bytes, srcs, lens); err != nil {
			return err
		}
		if !bytes.Equal(hb.Bytes, want) {
			return errors.New("gathered bytes differ from the spans uploaded")
		}
		if err := c.GatherDtoH(hb.Bytes[:10], srcs[:1], []int64{11}); err == nil {
			return errors.New("a span past the destination was accepted")
		}
		h, err := c.IpcGetMemHandle(p)
		if err != nil {
			return err
		}
		if h == (IpcMemHandle{}) {
			return errors.New("empty IPC handle")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
