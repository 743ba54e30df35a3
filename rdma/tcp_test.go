package rdma

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
)

func newPair(t testing.TB, cfg TCPConfig) (send, recv *TCPEngine, peer Peer) {
	t.Helper()
	rc := cfg
	rc.Listen = "127.0.0.1:0"
	recv, err := NewTCP(rc)
	if err != nil {
		t.Fatal(err)
	}
	send, err = NewTCP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	peer, err = send.Connect(context.Background(), recv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = peer.Close()
		_ = send.Close()
		_ = recv.Close()
	})
	return send, recv, peer
}

// snapshot copies a receive region between Revoke and a fresh Open, the way
// an owner reads it: Revoke orders every completed write before the read,
// Open orders the read before later writes (the race detector cannot see
// the ordering through the socket, only through these locks).
func snapshot(t testing.TB, e Engine, id RegionID, key uint64, mem []byte) []byte {
	t.Helper()
	if err := e.Revoke(id); err != nil {
		t.Fatal(err)
	}
	out := bytes.Clone(mem)
	if _, err := e.Open(id, key); err != nil {
		t.Fatal(err)
	}
	return out
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestTCPIntegrityRandom(t *testing.T) {
	cases := []struct {
		name string
		cfg  TCPConfig
	}{
		{"defaults", TCPConfig{}},
		{"one stream small pieces", TCPConfig{Streams: 1, PieceBytes: 4099, ChunkBytes: 1021, Window: 2}},
		{"many streams", TCPConfig{Streams: 8, PieceBytes: 4096, ChunkBytes: 1000}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			send, recv, peer := newPair(t, tc.cfg)
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			src := randBytes(rng, 1<<20)
			dst := make([]byte, 1<<20)
			want := make([]byte, len(dst))
			if err := send.Register(Region{ID: 1, Host: src}); err != nil {
				t.Fatal(err)
			}
			if err := recv.Register(Region{ID: 9, Host: dst}); err != nil {
				t.Fatal(err)
			}
			rem, err := recv.Open(9, 42)
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 20; round++ {
				var ops []WriteOp
				for k := rng.IntN(5) + 1; k > 0; {
					n := rng.Int64N(200_000) + 1
					lo := rng.Int64N(int64(len(src)) - n + 1)
					ro := rng.Int64N(int64(len(dst)) - n + 1)
					// Pieces of overlapping ops may land in any order, so keep
					// destinations disjoint within one batch.
					cand := append(ops, WriteOp{Local: 1, LocalOff: lo, Remote: rem, RemoteOff: ro, Len: n})
					if overlapFree(cand) {
						ops = cand
						k--
					}
				}
				if err := peer.Write(context.Background(), ops); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				for _, op := range ops {
					copy(want[op.RemoteOff:], src[op.LocalOff:op.LocalOff+op.Len])
				}
				if !bytes.Equal(snapshot(t, recv, 9, 42, dst), want) {
					t.Fatalf("round %d: destination differs from what was written", round)
				}
			}
		})
	}
}

func overlapFree(ops []WriteOp) bool {
	for i := range ops {
		for j := i + 1; j < len(ops); j++ {
			a, b := ops[i], ops[j]
			if a.RemoteOff < b.RemoteOff+b.Len && b.RemoteOff < a.RemoteOff+a.Len {
				return false
			}
		}
	}
	return true
}

