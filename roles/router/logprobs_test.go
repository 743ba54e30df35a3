package router

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/openai"
	"github.com/tilert-go/tilert/openai/parsers"
)

// Logprobs and the sampling controls users set go through the whole stack
// (vLLM's first token, the decode node's NDJSON, the router's OpenAI
// shapes) and equal the engine's own generation with the same settings;
// streamed == non-streamed.
func TestLogprobsAndPenalties(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	const maxTokens = 12
	bias := prompt[3]
	p := engine.Params{MaxTokens: maxTokens, RepetitionPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.4,
		LogitBias: map[int]float32{bias: 4}, PromptIDs: prompt, Logprobs: true, TopLogprobs: 3}
	ids, lps, _ := s.referenceP(t, prompt, p)
	plain, _ := s.reference(t, prompt, maxTokens, true)
	if slices.Equal(ids, plain) {
		t.Fatal("the settings change nothing on this prompt; the test would prove nothing")
	}
	body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.4,
		"logit_bias": map[string]float64{strconv.Itoa(bias): 4}, "logprobs": 3}
	type comp struct {
		Choices []struct {
			Text     string                     `json:"text"`
			Logprobs *openai.CompletionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	var c comp
	res := readJSON(t, s.post(t, "/v1/completions", body), false)
	if err := json.Unmarshal([]byte(res.raw[0]), &c); err != nil {
		t.Fatal(err)
	}
	if res.text != s.tok.Decode(ids, true) {
		t.Fatalf("text %q, want the engine's %q", res.text, s.tok.Decode(ids, true))
	}
	lp := c.Choices[0].Logprobs
	if lp == nil || len(lp.TokenLogprobs) != len(ids) {
		t.Fatalf("logprobs %+v for %d tokens", lp, len(ids))
	}
	for i := range ids {
		if d := math.Abs(lp.TokenLogprobs[i] - float64(lps[i].Logprob)); d > 1e-6 {
			t.Fatalf("token %d logprob %g, engine %g", i, lp.TokenLogprobs[i], lps[i].Logprob)
		}
		if len(lp.TopLogprobs[i]) < 3 {
			t.Fatalf("token %d: %d alternatives", i, len(lp.TopLogprobs[i]))
		}
		for _, a := range lps[i].Top {
			if v, ok := lp.TopLogprobs[i][s.tok.Decode([]int{a.ID}, false)]; !ok || math.Abs(v-float64(a.Logprob)) > 1e-6 {
				t.Fatalf("token %d: alternative %d (%g) missing or off: %v", i, a.ID, a.Logprob, lp.TopLogprobs[i])
			}
		}
	}
	// Streamed: the same text and the same logprobs, spread over chunks.
	body["stream"] = true
	sres := readSSE(t, s.post(t, "/v1/completions", body), false)
	var streamed []float64
	for _, raw := range sres.raw {
		var ch comp
		if json.Unmarshal([]byte(raw), &ch) == nil && len(ch.Choices) > 0 && ch.Choices[0].Logprobs != nil {
			streamed = append(streamed, ch.Choices[0].Logprobs.TokenLogprobs...)
		}
	}
	if sres.text != res.text || !floatsEqual(streamed, lp.TokenLogprobs) {
		t.Fatalf("stream %q %v != non-stream %q %v", sres.text, streamed, res.text, lp.TokenLogprobs)
	}

	// Chat: logprobs true, top_logprobs 2.
	chatBody := map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}, "max_tokens": 6,
		"temperature": 0, "ignore_eos": true, "presence_penalty": 1.5, "logprobs": true, "top_logprobs": 2}
	var cc struct {
		Choices []struct {
			Logprobs *openai.ChatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	cres := readJSON(t, s.post(t, "/v1/chat/completions", chatBody), true)
	if err := json.Unmarshal([]byte(cres.raw[0]), &cc); err != nil || cc.Choices[0].Logprobs == nil {
		t.Fatalf("%v %s", err, cres.raw[0])
	}
	content := cc.Choices[0].Logprobs.Content
	if len(content) != 6 {
		t.Fatalf("%d chat logprob entries, want 6", len(content))
	}
	for i, e := range content {
		if len(e.TopLogprobs) != 2 || e.Logprob > 0 || e.TopLogprobs[0].Logprob < e.TopLogprobs[1].Logprob {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	chatBody["stream"] = true
	scres := readSSE(t, s.post(t, "/v1/chat/completions", chatBody), true)
	var sc []openai.TokenLogprob
	for _, raw := range scres.raw {
		var ch struct {
			Choices []struct {
				Logprobs *openai.ChatLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(raw), &ch) == nil && len(ch.Choices) > 0 && ch.Choices[0].Logprobs != nil {
			sc = append(sc, ch.Choices[0].Logprobs.Content...)
		}
	}
	a, _ := json.Marshal(sc)
	b, _ := json.Marshal(content)
	if string(a) != string(b) || scres.text != cres.text {
		t.Fatalf("chat stream logprobs %s\n!= non-stream %s", a, b)
	}
}

func floatsEqual(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// bad_words and min_p go through the whole stack (vLLM's first token, the
// node's steps with MTP drafts) and equal the engine's own generation with
// the words' ids by vLLM's rule; streamed == non-streamed.
func TestBadWordsAndMinP(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	const maxTokens = 16
	plain, _ := s.reference(t, prompt, maxTokens, true)
	// Words the plain continuation writes, chosen so that their ids are the
	// continuation's own: one token (after the first) and two tokens.
	pick := func(from, n int) string {
		for i := from; i+n <= len(plain); i++ {
			w := s.tok.Decode(plain[i:i+n], true)
			ids, err := s.tok.BadWords([]string{w}, 128)
			if err == nil && slices.ContainsFunc(ids, func(seq []int) bool { return slices.Equal(seq, plain[i:i+n]) }) {
				return w
			}
		}
		t.Fatalf("no %d-token word of %v encodes back to its ids", n, plain)
		return ""
	}
	for _, words := range [][]string{{pick(1, 1)}, {pick(1, 2)}} {
		ids, err := s.tok.BadWords(words, 128)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _ := s.referenceP(t, prompt, engine.Params{MaxTokens: maxTokens, BadWords: ids})
		if slices.Equal(want, plain) {
			t.Fatalf("bad words %q (%v) change nothing", words, ids)
		}
		body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "bad_words": words}
		res := readJSON(t, s.post(t, "/v1/completions", body), false)
		if wt := s.tok.Decode(want, true); res.text != wt {
			t.Fatalf("bad words %q: %q, want the engine's %q", words, res.text, wt)
		}
		body["stream"] = true
		if sres := readSSE(t, s.post(t, "/v1/completions", body), false); sres.text != res.text {
			t.Fatalf("bad words %q streamed: %q, want %q", words, sres.text, res.text)
		}
	}

	p := engine.Params{MaxTokens: maxTokens, Temperature: 1, Seed: 7, MinP: 0.3}
	want, _, _ := s.referenceP(t, prompt, p)
	p.MinP = 0
	if free, _, _ := s.referenceP(t, prompt, p); slices.Equal(free, want) {
		t.Fatal("min_p 0.3 changes nothing on this prompt and seed; the test would prove nothing")
	}
	body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 1, "seed": 7, "min_p": 0.3, "ignore_eos": true}
	if res := readJSON(t, s.post(t, "/v1/completions", body), false); res.text != s.tok.Decode(want, true) {
		t.Fatalf("min_p: %q, want the engine's %q", res.text, s.tok.Decode(want, true))
	}
}

// return_tokens_as_token_ids writes every logprob token as token_id:N (the
// sampled ones are the engine's ids), in both shapes.
func TestTokensAsIDs(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	const maxTokens = 6
	ids, _ := s.reference(t, prompt, maxTokens, true)
	body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"logprobs": 2, "return_tokens_as_token_ids": true}
	var c struct {
		Choices []struct {
			Logprobs *openai.CompletionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	res := readJSON(t, s.post(t, "/v1/completions", body), false)
	if err := json.Unmarshal([]byte(res.raw[0]), &c); err != nil || c.Choices[0].Logprobs == nil {
		t.Fatalf("%v %s", err, res.raw[0])
	}
	lp := c.Choices[0].Logprobs
	if len(lp.Tokens) != len(ids) {
		t.Fatalf("%d tokens, want %d", len(lp.Tokens), len(ids))
	}
	off := 0
	for i, id := range ids {
		want := "token_id:" + strconv.Itoa(id)
		if lp.Tokens[i] != want || lp.TextOffset[i] != off {
			t.Fatalf("token %d: %q at %d, want %q at %d", i, lp.Tokens[i], lp.TextOffset[i], want, off)
		}
		off += len(want)
		for k := range lp.TopLogprobs[i] {
			if !strings.HasPrefix(k, "token_id:") {
				t.Fatalf("token %d: alternative %q", i, k)
			}
		}
	}
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}, "max_tokens": 3,
		"temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 1, "return_tokens_as_token_ids": true}
	var cc struct {
		Choices []struct {
			Logprobs *openai.ChatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	cres := readJSON(t, s.post(t, "/v1/chat/completions", chat), true)
	if err := json.Unmarshal([]byte(cres.raw[0]), &cc); err != nil || cc.Choices[0].Logprobs == nil || len(cc.Choices[0].Logprobs.Content) != 3 {
		t.Fatalf("%v %s", err, cres.raw[0])
	}
	for _, e := range cc.Choices[0].Logprobs.Content {
		if !strings.HasPrefix(e.Token, "token_id:") || !strings.HasPrefix(e.TopLogprobs[0].Token, "token_id:") ||
			string(rune(e.TopLogprobs[0].Bytes[0])) != "t" {
			t.Fatalf("chat entry %+v", e)
		}
	}
}

// return_token_ids: the prompt's ids (vLLM's) and the generated ids, the
// engine's own; streamed, the prompt's ids come once, on the first chunk,
// and the chunks' ids add up to the same list.
func TestReturnTokenIDs(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	const maxTokens = 7
	ids, _ := s.reference(t, prompt, maxTokens, true)
	type choice struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		TokenIDs       []int `json:"token_ids"`
	}
	type answer struct {
		PromptTokenIDs []int    `json:"prompt_token_ids"` // chat
		Choices        []choice `json:"choices"`
	}
	collect := func(raws []string) (promptIDs, out []int, prompts int) {
		for _, raw := range raws {
			var a answer
			if json.Unmarshal([]byte(raw), &a) != nil {
				continue
			}
			if a.PromptTokenIDs != nil {
				promptIDs, prompts = a.PromptTokenIDs, prompts+1
			}
			for _, c := range a.Choices {
				if c.PromptTokenIDs != nil {
					promptIDs, prompts = c.PromptTokenIDs, prompts+1
				}
				out = append(out, c.TokenIDs...)
			}
		}
		return promptIDs, out, prompts
	}
	body := map[string]any{"prompt": testPrompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "return_token_ids": true}
	res := readJSON(t, s.post(t, "/v1/completions", body), false)
	if p, got, _ := collect(res.raw); !slices.Equal(p, prompt) || !slices.Equal(got, ids) {
		t.Fatalf("completion: prompt ids %v, ids %v; want %v, %v", p, got, prompt, ids)
	}
	body["stream"] = true
	sres := readSSE(t, s.post(t, "/v1/completions", body), false)
	if p, got, n := collect(sres.raw); !slices.Equal(p, prompt) || !slices.Equal(got, ids) || n != 1 {
		t.Fatalf("completion stream: prompt ids %v (%d times), ids %v; want %v once, %v", p, n, got, prompt, ids)
	}
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}, "max_tokens": maxTokens,
		"temperature": 0, "ignore_eos": true, "return_token_ids": true}
	cres := readJSON(t, s.post(t, "/v1/chat/completions", chat), true)
	cp, cids, _ := collect(cres.raw)
	if len(cp) == 0 || len(cids) != maxTokens || s.tok.Decode(cids, true) != cres.text {
		t.Fatalf("chat: prompt ids %v, ids %v (text %q)", cp, cids, cres.text)
	}
	chat["stream"] = true
	scres := readSSE(t, s.post(t, "/v1/chat/completions", chat), true)
	if p, got, n := collect(scres.raw); !slices.Equal(p, cp) || !slices.Equal(got, cids) || n != 1 {
		t.Fatalf("chat stream: prompt ids %v (%d times), ids %v; want %v once, %v", p, n, got, cp, cids)
	}
	// Without the field nothing is added.
	delete(body, "return_token_ids")
	delete(body, "stream")
	if p, got, _ := collect(readJSON(t, s.post(t, "/v1/completions", body), false).raw); p != nil || got != nil {
		t.Fatalf("without return_token_ids: %v %v", p, got)
	}
}

// thinking_token_budget: a prompt that opens a thinking block gets budget
// tokens in it, then the end tag, forced (by vLLM for the first token, by
// the decode node after it); the ids equal the engine's own with the budget.
func TestThinkingBudget(t *testing.T) {
	s := newStack(t, stackOpts{router: func(o *Options) { o.ReasoningParser = "glm45" }})
	start, end := mustID(t, s.tok, "<think>"), mustID(t, s.tok, "</think>")
	text := testPrompt + "<think>"
	prompt, _ := s.tok.Encode(text, true)
	if prompt[len(prompt)-1] != start {
		t.Fatalf("the prompt %v does not end with <think> (%d)", prompt, start)
	}
	const maxTokens = 8
	free, _, _ := s.referenceP(t, prompt, engine.Params{MaxTokens: maxTokens})
	for _, budget := range []int{0, 3} {
		p := engine.Params{MaxTokens: maxTokens, Think: engine.NewThinkBudget(budget, []int{start}, []int{end}, prompt)}
		want, _, _ := s.referenceP(t, prompt, p)
		if want[budget] != end || free[budget] == end {
			t.Fatalf("budget %d: the engine's %v (free %v) does not force </think> (%d) at %d", budget, want, free, end, budget)
		}
		body := map[string]any{"prompt": text, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
			"thinking_token_budget": budget, "return_token_ids": true}
		var c struct {
			Choices []struct {
				TokenIDs []int `json:"token_ids"`
			} `json:"choices"`
		}
		res := readJSON(t, s.post(t, "/v1/completions", body), false)
		if err := json.Unmarshal([]byte(res.raw[0]), &c); err != nil || !slices.Equal(c.Choices[0].TokenIDs, want) {
			t.Fatalf("budget %d: ids %v (%v), want the engine's %v", budget, c.Choices, err, want)
		}
	}
}

// repetition_detection ends a generation whose tail repeats, with vLLM's
// finish_reason "repetition", streamed and not, and never before
// min_tokens; the node's slot is freed (the request is cancelled there).
func TestRepetitionDetection(t *testing.T) {
	s := newStack(t, stackOpts{})
	x := s.tok.VocabSize() / 3 // made the only likely token: the output repeats it
	body := map[string]any{"prompt": testPrompt, "max_tokens": 10, "temperature": 0, "ignore_eos": true,
		"logit_bias": map[string]float64{strconv.Itoa(x): 100}, "return_token_ids": true}
	ids := func(raws []string) []int {
		var out []int
		for _, raw := range raws {
			var a struct {
				Choices []struct {
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(raw), &a) == nil {
				for _, c := range a.Choices {
					out = append(out, c.TokenIDs...)
				}
			}
		}
		return out
	}
	res := readJSON(t, s.post(t, "/v1/completions", body), false)
	if got := ids(res.raw); len(got) != 10 || res.finish != "length" {
		t.Fatalf("without detection: %v, finish %q; want 10 tokens, length", got, res.finish)
	}
	for _, tc := range []struct {
		minTokens, want int
		stream          bool
		maxTokens       int
		finish          string
	}{{0, 3, false, 10, "repetition"}, {0, 3, true, 10, "repetition"}, {5, 5, false, 10, "repetition"}, {5, 5, true, 10, "repetition"},
		{0, 3, false, 3, "length"}} { // the last token allowed: length, as vLLM checks it first
		body["repetition_detection"] = map[string]any{"max_pattern_size": 2, "min_count": 3}
		body["min_tokens"], body["stream"], body["max_tokens"] = tc.minTokens, tc.stream, tc.maxTokens
		var r completion
		if tc.stream {
			r = readSSE(t, s.post(t, "/v1/completions", body), false)
		} else {
			r = readJSON(t, s.post(t, "/v1/completions", body), false)
		}
		got := ids(r.raw)
		if len(got) != tc.want || r.finish != tc.finish || slices.ContainsFunc(got, func(id int) bool { return id != x }) {
			t.Fatalf("%+v: %v, finish %q; want %d x %d, %s", tc, got, r.finish, tc.want, x, tc.finish)
		}
	}
	deadline := time.Now().Add(5 * time.Second) // a stream's slot is released just after its [DONE]
	for b, _ := s.rt.gate.busy(); b != 0; b, _ = s.rt.gate.busy() {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots busy after the requests", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// prompt_logprobs are vLLM's prefill's, relayed as vLLM wrote them (dev-vllm
// does not compute them, so a wrapper plays that part of vLLM); streamed,
// they are refused as vLLM refuses them. return_prompt_text relays the
// rendered prompt, on a stream's first chunk only.
func TestPromptLogprobsAndText(t *testing.T) {
	canned := json.RawMessage(`[null,{"17":{"logprob":-1.5,"rank":1,"decoded_token":"x"}},{"9":{"logprob":-0.25,"rank":1,"decoded_token":"y"}}]`)
	s := newStack(t, stackOpts{vllmWrap: func(inner fasthttp.RequestHandler) fasthttp.RequestHandler {
		return func(ctx *fasthttp.RequestCtx) {
			var body map[string]any
			if json.Unmarshal(ctx.PostBody(), &body) != nil || body["prompt_logprobs"] == nil {
				inner(ctx)
				return
			}
			delete(body, "prompt_logprobs")
			b, _ := json.Marshal(body)
			ctx.Request.SetBody(b)
			inner(ctx)
			var out map[string]any
			if json.Unmarshal(ctx.Response.Body(), &out) != nil {
				return
			}
			if _, chat := body["messages"]; chat {
				out["prompt_logprobs"] = canned
			} else {
				out["choices"].([]any)[0].(map[string]any)["prompt_logprobs"] = canned
			}
			b, _ = json.Marshal(out)
			ctx.Response.SetBody(b)
		}
	}})
	msgs := []any{map[string]any{"role": "user", "content": testPrompt}}
	for _, chat := range []bool{false, true} {
		path, body := "/v1/completions", map[string]any{"prompt": testPrompt, "max_tokens": 3, "prompt_logprobs": 1}
		if chat {
			path, body = "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3, "prompt_logprobs": 1}
		}
		res := readJSON(t, s.post(t, path, body), chat)
		var a struct {
			PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
			Choices        []struct {
				PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(res.raw[0]), &a); err != nil {
			t.Fatal(err)
		}
		got := a.Choices[0].PromptLogprobs
		if chat {
			got = a.PromptLogprobs
		}
		if !jsonEqual(got, canned) {
			t.Fatalf("chat=%v: prompt_logprobs %s, want vLLM's %s", chat, got, canned)
		}
		body["stream"] = true
		resp := s.post(t, path, body)
		checkError(t, resp, http.StatusBadRequest, "prompt_logprobs", "")
	}
	chat := map[string]any{"messages": msgs, "max_tokens": 3, "return_prompt_text": true}
	res := readJSON(t, s.post(t, "/v1/chat/completions", chat), true)
	var a struct {
		PromptText *string `json:"prompt_text"`
	}
	if err := json.Unmarshal([]byte(res.raw[0]), &a); err != nil || a.PromptText == nil || !strings.Contains(*a.PromptText, testPrompt) {
		t.Fatalf("prompt_text %v (%v) in %s", a.PromptText, err, res.raw[0])
	}
	chat["stream"] = true
	n := 0
	for _, raw := range readSSE(t, s.post(t, "/v1/chat/completions", chat), true).raw {
		var c struct {
			PromptText *string `json:"prompt_text"`
		}
		if json.Unmarshal([]byte(raw), &c) == nil && c.PromptText != nil {
			if n++; *c.PromptText != *a.PromptText {
				t.Fatalf("streamed prompt_text %q, want %q", *c.PromptText, *a.PromptText)
			}
		}
	}
	if n != 1 {
		t.Fatalf("prompt_text on %d chunks, want the first only", n)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// generation_config.json's defaults apply where the client set none, as
// vLLM applies them: max_new_tokens for a chat without max_tokens (capped by
// the context, never a 400) and temperature end to end; the penalties and
// skip_special_tokens into the node's request and vLLM's prefill body. A
// client's own value (0 included) wins.
func TestGenerationConfigDefaults(t *testing.T) {
	gc := t.TempDir()
	if err := os.WriteFile(filepath.Join(gc, "generation_config.json"),
		[]byte(`{"repetition_penalty":1.3,"presence_penalty":1.5,"frequency_penalty":0.25,"skip_special_tokens":false,"max_new_tokens":6,"temperature":0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOpts{maxSeqLen: 64, router: func(o *Options) { o.ModelPath = gc }})
	msg := map[string]any{"role": "user", "content": testPrompt}
	raw, _ := json.Marshal(msg)
	text, _ := devvllm.RenderChat(s.tok, []json.RawMessage{raw})
	prompt, _ := s.tok.Encode(text, false)
	p := engine.Params{MaxTokens: 6, RepetitionPenalty: 1.3, PresencePenalty: 1.5, FrequencyPenalty: 0.25, PromptIDs: prompt}
	want, _, _ := s.referenceP(t, prompt, p)
	body := map[string]any{"messages": []any{msg}, "ignore_eos": true, "return_token_ids": true}
	var a struct {
		Choices []struct {
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
	}
	res := readJSON(t, s.post(t, "/v1/chat/completions", body), true)
	if err := json.Unmarshal([]byte(res.raw[0]), &a); err != nil || !slices.Equal(a.Choices[0].TokenIDs, want) {
		t.Fatalf("defaults: %v (%v), want the engine's %v", a.Choices, err, want)
	}
	// A default larger than the room left is capped, not refused.
	if err := os.WriteFile(filepath.Join(gc, "generation_config.json"), []byte(`{"max_new_tokens":100000,"temperature":0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s.rt.defaults = readDefaults(gc)
	if r := readJSON(t, s.post(t, "/v1/chat/completions", body), true); r.finish != "length" {
		t.Fatalf("a default past the context: finish %q, want length", r.finish)
	}

	s.rt.defaults = samplingDefaults{}
	if err := json.Unmarshal([]byte(`{"repetition_penalty":1.3,"presence_penalty":1.5,"skip_special_tokens":false}`), &s.rt.defaults); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		client            string
		rep, presence     float64
		skip, wantDefault bool
	}{
		{`{"messages":[{"role":"user","content":"x"}]}`, 1.3, 1.5, false, true},
		{`{"messages":[{"role":"user","content":"x"}],"presence_penalty":0,"repetition_penalty":1,"skip_special_tokens":true}`, 1, 0, true, false},
	} {
		r, e := s.rt.check([]byte(tc.client), true)
		if e != nil {
			t.Fatal(e)
		}
		d := r.decodeRequest("rid", 1, []int{1, 2})
		wantRep := tc.rep // the node's request leaves an off repetition penalty out
		if wantRep == 1 {
			wantRep = 0
		}
		if d.Sampling.RepetitionPenalty != wantRep || d.Sampling.PresencePenalty != tc.presence || r.SkipSpecial != tc.skip {
			t.Errorf("%s: decode request %+v, skip_special_tokens %v", tc.client, d.Sampling, r.SkipSpecial)
		}
		b, _ := r.prefillBody("m", &node{host: "h", ctrlPort: 1}, "rid")
		var pb map[string]any
		_ = json.Unmarshal(b, &pb)
		if got := pb["presence_penalty"]; tc.wantDefault != (got == 1.5) {
			t.Errorf("%s: prefill body presence_penalty %v", tc.client, got)
		}
	}
}

// stream_options.continuous_usage_stats (with include_usage) puts the usage
// so far on every chunk, as vLLM does: the prompt's tokens, and the
// generated ones counted up to the answer's total.
func TestContinuousUsage(t *testing.T) {
	s := newStack(t, stackOpts{})
	prompt, _ := s.tok.Encode(testPrompt, true)
	for _, chat := range []bool{false, true} {
		path, body := "/v1/completions", map[string]any{"prompt": testPrompt}
		if chat {
			path, body = "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}}
		}
		body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"] = 6, 0, true, true
		body["stream_options"] = map[string]any{"include_usage": true, "continuous_usage_stats": true}
		events := func() []string {
			resp := s.post(t, path, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var out []string
			for _, line := range strings.Split(string(b), "\n") {
				if ev, ok := strings.CutPrefix(line, "data: "); ok && ev != "[DONE]" {
					out = append(out, ev)
				}
			}
			return out
		}
		last, chunks := -1, 0
		var final *openai.Usage
		for _, raw := range events() {
			var c struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *openai.Usage     `json:"usage"`
			}
			if err := json.Unmarshal([]byte(raw), &c); err != nil {
				t.Fatal(err)
			}
			if len(c.Choices) == 0 {
				final = c.Usage
				continue
			}
			chunks++
			if c.Usage == nil || c.Usage.CompletionTokens < last || c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens ||
				(!chat && c.Usage.PromptTokens != len(prompt)) {
				t.Fatalf("chat=%v: chunk %s", chat, raw)
			}
			last = c.Usage.CompletionTokens
		}
		if chunks < 3 || last != 6 || final == nil || final.CompletionTokens != 6 {
			t.Fatalf("chat=%v: %d chunks, last count %d, final usage %+v", chat, chunks, last, final)
		}
		delete(body, "stream_options")
		for _, raw := range events() {
			if strings.Contains(raw, `"usage"`) {
				t.Fatalf("chat=%v: usage without stream_options: %s", chat, raw)
			}
		}
	}
}

// usage.completion_tokens_details.reasoning_tokens: chat answers of a router
// with a reasoning parser count the generated tokens inside <think> blocks
// by vLLM's rule (parsers.ReasoningCounter), over exactly the ids returned,
// non-streamed, streamed (the final usage and every continuous one) and
// summed over n choices; without a parser, and on completions, the field
// is left out as vLLM leaves it.
func TestReasoningTokensUsage(t *testing.T) {
	s := newStack(t, stackOpts{maxInflight: 2, router: func(o *Options) { o.ReasoningParser = "glm45" }})
	start, end := mustID(t, s.tok, "<think>"), mustID(t, s.tok, "</think>")
	// Biased so that the tags come up among other tokens (seeded).
	body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": testPrompt}}, "max_tokens": 24,
		"temperature": 1, "seed": 5, "ignore_eos": true, "return_token_ids": true,
		"logit_bias": map[string]float64{strconv.Itoa(start): 9, strconv.Itoa(end): 6}}
	count := func(ids []int) int {
		c := parsers.NewReasoningCounter("glm45", false, start, end)
		for _, id := range ids {
			c.Add(id)
		}
		return c.Tokens()
	}
	type answer struct {
		Choices []struct {
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
		Usage *openai.Usage `json:"usage"`
	}
	post := func(s *stack, path string) answer {
		t.Helper()
		resp := s.post(t, path, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a answer
		if err := json.Unmarshal(b, &a); err != nil || resp.StatusCode != http.StatusOK || a.Usage == nil {
			t.Fatalf("%s: %s %s (%v)", path, resp.Status, b, err)
		}
		return a
	}
	for _, n := range []int{1, 2} {
		body["n"] = n
		delete(body, "stream")
		delete(body, "stream_options")
		a := post(s, "/v1/chat/completions")
		want := 0
		for _, c := range a.Choices {
			want += count(c.TokenIDs)
		}
		if want == 0 || a.Usage == nil || a.Usage.CompletionTokensDetails == nil || a.Usage.CompletionTokensDetails.ReasoningTokens != want {
			t.Fatalf("n=%d: usage %+v for ids %+v; want %d reasoning tokens (> 0)", n, a.Usage, a.Choices, want)
		}
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true, "continuous_usage_stats": n == 1}
		ids := map[int][]int{}
		var final *openai.Usage
		resp := s.post(t, "/v1/chat/completions", body)
		all, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(all), "\n") {
			raw, ok := strings.CutPrefix(line, "data: ")
			if !ok || raw == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Index    int   `json:"index"`
					TokenIDs []int `json:"token_ids"`
				} `json:"choices"`
				Usage *openai.Usage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(raw), &c); err != nil {
				t.Fatal(err)
			}
			for _, ch := range c.Choices {
				ids[ch.Index] = append(ids[ch.Index], ch.TokenIDs...)
			}
			if len(c.Choices) == 0 {
				final = c.Usage
			} else if n == 1 {
				if d := c.Usage.CompletionTokensDetails; d == nil || d.ReasoningTokens != count(ids[0]) {
					t.Fatalf("continuous usage %+v after ids %v", c.Usage, ids[0])
				}
			}
		}
		want = 0
		for _, v := range ids {
			want += count(v)
		}
		if final == nil || final.CompletionTokensDetails == nil || final.CompletionTokensDetails.ReasoningTokens != want || want == 0 {
			t.Fatalf("n=%d stream: final usage %+v for ids %v; want %d", n, final, ids, want)
		}
	}
	// Completions and a router without a parser: no details.
	plain := newStack(t, stackOpts{})
	delete(body, "stream")
	delete(body, "stream_options")
	body["n"] = 1
	if a := post(plain, "/v1/chat/completions"); a.Usage.CompletionTokensDetails != nil {
		t.Fatalf("without a reasoning parser: usage %+v", a.Usage)
	}
	delete(body, "messages")
	body["prompt"] = testPrompt
	if a := post(s, "/v1/completions"); a.Usage.CompletionTokensDetails != nil {
		t.Fatalf("completions: usage %+v", a.Usage)
	}
}
