package engine

import (
	"github.com/cockroachdb/errors"
)

// This file is the one slot book and step driver every engine shares: slot
// states, Prefill/Import/Start/Step/Release, the finish rule and the MTP
// draft-and-verify bookkeeping. A backend (engine/cpu, engine/gpu, a
// sharded engine) supplies only the compute: forward rows through the main
// model or the MTP layer, keep a slot's last hidden state, pick tokens.

// Row is one position to forward: slot Slot's token Tok at position Pos.
type Row struct{ Slot, Tok, Pos int }

// Pick asks for one token from the logits of row Row of the last forward,
// chosen with Params at position Pos (seeded sampling draws by position,
// so output does not depend on batching or MTP).
type Pick struct {
	Row    int
	Pos    int
	Params Params
	// Adjust changes logits of the row before the choice (penalties,
	// logit_bias, min_tokens: Params.Adjustments).
	Adjust []LogitAdjust
	// LP, when set, receives the chosen token's raw logprob and TopLP
	// alternatives.
	LP    *TokenLogprobs
	TopLP int
}

// Backend is the compute half of an engine: the model, every slot's caches
// and the hidden state each slot keeps for its MTP layer. The Book decides
// what to forward; the backend forwards it.
type Backend interface {
	// Run calls f with the backend's compute in its execution context (a
	// GPU's device thread). step is true for a decode step, which a
	// backend may capture and replay as a graph.
	Run(step bool, f func(Compute) error) error
	// SlotBuffer is slot's receive buffer (Layout().SlotBytes bytes).
	SlotBuffer(slot int) ([]byte, error)
	// Import puts a checked state into slot's caches: segs copied to their
	// offsets, or with segs == nil the bytes already in SlotBuffer(slot).
	Import(slot int, meta SlotMeta, segs []Segment) error
	// Export copies the used pages of slot's caches (meta gives lengths).
	Export(slot int, meta SlotMeta) ([]Segment, error)
	Close() error
}

// Compute is a backend's work inside Backend.Run.
type Compute interface {
	// Forward runs rows through the main model, writing their cache
	// entries before any row attends (a row attends to positions <= its
	// own). Every row's final hidden state, and the logits of rows with
	// logits[i] (nil: all rows), stay until the next Forward or ForwardMTP.
	Forward(rows []Row, logits []bool) error
	// KeepHidden keeps row's final hidden state of the last Forward as
	// slot's hidden state: the MTP input at the slot's last position.
	KeepHidden(slot, row int) error
	// ForwardMTP runs rows through the MTP layer. Row j's hidden input is
	// row hidden[j] of the Forward just before it, or, when hidden[j] is
	// -1, the hidden state its slot keeps.
	ForwardMTP(rows []Row, hidden []int, logits []bool) error
	// Pick chooses one token per pick from the last forward's logits.
	Pick(picks []Pick) ([]int, error)
}

// Ahead is an optional Compute capability (the GPU backend's): choose a
// step's tokens and, before they reach the host, start the next step's
// forward on the device with them, so the device does not idle while the
// host reads the tokens, does the book-keeping and records the next step
// (vLLM's async scheduling). The CPU backend has none: its steps stay as
// they are.
type Ahead interface {
	// AheadOK says whether PickAhead may be used in this run: after a
	// step's main forward (mtp false) or after its MTP forward, for the
	// draft picks (mtp true).
	AheadOK(mtp bool) bool
	// PickAhead is Pick(picks) that also
	// starts Forward(next, nil) before the tokens reach the host: where
	// from[i] >= 0, next[i].Tok is the token picks[from[i]] chooses (taken
	// on the device; the Tok given is ignored). A later Forward of exactly
	// those rows, tokens included, with nothing else run on the device in
	// between, finds its results in place; any other Forward or run
	// discards them (their cache entries are rewritten by whatever runs
	// those positions again: the same token gives the same bytes).
	PickAhead(picks []Pick, next []Row, from []int) ([]int, error)
}

