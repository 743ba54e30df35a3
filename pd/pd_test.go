package pd

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/rdma"
)

var testLayout = Layout{Model: "tiny", LayoutVersion: 1, KVCacheDType: "fp8_ds_mla", NumLayers: 2}

const (
	capMLA = 4096
	capIdx = 1024
)

type fakeTimer struct {
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

// fakeClock fires deadlines only when the test says so.
type fakeClock struct {
	mu     sync.Mutex
	timers []*fakeTimer
}

func (c *fakeClock) AfterFunc(_ time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{f: f}
	c.timers = append(c.timers, t)
	return t
}

// fire runs every pending deadline, as if all of them had passed.
func (c *fakeClock) fire() {
	c.mu.Lock()
	ts := c.timers
	c.timers = nil
	c.mu.Unlock()
	for _, t := range ts {
		if !t.stopped {
			t.stopped = true
			t.f()
		}
	}
}

type rig struct {
	recv    rdma.Engine
	regions *EngineReceiver
	table   *Table
	srv     *Server
	addr    string
	clock   *fakeClock
}

func newRig(t *testing.T, slots int, tweak func(*TableConfig)) *rig {
	t.Helper()
	recv, err := rdma.NewTCP(rdma.TCPConfig{Listen: "127.0.0.1:0", Streams: 2, PieceBytes: 512, ChunkBytes: 256})
	if err != nil {
		t.Fatal(err)
	}
	return newRigWith(t, slots, recv, tweak)
}

func newRigWith(t *testing.T, slots int, recv rdma.Engine, tweak func(*TableConfig)) *rig {
	t.Helper()
	return newRigSec(t, slots, recv, Security{}, tweak)
}

func newRigSec(t *testing.T, slots int, recv rdma.Engine, sec Security, tweak func(*TableConfig)) *rig {
	t.Helper()
	var sr [][]SlotRegion
	for i := range slots {
		sr = append(sr, []SlotRegion{
			{Name: "mla", Region: rdma.Region{ID: rdma.RegionID(100 + 2*i), Host: make([]byte, capMLA)}},
			{Name: "idx", Region: rdma.Region{ID: rdma.RegionID(101 + 2*i), Host: make([]byte, capIdx)}},
		})
	}
	regs, err := NewEngineReceiver(recv, sr)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	cfg := TableConfig{Slots: slots, Layout: testLayout, MaxSeqLen: 64, Regions: regs.Caps(), Clock: clock}
	if tweak != nil {
		tweak(&cfg)
	}
	table, err := NewTable(cfg, regs)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(table, Transport{Kind: recv.Kind(), Endpoint: recv.Endpoint()}, slog.New(slog.DiscardHandler), sec)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = recv.Close()
	})
	return &rig{recv: recv, regions: regs, table: table, srv: srv, addr: ln.Addr().String(), clock: clock}
}

