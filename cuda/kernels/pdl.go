package kernels

import (
	"maps"
	"os"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/tilert-go/tilert/cuda"
)

// Programmatic dependent launch (cuda.Ctx.LaunchEx): on Hopper the kernels
// below are launched so that each may be scheduled while the kernel before
// it on the stream still runs, instead of after it has drained; a decode
// step is ~280 small launches, and the gaps between them are a large part
// of the step. A kernel may be listed here only if PDL_WAIT() is the first
// statement of its body (common.cuh; TestPDLKernelsWait parses the embedded
// source): a kernel launched this way that did not wait would read its
// inputs before they are written, and the kernel after it, whose wait
// covers only the kernels it depends on directly, could overtake it. New
// kernels launch plainly until they have the wait and are added.
// TILERT_GPU_PDL=1 turns it on (off by default: see pdlEnv).
var pdlKernels = setOf(
	// engine.cu, exact.cu
	"eng_mla_cache_write", "eng_indexer_cache_write", "eng_quant_ue8m0", "eng_copy2d", "eng_scale",
	"eng_absorb_q", "eng_absorb_v",
	"eng_mla_cache_write_f32", "eng_mla_cache_write_bf16", "eng_indexer_cache_write_f32",
	"eng_indexer_scores_f32", "eng_mla_decode_f32", "eng_mla_decode_bf16",
	// fused.cu
	"attn_epilogue", "attn_epilogue_rows", "attn_epilogue_qs",
	// norm.cu, moe.cu register-staged / rank variants
	"rmsnorm_reg", "add_rmsnorm_reg", "moe_route_rank", "moe_route_sort",
	// gemm_tc.cu (prefill)
	"gemm_fp8_tc_s1", "gemm_bf16_tc_s1", "gemm_fp8_experts_tc_s1",
	"gemm_fp8_tc_s2", "gemm_bf16_tc_s2", "gemm_fp8_experts_tc_s2",
	"gemm_fp8_tc_s3", "gemm_bf16_tc_s3", "gemm_fp8_experts_tc_s3", "moe_combine_rows",
	// gemv.cu, gemv_wide.cu
	"gemv_fp8_r1", "gemv_fp8_r2", "gemv_fp8_r4", "gemv_bf16_r1", "gemv_bf16_r2", "gemv_bf16_r4",
	"gemv_f32_r1", "gemv_f32_r4", "gemv_fp8_experts_r1", "gemv_fp8_experts_r4",
	"gemv_fp8_wide_r1", "gemv_fp8_wide_r2", "gemv_fp8_wide_r4", "gemv_fp8_wide_r8",
	"gemv_bf16_wide_r1", "gemv_bf16_wide_r2", "gemv_bf16_wide_r4", "gemv_bf16_wide_r8",
	"gemv_fp8_experts_wide_r1", "gemv_fp8_experts_wide_r2", "gemv_fp8_experts_wide_r4", "gemv_fp8_experts_wide_r8",
	// gemv_mma.cu, gemv_mma_x.cu
	"gemv_mma_fp8_r1_u4", "gemv_mma_fp8_r2_u1", "gemv_mma_fp8_r2_u2", "gemv_mma_fp8_r4_u1",
	"gemv_mma_bf16_r1_u4", "gemv_mma_bf16_r2_u1", "gemv_mma_bf16_r4_u1",
	"gemv_mmx_fp8_r2_u1_p",
	"gemv_mmx_group_u2", "gemv_mmx_group_u4",
	// gemv_tile.cu
	"gemv_tile_fp8_r1_m1", "gemv_tile_fp8_r2_m1", "gemv_tile_fp8_r4_m1", "gemv_tile_fp8_r8_m1",
	"gemv_tile_fp8_r1_m2", "gemv_tile_fp8_r2_m2", "gemv_tile_fp8_r4_m2", "gemv_tile_fp8_r8_m2",
	"gemv_tile_fp8_r1_m4", "gemv_tile_fp8_r2_m4", "gemv_tile_fp8_r4_m4", "gemv_tile_fp8_r8_m4",
	"gemv_tile_fp8_r1_m8", "gemv_tile_fp8_r2_m8", "gemv_tile_fp8_r4_m8",
	"gemv_tile_bf16_r1_m8", "gemv_tile_bf16_r2_m8", "gemv_tile_bf16_r4_m8",
	"gemv_tile_fp8_r2_m1_d16", "gemv_tile_fp8_r4_m1_d16", "gemv_tile_fp8_r8_m1_d16",
	"gemv_tile_fp8_r4_m1_o4", "gemv_tile_fp8_r8_m1_o4", "gemv_tile_fp8_r8_m1_o4k",
	"moe_combine_slots",
	// moe_unique.cu
	"moe_unique", "gemv_tile_fp8_r4_m4_u", "gemv_tile_fp8_r2_m8_u", "gemv_mmx_fp8_r2_u1_pu",
	// norm.cu: the fused MoE combine + add + RMSNorm (sm_90 clusters)
	"moe_combine_norm_cl",
	// gemv_tile_group.cu
	"gemv_group_r4_m8", "gemv_group_r8_m1", "gemv_group_r8_m2", "gemv_group_r8_m4", "gemv_group_r8_m1_qw",
	// gemv_wide.cu (dense; the experts variants wait before reading ids)
	"gemv_fp8_wide_r1", "gemv_fp8_wide_r2", "gemv_fp8_wide_r4", "gemv_fp8_wide_r8",
	"gemv_bf16_wide_r1", "gemv_bf16_wide_r2", "gemv_bf16_wide_r4", "gemv_bf16_wide_r8",
	// indexer.cu, indexer_mma.cu, indexer_wide.cu, topk_radix.cu, topk_wide.cu
	"indexer_scores", "topk_rows", "idx_q_prep", "indexer_scores_mma_pf", "indexer_scores_mma_rows", "indexer_scores_wide",
	"topk_radix_hist", "topk_radix_mark", "topk_radix_mark_s", "topk_radix_mark_l", "topk_radix_mark_lw",
	"topk_wide_hist", "topk_wide_pick", "topk_wide_count", "topk_wide_emit",
	// mla*.cu
	"mla_decode", "mla_combine", "mla_combine_wide", "mla_combine_wide_v1", "mla_decode_heads", "mla_decode_tc",
	"mla_decode_tcp",
	"topk_radix_one_w8", "topk_radix_one_w16", "topk_radix_one_w32", "topk_radix_one_w12",
	"absorb_q_fp8", "absorb_q_fp8_r4", "absorb_v_fp8",
	// moe.cu, norm.cu, sample.cu, logits.cu
	"moe_route", "rmsnorm", "add_rmsnorm", "layernorm", "rope", "add_f32", "silu_mul", "embed_bf16", "embed_bf16_checked", "moe_combine",
	"argmax_rows", "sample_rows", "argmax_wide", "sample_wide_max", "sample_wide_hist", "sample_wide_draw", "adjust_logits", "logprob_rows",
	// Not comm.cu's collectives: they spin on flags other ranks' kernels
	// set, and stay launched plainly.
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// pdlEnv: TILERT_GPU_PDL=1 turns programmatic launches on; read when a
// context loads the kernels. Off by default: on merged main (2026-12-01,
// docs/measured/h200-2026-12-01-merged2) the decode step's graphs took 3169
// us with them and 3105 us without (1 slot, context 8192; 8945 / 8778 us
// at 4 slots): each kernel lets the next one's blocks in at its start, and
// those take SM room from the bandwidth-bound GEMVs they wait on.
func pdlEnv() (bool, error) {
	if pdlSelErr != nil {
		return false, pdlSelErr
	}
	return pdlSwitch(os.Getenv("TILERT_GPU_PDL"))
}

// pdlSwitch is TILERT_GPU_PDL's value: unset or 0 plain launches, 1
// programmatic launches of pdlKernels; anything else is refused. =2 (the
// module compiled a second time with early triggers and GEMV weight loads
// before the wait, helper pdlw) was measured on the H200 in session 9,
// gained nothing and was removed (cuda/kernels/NOTES.md "PDL mode 2 (pdlw)").
func pdlSwitch(v string) (bool, error) {
	switch v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	case "2":
		return false, errors.WithHint(
			errors.New("TILERT_GPU_PDL=2 (early triggers, GEMV weight loads before griddepcontrol.wait) was removed: measured on the H200 in session 9 it gained nothing (decode p50 2.966 ms against 2.967 ms plain)"),
			"unset TILERT_GPU_PDL (or set it to 0) for plain launches, or set it to 1 for programmatic launches; the record is in cuda/kernels/NOTES.md \"PDL mode 2 (pdlw)\"")
	}
	return false, errors.WithHintf(errors.Newf("TILERT_GPU_PDL=%q is not a launch mode", v),
		"unset TILERT_GPU_PDL (or set it to 0) for plain launches, or set it to 1 for programmatic launches")
}

