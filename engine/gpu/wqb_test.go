package gpu

import (
	"math/rand/v2"
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
	"github.com/tilert-go/tilert/model"
)

// TestWqbShape: the shape pinned to the staged GEMV is the indexer wq_b's
// (index heads x head dim rows of q_lora_rank), none without an indexer.
func TestWqbShape(t *testing.T) {
	for _, c := range []struct {
		cfg  model.Config
		want [2]int
	}{
		{model.Config{IndexNHeads: 64, IndexHeadDim: 128, QLoraRank: 1536}, [2]int{8192, 1536}}, // DeepSeek-V3.2
		{model.Config{IndexNHeads: 32, IndexHeadDim: 128, QLoraRank: 2048}, [2]int{4096, 2048}}, // GLM-5
		{model.Config{QLoraRank: 1536}, [2]int{}},
	} {
		if got := wqbShape(&c.cfg); got != c.want {
			t.Errorf("wqbShape(%d heads x %d, q_lora %d) = %v, want %v", c.cfg.IndexNHeads, c.cfg.IndexHeadDim, c.cfg.QLoraRank, got, c.want)
		}
	}
}

// TestGPUWqbStage: an engine of DeepSeek-V3.2's real dimensions (the
// deepseek-v3.2-2layer preset: two dense layers, ~5 GB of random weights) decodes with its indexer wq_b
// on the staged GEMV by default and on the tile kernel with
// TILERT_GPU_WQB_STAGE=0; the staged launches happen only in the first, and
// the greedy tokens are the same (at these dims the staged sums are the
// tile plan's bit for bit).
func TestGPUWqbStage(t *testing.T) {
	gpuDevice(t)
	cfg := synthConfig(t, "deepseek-v3.2-2layer")
	opts := engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 4096}
	r := rand.New(rand.NewPCG(53, 1))
	prompt := make([]int, 2500) // past the indexer's 2048 selections: the top-k selects
	for i := range prompt {
		prompt[i] = r.IntN(cfg.VocabSize)
	}
	run := func(v string) ([]int, int64) {
		t.Setenv("TILERT_GPU_WQB_STAGE", v)
		n0 := kernels.StageLaunches.Load()
		e := newTestEngine(t, onGPU, Dummy(cfg, 3), opts)
		got := enginetest.Generate(t, e, 0, prompt, engine.Params{}, 16)
		return got, kernels.StageLaunches.Load() - n0
	}
	off, nOff := run("0")
	on, nOn := run("")
	if nOff != 0 {
		t.Errorf("TILERT_GPU_WQB_STAGE=0: %d staged launches, want none", nOff)
	}
	if nOn == 0 {
		t.Errorf("default: no staged launch (wq_b %v did not run staged)", wqbShape(cfg))
	}
	if i := enginetest.FirstDiff(on, off); i >= 0 {
		t.Errorf("tokens differ from %d:\n staged %v\n   tile %v", i, on, off)
	}
	t.Logf("%d staged launches; tokens %v", nOn, on)
}
