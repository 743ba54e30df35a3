package decode

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/handoff"
)

func TestBadDecodeBodies(t *testing.T) {
	r := newRig(t, rigOpts{})
	cases := []struct {
		name, body, field string
	}{
		{"not JSON", `{"rid":`, "JSON"},
		{"array", `[1]`, "JSON"},
		{"trailing data", `{"rid":"a","first_token_id":1} {}`, "after the JSON object"},
		{"no rid", `{"first_token_id":1}`, "rid"},
		{"rid a number", `{"rid":5,"first_token_id":1}`, "rid"},
		{"no first token", `{"rid":"a"}`, "first_token_id"},
		{"first token a string", `{"rid":"a","first_token_id":"7"}`, "first_token_id"},
		{"first token outside vocab", `{"rid":"a","first_token_id":1024}`, "first_token_id"},
		{"negative first token", `{"rid":"a","first_token_id":-1}`, "first_token_id"},
		{"negative max_tokens", `{"rid":"a","first_token_id":1,"max_tokens":-2}`, "max_tokens"},
		{"max_tokens fractional", `{"rid":"a","first_token_id":1,"max_tokens":2.5}`, "max_tokens"},
		{"negative temperature", `{"rid":"a","first_token_id":1,"sampling":{"temperature":-1}}`, "sampling.temperature"},
		{"top_p above 1", `{"rid":"a","first_token_id":1,"sampling":{"top_p":1.5}}`, "sampling.top_p"},
		{"top_k -2", `{"rid":"a","first_token_id":1,"sampling":{"top_k":-2}}`, "sampling.top_k"},
		{"min_p above 1", `{"rid":"a","first_token_id":1,"sampling":{"min_p":1.01}}`, "sampling.min_p"},
		{"bad word empty", `{"rid":"a","first_token_id":1,"sampling":{"bad_words_token_ids":[[3],[]]}}`, "sampling.bad_words_token_ids[1]"},
		{"bad word outside vocab", `{"rid":"a","first_token_id":1,"sampling":{"bad_words_token_ids":[[3,1024]]}}`, "sampling.bad_words_token_ids[0]"},
		{"bad words not ids", `{"rid":"a","first_token_id":1,"sampling":{"bad_words_token_ids":["no"]}}`, "sampling"},
		{"thinking budget negative", `{"rid":"a","first_token_id":1,"prompt_token_ids":[1],"sampling":{"thinking_budget":{"budget":-1,"start_ids":[3],"end_ids":[4]}}}`, "thinking_budget.budget"},
		{"thinking budget without end", `{"rid":"a","first_token_id":1,"prompt_token_ids":[1],"sampling":{"thinking_budget":{"budget":5,"start_ids":[3],"end_ids":[]}}}`, "thinking_budget.end_ids"},
		{"thinking budget id outside vocab", `{"rid":"a","first_token_id":1,"prompt_token_ids":[1],"sampling":{"thinking_budget":{"budget":5,"start_ids":[3],"end_ids":[4096]}}}`, "outside the vocabulary"},
		{"thinking budget without the prompt", `{"rid":"a","first_token_id":1,"sampling":{"thinking_budget":{"budget":5,"start_ids":[3],"end_ids":[4]}}}`, "prompt_token_ids"},
		{"too many bad words", `{"rid":"a","first_token_id":1,"sampling":{"bad_words_token_ids":[` + strings.Repeat(`[1],`, 128) + `[2]]}}`, "at most 128"},
		{"seed negative", `{"rid":"a","first_token_id":1,"sampling":{"seed":-1}}`, "sampling.seed"},
		{"stop id outside vocab", `{"rid":"a","first_token_id":1,"stop_token_ids":[3,99999]}`, "stop_token_ids[1]"},
		{"stop ids not an array", `{"rid":"a","first_token_id":1,"stop_token_ids":3}`, "stop_token_ids"},
		{"zero timeout", `{"rid":"a","first_token_id":1,"timeout_s":0}`, "timeout_s"},
		{"stream a string", `{"rid":"a","first_token_id":1,"stream":"yes"}`, "stream"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := http.Post(r.base+"/pd/decode", "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			var e map[string]any
			if err := readJSONBody(resp, &e); err != nil {
				t.Fatal(err)
			}
			msg, _ := e["message"].(string)
			if resp.StatusCode != http.StatusBadRequest || e["error"] != "bad_request" || !strings.Contains(msg, c.field) {
				t.Fatalf("%d %v, want 400 naming %q", resp.StatusCode, e, c.field)
			}
		})
	}
	if !r.allFree(t) {
		t.Fatal("a bad body left state behind")
	}
}

