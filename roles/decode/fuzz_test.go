package decode

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/pd"
)

// FuzzDecodeBody feeds arbitrary /pd/decode bodies to the node's parser:
// never a panic, and a body it accepts satisfies every documented bound.
//
//	go test ./roles/decode -run '^$' -fuzz FuzzDecodeBody -fuzztime 60s
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{
		`{"rid":"r-1","first_token_id":5,"max_tokens":16,"sampling":{"temperature":0.7,"top_p":0.9,"top_k":40,"seed":1},"stop_token_ids":[3],"ignore_eos":true,"timeout_s":2,"stream":false}`,
		`{"rid":"r-2","first_token_id":0}`, `{"rid":"","first_token_id":1}`, `{"rid":"x","first_token_id":-1}`,
		`{"rid":"x","first_token_id":1,"timeout_s":1e308}`, `{"rid":"x","first_token_id":1,"sampling":{"temperature":-1}}`,
		`{"rid":"x","first_token_id":1}{}`, `[]`, `null`, `{"rid":7}`, `{"rid":"a\u0000b","first_token_id":1}`,
		`{"rid":"x","first_token_id":1,"prompt_token_ids":[4,5],"sampling":{"temperature":1,"min_p":0.2,"bad_words_token_ids":[[3],[4,5]],"thinking_budget":{"budget":3,"start_ids":[4],"end_ids":[6]}}}`,
	} {
		f.Add([]byte(s))
	}
	n := &Node{opts: Options{VocabSize: 1000, EOS: []int{2}, StateTimeout: 30 * time.Second}}
	n.sec.defaults()
	f.Fuzz(func(t *testing.T, body []byte) {
		req, p, timeout, herr := n.parseDecode(body)
		if herr != nil {
			if herr.Code.Status() != 400 || herr.Message == "" {
				t.Fatalf("refusal %+v", herr)
			}
			return
		}
		switch {
		case pd.CheckRID(req.RID, n.sec.MaxRIDBytes, "") != nil:
			t.Fatalf("accepted rid %q", req.RID)
		case *req.FirstTokenID < 0 || *req.FirstTokenID >= 1000:
			t.Fatalf("accepted first_token_id %d", *req.FirstTokenID)
		case p.MaxTokens < 0 || p.Temperature < 0 || p.TopP < 0 || p.TopP > 1 || p.TopK < 0 || !(p.MinP >= 0 && p.MinP <= 1):
			t.Fatalf("accepted params %+v", p)
		case len(p.BadWords) > 128 || (p.Think != nil && (p.Think.Budget < 0 || len(p.Think.End) == 0)):
			t.Fatalf("accepted bad words %v, thinking budget %+v", p.BadWords, p.Think)
		case timeout <= 0 || timeout > time.Hour:
			t.Fatalf("accepted timeout %s", timeout)
		}
		ids := append([]int(nil), p.StopIDs...)
		for _, w := range p.BadWords {
			if len(w) == 0 {
				t.Fatal("accepted an empty bad word")
			}
			ids = append(ids, w...)
		}
		if p.Think != nil {
			ids = append(append(ids, p.Think.Start...), p.Think.End...)
		}
		for _, id := range ids {
			if id < 0 || id >= 1000 {
				t.Fatalf("accepted token id %d", id)
			}
		}
	})
}

// FuzzCancelBody sends arbitrary /pd/cancel bodies through a live node's
// HTTP router: a 200 with a cancel answer or a 400, never a panic, and the
// cancelled-rid memory stays within its bound.
//
//	go test ./roles/decode -run '^$' -fuzz FuzzCancelBody -fuzztime 60s
func FuzzCancelBody(f *testing.F) {
	for _, s := range []string{`{"rid":"r-1"}`, `{"rid":""}`, `{}`, `{"rid":["x"]}`, `{"rid":"` + string(make([]byte, 200)) + `"}`, `nope`} {
		f.Add([]byte(s))
	}
	r := newRig(f, rigOpts{sec: Security{CancelledRIDs: 64}})
	f.Fuzz(func(t *testing.T, body []byte) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/pd/cancel")
		ctx.Request.SetBody(body)
		r.node.http.Handler(&ctx)
		st := ctx.Response.StatusCode()
		var out map[string]any
		if err := json.Unmarshal(ctx.Response.Body(), &out); err != nil {
			t.Fatalf("status %d, body not JSON: %q", st, ctx.Response.Body())
		}
		if st != 200 && st != 400 {
			t.Fatalf("status %d: %s", st, ctx.Response.Body())
		}
		if n := r.node.table.Cancelled(); n > 64 {
			t.Fatalf("%d cancelled rids remembered, bound 64", n)
		}
	})
}
