package synth

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/tokenizer"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sha256 golden hashes")

var tinyPresets = []string{"deepseek-v3.2-tiny", "glm-5-tiny"}

// dirHash hashes every file of dir (sorted by name, name and content).
func dirHash(t testing.TB, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(n))
		h.Write([]byte{0})
		sum := sha256.Sum256(data)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeTiny(t testing.TB, preset string, seed int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := Write(preset, dir, seed, nil); err != nil {
		t.Fatalf("Write(%s): %+v", preset, err)
	}
	return dir
}

// TestGoldenHash: the bytes for seed 0 never change (any machine, any Go version); two runs are equal.
func TestGoldenHash(t *testing.T) {
	for _, p := range tinyPresets {
		t.Run(p, func(t *testing.T) {
			a := dirHash(t, writeTiny(t, p, 0))
			b := dirHash(t, writeTiny(t, p, 0))
			if a != b {
				t.Fatalf("two runs differ: %s vs %s", a, b)
			}
			golden := filepath.Join("testdata", p+".seed0.sha256")
			if *update {
				if err := os.WriteFile(golden, []byte(a+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./model/synth -run TestGoldenHash -update)", err)
			}
			if strings.TrimSpace(string(want)) != a {
				t.Errorf("output hash %s, golden %s: the generator changed (refresh with -update only if intended)", a, strings.TrimSpace(string(want)))
			}
			if c := dirHash(t, writeTiny(t, p, 1)); c == a {
				t.Error("seed 1 gives the same checkpoint as seed 0")
			}
		})
	}
}

// TestCheckpointContents opens each tiny checkpoint through model.OpenHF and checks layout,
// dtypes, preset requirements, and weight statistics.
func TestCheckpointContents(t *testing.T) {
	for _, p := range tinyPresets {
		t.Run(p, func(t *testing.T) {
			dir := writeTiny(t, p, 0)
			w, err := model.OpenHF(dir)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			defer w.Close()
			c := w.Config()
			if c.KVLoraRank != 512 || c.QKRopeHeadDim != 64 || c.IndexHeadDim != 128 {
				t.Errorf("kv_lora/rope/index dims = %d/%d/%d, want 512/64/128", c.KVLoraRank, c.QKRopeHeadDim, c.IndexHeadDim)
			}
			if c.IndexTopK >= 150 || c.NumNextNLayers != 1 || c.Quant == nil {
				t.Errorf("index_topk %d, nextn %d, quant %v", c.IndexTopK, c.NumNextNLayers, c.Quant)
			}
			if c.IsMoELayer(0) || !c.IsMoELayer(1) || !c.IsMoELayer(2) || !c.IsMoELayer(3) {
				t.Error("want layer 0 dense, layers 1-2 and the MTP layer MoE")
			}
			odd := c.HiddenSize%128 != 0 || c.QLoraRank%128 != 0 || c.MoEIntermediateSize%128 != 0
			if !odd {
				t.Error("want dimensions that are not multiples of 128")
			}
			switch c.Family {
			case model.DeepSeekV32:
				if c.NGroup != 4 || c.TopKGroup != 2 || c.Rope.Type != "yarn" || c.IndexerRopeInterleave {
					t.Errorf("deepseek routing/rope: groups %d keep %d rope %s idx-interleave %v", c.NGroup, c.TopKGroup, c.Rope.Type, c.IndexerRopeInterleave)
				}
			case model.GLMMoEDSA:
				if c.NGroup != 1 || c.Rope.Type != "default" || !c.IndexerRopeInterleave {
					t.Errorf("glm routing/rope: groups %d rope %s idx-interleave %v", c.NGroup, c.Rope.Type, c.IndexerRopeInterleave)
				}
			}
			idx, err := safetensors.ReadIndex(dir)
			if err != nil {
				t.Fatal(err)
			}
			shards := map[string]bool{}
			for _, s := range idx.WeightMap {
				shards[s] = true
			}
			if len(shards) < 2 {
				t.Errorf("%d shards, want >= 2", len(shards))
			}
			var total int64
			ck := w.Checkpoint()
			for _, n := range ck.Names() {
				info, _, _ := ck.Lookup(n)
				total += info.End - info.Begin
			}
			if total > 16<<20 {
				t.Errorf("tiny checkpoint holds %d bytes, want a few MB", total)
			}

			for _, s := range model.Specs(c) {
				info, _, ok := ck.Lookup(s.Name)
				if !ok {
					t.Fatalf("missing %s", s.Name)
				}
				if string(info.DType) != s.StoredDType(c) {
					t.Errorf("%s: dtype %s, want %s", s.Name, info.DType, s.StoredDType(c))
				}
				tn, err := w.Get(s.Name)
				if err != nil {
					t.Fatalf("%+v", err)
				}
				mean, std := stats(tn.Data)
				want := initFor(c, s)
				if math.Abs(mean-float64(want.center)) > 0.05+0.2*float64(want.std) {
					t.Errorf("%s: mean %.4f, want about %.2f", s.Name, mean, want.center)
				}
				// Small tensors have few samples and FP8 ones few blocks (each with a scale factor in
				// [0.75, 1.25)), so the bound is loose; it still catches a wrong fan-in or dtype.
				if r := std / float64(want.std); len(tn.Data) >= 256 && (r < 0.7 || r > 1.35) {
					t.Errorf("%s: std %.4g, want about %.4g", s.Name, std, want.std)
				}
			}
			// MTP embedding and head are copies of the main ones, as in the released checkpoints.
			mtp := model.Layer(c.NumLayers)
			for _, pair := range [][2]string{{mtp.MTPEmbed, model.EmbedTokensName}, {mtp.SharedHeadHead, model.LMHeadName}} {
				a, _ := ck.Data(pair[0])
				b, _ := ck.Data(pair[1])
				if string(a) != string(b) {
					t.Errorf("%s differs from %s", pair[0], pair[1])
				}
			}
			// Block scales vary inside a tensor, so a wrong block index cannot go unnoticed.
			l1 := model.Layer(1)
			r, err := w.Raw(l1.SharedUp)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Scale) < 2 || r.Scale[0] == r.Scale[1] {
				t.Errorf("scales of %s = %v, want distinct per block", l1.SharedUp, r.Scale)
			}

			tok, err := tokenizer.Load(dir)
			if err != nil {
				t.Fatalf("tokenizer.Load: %+v", err)
			}
			if tok.VocabSize() > c.VocabSize {
				t.Errorf("tokenizer vocab %d > model vocab %d", tok.VocabSize(), c.VocabSize)
			}
			for _, e := range c.EOS {
				found := false
				for _, te := range tok.EOS() {
					found = found || te == e
				}
				if !found {
					t.Errorf("config eos %d not among tokenizer EOS %v", e, tok.EOS())
				}
			}
			if c.Family == model.DeepSeekV32 && tok.BOS() != c.BOS {
				t.Errorf("tokenizer BOS %d, config %d", tok.BOS(), c.BOS)
			}
		})
	}
}

