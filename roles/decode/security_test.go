package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/auth"
	"github.com/tilert-go/tilert/internal/netguard/floodtest"
	"github.com/tilert-go/tilert/pd"
)

const (
	tokA = "router-a-token-0123456789"
	tokB = "router-b-token-0123456789"
)

func tokenRig(t *testing.T, o rigOpts) *rig {
	o.sec.Tokens = auth.NewTokens(tokA, tokB)
	return newRig(t, o)
}

// postAs posts body to path with token as bearer ("" sends none).
func (r *rig) postAs(t testing.TB, path, token string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", r.base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

func (r *rig) statusAs(t testing.TB, token string) decodeapi.Status {
	t.Helper()
	req, _ := http.NewRequest("GET", r.base+decodeapi.PathStatus, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st decodeapi.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// Findings: /decode_status listed live rids, and /pd/cancel and /pd/decode
// took any caller. With tokens, /pd/* without one (or with a wrong one) is
// 401 in the node's error shape; /decode_status masks rids for callers
// without a token and shows them to the router.
func TestPDRequiresToken(t *testing.T) {
	r := tokenRig(t, rigOpts{})
	for _, tc := range []struct{ path, token string }{
		{decodeapi.PathDecode, ""}, {decodeapi.PathDecode, "wrong-token-0123456789"}, {decodeapi.PathCancel, ""},
	} {
		resp, body := r.postAs(t, tc.path, tc.token, map[string]any{"rid": "victim", "first_token_id": 1})
		if resp.StatusCode != 401 || !strings.Contains(string(body), `"unauthorized"`) || resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("%s with token %q: %d %s, want 401 unauthorized", tc.path, tc.token, resp.StatusCode, body)
		}
	}
	// A waiting request from router A.
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.postAs(t, decodeapi.PathDecode, tokA, map[string]any{"rid": "r-0123456789abcdef", "first_token_id": 1, "timeout_s": 30})
	}()
	waitFor(t, "the request to wait", func() bool { return len(r.statusAs(t, tokA).Requests) == 1 })
	if got := r.statusAs(t, "").Requests[0].RID; got == "r-0123456789abcdef" || strings.Contains(got, "0123456789abcdef") {
		t.Fatalf("anonymous /decode_status shows the rid %q", got)
	}
	if got := r.statusAs(t, tokA).Requests[0].RID; got != "r-0123456789abcdef" {
		t.Fatalf("the router's /decode_status shows %q", got)
	}
	// Finding: anyone could cancel others' requests. Router B's cancel of
	// A's request is a no-op that reveals nothing; A's own cancel works.
	resp, body := r.postAs(t, decodeapi.PathCancel, tokB, map[string]any{"rid": "r-0123456789abcdef"})
	var cr decodeapi.CancelResponse
	_ = json.Unmarshal(body, &cr)
	if resp.StatusCode != 200 || cr.Cancelled || cr.State != decodeapi.CancelUnknown {
		t.Fatalf("B cancels A's request: %d %s", resp.StatusCode, body)
	}
	if len(r.statusAs(t, tokA).Requests) != 1 {
		t.Fatal("B's cancel ended A's request")
	}
	resp, body = r.postAs(t, decodeapi.PathCancel, tokA, map[string]any{"rid": "r-0123456789abcdef"})
	_ = json.Unmarshal(body, &cr)
	if resp.StatusCode != 200 || !cr.Cancelled || cr.State != decodeapi.CancelWaiting {
		t.Fatalf("A cancels its request: %d %s", resp.StatusCode, body)
	}
	<-done
}

// Findings: /pd/cancel kept and logged 1 MB rids. Rids past
// security.max_rid_bytes are refused (400 naming the limit) and nothing is
// remembered; a body past max_body_bytes is refused by size.
func TestRIDLimits(t *testing.T) {
	r := newRig(t, rigOpts{sec: Security{MaxRIDBytes: 64, MaxBodyBytes: 64 << 10}})
	for _, path := range []string{decodeapi.PathCancel, decodeapi.PathDecode} {
		resp, body := r.postAs(t, path, "", map[string]any{"rid": strings.Repeat("x", 65), "first_token_id": 1})
		if resp.StatusCode != 400 || !strings.Contains(string(body), "security.max_rid_bytes") {
			t.Fatalf("%s with a 65-byte rid: %d %s", path, resp.StatusCode, body)
		}
	}
	if n := r.node.table.Cancelled(); n != 0 {
		t.Fatalf("%d refused rids remembered", n)
	}
	resp, _ := r.postAs(t, decodeapi.PathCancel, "", map[string]any{"rid": strings.Repeat("x", 100<<10)})
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("100 KiB body over a 64 KiB limit: %d", resp.StatusCode)
	}
}

