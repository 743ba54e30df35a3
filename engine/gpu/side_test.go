package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

func TestSideLast(t *testing.T) {
	ops := func(names string) []gop {
		var run []gop
		for _, n := range strings.Fields(names) {
			run = append(run, gop{name: n})
		}
		return run
	}
	names := func(run []gop) string {
		var s []string
		for _, op := range run {
			s = append(s, op.name)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct{ in, want, err string }{
		{in: "a b c", want: "a b c"},
		{in: "a fork s1 s2 unfork m1 m2 join c", want: "a m1 m2 s1 s2 c"},
		{in: "fork s unfork join", want: "s"},
		{in: "fork s1 unfork m1 join fork s2 unfork m2 join x", want: "m1 s1 m2 s2 x"},
		{in: "a fork s1 fork", err: "fork inside a fork"},
		{in: "a unfork", err: "unfork without a fork"},
		{in: "fork s join", err: "join without a fork and unfork"},
		{in: "fork s unfork m", err: "not joined"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := sideLast(ops(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("sideLast(%q): error %v, want one saying %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if names(got) != tc.want {
				t.Errorf("sideLast(%q) = %q, want %q", tc.in, names(got), tc.want)
			}
		})
	}
}

// TestEmuSideOrderShowsAHazard: a main-stream call that reads what the
// side chain writes, without a join between them, computes something else
// on the emulator than in call order: the engine checks that run with the
// side stream on would catch a missing join.
func TestEmuSideOrderShowsAHazard(t *testing.T) {
	m := newEmu()
	gs := newGraphs()
	gs.on = true
	x, err := m.alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	y, _ := m.alloc(16)
	one := make([]byte, 16)
	for i := 0; i < 4; i++ {
		binary.LittleEndian.PutUint32(one[4*i:], math.Float32bits(1))
	}
	if err := m.upload(x, one); err != nil {
		t.Fatal(err)
	}
	gb := &graphDevice{device: m, gs: gs, g: emuGrapher{}, mark: time.Now()}
	for _, err := range []error{gb.fork(chainQ, 1), gb.scale(x, 2, 4), gb.unfork(), gb.copyDD(y, x, 16), gb.join(), gb.flush()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 16)
	if err := m.download(got, y); err != nil {
		t.Fatal(err)
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(got)); v != 1 {
		t.Errorf("the copy read %v: the side chain's scale ran before the main chain (want 1, the value before it)", v)
	}
}

// TILERT_GPU_SIDE=1: q_b with the query absorption, and the shared expert,
// run on a second stream beside the indexer's chain and the router; the
// tokens must be those of one stream (on the GPU the same kernels give the
// same bits; on the emulator each side chain runs after the chain it
// overlaps, so a read of the other chain's output would show). Three slots
// (one within index_topk, two past it) and one, with and without MTP.
func TestEmuSideStreamSameTokens(t *testing.T) { testSideStream(t, onEmu) }
func TestGPUSideStreamSameTokens(t *testing.T) { testSideStream(t, onGPU) }

func testSideStream(t *testing.T, kind deviceKind) {
	if kind == onGPU {
		gpuDevice(t)
	}
	defer func(q, sh, pl, ed bool, cp [nChains]int, at string, pr prioMode) {
		sideQOn, sideShOn, sidePlainOn, sideEdgeOn, sideCapTest, sideQAt, mainPrio = q, sh, pl, ed, cp, at, pr
	}(sideQOn, sideShOn, sidePlainOn, sideEdgeOn, sideCapTest, sideQAt, mainPrio)
	// side streams off, on, and (GPU: scheduling only, the same bits) on
	// with the side GEMVs uncapped and capped at a block per SM
	// (TILERT_GPU_SIDE_CAP)
	// and capped with its launches plain (the default; TILERT_GPU_SIDE_PDL=1
	// launches them programmatically), and with the q chain forked on a
	// programmatic edge (TILERT_GPU_SIDE_EDGE=1: in one-row steps' graphs
	// some edge must have been turned)
	// and each chain capped alone, and the q chain forked beside the
	// indexer's top-k alone (TILERT_GPU_SIDE_Q_AT=topk-all: the tiny
	// presets' rows are far under topk's 32768 keys), and before the
	// scores (scores-all); and (GPU) with the main stream at the
	// greatest priority (TILERT_GPU_MAIN_PRIO=1), capped as by default and
	// uncapped, and with the shared expert's side stream raised too (=q)
	type sideCfg struct {
		on, plain bool
		edge      bool // TILERT_GPU_SIDE_EDGE
		cap       [nChains]int
		qAt       string
		prio      prioMode
	}
	dflt := [nChains]int{-1, -1}
	cfgs := []sideCfg{{cap: dflt}, {on: true, cap: dflt}, {on: true, cap: dflt, qAt: "topk-all"},
		{on: true, cap: dflt, qAt: "scores-all"}}
	if kind == onGPU {
		cfgs = []sideCfg{{cap: dflt}, {on: true, cap: [nChains]int{0, 0}}, {on: true, cap: [nChains]int{1, 1}},
			{on: true, plain: true, cap: [nChains]int{1, 1}}, {on: true, plain: true, cap: [nChains]int{0, 1}},
			{on: true, plain: true, cap: [nChains]int{1, 0}}, {on: true, plain: true, cap: dflt, qAt: "topk-all"},
			{on: true, plain: true, cap: dflt, qAt: "scores-all"},
			{on: true, plain: true, cap: dflt, prio: prioMain}, {on: true, plain: true, cap: [nChains]int{0, 0}, prio: prioMain},
			{on: true, plain: true, cap: dflt, prio: prioQLow}, {on: true, plain: true, cap: dflt, prio: prioAuto},
			{on: true, plain: true, edge: true, cap: dflt}, {on: true, plain: true, edge: true, cap: dflt, qAt: "topk-all"}}
	}
	for _, pr := range enginetest.Presets {
		for _, mtp := range []bool{false, true} {
			for _, slots := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s mtp=%v slots=%d", pr, mtp, slots), func(t *testing.T) {
					w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
					vocab := w.Config().VocabSize
					tk := w.Config().IndexTopK
					prompt := enginetest.Prompt(tk+30, vocab, 11)
					prompts := [][]int{prompt[:tk-10], prompt, prompt[:tk+7]}[:slots]
					if slots == 1 {
						prompts = [][]int{prompt}
					}
					n := 10
					opts := engine.Options{MTP: mtp, MaxSeqLen: len(prompt) + n + 16, Slots: slots}
					batch := make([][][]int, len(cfgs))
					forks := make([]int, len(cfgs))
					sideRoutes := make([]int, len(cfgs)) // routings queued on the side stream (none: the shared expert is the side chain)
					for k, cf := range cfgs {
						sideQOn, sideShOn, sidePlainOn, sideCapTest, sideQAt, mainPrio = cf.on, cf.on, cf.plain, cf.cap, cf.qAt, cf.prio
						sideEdgeOn = cf.edge
						e0 := kernels.EdgesTurned.Load()
						e := newTestEngine(t, kind, src, opts)
						if cr, ok := e.m.r.(*cudaRunner); kind == onGPU {
							want := prioOff
							if ok {
								want = prioFor(cf.prio, cr.qbVariant)
							}
							if !ok || cr.prio != want || cr.stream != 0 {
								t.Fatalf("%+v: the GPU runner (%T) does not hold the launch priority mode asked for (%v)", cf, e.m.r, want)
							}
						}
						e.m.graphs.keep = [][]gop{}
						batch[k] = generateBatch(t, e, prompts, engine.Params{}, n)
						// Edges turned: none without the switch, some in one
						// slot's one-row steps (MTP's verify steps have two rows).
						turned := kernels.EdgesTurned.Load() - e0
						if kind == onGPU && (!cf.edge && turned > 0 || cf.edge && slots == 1 && !mtp && turned == 0) {
							t.Errorf("%+v: %d captured edges made programmatic", cf, turned)
						}
						afterScores := 0  // forks right after a scores launch
						beforeScores := 0 // forks whose side chain the scores launch follows
						for _, run := range e.m.graphs.keep {
							side := false
							for i, op := range run {
								switch op.name {
								case "fork":
									forks[k]++
									side = true
									if i > 0 && run[i-1].name == "indexerScoresQ" {
										afterScores++
									}
									for j := i + 1; j+1 < len(run); j++ {
										if run[j].name == "unfork" || run[j].name == "join" {
											if run[j+1].name == "indexerScoresQ" {
												beforeScores++
											}
											break
										}
									}
								case "unfork", "join":
									side = false
								case "moeRoute":
									if side {
										sideRoutes[k]++
									}
								}
							}
						}
						if sideRoutes[k] > 0 {
							t.Errorf("%+v: %d routings on the side stream", cf, sideRoutes[k])
						}
						// Late forks: every step with topk-all; none with auto
						// (at q_a).
						late := cf.qAt == "topk-all"
						if late && afterScores == 0 || !late && afterScores > 0 {
							t.Errorf("%+v: %d forks right after a scores launch", cf, afterScores)
						}
						// scores-all: every step forks right before its scores
						// launch (the side chain recorded, then the scores).
						if (cf.qAt == "scores-all") != (beforeScores > 0) {
							t.Errorf("%+v: %d forks right before a scores launch", cf, beforeScores)
						}
					}
					for k := 1; k < len(cfgs); k++ {
						for s := range batch[0] {
							if i := enginetest.FirstDiff(batch[k][s], batch[0][s]); i >= 0 {
								t.Errorf("slot %d: tokens with the side stream (%+v) differ at %d:\n got %v\nwant %v", s, cfgs[k], i, batch[k][s], batch[0][s])
							}
						}
						if forks[k] == 0 {
							t.Errorf("no fork with the side stream on (%+v)", cfgs[k])
						}
					}
					t.Logf("%s forks: %v (configurations %+v)", kind, forks, cfgs)
					if forks[0] != 0 {
						t.Errorf("forks: %d with the side stream off (want 0)", forks[0])
					}
				})
			}
		}
	}
}

