package netguard

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	r := NewRate(10, 3)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for i := range 3 {
		if ok, _ := r.Allow("a"); !ok {
			t.Fatalf("burst %d refused", i)
		}
	}
	ok, wait := r.Allow("a")
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("past the burst: %v %v", ok, wait)
	}
	if ok, _ := r.Allow("b"); !ok {
		t.Fatal("another peer limited")
	}
	now = now.Add(100 * time.Millisecond)
	if ok, _ := r.Allow("a"); !ok {
		t.Fatal("not refilled after 1/rate")
	}
	now = now.Add(time.Hour)
	r.Allow("c")
	if len(r.buckets) != 1 {
		t.Fatalf("%d idle buckets kept", len(r.buckets))
	}
	if ok, _ := (*Rate)(nil).Allow("x"); !ok {
		t.Fatal("nil limiter")
	}
}

// Connections past the total cap are closed at once; closing one frees
// its place.
func TestListenerCaps(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	ln := Wrap(raw, Limits{MaxConns: 2, OnRefuse: func(string) { refused.Add(1) }})
	defer ln.Close()
	acc := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			acc <- c
		}
	}()
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	a, b := <-acc, <-acc
	_ = clients[2].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := clients[2].Read(make([]byte, 1)); err == nil {
		t.Fatal("third connection not closed")
	}
	if ln.Open() != 2 || ln.Refused() != 1 || refused.Load() != 1 {
		t.Fatalf("open %d refused %d/%d", ln.Open(), ln.Refused(), refused.Load())
	}
	_ = a.Close()
	_ = a.Close() // idempotent
	if ln.Open() != 1 {
		t.Fatalf("open %d after a close", ln.Open())
	}
	c, _ := net.Dial("tcp", raw.Addr().String())
	defer c.Close()
	select {
	case <-acc:
	case <-time.After(2 * time.Second):
		t.Fatal("a freed place is not reused")
	}
	_ = b.Close()
}
