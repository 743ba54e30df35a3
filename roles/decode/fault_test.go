package decode

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (r *rig) slotGen(t testing.TB, slot int) (string, uint64) {
	var st decodeapi.Status
	r.getJSON(t, "/decode_status", &st)
	return st.Slots[slot].State, st.Slots[slot].Generation
}

// A sender that fails after its accept leaves nothing usable behind: the
// slot expires, late writes are refused, /pd/decode for it times out, and
// the next request decodes exactly.
func TestSenderFailsMidTransfer(t *testing.T) {
	cases := []struct {
		name    string
		reserve time.Duration
		// fail misbehaves after the accept; it returns once the failure
		// is complete from the sender's side.
		fail func(t *testing.T, s *sender, acc *pd.Accept, out *handoff.Outgoing)
	}{
		{"disconnect mid-write", 0, func(t *testing.T, s *sender, acc *pd.Accept, out *handoff.Outgoing) {
			// Half of the first region lands, then the process "dies".
			peer, err := s.tr.(rdma.SessionConnector).ConnectAs(ctxT(t), s.c.Hello().Transport.Endpoint, s.c.Hello().Session)
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			d := acc.Regions[0]
			if err := peer.Write(ctxT(t), []rdma.WriteOp{{Local: out.ID, Remote: d.Remote, Len: d.Bytes / 2}}); err != nil {
				t.Fatal(err)
			}
			_ = s.c.Close()
		}},
		{"done with a wrong checksum", 0, func(t *testing.T, s *sender, acc *pd.Accept, out *handoff.Outgoing) {
			n, crc, err := s.c.Write(ctxT(t), acc, out.Sources)
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.c.Done(ctxT(t), acc, n, crc^1)
			var ae *pd.AckError
			if !errors.As(err, &ae) || ae.Ack.Error != pd.AckChecksumMismatch {
				t.Fatalf("done with a bad checksum: %v", err)
			}
		}},
		{"no done before the deadline", 300 * time.Millisecond, func(t *testing.T, s *sender, acc *pd.Accept, out *handoff.Outgoing) {
			if _, _, err := s.c.Write(ctxT(t), acc, out.Sources); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := rigOpts{mtp: true, reserve: c.reserve}
			r := newRig(t, o)
			vocab := r.lm.cfg.VocabSize
			dead := prepare(t, o, "dead", randomPrompt(21, 90, vocab), engine.Params{MaxTokens: 8})
			s := newSender(t, r, "tcp")
			out := s.pack(dead)
			for i := range out.Buf { // garbage, so any use of it would show
				out.Buf[i] = 0x7e
			}
			acc, err := s.c.Admit(ctxT(t), out.Admit)
			if err != nil {
				t.Fatal(err)
			}
			c.fail(t, s, acc, out)
			waitFor(t, "the slot to be freed", func() bool {
				st, gen := r.slotGen(t, acc.Slot)
				return st == "free" && gen > acc.Generation
			})
			// Late writes carry the old key: refused.
			peer, err := s.tr.(rdma.SessionConnector).ConnectAs(ctxT(t), s.c.Hello().Transport.Endpoint, s.c.Hello().Session)
			if err != nil {
				t.Fatal(err)
			}
			d := acc.Regions[0]
			err = peer.Write(ctxT(t), []rdma.WriteOp{{Local: out.ID, Remote: d.Remote, Len: d.Bytes}})
			_ = peer.Close()
			if !errors.Is(err, rdma.ErrRefused) {
				t.Fatalf("late write after expiry: %v, want refused", err)
			}
			body := decodeBody(dead)
			body["timeout_s"] = 0.3
			res := r.decode(t, body)
			if res.status != http.StatusGatewayTimeout || res.final["error"] != "kv_transfer_timeout" {
				t.Fatalf("decode of the failed request: %d %s", res.status, res.body)
			}
			// The next request (shorter, so stale pages stay behind it) is exact.
			next := prepare(t, o, "next", randomPrompt(22, 40, vocab), engine.Params{MaxTokens: 10})
			if err := newSender(t, r, "tcp").send(next); err != nil {
				t.Fatal(err)
			}
			checkEqual(t, next, r.decode(t, decodeBody(next)))
			if m := r.metricsText(t); !strings.Contains(m, `tilert_decode_rejects_total{reason="kv_transfer_timeout",where="http"} 1`) {
				t.Fatalf("metrics lack the timeout reject:\n%s", m)
			}
		})
	}
}

