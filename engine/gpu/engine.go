// Package gpu is the CUDA backend of the decode engine: the whole forward
// (absorbed MLA over vLLM's fp8_ds_mla cache, the DSA indexer over its fp8
// key cache, MoE, the MTP layer) runs on one NVIDIA GPU through package
// github.com/tilert-go/tilert/gpu, with every slot's caches in device memory
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

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
	cuda "github.com/tilert-go/tilert/gpu"
	"github.com/tilert-go/tilert/model"
)

type slotState int

const (
	slotFree slotState = iota
	slotLoaded
	slotActive
	slotFinished
)

func (s slotState) String() string {
	return [...]string{"free", "loaded", "active", "finished"}[s]
}

type slot struct {
	id          int
	state       slotState
	buf         cuda.DevPtr  // the slot's caches (Layout().SlotBytes), device memory
	staging     []byte       // host staging copy for SlotBuffer (lazy; pinned on the GPU)
	freeStaging func() error // releases staging

	seqLen    int
	mtpLen    int
	lastToken int
	// hidden holds the final-normed hidden at seqLen-1 when hasHidden, so the
	// MTP entry at seqLen-1 can be (re)computed.
	hidden    cuda.DevPtr
	hasHidden bool
	mtpTok    int
	mtpDraft  int

	next      int
	draft     int
	params    engine.Params
	generated int
	finish    engine.FinishReason
}

// Engine is the GPU backend; it implements engine.Engine. Not safe for
// concurrent use (the decode node serialises calls).
type Engine struct {
	cfg    *model.Config
	opts   engine.Options
	layout engine.Layout
	maxSeq int
	r      runner
	w      *dweights
	ws     *workspace
	slots  []*slot
	stats  engine.Stats
	owned  []cuda.DevPtr // every allocation, freed by Close
	closed bool

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
	graphs   *graphs // decode-step CUDA graphs (graph.go)
}

