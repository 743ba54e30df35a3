package gpu

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
)

func TestParseTilePlans(t *testing.T) {
	plan := func(s string) kernels.TilePlan {
		p, err := kernels.ParseTilePlan(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		in   string
		want map[[2]int]kernels.TilePlan
		bad  string // a part of the error; "" when accepted
	}{
		{"", nil, ""},
		{"  ", nil, ""},
		{"16384x2048=G64/R8_d16/B0", map[[2]int]kernels.TilePlan{{16384, 2048}: plan("G64/R8_d16/B0")}, ""},
		{"16384x2048=G64/R8_d16/B0, 6144x12288=G64/R8_d16s/B0", map[[2]int]kernels.TilePlan{
			{16384, 2048}: plan("G64/R8_d16/B0"), {6144, 12288}: plan("G64/R8_d16s/B0")}, ""},
		{"16384x2048", nil, "not NxK=PLAN"},
		{"16384*2048=G64/R8_d16/B0", nil, "not NxK=PLAN"},
		{"0x2048=G64/R8_d16/B0", nil, "not NxK=PLAN"},
		{"16384x2048y=G64/R8_d16/B0", nil, "not NxK=PLAN"},
		{"16384x2048=G64/R3/B0", nil, "16384x2048"},
		{"16384x2048=0", nil, "has no plan"},
		{"16384x2048=G64/R8/B0,16384x2048=G64/R4/B0", nil, "pinned twice"},
		// the routed experts' launches: down (e) and paired gate/up (p), apart from a dense pin of the same shape
		{"e7168x2048=G64/R8_d16/B0,p2048x7168=G64/R4_o4/B2,7168x2048=G64/R8/B0", map[[2]int]kernels.TilePlan{
			{7168 | kernels.PlanExperts, 2048}: plan("G64/R8_d16/B0"), {2048 | kernels.PlanPair, 7168}: plan("G64/R4_o4/B2"),
			{7168, 2048}: plan("G64/R8/B0")}, ""},
		{"e7168x2048=G64/R8_d16s/B0", nil, "not a plan for the routed experts"},
		{"8192x1536=G32/R8_st/B0", map[[2]int]kernels.TilePlan{{8192, 1536}: plan("G32/R8_st/B0")}, ""},
		{"e7168x2048=G32/R8_st/B0", nil, "not a plan for the routed experts"},
		{"8192x1536=G64/R8_st/B0", nil, "8192x1536"},
		{"p2048x7168=G64/R1/B0", nil, "not a plan for the routed experts"},
		{"e7168x2048=G64/R8/B0,e7168x2048=G64/R4/B0", nil, "pinned twice"},
		{"x7168x2048=G64/R8/B0", nil, "not NxK=PLAN"},
		{"ee7168x2048=G64/R8/B0", nil, "not NxK=PLAN"},
		{"e1073741824x2048=G64/R8/B0", nil, "not NxK=PLAN"},
	} {
		got, err := parseTilePlans(c.in)
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("%q: error %v, want one saying %q", c.in, err, c.bad)
		case c.bad != "" && len(errors.GetAllHints(err)) == 0:
			t.Errorf("%q: error without a hint: %v", c.in, err)
		case len(got) != len(c.want):
			t.Errorf("%q: pins %v, want %v", c.in, got, c.want)
		}
		for k, p := range c.want {
			if got[k] != p {
				t.Errorf("%q: %v pinned to %v, want %v", c.in, k, got[k], p)
			}
		}
	}
}

// The pins reach a CUDA runner (readyModules sets them at every run), and
// a value that did not parse is refused at engine creation.
func TestTilePlansPin(t *testing.T) {
	defer func(p map[[2]int]kernels.TilePlan, e error) { tilePlansSet, tilePlansErr = p, e }(tilePlansSet, tilePlansErr)
	tilePlansSet, tilePlansErr = parseTilePlans("6144x12288=G64/R8_d16s/B0")
	cr := &cudaRunner{}
	if err := tilePlansPin(cr); err != nil || len(cr.plans) != 1 || !cr.plans[[2]int{6144, 12288}].On() {
		t.Errorf("pins %v, %v", cr.plans, err)
	}
	tilePlansSet, tilePlansErr = parseTilePlans("6144x12288")
	if err := tilePlansPin(&cudaRunner{}); err == nil {
		t.Error("a malformed TILERT_GPU_TILE_PLANS was not refused")
	}
}
