package kernels

import (
	"github.com/cockroachdb/errors"
)

// The dataflow variant of the persistent MoE kernel (TILERT_GPU_MOE_PERSIST_V=flow,
// cu/persist/moe_flow.cu): blocks take tasks in one global order from a
// ticket counter and wait only on readiness counters. moeFlowSchedule is that
// order on the host, the same ranges the kernel computes (moe_flow_body's
// tSG..total), so a pure-Go test can replay it: every task covered once, and
// no task waits on a counter that a task of a higher ticket signals (that is
// what makes any number of resident blocks >= 1 finish).

// moeFlowRows is the tile rows a group of the flow kernels (their R; 4 for
// moe_flow_m1_r4).
const moeFlowRows = 8

// Readiness counters (moe_flow.cu's MF_*; slot j is moeFlowSlot + j).
const (
	moeFlowNone = iota
	moeFlowRouter
	moeFlowSharedGU
	moeFlowDown
	moeFlowComb
	moeFlowRoute
	moeFlowSlot // + j
)

// moeFlowTask is one ticket of the schedule.
type moeFlowTask struct {
	kind string // router, shgu, route, gu, shdown, down, combine, norm
	slot int    // routed slot (gu, down), -1 otherwise
	idx  int    // row block, tile or virtual warp within its kind
	// wait: the counter the task waits for (moeFlowNone: none) and the count.
	wait, need int
	// wait2, need2: a second counter (the combine waits for the route task too).
	wait2, need2 int
	// routed: the task needs the routing (it waits for the router rows).
	routed bool
	signal int // the counter it counts on when done (moeFlowNone: none)
}

// moeFlowShape is what the schedule depends on.
type moeFlowShape struct {
	E, K, H, MI, RR, Ggu, Gd, NT int
	R                            int // tile rows a group (0: moeFlowRows)
	shared, mo, y                bool
}

// rows is the kernel's R.
func (s moeFlowShape) rows() int {
	if s.R == 0 {
		return moeFlowRows
	}
	return s.R
}

// tiles returns the gate/up and down tiles a slot (moe_flow_body's tgu, td).
func (s moeFlowShape) tiles() (tgu, td int) {
	R := s.rows()
	tgu = cdiv(cdiv(s.MI, R/2), moePersistThreads/s.Ggu)
	td = cdiv(cdiv(s.H, R), moePersistThreads/s.Gd)
	return tgu, td
}

// moeFlowSchedule is the kernel's ticket order.
func moeFlowSchedule(s moeFlowShape) []moeFlowTask {
	tgu, td := s.tiles()
	nr := cdiv(s.E, s.RR)
	var ts []moeFlowTask
	add := func(t moeFlowTask) { ts = append(ts, t) }
	for i := range nr {
		add(moeFlowTask{kind: "router", slot: -1, idx: i, signal: moeFlowRouter})
	}
	if s.shared {
		for i := range tgu {
			add(moeFlowTask{kind: "shgu", slot: -1, idx: i, signal: moeFlowSharedGU})
		}
	}
	add(moeFlowTask{kind: "route", slot: -1, routed: true, signal: moeFlowRoute})
	for j := range s.K {
		for i := range tgu {
			add(moeFlowTask{kind: "gu", slot: j, idx: i, routed: true, signal: moeFlowSlot + j})
		}
	}
	if s.shared {
		for i := range td {
			add(moeFlowTask{kind: "shdown", slot: -1, idx: i, wait: moeFlowSharedGU, need: tgu, signal: moeFlowDown})
		}
	}
	for j := range s.K {
		for i := range td {
			add(moeFlowTask{kind: "down", slot: j, idx: i, routed: true, wait: moeFlowSlot + j, need: tgu, signal: moeFlowDown})
		}
	}
	ns := s.K
	if s.shared {
		ns++
	}
	nc := s.NT / 32
	if s.mo {
		nc = cdiv(s.H, moePersistThreads)
	}
	for v := range nc {
		t := moeFlowTask{kind: "combine", slot: -1, idx: v, routed: true, wait: moeFlowDown, need: ns * td, wait2: moeFlowRoute, need2: 1}
		if !s.mo && s.y {
			t.signal = moeFlowComb
		}
		add(t)
	}
	if !s.mo && s.y {
		for v := range s.NT / 32 {
			add(moeFlowTask{kind: "norm", slot: -1, idx: v, wait: moeFlowComb, need: s.NT / 32})
		}
	}
	return ts
}

// moeFlowCheck replays the schedule: each output covered exactly once,
// every wait satisfiable by lower tickets alone (routed tasks wait for all
// router rows), the counters inside the control buffer's words, and a
// simulation with nb blocks that take tickets in order finishes.
func moeFlowCheck(s moeFlowShape, nb int) error { return moeFlowCheckTasks(s, moeFlowSchedule(s), nb) }