// Drainer is an optional Backend capability: Drain waits until no device
// work started ahead (Ahead) is in flight, so a slot's buffer can be handed
// to a writer outside the device's stream (a transfer engine writing device
// memory). An error of that work is returned by the backend's next call.
type Drainer interface {
	Drain()
}

// BookConfig sizes a Book.
type BookConfig struct {
	Options Options // resolved (defaults applied)
	Layout  Layout
	// MaxSeq is the positions a slot holds (<= Options.MaxSeqLen).
	MaxSeq    int
	VocabSize int
	// HasMTP says the model has an MTP layer: prefill fills its cache even
	// when Options.MTP is off, so an exported state is what vLLM ships.
	HasMTP bool
	// PrefillRows bounds the rows of one prefill forward.
	PrefillRows int
}

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

// bookSlot is one slot's book: everything but its caches and hidden state.
type bookSlot struct {
	id    int
	state slotState

	seqLen    int  // positions present in the main caches
	mtpLen    int  // positions present in the MTP cache
	lastToken int  // token at seqLen-1
	hasHidden bool // the backend keeps the final hidden at seqLen-1
	mtpTok    int  // token the MTP entry at seqLen-1 was computed with (-1: none)
	mtpDraft  int  // MTP prediction for position seqLen+1 given mtpTok (-1: none)

	next      int // token to forward at position seqLen
	draft     int // drafted token for position seqLen+1, -1 when none
	params    Params
	generated int
	finish    FinishReason
	hist      *TokenHistory  // generated tokens (and the prompt) when params adjust logits
	prefillLP *TokenLogprobs // the first token's logprobs of the last Prefill, when asked for
}

func (s *bookSlot) reset() {
	*s = bookSlot{id: s.id, draft: -1, mtpTok: -1, mtpDraft: -1}
}

// Book is the slot book and step driver over a Backend; it implements
// Engine. Not safe for concurrent use.
type Book struct {
	cfg   BookConfig
	be    Backend
	slots []bookSlot
	stats Stats
}

var _ Engine = (*Book)(nil)

// NewBook keeps the book of cfg.Options.Slots free slots over be.
func NewBook(be Backend, cfg BookConfig) *Book {
	b := &Book{cfg: cfg, be: be, slots: make([]bookSlot, cfg.Options.Slots)}
	for i := range b.slots {
		b.slots[i].id = i
		b.slots[i].reset()
	}
	if b.cfg.PrefillRows <= 0 {
		b.cfg.PrefillRows = 64
	}
	return b
}

func (b *Book) Options() Options { return b.cfg.Options }
func (b *Book) Layout() Layout   { return b.cfg.Layout }
func (b *Book) Stats() Stats     { return b.stats }
func (b *Book) Close() error     { return b.be.Close() }

// MaxSeq is the number of positions a slot holds.
func (b *Book) MaxSeq() int { return b.cfg.MaxSeq }

func (b *Book) slot(i int) (*bookSlot, error) {
	if i < 0 || i >= len(b.slots) {
		return nil, errors.Wrapf(ErrBadSlot, "slot %d (engine has %d)", i, len(b.slots))
	}
	return &b.slots[i], nil
}

// CheckFree returns an error unless slot exists and is free (for a
// backend's diagnostics that borrow a free slot's caches).
func (b *Book) CheckFree(slot int) error {
	s, err := b.slot(slot)
	if err != nil {
		return err
	}
	if s.state != slotFree {
		return errors.Wrapf(ErrSlotBusy, "slot %d is %s", slot, s.state)
	}
	return nil
}

// ForceDraft replaces an Active slot's pending MTP draft with tok, so a
// test can make the next Step verify a right or a wrong draft.
func (b *Book) ForceDraft(slot, tok int) error {
	s, err := b.slot(slot)
	if err != nil {
		return err
	}
	if s.state != slotActive {
		return errors.Wrapf(ErrSlotState, "draft for slot %d: it is %s, want active", slot, s.state)
	}
	if err := CheckTokens(b.cfg.VocabSize, tok); err != nil {
		return err
	}
	s.draft = tok
	return nil
}

