package rdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard/floodtest"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// handshake opens a stream by hand and proves secret for session.
func handshake(t *testing.T, addr string, key []byte, session string) (net.Conn, byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte(tcpMagic))
	nonce := make([]byte, 32)
	if _, err := io.ReadFull(c, nonce); err != nil {
		t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint16(nil, uint16(len(session)))
	msg = append(msg, session...)
	_, _ = c.Write(append(msg, auth.MAC(key, tcpMACLabel, nonce, []byte(session))...))
	var st [1]byte
	_, _ = io.ReadFull(c, st[:])
	return c, st[0]
}

// A region opened for one session takes writes carrying its key only from
// that session's streams; a stream with the wrong secret is refused at its
// handshake; an old-version stream (magic TLRTWR01) is refused.
func TestTCPSessionAndSecret(t *testing.T) {
	recv, err := NewTCP(TCPConfig{Listen: "127.0.0.1:0", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	mem := make([]byte, 4096)
	if err := recv.Register(Region{ID: 1, Host: mem}); err != nil {
		t.Fatal(err)
	}
	rem, err := recv.OpenFor(1, 77, "s-owner")
	if err != nil {
		t.Fatal(err)
	}
	send, _ := NewTCP(TCPConfig{Secret: secret, Streams: 1})
	defer send.Close()
	src := bytes.Repeat([]byte{9}, 512)
	if err := send.Register(Region{ID: 5, Host: src}); err != nil {
		t.Fatal(err)
	}
	op := []WriteOp{{Local: 5, Remote: rem, Len: 512}}
	for _, session := range []string{"", "s-other"} {
		p, err := send.ConnectAs(context.Background(), recv.Endpoint(), session)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Write(context.Background(), op); !errors.Is(err, ErrRefused) {
			t.Fatalf("session %q writes into s-owner's region: %v", session, err)
		}
		_ = p.Close()
	}
	p, err := send.ConnectAs(context.Background(), recv.Endpoint(), "s-owner")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Write(context.Background(), op); err != nil {
		t.Fatalf("the owner's write: %v", err)
	}
	addr := strings.TrimPrefix(recv.Endpoint(), "tcp://")
	if _, st := handshake(t, addr, []byte("wrong"), "s-owner"); st != 1 {
		t.Fatalf("wrong secret: status %d, want refused", st)
	}
	old, _ := net.Dial("tcp", addr)
	defer old.Close()
	_, _ = old.Write([]byte("TLRTWR01"))
	_ = old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := io.ReadFull(old, make([]byte, 32)); n != 0 {
		t.Fatal("a version-1 stream got a challenge")
	}
}

// Findings: the data port had no read deadline and no connection cap. A
// bounded flood on loopback: half-open connections, handshakes sent a byte
// at a time, authenticated streams idle or stuck inside a header, and
// payloads that stop half-way. A good sender's write lands throughout,
// memory stays small, and the receiver closes every flooding connection
// within its deadlines.
func TestTCPFloodsBounded(t *testing.T) {
	recv, err := NewTCP(TCPConfig{Listen: "127.0.0.1:0", Secret: secret, HandshakeTimeout: time.Second,
		IdleTimeout: 2 * time.Second, IOTimeout: time.Second, MaxConns: 400, MaxConnsPerPeer: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	mem := make([]byte, 1<<20)
	if err := recv.Register(Region{ID: 1, Host: mem}); err != nil {
		t.Fatal(err)
	}
	rem, _ := recv.OpenFor(1, 77, "s-good")
	addr := strings.TrimPrefix(recv.Endpoint(), "tcp://")
	before := floodtest.HeapInUse()
	var conns []net.Conn
	tr := floodtest.NewTrickler()
	for i := range 200 {
		var c net.Conn
		switch i % 5 {
		case 0: // half-open
			c, _ = net.Dial("tcp", addr)
		case 1: // slowloris handshake
			c, _ = net.Dial("tcp", addr)
			tr.Start(c, []byte(tcpMagic), false)
		case 2: // authenticated, idle
			c, _ = handshake(t, addr, secret, "s-idle")
		case 3: // authenticated, half a header
			c, _ = handshake(t, addr, secret, "s-half")
			_, _ = c.Write(make([]byte, 20))
		case 4: // a payload that stops half-way (refused key: read and dropped)
			c, _ = handshake(t, addr, secret, "s-stall")
			h := make([]byte, tcpHeaderLen)
			binary.BigEndian.PutUint32(h[8:], 1)
			binary.BigEndian.PutUint64(h[16:], 1)
			binary.BigEndian.PutUint64(h[32:], 1<<19)
			_, _ = c.Write(append(h, make([]byte, 1000)...))
		}
		conns = append(conns, c)
	}
	held := floodtest.HeapInUse()
	send, _ := NewTCP(TCPConfig{Secret: secret, Streams: 2})
	defer send.Close()
	src := bytes.Repeat([]byte{5}, 64<<10)
	_ = send.Register(Region{ID: 9, Host: src})
	p, err := send.ConnectAs(context.Background(), recv.Endpoint(), "s-good")
	if err != nil {
		t.Fatalf("a good sender during the flood: %v", err)
	}
	defer p.Close()
	if err := p.Write(context.Background(), []WriteOp{{Local: 9, Remote: rem, Len: int64(len(src))}}); err != nil {
		t.Fatalf("a good write during the flood: %v", err)
	}
	floodtest.HeapBounded(t, len(conns), before, held, 48<<20)
	floodtest.AllClosed(t, conns, 5*time.Second)
	tr.Stop()
}