// Two senders race for the only slot: exactly one is accepted.
func TestTwoSendersRaceForOneSlot(t *testing.T) {
	cases := []struct {
		name     string
		sameRID  bool
		loserErr string
	}{
		{"different requests", false, pd.ReasonBusy},
		{"same request twice", true, pd.ReasonBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := rigOpts{}
			r := newRig(t, o)
			vocab := r.lm.cfg.VocabSize
			prs := []*prepared{
				prepare(t, o, "a", randomPrompt(31, 20, vocab), engine.Params{MaxTokens: 8}),
				prepare(t, o, "b", randomPrompt(32, 30, vocab), engine.Params{MaxTokens: 8}),
			}
			if c.sameRID {
				prs[1] = prs[0]
			}
			senders := []*sender{newSender(t, r, "tcp"), newSender(t, r, "tcp")}
			outs := []*handoff.Outgoing{senders[0].pack(prs[0]), senders[1].pack(prs[1])}
			accs := make([]*pd.Accept, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range senders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					accs[i], errs[i] = senders[i].c.Admit(ctxT(t), outs[i].Admit)
				}()
			}
			close(start)
			wg.Wait()
			win := -1
			for i := range accs {
				if errs[i] == nil {
					if win >= 0 {
						t.Fatalf("both senders were accepted: %+v %+v", accs[0], accs[1])
					}
					win = i
				}
			}
			if win < 0 {
				t.Fatalf("neither was accepted: %v / %v", errs[0], errs[1])
			}
			lose := 1 - win
			var re *pd.RejectError
			if !errors.As(errs[lose], &re) || re.Reject.Error != c.loserErr {
				t.Fatalf("loser: %v, want reject %s", errs[lose], c.loserErr)
			}
			n, crc, err := senders[win].c.Write(ctxT(t), accs[win], outs[win].Sources)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := senders[win].c.Done(ctxT(t), accs[win], n, crc); err != nil {
				t.Fatal(err)
			}
			checkEqual(t, prs[win], r.decode(t, decodeBody(prs[win])))
			if !c.sameRID { // the loser retries once the slot is free
				if _, err := senders[lose].c.Send(ctxT(t), outs[lose].Admit, outs[lose].Sources); err != nil {
					t.Fatal(err)
				}
				checkEqual(t, prs[lose], r.decode(t, decodeBody(prs[lose])))
			}
			if m := r.metricsText(t); !strings.Contains(m, fmt.Sprintf(`tilert_decode_rejects_total{reason="%s",where="ctrl"} 1`, c.loserErr)) {
				t.Fatalf("metrics lack the ctrl reject %s:\n%s", c.loserErr, m)
			}
		})
	}
}

// holdAfterFirstStep returns a step hook that parks the scheduler after its
// first step until release is called.
func holdAfterFirstStep() (hook func(), release func()) {
	gate := make(chan struct{})
	var once, rel sync.Once
	return func() { once.Do(func() { <-gate }) }, func() { rel.Do(func() { close(gate) }) }
}

func longBody(pr *prepared, maxTokens int) map[string]any {
	b := decodeBody(pr)
	b["max_tokens"], b["ignore_eos"] = maxTokens, true
	return b
}