// Prefill implements Engine: the prompt runs in chunks of PrefillRows; the
// MTP layer follows each chunk (its position j takes the main hidden of j
// and token j+1; the last one, the sampled first token).
func (b *Book) Prefill(slot int, prompt []int, p Params) (int, error) {
	if err := b.CheckFree(slot); err != nil {
		return 0, err
	}
	s := &b.slots[slot]
	if len(prompt) == 0 {
		return 0, errors.New("empty prompt")
	}
	if len(prompt) >= b.cfg.MaxSeq {
		return 0, errors.Wrapf(ErrTooLong, "prompt of %d tokens, max_seq_len %d", len(prompt), b.cfg.MaxSeq)
	}
	if err := CheckTokens(b.cfg.VocabSize, prompt...); err != nil {
		return 0, err
	}
	L := len(prompt)
	first := -1
	err := b.be.Run(false, func(c Compute) error {
		for lo := 0; lo < L; lo += b.cfg.PrefillRows {
			hi := min(lo+b.cfg.PrefillRows, L)
			rows := make([]Row, hi-lo)
			logits := make([]bool, hi-lo)
			for i := range rows {
				rows[i] = Row{Slot: slot, Tok: prompt[lo+i], Pos: lo + i}
			}
			logits[len(logits)-1] = hi == L
			if err := c.Forward(rows, logits); err != nil {
				return err
			}
			if hi == L {
				pk := Pick{Row: hi - lo - 1, Pos: L, Params: p}
				if p.Adjusts() {
					pk.Adjust = p.Adjustments(NewTokenHistory(prompt), -1)
				}
				if p.Logprobs {
					pk.LP, pk.TopLP = &TokenLogprobs{}, p.TopLogprobs
				}
				toks, err := c.Pick([]Pick{pk})
				if err != nil {
					return err
				}
				first = toks[0]
				s.prefillLP = pk.LP
				if err := c.KeepHidden(slot, hi-lo-1); err != nil {
					return err
				}
			}
			// MTP rows j in [lo, hi) with j < L-1: (hidden_j, prompt[j+1]).
			if n := min(hi, L-1) - lo; b.cfg.HasMTP && n > 0 {
				mrows := make([]Row, n)
				hidden := make([]int, n)
				for i := range mrows {
					mrows[i] = Row{Slot: slot, Tok: prompt[lo+i+1], Pos: lo + i}
					hidden[i] = i
				}
				if err := c.ForwardMTP(mrows, hidden, make([]bool, n)); err != nil {
					return err
				}
			}
		}
		b.stats.Forwarded += int64(L)
		s.state = slotLoaded
		s.seqLen, s.lastToken, s.hasHidden = L, prompt[L-1], true
		if b.cfg.HasMTP {
			s.mtpLen = L - 1
			return b.fillLastMTP(c, s, first)
		}
		return nil
	})
	if err != nil {
		s.reset()
		return 0, err
	}
	return first, nil
}

// SlotBuffer implements Engine.
func (b *Book) SlotBuffer(slot int) ([]byte, error) {
	if _, err := b.slot(slot); err != nil {
		return nil, err
	}
	return b.be.SlotBuffer(slot)
}

// Import implements Engine.
func (b *Book) Import(slot int, meta SlotMeta, segs []Segment) error {
	s, err := b.slot(slot)
	if err != nil {
		return err
	}
	if s.state != slotFree {
		return errors.Wrapf(ErrSlotBusy, "import into slot %d: it is %s", slot, s.state)
	}
	o := b.cfg.Options
	if err := CheckImport(meta, segs, b.cfg.MaxSeq, b.cfg.VocabSize, o.MTP, b.cfg.Layout.SlotBytes); err != nil {
		return err
	}
	if err := b.be.Import(slot, meta, segs); err != nil {
		return err
	}
	s.reset()
	s.state = slotLoaded
	s.seqLen, s.mtpLen, s.lastToken = meta.SeqLen, meta.MTPLen, meta.LastToken
	return nil
}