// PDL reports whether this Set launches its listed kernels programmatically
// (Hopper or newer, a driver with cuLaunchKernelEx, TILERT_GPU_PDL=1).
func (k *Set) PDL() bool { return k.pdl }

// PDLSupported reports whether programmatic launches are possible here
// (whatever TILERT_GPU_PDL says): measurements time both ways.
func (k *Set) PDLSupported() bool { return k.c.PDLSupported() }

// SetPDL turns programmatic launches on or off for later launches (where
// the device supports them); measurements compare both in one process.
// Graphs captured before keep the launches they were captured with.
func (k *Set) SetPDL(on bool) { k.pdl = on && k.c.PDLSupported() }

// pdlMoreKernels are kernels of the decode step's default path that begin
// with PDL_WAIT() but launch programmatically only as pdlSel says: the
// sparse MLA decode (mla_decode_tcf2, the default at more than 16 heads)
// and the extra modules' kernels (absorb, few, mid), which were written
// with the wait while programmatic launches were opt-in. They are apart
// because one of them (absorb_q) measured slower launched so, and the
// rest were measured one family at a time. TestPDLMoreKernelsWait checks
// the wait in every definition and that every extra-module kernel is on
// one of the two lists.
var pdlMoreKernels = setOf(
	"mla_decode_tcf", "mla_decode_tcf2",
	// cu/wg (mla_prefill_wg, mla_prefill_wg2, mla_decode_wg2 and mwg_probe
	// have no wait and are on neither list: launched plainly)
	"mla_decode_wg2b", "mla_decode_wg2h",
	// cu/wg: the indexer scores on wgmma, launched as indexer_scores_mma_pf
	// (pdlKernels) is, so programmatically in pdlMoreDefault.
	"indexer_scores_wgh", "indexer_scores_wgh_rows", "indexer_scores_wgh2", "indexer_scores_wgh2_rows",
	// SpreadPlan's o_proj: plainly by default (session 15 call C, GLM-5, 8192:
	// 2.862 ms a step against 2.880 launched programmatically).
	"gemv_tile_fp8_r4_m1_d16s", "gemv_tile_fp8_r8_m1_d16s",
	// cu/absorb
	"absorb_q_fast_g2_r4", "absorb_q_fast_g4_r4", "absorb_q_fast_g8_r4", "absorb_q_fast_g8_r8",
	"absorb_q_fast_g2_r4_n", "absorb_q_fast_g4_r4_n", "absorb_q_fast_g8_r4_n", "absorb_q_fast_g8_r8_n",
	"absorb_v_fast_rw1", "absorb_v_fast_rw2", "absorb_v_fast_rw4", "absorb_v_fast_rw8",
	"qb_absorb_g32_r4", "qb_absorb_g32_r4_n", "qb_absorb_g64_r8", "qb_absorb_g64_r8_n",
	"qb_absorb_g32_r4_c2", "qb_absorb_g32_r4_c2_n", "qb_absorb_g64_r8_c2", "qb_absorb_g64_r8_c2_n",
	// cu/few
	"mla_decode_few", "mla_combine_few",
	"topk_fast16", "topk_fast32", "topk_fast64",
	// cu/mid
	"gemv_mid_group_r2_m1_o4", "gemv_mid_group_r2_m1_o4n", "gemv_mid_group_r4_m1_d16", "gemv_mid_group_r4_m1_d16n",
	"gemv_mid_group_r4_m1_o4", "gemv_mid_group_r4_m1_o4n", "gemv_mid_group_r8_m1_d16", "gemv_mid_group_r8_m1_d16n",
)

