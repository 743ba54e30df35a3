package rdma

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// hostAsDevice is a DeviceReader whose "device memory" is ordinary host
// memory at the same addresses: it checks the engine's chunking,
// coalescing and pipelining, not a GPU (gpu-check does that on the H200).
type hostAsDevice struct {
	mem     []byte // the "device" memory; addresses are its own
	mu      sync.Mutex
	gathers int
	segs    int
	bufs    int
	fail    bool
}

func (h *hostAsDevice) HostBuffer(n int) ([]byte, error) {
	h.mu.Lock()
	h.bufs++
	h.mu.Unlock()
	return make([]byte, n), nil
}

func (h *hostAsDevice) FreeHostBuffer([]byte) error { return nil }

func (h *hostAsDevice) Gather(device int, dst []byte, segs []DeviceSeg) error {
	h.mu.Lock()
	h.gathers++
	h.segs += len(segs)
	fail := h.fail
	h.mu.Unlock()
	if fail {
		return errors.New("test: device read failed")
	}
	base := uintptr(unsafe.Pointer(&h.mem[0]))
	at := 0
	for _, s := range segs {
		off := int64(s.Addr - base)
		if s.Addr < base || off+s.Len > int64(len(h.mem)) {
			return errors.Newf("segment %#x+%d outside the device memory", s.Addr, s.Len)
		}
		at += copy(dst[at:], h.mem[off:off+s.Len])
	}
	if at != len(dst) {
		return errors.Newf("segments hold %d bytes, dst %d", at, len(dst))
	}
	return nil
}

// TestTCPDeviceSource sends scattered blocks of a "device" region (as the
// sidecar does from vLLM's paged cache) and checks every byte lands where
// its op says, for chunk sizes that cut pieces and blocks anywhere.
func TestTCPDeviceSource(t *testing.T) {
	for _, tc := range []struct {
		name    string
		staging int64
		piece   int64
	}{
		{"default", 0, 0},
		{"chunk cuts blocks", 10_000, 4096},
		{"tiny pieces", 1 << 16, 999},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(tc.staging)))
			const blocks, blockBytes = 64, 41984 // 64 tokens x 656 bytes
			cache := randBytes(rng, blocks*blockBytes)
			dev := &hostAsDevice{mem: cache}
			cfg := TCPConfig{Streams: 3, DeviceReader: dev, DeviceStagingBytes: tc.staging, PieceBytes: tc.piece}
			send, recv, peer := newPair(t, cfg)
			if err := send.Register(Region{ID: 1, Kind: DeviceMem, Addr: uintptr(unsafe.Pointer(&cache[0])), Len: int64(len(cache))}); err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, 40*blockBytes)
			if err := recv.Register(Region{ID: 9, Host: dst}); err != nil {
				t.Fatal(err)
			}
			rem, err := recv.Open(9, 77)
			if err != nil {
				t.Fatal(err)
			}
			// A block table: some runs of neighbours (coalesced), the rest scattered.
			ids := append([]int{5, 6, 7, 8}, rng.Perm(blocks)[:36]...)
			var ops []WriteOp
			want := make([]byte, len(dst))
			for i, b := range ids {
				ops = append(ops, WriteOp{Local: 1, LocalOff: int64(b * blockBytes), Remote: rem, RemoteOff: int64(i * blockBytes), Len: blockBytes})
				copy(want[i*blockBytes:], cache[b*blockBytes:(b+1)*blockBytes])
			}
			if err := peer.Write(context.Background(), ops); err != nil {
				t.Fatal(err)
			}
			if got := snapshot(t, recv, 9, 77, dst); !bytes.Equal(got, want) {
				t.Fatal("device-sourced bytes differ from the blocks the ops name")
			}
			if dev.gathers == 0 {
				t.Fatal("no Gather: the device region was not read through the reader")
			}
			if dev.segs >= len(ids)+dev.gathers {
				t.Errorf("%d segments for %d blocks in %d gathers: adjacent blocks 5..8 did not coalesce", dev.segs, len(ids), dev.gathers)
			}
		})
	}
}

func TestTCPDeviceSourceErrors(t *testing.T) {
	// Without a reader, device memory is refused at Register, saying what to do.
	e, err := NewTCP(TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	buf := make([]byte, 64)
	if err := e.Register(Region{ID: 1, Kind: DeviceMem, Addr: uintptr(unsafe.Pointer(&buf[0])), Len: 64}); err == nil {
		t.Fatal("device region registered without a DeviceReader")
	}

	// A failing device read fails the write and leaves the engine usable.
	src := make([]byte, 1<<20)
	dev := &hostAsDevice{mem: src, fail: true}
	send, recv, peer := newPair(t, TCPConfig{DeviceReader: dev})
	if err := send.Register(Region{ID: 1, Kind: DeviceMem, Addr: uintptr(unsafe.Pointer(&src[0])), Len: int64(len(src))}); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 1<<20)
	if err := recv.Register(Region{ID: 2, Host: dst}); err != nil {
		t.Fatal(err)
	}
	rem, _ := recv.Open(2, 5)
	op := []WriteOp{{Local: 1, Remote: rem, Len: 1 << 20}}
	if err := peer.Write(context.Background(), op); err == nil {
		t.Fatal("write succeeded though the device read failed")
	}
	dev.mu.Lock()
	dev.fail = false
	dev.mu.Unlock()
	for i := range src {
		src[i] = byte(i * 7)
	}
	if err := peer.Write(context.Background(), op); err != nil {
		t.Fatalf("write after a failed device read: %v", err)
	}
	if got := snapshot(t, recv, 2, 5, dst); !bytes.Equal(got, src) {
		t.Fatal("bytes differ after retry")
	}
}
