package gpu

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// A decode layer has chains of work that do not depend on each other: q_b
// and the query absorption beside the indexer's projection, scores and
// top-k; the shared expert beside the router and the routing. On one
// stream each short, latency-bound kernel leaves the HBM idle while it
// ramps up and drains; on two streams one chain's weights stream while the
// other chain's small kernels run. fork queues the calls that follow on a
// second stream (after everything queued so far), unfork returns to the
// main stream and join makes the main stream wait for the side's calls.
// Captured into a step's graph these are a fork and a join of its branches.
//
// Both forks are on by default (TILERT_GPU_SIDE=0 turns them off, =q
// keeps only the attention's, =moe only the shared expert's): with
// programmatic launches and the side GEMVs capped (below) the 1-slot step
// at 8192 took 2.764 ms against 2.902 on one stream (docs/measured/
// h200-2026-12-02-s11 call C; session 7, uncapped and plain: 2.928 against
// ~2.95, and 6.47 against ~6.36 at 4 slots). The emulator runs
// each side chain after the main chain it overlaps (sideLast): a chain
// that read what the other writes would then compute something else, so
// the emulated engine checks catch an ordering mistake that the GPU would
// only show as a rare race.
var sideQOn, sideShOn = sideMode(os.Getenv("TILERT_GPU_SIDE"))

// Two chains only overlap if the weight stream leaves the latency-bound
// chain room on the SMs: a tile GEMV's grid fills every SM (two blocks of
// 128 registers take all of an SM's registers), so the other stream's
// kernels wait for its last wave. TILERT_GPU_SIDE_CAP=B caps the side
// stream's tile GEMVs at B blocks per SM (kernels.SetTileCap: the same
// bits), leaving the rest of each SM to the main chain; 0 leaves them
// uncapped; q=B,sh=B sets each chain's. Unset: 1 where the kernels launch
// programmatically (PDL), else 0, except for a chain that the cap would
// starve (sideOpen). Measured on the H200 (docs/measured/h200-2026-12-02-s11
// calls B-C, DeepSeek-V3.2 dims, 9 MoE layers, 8192, 1 slot, p50): one
// stream 2.916 ms; side streams 2.895; with the cap 2.938; PDL 2.902; PDL +
// side streams 2.844; PDL + side streams + cap 2.764-2.769. A priority for
// the main chain's launches (CU_LAUNCH_ATTRIBUTE_PRIORITY) changed nothing
// (2.842 / 2.764 with it) and was dropped, but its graphs replayed every
// node at the launching stream's priority (prio.go: TILERT_GPU_MAIN_PRIO).
// Per chain (session 16, docs/measured/h200-2026-12-03-s16 call D, side
// launches plain): the q chain's cap is worth ~80 us a step on
// DeepSeek-V3.2 dims (2.697 capped against 2.783 uncapped at 8192) and
// costs ~100 us on GLM-5 dims (2.878 against 2.774; 3.027 against 2.930 at
// 131072); the shared expert's cap changes nothing measurable on either.
//
// The side stream's kernels launch plainly by default (kernels.Set.SetPlain
// between fork and unfork; TILERT_GPU_SIDE_PDL=1 launches them
// programmatically as on the main stream). A programmatic launch makes its
// grid resident while the kernel before it runs, and the waiting blocks
// keep their registers: the capped shared expert's down GEMV, launched so
// behind its gate/up, held the second half of every SM's registers for the
// whole of the gate/up, and the router and the routing on the main stream
// found no room (~11 us a layer each in the graph, ~3-4 us timed alone).
// Measured on the H200 (docs/measured/h200-2026-12-02-s13 call A, 9 MoE
// layers, 8192, 1 slot, p50): DeepSeek-V3.2 dims 2.761 / 2.760 ms
// programmatic, 2.702 / 2.701 plain; GLM-5 dims 2.954 against 2.915.
var sidePlainOn = os.Getenv("TILERT_GPU_SIDE_PDL") != "1"

// TILERT_GPU_SIDE_EDGE=1 (session 64, opt-in): a one-row step's q chain
// forks on a programmatic edge. Its first launch, if it waits for its
// predecessor (kernels.Set.SetEdgeNext), depends on the grouped input GEMV
// through a programmatic graph edge (cuda.Ctx.ProgrammaticDeps) and may
// become resident while the GEMV's last blocks run, as the wq_b GEMV behind
// it on the main stream does; its later launches keep the side stream's
// plain launches. Session 64 call A's block clocks: the q chain's launches
// made programmatic (its removed TILERT_GPU_SIDE_PDL=q) did not move
// qb_absorb (resident 16.0 us into the layer against 16.4, its launch 15.7
// against 15.9): a captured edge through an event stays a full one
// whatever the launch's attribute.
var sideEdgeOn = os.Getenv("TILERT_GPU_SIDE_EDGE") == "1"

