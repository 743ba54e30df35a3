package gpu

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

func TestParseMainPrio(t *testing.T) {
	for _, c := range []struct {
		in   string
		mode prioMode
		bad  bool
	}{{"", prioAuto, false}, {"0", prioOff, false}, {"1", prioMain, false}, {"q", prioQLow, false}, {"auto", prioAuto, false},
		{"2", prioOff, true}, {"on", prioOff, true}, {" 1", prioOff, true}, {"Q", prioOff, true}} {
		mode, err := parseMainPrio(c.in)
		if mode != c.mode || (err != nil) != c.bad {
			t.Errorf("%q: %v, %v; want %v (error %v)", c.in, mode, err, c.mode, c.bad)
		}
		if err != nil && (!strings.Contains(err.Error(), "TILERT_GPU_MAIN_PRIO") || len(errors.GetAllHints(err)) == 0) {
			t.Errorf("%q: error %v should name the switch and carry a hint", c.in, err)
		}
	}
}

// Without the switch, and on the emulator or a wrapped (sharded) runner,
// prioPin leaves the runner alone.
func TestPrioPinLeavesOthers(t *testing.T) {
	defer func(m prioMode) { mainPrio = m }(mainPrio)
	for _, on := range []prioMode{prioOff, prioMain, prioQLow, prioAuto} {
		mainPrio = on
		cr := &cudaRunner{}
		if err := prioPin(cr); err != nil || cr.prio != prioOff || cr.stream != 0 {
			t.Errorf("on=%v: a runner without a device: %v, prio %v, stream %v", on, err, cr.prio, cr.stream)
		}
		em := &emuRunner{m: newEmu()}
		if err := prioPin(em); err != nil {
			t.Errorf("on=%v: the emulator: %v", on, err)
		}
	}
}

// auto stays only where q_b is a _d16 launch (the q chain capped by
// default); the other modes stand.
func TestPrioFor(t *testing.T) {
	for _, c := range []struct {
		m    prioMode
		v    string
		want prioMode
	}{
		{prioAuto, "_d16", prioAuto}, {prioAuto, "_o4", prioOff}, {prioAuto, "", prioOff},
		{prioOff, "_d16", prioOff}, {prioMain, "_o4", prioMain}, {prioQLow, "_o4", prioQLow},
	} {
		if got := prioFor(c.m, c.v); got != c.want {
			t.Errorf("prioFor(%v, %q) = %v, want %v", c.m, c.v, got, c.want)
		}
	}
}

// Which steps run raised, and which side chains keep it: auto in one- and
// two-row steps within 32768 keys whose q chain forks at q_a (measured
// faster there; slower at four rows, with the late fork, at two rows of
// 131072 keys and, since the q chain forks at q_a there, at one row past
// 32768 keys); q and 1 in every step. Only the shared expert
// keeps a raised step's priority, and not under 1.
func TestStepRaised(t *testing.T) {
	for _, c := range []struct {
		m                prioMode
		rows             int
		late, long, want bool
	}{
		{prioAuto, 1, false, false, true}, {prioAuto, 1, false, true, false}, {prioAuto, 1, true, true, false},
		{prioAuto, 2, false, false, true}, {prioAuto, 2, false, true, false}, {prioAuto, 3, false, false, false},
		{prioAuto, 4, false, false, false},
		{prioQLow, 4, true, true, true}, {prioMain, 1, true, true, true}, {prioOff, 1, false, false, false},
	} {
		if got := stepRaised(c.m, c.rows, c.late, c.long); got != c.want {
			t.Errorf("stepRaised(%v, %d rows, late %v, long %v) = %v, want %v", c.m, c.rows, c.late, c.long, got, c.want)
		}
	}
	for _, c := range []struct {
		m                  prioMode
		q, qLate, sh, open bool
	}{
		{prioAuto, false, false, true, true}, {prioQLow, false, false, true, true},
		{prioMain, false, false, false, false}, {prioOff, false, false, false, false},
	} {
		got := [3]bool{chainRaised(c.m, chainQ), chainRaised(c.m, chainQLate), chainRaised(c.m, chainSh)}
		if got != [3]bool{c.q, c.qLate, c.sh} || qUncapped(c.m, true) != c.open || qUncapped(c.m, false) {
			t.Errorf("%v: chains raised (q, q late, shared) %v, want %v; q uncapped raised %v (want %v), not raised %v (want false)", c.m, got,
				[3]bool{c.q, c.qLate, c.sh}, qUncapped(c.m, true), c.open, qUncapped(c.m, false))
		}
	}
}