// The side stream's tile cap holds between a fork and its unfork only: a
// cap left behind would slow every main-stream GEMV after it.
func TestGPUSideCapScoped(t *testing.T) {
	dev := gpuDevice(t)
	defer func(cp [nChains]int, pl bool) { sideCapTest, sidePlainOn = cp, pl }(sideCapTest, sidePlainOn)
	r := &cudaRunner{dev: dev, info: dev.Info}
	defer func() {
		if err := r.close(); err != nil {
			t.Error(err)
		}
	}()
	for i, want := range []int{0, 1, 3, 2} {
		ch := sideChain(i % int(nChains))
		sideCapTest, sidePlainOn = [nChains]int{-1, -1}, want == 1 // and the side stream's plain-launch hold
		sideCapTest[ch] = want
		err := r.run(func(b device) error {
			cb := b.(*cudaDevice)
			if got := cb.k.TileCap(); got != 0 {
				return errors.Newf("cap %d before the fork, want 0", got)
			}
			if cb.k.Plain() {
				return errors.New("plain launches held before the fork")
			}
			if err := cb.fork(ch, 1); err != nil {
				return err
			}
			if got := cb.k.TileCap(); got != want {
				return errors.Newf("cap %d on the side stream, want %d", got, want)
			}
			if cb.k.Plain() != sidePlainOn {
				return errors.Newf("plain launches held on the side stream: %v, want %v", cb.k.Plain(), sidePlainOn)
			}
			if err := cb.unfork(); err != nil {
				return err
			}
			if got := cb.k.TileCap(); got != 0 {
				return errors.Newf("cap %d after the unfork, want 0", got)
			}
			if cb.k.Plain() {
				return errors.New("plain launches still held after the unfork")
			}
			return cb.join()
		})
		if err != nil {
			t.Errorf("side cap %d on chain %s: %v", want, chainNames[ch], err)
		}
	}
}

