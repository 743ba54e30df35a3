package devprefill

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/roles/decode"
)

// dev-prefill against a running node prints the node's stream, and the ids
// are the ones the CPU engine generates locally from the same prompt.
func TestDevPrefillAgainstNode(t *testing.T) {
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
	for i := 0; ; i++ {
		b, err := os.ReadFile(addrFile)
		if err == nil && json.Valid(b) {
			break
		}
		if i > 2000 {
			t.Fatal("the node did not write its address file")
		}
		time.Sleep(5 * time.Millisecond)
	}

	prompt := []int{5, 17, 300, 42, 9, 77, 512, 1000}
	var out bytes.Buffer
	app := &cli.App{Writer: &out, ErrWriter: &out, Commands: []*cli.Command{Command()}}
	ids := make([]string, len(prompt))
	for i, id := range prompt {
		ids[i] = strconv.Itoa(id)
	}
	if err := app.Run([]string{"tilert", "dev-prefill", "--model-dir", dir, "--addr-file", addrFile,
		"--prompt-ids", strings.Join(ids, ","), "--max-tokens", "12", "--ignore-eos", "--rid", "dev-test"}); err != nil {
		t.Fatalf("dev-prefill: %v\n%s", err, out.String())
	}

	mcfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.OpenWeights(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := cpu.New(mcfg, w, engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	p := engine.Params{MaxTokens: 12}
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{strconv.Itoa(first)}
	fin, err := e.Start(0, first, p)
	for err == nil && fin == engine.FinishNone {
		var res []engine.StepResult
		if res, err = e.Step([]int{0}); err == nil {
			for _, t := range res[0].Tokens {
				want = append(want, strconv.Itoa(t))
			}
			fin = res[0].Finish
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if line := "ids: " + strings.Join(want, ","); !strings.Contains(out.String(), line+"\n") {
		t.Fatalf("output lacks %q:\n%s", line, out.String())
	}
	for _, s := range []string{"handoff: rid dev-test -> slot 0", `"finish_reason":"length"`, `{"t":[`} {
		if !strings.Contains(out.String(), s) {
			t.Fatalf("output lacks %q:\n%s", s, out.String())
		}
	}
}
