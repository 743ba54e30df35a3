package gpu

import (
	"math"
	"os"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda/kernels"
)

// TILERT_GPU_QA_NORM=late (the default since session 42; built in session
// 41, issue 10): a one-row step's q_a RMSNorm leaves both attention chains.
// With =launch the layer-input group writes q_a, one block normalises it (rmsnorm_reg),
// and the indexer's wq_b and q_b both wait for that launch: 1.6-2.1 us
// charged on every row's critical path in session 40's traces (engine/gpu
// NOTES "Session 41"). RMSNorm(x) = x * w * r with one scalar r =
// rsqrt(mean(x^2) + eps), and both consumers are linear, so with =late:
//   - the group (kernels.GroupSeg.OutW / SumSq on gemv_group_r8_m1_qw)
//     writes q_a * w and each of its q_a blocks' sum of squares;
//   - wq_b and q_b run on that, with no norm launch before them;
//   - the two launches that read their outputs apply r, summed from the
//     group's partials (kernels.QScale): absorb_q (absorb_q_fast_..._n) to
//     its outputs, the absorbed nope part and the rotated RoPE part;
//     attn_epilogue (attn_epilogue_qs) to the indexer's query before its
//     RoPE and fp8 quantisation. The query must be scaled there: its
//     scores scale with r exactly, but the fp8 codes of q / r are not those
//     of q, and the top-k then picks other keys near its threshold (the
//     emulator's greedy tokens left the CPU engine's at the third token
//     when the query was left unscaled).
//
// r is applied after the sums, not inside each product, so the bit-level
// equalities with the default path do not hold; greedy tokens equal the
// CPU engine's (TestEmuQANormLate, TestGPUQANormLate). Taken where the step
// has one row, W_UK is fp8, the one-row absorb kernels load and the
// indexer's query goes through the fused epilogue (projGroup asks qaLate);
// elsewhere the norm launch runs as before ("launch" everywhere).
// Measured (H200, session 42 call A, docs/measured/h200-2026-12-05-s42, 9
// MoE layers, 1 slot, A/B/A/B p50): GLM-5 dims 8192 2.648 / 2.648 ms with
// the launch against 2.622 / 2.621 late, 131072 2.768 / 2.766 against
// 2.740 / 2.742; DeepSeek-V3.2 dims 8192 2.591 / 2.591 against 2.581 /
// 2.586, 131072 2.736 / 2.737 against 2.714 / 2.719.
var qaNormLate, qaNormErr = parseQANorm(os.Getenv("TILERT_GPU_QA_NORM"))

func parseQANorm(v string) (bool, error) {
	switch v {
	case "launch":
		return false, nil
	case "", "late":
		return true, nil
	}
	return false, errors.WithHint(errors.Newf("TILERT_GPU_QA_NORM=%q: not a value this switch knows", v),
		"unset it (or late) to fold q_a's RMSNorm into the layer-input group, absorb_q and the attention epilogue in one-row steps (the default), launch for its own launch before q_b and the indexer's wq_b")
}

// qaLate: the one-row absorb_q_fast takes the scaled form here, and the
// group writes its segment's blocks' sums.
func (b *cudaDevice) qaLate(M int, sg kernels.GroupSeg, K, nope, R, hs, P int) int {
	if !qaNormLate || M != 1 || !b.absorbFastQ(true, M, nope, R, hs, P, true) {
		return 0
	}
	return b.k.GroupSumSqBlocks(sg, K)
}

// qaLate: the emulator writes q_a's whole sum of squares as one partial.
func (m *emuDevice) qaLate(M int, sg kernels.GroupSeg, K, nope, R, hs, P int) int {
	if !qaNormLate || M != 1 || !absorbFastOn || !absorbWideOn || !kernels.AbsorbQFastOK(nope, R, hs, P, true) {
		return 0
	}
	return 1
}

// qaGroupOut is the emulator's OutW / SumSq for segment 0 of a one-row
// group once its output is written: the sum of the row's squares (in
// order) into SumSq[0], then the row times OutW.
func (m *emuDevice) qaGroupOut(sg kernels.GroupSeg, M int) {
	if M != 1 || sg.OutW == 0 || sg.SumSq == 0 {
		return
	}
	y := m.f32(sg.Y, sg.N)
	w := m.f32(sg.OutW, sg.N)
	var ss float32
	for n, v := range y {
		ss += v * v
		y[n] = v * w[n]
	}
	m.f32(sg.SumSq, 1)[0] = ss
	emuQALate.Add(1)
}

// emuQALate counts the emulator's late-norm group launches (tests).
var emuQALate atomic.Int64

// qaScale is r of qs: rsqrt(sum(partials) / K + eps).
func (m *emuDevice) qaScale(qs kernels.QScale) float32 {
	var ss float32
	for _, v := range m.f32(qs.SumSq, qs.N) {
		ss += v
	}
	return float32(1 / math.Sqrt(float64(ss/float32(qs.K)+qs.Eps)))
}

func scaleF32(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}