// The default cap per chain (sideOpen): in a one-row step a q chain whose
// q_b launches _o4 (GLM-5's shape) stays uncapped, one that launches _d16
// (DeepSeek-V3.2's) is capped at a block per SM, and the shared expert is
// capped either way; steps of several rows keep every cap.
func TestGPUSideCapDefault(t *testing.T) {
	dev := gpuDevice(t)
	if sideCapSet != [nChains]int{-1, -1} || !enginePDL {
		t.Skip("TILERT_GPU_SIDE_CAP or TILERT_GPU_PDL=0 set: the defaults are not in play")
	}
	defer func(cp [nChains]int) { sideCapTest = cp }(sideCapTest)
	sideCapTest = [nChains]int{-1, -1}
	for _, c := range []struct {
		name string
		qb   [2]int
		want [nChains]int
	}{
		{"glm-5", [2]int{16384, 2048}, [nChains]int{0, 1}},
		{"deepseek-v3.2", [2]int{24576, 1536}, [nChains]int{1, 1}},
		{"no q_b", [2]int{}, [nChains]int{1, 1}},
	} {
		r := &cudaRunner{dev: dev, info: dev.Info, qb: c.qb}
		err := r.run(func(b device) error {
			cb := b.(*cudaDevice)
			for _, rows := range []int{1, 4} {
				for ch := range nChains {
					if err := cb.fork(ch, rows); err != nil {
						return err
					}
					want := c.want[ch]
					if rows > 1 {
						want = 1
					}
					if got := cb.k.TileCap(); got != want {
						return errors.Newf("chain %s, %d rows: cap %d, want %d", chainNames[ch], rows, got, want)
					}
					if err := cb.unfork(); err != nil {
						return err
					}
				}
			}
			return cb.join()
		})
		if err != nil {
			t.Errorf("%s q_b %v: %v", c.name, c.qb, err)
		}
		if err := r.close(); err != nil {
			t.Error(err)
		}
	}
}