var _ engine.Engine = (*Engine)(nil)

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
	e.r.(*cudaRunner).own = true
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
	if c.KVLoraRank != cuda.MLALatentDim || c.QKRopeHeadDim != cuda.MLARopeDim || c.IndexHeadDim != cuda.IndexerHeadDim {
		return errors.Newf("the GPU kernels need kv_lora_rank %d, qk_rope_head_dim %d, index_head_dim %d (model has %d, %d, %d)",
			cuda.MLALatentDim, cuda.MLARopeDim, cuda.IndexerHeadDim, c.KVLoraRank, c.QKRopeHeadDim, c.IndexHeadDim)
	}
	if c.NRoutedExperts > 1024 || c.NumExpertsPerTok > 64 || c.NGroup > 32 {
		return errors.Newf("the MoE gate kernel handles at most 1024 experts, top-64, 32 groups (model: %d, %d, %d)",
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
	cfg := src.Config()
	if opts.Mode == "" {
		opts.Mode = engine.ModeServing
	}
	if _, err := engine.ParseMode(string(opts.Mode)); err != nil {
		return nil, err
	}
	dt, err := engine.ParseCacheDType(string(opts.MLACache))
	if err != nil {
		return nil, err
	}
	opts.MLACache = dt
	if opts.Slots <= 0 {
		opts.Slots = 1
	}
	if opts.MaxSeqLen <= 0 {
		opts.MaxSeqLen = 4096
	}
	if cfg.MaxPositionEmbeddings > 0 && opts.MaxSeqLen > cfg.MaxPositionEmbeddings {
		opts.MaxSeqLen = cfg.MaxPositionEmbeddings
	}
	if opts.MTP && cfg.NumNextNLayers < 1 {
		return nil, errors.WithHint(errors.New("MTP requested but the model has no MTP layer (num_nextn_predict_layers = 0)"),
			"run without --mtp")
	}
	if err := checkSupported(cfg, opts); err != nil {
		return nil, err
	}
	hasIdx := make([]bool, cfg.NumAllLayers())
	for i := range hasIdx {
		hasIdx[i] = cfg.HasIndexer(i)
	}
	lay, err := engine.NewLayout(opts.MLACache, cfg.KVLoraRank, cfg.QKRopeHeadDim, cfg.IndexHeadDim, opts.MaxSeqLen, hasIdx)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, opts: opts, layout: lay, r: r,
		maxSeq: min(lay.MaxPages*engine.BlockSize, opts.MaxSeqLen),
		scale:  float32(cfg.SoftmaxScale()),
		graphs: newGraphs(),
	}
	e.chunkLen = 32
	e.maxRows = max(e.chunkLen, 2*opts.Slots)
	e.setCacheLayout(hasIdx)
	err = r.run(func(b backend) error {
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

func (e *Engine) alloc(b backend, n int64) (cuda.DevPtr, error) {
	p, err := b.alloc(n)
	if err != nil {
		return 0, errors.Wrapf(err, "allocating %d bytes of device memory", n)
	}
	e.owned = append(e.owned, p)
	return p, nil
}

// allocState allocates the slot buffers, per-slot hiddens, RoPE tables and
// the forward workspace.
func (e *Engine) allocState(b backend) error {
	c := e.cfg
	for i := 0; i < e.opts.Slots; i++ {
		s := &slot{id: i, draft: -1, mtpTok: -1, mtpDraft: -1}
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
	rope := kern.NewRope(c.QKRopeHeadDim, kern.RopeParams{
		Type: c.Rope.Type, Theta: c.RopeTheta, Factor: c.Rope.Factor,
		OriginalMaxPosition: float64(c.Rope.OriginalMaxPositionEmbeddings),
		BetaFast:            c.Rope.BetaFast, BetaSlow: c.Rope.BetaSlow,
		MScale: c.Rope.Mscale, MScaleAllDim: c.Rope.MscaleAllDim,
		AttentionFactor:       c.Rope.AttentionFactor,
		MaxPositionEmbeddings: float64(c.MaxPositionEmbeddings),
		NoTruncate:            !c.Rope.Truncate,
	})
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
func (e *Engine) Config() *model.Config { return e.cfg }

func (e *Engine) Options() engine.Options { return e.opts }
func (e *Engine) Layout() engine.Layout   { return e.layout }
func (e *Engine) Stats() engine.Stats     { return e.stats }

// Close frees the engine's device memory (and the device, when New opened it).
func (e *Engine) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	err := e.r.run(func(b backend) error {
		var errs error
		if g := grapherOf(b); g != nil && e.graphs != nil {
			errs = e.graphs.clear(g)
		}
		for _, p := range e.owned {
			errs = errors.CombineErrors(errs, b.free(p))
		}
		for _, s := range e.slots {
			if s.freeStaging != nil {
				errs = errors.CombineErrors(errs, s.freeStaging())
				s.staging, s.freeStaging = nil, nil
			}
		}
		return errs
	})
	e.owned = nil
	return errors.CombineErrors(err, e.r.close())
}

func (e *Engine) slot(i int) (*slot, error) {
	if i < 0 || i >= len(e.slots) {
		return nil, errors.Wrapf(engine.ErrBadSlot, "slot %d (engine has %d)", i, len(e.slots))
	}
	return e.slots[i], nil
}

func (e *Engine) checkTokens(toks ...int) error { return engine.CheckTokens(e.cfg.VocabSize, toks...) }

func (e *Engine) hasMTP() bool { return e.cfg.NumNextNLayers > 0 }

// Prefill implements engine.Engine: the prompt runs through the decode path
// in chunks; the MTP layer follows each chunk (its position j needs the
// main hidden of j and token j+1, the last one the sampled first token).
func (e *Engine) Prefill(slotID int, prompt []int, p engine.Params) (int, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return 0, err
	}
	if s.state != slotFree {
		return 0, errors.Wrapf(engine.ErrSlotBusy, "slot %d is %s", slotID, s.state)
	}
	if len(prompt) == 0 {
		return 0, errors.New("empty prompt")
	}
	if len(prompt) >= e.maxSeq {
		return 0, errors.Wrapf(engine.ErrTooLong, "prompt of %d tokens, max_seq_len %d", len(prompt), e.maxSeq)
	}
	if err := e.checkTokens(prompt...); err != nil {
		return 0, err
	}
	L := len(prompt)
	first := -1
	err = e.r.run(func(b backend) error {
		o := &ops{b: b}
		ws := e.ws
		for lo := 0; lo < L; lo += e.chunkLen {
			hi := min(lo+e.chunkLen, L)
			rows := make([]fwdRow, hi-lo)
			want := make([]bool, hi-lo)
			for i := range rows {
				rows[i] = fwdRow{s: s, tok: prompt[lo+i], pos: lo + i}
			}
			want[len(want)-1] = hi == L
			e.forward(o, rows, false, want)
			if hi == L {
				toks, err := e.pick(o, []pickReq{{row: hi - lo - 1, p: p, pos: L}})
				if err != nil {
					return err
				}
				first = toks[0]
				o.copyRow(s.hidden, ws.hid, hi-lo-1, e.cfg.HiddenSize)
			}
			if e.hasMTP() {
				// MTP rows j in [lo, hi) with j < L-1: (hidden_j, prompt[j+1]).
				n := min(hi, L-1) - lo
				if n > 0 {
					mrows := make([]fwdRow, n)
					for i := range mrows {
						mrows[i] = fwdRow{s: s, tok: prompt[lo+i+1], pos: lo + i}
					}
					o.do(b.copyDD(ws.hin, ws.hid, int64(4*n*e.cfg.HiddenSize)))
					e.forward(o, mrows, true, nil)
				}
			}
			if o.err != nil {
				return o.err
			}
		}
		e.stats.Forwarded += int64(L)
		s.state = slotLoaded
		s.seqLen, s.lastToken, s.hasHidden = L, prompt[L-1], true
		s.mtpLen, s.mtpTok, s.mtpDraft = 0, -1, -1
		if e.hasMTP() {
			s.mtpLen = L - 1
			return e.fillLastMTP(o, s, first)
		}
		return o.err
	})
	if err != nil {
		e.resetSlot(s)
		return 0, err
	}
	return first, nil
}

// Start implements engine.Engine.
func (e *Engine) Start(slotID int, first int, p engine.Params) (engine.FinishReason, error) {
	s, err := e.slot(slotID)
	if err != nil {
		return "", err
	}
	if s.state != slotLoaded {
		return "", errors.Wrapf(engine.ErrSlotState, "start slot %d: it is %s, want loaded", slotID, s.state)
	}
	if err := e.checkTokens(first); err != nil {
		return "", err
	}
	s.params = p
	s.params.StopIDs = append([]int(nil), p.StopIDs...)
	s.next, s.draft, s.generated, s.finish = first, -1, 1, engine.FinishNone
	s.state = slotActive
	if f := e.finished(s, first); f != engine.FinishNone {
		s.finish, s.state = f, slotFinished
		return f, nil
	}
	if e.opts.MTP {
		switch {
		case s.mtpLen == s.seqLen && s.mtpTok == first:
			s.draft = s.mtpDraft
		case s.mtpLen == s.seqLen:
			// Imported with an MTP entry computed on first by the prefill
			// (vLLM's drafter); its draft was not shipped, so this step
			// runs without one.
		default:
			err := e.r.run(func(b backend) error { return e.fillLastMTP(&ops{b: b}, s, first) })
			if err != nil {
				return "", err
			}
			s.draft = s.mtpDraft
		}
	}
	return engine.FinishNone, nil
}

// fillLastMTP computes the MTP entry at seqLen-1 for token first, rerunning
// the last prompt token through the main model when its hidden is unknown.
func (e *Engine) fillLastMTP(o *ops, s *slot, first int) error {
	p := s.seqLen - 1
	if s.mtpLen < p {
		return errors.Wrapf(engine.ErrBadLayout, "MTP cache has %d positions, main cache %d", s.mtpLen, s.seqLen)
	}
	H := e.cfg.HiddenSize
	if !s.hasHidden {
		e.forward(o, []fwdRow{{s: s, tok: s.lastToken, pos: p}}, false, []bool{false})
		o.copyRow(s.hidden, e.ws.hid, 0, H)
		s.hasHidden = true
		e.stats.Forwarded++
	}
	o.do(o.b.copyDD(e.ws.hin, s.hidden, int64(4*H)))
	e.forward(o, []fwdRow{{s: s, tok: first, pos: p}}, true, []bool{true})
	d, err := e.argmaxRows(o, []int{0})
	if err != nil {
		return err
	}
	s.mtpLen, s.mtpTok, s.mtpDraft = s.seqLen, first, d[0]
	return nil
}

// finished applies the stop rules after tok became the generated-th token.
func (e *Engine) finished(s *slot, tok int) engine.FinishReason {
	return s.params.Finish(tok, s.generated, s.seqLen, e.maxSeq)
}

// Step implements engine.Engine: one main forward over every listed slot's
// pending token (and its MTP draft, verified in the same batch), tokens
// chosen on the device, then one MTP forward drafting each continuing
// slot's next token.
func (e *Engine) Step(ids []int) ([]engine.StepResult, error) {
	var act []*slot
	seen := map[int]bool{}
	for _, id := range ids {
		s, err := e.slot(id)
		if err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, errors.Newf("slot %d listed twice in one step", id)
		}
		seen[id] = true
		if s.state != slotActive {
			return nil, errors.Wrapf(engine.ErrSlotState, "step slot %d: it is %s, want active", id, s.state)
		}
		act = append(act, s)
	}
	if len(act) == 0 {
		return nil, nil
	}
	e.stats.Steps++
	var res []engine.StepResult
	err := e.runGraphed(func(b backend) error {
		var err error
		res, err = e.step(&ops{b: b}, act)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (e *Engine) step(o *ops, act []*slot) ([]engine.StepResult, error) {
	H := e.cfg.HiddenSize
	var rows []fwdRow
	first := make([]int, len(act))
	var reqs []pickReq
	for i, s := range act {
		first[i] = len(rows)
		rows = append(rows, fwdRow{s: s, tok: s.next, pos: s.seqLen})
		reqs = append(reqs, pickReq{row: first[i], p: s.params, pos: s.seqLen + 1})
		if s.draft >= 0 && s.seqLen+2 < e.maxSeq {
			rows = append(rows, fwdRow{s: s, tok: s.draft, pos: s.seqLen + 1})
			reqs = append(reqs, pickReq{row: first[i] + 1, p: s.params, pos: s.seqLen + 2})
		} else {
			s.draft = -1
		}
	}
	e.forward(o, rows, false, nil)
	picked, err := e.pick(o, reqs)
	if err != nil {
		return nil, err
	}
	e.stats.Forwarded += int64(len(rows))
	tokOf := map[int]int{}
	for i, r := range reqs {
		tokOf[r.row] = picked[i]
	}

	res := make([]engine.StepResult, len(act))
	var mrows []fwdRow
	var hinRows []int // main hidden row of each MTP row
	mlast := make([]int, len(act))
	for i, s := range act {
		r0 := first[i]
		res[i].Slot = s.id
		y := tokOf[r0]
		toks := []int{y}
		hrows := []int{r0}
		p := s.seqLen
		s.generated++
		s.seqLen++
		s.lastToken = s.next
		fin := e.finished(s, y)
		if s.draft >= 0 {
			res[i].Drafted = 1
			e.stats.DraftTokens++
			if y == s.draft && fin == engine.FinishNone {
				res[i].Accepted = 1
				e.stats.AcceptedTokens++
				y2 := tokOf[r0+1]
				toks = append(toks, y2)
				hrows = append(hrows, r0+1)
				s.generated++
				s.seqLen++
				s.lastToken = s.draft
				fin = e.finished(s, y2)
			} else if y == s.draft {
				res[i].Accepted = 1
				e.stats.AcceptedTokens++
			}
		}
		res[i].Tokens = toks
		e.stats.Tokens += int64(len(toks))
		s.next, s.draft = toks[len(toks)-1], -1
		o.copyRow(s.hidden, e.ws.hid, hrows[len(hrows)-1], H)
		s.hasHidden = true
		mlast[i] = -1
		if fin != engine.FinishNone {
			s.finish, s.state = fin, slotFinished
			res[i].Finish = fin
			continue
		}
		if e.opts.MTP {
			for j, t := range toks {
				mrows = append(mrows, fwdRow{s: s, tok: t, pos: p + j})
				hinRows = append(hinRows, hrows[j])
			}
			mlast[i] = len(mrows) - 1
		}
	}
	if len(mrows) > 0 {
		for j, hr := range hinRows {
			o.do(o.b.copyDD(fptr(e.ws.hin, j*H), fptr(e.ws.hid, hr*H), int64(4*H)))
		}
		want := make([]bool, len(mrows))
		for _, j := range mlast {
			if j >= 0 {
				want[j] = true
			}
		}
		e.forward(o, mrows, true, want)
		var wantRows []int
		for _, j := range mlast {
			if j >= 0 {
				wantRows = append(wantRows, j)
			}
		}
		drafts, err := e.argmaxRows(o, wantRows)
		if err != nil {
			return nil, err
		}
		k := 0
		for i, s := range act {
			if mlast[i] >= 0 {
				s.mtpLen, s.mtpTok = s.seqLen, s.next
				s.mtpDraft = drafts[k]
				s.draft = s.mtpDraft
				k++
			}
		}
	} else {
		for _, s := range act {
			s.mtpLen = min(s.mtpLen, s.seqLen-1)
		}
	}
	return res, o.err
}

// Release implements engine.Engine.
func (e *Engine) Release(slotID int) {
	s, err := e.slot(slotID)
	if err != nil {
		return
	}
	e.resetSlot(s)
}

func (e *Engine) resetSlot(s *slot) {
	s.state = slotFree
	s.seqLen, s.mtpLen, s.hasHidden, s.draft, s.mtpDraft, s.mtpTok = 0, 0, false, -1, -1, -1
	s.finish = engine.FinishNone
}