// rawStream opens a transfer data stream by hand: magic, then the proof of
// secret for session (the tcp engine's handshake, docs/PROTOCOL.md §5).
func rawStream(t *testing.T, endpoint string, secret []byte, session string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write([]byte("TLRTWR02")); err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 32)
	if _, err := io.ReadFull(c, nonce); err != nil {
		t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint16(nil, uint16(len(session)))
	msg = append(msg, session...)
	msg = append(msg, auth.MAC(secret, "tilert-tcp v2 stream", nonce, []byte(session))...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil || st[0] != 0 {
		t.Fatalf("handshake refused: %v %v", st, err)
	}
	return c
}

// sender is a prefill side: its own engine, registered state, a ctrl client.
type sender struct {
	eng rdma.Engine
	c   *Client
	mla []byte
	idx []byte
	rng *rand.Rand
}

func newSender(t *testing.T, r *rig, seed uint64) *sender {
	t.Helper()
	eng, err := rdma.NewTCP(rdma.TCPConfig{Streams: 2, PieceBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	return newSenderWith(t, r, eng, seed)
}

func newSenderWith(t *testing.T, r *rig, eng rdma.Engine, seed uint64, opts ...DialOption) *sender {
	t.Helper()
	var err error
	s := &sender{eng: eng, mla: make([]byte, capMLA), idx: make([]byte, capIdx), rng: rand.New(rand.NewPCG(seed, seed))}
	for i := range s.mla {
		s.mla[i] = byte(s.rng.Uint32())
	}
	for i := range s.idx {
		s.idx[i] = byte(s.rng.Uint32())
	}
	if err := eng.Register(rdma.Region{ID: 1, Host: s.mla}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Register(rdma.Region{ID: 2, Host: s.idx}); err != nil {
		t.Fatal(err)
	}
	s.c, err = Dial(context.Background(), r.addr, eng, testLayout, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.c.Close()
		_ = eng.Close()
	})
	return s
}

func (s *sender) admit(rid string, seqLen int) *Admit {
	return &Admit{RID: rid, SeqLen: seqLen, LastPromptToken: 7,
		Regions: []RegionSize{{"mla", int64(seqLen) * 64}, {"idx", int64(seqLen) * 16}}}
}

func (s *sender) sources(a *Admit) []Source {
	return []Source{
		{Name: "mla", Region: 1, Host: s.mla[:a.Regions[0].Bytes]},
		{Name: "idx", Region: 2, Host: s.idx[:a.Regions[1].Bytes]},
	}
}

// landed reads a ready slot's bytes as the engine would.
func (r *rig) landed(t *testing.T, rd *Ready) (mla, idx []byte) {
	t.Helper()
	m, _ := r.regions.Region(rd.Slot, "mla")
	x, _ := r.regions.Region(rd.Slot, "idx")
	return m.Host[:rd.Regions[0].Bytes], x.Host[:rd.Regions[1].Bytes]
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestHandoffAndWaitReady(t *testing.T) {
	r := newRig(t, 2, nil)
	s := newSender(t, r, 1)
	h := s.c.Hello()
	if h.Magic != Magic || h.Slots != 2 || h.Transport.Kind != "tcp" || h.Layout() != testLayout || len(h.Regions) != 2 {
		t.Fatalf("hello: %+v", h)
	}
	for round := range 3 { // slots are reused with fresh generations
		rid := fmt.Sprintf("req-%d", round)
		got := make(chan *Ready, 1)
		go func() { // /pd/decode may arrive before the state
			rd, err := r.table.WaitReady(ctxT(t), rid)
			if err != nil {
				t.Error(err)
			}
			got <- rd
		}()
		a := s.admit(rid, 10+round*20)
		ack, err := s.c.Send(ctxT(t), a, s.sources(a))
		if err != nil {
			t.Fatal(err)
		}
		rd := <-got
		if rd == nil {
			t.FailNow()
		}
		if rd.RID != rid || rd.Slot != ack.Slot || rd.Generation != ack.Generation || rd.SeqLen != a.SeqLen || rd.LastPromptToken != 7 {
			t.Fatalf("ready %+v, ack %+v", rd, ack)
		}
		mla, idx := r.landed(t, rd)
		if !bytes.Equal(mla, s.mla[:len(mla)]) || !bytes.Equal(idx, s.idx[:len(idx)]) {
			t.Fatalf("round %d: landed state differs from the sent state", round)
		}
		if err := r.table.Release(rd.Slot, rd.Generation); err != nil {
			t.Fatal(err)
		}
		if err := r.table.Release(rd.Slot, rd.Generation); !errors.Is(err, ErrNotInUse) {
			t.Fatalf("double release: %v", err)
		}
	}
}

func TestAdmitRejections(t *testing.T) {
	r := newRig(t, 1, func(c *TableConfig) {
		c.CheckSizes = func(seqLen int, sizes []RegionSize) error {
			if sizes[0].Bytes != int64(seqLen)*64 {
				return errors.Newf("mla: %d bytes for %d tokens, want 64 per token", sizes[0].Bytes, seqLen)
			}
			return nil
		}
	})
	s := newSender(t, r, 2)
	cases := []struct {
		name   string
		mutate func(a *Admit)
		reason string
	}{
		{"wrong magic", func(a *Admit) { a.Magic = "other-pd" }, ReasonBadRequest},
		{"wrong protocol version", func(a *Admit) { a.ProtocolVersion = ProtocolVersion + 1 }, ReasonLayoutMismatch},
		{"wrong model", func(a *Admit) { a.Model = "glm5" }, ReasonLayoutMismatch},
		{"wrong layout version", func(a *Admit) { a.LayoutVersion = 9 }, ReasonLayoutMismatch},
		{"wrong kv dtype", func(a *Admit) { a.KVCacheDType = "bf16" }, ReasonLayoutMismatch},
		{"wrong layer count", func(a *Admit) { a.NumLayers = 3 }, ReasonLayoutMismatch},
		{"seq too long", func(a *Admit) { a.SeqLen = 65 }, ReasonTooLong},
		{"region over capacity", func(a *Admit) { a.Regions[1].Bytes = capIdx + 1 }, ReasonTooLong},
		{"unknown region", func(a *Admit) { a.Regions[1].Name = "rope" }, ReasonLayoutMismatch},
		{"missing region", func(a *Admit) { a.Regions = a.Regions[:1] }, ReasonLayoutMismatch},
		{"sizes inconsistent", func(a *Admit) { a.Regions[0].Bytes-- }, ReasonLayoutMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := s.admit("r-"+tc.name, 8)
			a.Magic, a.ProtocolVersion = Magic, ProtocolVersion
			a.Model, a.LayoutVersion, a.KVCacheDType, a.NumLayers = testLayout.Model, testLayout.LayoutVersion, testLayout.KVCacheDType, testLayout.NumLayers
			tc.mutate(a)
			_, err := s.c.Admit(ctxT(t), a)
			var rej *RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("want a reject, got %v", err)
			}
			if rej.Reject.Error != tc.reason || rej.Reject.Message == "" {
				t.Fatalf("want %s with a message, got %+v", tc.reason, rej.Reject)
			}
		})
	}
	if r.table.Busy() != 0 {
		t.Fatal("a rejected admit holds a slot")
	}
	// The connection is still usable after rejects.
	a := s.admit("fine", 8)
	if _, err := s.c.Send(ctxT(t), a, s.sources(a)); err != nil {
		t.Fatal(err)
	}
}

// With MTP on the node can recompute only the last MTP position: mtp_len
// below seq_len-1 is refused, seq_len-1 and an omitted field reach Ready.
// With MTP off any mtp_len in range is fine.
func TestAdmitMTPLen(t *testing.T) {
	cases := []struct {
		name   string
		mtp    bool
		mtpLen *int // seq_len is 10
		reason string
		want   int
	}{
		{"mtp omitted", true, nil, "", 10},
		{"mtp equal", true, intPtr(10), "", 10},
		{"mtp one short", true, intPtr(9), "", 9},
		{"mtp two short", true, intPtr(8), ReasonBadRequest, 0},
		{"mtp zero", true, intPtr(0), ReasonBadRequest, 0},
		{"no mtp zero", false, intPtr(0), "", 0},
		{"no mtp omitted", false, nil, "", 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1, func(c *TableConfig) { c.MTP = tc.mtp })
			s := newSender(t, r, 5)
			a := s.admit("m", 10)
			a.Magic, a.ProtocolVersion = Magic, ProtocolVersion
			a.Model, a.LayoutVersion, a.KVCacheDType, a.NumLayers = testLayout.Model, testLayout.LayoutVersion, testLayout.KVCacheDType, testLayout.NumLayers
			a.MTPLen = tc.mtpLen
			_, err := s.c.Send(ctxT(t), a, s.sources(a))
			if tc.reason != "" {
				var rej *RejectError
				if !errors.As(err, &rej) || rej.Reject.Error != tc.reason || !strings.Contains(rej.Reject.Message, "mtp_len") {
					t.Fatalf("want %s naming mtp_len, got %v", tc.reason, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rd, err := r.table.WaitReady(ctxT(t), "m")
			if err != nil {
				t.Fatal(err)
			}
			if rd.SeqLen != 10 || rd.MTPLen != tc.want {
				t.Fatalf("ready seq_len %d mtp_len %d, want 10 and %d", rd.SeqLen, rd.MTPLen, tc.want)
			}
		})
	}
}

func TestTwoSendersRaceForOneSlot(t *testing.T) {
	r := newRig(t, 1, nil)
	s1, s2 := newSender(t, r, 3), newSender(t, r, 4)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	accs := make([]*Accept, 2)
	for i, s := range []*sender{s1, s2} {
		wg.Go(func() {
			accs[i], errs[i] = s.c.Admit(ctxT(t), s.admit(fmt.Sprintf("race-%d", i), 16))
		})
	}
	wg.Wait()
	winners := 0
	for i := range 2 {
		var rej *RejectError
		switch {
		case errs[i] == nil:
			winners++
		case errors.As(errs[i], &rej) && rej.Reject.Error == ReasonBusy && rej.Reject.RetryAfterMS > 0 && rej.Retryable():
		default:
			t.Fatalf("sender %d: %v", i, errs[i])
		}
	}
	if winners != 1 {
		t.Fatalf("%d senders got the one slot", winners)
	}
	// The loser cannot write into the winner's slot: the key is a secret of
	// the winner's accept, and guessing the generation does not open it.
	w := 0
	if errs[0] != nil {
		w = 1
	}
	loser := []*sender{s1, s2}[1-w]
	guess := accs[w].Regions[0].Remote
	guess.Key = accs[w].Generation
	peer, err := loser.eng.Connect(ctxT(t), r.recv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := peer.Write(ctxT(t), []rdma.WriteOp{{Local: 1, Remote: guess, Len: 256}}); !errors.Is(err, rdma.ErrRefused) {
		t.Fatalf("loser's write: want refused, got %v", err)
	}
	winner := []*sender{s1, s2}[w]
	wa := winner.admit(fmt.Sprintf("race-%d", w), 16)
	n, crc, err := winner.c.Write(ctxT(t), accs[w], winner.sources(wa))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := winner.c.Done(ctxT(t), accs[w], n, crc); err != nil {
		t.Fatal(err)
	}
}

func TestWriteBeforeAcceptRefused(t *testing.T) {
	r := newRig(t, 1, nil)
	s := newSender(t, r, 5)
	peer, err := s.eng.Connect(ctxT(t), r.recv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	mla, _ := r.regions.Region(0, "mla")
	for _, key := range []uint64{0, 1, 2, 1 << 40} { // no generation is open yet
		rem := rdma.Remote{ID: mla.ID, Key: key, Len: capMLA}
		err := peer.Write(ctxT(t), []rdma.WriteOp{{Local: 1, Remote: rem, Len: 512}})
		if !errors.Is(err, rdma.ErrRefused) {
			t.Fatalf("key %d: write before accept: want refused, got %v", key, err)
		}
	}
	// After accept, a key for any other generation is still refused.
	a := s.admit("r", 8)
	acc, err := s.c.Admit(ctxT(t), a)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []uint64{acc.Generation, acc.Generation + 1, acc.Regions[0].Remote.Key + 1} {
		rem := acc.Regions[0].Remote
		rem.Key = key
		if err := peer.Write(ctxT(t), []rdma.WriteOp{{Local: 1, Remote: rem, Len: 512}}); !errors.Is(err, rdma.ErrRefused) {
			t.Fatalf("write with key %d after accept: want refused, got %v", key, err)
		}
	}
	n, crc, err := s.c.Write(ctxT(t), acc, s.sources(a))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Done(ctxT(t), acc, n, crc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mla.Host[:512], s.mla[:512]) {
		t.Fatal("state after the refused writes is wrong")
	}
}

func slotGen(t *testing.T, r *rig, slot int) (string, uint64) {
	t.Helper()
	info := r.table.Snapshot()[slot]
	return info.State, info.Generation
}

// A sender dies mid-write (connection drop) or stalls past the deadline:
// the slot expires with a bumped generation, nothing of it is usable, its
// late writes and done are refused, and the next request gets correct data.
func TestSenderDiesMidWrite(t *testing.T) {
	for _, how := range []string{"disconnect", "deadline"} {
		t.Run(how, func(t *testing.T) {
			r := newRig(t, 1, nil)
			dead := newSender(t, r, 6)
			a := dead.admit("dying", 48)
			acc, err := dead.c.Admit(ctxT(t), a)
			if err != nil {
				t.Fatal(err)
			}
			// Half of the mla region, nothing of idx.
			// The dead sender's own session: its accept's key is bound to it.
			peer, err := dead.eng.(rdma.SessionConnector).ConnectAs(ctxT(t), r.recv.Endpoint(), dead.c.Hello().Session)
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			half := []rdma.WriteOp{{Local: 1, Remote: acc.Regions[0].Remote, Len: a.Regions[0].Bytes / 2}}
			if err := peer.Write(ctxT(t), half); err != nil {
				t.Fatal(err)
			}
			// And a data stream that dies in the middle of a payload.
			raw := rawStream(t, r.recv.Endpoint(), nil, dead.c.Hello().Session)
			hdr := make([]byte, 40)
			binary.BigEndian.PutUint64(hdr[0:], 1)
			binary.BigEndian.PutUint32(hdr[8:], uint32(acc.Regions[1].Remote.ID))
			binary.BigEndian.PutUint64(hdr[16:], acc.Regions[1].Remote.Key)
			binary.BigEndian.PutUint64(hdr[32:], uint64(a.Regions[1].Bytes))
			_, _ = raw.Write(append(hdr, dead.idx[:a.Regions[1].Bytes/2]...))
			_ = raw.Close()
			waitCtx, cancel := context.WithCancel(context.Background())
			waitErr := make(chan error, 1)
			go func() { _, err := r.table.WaitReady(waitCtx, "dying"); waitErr <- err }()

			switch how {
			case "disconnect":
				_ = dead.c.conn.Close()
				for st, _ := slotGen(t, r, 0); st != "free"; st, _ = slotGen(t, r, 0) {
					time.Sleep(time.Millisecond) // the server notices the drop
				}
			case "deadline":
				r.clock.fire()
			}
			st, gen := slotGen(t, r, 0)
			if st != "free" || gen != acc.Generation+1 {
				t.Fatalf("after expiry: slot %s gen %d, want free gen %d", st, gen, acc.Generation+1)
			}
			// Late writes for the expired generation are refused.
			if err := peer.Write(ctxT(t), half); !errors.Is(err, rdma.ErrRefused) {
				t.Fatalf("late write: want refused, got %v", err)
			}
			// Its done is refused too (from any connection).
			if how == "deadline" {
				_, err := dead.c.Done(ctxT(t), acc, a.TotalBytes(), 0)
				var ae *AckError
				if !errors.As(err, &ae) || ae.Ack.Error != AckStale {
					t.Fatalf("late done: %v", err)
				}
			}
			// Nothing of it reached a waiter.
			cancel()
			if err := <-waitErr; !errors.Is(err, ErrTimeout) {
				t.Fatalf("waiter of the dead request: %v", err)
			}

			next := newSender(t, r, 7)
			b := next.admit("next", 40)
			acc2, err := next.c.Admit(ctxT(t), b)
			if err != nil {
				t.Fatal(err)
			}
			if acc2.Slot != 0 || acc2.Generation != acc.Generation+2 {
				t.Fatalf("next accept slot %d gen %d, want 0 gen %d", acc2.Slot, acc2.Generation, acc.Generation+2)
			}
			// A late write of the dead sender during the next transfer is refused.
			if err := peer.Write(ctxT(t), half); !errors.Is(err, rdma.ErrRefused) {
				t.Fatalf("late write during next transfer: want refused, got %v", err)
			}
			n, crc, err := next.c.Write(ctxT(t), acc2, next.sources(b))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := next.c.Done(ctxT(t), acc2, n, crc); err != nil {
				t.Fatal(err)
			}
			rd, err := r.table.WaitReady(ctxT(t), "next")
			if err != nil {
				t.Fatal(err)
			}
			mla, idx := r.landed(t, rd)
			if !bytes.Equal(mla, next.mla[:len(mla)]) || !bytes.Equal(idx, next.idx[:len(idx)]) {
				t.Fatal("next request's state is not exactly what it sent")
			}
		})
	}
}

func TestDoneRefusals(t *testing.T) {
	r := newRig(t, 1, nil)
	s := newSender(t, r, 8)
	a := s.admit("d", 8)
	acc, err := s.c.Admit(ctxT(t), a)
	if err != nil {
		t.Fatal(err)
	}
	n, crc, err := s.c.Write(ctxT(t), acc, s.sources(a))
	if err != nil {
		t.Fatal(err)
	}
	wrongGen := *acc
	wrongGen.Generation++
	wrongRID := *acc
	wrongRID.RID = "other"
	cases := []struct {
		name string
		acc  *Accept
		n    int64
		crc  uint32
		want string
	}{
		{"wrong generation", &wrongGen, n, crc, AckStale},
		{"wrong rid", &wrongRID, n, crc, AckStale},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.c.Done(ctxT(t), tc.acc, tc.n, tc.crc)
			var ae *AckError
			if !errors.As(err, &ae) || ae.Ack.Error != tc.want {
				t.Fatalf("want %s, got %v", tc.want, err)
			}
		})
	}
	if _, err := s.c.Done(ctxT(t), acc, n, crc); err != nil {
		t.Fatal(err)
	}
	// Duplicate done.
	_, err = s.c.Done(ctxT(t), acc, n, crc)
	var ae *AckError
	if !errors.As(err, &ae) || ae.Ack.Error != AckStale {
		t.Fatalf("duplicate done: %v", err)
	}

	// Size and checksum mismatches free the slot with a new generation.
	rd, err := r.table.WaitReady(ctxT(t), "d")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.table.Release(rd.Slot, rd.Generation); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dn   int64
		dcrc uint32
		want string
	}{
		{"size", 1, 0, AckSizeMismatch},
		{"checksum", -1, 0x1234, AckChecksumMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := s.admit("m-"+tc.name, 8)
			acc, err := s.c.Admit(ctxT(t), b)
			if err != nil {
				t.Fatal(err)
			}
			n, crc, err := s.c.Write(ctxT(t), acc, s.sources(b))
			if err != nil {
				t.Fatal(err)
			}
			if tc.dn >= 0 {
				n = tc.dn
			}
			crc ^= tc.dcrc
			_, err = s.c.Done(ctxT(t), acc, n, crc)
			var ae *AckError
			if !errors.As(err, &ae) || ae.Ack.Error != tc.want {
				t.Fatalf("want %s, got %v", tc.want, err)
			}
			if st, gen := slotGen(t, r, acc.Slot); st != "free" || gen != acc.Generation+1 {
				t.Fatalf("slot %s gen %d after a failed done", st, gen)
			}
		})
	}
}

func TestWaitReadyCancelAndTTL(t *testing.T) {
	r := newRig(t, 2, nil)
	s := newSender(t, r, 9)

	// Timeout with nothing sent.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.table.WaitReady(ctx, "never"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}

	// Cancel wakes a waiter and refuses the rid's admit.
	errc := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		_, err := r.table.WaitReady(ctxT(t), "c1")
		errc <- err
	}()
	<-started
	for {
		r.table.mu.Lock()
		_, waiting := r.table.waiters["c1"]
		r.table.mu.Unlock()
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := r.table.WaitReady(ctxT(t), "c1"); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("second waiter: %v", err)
	}
	if r.table.Cancel("c1") {
		t.Fatal("cancel of a waiting request says in use")
	}
	if err := <-errc; !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	_, err := s.c.Admit(ctxT(t), s.admit("c1", 8))
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reject.Error != ReasonCancelling {
		t.Fatalf("admit of a cancelled rid: %v", err)
	}

	// Cancel of a reserved request expires its slot.
	a := s.admit("c2", 8)
	acc, err := s.c.Admit(ctxT(t), a)
	if err != nil {
		t.Fatal(err)
	}
	r.table.Cancel("c2")
	if st, gen := slotGen(t, r, acc.Slot); st != "free" || gen != acc.Generation+1 {
		t.Fatalf("cancelled reservation: slot %s gen %d", st, gen)
	}
	if _, err := s.c.Done(ctxT(t), acc, 0, 0); err == nil {
		t.Fatal("done after cancel accepted")
	}

	// Ready state nobody claims expires after ReadyTTL.
	b := s.admit("c3", 8)
	ack, err := s.c.Send(ctxT(t), b, s.sources(b))
	if err != nil {
		t.Fatal(err)
	}
	r.clock.fire()
	if st, _ := slotGen(t, r, ack.Slot); st != "free" {
		t.Fatalf("unclaimed ready slot is %s", st)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := r.table.WaitReady(ctx, "c3"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("expired ready state was handed out: %v", err)
	}

	// In use: Cancel reports it so the engine stops it.
	c := s.admit("c4", 8)
	if _, err := s.c.Send(ctxT(t), c, s.sources(c)); err != nil {
		t.Fatal(err)
	}
	rd, err := r.table.WaitReady(ctxT(t), "c4")
	if err != nil {
		t.Fatal(err)
	}
	if !r.table.Cancel("c4") {
		t.Fatal("cancel of an in-use request does not say so")
	}
	if err := r.table.Release(rd.Slot, rd.Generation); err != nil {
		t.Fatal(err)
	}
}

func TestGarbageFramesServerStaysHealthy(t *testing.T) {
	r := newRig(t, 1, nil)
	big := make([]byte, 4)
	binary.BigEndian.PutUint32(big, MaxFrame+1)
	helloFromClient, _ := Encode(&Hello{Magic: Magic, Transport: Transport{Kind: "tcp"}})
	cases := []struct {
		name string
		in   []byte
		code string
	}{
		{"text", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "bad_frame"},
		{"oversize", big, "bad_frame"},
		{"not json", frame("{{{{"), "bad_frame"},
		{"unknown type", frame(`{"type":"teleport"}`), "bad_frame"},
		{"unexpected hello", frame(string(helloFromClient)), "unexpected_message"},
		{"truncated", frame(`{"type":"admit","rid":"x"}`)[:12], "bad_frame"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if m, err := ReadMessage(c); err != nil || m.Type() != TypeHello {
				t.Fatalf("hello: %v %v", m, err)
			}
			_, _ = c.Write(tc.in)
			if tc.name == "truncated" {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			m, err := ReadMessage(c)
			e, ok := m.(*ErrorMsg)
			if err != nil || !ok || e.Error != tc.code {
				t.Fatalf("want error %s, got %v %v", tc.code, m, err)
			}
			if m, err = ReadMessage(c); err != io.EOF {
				t.Fatalf("connection not closed: %v %v", m, err)
			}
		})
	}
	// The server still serves.
	s := newSender(t, r, 10)
	a := s.admit("after-garbage", 8)
	if _, err := s.c.Send(ctxT(t), a, s.sources(a)); err != nil {
		t.Fatal(err)
	}
}

func TestDialChecksHello(t *testing.T) {
	r := newRig(t, 1, nil)
	eng, err := rdma.NewTCP(rdma.TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	wrong := testLayout
	wrong.NumLayers = 99
	if _, err := Dial(ctxT(t), r.addr, eng, wrong); !errors.Is(err, ErrHello) {
		t.Fatalf("layout mismatch: %v", err)
	}
	// Servers that are not TileRT ctrl ports, or speak another version or engine.
	for _, tc := range []struct {
		name  string
		hello *Hello
	}{
		{"wrong magic", &Hello{Magic: "redis", ProtocolVersion: 1, Transport: Transport{Kind: "tcp"}}},
		{"wrong version", &Hello{Magic: Magic, ProtocolVersion: 7, Transport: Transport{Kind: "tcp"}}},
		{"wrong engine", &Hello{Magic: Magic, ProtocolVersion: 1, Transport: Transport{Kind: "nixl"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					_ = WriteMessage(c, tc.hello)
					_, _ = io.Copy(io.Discard, c)
					_ = c.Close()
				}
			}()
			if _, err := Dial(ctxT(t), ln.Addr().String(), eng, Layout{}); !errors.Is(err, ErrHello) {
				t.Fatalf("want ErrHello, got %v", err)
			}
		})
	}
}
