// Package gpu is the CUDA backend of the decode engine: the whole forward
// (absorbed MLA over vLLM's fp8_ds_mla cache, the DSA indexer over its fp8
// key cache, MoE, the MTP layer) runs on one NVIDIA GPU through packages
// cuda and cuda/kernels, with every slot's caches in device memory
// in exactly the byte layouts of engine/layout.go.
//
// Modes: serving (default) keeps vLLM's bytes in device memory (MLA cache
// fp8_ds_mla or bf16, fp8 indexer keys, the indexer query quantised to fp8
// as vLLM does); its greedy output equals the CPU engine's serving mode.
// exact keeps float32 MLA and indexer caches and scores the float32 indexer
// query, as the CPU engine's exact mode, and matches the HF goldens by the
// same criteria; its Export/Import convert to and from the exchange layout
// (Layout(), lossy) as the CPU engine's exact mode does.
//
// Numerics: FP8 weights stay e4m3 with their 128x128 block scales (fp8
// GEMVs), bf16 tables and norms are exact, activations are float32; results
// equal the CPU engine's up to float32 summation order.
//
// Prefill runs through the decode path in chunks of rows (each row attends
// only to positions written before it, as in the CPU engine). Tokens are
// chosen on the device (arg-max, or the device sampler for temperature > 0,
// which draws differently from the CPU engine's inverse-CDF sampler: seeded
// sampling is reproducible per backend, not across backends).
//
// The same orchestration runs on a pure-Go emulation of the kernels
// (NewEmulated), which is how CI tests it without a GPU.
package gpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
	"github.com/tilert-go/tilert/model"
)

// slot is one slot's device caches and kept hidden state (its book is
// engine.Book's).
type slot struct {
	id          int
	buf         cuda.DevPtr  // the slot's caches (Layout().SlotBytes), device memory
	staging     []byte       // host staging copy for SlotBuffer (lazy; pinned on the GPU)
	freeStaging func() error // releases staging
	// hidden holds the final-normed hidden at the slot's last position when
	// kept (engine.Compute.KeepHidden), the MTP layer's input there.
	hidden cuda.DevPtr
}

// Engine is the GPU engine: engine.Book over the GPU backend. Not safe for
// concurrent use (the decode node serialises calls).
type Engine struct {
	*engine.Book
	m *backend
}

// backend is the model on the device and every slot's device caches; it
// implements engine.Backend.
type backend struct {
	r      runner
	cfg    *model.Config
	opts   engine.Options
	layout engine.Layout
	maxSeq int
	w      *dweights
	ws     *workspace
	lpw    lpWorkspace // penalties and logprobs (forward.go), on first use
	probe  routeProbe  // the routing of probed steps (probe.go)
	// rowPos: the positions of the last forward's rows, as beginMeta
	// uploaded them to metaCur (choose reads a sampler's counter there):
	// ws.meta, or its twin ws.meta2 where forwards alternate.
	rowPos  []int
	metaCur cuda.DevPtr
	slots   []*slot
	owned   []cuda.DevPtr // every allocation, freed by Close
	closed  bool

	scale    float32 // MLA softmax scale
	mla      mlaKind // the device MLA cache's element form
	idxF32   bool    // float32 indexer keys (exact mode), else fp8 pages
	devSlot  int64   // bytes of a slot's device cache buffer
	mlaOff   []int64 // per layer: MLA region offset in a slot's device buffer
	idxOff   []int64 // per layer: indexer region offset (-1: none)
	ropeCos  cuda.DevPtr
	ropeSin  cuda.DevPtr
	maxRows  int
	chunkLen int
	graphs   *graphs    // decode-step CUDA graphs (graph.go)
	ah       aheadState // the pipelined step (ahead.go)
	// prof, when set, times every call of the runs outside decode steps
	// (a prefill) alone (ProfilePrefill).
	prof *opTimer
}

// idxQ says whether the serving indexer runs indexerQPrep and the
// tensor-core scores: fp8 pages, 128-dimension heads, at most 64 of them, a
// device that has the kernels (sm_89 and later; the emulator always), and
// not turned off by TILERT_GPU_IDX_MMA=0.
func (e *backend) idxQ() bool {
	c := e.cfg
	if !idxMMAOn || e.idxF32 || c.IndexNHeads > kernels.IndexerQHeads || c.IndexHeadDim != kernels.IndexerHeadDim ||
		c.QKRopeHeadDim > kernels.IndexerHeadDim || c.QKRopeHeadDim%8 != 0 {
		return false
	}
	if cr, ok := e.r.(*cudaRunner); ok {
		return cr.info.CCMajor*10+cr.info.CCMinor >= 89
	}
	return true
}