// pdlSel is which kernels launch programmatically when PDL is on beyond
// and against pdlKernels, from two comma-separated lists of kernel-name
// prefixes read once (parsePDLSel; an entry matching no kernel of its list
// is refused at Load):
//   - TILERT_GPU_PDL_MORE: pdlMoreKernels that launch programmatically too
//     ("1": all of them; "0": none; unset: pdlMoreDefault). H200, session
//     12 (docs/measured/h200-2026-12-02-s12, 8192, 1 slot, p50): all of
//     them cost 150 us a step (call A: 2.771 -> 2.928 ms), and call B
//     found it all in absorb_q (2.913 against base 2.756-2.758 ms): its
//     early-resident grid waits beside the indexer chain it is forked
//     from. The MLA decode 2.749, the mid GEMVs 2.751, absorb_v 2.755, the
//     few-heads kernels 2.757: those three launch programmatically by
//     default since;
//   - TILERT_GPU_PDL_PLAIN: pdlKernels that launch plainly after all, to
//     find which programmatic launches cost more than they save (an early
//     resident grid holds SM room that a side stream's kernel waits for).
type pdlSelection struct {
	more, plain []string
	moreAll     bool
}

var pdlSel, pdlSelErr = parsePDLSel(os.Getenv("TILERT_GPU_PDL_MORE"), os.Getenv("TILERT_GPU_PDL_PLAIN"))

