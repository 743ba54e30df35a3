package pd

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/tilert-go/tilert/internal/netguard/floodtest"

	"github.com/tilert-go/tilert/rdma"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// secureRig is a node with a secret on both its ctrl and transfer ports.
func secureRig(t *testing.T, slots int, sec Security, tweak func(*TableConfig)) *rig {
	t.Helper()
	recv, err := rdma.NewTCP(rdma.TCPConfig{Listen: "127.0.0.1:0", Streams: 2, PieceBytes: 512, ChunkBytes: 256, Secret: sec.Secret,
		HandshakeTimeout: sec.ReadTimeout, IdleTimeout: sec.IdleTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return newRigSec(t, slots, recv, sec, tweak)
}

func secureSender(t *testing.T, r *rig, seed uint64, secret []byte) *sender {
	t.Helper()
	eng, err := rdma.NewTCP(rdma.TCPConfig{Streams: 2, PieceBytes: 512, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	return newSenderWith(t, r, eng, seed, WithSecret(secret))
}

// rawCtrl dials the ctrl port and reads the first hello, as an attacker
// without the secret would.
func rawCtrl(t *testing.T, addr string) (net.Conn, *bufio.Reader, *Hello) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	m, err := ReadMessage(br)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, m.(*Hello)
}

// Finding: an unauthenticated admit returned a slot's write key. With a
// secret, the first hello is only a challenge (no transport, no regions),
// an admit instead of auth closes the connection with unauthorized, and no
// slot is reserved; a wrong secret fails both ways; the right one works.
func TestCtrlAuthentication(t *testing.T) {
	r := secureRig(t, 2, Security{Secret: testSecret}, nil)
	c, br, h := rawCtrl(t, r.addr)
	if !h.Challenge() || len(h.Nonce) != 32 || h.Transport.Endpoint != "" || len(h.Regions) != 0 || h.ProtocolVersion != 2 {
		t.Fatalf("challenge hello reveals or lacks: %+v", h)
	}
	s := &sender{mla: make([]byte, capMLA), idx: make([]byte, capIdx)}
	a := s.admit("planted", 8)
	a.Magic, a.ProtocolVersion = Magic, ProtocolVersion
	a.Model, a.LayoutVersion, a.KVCacheDType, a.NumLayers = testLayout.Model, testLayout.LayoutVersion, testLayout.KVCacheDType, testLayout.NumLayers
	if err := WriteMessage(c, a); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMessage(br)
	if e, ok := m.(*ErrorMsg); err != nil || !ok || e.Error != "unauthorized" {
		t.Fatalf("admit before auth: %v %v, want unauthorized", m, err)
	}
	if _, err := ReadMessage(br); err == nil {
		t.Fatal("connection still open after a failed authentication")
	}
	if r.table.Busy() != 0 {
		t.Fatal("an unauthenticated admit reserved a slot")
	}

	// A forged auth (random MAC) is refused the same way.
	c2, br2, h2 := rawCtrl(t, r.addr)
	_ = WriteMessage(c2, &AuthMsg{Nonce: h2.Nonce, MAC: make([]byte, 32)})
	if m, _ := ReadMessage(br2); m == nil || m.Type() != TypeError {
		t.Fatalf("forged auth: %v", m)
	}

	eng, _ := rdma.NewTCP(rdma.TCPConfig{Streams: 1})
	defer eng.Close()
	if _, err := Dial(ctxT(t), r.addr, eng, testLayout); !errors.Is(err, ErrAuth) {
		t.Fatalf("dial without a secret: %v, want ErrAuth", err)
	}
	if _, err := Dial(ctxT(t), r.addr, eng, testLayout, WithSecret([]byte("another secret, 32 bytes long!!!"))); !errors.Is(err, ErrAuth) {
		t.Fatalf("dial with the wrong secret: %v, want ErrAuth", err)
	}
	// The node without a secret is refused by a client that has one: it
	// cannot prove it is the node.
	plain := newRig(t, 1, nil)
	if _, err := Dial(ctxT(t), plain.addr, eng, testLayout, WithSecret(testSecret)); !errors.Is(err, ErrAuth) {
		t.Fatalf("secret client, plain node: %v, want ErrAuth", err)
	}

	good := secureSender(t, r, 3, testSecret)
	if h := good.c.Hello(); h.Challenge() || h.Transport.Endpoint == "" || h.Session == "" || h.Auth != AuthHMAC {
		t.Fatalf("full hello after auth: %+v", h)
	}
	ga := good.admit("good", 8)
	if _, err := good.c.Send(ctxT(t), ga, good.sources(ga)); err != nil {
		t.Fatal(err)
	}
}

// Finding: bytes written with a leaked key were decoded. The transfer port
// refuses streams that do not prove the secret, and an accept's key is good
// only on the streams of the ctrl session that got it: another
// authenticated sender holding the key is refused too.
func TestWriteKeyBoundToPeer(t *testing.T) {
	r := secureRig(t, 2, Security{Secret: testSecret}, nil)
	owner := secureSender(t, r, 1, testSecret)
	other := secureSender(t, r, 2, testSecret)
	a := owner.admit("owned", 8)
	acc, err := owner.c.Admit(ctxT(t), a)
	if err != nil {
		t.Fatal(err)
	}
	op := []rdma.WriteOp{{Local: 1, Remote: acc.Regions[0].Remote, Len: 256}}
	if err := other.c.peer.Write(ctxT(t), op); !errors.Is(err, rdma.ErrRefused) {
		t.Fatalf("another session's write with the leaked key: %v, want refused", err)
	}
	// An engine without the secret cannot even open a stream.
	bad, _ := rdma.NewTCP(rdma.TCPConfig{Streams: 1, Secret: []byte("not the secret, but 32 bytes....")})
	defer bad.Close()
	if _, err := bad.ConnectAs(ctxT(t), r.recv.Endpoint(), owner.c.Hello().Session); !errors.Is(err, rdma.ErrUnauthorized) {
		t.Fatalf("stream with the wrong secret: %v, want ErrUnauthorized", err)
	}
	none, _ := rdma.NewTCP(rdma.TCPConfig{Streams: 1})
	defer none.Close()
	if _, err := none.Connect(ctxT(t), r.recv.Endpoint()); !errors.Is(err, rdma.ErrUnauthorized) {
		t.Fatalf("stream without a secret: %v, want ErrUnauthorized", err)
	}
	// The owner's own writes land.
	n, crc, err := owner.c.Write(ctxT(t), acc, owner.sources(a))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.c.Done(ctxT(t), acc, n, crc); err != nil {
		t.Fatal(err)
	}
}

// Finding: the ctrl port allocated a claimed 16 MiB before reading it. A
// frame longer than the pre-authentication limit is refused on its length;
// after authentication a half-sent 16 MiB frame holds what arrived, not
// what it claimed.
func TestFrameLimits(t *testing.T) {
	r := secureRig(t, 1, Security{Secret: testSecret}, nil)
	c, br, _ := rawCtrl(t, r.addr)
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame)
	_, _ = c.Write(hdr[:])
	m, _ := ReadMessage(br)
	if e, ok := m.(*ErrorMsg); !ok || !strings.Contains(e.Message, "pre-authentication frame limit") {
		t.Fatalf("16 MiB claim before auth: %v, want refused naming the limit", m)
	}
	// ReadFrameLimit names the configured key.
	_, err := ReadFrameLimit(strings.NewReader("\x00\x01\x00\x00"), 4096, "security.max_frame_bytes")
	if !errors.Is(err, ErrOversize) || !strings.Contains(err.Error(), "security.max_frame_bytes") {
		t.Fatalf("oversize: %v", err)
	}
}

// Findings: 100 half-sent frames held 1.6 GB; idle connections were held
// forever; nothing capped connections. A bounded flood on loopback of
// half-open connections, idle authenticated connections, slowloris frames
// (one byte at a time) and half-sent 16 MiB frames: a good sender is served
// throughout, the flood's memory stays small, and the server closes every
// flooding connection within its deadlines.
func TestCtrlFloodsBounded(t *testing.T) {
	sec := Security{Secret: testSecret, ReadTimeout: time.Second, IdleTimeout: 2 * time.Second,
		MaxConns: 400, MaxConnsPerPeer: 300}
	r := secureRig(t, 1, sec, nil)
	before := floodtest.HeapInUse()
	const n = 60
	var conns []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		return c
	}
	// Half-open: connect, say nothing.
	for range n {
		dial()
	}
	// Authenticated peers that claim a 16 MiB frame and send 100 bytes.
	for i := range n {
		s := secureSender(t, r, uint64(100+i), testSecret)
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], MaxFrame)
		_, _ = s.c.conn.Write(append(hdr[:], make([]byte, 100)...))
		conns = append(conns, s.c.conn)
	}
	// Slowloris: one byte of a frame length now and then.
	tr := floodtest.NewTrickler()
	for range n {
		tr.Start(dial(), []byte{0}, true)
	}
	time.Sleep(50 * time.Millisecond)
	held := floodtest.HeapInUse()
	// A good sender is served while all of that is held.
	good := secureSender(t, r, 1, testSecret)
	a := good.admit("served", 16)
	if _, err := good.c.Send(ctxT(t), a, good.sources(a)); err != nil {
		t.Fatalf("good sender during the flood: %v", err)
	}
	floodtest.HeapBounded(t, len(conns), before, held, 48<<20)
	// Every flooding connection is closed by the server within its
	// deadlines (read timeout for frames and handshakes, idle otherwise).
	floodtest.AllClosed(t, conns, 5*time.Second)
	tr.Stop()
}