// sideChain names a fork's chain: each has its own tile cap, since what
// a capped side GEMV costs depends on whether its chain or the main one is
// the longer.
type sideChain int

const (
	chainQ  sideChain = iota // q_b and the query absorption beside the indexer's chain
	chainSh                  // the shared expert beside the router and the routing
	nChains
	// chainQLate is the q chain forked after the indexer's scores (qLate),
	// beside the top-k alone. TILERT_GPU_SIDE_CAP's q sets it as chainQ's;
	// its default differs (sideCapFor).
	chainQLate = nChains
)

var chainNames = [nChains]string{chainQ: "q", chainSh: "sh"}

// openSet is each chain's default tile cap in a one-row step (sideOpen;
// chainQLate among them): 1, the rule, where the cap does not starve it.
type openSet [nChains + 1]int

var (
	// sideCapSet is TILERT_GPU_SIDE_CAP read once (-1: unset, the
	// default); sideCapErr says why a value was refused (at backend
	// creation, so that a mistyped cap is not silently the default).
	sideCapSet, sideCapErr = parseSideCap(os.Getenv("TILERT_GPU_SIDE_CAP"))
	// sideCapTest, where >= 0, overrides the environment (tests).
	sideCapTest = [nChains]int{-1, -1}
)

// parseSideCap reads TILERT_GPU_SIDE_CAP: "B" caps both chains' tile GEMVs
// at B blocks per SM, "q=B,sh=B" (either part alone) each chain; 0 is
// uncapped, a chain not named keeps its default (-1).
func parseSideCap(v string) ([nChains]int, error) {
	caps := [nChains]int{-1, -1}
	if v == "" {
		return caps, nil
	}
	bad := func(why string) ([nChains]int, error) {
		return [nChains]int{-1, -1}, errors.WithHint(errors.Newf("TILERT_GPU_SIDE_CAP=%q: %s", v, why),
			"set it to a block count per SM for both side chains (0: uncapped), or per chain as q=B,sh=B (q: q_b and the query absorption; sh: the shared expert), or unset it for the default")
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return bad("a negative block count")
		}
		return [nChains]int{n, n}, nil
	}
	for _, part := range strings.Split(v, ",") {
		name, num, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || n < 0 {
			return bad(fmt.Sprintf("%q is not chain=count", part))
		}
		i := slices.Index(chainNames[:], name)
		if i < 0 {
			return bad(fmt.Sprintf("no side chain %q (q, sh)", name))
		}
		caps[i] = n
	}
	return caps, nil
}

// sideCap is the blocks per SM of a side chain's tile GEMVs in a step of
// rows rows (0: as many as the grid has), from TILERT_GPU_SIDE_CAP or,
// unset, from whether the kernels launch programmatically and the cap
// would starve the chain. The open chains (sideOpen) were measured at one
// row; a step of several rows launches q_b on another kernel and keeps
// the cap, as measured before (session 14's 4-slot rows).
// The open chains are the step's: prio.go qUncapped.
func (b *cudaDevice) sideCap(ch sideChain, rows int) int {
	return sideCapFor(ch, b.k.PDL(), sideOpen(b.qbVariant, qUncapped(b.prio, b.raised)), rows)
}

func sideCapFor(ch sideChain, pdl bool, open openSet, rows int) int {
	set := ch
	if ch == chainQLate {
		set = chainQ
	}
	switch {
	case sideCapTest[set] >= 0:
		return sideCapTest[set]
	case sideCapSet[set] >= 0:
		return sideCapSet[set]
	case !pdl:
		return 0
	case rows == 1:
		return open[ch]
	}
	return 1
}

// sidePin gives a CUDA runner q_b's shape, the q chain's big GEMV. A
// sharded rank's runner (wrapped, shard.go) gets none and keeps the cap on
// both chains: the rule was measured on whole models only.
func sidePin(r runner, cfg *model.Config) {
	if cr, ok := r.(*cudaRunner); ok {
		cr.qb = [2]int{cfg.NumHeads * cfg.QKHeadDim(), cfg.QLoraRank}
	}
}