// New opens GPU 0 and builds an engine with weights from src (see Open,
// FromHF, FromConverted). Without a GPU the error is marked cuda.ErrNoGPU.
func New(src Source, opts engine.Options) (*Engine, error) {
	dev, err := cuda.Open(0)
	if err != nil {
		return nil, err
	}
	e, err := NewOnDevice(dev, src, opts)
	if err != nil {
		_ = dev.Close()
		return nil, err
	}
	e.m.r.(*cudaRunner).own = true
	return e, nil
}

// NewOnDevice builds an engine on an opened device (the caller keeps
// ownership of dev; Close frees the engine's memory only).
func NewOnDevice(dev *cuda.Device, src Source, opts engine.Options) (*Engine, error) {
	return build(&cudaRunner{dev: dev, info: dev.Info}, src, opts)
}

// NewEmulated builds the engine over the pure-Go emulation of the GPU
// kernels: the same orchestration, caches and byte layouts, no GPU. For
// tests and debugging (it is slow).
func NewEmulated(src Source, opts engine.Options) (*Engine, error) {
	return build(&emuRunner{m: newEmu()}, src, opts)
}

func checkSupported(c *model.Config, opts engine.Options) error {
	if c.KVLoraRank != kernels.MLALatentDim || c.QKRopeHeadDim != kernels.MLARopeDim || c.IndexHeadDim != kernels.IndexerHeadDim {
		return errors.Newf("the GPU kernels need kv_lora_rank %d, qk_rope_head_dim %d, index_head_dim %d (model has %d, %d, %d)",
			kernels.MLALatentDim, kernels.MLARopeDim, kernels.IndexerHeadDim, c.KVLoraRank, c.QKRopeHeadDim, c.IndexHeadDim)
	}
	if c.NRoutedExperts > 1024 || c.NumExpertsPerTok > 64 || c.NGroup > 32 {
		return errors.Newf("the MoE routing kernel handles at most 1024 experts, top-64, 32 groups (model: %d, %d, %d)",
			c.NRoutedExperts, c.NumExpertsPerTok, c.NGroup)
	}
	if c.NumLayers > 0 && !c.HasIndexer(0) {
		return errors.New("layer 0 has no indexer of its own: nothing to share top-k from")
	}
	if (c.QKNopeHeadDim+c.QKRopeHeadDim)%4 != 0 || (c.KVLoraRank+c.QKRopeHeadDim)%4 != 0 {
		return errors.Newf("head dims must keep rows 16-byte aligned")
	}
	return nil
}

func build(r runner, src Source, opts engine.Options) (*Engine, error) {
	e, err := newBackend(r, src, opts)
	if err != nil {
		return nil, err
	}
	return &Engine{Book: engine.NewBookFor(e, e.cfg, e.opts, e.layout, e.maxSeq, e.chunkLen), m: e}, nil
}

// newBackend loads src onto r's device and allocates every slot's caches
// (one rank of a sharded engine is one backend over its shard's weights).
func newBackend(r runner, src Source, opts engine.Options) (*backend, error) {
	if err := removedSwitchesEnv(); err != nil {
		return nil, err
	}
	if sideCapErr != nil {
		return nil, sideCapErr
	}
	if sideQAtErr != nil {
		return nil, sideQAtErr
	}
	if qaNormErr != nil {
		return nil, qaNormErr
	}
	if mainPrioErr != nil {
		return nil, mainPrioErr
	}
	cfg := src.Config()
	opts, lay, maxSeq, err := engine.Resolve(cfg, opts, engine.ModeServing)
	if err != nil {
		return nil, err
	}
	if err := checkSupported(cfg, opts); err != nil {
		return nil, err
	}
	if opts.Prefill == engine.PrefillFast && opts.Mode == engine.ModeExact {
		return nil, errors.WithHint(errors.New("prefill precision fast with exact mode"),
			"exact mode keeps float32 products everywhere: drop --prefill-precision fast, or serve in serving mode")
	}
	e := &backend{
		cfg: cfg, opts: opts, layout: lay, r: r, maxSeq: maxSeq,
		scale:  float32(cfg.SoftmaxScale()),
		graphs: newGraphs(),
		ah:     aheadState{off: !pipeOn, mtp: pipeMTP},
	}
	wqbPin(r, cfg)
	if err := oprojPin(r, cfg); err != nil {
		return nil, err
	}
	if err := tilePlansPin(r); err != nil {
		return nil, err
	}
	sidePin(r, cfg)
	if err := prioPin(r); err != nil {
		return nil, err
	}
	if cr, ok := r.(*cudaRunner); ok {
		if m := e.prefillMLAMode(e.gemmParts()); m == 5 || m == 6 {
			cr.wgMode = m
		}
	}
	e.chunkLen = e.pickChunk(src)
	e.maxRows = max(e.chunkLen, 2*opts.Slots)
	e.setCacheLayout(engine.IndexerLayers(cfg))
	err = r.run(func(b device) error {
		w, ptrs, err := uploadWeights(b, src, cfg)
		if err != nil {
			return err
		}
		e.w = w
		e.owned = append(e.owned, ptrs...)
		if err := e.allocState(b); err != nil {
			return err
		}
		return b.sync()
	})
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	slog.Debug("gpu engine ready", "slots", opts.Slots, "max_seq", e.maxSeq, "slot_bytes", lay.SlotBytes,
		"weight_bytes", e.w.bytes, "mtp", opts.MTP)
	return e, nil
}