// Per-peer and total caps close the excess at once; other peers (another
// loopback address) are still served.
func TestCtrlConnectionCaps(t *testing.T) {
	r := secureRig(t, 1, Security{Secret: testSecret, MaxConns: 8, MaxConnsPerPeer: 3}, nil)
	for range 3 {
		rawCtrl(t, r.addr)
	}
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("4th connection of one peer: read %d, %v; want closed", n, err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other, err := d.Dial("tcp", r.addr)
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	defer other.Close()
	_ = other.SetReadDeadline(time.Now().Add(5 * time.Second))
	if m, err := ReadMessage(bufio.NewReader(other)); err != nil || m.Type() != TypeHello {
		t.Fatalf("another peer is not served: %v %v", m, err)
	}
}

// Finding: two planted admits held both slots, forever. Admits past
// security.admits_per_s from one peer are rejected busy, naming the limit.
func TestAdmitRateLimit(t *testing.T) {
	r := secureRig(t, 64, Security{Secret: testSecret, AdmitsPerS: 5}, nil)
	s := secureSender(t, r, 1, testSecret)
	var limited *RejectError
	for i := range 20 {
		_, err := s.c.Admit(ctxT(t), s.admit(fmt.Sprintf("rate-%d", i), 8))
		if errors.As(err, &limited) {
			if i < 5 {
				t.Fatalf("admit %d limited within the burst", i)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if limited == nil || limited.Reject.Error != ReasonBusy || !strings.Contains(limited.Reject.Message, "security.admits_per_s") || limited.Reject.RetryAfterMS <= 0 {
		t.Fatalf("20 admits at once: no rate limit (%v)", limited)
	}
}

// Finding: the cancelled-rid memory was unbounded and scanned whole on
// every cancel. It keeps at most MaxCancelled rids, forgets the oldest,
// and a forgotten rid is admitted again.
func TestCancelledRIDsBounded(t *testing.T) {
	r := newRig(t, 1, func(c *TableConfig) { c.MaxCancelled = 100 })
	for i := range 1000 {
		r.table.Cancel(fmt.Sprintf("c-%d", i))
	}
	if n := r.table.Cancelled(); n != 100 {
		t.Fatalf("%d cancelled rids remembered, want 100", n)
	}
	s := newSender(t, r, 1)
	if _, err := s.c.Admit(ctxT(t), s.admit("c-999", 8)); err == nil {
		t.Fatal("a recently cancelled rid was admitted")
	}
	if _, err := s.c.Admit(ctxT(t), s.admit("c-0", 8)); err != nil {
		t.Fatalf("the oldest, forgotten rid: %v", err)
	}
}

// Rids are capped (security.max_rid_bytes) and must be printable ASCII.
func TestAdmitRIDChecked(t *testing.T) {
	r := newRig(t, 1, func(c *TableConfig) { c.MaxRIDBytes = 32 })
	s := newSender(t, r, 1)
	for _, rid := range []string{strings.Repeat("r", 33), "a\nb", `q"uote`} {
		_, err := s.c.Admit(ctxT(t), s.admit(rid, 8))
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Reject.Error != ReasonBadRequest {
			t.Fatalf("rid %q: %v, want bad_request", rid, err)
		}
	}
	_, err := s.c.Admit(ctxT(t), s.admit(strings.Repeat("r", 33), 8))
	if !strings.Contains(err.Error(), "security.max_rid_bytes") {
		t.Fatalf("long rid refusal does not name the limit: %v", err)
	}
}

// BenchmarkCancel measures one cancel with 100k cancelled rids remembered:
// constant, where it used to rescan the whole map under the table lock.
func BenchmarkCancel(b *testing.B) {
	g := &EngineReceiver{}
	tb, err := NewTable(TableConfig{Slots: 1, MaxSeqLen: 1, Regions: []RegionCap{{Name: "x", Capacity: 1}}, MaxCancelled: 100000}, g)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 100000 {
		tb.Cancel(fmt.Sprintf("pre-%d", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		tb.Cancel(fmt.Sprintf("b-%d", i))
	}
}
