package devvllm

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/internal/devprefill"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/roles/decode"
	"github.com/tilert-go/tilert/tokenizer"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The stand-in prefills, ships the state to a real decode node (which then
// holds it for the rid), and answers with the engine's first token as
// "token_id:N"; requests it cannot serve are refused with 400.
func TestPrefillHandoff(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "glm-5-tiny")
	if err := synth.Write("glm-5-tiny", dir, 0, nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Model.Name, cfg.Model.WeightsDir, cfg.Model.MaxSeqLen, cfg.Model.WithMTP = "glm5", dir, 256, true
	cfg.Decode.Device, cfg.Decode.Host, cfg.Decode.CtrlPort, cfg.Decode.HTTPPort = "cpu", "127.0.0.1", 0, 0
	cfg.Transfer.Listen = "127.0.0.1:0"
	addrFile := filepath.Join(t.TempDir(), "addr.json")
	ctx, stop := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- decode.Run(ctx, cfg, addrFile) }()
	defer func() {
		stop()
		if err := <-runErr; err != nil {
			t.Errorf("decode.Run: %v", err)
		}
	}()
	var addrs decodeapi.Addrs
	for i := 0; ; i++ {
		b, err := os.ReadFile(addrFile)
		if err == nil && json.Unmarshal(b, &addrs) == nil {
			break
		}
		if i > 4000 {
			t.Fatal("no address file")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	mcfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rdma.NewTCP(rdma.TCPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sh := devprefill.NewShipper(w, mcfg, tr, 512)
	defer sh.Close()
	srv, err := fastserve.Start(New(Options{Shipper: sh, Tokenizer: tok, ServedModel: "tiny", Log: quiet()}).NewHTTPServer(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	host, port, _ := strings.Cut(addrs.Ctrl, ":")
	ctrlPort, _ := strconv.Atoi(port)
	kv := func(rid string) map[string]any {
		return map[string]any{"tilert_host": host, "tilert_ctrl_port": ctrlPort, "tilert_rid": rid}
	}
	e, err := cpu.New(mcfg, w, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	firstOf := func(ids []int) int {
		t.Helper()
		f, err := e.Prefill(0, ids, engine.Params{})
		if err != nil {
			t.Fatal(err)
		}
		e.Release(0)
		return f
	}
	prompt := "hello there, decode node"
	ids, _ := tok.Encode(prompt, true)
	msgs := []json.RawMessage{json.RawMessage(`{"role":"user","content":[{"type":"text","text":"hi"}]}`)}
	chatText, err := RenderChat(tok, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(chatText, "[gMASK]<sop><|user|>\nhi") || !strings.HasSuffix(chatText, "<|assistant|>\n") {
		t.Fatalf("fallback rendering %q", chatText)
	}
	chatIDs, _ := tok.Encode(chatText, false)

	for i, tc := range []struct {
		path string
		body map[string]any
		want int
	}{
		{"/v1/completions", map[string]any{"prompt": prompt}, firstOf(ids)},
		{"/v1/completions", map[string]any{"prompt": []int{5, 17, 300, 42}}, firstOf([]int{5, 17, 300, 42})},
		{"/v1/chat/completions", map[string]any{"messages": msgs}, firstOf(chatIDs)},
	} {
		rid := "dv-" + strconv.Itoa(i)
		tc.body["max_tokens"], tc.body["temperature"], tc.body["kv_transfer_params"] = 1, 0, kv(rid)
		b, _ := json.Marshal(tc.body)
		resp, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s %s", tc.path, resp.Status, rb)
		}
		var out struct {
			Choices []struct {
				Logprobs struct {
					Tokens  []string `json:"tokens"`
					Content []struct {
						Token string `json:"token"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(rb, &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("%s: %s", tc.path, rb)
		}
		got := ""
		if lp := out.Choices[0].Logprobs; len(lp.Tokens) == 1 {
			got = lp.Tokens[0]
		} else if len(lp.Content) == 1 {
			got = lp.Content[0].Token
		}
		if want := "token_id:" + strconv.Itoa(tc.want); got != want {
			t.Fatalf("%s: token %q, want %q", tc.path, got, want)
		}
		// The node holds the shipped state for rid, ready to decode.
		sr, err := http.Get("http://" + addrs.HTTP + "/decode_status")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Slots []struct{ RID, State string }
		}
		_ = json.NewDecoder(sr.Body).Decode(&st)
		sr.Body.Close()
		// Without a /pd/* token the node shows only a prefix of the rid.
		if len(st.Slots) != 1 || !strings.HasSuffix(st.Slots[0].RID, "…") || !strings.HasPrefix(rid, strings.TrimSuffix(st.Slots[0].RID, "…")) || st.Slots[0].State != "ready" {
			t.Fatalf("%s: node slots %+v, want %s ready", tc.path, st.Slots, rid)
		}
		cb, _ := json.Marshal(map[string]string{"rid": rid})
		cr, err := http.Post("http://"+addrs.HTTP+"/pd/cancel", "application/json", strings.NewReader(string(cb)))
		if err != nil {
			t.Fatal(err)
		}
		cr.Body.Close()
	}

	// Without kv_transfer_params it generates natively (the spill target).
	nr, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":3,"temperature":0,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	nb, _ := io.ReadAll(nr.Body)
	nr.Body.Close()
	if nr.StatusCode != 200 || !strings.Contains(string(nb), `"completion_tokens":3`) {
		t.Errorf("native generation: %s %s", nr.Status, nb)
	}
	for _, tc := range []struct{ name, body, inMsg string }{
		{"incomplete kv params", `{"prompt":"hi","max_tokens":1,"kv_transfer_params":{"tilert_host":"h"}}`, "kv_transfer_params"},
		{"max tokens", `{"prompt":"hi","max_tokens":5,"kv_transfer_params":{"tilert_host":"h","tilert_ctrl_port":1,"tilert_rid":"r"}}`, "max_tokens must be 1"},
		{"bad prompt", `{"prompt":{},"max_tokens":1,"kv_transfer_params":{"tilert_host":"h","tilert_ctrl_port":1,"tilert_rid":"r"}}`, "prompt"},
	} {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(rb), tc.inMsg) {
			t.Errorf("%s: %s %s", tc.name, resp.Status, rb)
		}
	}
}