func (e *backend) alloc(b device, n int64) (cuda.DevPtr, error) {
	p, err := b.alloc(n)
	if err != nil {
		return 0, errors.Wrapf(err, "allocating %d bytes of device memory", n)
	}
	e.owned = append(e.owned, p)
	return p, nil
}

// allocState allocates the slot buffers, per-slot hiddens, RoPE tables and
// the forward workspace.
func (e *backend) allocState(b device) error {
	c := e.cfg
	for i := 0; i < e.opts.Slots; i++ {
		s := &slot{id: i}
		var err error
		if s.buf, err = e.alloc(b, e.devSlot); err != nil {
			return err
		}
		// Zeroed so a page never written decodes to finite values.
		if err := b.zero(s.buf, e.devSlot); err != nil {
			return err
		}
		if s.hidden, err = e.alloc(b, int64(4*c.HiddenSize)); err != nil {
			return err
		}
		e.slots = append(e.slots, s)
	}
	rope := kern.NewRope(c.QKRopeHeadDim, kern.RopeParamsOf(c))
	half := c.QKRopeHeadDim / 2
	cos, sin := make([]float32, e.maxSeq*half), make([]float32, e.maxSeq*half)
	for p := 0; p < e.maxSeq; p++ {
		rope.CosSin(p, cos[p*half:(p+1)*half], sin[p*half:(p+1)*half])
	}
	var err error
	if e.ropeCos, err = e.alloc(b, int64(4*len(cos))); err != nil {
		return err
	}
	if e.ropeSin, err = e.alloc(b, int64(4*len(sin))); err != nil {
		return err
	}
	if err := b.upload(e.ropeCos, f32Bytes(cos)); err != nil {
		return err
	}
	if err := b.upload(e.ropeSin, f32Bytes(sin)); err != nil {
		return err
	}
	e.ws, err = newWorkspace(e, b)
	return err
}

// Config returns the model configuration.
func (e *Engine) Config() *model.Config { return e.m.cfg }

// Close implements engine.Backend: it frees the engine's device memory (and
// the device, when New opened it).
func (e *backend) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	// Work started ahead ends before anything is freed.
	serr := e.settle()
	err := e.r.run(func(b device) error {
		// After a kernel fault every later call fails with the same sticky
		// error: keep the first and count the rest instead of chaining
		// hundreds of copies of it.
		var first error
		failed := 0
		note := func(err error) {
			if err != nil {
				if first == nil {
					first = err
				}
				failed++
			}
		}
		note(serr)
		note(e.freeAheadPins())
		if g := grapherOf(b); g != nil && e.graphs != nil {
			note(e.graphs.clear(g))
		}
		for _, p := range e.owned {
			note(b.free(p))
		}
		for _, s := range e.slots {
			if s.freeStaging != nil {
				note(s.freeStaging())
				s.staging, s.freeStaging = nil, nil
			}
		}
		if failed > 1 {
			return errors.Wrapf(first, "releasing the engine's device memory (%d of the releases failed; the first error follows)", failed)
		}
		return first
	})
	e.owned = nil
	return errors.CombineErrors(err, e.r.close())
}

func (e *backend) hasMTP() bool { return e.cfg.NumNextNLayers > 0 }
