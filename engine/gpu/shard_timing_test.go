package gpu

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/numeric"
)

// What one GPU of a TP-8 node computes for one MoE layer of the real
// models at batch 1, context 8192: rank 0's shard (16 of 128 heads for
// DeepSeek-V3.2, 8 of 64 for GLM-5; 256 of 2048 columns of every expert and
// the shared expert; the indexer, which rank 0 runs for all) and the shard
// of a rank without the indexer. The layer is captured in a CUDA graph and
// replayed; CUDA events time the replays. Weights are random (timing does
// not depend on values), the caches hold 8192 positions. Reported, never
// asserted (TILERT_GPU_TIMING=1, which scripts/gpu-check.sh sets); with
// TILERT_SHARD_REPORT=file the table is written there too.

const (
	shardBenchRanks = 8
	shardBenchCtx   = 8192
)

// realVocab is the real models' vocabulary (realLayerConfig shrinks it).
var realVocab = map[string]int{"deepseek-v3.2": 129280, "glm-5": 154880}

func TestGPUShardLayerTiming(t *testing.T) {
	if os.Getenv("TILERT_GPU_TIMING") != "1" {
		t.Skip("timing runs only with TILERT_GPU_TIMING=1 (scripts/gpu-check.sh)")
	}
	dev := gpuDevice(t)
	var rows []string
	add := func(format string, a ...any) {
		rows = append(rows, fmt.Sprintf(format, a...))
		t.Logf(format, a...)
	}
	copyGBps := measureCopy(t, dev)
	add("device-to-device copy: %.0f GB/s (read+write), the floor's bandwidth", copyGBps)
	for _, m := range []string{"deepseek-v3.2", "glm-5"} {
		full := realLayerConfig(t, m)
		for _, idx := range []bool{true, false} {
			us, usOther, pdlOn, plain, withComm, floor, ops := timeShardLayer(t, dev, full, idx, copyGBps)
			who := "rank 0 (runs the indexer)"
			if !idx {
				who = "ranks 1-7 (no indexer)"
			}
			add("%s MoE layer, TP-%d shard, %s, context %d: %.1f us graphed (%.1f us launched one by one); byte floor %.1f us (%.0f%% of floor)",
				m, shardBenchRanks, who, shardBenchCtx, us, plain, floor, 100*floor/us)
			if usOther > 0 {
				with, without := us, usOther
				if !pdlOn {
					with, without = usOther, us
				}
				add("    programmatic dependent launch (TILERT_GPU_PDL=1): %.1f us graphed with it, %.1f us without (%+.1f us)", with, without, with-without)
			}
			add("    with its communication: %.1f us graphed (both residual adds + norms replaced by the fused one-shot all-reduce over %d partial buffers on this device: %+.1f us; a node adds the NVLink crossing)",
				withComm, shardBenchRanks, withComm-us)
			add("    %-34s %-3s %8s  %8s  %9s  %s", "call", "n", "alone", "weights", "rate", "in graph (what the graph loses without it)")
			for _, o := range ops {
				add("    %-34s x%-2d %8.1f us  %8.2f MB  %6.0f GB/s  %6.1f us", o.Name, o.Count, o.Us, float64(o.Bytes)/1e6, float64(o.Bytes)/o.Us/1e3, o.InGraphUs)
			}
			if idx {
				// Projection (not a measurement): L layers, each the shard
				// time with its fused all-reduces as measured here plus the
				// link: an NVLink one-shot crossing (flag barrier + peer
				// reads, estimated) or NCCL's published latency in place of
				// the fused kernel.
				L := 61
				if m == "glm-5" {
					L = 78
				}
				for _, ar := range []struct {
					name string
					us   float64
				}{{"measured fused one-shot + est. 3 us NVLink crossing each", withComm + 2*3}, {"NCCL all-reduce (published ~15 us at 14-28 KB on 8xH100/H200 NVLink) each, plus the residual add + norm", us + 2*15}} {
					// The head's vocabulary slice at the copy bandwidth.
					head := float64(2*realVocab[m]*full.HiddenSize/shardBenchRanks) / copyGBps / 1e3
					step := float64(L)*ar.us + head
					add("  projection (not a measurement) %s, %d layers of %.1f us, all-reduce: %s, head slice %.0f us: %.2f ms per token -> %.0f tok/s per user without MTP",
						m, L, ar.us, ar.name, head, step/1000, 1e6/step)
				}
			}
		}
	}
	if p := os.Getenv("TILERT_SHARD_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// realLayerConfig is the real model's config (model/testdata) cut to one
// MoE layer with its own indexer, no MTP and a small vocabulary (the head
// is not part of a layer).
func realLayerConfig(t *testing.T, name string) *model.Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "model", "testdata", name+".config.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(data)
	if err != nil {
		t.Fatalf("%+v", err)
	}
	c.NumLayers, c.NumNextNLayers, c.FirstKDenseReplace = 1, 0, 0
	c.MLPLayerTypes, c.IndexerTypes = []string{"sparse"}, []string{"full"}
	c.VocabSize = 1024
	c.TieWordEmbeddings = false
	return c
}

func measureCopy(t *testing.T, dev *cuda.Device) float64 {
	var gbps float64
	err := dev.Do(func(c *cuda.Ctx) error {
		const n = 1 << 30
		src, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer c.Free(src)
		dst, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer c.Free(dst)
		s := c.Stream()
		us, err := eventMedian(c, s, 5, 9, func() error { return c.CopyDtoD(dst, src, n, s) })
		gbps = 2 * n / us / 1e3
		return err
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	return gbps
}

// eventMedian times inner back-to-back runs of f between two events, reps
// times: the median of one run in microseconds.
func eventMedian(c *cuda.Ctx, s cuda.Stream, inner, reps int, f func() error) (float64, error) {
	for range 3 {
		if err := f(); err != nil {
			return 0, err
		}
	}
	ts := make([]float64, reps)
	for i := range ts {
		us, err := eventUs(c, s, func() error {
			for range inner {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		ts[i] = us / float64(inner)
	}
	sort.Float64s(ts)
	return ts[len(ts)/2], nil
}

// timeShardLayer loads rank 0's TP-8 shard of full's one layer (random
// weights) and times one decode row at position shardBenchCtx through the
// block: graphed and launched. floor is the bytes the shard must read
// (weights touched, cache entries read) at the copy bandwidth.
//
// withComm is the same layer with its communication as a GPU of the node
// runs it: each of the two residual add + RMSNorm launches replaced by the
// fused all-reduce (allreduce_add_rmsnorm) that sums this rank's partial
// and the other 7 ranks' (buffers on this device) into the residual and
// writes the norm, this rank's output only.
func timeShardLayer(t *testing.T, dev *cuda.Device, full *model.Config, withIdx bool, copyGBps float64) (graphed, graphedOther float64, pdlOn bool, plain, withComm, floor float64, prof []OpTime) {
	t.Helper()
	p := planShard(full, shardBenchRanks, 0)
	local := *full
	local.NumHeads, local.IntermediateSize, local.MoEIntermediateSize = p.heads.n(), p.inter.n(), p.moe.n()
	src := newRandSource(&local, 1)
	e, err := newBackend(&cudaRunner{dev: dev, info: dev.Info}, src, engine.Options{MaxSeqLen: shardBenchCtx + 64, Slots: 1})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %+v", err)
		}
	}()
	lw := e.w.layers[0]
	if !lw.HasIdx {
		t.Fatalf("%s: layer 0 has no indexer to select the shard's tokens", full.Family)
	}
	err = e.r.run(func(b device) error {
		cd := b.(*cudaDevice)
		o := &ops{b: b}
		f := e.begin(o, []fwdRow{{s: e.slots[0], tok: 1, pos: shardBenchCtx}})
		if f == nil {
			return o.err
		}
		f.input(false)
		block := func() error {
			f.block(lw, e.ws.h, lw.InNorm)
			return o.err
		}
		// The first block runs the indexer either way: a rank without it
		// attends over rank 0's selection (broadcast in a node), so its
		// timing must read a real top-k, not a never-written buffer.
		if err := block(); err != nil {
			return err
		}
		lw.HasIdx = withIdx
		defer func() { lw.HasIdx = true }()
		var err error
		if plain, err = eventMedian(cd.c, cd.s, 5, 9, block); err != nil {
			return err
		}
		timeGraph := func() (float64, error) {
			if err := cd.c.BeginCapture(cd.s); err != nil {
				return 0, err
			}
			berr := block()
			g, err := cd.c.EndCapture(cd.s)
			if err := errors.CombineErrors(berr, err); err != nil {
				return 0, err
			}
			defer cd.c.DestroyGraph(g)
			return eventMedian(cd.c, cd.s, 20, 15, func() error { return cd.c.LaunchGraph(g, cd.s) })
		}
		if graphed, err = timeGraph(); err != nil {
			return err
		}
		if cd.k.PDLSupported() { // the same graph with the other kind of launch
			on := cd.k.PDL()
			cd.k.SetPDL(!on)
			graphedOther, err = timeGraph()
			cd.k.SetPDL(on)
			if err != nil {
				return err
			}
			pdlOn = on
		}
		if withComm, err = timeWithComm(cd, f, lw); err != nil {
			return err
		}
		// Where the time goes: the block's calls recorded (graph.go's
		// deferring device), then each timed alone.
		runs, err := recordBlock(b, f, lw)
		if err != nil {
			return err
		}
		byName := map[string]*OpTime{}
		for _, run := range runs {
			prevUs := 0.0
			for i, op := range run {
				if op.ctl() {
					continue // a stream fork or join (side.go): alone, the calls run in order
				}
				f, paired := opAlone(run, i, b)
				us, err := eventMedian(cd.c, cd.s, 3, 7, f)
				if err != nil {
					return errors.Wrapf(err, "timing %s", op.name)
				}
				if paired {
					us = max(0, us-prevUs)
				}
				prevUs = us
				addOpTime(byName, op, us)
			}
		}
		// Each row's share of the graphed block (profile.go).
		costs, err := inGraphCosts(runs, func(run []gop) (float64, error) {
			return graphUs(cudaGrapher{cd}, b, run, func(f func() error) (float64, error) { return eventMedian(cd.c, cd.s, 20, 9, f) })
		})
		if err != nil {
			return err
		}
		for key, ot := range byName {
			ot.InGraphUs = costs[key]
			prof = append(prof, *ot)
		}
		sort.Slice(prof, func(i, j int) bool { return prof[i].Us > prof[j].Us })
		return nil
	})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	floor = float64(shardLayerBytes(&local, withIdx)) / copyGBps / 1e3
	return graphed, graphedOther, pdlOn, plain, withComm, floor, prof
}

// timeWithComm times f's layer as a node's rank runs it, its two residual
// add + norms fused into the one-shot all-reduce over shardBenchRanks
// partial buffers (this rank's and shardBenchRanks-1 zeroed stand-ins).
func timeWithComm(cd *cudaDevice, f *fwd, lw *dlayer) (float64, error) {
	e, o := f.e, f.o
	ws := e.ws
	H := e.cfg.HiddenSize
	eps := float32(e.cfg.RMSNormEps)
	var owned []cuda.DevPtr
	defer func() {
		for _, p := range owned {
			_ = cd.free(p)
		}
	}()
	table := func(ptrs []cuda.DevPtr) (cuda.DevPtr, error) {
		t, err := cd.alloc(int64(8 * len(ptrs)))
		if err != nil {
			return 0, err
		}
		owned = append(owned, t)
		b, err := cuda.BytesOf(ptrs)
		if err != nil {
			return 0, err
		}
		return t, cd.upload(t, b)
	}
	parts := func(own cuda.DevPtr) (cuda.DevPtr, error) {
		ptrs := []cuda.DevPtr{own}
		for range shardBenchRanks - 1 {
			p, err := cd.alloc(int64(4 * H))
			if err != nil {
				return 0, err
			}
			owned = append(owned, p)
			if err := cd.zero(p, int64(4*H)); err != nil {
				return 0, err
			}
			ptrs = append(ptrs, p)
		}
		return table(ptrs)
	}
	pa, err := parts(ws.tmp)
	if err != nil {
		return 0, err
	}
	pm, err := parts(ws.mo)
	if err != nil {
		return 0, err
	}
	oa, err := table([]cuda.DevPtr{ws.x, ws.h, lw.PostNorm})
	if err != nil {
		return 0, err
	}
	om, err := table([]cuda.DevPtr{ws.x, ws.h, lw.InNorm})
	if err != nil {
		return 0, err
	}
	sn := kernels.ArScratchBytes(1, H)
	sc, err := cd.alloc(sn)
	if err != nil {
		return 0, err
	}
	owned = append(owned, sc)
	if err := cd.zero(sc, sn); err != nil {
		return 0, err
	}
	if err := cd.sync(); err != nil {
		return 0, err
	}
	layer := func() error {
		f.attention(lw)
		o.do(cd.allReduceAddRMSNorm(pa, shardBenchRanks, oa, 1, 1, H, eps, sc))
		f.moe(lw)
		o.do(cd.allReduceAddRMSNorm(pm, shardBenchRanks, om, 1, 1, H, eps, sc))
		return o.err
	}
	if err := layer(); err != nil {
		return 0, err
	}
	if err := cd.c.BeginCapture(cd.s); err != nil {
		return 0, err
	}
	lerr := layer()
	g, err := cd.c.EndCapture(cd.s)
	if err := errors.CombineErrors(lerr, err); err != nil {
		return 0, err
	}
	defer cd.c.DestroyGraph(g)
	return eventMedian(cd.c, cd.s, 20, 15, func() error { return cd.c.LaunchGraph(g, cd.s) })
}

// shardLayerBytes is what one decode row must read in the shard's layer:
// the attention slice, the router, top-k experts' slices and the shared
// expert's, the indexer (when it runs here) and its keys of the whole
// context, and the selected latent cache entries.
func shardLayerBytes(c *model.Config, withIdx bool) int64 {
	H := int64(c.HiddenSize)
	qk := int64(c.QKNopeHeadDim + c.QKRopeHeadDim)
	nh, R, P := int64(c.NumHeads), int64(c.KVLoraRank), int64(c.QKRopeHeadDim)
	QL, vd, MI := int64(c.QLoraRank), int64(c.VHeadDim), int64(c.MoEIntermediateSize)
	b := QL*H + nh*qk*QL + (R+P)*H + nh*(int64(c.QKNopeHeadDim)+vd)*R + H*nh*vd // fp8 attention
	b += 2 * int64(c.NRoutedExperts) * H                                        // bf16 router
	b += int64(c.NumExpertsPerTok+c.NSharedExperts) * 3 * MI * H                // fp8 experts
	topk := int64(min(c.IndexTopK, shardBenchCtx))
	b += topk * 656 // fp8_ds_mla entries of the selected positions
	if withIdx {
		IH, ID := int64(c.IndexNHeads), int64(c.IndexHeadDim)
		b += IH*ID*QL + ID*H + 2*IH*H        // indexer projections
		b += int64(shardBenchCtx) * (ID + 4) // fp8 keys + scales of the whole context
	}
	return b
}

// randSource is a Source of random weights for c: FP8 (finite e4m3 bytes,
// scale 1/64) where the real checkpoints store FP8, bf16-exact float32
// elsewhere. Every routed expert shares one random matrix per projection
// (uploaded to its own memory, as real experts are).
type randSource struct {
	c     *model.Config
	r     *rand.Rand
	store map[string]model.Storage
	exp   map[string]*Matrix
}

func newRandSource(c *model.Config, seed uint64) *randSource {
	s := &randSource{c: c, r: rand.New(rand.NewPCG(seed, 7)), store: map[string]model.Storage{}, exp: map[string]*Matrix{}}
	for _, sp := range model.Specs(c) {
		s.store[sp.Name] = sp.Storage
	}
	return s
}

func (s *randSource) Config() *model.Config { return s.c }

func (s *randSource) fp8(rows, cols int, rowScale bool) *Matrix {
	m := &Matrix{Rows: rows, Cols: cols, FP8: make([]byte, rows*cols)}
	for i := range m.FP8 {
		// sign, exponent 1..7, any mantissa: finite, |w| < 2
		m.FP8[i] = byte(s.r.IntN(2))<<7 | byte(1+s.r.IntN(7))<<3 | byte(s.r.IntN(8))
	}
	sr := (rows + 127) / 128
	if rowScale {
		sr = rows
	}
	m.Scale = make([]float32, sr*((cols+127)/128))
	for i := range m.Scale {
		m.Scale[i] = 1.0 / 64
	}
	return m
}

func (s *randSource) f32(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = numeric.BF16ToFloat32(numeric.Float32ToBF16(scale * float32(s.r.NormFloat64())))
	}
	return v
}

func (s *randSource) Linear(name string, rows, cols int) (*Matrix, error) {
	if st, ok := s.store[name]; ok && st == model.StoreBF16 {
		return &Matrix{Rows: rows, Cols: cols, F32: s.f32(rows*cols, 0.02)}, nil
	}
	return s.fp8(rows, cols, false), nil
}

func (s *randSource) Expert(layer, e int, proj string, rows, cols int) (*Matrix, error) {
	if m, ok := s.exp[proj]; ok {
		return m, nil
	}
	m := s.fp8(rows, cols, false)
	s.exp[proj] = m
	return m, nil
}

func (s *randSource) Absorbed(layer int) (*Matrix, *Matrix, error) {
	c := s.c
	return s.fp8(c.NumHeads*c.QKNopeHeadDim, c.KVLoraRank, true), s.fp8(c.NumHeads*c.VHeadDim, c.KVLoraRank, true), nil
}

func (s *randSource) Get(name string) (*model.Tensor, error) {
	c := s.c
	n := 0
	switch {
	case name == model.EmbedTokensName:
		n = c.VocabSize * c.HiddenSize
	case strings.HasSuffix(name, "e_score_correction_bias"):
		return &model.Tensor{Data: make([]float32, c.NRoutedExperts)}, nil
	default:
		shape, ok := model.ExpectedShapes(c)[name]
		if !ok {
			return nil, errors.Newf("random source: no tensor %s", name)
		}
		n = 1
		for _, d := range shape {
			n *= d
		}
	}
	v := s.f32(n, 0.02)
	if strings.Contains(name, "norm") && !strings.HasSuffix(name, "bias") {
		for i := range v {
			v[i] = 1
		}
	}
	return &model.Tensor{Data: v}, nil
}

// The timed shard's shapes on the emulator: rank 0's TP-8 shard of each
// real layer (16 routed experts instead of 256, to stay small) loads and
// runs one decode row at a long context without an out-of-range access.
func TestEmuShardRealLayerShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	for _, m := range []string{"deepseek-v3.2", "glm-5"} {
		full := realLayerConfig(t, m)
		full.NRoutedExperts, full.NGroup, full.TopKGroup = 16, 1, 1
		p := planShard(full, shardBenchRanks, 0)
		local := *full
		local.NumHeads, local.IntermediateSize, local.MoEIntermediateSize = p.heads.n(), p.inter.n(), p.moe.n()
		const ctx = 2100 // past index_topk: the indexer selects
		e, err := newBackend(&emuRunner{m: newEmu()}, newRandSource(&local, 1), engine.Options{MaxSeqLen: ctx + 64, Slots: 1})
		if err != nil {
			t.Fatalf("%s: %+v", m, err)
		}
		err = e.r.run(func(b device) error {
			o := &ops{b: b}
			f := e.begin(o, []fwdRow{{s: e.slots[0], tok: 1, pos: ctx}})
			if f == nil {
				return o.err
			}
			f.input(false)
			f.block(e.w.layers[0], e.ws.h, e.w.layers[0].InNorm)
			if o.err != nil {
				return o.err
			}
			// The per-call profile's recording, as the GPU timing uses it.
			runs, err := recordBlock(b, f, e.w.layers[0])
			if err != nil {
				return err
			}
			n := 0
			for _, run := range runs {
				for _, op := range run {
					if err := op.run(b); err != nil {
						return errors.Wrapf(err, "replaying %s", op.name)
					}
					n++
				}
			}
			least := 15 // 21 with the fused attention epilogue, 27 without
			if n < least {
				return errors.Newf("recorded %d calls of a block", n)
			}
			t.Logf("%s: %d calls recorded in one block", m, n)
			return nil
		})
		if err != nil {
			t.Errorf("%s: %+v", m, err)
		}
		if err := e.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("%s TP-%d rank 0 shard: %d heads, moe columns %d, %d weight bytes (16 experts); one row at context %d reads %.1f MB (rank 0, with the indexer), %.1f MB (other ranks)",
			m, shardBenchRanks, local.NumHeads, local.MoEIntermediateSize, e.w.bytes, shardBenchCtx,
			float64(shardLayerBytes(&local, true))/1e6, float64(shardLayerBytes(&local, false))/1e6)
	}
}

// recordBlock records the calls of one block through graph.go's deferring
// device (running them once) and returns them.
func recordBlock(b device, f *fwd, lw *dlayer) ([][]gop, error) {
	gs := newGraphs()
	gs.on, gs.hold = true, true
	g := grapherOf(b)
	if g == nil {
		return nil, errors.New("no grapher for this device")
	}
	gd := &graphDevice{device: b, gs: gs, g: g}
	o := f.o
	defer func() { f.o = o }()
	f.o = &ops{b: gd}
	f.block(lw, f.e.ws.h, lw.InNorm)
	if err := errors.CombineErrors(f.o.err, gd.flush()); err != nil {
		return nil, err
	}
	return gs.keep, nil
}