func TestSideCapFor(t *testing.T) {
	defer func(cp, set [nChains]int) { sideCapTest, sideCapSet = cp, set }(sideCapTest, sideCapSet)
	sideCapTest, sideCapSet = [nChains]int{-1, -1}, [nChains]int{-1, -1}
	for _, c := range []struct {
		pdl     bool
		variant string // q_b's one-row launch
		rows    int
		set     [nChains]int
		want    [nChains]int
		late    int // the q chain forked after the scores (chainQLate)
	}{
		{true, "_o4", 1, [nChains]int{-1, -1}, [nChains]int{0, 1}, 0},  // GLM-5
		{true, "_o4", 4, [nChains]int{-1, -1}, [nChains]int{1, 1}, 1},  // GLM-5, 4 slots: capped as measured before
		{true, "_d16", 1, [nChains]int{-1, -1}, [nChains]int{1, 1}, 2}, // DeepSeek-V3.2: late, at its residency (two an SM)
		{true, "_d16", 2, [nChains]int{-1, -1}, [nChains]int{1, 1}, 1},
		{true, "", 1, [nChains]int{-1, -1}, [nChains]int{1, 1}, 1}, // no q_b (a sharded rank): every cap
		{false, "_o4", 1, [nChains]int{-1, -1}, [nChains]int{0, 0}, 0},
		{false, "_d16", 4, [nChains]int{-1, -1}, [nChains]int{0, 0}, 0},
		{true, "_o4", 1, [nChains]int{2, -1}, [nChains]int{2, 1}, 2}, // TILERT_GPU_SIDE_CAP=q=2: wherever q forks
		{true, "_o4", 4, [nChains]int{0, -1}, [nChains]int{0, 1}, 0}, // =q=0 at 4 slots
		{true, "_d16", 1, [nChains]int{1, 0}, [nChains]int{1, 0}, 1}, // =q=1,sh=0: the late chain capped too
		{false, "_d16", 1, [nChains]int{-1, 3}, [nChains]int{0, 3}, 0},
	} {
		sideCapSet = c.set
		open := sideOpen(c.variant, false)
		for ch := range nChains {
			if got := sideCapFor(ch, c.pdl, open, c.rows); got != c.want[ch] {
				t.Errorf("pdl %v, q_b %q, %d rows, set %v: chain %s capped at %d, want %d", c.pdl, c.variant, c.rows, c.set, chainNames[ch], got, c.want[ch])
			}
		}
		if got := sideCapFor(chainQLate, c.pdl, open, c.rows); got != c.late {
			t.Errorf("pdl %v, q_b %q, %d rows, set %v: the late q chain capped at %d, want %d", c.pdl, c.variant, c.rows, c.set, got, c.late)
		}
	}
	// With the q chain's stream the only one at the least priority
	// (TILERT_GPU_MAIN_PRIO=q) its one-row fork at q_a is uncapped; the
	// rest as without.
	sideCapSet = [nChains]int{-1, -1}
	for _, v := range []string{"_d16", "_o4", ""} {
		open, plain := sideOpen(v, true), sideOpen(v, false)
		for _, rows := range []int{1, 4} {
			for ch := range nChains + 1 {
				want := sideCapFor(ch, true, plain, rows)
				if ch == chainQ && rows == 1 {
					want = 0
				}
				if got := sideCapFor(ch, true, open, rows); got != want {
					t.Errorf("raised, q_b %q, %d rows: chain %d capped at %d, want %d", v, rows, ch, got, want)
				}
			}
		}
	}
}

