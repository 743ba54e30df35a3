package router

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/openai"
)

// openaiNodeModules finds or installs the official openai npm package:
// $TILERT_OPENAI_NPM_DIR, else a cache under the user cache dir (npm
// install openai once). The test is skipped, saying why, where node, npm
// or the registry is unavailable.
func openaiNodeModules(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: the openai npm e2e test needs it")
	}
	dir := os.Getenv("TILERT_OPENAI_NPM_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		dir = filepath.Join(cache, "tilert-openai-npm")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err == nil {
		return dir
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("npm is not installed: cannot get the openai package")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("no cache dir for the openai package: %v", err)
	}
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "openai")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm install openai failed (no registry access?): %v\n%s", err, out)
	}
	return dir
}

// The official openai client (npm) drives the router: completions and chat,
// streamed and not, usage, a 400 as a typed error, the model list.
func TestOpenAINodeClient(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the openai npm e2e test")
	}
	nm := openaiNodeModules(t)
	s := newStack(t, stackOpts{})
	const maxTokens = 14
	prompt, _ := s.tok.Encode(testPrompt, true)
	ids, _ := s.reference(t, prompt, maxTokens, true)
	want := s.tok.Decode(ids, true)
	raw, _ := json.Marshal(map[string]any{"role": "user", "content": testPrompt})
	chatText, err := devvllm.RenderChat(s.tok, []json.RawMessage{raw})
	if err != nil {
		t.Fatal(err)
	}
	chatPrompt, _ := s.tok.Encode(chatText, false)
	chatIDs, _ := s.reference(t, chatPrompt, maxTokens, true)
	wantChat := s.tok.Decode(chatIDs, true)

	script, _ := filepath.Abs(filepath.Join("testdata", "openai_e2e.mjs"))
	// Node resolves "openai" from the script's directory upwards: run a copy
	// placed next to node_modules.
	local := filepath.Join(nm, "openai_e2e.mjs")
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", local, s.router.URL+"/v1", "glm-5-tiny", testPrompt, strconv.Itoa(maxTokens))
	out, err := cmd.Output()
	t.Logf("openai client: %s", out)
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr)
	}
	type res struct {
		Text   string        `json:"text"`
		Finish string        `json:"finish"`
		Role   string        `json:"role"`
		Usage  *openai.Usage `json:"usage"`
		Chunks int           `json:"chunks"`
	}
	var r struct {
		Completion       res `json:"completion"`
		CompletionStream res `json:"completion_stream"`
		Chat             res `json:"chat"`
		ChatStream       res `json:"chat_stream"`
		Error            struct {
			Status int    `json:"status"`
			Param  string `json:"param"`
			Kind   string `json:"kind"`
		} `json:"error"`
		Models []string `json:"models"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	wantU := openai.Usage{PromptTokens: len(prompt), CompletionTokens: len(ids), TotalTokens: len(prompt) + len(ids)}
	wantCU := openai.Usage{PromptTokens: len(chatPrompt), CompletionTokens: len(chatIDs), TotalTokens: len(chatPrompt) + len(chatIDs)}
	for name, c := range map[string]struct {
		got  res
		text string
		u    openai.Usage
	}{
		"completion": {r.Completion, want, wantU}, "completion stream": {r.CompletionStream, want, wantU},
		"chat": {r.Chat, wantChat, wantCU}, "chat stream": {r.ChatStream, wantChat, wantCU},
	} {
		if c.got.Text != c.text || c.got.Finish != "length" || c.got.Usage == nil || *c.got.Usage != c.u {
			t.Errorf("%s: %+v (usage %+v), want text %q length usage %+v", name, c.got, c.got.Usage, c.text, c.u)
		}
	}
	if r.CompletionStream.Chunks < 2 {
		t.Errorf("completion stream came in %d chunks", r.CompletionStream.Chunks)
	}
	if r.Chat.Role != "assistant" {
		t.Errorf("chat role %q", r.Chat.Role)
	}
	if r.Error.Status != 400 || r.Error.Param != "n" || r.Error.Kind != "BadRequestError" {
		t.Errorf("n=1025: %+v, want a 400 BadRequestError on param n", r.Error)
	}
	if len(r.Models) != 1 || r.Models[0] != "glm-5-tiny" {
		t.Errorf("models %v", r.Models)
	}
}