func TestCancelMidStream(t *testing.T) {
	hook, release := holdAfterFirstStep()
	defer release()
	o := rigOpts{mtp: true, stepHook: hook}
	r := newRig(t, o)
	vocab := r.lm.cfg.VocabSize
	pr := prepare(t, o, "long", randomPrompt(41, 12, vocab), engine.Params{MaxTokens: 8})
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	resp, err := postJSON(t, r.base+"/pd/decode", longBody(pr, 400))
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	res := readStream(t, resp, func(string) {
		lines++
		if lines == 1 { // the first tokens are out; the engine is parked
			cr, err := postJSON(t, r.base+"/pd/cancel", map[string]any{"rid": "long"})
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, cr.Body)
			cr.Body.Close()
			release()
		}
	})
	if res.finishReason() != decodeapi.FinishCancelled {
		t.Fatalf("finish %q after cancel (lines %q)", res.finishReason(), res.lines)
	}
	n, _ := res.final["n"].(float64)
	if int(n) != len(res.ids) || len(res.ids) == 0 || len(res.ids) > 2 {
		t.Fatalf("n %v, streamed %d ids: the request should stop after its first step", res.final["n"], len(res.ids))
	}
	// The streamed prefix is still the exact generation.
	if fmt.Sprint(res.ids) != fmt.Sprint(pr.want[:len(res.ids)]) {
		t.Fatalf("streamed %v, local %v", res.ids, pr.want)
	}
	waitFor(t, "the slot to be freed", func() bool { return r.allFree(t) })
	next := prepare(t, o, "after", randomPrompt(42, 33, vocab), engine.Params{MaxTokens: 9})
	if err := newSender(t, r, "tcp").send(next); err != nil {
		t.Fatal(err)
	}
	checkEqual(t, next, r.decode(t, decodeBody(next)))
	if m := r.metricsText(t); !strings.Contains(m, `tilert_decode_requests_total{outcome="cancelled"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
}

// A cancel before the state arrives ends the waiting /pd/decode and makes
// the sender's admit fail with "cancelling".
func TestCancelBeforeState(t *testing.T) {
	o := rigOpts{}
	r := newRig(t, o)
	pr := prepare(t, o, "early", randomPrompt(51, 10, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 5})
	res := make(chan *decodeResult, 1)
	go func() { res <- r.decode(t, decodeBody(pr)) }()
	waitFor(t, "the request to wait", func() bool {
		var st decodeapi.Status
		r.getJSON(t, "/decode_status", &st)
		return len(st.Requests) == 1 && st.Requests[0].State == "waiting_state"
	})
	var cr map[string]any
	resp, err := postJSON(t, r.base+"/pd/cancel", map[string]any{"rid": "early"})
	if err != nil {
		t.Fatal(err)
	}
	_ = readJSONBody(resp, &cr)
	if cr["state"] != "waiting" {
		t.Fatalf("cancel answer %v", cr)
	}
	d := <-res
	if d.status != http.StatusOK || d.finishReason() != decodeapi.FinishCancelled || len(d.ids) != 0 {
		t.Fatalf("waiting decode after cancel: %d %v %v", d.status, d.final, d.ids)
	}
	err = newSender(t, r, "tcp").send(pr)
	var re *pd.RejectError
	if !errors.As(err, &re) || re.Reject.Error != pd.ReasonCancelling {
		t.Fatalf("admit after cancel: %v, want reject cancelling", err)
	}
	if !r.allFree(t) {
		t.Fatal("slots busy after the cancelled request")
	}
}

func TestBusyIs429(t *testing.T) {
	cases := []struct {
		name string
		// occupy takes the only slot; it returns a cleanup.
		occupy func(t *testing.T, r *rig, o rigOpts, release func()) func()
	}{
		{"decoding", func(t *testing.T, r *rig, o rigOpts, release func()) func() {
			pr := prepare(t, o, "holder", randomPrompt(61, 12, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 8})
			if err := newSender(t, r, "tcp").send(pr); err != nil {
				t.Fatal(err)
			}
			resp, err := postJSON(t, r.base+"/pd/decode", longBody(pr, 300))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the holder to decode", func() bool { return r.node.MaxBatch() == 1 })
			return func() {
				cancelRID(t, r, "holder")
				release()
				readStream(t, resp, nil)
			}
		}},
		{"waiting for state", func(t *testing.T, r *rig, o rigOpts, release func()) func() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				r.decode(t, map[string]any{"rid": "holder", "first_token_id": 1, "timeout_s": 30})
			}()
			waitFor(t, "the holder to wait", func() bool {
				var st decodeapi.Status
				r.getJSON(t, "/decode_status", &st)
				return len(st.Requests) == 1
			})
			return func() { cancelRID(t, r, "holder"); <-done }
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hook, release := holdAfterFirstStep()
			defer release()
			o := rigOpts{stepHook: hook}
			r := newRig(t, o)
			cleanup := c.occupy(t, r, o, release)
			d := r.decode(t, map[string]any{"rid": "second", "first_token_id": 1})
			if d.status != http.StatusTooManyRequests || d.final["error"] != "busy" {
				t.Fatalf("second request: %d %s", d.status, d.body)
			}
			if ra := d.header.Get("Retry-After"); ra == "" || ra == "0" {
				t.Fatalf("Retry-After %q", ra)
			}
			cleanup()
			waitFor(t, "the slot to be freed", func() bool { return r.allFree(t) })
			if m := r.metricsText(t); !strings.Contains(m, `tilert_decode_rejects_total{reason="busy",where="http"} 1`) {
				t.Fatalf("metrics:\n%s", m)
			}
		})
	}
}

func cancelRID(t testing.TB, r *rig, rid string) {
	t.Helper()
	resp, err := postJSON(t, r.base+"/pd/cancel", map[string]any{"rid": rid})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func TestNoStateWithinTimeoutIs504(t *testing.T) {
	r := newRig(t, rigOpts{})
	for _, timeout := range []float64{0.05, 0.3} {
		d := r.decode(t, map[string]any{"rid": fmt.Sprintf("never-%v", timeout), "first_token_id": 3, "timeout_s": timeout})
		if d.status != http.StatusGatewayTimeout || d.final["error"] != "kv_transfer_timeout" {
			t.Fatalf("timeout %v: %d %s", timeout, d.status, d.body)
		}
		if msg, _ := d.final["message"].(string); !strings.Contains(msg, "did not arrive") {
			t.Fatalf("message %q", msg)
		}
	}
	if !r.allFree(t) {
		t.Fatal("slots busy after timeouts")
	}
}

// Garbage on the ctrl port closes that connection (after an error frame)
// and nothing else: the node stays healthy and keeps serving.
func TestGarbageCtrlFrames(t *testing.T) {
	frame := func(payload string) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
		return append(b, payload...)
	}
	cases := []struct {
		name  string
		bytes []byte
		half  bool // then close our write side: the frame is truncated
		want  string
	}{
		{"oversize length", []byte{0xff, 0xff, 0xff, 0xff, 'x'}, false, "bad_frame"},
		{"zero length", []byte{0, 0, 0, 0}, false, "bad_frame"},
		{"not JSON", frame("\x00\x01garbage"), false, "bad_frame"},
		{"JSON array", frame(`[1,2,3]`), false, "bad_frame"},
		{"unknown type", frame(`{"type":"gimme"}`), false, "bad_frame"},
		{"admit with wrong field types", frame(`{"type":"admit","rid":7}`), false, "bad_frame"},
		{"hello from a client", frame(`{"type":"hello","magic":"tilert-pd","protocol_version":1,"transport":{"kind":"tcp","endpoint":"x"}}`), false, "unexpected_message"},
		{"truncated frame", []byte{0, 0, 1, 0, '{'}, true, "bad_frame"},
		{"HTTP request on the ctrl port", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false, "bad_frame"},
	}
	o := rigOpts{}
	r := newRig(t, o)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", r.ctrl)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			if m, err := pd.ReadMessage(conn); err != nil || m.Type() != pd.TypeHello {
				t.Fatalf("hello: %v %v", m, err)
			}
			if _, err := conn.Write(c.bytes); err != nil {
				t.Fatal(err)
			}
			if c.half {
				_ = conn.(*net.TCPConn).CloseWrite()
			}
			m, err := pd.ReadMessage(conn)
			if err != nil {
				t.Fatalf("want an error frame, got %v", err)
			}
			em, ok := m.(*pd.ErrorMsg)
			if !ok || em.Error != c.want {
				t.Fatalf("got %+v, want error %s", m, c.want)
			}
			if _, err := pd.ReadMessage(conn); err != io.EOF {
				t.Fatalf("connection not closed after the error frame: %v", err)
			}
		})
	}
	var h map[string]any
	if code := r.getJSON(t, "/health", &h); code != http.StatusOK || h["status"] != "ok" {
		t.Fatalf("health after garbage: %d %v", code, h)
	}
	pr := prepare(t, o, "after-garbage", randomPrompt(71, 25, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 10})
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	checkEqual(t, pr, r.decode(t, decodeBody(pr)))
	m := r.metricsText(t)
	if !strings.Contains(m, `tilert_decode_rejects_total{reason="bad_frame",where="ctrl"} 8`) ||
		!strings.Contains(m, `tilert_decode_rejects_total{reason="unexpected_message",where="ctrl"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
}

// A client that goes away mid-stream stops its decode: the node notices on
// its next write and frees the slot.
func TestClientGoneMidStream(t *testing.T) {
	hook, release := holdAfterFirstStep()
	defer release()
	o := rigOpts{stepHook: hook}
	r := newRig(t, o)
	pr := prepare(t, o, "gone", randomPrompt(43, 12, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 8})
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"rid":"gone","first_token_id":%d,"max_tokens":%d,"ignore_eos":true}`, pr.first, testMaxSeq)
	fmt.Fprintf(conn, "POST /pd/decode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	buf := make([]byte, 4096)
	got := ""
	for !strings.Contains(got, `{"t":[`) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("reading the first line: %v (%q)", err, got)
		}
		got += string(buf[:n])
	}
	_ = conn.Close()
	release()
	waitFor(t, "the slot to be freed", func() bool { return r.allFree(t) })
	if m := r.metricsText(t); !strings.Contains(m, `tilert_decode_requests_total{outcome="cancelled"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
	if n := int(r.node.m.tokens.With().Value()); n >= testMaxSeq-20 {
		t.Fatalf("%d tokens generated: the decode ran to the end for a client that left", n)
	}
}
