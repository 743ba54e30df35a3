package gpu

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/internal/enginetest"
)

// faultyFree makes every free fail once fail is set, as every call does
// after a kernel fault (the context's sticky error).
type faultyFree struct {
	device
	fail *bool
}

func (d faultyFree) free(p cuda.DevPtr) error {
	if *d.fail {
		return errors.New("injected free fault")
	}
	return d.device.free(p)
}

type faultyRunner struct {
	emuRunner
	fail *bool
}

func (r *faultyRunner) run(f func(b device) error) error {
	return r.runWith(faultyFree{device: r.m, fail: r.fail}, f)
}

// After a fault Close reports the first error once with a count, not one
// copy per buffer (a faulted shard run printed 109 chained copies).
func TestEmuCloseAfterFaultReportsOnce(t *testing.T) {
	_, src := hfSourceOf(t, enginetest.PresetDir(t, enginetest.Presets[0]))
	fail := false
	e, err := build(&faultyRunner{emuRunner: emuRunner{m: newEmu()}, fail: &fail}, src, engine.Options{MaxSeqLen: maxSeq, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	fail = true
	err = e.Close()
	if err == nil {
		t.Fatal("Close after injected faults returned nil")
	}
	msg := err.Error()
	if n := strings.Count(msg, "injected free fault"); n != 1 {
		t.Errorf("the fault appears %d times in %q, want once", n, msg)
	}
	if !strings.Contains(msg, "of the releases failed") {
		t.Errorf("no count of failed releases in %q", msg)
	}
	fail = false
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
