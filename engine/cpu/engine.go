// Package cpu is the pure-Go CPU reference backend of the decode engine:
// float32 compute, absorbed MLA with the DSA lightning indexer, both MoE
// routings, the MTP layer, exact (float32 caches) and serving (vLLM byte
// layouts) modes. It also runs the tiny synthetic models in CI.
package cpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
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
	id     int
	state  slotState
	caches []layerCache
	buf    []byte // serving: the live cache; exact: receive/staging buffer (lazy)

	seqLen    int // positions present in the main caches
	mtpLen    int // positions present in the MTP cache
	lastToken int // token at seqLen-1
	// lastHidden is the final-normed hidden at seqLen-1 when known (after a
	// local prefill), so the MTP entry at seqLen-1 can be (re)computed.
	lastHidden []float32
	mtpTok     int // token the MTP entry at seqLen-1 was computed with (-1: none)
	mtpDraft   int // MTP prediction for position seqLen+1 given mtpTok (-1: none)

	next      int // token to forward at position seqLen
	draft     int // drafted token for position seqLen+1, -1 when none
	params    engine.Params
	generated int
	finish    engine.FinishReason
}

// Engine is the CPU backend; it implements engine.Engine.
type Engine struct {
	cfg          *model.Config
	opts         engine.Options
	w            *weights
	layout       engine.Layout
	ropeTab      *kern.Rope
	softmaxScale float64
	slots        []*slot
	maxSeq       int
	stats        engine.Stats
	// indexerHook, when set (tests), sees every row's indexer scores and selection.
	indexerHook func(layer, pos int, scores []float32, sel []int)
}

var _ engine.Engine = (*Engine)(nil)

// New builds a CPU engine for cfg with weights from src.
func New(cfg *model.Config, src model.Weights, opts engine.Options) (*Engine, error) {
	if opts.Mode == "" {
		opts.Mode = engine.ModeExact
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
	if opts.MaxSeqLen > cfg.MaxPositionEmbeddings && cfg.MaxPositionEmbeddings > 0 {
		opts.MaxSeqLen = cfg.MaxPositionEmbeddings
	}
	if opts.MTP && cfg.NumNextNLayers < 1 {
		return nil, errors.WithHint(errors.New("MTP requested but the model has no MTP layer (num_nextn_predict_layers = 0)"),
			"run without --mtp")
	}
	w, err := loadWeights(cfg, src)
	if err != nil {
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
		cfg: cfg, opts: opts, w: w, layout: lay,
		softmaxScale: cfg.SoftmaxScale(),
		maxSeq:       lay.MaxPages * engine.BlockSize,
	}
	if e.maxSeq > opts.MaxSeqLen {
		e.maxSeq = opts.MaxSeqLen
	}
	e.ropeTab = kern.NewRope(cfg.QKRopeHeadDim, kern.RopeParams{
		Type: cfg.Rope.Type, Theta: cfg.RopeTheta, Factor: cfg.Rope.Factor,
		OriginalMaxPosition: float64(cfg.Rope.OriginalMaxPositionEmbeddings),
		BetaFast:            cfg.Rope.BetaFast, BetaSlow: cfg.Rope.BetaSlow,
		MScale: cfg.Rope.Mscale, MScaleAllDim: cfg.Rope.MscaleAllDim,
		AttentionFactor:       cfg.Rope.AttentionFactor,
		MaxPositionEmbeddings: float64(cfg.MaxPositionEmbeddings),
		NoTruncate:            !cfg.Rope.Truncate,
	})
	for i := 0; i < opts.Slots; i++ {
		s := &slot{id: i}
		if opts.Mode == engine.ModeServing {
			s.buf = make([]byte, lay.SlotBytes)
			s.caches = newByteCaches(lay, s.buf)
		} else {
			s.caches = make([]layerCache, lay.NumLayers)
			for l := range s.caches {
				s.caches[l] = newF32Cache(e.maxSeq, cfg.KVLoraRank, cfg.QKRopeHeadDim, cfg.IndexHeadDim, hasIdx[l])
			}
		}
		e.slots = append(e.slots, s)
	}
	slog.Debug("cpu engine ready", "mode", opts.Mode, "mla_cache", opts.MLACache, "slots", opts.Slots,
		"max_seq", e.maxSeq, "slot_bytes", lay.SlotBytes, "mtp", opts.MTP)
	return e, nil
}

// Config returns the model configuration.
func (e *Engine) Config() *model.Config { return e.cfg }

func (e *Engine) Options() engine.Options { return e.opts }
func (e *Engine) Layout() engine.Layout   { return e.layout }
func (e *Engine) Stats() engine.Stats     { return e.stats }
func (e *Engine) Close() error            { return nil }

func (e *Engine) slot(i int) (*slot, error) {
	if i < 0 || i >= len(e.slots) {
		return nil, errors.Wrapf(engine.ErrBadSlot, "slot %d (engine has %d)", i, len(e.slots))
	}
	return e.slots[i], nil
}

func (e *Engine) checkTokens(toks ...int) error { return engine.CheckTokens(e.cfg.VocabSize, toks...) }

func (e *Engine) hasMTP() bool { return e.cfg.NumNextNLayers > 0 }

// prefillChunk bounds the rows forwarded together during prefill.
const prefillChunk = 64

// Prefill implements engine.Engine.
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
	hidden, last := e.prefillMain(s, prompt)
	first := engine.Sample(last, p, len(prompt))
	s.state = slotLoaded
	s.seqLen, s.lastToken = len(prompt), prompt[len(prompt)-1]
	s.lastHidden = hidden[len(hidden)-1]
	s.mtpLen, s.mtpTok, s.mtpDraft = 0, -1, -1
	if e.hasMTP() {
		toks := append(append([]int(nil), prompt[1:]...), first)
		logits := e.prefillMTP(s, toks, hidden)
		s.mtpLen, s.mtpTok, s.mtpDraft = len(prompt), first, engine.Argmax(logits)
	}
	return first, nil
}