// Export implements Engine.
func (b *Book) Export(slot int) (SlotMeta, []Segment, error) {
	s, err := b.slot(slot)
	if err != nil {
		return SlotMeta{}, nil, err
	}
	if s.state == slotFree {
		return SlotMeta{}, nil, errors.Wrapf(ErrSlotState, "export slot %d: it is free", slot)
	}
	meta := SlotMeta{SeqLen: s.seqLen, MTPLen: s.mtpLen, LastToken: s.lastToken}
	segs, err := b.be.Export(slot, meta)
	if err != nil {
		return SlotMeta{}, nil, err
	}
	return meta, segs, nil
}

// Start implements Engine.
func (b *Book) Start(slot int, first int, p Params) (FinishReason, error) {
	s, err := b.slot(slot)
	if err != nil {
		return "", err
	}
	if s.state != slotLoaded {
		return "", errors.Wrapf(ErrSlotState, "start slot %d: it is %s, want loaded", slot, s.state)
	}
	if err := CheckTokens(b.cfg.VocabSize, first); err != nil {
		return "", err
	}
	s.params = p
	s.params.StopIDs = append([]int(nil), p.StopIDs...)
	s.next, s.draft, s.generated, s.finish = first, -1, 1, FinishNone
	s.hist = nil
	if p.Adjusts() {
		var prompt []int
		if p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1 {
			prompt = p.PromptIDs
		}
		s.hist = NewTokenHistory(prompt)
		s.hist.Add(first)
	}
	s.state = slotActive
	if f := b.finished(s, first); f != FinishNone {
		s.finish, s.state = f, slotFinished
		return f, nil
	}
	if b.cfg.Options.MTP {
		switch {
		case s.mtpLen == s.seqLen && s.mtpTok == first:
			s.draft = s.mtpDraft
		case s.mtpLen == s.seqLen:
			// Imported with an MTP entry computed on first by the prefill
			// (vLLM's drafter); its draft was not shipped, so this step
			// runs without one.
		default:
			if err := b.be.Run(false, func(c Compute) error { return b.fillLastMTP(c, s, first) }); err != nil {
				return "", err
			}
			s.draft = s.mtpDraft
		}
	}
	return FinishNone, nil
}

// fillLastMTP computes the MTP entry at seqLen-1 for token first, rerunning
// the last prompt token through the main model when its hidden is unknown.
func (b *Book) fillLastMTP(c Compute, s *bookSlot, first int) error {
	p := s.seqLen - 1
	if s.mtpLen < p {
		return errors.Wrapf(ErrBadLayout, "MTP cache has %d positions, main cache %d", s.mtpLen, s.seqLen)
	}
	if !s.hasHidden {
		if err := c.Forward([]Row{{Slot: s.id, Tok: s.lastToken, Pos: p}}, []bool{false}); err != nil {
			return err
		}
		if err := c.KeepHidden(s.id, 0); err != nil {
			return err
		}
		s.hasHidden = true
		b.stats.Forwarded++
	}
	if err := c.ForwardMTP([]Row{{Slot: s.id, Tok: first, Pos: p}}, []int{-1}, []bool{true}); err != nil {
		return err
	}
	d, err := c.Pick([]Pick{{Row: 0, Pos: p + 1}})
	if err != nil {
		return err
	}
	s.mtpLen, s.mtpTok, s.mtpDraft = s.seqLen, first, d[0]
	return nil
}

// finished applies the stop rules after tok became the generated-th token.
func (b *Book) finished(s *bookSlot, tok int) FinishReason {
	return s.params.Finish(tok, s.generated, s.seqLen, b.cfg.MaxSeq)
}