// sideOpen says which side chains a cap of one block per SM would starve,
// from qbVariant (kernels.Set.TileVariantOf q_b's shape; "" without one):
// the q chain where q_b's one-row launch is an _o4 one, shaped to stream
// with four blocks of 64 registers an SM, so that one block keeps a
// quarter of its loads in flight and the chain outlasts the indexer's
// beside it. GLM-5's q_b (16384 x 2048) is, DeepSeek-V3.2's (24576 x 1536,
// _d16: two blocks an SM, so half) is not: the measured split above. The
// shared expert stays capped (neutral on both). The q chain forked after
// the indexer's scores is uncapped on both models: beside the top-k alone
// the scores no longer share the SMs, and a capped q_b would outlast the
// top-k (session 17: DeepSeek-V3.2 dims at 131072, 2.884 ms capped against
// 2.837-2.841 uncapped; GLM-5 dims 3.021 against 2.888), except that a
// _d16 q_b there is capped at two blocks an SM, its residency anyway: 264
// looping blocks instead of 768 queued ones, measured in two sessions
// (DeepSeek-V3.2 dims at 131072, 1 slot, p50: session 27 2.775 / 2.777 ms
// against 2.783 / 2.785; session 28 2.779 / 2.770 against 2.784 / 2.786;
// GLM-5's _o4 q_b so capped lost, 2.836 against 2.829). A runner without
// q_b's shape (a sharded rank) keeps every cap: measured on whole models.
//
// raised (TILERT_GPU_MAIN_PRIO=q or auto resolved, prio.go qUncapped: the
// q chain's launches the only ones below the main chain's priority)
// uncaps the q chain at q_a: the priority stands in for the cap (session
// 28: DeepSeek-V3.2 dims at 8192 2.632 / 2.633 ms against 2.658 / 2.663).
func sideOpen(qbVariant string, raised bool) openSet {
	open := openSet{1, 1, 1}
	if qbVariant == "_o4" || raised {
		open[chainQ] = 0
	}
	switch qbVariant {
	case "":
	case "_d16":
		open[chainQLate] = 2
	default:
		open[chainQLate] = 0
	}
	return open
}

// Where the q chain forks (TILERT_GPU_SIDE_Q_AT): "qa" as soon as q_a is
// normed, beside the whole of the indexer's chain (its wq_b, the query
// preparation, the scores and the top-k); "topk" after the indexer's
// scores launch, beside the top-k alone, where a row's length bucket is
// over kernels.TopKRadixOneMaxT keys (the long rows whose scores are on the
// step's critical path); "topk-all" after the scores at every length over
// index_topk; "scores" and "scores-all" the same, but forked right before
// the scores launch (the q chain beside the scores and the top-k, uncapped
// unless TILERT_GPU_SIDE_CAP sets q: at 131072 the front ends with
// absorb_q after q_b, which the fork after the scores starts only when they
// end, session 25's traces). Unset ("auto", qFork): at q_a everywhere
// (since session 42). Until then a one-row step took "scores"'s rule where
// q_b's one-row launch was not _o4 (DeepSeek-V3.2's _d16 q_b); since the
// indexer's long scores run on indexer_scores_wgh (session 40) the fork at
// q_a is the faster there too: H200, session 42 (docs/measured/
// h200-2026-12-05-s42 calls C and D), DeepSeek-V3.2 dims at 131072, 9 MoE
// layers, 1 slot, A/B/A/B p50: 2.741 / 2.738 ms before the scores against
// 2.708 / 2.709 at q_a; with TILERT_GPU_QA_NORM=late 2.716 / 2.712 against
// 2.707 / 2.703; at 8192 (already at q_a) unchanged. Why late, once: at
// 131072 keys the scores run at 33% of the copy rate, bound by their
// instructions, and timed alone take ~13-17 us
// against ~22 inside the step, where q_b holds SMs beside them; the top-k
// is a latency chain of few blocks that leaves the SMs to a weight stream. Measured (session 17,
// docs/measured/h200-2026-12-03-s17, 9 MoE layers, 1 slot, p50): 131072
// DeepSeek-V3.2 dims 2.895-2.898 ms at q_a, 2.837-2.841 late (uncapped);
// GLM-5 dims 2.919-2.922 against 2.888-2.894; GLM-5 at 8192 2.755-2.760
// against 2.738-2.745; DeepSeek-V3.2 at 8192 late is slower (2.685 against
// 2.712 uncapped, 2.775 capped), so its rows within 32768 keys keep q_a.
// Since the mark_lw top-k (session 26) GLM-5's q chain no longer gains from
// the late fork: session 28 (docs/measured/h200-2026-12-04-s28 call C,
// A/B/A/B) 2.795 / 2.802 ms at q_a against 2.821 / 2.819 before the scores
// at 131072, 2.696 / 2.692 against 2.696 / 2.695 after them at 8192.
var sideQAt, sideQAtErr = parseSideQAt(os.Getenv("TILERT_GPU_SIDE_Q_AT"))