// prefillMain forwards prompt at positions 0.. and returns all final-normed
// hiddens and the last position's logits.
func (e *Engine) prefillMain(s *slot, prompt []int) ([][]float32, []float32) {
	var hidden [][]float32
	var last []float32
	for lo := 0; lo < len(prompt); lo += prefillChunk {
		hi := min(lo+prefillChunk, len(prompt))
		rows := make([]row, hi-lo)
		want := make([]bool, hi-lo)
		for i := range rows {
			rows[i] = row{s: s, tok: prompt[lo+i], pos: lo + i}
		}
		want[len(want)-1] = hi == len(prompt)
		h, lg := e.forwardMain(rows, want)
		hidden = append(hidden, h...)
		if hi == len(prompt) {
			last = lg[len(lg)-1]
		}
	}
	e.stats.Forwarded += int64(len(prompt))
	return hidden, last
}

// prefillMTP fills MTP positions 0..len(toks)-1 with (hidden[j], toks[j])
// and returns the logits of the last one.
func (e *Engine) prefillMTP(s *slot, toks []int, hidden [][]float32) []float32 {
	var last []float32
	for lo := 0; lo < len(toks); lo += prefillChunk {
		hi := min(lo+prefillChunk, len(toks))
		rows := make([]row, hi-lo)
		want := make([]bool, hi-lo)
		for i := range rows {
			rows[i] = row{s: s, tok: toks[lo+i], pos: lo + i, h: hidden[lo+i]}
		}
		want[len(want)-1] = hi == len(toks)
		lg := e.forwardMTP(rows, want)
		if hi == len(toks) {
			last = lg[len(lg)-1]
		}
	}
	return last
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
			// The MTP entry at seqLen-1 needs the last hidden state.
			if err := e.fillLastMTP(s, first); err != nil {
				return "", err
			}
			s.draft = s.mtpDraft
		}
	}
	return engine.FinishNone, nil
}