// moeFlowCheckTasks is moeFlowCheck of the order ts (tests break it on purpose).
func moeFlowCheckTasks(s moeFlowShape, ts []moeFlowTask, nb int) error {
	// signalled[c] counts tasks signalling c so far (tickets below the current one).
	signalled := map[int]int{}
	total := map[int]int{}
	for _, t := range ts {
		if t.signal != moeFlowNone {
			total[t.signal]++
		}
	}
	nr := cdiv(s.E, s.RR)
	for tk, t := range ts {
		if t.routed && signalled[moeFlowRouter] < nr {
			return errors.Newf("ticket %d (%s): needs the routing with %d of %d router rows before it", tk, t.kind, signalled[moeFlowRouter], nr)
		}
		for _, w := range [][2]int{{t.wait, t.need}, {t.wait2, t.need2}} {
			if w[0] == moeFlowNone {
				continue
			}
			if signalled[w[0]] < w[1] {
				return errors.Newf("ticket %d (%s %d/%d): waits for %d on counter %d, lower tickets give %d", tk, t.kind, t.slot, t.idx,
					w[1], w[0], signalled[w[0]])
			}
			if total[w[0]] != w[1] {
				return errors.Newf("ticket %d (%s): waits for %d on counter %d, %d tasks signal it", tk, t.kind, w[1], w[0], total[w[0]])
			}
		}
		if t.signal >= moeFlowSlot+moePersistMaxK {
			return errors.Newf("ticket %d: slot counter %d past the control buffer's %d", tk, t.signal-moeFlowSlot, moePersistMaxK)
		}
		if t.signal != moeFlowNone {
			signalled[t.signal]++
		}
	}
	// Coverage: rows of the router, gate/up and down of every slot, the
	// combine's and the norm's elements, each exactly once.
	cover := func(what string, n int, rows func(yield func(int))) error {
		seen := make([]int, n)
		bad := -1
		rows(func(i int) {
			if i < 0 || i >= n {
				bad = i
				return
			}
			seen[i]++
		})
		if bad >= 0 {
			return errors.Newf("%s: row %d outside [0,%d)", what, bad, n)
		}
		for i, c := range seen {
			if c != 1 {
				return errors.Newf("%s: row %d written %d times", what, i, c)
			}
		}
		return nil
	}
	// tileRows is mp_tile_task's rows for tile bx (N rows, group size G, rout rows a group).
	tileRows := func(N, G, rout, bx int, yield func(int)) {
		for grp := range moePersistThreads / G {
			n0 := (bx*(moePersistThreads/G) + grp) * rout
			for r := range rout {
				if n0 < N && n0+r < N {
					yield(n0 + r)
				}
			}
		}
	}
	ns := s.K
	if s.shared {
		ns++
	}
	for j := range ns {
		kindGU, kindD := "gu", "down"
		if j == s.K {
			kindGU, kindD = "shgu", "shdown"
		}
		if err := cover(kindGU+" rows", s.MI, func(yield func(int)) {
			for _, t := range ts {
				if t.kind == kindGU && (t.slot == j || j == s.K) {
					tileRows(s.MI, s.Ggu, s.rows()/2, t.idx, yield)
				}
			}
		}); err != nil {
			return errors.Wrapf(err, "slot %d", j)
		}
		if err := cover(kindD+" rows", s.H, func(yield func(int)) {
			for _, t := range ts {
				if t.kind == kindD && (t.slot == j || j == s.K) {
					tileRows(s.H, s.Gd, s.rows(), t.idx, yield)
				}
			}
		}); err != nil {
			return errors.Wrapf(err, "slot %d", j)
		}
	}
	if err := cover("router rows", s.E, func(yield func(int)) {
		for _, t := range ts {
			if t.kind == "router" {
				for r := range s.RR {
					if t.idx*s.RR+r < s.E {
						yield(t.idx*s.RR + r)
					}
				}
			}
		}
	}); err != nil {
		return err
	}
	// The virtual warps' elements (v*32 + lane + j*nt), or the combine-only form's v*256 + t.
	vw := func(kind string) func(yield func(int)) {
		return func(yield func(int)) {
			for _, t := range ts {
				if t.kind != kind {
					continue
				}
				if s.mo {
					for i := t.idx * moePersistThreads; i < min(s.H, (t.idx+1)*moePersistThreads); i++ {
						yield(i)
					}
					continue
				}
				for j := range cdiv(s.H, s.NT) {
					for lane := range 32 {
						if i := t.idx*32 + lane + j*s.NT; i < s.H {
							yield(i)
						}
					}
				}
			}
		}
	}
	if err := cover("combine elements", s.H, vw("combine")); err != nil {
		return err
	}
	if !s.mo && s.y {
		if err := cover("norm elements", s.H, vw("norm")); err != nil {
			return err
		}
	}
	// Simulation: nb blocks, each takes the next ticket when its task is
	// done; a task is done once its counter (and the router rows, for a
	// routed task) is complete. Rounds: every running block finishes what
	// it can; no progress in a round with tasks left is a deadlock.
	cnt := map[int]int{}
	next := 0
	cur := make([]int, nb)
	for i := range cur {
		cur[i] = -1
	}
	done := 0
	for done < len(ts) {
		progress := false
		for bi := range cur {
			if cur[bi] < 0 && next < len(ts) {
				cur[bi] = next
				next++
				progress = true
			}
			if cur[bi] < 0 {
				continue
			}
			t := ts[cur[bi]]
			if t.routed && cnt[moeFlowRouter] < nr || t.wait != moeFlowNone && cnt[t.wait] < t.need ||
				t.wait2 != moeFlowNone && cnt[t.wait2] < t.need2 {
				continue
			}
			if t.signal != moeFlowNone {
				cnt[t.signal]++
			}
			cur[bi] = -1
			done++
			progress = true
		}
		if !progress {
			return errors.Newf("%d blocks: deadlock with %d of %d tasks done", nb, done, len(ts))
		}
	}
	return nil
}
