package router

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/tokenizer"
)

// The random-weight tiny model says whatever its logits say, so these
// tests make it say a tool call the way any user could: with logit_bias
// and a repetition penalty. forcedBias computes, from the engine's own
// logits at each step of the wanted sequence (teacher-forced prefills on
// the CPU engine), a bias per token such that greedy decoding picks seq[i]
// at step i: -100 for every other token, and for the sequence's tokens,
// solved from the last one back, enough to beat every later one by a
// margin; a repetition penalty of 1e6 then takes each token out once said.
// The text then comes out through the real stack: dev-vllm's prefill (the
// first token), the decode node (the rest, with MTP), the router's
// detokeniser and parsers, the openai npm client.
func forcedBias(t *testing.T, s *stack, prompt, seq []int) map[string]float64 {
	t.Helper()
	mcfg, err := model.LoadConfig(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := cpu.New(mcfg, w, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: len(prompt) + len(seq) + 8})
	if err != nil {
		t.Fatal(err)
	}
	V := mcfg.VocabSize
	lps := make([]map[int]float64, len(seq)) // step i's logprobs of the sequence's tokens
	for i := range seq {
		ctx := append(append([]int(nil), prompt...), seq[:i]...)
		if _, err := e.Prefill(0, ctx, engine.Params{Logprobs: true, TopLogprobs: V}); err != nil {
			t.Fatal(err)
		}
		lp, _ := e.PrefillLogprobs(0)
		e.Release(0)
		lps[i] = map[int]float64{}
		for _, a := range lp.Top {
			lps[i][a.ID] = float64(a.Logprob)
		}
	}
	const margin = 4
	b := make([]float64, len(seq))
	for i := len(seq) - 2; i >= 0; i-- {
		need := math.Inf(-1)
		for j := i + 1; j < len(seq); j++ {
			need = math.Max(need, lps[i][seq[j]]+b[j])
		}
		b[i] = need - lps[i][seq[i]] + margin
	}
	shift := 100 - slices.Max(b)
	out := make(map[string]float64, V)
	for id := 0; id < V; id++ {
		out[strconv.Itoa(id)] = -100
	}
	for i, id := range seq {
		b[i] += shift
		if b[i] < -100 || lps[i][id]+b[i] < 10 { // positive raw logit+bias (lse >= log(vocab) > 0 here), so the penalty divides
			t.Fatalf("no bias forces this sequence (step %d: bias %.1f, logprob %.1f); pick other tokens", i, b[i], lps[i][id])
		}
		out[strconv.Itoa(id)] = b[i]
	}
	return out
}

// wordTokens returns n tokens that decode to a plain lowercase word (so
// they make good tool, argument and value names), none of them in avoid.
func wordTokens(t *testing.T, tok *tokenizer.Tokenizer, n int, avoid []int) ([]int, []string) {
	t.Helper()
	word := regexp.MustCompile(`^[a-z]{3,}$`)
	var ids []int
	var words []string
	seen := map[string]bool{}
	for id := 0; id < tok.VocabSize() && len(ids) < n; id++ {
		w := tok.Decode([]int{id}, false)
		if word.MatchString(w) && !seen[w] && !tok.IsSpecial(id) && !slices.Contains(avoid, id) {
			seen[w] = true
			ids, words = append(ids, id), append(words, w)
		}
	}
	if len(ids) < n {
		t.Fatalf("only %d word tokens in the vocabulary", len(ids))
	}
	return ids, words
}

func mustID(t *testing.T, tok *tokenizer.Tokenizer, s string) int {
	t.Helper()
	id, ok := tok.TokenID(s)
	if !ok {
		t.Fatalf("no token %q", s)
	}
	return id
}

