package gpu

import (
	"testing"

	"github.com/tilert-go/tilert/cuda/kernels"
	"github.com/tilert-go/tilert/model"
)

// TestOProjPin: TILERT_GPU_OPROJ's plan reaches a CUDA runner as o_proj's
// shape (hidden x heads*v_head_dim), also unset (SpreadPlan decides), nothing
// with =0, and a value
// that does not parse is refused.
func TestOProjPin(t *testing.T) {
	defer func(p kernels.TilePlan, e error, a bool) { oprojPlan, oprojPlanErr, oprojAuto = p, e, a }(oprojPlan, oprojPlanErr, oprojAuto)
	oprojAuto = false
	for _, c := range []struct {
		cfg  model.Config
		want [2]int
	}{
		{model.Config{HiddenSize: 7168, NumHeads: 128, VHeadDim: 128}, [2]int{7168, 16384}}, // DeepSeek-V3.2
		{model.Config{HiddenSize: 6144, NumHeads: 64, VHeadDim: 256}, [2]int{6144, 16384}},  // GLM-5
	} {
		oprojPlan, oprojPlanErr = kernels.ParseTilePlan("G64/R4_o4/B0")
		cr := &cudaRunner{}
		if err := oprojPin(cr, &c.cfg); err != nil || cr.oproj != c.want {
			t.Errorf("pinned %v, %v; want %v", cr.oproj, err, c.want)
		}
		oprojPlan, oprojPlanErr = kernels.ParseTilePlan("")
		cr = &cudaRunner{}
		if err := oprojPin(cr, &c.cfg); err != nil || cr.oproj != [2]int{} {
			t.Errorf("no plan: pinned %v, %v", cr.oproj, err)
		}
		oprojAuto = true // unset: SpreadPlan's choice, asked at readyModules
		cr = &cudaRunner{}
		if err := oprojPin(cr, &c.cfg); err != nil || cr.oproj != c.want {
			t.Errorf("auto: pinned %v, %v; want %v", cr.oproj, err, c.want)
		}
		oprojAuto = false
		oprojPlan, oprojPlanErr = kernels.ParseTilePlan("G64/R3/B0")
		if err := oprojPin(&cudaRunner{}, &c.cfg); err == nil {
			t.Errorf("G64/R3/B0 was not refused")
		}
	}
}