func TestNonStreamingBody(t *testing.T) {
	o := rigOpts{mtp: true}
	r := newRig(t, o)
	p := engine.Params{MaxTokens: 14, Temperature: 0.7, TopK: 20, Seed: 5}
	pr := prepare(t, o, "ns", randomPrompt(81, 66, r.lm.cfg.VocabSize), p)
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	body := decodeBody(pr)
	body["stream"] = false
	resp, err := postJSON(t, r.base+"/pd/decode", body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	var got struct {
		RID          string             `json:"rid"`
		T            []int              `json:"t"`
		Done         bool               `json:"done"`
		N            int                `json:"n"`
		FinishReason string             `json:"finish_reason"`
		TimingMS     map[string]float64 `json:"timing_ms"`
	}
	if err := readJSONBody(resp, &got); err != nil {
		t.Fatal(err)
	}
	if got.RID != "ns" || !got.Done || got.N != len(pr.want) || got.FinishReason != string(pr.finish) {
		t.Fatalf("body %+v", got)
	}
	if len(got.T) != len(pr.want) {
		t.Fatalf("t %v, local %v", got.T, pr.want)
	}
	for i := range got.T {
		if got.T[i] != pr.want[i] {
			t.Fatalf("t %v, local %v", got.T, pr.want)
		}
	}
	for _, k := range []string{"wait_state", "import", "decode", "total"} {
		if _, ok := got.TimingMS[k]; !ok {
			t.Fatalf("timing_ms lacks %s: %v", k, got.TimingMS)
		}
	}
}

// Stop ids from the request end the stream at that token (emitted), and
// ignore_eos keeps decoding past the model's EOS.
func TestStopTokenIDs(t *testing.T) {
	o := rigOpts{}
	r := newRig(t, o)
	pr := prepare(t, o, "stop", randomPrompt(91, 30, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 20})
	if len(pr.want) < 6 {
		t.Skipf("reference too short (%d tokens) to pick a stop id", len(pr.want))
	}
	stop := pr.want[4]
	cut := 0
	for cut < len(pr.want) && pr.want[cut] != stop {
		cut++
	}
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	body := decodeBody(pr)
	body["stop_token_ids"] = []int{stop}
	d := r.decode(t, body)
	if d.finishReason() != "stop" || len(d.ids) != cut+1 || d.ids[cut] != stop {
		t.Fatalf("stop at %d: got %v (%s), local %v", stop, d.ids, d.finishReason(), pr.want)
	}
}

func TestInfoEndpoints(t *testing.T) {
	o := rigOpts{slots: 2, mtp: true}
	r := newRig(t, o)
	var capa decodeapi.Capabilities
	if code := r.getJSON(t, "/capabilities", &capa); code != http.StatusOK {
		t.Fatalf("capabilities %d", code)
	}
	if capa.Model != "glm5" || capa.LayoutVersion != handoff.LayoutVersion || capa.KVCacheDType != "fp8_ds_mla" || capa.NumLayers != 4 ||
		capa.MaxSeqLen != testMaxSeq || capa.MaxInflight != 2 || !capa.MTP || capa.Transport.Kind != "tcp" || len(capa.Regions) == 0 {
		t.Fatalf("capabilities %+v", capa)
	}
	pr := prepare(t, o, "info", randomPrompt(101, 20, r.lm.cfg.VocabSize), engine.Params{MaxTokens: 6})
	if err := newSender(t, r, "tcp").send(pr); err != nil {
		t.Fatal(err)
	}
	var st decodeapi.Status
	r.getJSON(t, "/decode_status", &st)
	if st.MaxInflight != 2 || st.Busy != 1 || st.Slots[0].State != "ready" || st.Slots[0].RID != "i…" /* masked without a /pd/* token */ {
		t.Fatalf("status with ready state %+v", st)
	}
	checkEqual(t, pr, r.decode(t, decodeBody(pr)))
	m := r.metricsText(t)
	for _, want := range []string{
		`tilert_decode_requests_total{outcome="` + string(pr.finish) + `"} 1`,
		"tilert_decode_tokens_total " + itoa(len(pr.want)),
		"tilert_decode_step_seconds_count ",
		`tilert_decode_step_batch_size_bucket{le="1"} `,
		"tilert_decode_transfer_bytes_total " + itoa(int(sumBytes(pr))),
		"tilert_decode_transfer_seconds_count 1",
		"tilert_decode_mtp_draft_tokens_total ",
		"tilert_decode_mtp_accepted_tokens_total ",
		"tilert_decode_slots 2",
		"tilert_decode_slots_busy 0",
		`tilert_decode_rejects_total{reason="busy",where="ctrl"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, m)
		}
	}
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/health", 200}, {"HEAD", "/health", 200}, {"GET", "/nope", 404},
		{"GET", "/pd/decode", 405}, {"POST", "/metrics", 405}, {"POST", "/pd/cancel", 400},
	} {
		req, _ := http.NewRequest(c.method, r.base+c.path, bytes.NewReader(nil))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.status)
		}
	}
}

func sumBytes(pr *prepared) int64 {
	var n int64
	for _, s := range pr.segs {
		n += int64(len(s.Data))
	}
	return n
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