// fillLastMTP computes the MTP entry at seqLen-1 for token first, rerunning
// the last prompt token through the main model when its hidden is unknown.
func (e *Engine) fillLastMTP(s *slot, first int) error {
	p := s.seqLen - 1
	if s.mtpLen < p {
		return errors.Wrapf(engine.ErrBadLayout, "MTP cache has %d positions, main cache %d", s.mtpLen, s.seqLen)
	}
	h := s.lastHidden
	if h == nil {
		hid, _ := e.forwardMain([]row{{s: s, tok: s.lastToken, pos: p}}, []bool{false})
		h = hid[0]
		e.stats.Forwarded++
	}
	lg := e.forwardMTP([]row{{s: s, tok: first, pos: p, h: h}}, []bool{true})
	s.mtpLen, s.mtpTok, s.mtpDraft = s.seqLen, first, engine.Argmax(lg[0])
	return nil
}

// finished applies the stop rules after tok became the generated-th token.
func (e *Engine) finished(s *slot, tok int) engine.FinishReason {
	return s.params.Finish(tok, s.generated, s.seqLen, e.maxSeq)
}

// Step implements engine.Engine.
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
	e.stats.Steps++
	// Main forward: each slot's pending token, plus its draft when it has one.
	var rows []row
	first := make([]int, len(act)) // index of each slot's first row
	for i, s := range act {
		first[i] = len(rows)
		rows = append(rows, row{s: s, tok: s.next, pos: s.seqLen})
		if s.draft >= 0 && s.seqLen+2 < e.maxSeq {
			rows = append(rows, row{s: s, tok: s.draft, pos: s.seqLen + 1})
		} else {
			s.draft = -1
		}
	}
	hidden, logits := e.forwardMain(rows, nil)
	e.stats.Forwarded += int64(len(rows))

	res := make([]engine.StepResult, len(act))
	var mrows []row
	var mlast []int // index into mrows of each continuing slot's last MTP row, or -1
	for i, s := range act {
		r0 := first[i]
		p := s.seqLen
		res[i].Slot = s.id
		y := engine.Sample(logits[r0], s.params, p+1)
		toks := []int{y}
		hs := [][]float32{hidden[r0]}
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
				y2 := engine.Sample(logits[r0+1], s.params, p+2)
				toks = append(toks, y2)
				hs = append(hs, hidden[r0+1])
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
		s.lastHidden = hs[len(hs)-1]
		if fin != engine.FinishNone {
			s.finish, s.state = fin, slotFinished
			res[i].Finish = fin
			mlast = append(mlast, -1)
			continue
		}
		if e.opts.MTP {
			for j, t := range toks {
				mrows = append(mrows, row{s: s, tok: t, pos: p + j, h: hs[j]})
			}
			mlast = append(mlast, len(mrows)-1)
		} else {
			mlast = append(mlast, -1)
		}
	}
	if len(mrows) > 0 {
		want := make([]bool, len(mrows))
		for _, j := range mlast {
			if j >= 0 {
				want[j] = true
			}
		}
		lg := e.forwardMTP(mrows, want)
		for i, s := range act {
			if j := mlast[i]; j >= 0 {
				s.mtpLen, s.mtpTok = s.seqLen, s.next
				s.mtpDraft = engine.Argmax(lg[j])
				s.draft = s.mtpDraft
			}
		}
	} else {
		for _, s := range act {
			s.mtpLen = min(s.mtpLen, s.seqLen-1)
		}
	}
	return res, nil
}

// Release implements engine.Engine.
func (e *Engine) Release(slotID int) {
	s, err := e.slot(slotID)
	if err != nil {
		return
	}
	s.state = slotFree
	s.seqLen, s.mtpLen, s.lastHidden, s.draft, s.mtpDraft, s.mtpTok = 0, 0, nil, -1, -1, -1
	s.finish = engine.FinishNone
}
