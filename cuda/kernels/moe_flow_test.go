package kernels

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestMoEFlowSchedule replays the flow kernel's ticket order on the host (no
// GPU): every router row, gate/up and down row of every slot, combine and
// norm element covered exactly once; every counter a task waits on complete
// from lower tickets alone; a simulation with 1, 2, 5, 132 and 264 blocks
// finishes. Shapes: the decode shapes and tiny presets on 132, 78 and 8
// SMs, tile rows 8 and 4 (moe_flow_m1_r4), with and without the shared expert, the next norm and the
// combine-only (shard) form. Then a schedule broken on purpose must fail.
func TestMoEFlowSchedule(t *testing.T) {
	n, bad := 0, 0
	for _, sh := range moePersistShapes {
		for _, sms := range []int{132, 78, 8} {
			for _, shared := range []bool{true, false} {
				for _, form := range []struct{ mo, y bool }{{false, true}, {false, false}, {true, false}} {
					pl := moePersistPlanB(sms, sh.E, sh.K, sh.H, sh.MI, shared, 2)
					for _, R := range []int{8, 4} {
						s := moeFlowShape{E: sh.E, K: sh.K, H: sh.H, MI: sh.MI, RR: pl.RR, Ggu: pl.Ggu, Gd: pl.Gd, NT: pl.NT,
							R: R, shared: shared, mo: form.mo, y: form.y}
						for _, nb := range []int{1, 2, 5, 132, 264} {
							if err := moeFlowCheck(s, nb); err != nil {
								bad++
								t.Errorf("%s sms=%d R=%d shared=%v mo=%v y=%v blocks=%d: %+v", sh.name, sms, R, shared, form.mo, form.y, nb, err)
							}
							n++
						}
					}
				}
			}
		}
	}
	// Broken on purpose: the shared down before its gate/up, a routed
	// gate/up before the router rows, a task dropped.
	pl := moePersistPlanB(132, 16, 4, 160, 96, true, 2)
	s := moeFlowShape{E: 16, K: 4, H: 160, MI: 96, RR: pl.RR, Ggu: pl.Ggu, Gd: pl.Gd, NT: pl.NT, shared: true, y: true}
	ts := moeFlowSchedule(s)
	find := func(kind string) int {
		for i, x := range ts {
			if x.kind == kind {
				return i
			}
		}
		t.Fatalf("no %s task", kind)
		return -1
	}
	for name, broken := range map[string][]moeFlowTask{
		"shdown first": append([]moeFlowTask{ts[find("shdown")]}, ts...),
		"gu first":     append([]moeFlowTask{ts[find("gu")]}, ts...),
		"router gone":  ts[1:],
	} {
		if err := moeFlowCheckTasks(s, broken, 3); err == nil {
			t.Errorf("schedule %q accepted", name)
		}
	}
	record(t, "moe_flow schedule replays (shapes x SMs x forms x blocks)", "failed replays", float64(bad), 0)
	t.Logf("%d schedule replays", n)
	// The kernel computes the same ranges in the same order (moe_flow_body).
	src, err := os.ReadFile("cu/persist/moe_flow.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"const int tSG = (E + RR - 1) / RR;",
		"const int tRT = tSG + (hasSh ? tgu : 0);",
		"const int tGU = tRT + 1;",
		"const int tSD = tGU + K * tgu;",
		"const int tD = tSD + (hasSh ? td : 0);",
		"const int tC = tD + K * td;",
		"const int nC = mo ? (H + MP_THREADS - 1) / MP_THREADS : nvw;",
		"const int tY = tC + nC;",
		"const int total = tY + ((!mo && y) ? nvw : 0);",
		fmt.Sprintf("moe_flow_body<%d, 8, true, true>(", moeFlowRows),
		fmt.Sprintf("moe_flow_body<%d, 8, true, false>(", moeFlowRows),
		fmt.Sprintf("moe_flow_body<%d, 8, false, false>(", moeFlowRows),
		"moe_flow_body<4, 8, true, true>(",
	} {
		if !strings.Contains(string(src), line) {
			t.Errorf("moe_flow.cu lacks %q (moeFlowSchedule's order)", line)
		}
	}
}
