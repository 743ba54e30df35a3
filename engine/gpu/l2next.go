package gpu

import (
	"os"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_L2_NEXT: the next layer's input projections asked into the L2
// while this MoE layer's routed experts stream (session 49, issue 10; off
// until measured).
//
// A one-row layer starts with a chain of latency-bound launches whose first,
// the grouped input GEMV (q_a, kv_a, the indexer's wk and weights_proj:
// ~16.5 MB of DeepSeek-V3.2 dims), reads its weights from HBM while little
// else does. L2 prefetches lost twice before (sessions 4 and 30): both were
// issued during latency-bound launches, whose L2 round trips they slowed, and
// the weight streams after them (normal priority then) pushed the lines out.
// Since session 47 the streams load evict-first (kernels.EvictFirst), so
// lines brought in at normal priority stay while ~400 MB of experts pass.
// Here the prefetch (kernels' l2_prefetch: ~32 blocks that issue
// prefetch.global.L2 over the ranges and exit) runs on the shared expert's
// side stream after its down projection, when the routed experts keep the
// HBM busy anyway; the next layer's grouped GEMV then reads the L2.
//
// Values: unset or 0, off; group, the grouped input GEMV's weights and
// scales; wqb, those and the indexer's wq_b (the next launch on the
// indexer's chain, 12.6 MB more).
var l2NextMode = os.Getenv("TILERT_GPU_L2_NEXT")

// l2NextRanges is what TILERT_GPU_L2_NEXT=mode asks into the L2 ahead of
// layer next: its input projections' weights and fp8 scales (and wq_b's for
// wqb), nil when off, when next is nil or when q_a is not fp8 (exact mode's
// float32 layers keep their launches as they are).
func l2NextRanges(next *dlayer, mode string) []kernels.L2Range {
	if next == nil || (mode != "group" && mode != "wqb") || next.QA.kind != linFP8 {
		return nil
	}
	ls := []dlin{next.QA, next.KVA, next.IWK, next.IWP}
	if mode == "wqb" {
		ls = append(ls, next.IWQ)
	}
	var rs []kernels.L2Range
	for _, l := range ls {
		if l.w == 0 || l.out <= 0 || l.in <= 0 {
			continue
		}
		per := int64(4)
		switch l.kind {
		case linFP8:
			per = 1
		case linBF16:
			per = 2
		}
		rs = append(rs, kernels.L2Range{P: l.w, N: per * int64(l.out) * int64(l.in)})
		if l.kind == linFP8 && l.s != 0 {
			rs = append(rs, kernels.L2Range{P: l.s, N: 4 * int64(cdivI(l.out, 128)*cdivI(l.in, 128))})
		}
	}
	return rs // at most 10 (5 matrices, each with its scales): one launch
}

func cdivI(a, b int) int { return (a + b - 1) / b }
