package gpu

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

func TestParseMainPrio(t *testing.T) {
	for _, c := range []struct {
		in      string
		on, bad bool
	}{{"", false, false}, {"0", false, false}, {"1", true, false}, {"2", false, true}, {"on", false, true}, {" 1", false, true}} {
		on, err := parseMainPrio(c.in)
		if on != c.on || (err != nil) != c.bad {
			t.Errorf("%q: %v, %v; want %v (error %v)", c.in, on, err, c.on, c.bad)
		}
		if err != nil && (!strings.Contains(err.Error(), "TILERT_GPU_MAIN_PRIO") || len(errors.GetAllHints(err)) == 0) {
			t.Errorf("%q: error %v should name the switch and carry a hint", c.in, err)
		}
	}
}

// Without the switch, and on the emulator or a wrapped (sharded) runner,
// prioPin leaves the runner alone.
func TestPrioPinLeavesOthers(t *testing.T) {
	defer func(on bool) { mainPrioOn = on }(mainPrioOn)
	for _, on := range []bool{false, true} {
		mainPrioOn = on
		cr := &cudaRunner{}
		if err := prioPin(cr); err != nil || cr.prio || cr.stream != 0 {
			t.Errorf("on=%v: a runner without a device: %v, prio %v, stream %v", on, err, cr.prio, cr.stream)
		}
		em := &emuRunner{m: newEmu()}
		if err := prioPin(em); err != nil {
			t.Errorf("on=%v: the emulator: %v", on, err)
		}
	}
}