// Step implements Engine: one main forward over every listed slot's
// pending token (and its MTP draft, verified in the same batch), then one
// MTP forward drafting each continuing slot's next token.
func (b *Book) Step(ids []int) ([]StepResult, error) {
	var act []*bookSlot
	seen := map[int]bool{}
	for _, id := range ids {
		s, err := b.slot(id)
		if err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, errors.Newf("slot %d listed twice in one step", id)
		}
		seen[id] = true
		if s.state != slotActive {
			return nil, errors.Wrapf(ErrSlotState, "step slot %d: it is %s, want active", id, s.state)
		}
		act = append(act, s)
	}
	if len(act) == 0 {
		return nil, nil
	}
	b.stats.Steps++
	var res []StepResult
	err := b.be.Run(true, func(c Compute) error {
		var err error
		res, err = b.step(c, act)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (b *Book) step(c Compute, act []*bookSlot) ([]StepResult, error) {
	var rows []Row
	var picks []Pick
	first := make([]int, len(act)) // each slot's first row
	for i, s := range act {
		first[i] = len(rows)
		rows = append(rows, Row{Slot: s.id, Tok: s.next, Pos: s.seqLen})
		picks = append(picks, s.pick(first[i], s.seqLen+1, -1))
		if s.draft >= 0 && s.seqLen+2 < b.cfg.MaxSeq {
			rows = append(rows, Row{Slot: s.id, Tok: s.draft, Pos: s.seqLen + 1})
			// Used only when the draft is accepted: the draft then counts
			// as generated for the penalties.
			picks = append(picks, s.pick(first[i]+1, s.seqLen+2, s.draft))
		} else {
			s.draft = -1
		}
	}
	if err := c.Forward(rows, nil); err != nil {
		return nil, err
	}
	ah, _ := c.(Ahead)
	ahead := ah != nil && ah.AheadOK(false) && b.plainStep(act, rows, picks)
	var picked []int
	var err error
	if ahead {
		// Every slot keeps row i's hidden now: the forward started ahead
		// overwrites the rows.
		next := make([]Row, len(rows))
		from := make([]int, len(rows))
		for i, s := range act {
			if err := c.KeepHidden(s.id, i); err != nil {
				return nil, err
			}
			next[i], from[i] = Row{Slot: s.id, Tok: -1, Pos: s.seqLen + 1}, i
		}
		picked, err = ah.PickAhead(picks, next, from)
	} else {
		picked, err = c.Pick(picks)
	}
	if err != nil {
		return nil, err
	}
	b.stats.Forwarded += int64(len(rows))
	// picks are in row order, one per row
	res := make([]StepResult, len(act))
	var mrows []Row
	var hidden []int // main row feeding each MTP row
	mlast := make([]int, len(act))
	for i, s := range act {
		r0 := first[i]
		res[i].Slot = s.id
		y := picked[r0]
		toks, hrows := []int{y}, []int{r0}
		lps := []*TokenLogprobs{picks[r0].LP}
		if s.hist != nil {
			s.hist.Add(y)
		}
		p := s.seqLen
		s.generated++
		s.seqLen++
		s.lastToken = s.next
		fin := b.finished(s, y)
		if s.draft >= 0 {
			res[i].Drafted = 1
			b.stats.DraftTokens++
			if y == s.draft {
				res[i].Accepted = 1
				b.stats.AcceptedTokens++
			}
			if y == s.draft && fin == FinishNone {
				y2 := picked[r0+1]
				toks = append(toks, y2)
				hrows = append(hrows, r0+1)
				lps = append(lps, picks[r0+1].LP)
				if s.hist != nil {
					s.hist.Add(y2)
				}
				s.generated++
				s.seqLen++
				s.lastToken = s.draft
				fin = b.finished(s, y2)
			}
		}
		res[i].Tokens = toks
		if s.params.Logprobs {
			for _, lp := range lps {
				res[i].Logprobs = append(res[i].Logprobs, *lp)
			}
		}
		b.stats.Tokens += int64(len(toks))
		s.next, s.draft = toks[len(toks)-1], -1
		if !ahead {
			if err := c.KeepHidden(s.id, hrows[len(hrows)-1]); err != nil {
				return nil, err
			}
		}
		s.hasHidden = true
		mlast[i] = -1
		if fin != FinishNone {
			s.finish, s.state = fin, slotFinished
			res[i].Finish = fin
			continue
		}
		if b.cfg.Options.MTP {
			for j, t := range toks {
				mrows = append(mrows, Row{Slot: s.id, Tok: t, Pos: p + j})
				hidden = append(hidden, hrows[j])
			}
			mlast[i] = len(mrows) - 1
		}
	}
	if len(mrows) == 0 {
		for _, s := range act {
			s.mtpLen = min(s.mtpLen, s.seqLen-1)
		}
		return res, nil
	}
	logits := make([]bool, len(mrows))
	var dpicks []Pick
	for i, j := range mlast {
		if j >= 0 {
			logits[j] = true
			dpicks = append(dpicks, Pick{Row: j, Pos: act[i].seqLen + 1}) // greedy
		}
	}
	if err := c.ForwardMTP(mrows, hidden, logits); err != nil {
		return nil, err
	}
	var drafts []int
	if ah != nil && ah.AheadOK(true) {
		// Everything the next step forwards is known here but the drafts:
		// each continuing slot's token at seqLen and its draft at
		// seqLen+1 (as step builds its rows), the drafts taken on the
		// device.
		var next []Row
		var from []int
		k := 0
		for i, s := range act {
			if mlast[i] < 0 {
				continue
			}
			next = append(next, Row{Slot: s.id, Tok: s.next, Pos: s.seqLen})
			from = append(from, -1)
			if s.seqLen+2 < b.cfg.MaxSeq {
				next = append(next, Row{Slot: s.id, Tok: -1, Pos: s.seqLen + 1})
				from = append(from, k)
			}
			k++
		}
		drafts, err = ah.PickAhead(dpicks, next, from)
	} else {
		drafts, err = c.Pick(dpicks)
	}
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
	return res, nil
}

// plainStep says whether a step may start the next step's forward before
// its tokens reach the host (Ahead): one row per slot (no MTP, no draft),
// every pick's row its own (logit adjustments and logprobs go with the
// pick: known once the last token is, and read back with the ids), and no
// slot ending at this step by length (a stop token, which only the
// pick shows, discards the forward started ahead).
func (b *Book) plainStep(act []*bookSlot, rows []Row, picks []Pick) bool {
	if b.cfg.Options.MTP || len(rows) != len(act) {
		return false
	}
	for i, s := range act {
		pk := picks[i]
		if pk.Row != i {
			return false
		}
		if (s.params.MaxTokens > 0 && s.generated+1 >= s.params.MaxTokens) || s.seqLen+2 >= b.cfg.MaxSeq {
			return false
		}
	}
	return true
}

// pick is the Pick for logits row row at position pos under the slot's
// params; extra >= 0 is a draft counted as generated before it.
func (s *bookSlot) pick(row, pos, extra int) Pick {
	pk := Pick{Row: row, Pos: pos, Params: s.params}
	if s.hist != nil {
		pk.Adjust = s.params.Adjustments(s.hist, extra)
	}
	if s.params.Logprobs {
		pk.LP, pk.TopLP = &TokenLogprobs{}, s.params.TopLogprobs
	}
	return pk
}

// PrefillLogprobs is the first token's logprobs of the last Prefill into
// slot, when its params asked for them (what vLLM returns with the
// prefill's one token).
func (b *Book) PrefillLogprobs(slot int) (TokenLogprobs, bool) {
	s, err := b.slot(slot)
	if err != nil || s.prefillLP == nil {
		return TokenLogprobs{}, false
	}
	return *s.prefillLP, true
}

// Release implements Engine. Device work started ahead may still write
// the slot's caches: it is waited for before the slot can be handed out.
func (b *Book) Release(slot int) {
	if s, err := b.slot(slot); err == nil {
		if d, ok := b.be.(Drainer); ok {
			d.Drain()
		}
		s.reset()
	}
}