// A step that auto leaves unraised keeps the q chain's cap of the
// priorities off (DeepSeek-V3.2's _d16 q_b: one block an SM at one row);
// a raised one takes the runner's open set; GLM-5's _o4 q chain is
// uncapped either way.
func TestStepQCap(t *testing.T) {
	for _, c := range []struct {
		variant string
		raised  bool
		want    int // the one-row q chain's cap
	}{
		{"_d16", true, 0}, {"_d16", false, 1}, {"_o4", true, 0}, {"_o4", false, 0}, {"", false, 1},
	} {
		open := sideOpen(c.variant, qUncapped(prioFor(prioAuto, c.variant), c.raised))
		if got := sideCapFor(chainQ, true, open, 1); got != c.want {
			t.Errorf("q_b %q, raised %v: the q chain capped at %d, want %d", c.variant, c.raised, got, c.want)
		}
	}
}

func TestParseSideQAt(t *testing.T) {
	for _, c := range []struct{ in, want, bad string }{
		{"", "", ""}, {"auto", "", ""}, {"qa", "qa", ""}, {"topk", "topk", ""}, {"topk-all", "topk-all", ""},
		{"scores", "scores", ""}, {"scores-all", "scores-all", ""},
		{"score", "", "no such fork point"}, {"TOPK", "", "no such fork point"},
	} {
		got, err := parseSideQAt(c.in)
		switch {
		case c.bad == "" && (err != nil || got != c.want):
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad) || len(errors.GetAllHints(err)) == 0):
			t.Errorf("%q: error %v, want one saying %q with a hint", c.in, err, c.bad)
		}
	}
}

// qFork's rule (qLate) where the indexer scores rows past index_topk.
func TestQFork(t *testing.T) {
	for _, c := range []struct {
		at           string
		long         bool
		late, before bool
	}{
		// auto and qa: at q_a, whatever the rows' lengths.
		{"", true, false, false},
		{"", false, false, false},
		{"qa", true, false, false},
		// set: as asked.
		{"topk", true, true, false},
		{"topk", false, false, false},
		{"topk-all", false, true, false},
		{"scores", true, true, true},
		{"scores", false, false, false},
		{"scores-all", false, true, true},
	} {
		late, before := qFork(c.at, c.long)
		if late != c.late || before != c.before {
			t.Errorf("%+v: late %v before %v", c, late, before)
		}
	}
}

func TestParseSideCap(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want [nChains]int
		bad  string // a part of the error, "" when accepted
	}{
		{"", [nChains]int{-1, -1}, ""},
		{"0", [nChains]int{0, 0}, ""},
		{"2", [nChains]int{2, 2}, ""},
		{"q=0", [nChains]int{0, -1}, ""},
		{"sh=1", [nChains]int{-1, 1}, ""},
		{"q=0,sh=1", [nChains]int{0, 1}, ""},
		{" sh=3 , q=2", [nChains]int{2, 3}, ""},
		{"-1", [nChains]int{-1, -1}, "negative"},
		{"q", [nChains]int{-1, -1}, "not chain=count"},
		{"q=x", [nChains]int{-1, -1}, "not chain=count"},
		{"q=-2", [nChains]int{-1, -1}, "not chain=count"},
		{"kv=1", [nChains]int{-1, -1}, "no side chain"},
		{"one", [nChains]int{-1, -1}, "not chain=count"},
	} {
		got, err := parseSideCap(tc.in)
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.bad)
		case got != tc.want:
			t.Errorf("%q: caps %v, want %v", tc.in, got, tc.want)
		}
		if err != nil && len(errors.GetAllHints(err)) == 0 {
			t.Errorf("%q: error without a hint", tc.in)
		}
	}
}