func stats(x []float32) (mean, std float64) {
	var s, ss float64
	for _, v := range x {
		s += float64(v)
	}
	mean = s / float64(len(x))
	for _, v := range x {
		d := float64(v) - mean
		ss += d * d
	}
	return mean, math.Sqrt(ss / float64(len(x)))
}

// TestBigPresetPlans: the real-dimension presets have DeepSeek-V3.2's layer sizes, the layer kinds
// they promise, and a sharding that keeps every scale beside its weight (planned only: they are GBs).
func TestBigPresetPlans(t *testing.T) {
	for _, tc := range []struct {
		preset     string
		moeLayers  []bool  // per layer: MoE?
		minGiB     float64 // checkpoint size bounds
		maxGiB     float64
		expertTens int // routed-expert weight tensors (gate, up, down of each expert)
	}{
		{"deepseek-v3.2-2layer", []bool{false, false}, 4, 5, 0},
		{"deepseek-v3.2-moe", []bool{false, true}, 14, 16, 3 * 256},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			p, err := Lookup(tc.preset)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Build(p, 0)
			if err != nil {
				t.Fatalf("%+v", err)
			}
			c := b.Config
			if c.HiddenSize != 7168 || c.NumHeads != 128 || c.QLoraRank != 1536 || c.IntermediateSize != 18432 ||
				c.MoEIntermediateSize != 2048 || c.NumLayers != len(tc.moeLayers) || c.NumNextNLayers != 0 {
				t.Errorf("not the real DeepSeek-V3.2 layer dimensions: %v", c)
			}
			for i, moe := range tc.moeLayers {
				if c.IsMoELayer(i) != moe {
					t.Errorf("layer %d: MoE %v, want %v", i, c.IsMoELayer(i), moe)
				}
			}
			if tc.expertTens > 0 && (c.NRoutedExperts != 256 || c.NumExpertsPerTok != 8 || c.NGroup != 8 || c.TopKGroup != 4 || c.NSharedExperts != 1) {
				t.Errorf("routing %d experts top-%d groups %d/%d shared %d, want DeepSeek-V3.2's 256 top-8 8/4 1",
					c.NRoutedExperts, c.NumExpertsPerTok, c.NGroup, c.TopKGroup, c.NSharedExperts)
			}
			pl := MakePlan(b)
			if gib := float64(pl.Total) / (1 << 30); gib < tc.minGiB || gib > tc.maxGiB {
				t.Errorf("checkpoint is %.2f GiB, want %.0f..%.0f", gib, tc.minGiB, tc.maxGiB)
			}
			if pl.shards < 2 {
				t.Errorf("%d shards", pl.shards)
			}
			experts := 0
			for i, it := range pl.items {
				if it.scale && pl.shard[i] != pl.shard[i-1] {
					t.Errorf("%s is not in its weight's shard", it.info.Name)
				}
				if !it.scale && strings.Contains(it.info.Name, ".mlp.experts.") {
					experts++
					if it.info.DType != safetensors.F8E4M3 {
						t.Errorf("%s is %s, want F8_E4M3", it.info.Name, it.info.DType)
					}
				}
			}
			if experts != tc.expertTens {
				t.Errorf("%d routed-expert tensors, want %d", experts, tc.expertTens)
			}
		})
	}
}