// The forward pass asks for its step's priority before the first layer
// and lowers it after the head, outside every fork: recorded in the graphs
// as "raise" / "lower" (the emulator's mode set by emuPrio). One and two
// slots' decode steps (the tiny presets' rows are short) are raised under
// auto and q; three slots' under q only (TestStepRaised has the rule's
// table); off records nothing.
func TestEmuStepPriority(t *testing.T) {
	defer func(m prioMode) { emuPrio = m }(emuPrio)
	pr := enginetest.Presets[0]
	w, src := hfSourceOf(t, enginetest.PresetDir(t, pr))
	vocab, tk := w.Config().VocabSize, w.Config().IndexTopK
	prompt := enginetest.Prompt(tk+30, vocab, 11)
	for _, m := range []prioMode{prioOff, prioAuto, prioQLow} {
		for _, slots := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%v slots=%d", m, slots), func(t *testing.T) {
				emuPrio = m
				prompts := make([][]int, slots)
				for i := range prompts {
					prompts[i] = prompt[:tk+7*i]
				}
				n := 6
				e := newTestEngine(t, onEmu, src, engine.Options{MaxSeqLen: len(prompt) + n + 16, Slots: slots})
				e.m.graphs.keep = [][]gop{}
				generateBatch(t, e, prompts, engine.Params{}, n)
				raised, lowered := 0, 0
				for _, run := range e.m.graphs.keep {
					open, first, last := false, "", ""
					for _, op := range run {
						switch op.name {
						case "fork":
							open = true
						case "unfork", "join":
							open = false
						case "raise", "lower":
							if open {
								t.Fatalf("%s inside a fork", op.name)
							}
							if first == "" {
								first = op.name
							}
							last = op.name
						}
					}
					if m == prioOff {
						if first != "" {
							t.Fatalf("a %s recorded with the priorities off", first)
						}
						continue
					}
					if first == "" {
						continue // no forward pass in this run
					}
					if last != "lower" {
						t.Fatalf("the pass ends with %s, want lower", last)
					}
					if first == "raise" {
						raised++
					} else {
						lowered++
					}
				}
				want := m == prioQLow || m == prioAuto && slots <= 2
				t.Logf("%v, %d slots: %d passes raised, %d not", m, slots, raised, lowered)
				switch {
				case m == prioOff:
				case want && raised < n-1:
					t.Errorf("%d passes raised, want the %d decode steps at least", raised, n-1)
				case !want && raised > 0:
					t.Errorf("%d passes raised, want none", raised)
				}
			})
		}
	}
}

// A raised step's priority holds on the main chain and the shared
// expert's fork, not the q chain's (nor, under 1, either side chain's);
// raise inside a fork is refused; the run's end leaves the launches at the
// stream's priority.
func TestGPUPriorityScoped(t *testing.T) {
	dev := gpuDevice(t)
	var hi int
	if err := dev.Do(func(c *cuda.Ctx) error {
		least, greatest, err := c.StreamPriorityRange()
		hi = greatest
		if err == nil && least == greatest {
			t.Skip("one scheduling priority")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []prioMode{prioAuto, prioMain} {
		r := &cudaRunner{dev: dev, info: dev.Info, prio: m, prioHi: hi}
		want := func(cb *cudaDevice, what string, p int) error {
			if got := cb.k.Priority(); got != p {
				return errors.Newf("%v, %s: launch priority %d, want %d", m, what, got, p)
			}
			return nil
		}
		err := r.run(func(b device) error {
			cb := b.(*cudaDevice)
			shared := 0
			if m == prioAuto {
				shared = hi
			}
			for _, step := range []func() error{
				func() error { return want(cb, "the run's start", 0) },
				func() error { return cb.raise(true) },
				func() error { return want(cb, "raised", hi) },
				func() error { return cb.fork(chainQ, 1) },
				func() error { return want(cb, "the q chain", 0) },
				func() error {
					if cb.raise(true) == nil {
						return errors.New("raise inside a fork was accepted")
					}
					return nil
				},
				func() error { return cb.unfork() },
				func() error { return want(cb, "after the q chain", hi) },
				func() error { return cb.join() },
				func() error { return cb.fork(chainSh, 1) },
				func() error { return want(cb, "the shared expert", shared) },
				func() error { return cb.unfork() },
				func() error { return cb.join() },
				func() error { return want(cb, "after the shared expert", hi) },
			} {
				if err := step(); err != nil {
					return err
				}
			}
			return nil // left raised: the run's end lowers it
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.run(func(b device) error { return want(b.(*cudaDevice), "the next run's start", 0) }); err != nil {
			t.Error(err)
		}
		if err := r.close(); err != nil {
			t.Error(err)
		}
	}
}