type e2eResult struct {
	Content   *string `json:"content"`
	Reasoning *string `json:"reasoning"`
	ToolCalls []struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"tool_calls"`
	Finish     string `json:"finish"`
	ToolDeltas int    `json:"tool_deltas"`
	Logprobs   int    `json:"logprobs"`
}

type e2eCase struct {
	Name string         `json:"name"`
	Body map[string]any `json:"body"`
}

// runToolsScript runs testdata/openai_tools_e2e.mjs against url.
func runToolsScript(t *testing.T, nm, url string, cases []e2eCase) map[string]e2eResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "openai_tools_e2e.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(nm, "openai_tools_e2e.mjs")
	if err := os.WriteFile(script, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cb, _ := json.Marshal(cases)
	cf := filepath.Join(t.TempDir(), "cases.json")
	if err := os.WriteFile(cf, cb, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("node", script, url+"/v1", cf).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr)
	}
	t.Logf("openai client: %s", out)
	var res map[string]e2eResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return res
}

// checkPair checks a streamed and a non-streamed case gave the same
// answer.
func checkPair(t *testing.T, res map[string]e2eResult, name string) e2eResult {
	t.Helper()
	a, b := res[name], res[name+" stream"]
	ja, _ := json.Marshal(struct {
		C, R *string
		T    any
		F    string
	}{a.Content, a.Reasoning, callsNoID(a), a.Finish})
	jb, _ := json.Marshal(struct {
		C, R *string
		T    any
		F    string
	}{b.Content, b.Reasoning, callsNoID(b), b.Finish})
	if string(ja) != string(jb) {
		t.Errorf("%s: stream %s != non-stream %s", name, jb, ja)
	}
	return a
}

func callsNoID(r e2eResult) [][2]string {
	var out [][2]string
	for _, c := range r.ToolCalls {
		out = append(out, [2]string{c.Name, c.Arguments})
	}
	return out
}

// GLM-4.7/GLM-5 format (glm47 tool parser, glm45 reasoning parser): tool
// calls with tool_choice auto and named, and reasoning, streamed and not.
func TestOpenAIToolsGLM(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the openai npm e2e test")
	}
	nm := openaiNodeModules(t)
	s := newStack(t, stackOpts{router: func(o *Options) {
		o.ToolCallParser, o.ReasoningParser, o.EnableAutoToolChoice = "glm47", "glm45", true
	}})
	msgs := []any{map[string]any{"role": "user", "content": testPrompt}}
	raw, _ := json.Marshal(msgs[0])
	chatText, _ := devvllm.RenderChat(s.tok, []json.RawMessage{raw})
	promptIDs, _ := s.tok.Encode(chatText, false)
	ids, words := wordTokens(t, s.tok, 7, promptIDs)
	name, key, val := words[0], words[1], words[2]
	tc := func(n string) int { return mustID(t, s.tok, n) }
	toolSeq := []int{tc("<tool_call>"), ids[0], tc("<arg_key>"), ids[1], tc("</arg_key>"), tc("<arg_value>"), ids[2],
		tc("</arg_value>"), tc("</tool_call>"), tc("<|observation|>")}
	reasonSeq := []int{ids[3], ids[4], tc("</think>"), ids[5], ids[6], tc("<|endoftext|>")}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": name, "description": "a test tool",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{key: map[string]any{"type": "string"}}}}}}
	bias := map[string]map[string]float64{"tool": forcedBias(t, s, promptIDs, toolSeq), "reason": forcedBias(t, s, promptIDs, reasonSeq)}
	body := func(seq []int, extra map[string]any) map[string]any {
		which := "tool"
		if seq[0] == reasonSeq[0] {
			which = "reason"
		}
		b := map[string]any{"model": "glm-5-tiny", "messages": msgs, "max_tokens": len(seq) + 4, "temperature": 0,
			"logit_bias": bias[which], "repetition_penalty": 1e6}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	var cases []e2eCase
	for _, stream := range []bool{false, true} {
		suffix := ""
		if stream {
			suffix = " stream"
		}
		cases = append(cases,
			e2eCase{"auto" + suffix, body(toolSeq, map[string]any{"tools": tools, "tool_choice": "auto", "stream": stream})},
			e2eCase{"named" + suffix, body(toolSeq, map[string]any{"tools": tools, "stream": stream,
				"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": name}}})},
			e2eCase{"reasoning" + suffix, body(reasonSeq, map[string]any{"stream": stream, "logprobs": true, "top_logprobs": 2,
				"chat_template_kwargs": map[string]any{"enable_thinking": true}})},
		)
	}
	res := runToolsScript(t, nm, s.router.URL, cases)
	wantArgs := `{"` + key + `": "` + val + `"}`
	for _, c := range []struct{ name, finish string }{{"auto", "tool_calls"}, {"named", "stop"}} {
		r := checkPair(t, res, c.name)
		if len(r.ToolCalls) != 1 || r.ToolCalls[0].Name != name || r.ToolCalls[0].Arguments != wantArgs ||
			r.ToolCalls[0].Type != "function" || r.ToolCalls[0].ID == "" || r.Finish != c.finish {
			t.Errorf("%s: %+v, want one call %s(%s), finish %s", c.name, r, name, wantArgs, c.finish)
		}
		if r.Content != nil && *r.Content != "" {
			t.Errorf("%s: content %q beside the tool call", c.name, *r.Content)
		}
		if d := res[c.name+" stream"].ToolDeltas; d < 3 {
			t.Errorf("%s stream: the call came in %d deltas, want id+name, argument fragments, closing brace", c.name, d)
		}
	}
	r := checkPair(t, res, "reasoning")
	wantR, wantC := s.tok.Decode(ids[3:5], false), s.tok.Decode(ids[5:7], false)
	if r.Reasoning == nil || *r.Reasoning != wantR || r.Content == nil || *r.Content != wantC || r.Finish != "stop" {
		t.Errorf("reasoning: %+v, want reasoning %q content %q", r, wantR, wantC)
	}
	if r.Logprobs != len(reasonSeq) || res["reasoning stream"].Logprobs != len(reasonSeq) {
		t.Errorf("reasoning: %d / %d logprob entries, want %d", r.Logprobs, res["reasoning stream"].Logprobs, len(reasonSeq))
	}
}

// DeepSeek-V3.2's DSML format (deepseek_v32): the test model's tokenizer
// gets eight of its unused added tokens renamed to the DSML tags (as plain,
// non-special text), so the model can say a DSML call token by token.
func TestOpenAIToolsDSML(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the openai npm e2e test")
	}
	nm := openaiNodeModules(t)
	s := newStack(t, stackOpts{})
	rename := map[string]string{
		"[MASK]": "<｜DSML｜function_calls>", "[sMASK]": `<｜DSML｜invoke name="`, "<eop>": `">`,
		"<|system|>": `<｜DSML｜parameter name="`, "<tool_response>": `" string="true">`, "</tool_response>": "</｜DSML｜parameter>",
		"/nothink": "</｜DSML｜invoke>", "<arg_key>": "</｜DSML｜function_calls>",
	}
	dir := renamedModel(t, s.dir, rename)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var specs []string
	for _, a := range s.nodes {
		host, hp, _ := net.SplitHostPort(a.HTTP)
		_, cp, _ := net.SplitHostPort(a.Ctrl)
		specs = append(specs, host+":"+cp+":"+hp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rt, err := New(ctx, Options{VLLMURL: s.vllm.URL, Nodes: specs, Tokenizer: tok, ModelPath: dir, ServedModel: "glm-5-tiny",
		QueueSize: 4, QueueTimeout: time.Minute, ToolCallParser: "deepseek_v32", EnableAutoToolChoice: true, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv := serveRouter(t, rt)

	msgs := []any{map[string]any{"role": "user", "content": testPrompt}}
	raw, _ := json.Marshal(msgs[0])
	chatText, _ := devvllm.RenderChat(s.tok, []json.RawMessage{raw})
	promptIDs, _ := s.tok.Encode(chatText, false)
	ids, words := wordTokens(t, tok, 3, promptIDs)
	name, key, val := words[0], words[1], words[2]
	tc := func(orig string) int { return mustID(t, s.tok, orig) } // ids of the renamed tokens
	seq := []int{tc("[MASK]"), tc("[sMASK]"), ids[0], tc("<eop>"), tc("<|system|>"), ids[1], tc("<tool_response>"), ids[2],
		tc("</tool_response>"), tc("/nothink"), tc("<arg_key>"), mustID(t, s.tok, "<|observation|>")}
	if got := tok.Decode(seq[:len(seq)-1], true); got != `<｜DSML｜function_calls><｜DSML｜invoke name="`+name+`"><｜DSML｜parameter name="`+key+`" string="true">`+val+`</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>` {
		t.Fatalf("the renamed tokens spell %q", got)
	}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": name,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{key: map[string]any{"type": "string"}}}}}}
	dbias := forcedBias(t, s, promptIDs, seq)
	var cases []e2eCase
	for _, stream := range []bool{false, true} {
		suffix := ""
		if stream {
			suffix = " stream"
		}
		for _, choice := range []struct {
			n string
			v any
		}{{"auto", "auto"}, {"named", map[string]any{"type": "function", "function": map[string]any{"name": name}}}} {
			cases = append(cases, e2eCase{choice.n + suffix, map[string]any{"model": "glm-5-tiny", "messages": msgs,
				"max_tokens": len(seq) + 4, "temperature": 0, "logit_bias": dbias, "repetition_penalty": 1e6,
				"tools": tools, "tool_choice": choice.v, "stream": stream}})
		}
	}
	res := runToolsScript(t, nm, srv.URL, cases)
	wantArgs := `{"` + key + `": "` + val + `"}`
	for _, c := range []struct{ name, finish string }{{"auto", "tool_calls"}, {"named", "stop"}} {
		r := checkPair(t, res, c.name)
		if len(r.ToolCalls) != 1 || r.ToolCalls[0].Name != name || r.ToolCalls[0].Arguments != wantArgs || r.Finish != c.finish {
			t.Errorf("%s: %+v, want one call %s(%s), finish %s", c.name, r, name, wantArgs, c.finish)
		}
	}
}

// renamedModel is a copy of model dir dir (weights linked) whose
// tokenizer.json has the added tokens named in rename renamed, as plain
// (non-special) tokens.
func renamedModel(t *testing.T, dir string, rename map[string]string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(dir))
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "tokenizer.json" {
			continue
		}
		if err := os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(out, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	if err := json.Unmarshal(b, &tj); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, a := range tj["added_tokens"].([]any) {
		m := a.(map[string]any)
		if to, ok := rename[m["content"].(string)]; ok {
			m["content"], m["special"] = to, false
			n++
		}
	}
	if n != len(rename) {
		t.Fatalf("renamed %d of %d tokens", n, len(rename))
	}
	b, _ = json.Marshal(tj)
	if err := os.WriteFile(filepath.Join(out, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