func parseSideQAt(v string) (string, error) {
	switch v {
	case "", "auto":
		return "", nil
	case "qa", "topk", "topk-all", "scores", "scores-all":
		return v, nil
	}
	return "", errors.WithHint(errors.Newf("TILERT_GPU_SIDE_Q_AT=%q: no such fork point", v),
		"set it to auto (the default), qa (beside the whole indexer chain), topk (beside the top-k where rows are over 32768 keys), topk-all (beside the top-k at every length), scores or scores-all (as topk and topk-all, forked before the scores launch)")
}

// qLate says whether this layer's q chain waits for the indexer's scores
// launch (qPending) and, if so, whether it forks right before that launch
// (before) rather than right after it: the serving indexer scores some row
// (longer than index_topk); qFork decides.
func (f *fwd) qLate() (late, before bool) {
	if !f.e.idxQ() || !f.scored() {
		return false, false
	}
	return qFork(sideQAt, f.long())
}

func (f *fwd) maxLen() int {
	n := 0
	for _, g := range f.groups {
		n = max(n, g.maxLen)
	}
	return n
}

// scored says whether the serving indexer scores some row of the step:
// one longer than index_topk.
func (f *fwd) scored() bool { return f.maxLen() > f.e.cfg.IndexTopK }

// long says whether some row's length bucket is over
// kernels.TopKRadixOneMaxT keys: its top-k on the mark blocks.
func (f *fwd) long() bool {
	return lenBucket(f.maxLen(), f.e.ws.ldScores) > kernels.TopKRadixOneMaxT
}

// qFork is qLate's rule for a layer whose indexer scores rows past
// index_topk: at (TILERT_GPU_SIDE_Q_AT, "" for auto) and long (some row
// over kernels.TopKRadixOneMaxT keys, its top-k on the mark blocks). Auto
// and qa fork at q_a; the late forks are kept as switches to measure
// against (sideQAt's comment says what each measured).
func qFork(at string, long bool) (late, before bool) {
	switch at {
	case "topk-all":
		return true, false
	case "scores-all":
		return true, true
	case "topk":
		return long, false
	case "scores":
		return long, long
	}
	return false, false
}

// qBeforeScores forks the q chain that qLate held back right before the
// first scores launch, where qLate said so (f.qBefore); qAfterScores then
// finds nothing pending.
func (f *fwd) qBeforeScores(lw *dlayer) {
	if f.qBefore {
		f.qAfterScores(lw)
	}
}

// qAfterScores forks the q chain that qLate held back, right after the
// first scores launch.
func (f *fwd) qAfterScores(lw *dlayer) {
	if f.qPending {
		f.qPending, f.qBefore = false, false
		f.qBeside(lw, chainQLate)
	}
}

func sideMode(v string) (q, sh bool) {
	switch v {
	case "", "1":
		return true, true
	case "q":
		return true, false
	case "moe":
		return false, true
	}
	return false, false
}

// sideStream is a runner's second stream and the events that order it
// against the main one (created on first use, on the device thread).
type sideStream struct {
	s          cuda.Stream
	fork, join cuda.Event
	main       cuda.Stream // the stream unfork returns to
	active     bool        // calls go to s
	pending    bool        // s has calls the main stream has not waited for
	cap        int         // the tile cap fork replaced (sideCap)
	plain      bool        // the plain-launch hold fork replaced (sidePlainOn)
	prio       int         // the launch priority fork replaced (prio.go)
}

func (sd *sideStream) ensure(c *cuda.Ctx) error {
	if sd.s != 0 {
		return nil
	}
	s, err := c.NewStream()
	if err != nil {
		return err
	}
	f, err := c.NewSyncEvent()
	if err != nil {
		return errors.CombineErrors(err, c.DestroyStream(s))
	}
	j, err := c.NewSyncEvent()
	if err != nil {
		return errors.CombineErrors(err, errors.CombineErrors(c.DestroyEvent(f), c.DestroyStream(s)))
	}
	sd.s, sd.fork, sd.join = s, f, j
	return nil
}

func (sd *sideStream) destroy(c *cuda.Ctx) error {
	if sd.s == 0 {
		return nil
	}
	err := errors.CombineErrors(c.DestroyEvent(sd.fork), c.DestroyEvent(sd.join))
	err = errors.CombineErrors(err, c.DestroyStream(sd.s))
	*sd = sideStream{}
	return err
}

