// Package cpu is the pure-Go CPU reference backend of the decode engine:
// float32 compute, absorbed MLA with the DSA lightning indexer, both MoE
// routings, the MTP layer, exact (float32 caches) and serving (vLLM byte
// layouts) modes. It also runs the tiny synthetic models in CI.
//
// The slot book and step driver are engine.Book's; this package supplies
// the compute (engine.Backend).
package cpu

import (
	"log/slog"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/kern"
	"github.com/tilert-go/tilert/model"
)

// slot is one slot's caches and kept hidden state (its book is engine.Book's).
type slot struct {
	id     int
	caches []layerCache
	buf    []byte // serving: the live cache; exact: receive/staging buffer (lazy)
	// lastHidden is the final-normed hidden at the slot's last position when
	// kept (engine.Compute.KeepHidden), the MTP layer's input there.
	lastHidden []float32
}

// Engine is the CPU engine: engine.Book over the CPU backend.
type Engine struct {
	*engine.Book
	m *backend
}

// backend is the model and the slots' caches; it implements engine.Backend
// and engine.Compute.
type backend struct {
	cfg          *model.Config
	opts         engine.Options
	w            *weights
	layout       engine.Layout
	ropeTab      *kern.Rope
	softmaxScale float64
	slots        []*slot
	maxSeq       int
	// The last forward's rows: main hiddens (for KeepHidden and ForwardMTP)
	// and logits (for Pick).
	hidden, logits [][]float32
	// indexerHook, when set (tests), sees every row's indexer scores and selection.
	indexerHook func(layer, pos int, scores []float32, sel []int)
}

// prefillChunk bounds the rows forwarded together during prefill.
const prefillChunk = 64

// New builds a CPU engine for cfg with weights from src.
func New(cfg *model.Config, src model.Weights, opts engine.Options) (*Engine, error) {
	opts, lay, maxSeq, err := engine.Resolve(cfg, opts, engine.ModeExact)
	if err != nil {
		return nil, err
	}
	w, err := loadWeights(cfg, src)
	if err != nil {
		return nil, err
	}
	m := &backend{
		cfg: cfg, opts: opts, w: w, layout: lay, maxSeq: maxSeq,
		softmaxScale: cfg.SoftmaxScale(),
		ropeTab:      kern.NewRope(cfg.QKRopeHeadDim, kern.RopeParamsOf(cfg)),
	}
	hasIdx := engine.IndexerLayers(cfg)
	for i := 0; i < opts.Slots; i++ {
		s := &slot{id: i}
		if opts.Mode == engine.ModeServing {
			s.buf = make([]byte, lay.SlotBytes)
			s.caches = newByteCaches(lay, s.buf)
		} else {
			s.caches = make([]layerCache, lay.NumLayers)
			for l := range s.caches {
				s.caches[l] = newF32Cache(maxSeq, cfg.KVLoraRank, cfg.QKRopeHeadDim, cfg.IndexHeadDim, hasIdx[l])
			}
		}
		m.slots = append(m.slots, s)
	}
	slog.Debug("cpu engine ready", "mode", opts.Mode, "mla_cache", opts.MLACache, "slots", opts.Slots,
		"max_seq", maxSeq, "slot_bytes", lay.SlotBytes, "mtp", opts.MTP)
	return &Engine{Book: engine.NewBookFor(m, cfg, opts, lay, maxSeq, prefillChunk), m: m}, nil
}

// Config returns the model configuration.
func (e *Engine) Config() *model.Config { return e.m.cfg }

func (e *backend) hasMTP() bool { return e.cfg.NumNextNLayers > 0 }

// Run implements engine.Backend: the CPU computes on the caller's goroutine.
func (e *backend) Run(_ bool, f func(engine.Compute) error) error { return f(e) }

// Close implements engine.Backend.
func (e *backend) Close() error { return nil }

func (e *backend) rows(rs []engine.Row, hidden []int) ([]row, error) {
	out := make([]row, len(rs))
	for i, r := range rs {
		if r.Slot < 0 || r.Slot >= len(e.slots) {
			return nil, errors.Wrapf(engine.ErrBadSlot, "row of slot %d", r.Slot)
		}
		out[i] = row{s: e.slots[r.Slot], tok: r.Tok, pos: r.Pos}
		if hidden == nil {
			continue
		}
		if j := hidden[i]; j >= 0 {
			out[i].h = e.hidden[j]
		} else if out[i].h = out[i].s.lastHidden; out[i].h == nil {
			return nil, errors.Newf("MTP row of slot %d: the slot keeps no hidden state", r.Slot)
		}
	}
	return out, nil
}

// Forward implements engine.Compute.
func (e *backend) Forward(rs []engine.Row, logits []bool) error {
	rows, err := e.rows(rs, nil)
	if err != nil {
		return err
	}
	e.hidden, e.logits = e.forwardMain(rows, logits)
	return nil
}

// KeepHidden implements engine.Compute.
func (e *backend) KeepHidden(slot, row int) error {
	e.slots[slot].lastHidden = e.hidden[row]
	return nil
}

// ForwardMTP implements engine.Compute.
func (e *backend) ForwardMTP(rs []engine.Row, hidden []int, logits []bool) error {
	rows, err := e.rows(rs, hidden)
	if err != nil {
		return err
	}
	e.logits = e.forwardMTP(rows, logits)
	return nil
}

// Pick implements engine.Compute with engine.Sample.
func (e *backend) Pick(picks []engine.Pick) ([]int, error) {
	out := make([]int, len(picks))
	for i, p := range picks {
		lg := e.logits[p.Row]
		if lg == nil {
			return nil, errors.Newf("pick from row %d: the forward computed no logits for it", p.Row)
		}
		raw := lg
		if len(p.Adjust) > 0 {
			lg = append([]float32(nil), lg...) // the row may be picked again (a draft's row)
			engine.ApplyAdjust(lg, p.Adjust)
		}
		out[i] = engine.Sample(lg, p.Params, p.Pos)
		if p.LP != nil {
			*p.LP = engine.Logprobs(raw, out[i], p.TopLP)
		}
	}
	return out, nil
}