// pdlMoreDefault is TILERT_GPU_PDL_MORE's unset value (see pdlSelection).
const pdlMoreDefault = "mla_decode_tcf,gemv_mid,absorb_v,mla_decode_wg2b,mla_decode_wg2h,indexer_scores_wgh"

func parsePDLSel(more, plain string) (pdlSelection, error) {
	var sel pdlSelection
	if more == "" {
		more = pdlMoreDefault
	}
	const hint = "name kernels by a prefix of their names (cuda/kernels/pdl.go lists them: pdlMoreKernels for TILERT_GPU_PDL_MORE, pdlKernels and pdlWeightsFirst for TILERT_GPU_PDL_PLAIN), separated by commas"
	var err error
	if more == "1" {
		sel.moreAll = true
	} else if more != "0" {
		if sel.more, err = namePrefixes("TILERT_GPU_PDL_MORE", more, pdlMoreKernels, hint); err != nil {
			return sel, err
		}
	}
	plainable := maps.Clone(pdlKernels)
	maps.Copy(plainable, pdlWeightsFirst)
	sel.plain, err = namePrefixes("TILERT_GPU_PDL_PLAIN", plain, plainable, hint)
	return sel, err
}

// namePrefixes reads a comma-separated list of kernel-name prefixes from
// the variable env (value v): each must start a name of list, else the
// error says which did not, with hint.
func namePrefixes(env, v string, list map[string]bool, hint string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		hit := false
		for n := range list {
			hit = hit || strings.HasPrefix(n, p)
		}
		if !hit {
			return nil, errors.WithHint(errors.Newf("%s: %q is the start of no kernel name it can switch", env, p), hint)
		}
		out = append(out, p)
	}
	return out, nil
}