// forked is the side stream a fork made active (nil: none).
func (b *cudaDevice) forked() *sideStream {
	if b.side != nil && b.side.active {
		return b.side
	}
	return nil
}

func (b *cudaDevice) fork(ch sideChain, rows int) error {
	sd := b.side
	if sd == nil {
		return nil // no second stream (a sharded phase): the calls stay in order
	}
	if b.forked() != nil {
		return errors.AssertionFailedf("gpu: fork inside a fork")
	}
	if err := sd.ensure(b.c); err != nil {
		return err
	}
	if err := b.c.Record(sd.fork, b.s); err != nil {
		return err
	}
	if err := b.c.WaitEvent(sd.s, sd.fork); err != nil {
		return err
	}
	sd.main, b.s, sd.active = b.s, sd.s, true
	sd.cap = b.k.SetTileCap(b.sideCap(ch, rows))
	sd.plain = b.k.SetPlain(sidePlainOn || b.k.Plain())
	if sideEdgeOn && rows == 1 && (ch == chainQ || ch == chainQLate) {
		b.k.SetEdgeNext(true)
	}
	sd.prio = b.k.SetPriority(b.launchPrio(b.raised && chainRaised(b.prio, ch)))
	return nil
}

func (b *cudaDevice) unfork() error {
	sd := b.forked()
	if sd == nil {
		return nil
	}
	b.s, sd.active = sd.main, false
	b.k.SetEdgeNext(false) // a fork whose chain launched nothing that waits
	b.k.SetTileCap(sd.cap)
	b.k.SetPlain(sd.plain)
	b.k.SetPriority(sd.prio)
	if err := b.c.Record(sd.join, sd.s); err != nil {
		return err
	}
	sd.pending = true
	return nil
}

func (b *cudaDevice) join() error {
	if err := b.unfork(); err != nil {
		return err
	}
	if sd := b.side; sd != nil && sd.pending {
		sd.pending = false
		return b.c.WaitEvent(b.s, sd.join)
	}
	return nil
}

// settle ends a run with the main stream behind any side work (an error
// between fork and join leaves the side open).
func (b *cudaDevice) settle() error {
	if sd := b.side; sd != nil && (sd.active || sd.pending) {
		return b.join()
	}
	return nil
}

// The emulator runs in call order; graphDevice reorders its side chains
// (sideLast).
func (m *emuDevice) fork(sideChain, int) error { return nil }
func (m *emuDevice) unfork() error             { return nil }
func (m *emuDevice) join() error               { return nil }

func (gb *graphDevice) fork(ch sideChain, rows int) error {
	return gb.rec("fork", 0, func(b device) error { return b.fork(ch, rows) })
}

func (gb *graphDevice) unfork() error {
	return gb.rec("unfork", 0, func(b device) error { return b.unfork() })
}

func (gb *graphDevice) join() error {
	return gb.rec("join", 0, func(b device) error { return b.join() })
}

// ctl says whether op is a stream fork, unfork or join, or a launch
// priority's change (prio.go): no device work of its own (timing calls
// alone skips it).
func (op gop) ctl() bool {
	switch op.name {
	case "fork", "unfork", "join", "raise", "lower":
		return true
	}
	return false
}

// sideLast returns run with every side chain (the calls between a fork
// and its unfork) moved to its join, after the main chain it overlaps: the
// order the emulator runs. A fork without its unfork, or an unfork or join
// without a fork, is an error.
func sideLast(run []gop) ([]gop, error) {
	out := make([]gop, 0, len(run))
	var side []gop
	state := 0 // 0 main, 1 in a side chain, 2 side chain waiting for its join
	for _, op := range run {
		switch op.name {
		case "fork":
			if state != 0 {
				return nil, errors.AssertionFailedf("gpu: fork inside a fork")
			}
			state, side = 1, side[:0]
			continue
		case "unfork":
			if state != 1 {
				return nil, errors.AssertionFailedf("gpu: unfork without a fork")
			}
			state = 2
			continue
		case "join":
			if state != 2 {
				return nil, errors.AssertionFailedf("gpu: join without a fork and unfork")
			}
			out, state = append(out, side...), 0
			continue
		}
		if state == 1 {
			side = append(side, op)
		} else {
			out = append(out, op)
		}
	}
	if state != 0 {
		return nil, errors.AssertionFailedf("gpu: a side chain is not joined at the end of a run")
	}
	return out, nil
}