// Finding: a /pd/decode whose state never comes stayed after its client
// left (up to timeout_s), and every later request got 429. The waiter now
// goes with its client, and the slot's promise with it.
func TestWaiterVanishesWithClient(t *testing.T) {
	// A read timeout far below the wait: the watch outlives it.
	r := newRig(t, rigOpts{sec: Security{Ctrl: pd.Security{ReadTimeout: 200 * time.Millisecond}}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"rid":"never-comes","first_token_id":1,"timeout_s":3600}`
	fmt.Fprintf(conn, "POST /pd/decode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "the request to wait", func() bool { return len(r.statusAs(t, "").Requests) == 1 })
	// Meanwhile the only free slot is promised: another request is busy.
	if resp, b := r.postAs(t, decodeapi.PathDecode, "", map[string]any{"rid": "other", "first_token_id": 1, "timeout_s": 0.2}); resp.StatusCode != 429 {
		t.Fatalf("second request while one waits: %d %s", resp.StatusCode, b)
	}
	time.Sleep(500 * time.Millisecond) // past the read timeout
	if len(r.statusAs(t, "").Requests) != 1 {
		t.Fatal("the waiter ended while its client was still there")
	}
	_ = conn.Close()
	waitFor(t, "the waiter to go with its client", func() bool { return len(r.statusAs(t, "").Requests) == 0 })
	if resp, b := r.postAs(t, decodeapi.PathDecode, "", map[string]any{"rid": "other", "first_token_id": 1, "timeout_s": 0.2}); resp.StatusCode != 504 {
		t.Fatalf("after the client left: %d %s, want 504 (no state for it), not 429", resp.StatusCode, b)
	}
}

// Finding: an abandoned non-streamed /pd/decode ran to max_seq_len. The
// node notices the client's close while it decodes and cancels.
func TestNonStreamedNoticesGoneClient(t *testing.T) {
	hook, release := holdAfterFirstStep()
	defer release()
	o := rigOpts{stepHook: hook}
	r := newRig(t, o)
	pr := prepare(t, o, "quiet", randomPrompt(44, 12, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 8})
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"rid":"quiet","first_token_id":%d,"max_tokens":%d,"ignore_eos":true,"stream":false}`, pr.first, testMaxSeq)
	fmt.Fprintf(conn, "POST /pd/decode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "decoding", func() bool {
		st := r.statusAs(t, "")
		return len(st.Requests) == 1 && st.Requests[0].State == decodeapi.RequestDecoding
	})
	_ = conn.Close()
	time.Sleep(50 * time.Millisecond) // the close reaches the node before the engine moves on
	release()
	waitFor(t, "the slot to be freed", func() bool { return r.allFree(t) })
	if n := int(r.node.m.tokens.With().Value()); n >= testMaxSeq-20 {
		t.Fatalf("%d tokens generated: the non-streamed decode ran to the end for a client that left", n)
	}
}

// The router's connection is kept alive across requests: the client watch
// neither eats its next request nor breaks the keep-alive connection.
func TestKeepAliveAfterWatch(t *testing.T) {
	o := rigOpts{}
	r := newRig(t, o)
	s := newSender(t, r, "tcp")
	for i := range 3 {
		for _, stream := range []bool{true, false} {
			pr := prepare(t, o, fmt.Sprintf("ka-%d-%v", i, stream), randomPrompt(uint64(50+i), 10, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 4})
			if err := s.send(pr); err != nil {
				t.Fatal(err)
			}
			b := decodeBody(pr)
			b["stream"] = stream
			resp, body := r.postAs(t, decodeapi.PathDecode, "", b)
			if resp.StatusCode != 200 || !strings.Contains(string(body), `"done":true`) {
				t.Fatalf("request %d stream=%v: %d %s", i, stream, resp.StatusCode, body)
			}
		}
	}
}

// A bounded flood on the node's http port from another loopback address:
// half-open connections, slowloris headers (a byte now and then) and
// half-sent bodies. The router's requests are served throughout, memory
// stays small, and the server cuts every flooding connection within its
// read timeout; the per-peer cap closes the excess at once.
func TestHTTPFloodsBounded(t *testing.T) {
	r := newRig(t, rigOpts{sec: Security{Ctrl: pd.Security{ReadTimeout: time.Second, IdleTimeout: 1500 * time.Millisecond,
		MaxConnsPerPeer: 150}}})
	addr := strings.TrimPrefix(r.base, "http://")
	d := floodtest.OtherPeer(t, addr)
	before := floodtest.HeapInUse()
	var conns []net.Conn
	tr := floodtest.NewTrickler()
	for i := range 150 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 0: // half-open
		case 1: // slowloris headers
			_, _ = c.Write([]byte("POST /pd/decode HTTP/1.1\r\nHost: x\r\n"))
			tr.Start(c, []byte("X"), true)
		case 2: // a body that never completes
			_, _ = c.Write([]byte("POST /pd/cancel HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n{\"rid\":\""))
		}
	}
	// Past the per-peer cap: closed at once.
	waitFor(t, "the flood to be accepted", func() bool { return r.node.httpGuard.Load().Open() == len(conns) })
	extra, err := d.Dial("tcp", addr)
	if err == nil {
		_ = extra.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // before any timeout answer
		if n, err := extra.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
			t.Fatalf("connection past max_conns_per_peer: %d %v, want closed", n, err)
		}
		_ = extra.Close()
	}
	held := floodtest.HeapInUse()
	if st := r.statusAs(t, ""); st.MaxInflight != 1 {
		t.Fatalf("status during the flood: %+v", st)
	}
	resp, body := r.postAs(t, decodeapi.PathDecode, "", map[string]any{"rid": "served", "first_token_id": 1, "timeout_s": 0.1})
	if resp.StatusCode != 504 {
		t.Fatalf("a router request during the flood: %d %s", resp.StatusCode, body)
	}
	floodtest.HeapBounded(t, len(conns), before, held, 48<<20)
	floodtest.AllClosed(t, conns, 5*time.Second)
	tr.Stop()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
