package kernels

import (
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
)

// TilePlan pins the launch of a one-row fp8 tile GEMV: G threads a group
// (splitting K), R rows a group, the kernel variant V ("", "_d16", "_o4",
// or "_d16s": _d16 with the groups' row tiles dealt out, a block's groups
// gridDim.x tiles apart, on B blocks an SM, 2 if B is 0) and B blocks per
// SM (0: a block per row tile; SetTileCap). Its text is
// the timing sweeps' "G64/R8_d16/B0". For one G every R, V and B gives the
// same floats bit for bit (each thread sums its chunks tg, tg+G, ... in
// that order and the group's warps meet in a fixed order whatever the rows
// per group or loads in flight: TestKernelTilePlanBitwise); another G is
// another summation order.
type TilePlan struct {
	G, R int
	V    string
	B    int
}

// On says whether p pins anything (the zero plan does not).
func (p TilePlan) On() bool { return p.G != 0 }

func (p TilePlan) String() string { return fmt.Sprintf("G%d/R%d%s/B%d", p.G, p.R, p.V, p.B) }

// ParseTilePlan reads a plan as String writes it ("" and "0": none).
func ParseTilePlan(s string) (TilePlan, error) {
	var p TilePlan
	if s = strings.TrimSpace(s); s == "" || s == "0" {
		return p, nil
	}
	bad := func() (TilePlan, error) {
		return TilePlan{}, errors.WithHint(errors.Newf("tile plan %q is not G<32|64|128|256>/R<1|2|4|8>[_d16|_o4|_d16s|_st]/B<blocks per SM>", s),
			"write it as the o_proj timing sweep names plans (TestKernelTimingOProj), e.g. G64/R4_o4/B0; _d16 needs R >= 2, _o4 and _d16s R >= 4; _st (the staged GEMV, gemv_stage.go) is G32/R8_st/B0 only")
	}
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return bad()
	}
	if strings.Contains(parts[1], "_bk") {
		return TilePlan{}, errors.WithHint(errors.Newf("tile plan %q: the bulk-copy GEMV (_bk) was removed", s),
			"session 57 measured it slower than the tile kernels on one H100 (o_proj 55.7 against 42.9 us alone, +165 us a step at 8192; q_b 27.9 against 18.2): pin _d16, _o4, _d16s or _st; the code last exists at commit 2641a67, the record is in cuda/kernels/NOTES.md \"gemv_bulk\"")
	}
	rv := parts[1]
	if i := strings.IndexByte(rv, '_'); i >= 0 {
		p.V, rv = rv[i:], rv[:i]
	}
	if _, err := fmt.Sscanf(parts[0]+" "+rv+" "+parts[2], "G%d R%d B%d", &p.G, &p.R, &p.B); err != nil {
		return bad()
	}
	okG := p.G == 32 || p.G == 64 || p.G == 128 || p.G == 256
	okR := p.R == 1 || p.R == 2 || p.R == 4 || p.R == 8
	okV := p.V == "" || (p.V == "_d16" && p.R >= 2) || (p.V == "_o4" && p.R >= 4) || (p.V == "_d16s" && p.R >= 4) ||
		(p.V == StageVariant && p.G == 32 && p.R == 8 && p.B == 0)
	if !okG || !okR || !okV || p.B < 0 || p.B > 16 || p.String() != s {
		return bad()
	}
	return p, nil
}

// SetTilePlan makes later one-row dense fp8 tile GEMVs of N rows of K
// (GemvFP8Tile with M = 1; not paired, no routed slots) launch with plan p
// (a zero p: tileShape's choice again) and returns the previous plan for
// that shape. The engine pins o_proj's so (TILERT_GPU_OPROJ).
func (k *Set) SetTilePlan(N, K int, p TilePlan) (prev TilePlan) {
	key := [2]int{N, K}
	prev = k.plans[key]
	if !p.On() {
		delete(k.plans, key)
		return prev
	}
	if k.plans == nil {
		k.plans = map[[2]int]TilePlan{}
	}
	k.plans[key] = p
	if p.V == StageVariant && prev != p {
		// Once a pin, not at each of the engine's runs (readyModules pins
		// again every run).
		k.stageErr = k.stageSetup()
	}
	return prev
}

// PlanExperts and PlanPair mark a SetTilePlan shape's N as the routed
// experts' one-row launches rather than a dense GEMV: N|PlanExperts the
// experts' down projection (N rows of K a slot), N|PlanPair their paired
// gate/up (N rows each). Their plans keep the launch's grid rule over the
// slots (tileGridX; B caps blocks an SM); _d16s is a one-slot plan.
const (
	PlanExperts = 1 << 30
	PlanPair    = 2 << 30
)

