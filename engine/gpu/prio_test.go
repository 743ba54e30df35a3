package gpu

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

func TestParseMainPrio(t *testing.T) {
	for _, c := range []struct {
		in   string
		mode prioMode
		bad  bool
	}{{"", prioOff, false}, {"0", prioOff, false}, {"1", prioMain, false}, {"q", prioQLow, false}, {"auto", prioAuto, false},
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
		if err := prioPin(cr); err != nil || cr.prio || cr.stream != 0 || cr.sideSh.raised {
			t.Errorf("on=%v: a runner without a device: %v, prio %v, stream %v", on, err, cr.prio, cr.stream)
		}
		em := &emuRunner{m: newEmu()}
		if err := prioPin(em); err != nil {
			t.Errorf("on=%v: the emulator: %v", on, err)
		}
	}
}

// auto raises the main and shared-expert streams only where q_b is a
// _d16 launch (the q chain capped by default); the other modes stand.
func TestPrioFor(t *testing.T) {
	for _, c := range []struct {
		m    prioMode
		v    string
		want prioMode
	}{
		{prioAuto, "_d16", prioQLow}, {prioAuto, "_o4", prioOff}, {prioAuto, "", prioOff},
		{prioOff, "_d16", prioOff}, {prioMain, "_o4", prioMain}, {prioQLow, "_o4", prioQLow},
	} {
		if got := prioFor(c.m, c.v); got != c.want {
			t.Errorf("prioFor(%v, %q) = %v, want %v", c.m, c.v, got, c.want)
		}
	}
}