func hasPrefixIn(name string, ps []string) bool {
	for _, p := range ps {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// pdlWeightsFirst are kernels launched as pdlKernels are whose body begins
// with a copy of weights (never written during a step) into the block's
// shared memory and only then PDL_WAIT(): the staged GEMV (gemv_stage.go),
// whose weights stream while the kernel before it runs. TestPDLWeightsFirst
// checks that form and that the copy helper is handed nothing but weights.
var pdlWeightsFirst = setOf(stageKernel)

// pdlFor says whether a kernel named name launches programmatically when
// PDL is on.
func pdlFor(name string) bool {
	if pdlKernels[name] || pdlWeightsFirst[name] {
		return !hasPrefixIn(name, pdlSel.plain)
	}
	return pdlMoreKernels[name] && (pdlSel.moreAll || hasPrefixIn(name, pdlSel.more))
}

// SetPlain makes later launches plain (on) or as pdlFor says (off) and
// returns the previous setting. A programmatic launch lets its grid become
// resident while the kernel before it still runs, and its blocks then hold
// their registers in griddepcontrol.wait; on a side stream beside a
// latency-bound chain that room is what the other stream needs (session
// 12: absorb_q launched so behind the capped q_b cost 150 us a step). The
// engine holds plain launches between a fork and its unfork unless
// TILERT_GPU_SIDE_PDL=1 (engine/gpu side.go).
func (k *Set) SetPlain(on bool) (prev bool) {
	prev, k.plain = k.plain, on
	return prev
}

// Plain is SetPlain's current setting.
func (k *Set) Plain() bool { return k.plain }

// SetEdgeNext (on) asks that the next launch of a kernel that waits for the
// one before it (pdlFor: its griddepcontrol.wait is compiled in, whether
// the launch is programmatic or plain) take programmatic edges from the
// kernels it depends on in a graph capture (cuda.Ctx.ProgrammaticDeps),
// across streams too; a launch of any other kernel clears the request
// unused. It returns the previous setting.
func (k *Set) SetEdgeNext(on bool) (prev bool) {
	prev, k.edgeNext = k.edgeNext, on
	return prev
}

// EdgesTurned counts the captured edges SetEdgeNext's launches made
// programmatic (tests ask that some were).
var EdgesTurned atomic.Int64

// programmatic says whether a launch of the kernel named name is
// programmatic now.
func (k *Set) programmatic(name string) bool { return k.pdl && !k.plain && pdlFor(name) }

// SetPriority gives later launches the scheduling priority p (cuda
// LaunchOpts: lower numbers first, within the context's
// StreamPriorityRange; 0 leaves the stream's) and returns the previous
// one. A captured graph keeps it per kernel node when instantiated with
// the nodes' priorities (cuda.Ctx.EndCaptureWith); the engine raises the
// step's main chain with it (engine/gpu prio.go).
func (k *Set) SetPriority(p int) (prev int) {
	prev, k.prio = k.prio, p
	return prev
}

// Priority is SetPriority's current priority.
func (k *Set) Priority() int { return k.prio }

// launchFn queues f: programmatically when it is a listed kernel, PDL is
// on and no SetPlain holds; at SetPriority's priority.
func (k *Set) launchFn(f *cuda.Function, grid, block cuda.Dim3, smem int, s cuda.Stream, args ...any) error {
	if k.edgeNext {
		k.edgeNext = false
		if k.pdl && pdlFor(f.Name) {
			n, err := k.c.ProgrammaticDeps(s)
			if err != nil {
				return errors.Wrapf(err, "%s: its captured edges made programmatic", f.Name)
			}
			EdgesTurned.Add(int64(n))
		}
	}
	return k.c.LaunchWith(f, grid, block, smem, s, cuda.LaunchOpts{PDL: k.programmatic(f.Name), Priority: k.prio}, args...)
}