// tilePlan is the pinned plan of launch a, if any.
func (k *Set) tilePlan(a tileLaunch, pair bool) (TilePlan, bool) {
	if len(k.plans) == 0 || a.bf16 || a.M != 1 {
		return TilePlan{}, false
	}
	// A routed launch shaped as another's (ExpertsFP8Shaped, beside the
	// shared expert's) takes its pin too: the pin sets the shape.
	key := [2]int{a.N, a.K}
	switch {
	case a.slots > 0 && a.dense == 0 && pair:
		key[0] |= PlanPair
	case a.slots > 0 && a.dense == 0:
		key[0] |= PlanExperts
	case pair || a.slots != 0 || a.dense != 1 || a.shapeSlots != 0:
		return TilePlan{}, false
	}
	p, ok := k.plans[key]
	return p, ok
}

// tilePlanGrid is the blocks of a one-slot launch under p of N rows (rout
// rows a group): _d16s launches B (default 2) blocks an SM, at most one a
// group tile; the others as tileGridX.
func tilePlanGrid(p TilePlan, N, sms, capB int) int {
	gtiles := cdiv(N, p.R)
	if p.V == "_d16s" {
		b := p.B
		if b == 0 {
			b = 2
		}
		return max(1, min(b*max(1, sms), gtiles))
	}
	return tileGridX(cdiv(gtiles, tileThreads/p.G), capB, sms, 1)
}

// TileVariantOf is the kernel variant ("", "_d16" or "_o4") that a one-row
// fp8 tile GEMV of N rows of K launches with when no plan is pinned: how
// many blocks an SM it was shaped to stream with (two, four for _o4).
func (k *Set) TileVariantOf(N, K int) string { return defaultPlan(k.c.Info().SMs, N, K).V }

// defaultPlan is the plan a dense one-row launch of N x K fp8 takes
// unpinned (tileLaunchShape: the rule, then OneRowWholeChunks).
func defaultPlan(sms, N, K int) TilePlan {
	G, R, v := tileLaunchShape(sms, N, K, 1, 1, 1, false, false, expertLaunch{})
	return TilePlan{G: G, R: R, V: v}
}

// planRowsPerSM is the most and the mean weight rows an SM streams under
// p, if the blocks go to the SMs round robin (block b on SM b % sms; a
// block per row tile: the next free SM, the same count) and a capped
// block takes its tiles b, b+grid, ...: the launch's balance across SMs.
func planRowsPerSM(sms, N int, p TilePlan) (most int, mean float64) {
	ng := tileThreads / p.G
	rows := p.R * ng
	tiles := cdiv(N, rows)
	grid := tilePlanGrid(p, N, sms, p.B)
	per := make([]int, sms)
	for b := range grid {
		if p.V == "_d16s" {
			// block b's groups: group tiles (it*ng + grp)*grid + b
			for gt := b; gt < cdiv(N, p.R); gt += grid {
				per[b%sms] += p.R
			}
			continue
		}
		per[b%sms] += cdiv(tiles-b, grid) * rows
	}
	for _, n := range per {
		most = max(most, n)
	}
	return most, float64(N) / float64(sms)
}

// SpreadPlan is the plan that deals the row tiles of a one-row N x K fp8
// tile GEMV out over two blocks an SM (_d16s, tileShape's G and R, so the
// same floats bit for bit) where that cuts the rows of the busiest SM by a
// fifth or more against tileShape's launch; otherwise the zero plan. Why
// (session 15's reading): a launch takes its busiest SM's bytes. Session
// 57's probe (TestKernelTimingSMRate, one H100) found an SM streams faster
// as fewer stream (105 GB/s alone, 22.5 at all 132), so the tail costs less
// than that reading says; o_proj on _d16s alone was 42.94 against 42.93 us
// there. H200, session
// 15 (docs/measured/h200-2026-12-03-s15 calls B-C), o_proj at 8192, 1 slot:
// GLM-5's 6144 rows go from 64 to 48 a busiest SM, 29.98 -> 28.75 us alone
// and 2.898 -> 2.862 ms a step (launched plainly); DeepSeek-V3.2's 7168
// from 64 to 56, 33.74 -> 31.78 us alone but no faster a step (2.685 ->
// 2.687), so the rule leaves it.
func (k *Set) SpreadPlan(N, K int) TilePlan {
	return spreadPlan(k.c.Info().SMs, N, K)
}

func spreadPlan(sms, N, K int) TilePlan {
	p := defaultPlan(sms, N, K)
	if p.V != "_d16" || p.R < 4 {
		return TilePlan{}
	}
	s := TilePlan{G: p.G, R: p.R, V: "_d16s"}
	was, _ := planRowsPerSM(sms, N, p)
	now, _ := planRowsPerSM(sms, N, s)
	if 5*now > 4*was {
		return TilePlan{}
	}
	return s
}