func TestTCPConcurrentWritersDifferentRegions(t *testing.T) {
	send, recv, peer := newPair(t, TCPConfig{Streams: 3, PieceBytes: 10_000})
	const writers = 8
	const size = 300_000
	srcs := make([][]byte, writers)
	dsts := make([][]byte, writers)
	rems := make([]Remote, writers)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range writers {
		srcs[i] = randBytes(rng, size)
		dsts[i] = make([]byte, size)
		if err := send.Register(Region{ID: RegionID(100 + i), Host: srcs[i]}); err != nil {
			t.Fatal(err)
		}
		if err := recv.Register(Region{ID: RegionID(200 + i), Host: dsts[i]}); err != nil {
			t.Fatal(err)
		}
		var err error
		if rems[i], err = recv.Open(RegionID(200+i), uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Go(func() {
			// Several ops per writer in mixed order.
			for _, part := range [][2]int64{{200_000, 100_000}, {0, 150_000}, {150_000, 50_000}} {
				op := WriteOp{Local: RegionID(100 + i), LocalOff: part[0], Remote: rems[i], RemoteOff: part[0], Len: part[1]}
				if err := peer.Write(context.Background(), []WriteOp{op}); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range writers {
		if errs[i] != nil {
			t.Fatalf("writer %d: %v", i, errs[i])
		}
		if !bytes.Equal(srcs[i], snapshot(t, recv, RegionID(200+i), uint64(i+1), dsts[i])) {
			t.Fatalf("writer %d: region content differs", i)
		}
	}
}

func TestTCPRefusals(t *testing.T) {
	send, recv, peer := newPair(t, TCPConfig{Streams: 2, PieceBytes: 64, ChunkBytes: 16})
	src := bytes.Repeat([]byte{0xAB}, 1000)
	dst := make([]byte, 1000)
	if err := send.Register(Region{ID: 1, Host: src}); err != nil {
		t.Fatal(err)
	}
	if err := recv.Register(Region{ID: 2, Host: dst}); err != nil {
		t.Fatal(err)
	}
	open, err := recv.Open(2, 5)
	if err != nil {
		t.Fatal(err)
	}
	stale := open
	stale.Key = 4
	unknown := open
	unknown.ID = 77
	bigger := open
	bigger.Len = 5000 // lies about the size; the receiver checks its own
	cases := []struct {
		name   string
		rem    Remote
		off, n int64
	}{
		{"stale key", stale, 0, 500},
		{"unknown region", unknown, 0, 500},
		{"out of bounds at receiver", bigger, 1200, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := peer.Write(context.Background(), []WriteOp{{Local: 1, Remote: tc.rem, RemoteOff: tc.off, Len: tc.n}})
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("want ErrRefused, got %v", err)
			}
			if !bytes.Equal(snapshot(t, recv, 2, 5, dst), make([]byte, 1000)) {
				t.Fatal("a refused write changed the region")
			}
		})
	}
	// The streams stayed in sync: a good write still works.
	if err := peer.Write(context.Background(), []WriteOp{{Local: 1, Remote: open, Len: 1000}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapshot(t, recv, 2, 5, dst), src) {
		t.Fatal("good write after refusals did not land")
	}
	// Revoked: refused and nothing changes.
	if err := recv.Revoke(2); err != nil {
		t.Fatal(err)
	}
	clear(dst)
	if err := peer.Write(context.Background(), []WriteOp{{Local: 1, Remote: open, Len: 1000}}); !errors.Is(err, ErrRefused) {
		t.Fatalf("write after revoke: want ErrRefused, got %v", err)
	}
	if !bytes.Equal(dst, make([]byte, 1000)) {
		t.Fatal("write after revoke changed the region")
	}
	// Sender-side range checks.
	if err := peer.Write(context.Background(), []WriteOp{{Local: 1, LocalOff: 990, Remote: open, Len: 20}}); err == nil {
		t.Fatal("local out-of-range write accepted")
	}
	if err := peer.Write(context.Background(), []WriteOp{{Local: 3, Remote: open, Len: 1}}); err == nil {
		t.Fatal("write from unregistered local region accepted")
	}
}

func TestTCPRegisterErrors(t *testing.T) {
	e, err := NewTCP(TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cases := []struct {
		name string
		r    Region
	}{
		{"empty host", Region{ID: 1}},
		{"device", Region{ID: 2, Kind: DeviceMem, Addr: 0x1000, Len: 10}},
		{"bad kind", Region{ID: 3, Kind: "disk", Host: []byte{1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Register(tc.r); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if err := e.Register(Region{ID: 4, Host: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Register(Region{ID: 4, Host: []byte{1}}); err == nil {
		t.Fatal("duplicate id accepted")
	}
	if _, err := e.Open(4, 0); err == nil {
		t.Fatal("key 0 accepted")
	}
	if _, err := e.Connect(context.Background(), "nixl://x"); err == nil {
		t.Fatal("foreign endpoint accepted")
	}
}

// A stream that dies mid-payload leaves the receiver healthy.
func TestTCPGarbageStream(t *testing.T) {
	send, recv, peer := newPair(t, TCPConfig{Streams: 1})
	src := bytes.Repeat([]byte{1}, 100)
	dst := make([]byte, 100)
	_ = send.Register(Region{ID: 1, Host: src})
	_ = recv.Register(Region{ID: 2, Host: dst})
	rem, _ := recv.Open(2, 9)
	addr := recv.Endpoint()[len("tcp://"):]
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), append([]byte(tcpMagic), 1, 2, 3)} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(junk)
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, c) // the receiver closes it
		_ = c.Close()
	}
	if err := peer.Write(context.Background(), []WriteOp{{Local: 1, Remote: rem, Len: 100}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snapshot(t, recv, 2, 9, dst), src) {
		t.Fatal("write after garbage streams did not land")
	}
}

const benchSize = 64 << 20

// BenchmarkTransfer compares the engine with a plain socket copy of the same
// bytes over loopback in the same run.
func BenchmarkTransfer(b *testing.B) {
	b.Run("plain-socket", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		dst := make([]byte, benchSize)
		done := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			var ack [1]byte
			for {
				if _, err := io.ReadFull(c, dst); err != nil {
					done <- nil
					return
				}
				if _, err := c.Write(ack[:]); err != nil {
					done <- err
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		src := make([]byte, benchSize)
		var ack [1]byte
		b.SetBytes(benchSize)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := c.Write(src); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, ack[:]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		_ = c.Close()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	})
	for _, streams := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("tcp-engine/streams=%d", streams), func(b *testing.B) {
			send, recv, peer := newPair(b, TCPConfig{Streams: streams})
			src := make([]byte, benchSize)
			dst := make([]byte, benchSize)
			_ = send.Register(Region{ID: 1, Host: src})
			_ = recv.Register(Region{ID: 2, Host: dst})
			rem, _ := recv.Open(2, 1)
			ops := []WriteOp{{Local: 1, Remote: rem, Len: benchSize}}
			b.SetBytes(benchSize)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := peer.Write(context.Background(), ops); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