func TestWriteErrors(t *testing.T) {
	if err := Write("nope", t.TempDir(), 0, nil); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown preset: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x"), []byte("x"), 0o644)
	if err := Write("glm-5-tiny", dir, 0, nil); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("non-empty output: %v", err)
	}
	if _, err := os.Stat(dir + ".partial"); !os.IsNotExist(err) {
		t.Error("left a .partial directory behind")
	}
}

func TestProgress(t *testing.T) {
	var last, total, calls int64
	dir := filepath.Join(t.TempDir(), "out")
	err := Write("glm-5-tiny", dir, 0, func(d, tot int64) {
		if d < last {
			t.Errorf("progress went back: %d after %d", d, last)
		}
		last, total = d, tot
		calls++
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last != total {
		t.Errorf("progress ended at %d of %d after %d calls", last, total, calls)
	}
}

func python(t *testing.T) string {
	if testing.Short() {
		t.Skip("-short: skipping the transformers check (about a minute)")
	}
	py := os.Getenv("TILERT_PYTHON")
	if py == "" {
		py = "/work/pyenv/bin/python"
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no python with transformers at %s (set TILERT_PYTHON)", py)
	}
	if err := exec.Command(py, "-c", "import transformers, torch, safetensors").Run(); err != nil {
		t.Skipf("%s lacks transformers/torch/safetensors: %v", py, err)
	}
	return py
}

// TestTransformersLoads: transformers reads config.json, builds the model, and expects exactly the
// checkpoint's tensor names and shapes (MTP layer aside); a forward pass over the dequantised
// weights gives logits with a useful spread.
func TestTransformersLoads(t *testing.T) {
	py := python(t)
	for _, p := range tinyPresets {
		t.Run(p, func(t *testing.T) {
			dir := writeTiny(t, p, 0)
			out, err := exec.Command(py, "testdata/hf_check.py", dir, "--forward").Output()
			var rep struct {
				ModelType     string          `json:"model_type"`
				Scaling       float64         `json:"scaling"`
				Missing       []string        `json:"missing"`
				Unexpected    []string        `json:"unexpected"`
				ShapeMismatch []string        `json:"shape_mismatch"`
				Rope          json.RawMessage `json:"rope_parameters"`
				Logits        struct {
					Std      float64 `json:"std"`
					MaxAbs   float64 `json:"max_abs"`
					Distinct int     `json:"distinct_argmax"`
				} `json:"logits"`
			}
			if jerr := json.Unmarshal(out, &rep); jerr != nil {
				var stderr string
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = string(ee.Stderr)
				}
				t.Fatalf("hf_check: %v %v\n%s\n%s", err, jerr, out, stderr)
			}
			if err != nil || len(rep.Missing)+len(rep.Unexpected)+len(rep.ShapeMismatch) > 0 {
				t.Fatalf("names differ from HF: missing %v unexpected %v shapes %v (%v)", rep.Missing, rep.Unexpected, rep.ShapeMismatch, err)
			}
			c, err := model.LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.ModelType != string(c.Family) || math.Abs(rep.Scaling-c.SoftmaxScale()) > 1e-9 {
				t.Errorf("HF scaling %v, ours %v", rep.Scaling, c.SoftmaxScale())
			}
			if rep.Logits.Std < 0.3 || rep.Logits.Std > 10 || rep.Logits.Distinct < 20 {
				t.Errorf("logits degenerate: %+v", rep.Logits)
			}
			t.Logf("%s logits: %+v", p, rep.Logits)
		})
	}
}

func BenchmarkWriteTiny(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(b.TempDir(), "out")
		if err := Write("deepseek-v3.2-tiny", dir, int64(i), nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWrite2Layer writes the ~4.9 GB preset; it runs only with TILERT_SYNTH_BIG=1.
func BenchmarkWrite2Layer(b *testing.B) {
	if os.Getenv("TILERT_SYNTH_BIG") == "" {
		b.Skip("set TILERT_SYNTH_BIG=1 to write the 4.9 GB deepseek-v3.2-2layer preset")
	}
	b.ReportAllocs()
	for b.Loop() {
		dir := filepath.Join(b.TempDir(), "out")
		var total int64
		if err := Write("deepseek-v3.2-2layer", dir, 0, func(_, t int64) { total = t }); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(total)
	}
}
