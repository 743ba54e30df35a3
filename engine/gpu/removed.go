package gpu

import (
	"os"
	"slices"

	"github.com/cockroachdb/errors"
)

// removedSwitch is an environment switch whose code was removed. A value
// other than "" and keep is refused with the message name+"="+%q+": "+what
// (what was removed, when, what it measured) and the hint "unset "+name+hint
// (what runs instead, where the code and the record are). Where only is set,
// just those values are refused: the switch itself is kept, and its other
// values are checked elsewhere (switchValues, device.go).
type removedSwitch struct {
	name       string
	keep, only []string
	what, hint string
}

// removedTable is checked in order and the first refusal wins, so a script
// that still sets a removed switch is told so at backend creation instead of
// silently measuring the default path.
var removedTable = []removedSwitch{
	// TILERT_GPU_MLA_TCQ=1 ran mla_decode_tcq and TILERT_GPU_MLA_TCF=q
	// mla_decode_tcfq, the sparse MLA decode with its splits merged inside a
	// thread block cluster (one launch, no combine; sessions 3-4). Correct,
	// but slower than tcf2 + combine at every shape the H200 timed; removed in
	// session 12. TILERT_GPU_MLA_TCF's other values stay.
	{name: "TILERT_GPU_MLA_TCQ", keep: zero,
		what: "the cluster-merged sparse MLA decode (mla_decode_tcq) was removed in session 12: " + clusterMLAMeasured,
		hint: ": the MLA decode runs mla_decode_tcf2 with its combine (the default)" + clusterMLARecord},
	{name: "TILERT_GPU_MLA_TCF", only: []string{"q"},
		what: "the cluster-merged sparse MLA decode (mla_decode_tcfq) was removed in session 12: " + clusterMLAMeasured,
		hint: " for mla_decode_tcf2 with its combine (the default), or set it to 1 / 3 (three fp16 parts) or 8 (8 warps a head group)" + clusterMLARecord},
	// TILERT_GPU_MOE_PERSIST=1 ran the MoE half of a one-row decode layer as
	// one persistent launch with device-wide barriers (moe_persist_m1,
	// sessions 9-10; TILERT_GPU_MOE_PERSIST_V picked its variants):
	// bit-identical to the launch chain but slower on the H200 every time,
	// removed in session 11.
	{name: "TILERT_GPU_MOE_PERSIST", keep: zero, what: moePersistWhat, hint: moePersistHint},
	{name: "TILERT_GPU_MOE_PERSIST_V", what: moePersistWhat, hint: moePersistHint},
	// Session 20 measured two one-launch fusions bit for bit the default and
	// slower, and removed them: the router GEMV + routing (moe_router_route)
	// and the one-row MLA merge inside the W_UV launch (absorb_v_comb).
	{name: "TILERT_GPU_ROUTE_FUSED", keep: zero,
		what: "the router GEMV and the routing in one launch (moe_router_route) was removed in session 20: measured on the H200 it was slower graph-timed at every row count (1 row 7.71 -> 8.45 us, 4 rows 10.75 -> 24.30)",
		hint: `: the router GEMV and the routing (moe_route_sort) run as two launches; the code last exists at 5643518, the record is in cuda/kernels/NOTES.md "moe_router_route"`},
	{name: "TILERT_GPU_ABSORB_COMB", keep: zero,
		what: "the one-row MLA merge inside the W_UV launch (absorb_v_comb) was removed in session 20: measured on the H200 the step was slower (2.720 against 2.657 ms, DeepSeek-V3.2 dims, 8192, 1 slot)",
		hint: `: mla_combine_wide merges the split partials before absorb_v_fast; the code last exists at 5048476, the record is in cuda/kernels/NOTES.md "mla_decode_wg2b and absorb_v_comb"`},
	// Session 22 measured two pre-wait weight loads slower and removed
	// them: the router GEMV with its matrix in shared memory
	// (gemv_bf16_smem) and the one-row W_UV product with its weights in
	// registers (absorb_v_fastw).
	{name: "TILERT_GPU_ROUTER_SMEM", keep: []string{"0"},
		what: "the router GEMV with its weights staged in shared memory before its PDL wait (gemv_bf16_smem) was removed in session 22: measured on the H200 it was slower (graph-timed 7.00 against 3.34 us after the norm; decode p50 2.719 against 2.665 ms, DeepSeek-V3.2 dims, 8192, 1 slot)",
		hint: `: the router runs gemv_bf16_wide (the default); the code last exists at 27f493f, the record is in cuda/kernels/NOTES.md "gemv_bf16_smem"`},
	{name: "TILERT_GPU_ABSORB_V_PRE", keep: []string{"0"},
		what: "the one-row W_UV product with its weights loaded before its PDL wait (absorb_v_fastw) was removed in session 22: measured on the H200 the step was slower (2.719 against 2.710 ms, DeepSeek-V3.2 dims, 8192, 1 slot)",
		hint: `: absorb_v_fast loads its weights after the wait (the default); the code last exists at ca9fc3f, the record is in cuda/kernels/NOTES.md "absorb_v_fastw"`},
	// TILERT_GPU_IDX_QPRO (session 22, helper epiq): the indexer query's
	// preparation in every scores block, the q_a norm and the cache half of
	// attn_epilogue in one launch; correct, slower, removed.
	{name: "TILERT_GPU_IDX_QPRO", keep: []string{"0"},
		what: "the indexer query prepared inside the scores kernel (indexer_scores_mma_pfq, attn_epilogue_norm) was removed in session 22: measured on the H200 it was slower (graph-timed 13.66 against 6.74 us after wq_b at 8192 keys; decode p50 at 8192, 1 slot: DeepSeek-V3.2 dims 2.707 against 2.688 ms, GLM-5 dims 2.764 against 2.717)",
		hint: `: attn_epilogue prepares the query before indexer_scores_mma_pf (the default); the code last exists at 7599143, the record is in cuda/kernels/NOTES.md "The indexer query in the scores' prologue"`},
	// TILERT_GPU_IDX_SCALE_LATE=1 ran the indexer scores with each key
	// group's scales loaded after its products (indexer_scores_mma_pfl, the
	// order before session 24), the A/B form of session 24's prefetch.
	{name: "TILERT_GPU_IDX_SCALE_LATE", keep: zero,
		what: "the indexer scores with each key group's scales loaded after its products (indexer_scores_mma_pfl, the order before session 24) was removed in session 24: measured on the H200 it was slower (graph-timed 12.06 against 11.41 us at 131072 keys, 1 row, 3.99 against 3.72 at 8192; decode p50 at 131072, 1 slot: DeepSeek-V3.2 dims 2.795 / 2.796 against 2.794 / 2.787 ms, GLM-5 dims 2.852 / 2.854 against 2.845 / 2.843)",
		hint: `: indexer_scores_mma_pf loads the scales with the keys (the default); the code last exists at da477d2, the record is in cuda/kernels/NOTES.md "The indexer scores' key scales with the keys"`},
	// TILERT_GPU_IDX_NOPF=1 ran the one-slot indexer scores on
	// indexer_scores_mma (no prefetch: 80 registers, 3 blocks an SM) in the
	// step, session 24's opt-in A/B; slower in session 25. The kernel itself
	// went in session 54 with the other kernels nothing could launch.
	{name: "TILERT_GPU_IDX_NOPF", keep: zero,
		what: "the one-slot indexer scores without the prefetch (indexer_scores_mma in the step) was measured slower on the H200 in session 25 and the switch removed (graph-timed scores + histogram 12.96 against _pf's 11.50 us at 131072 keys, 1 row, 3.91 against 3.73 at 8192; decode p50 at 131072, 1 slot, A/B/A/B: DeepSeek-V3.2 dims 2.799 / 2.804 against 2.794 / 2.789 ms, GLM-5 dims 2.869 / 2.868 against 2.849 / 2.847)",
		hint: `: indexer_scores_mma_pf runs (the default); the switch last exists at 6af7a79, the record is in docs/measured/h200-2026-12-04-s25`},
	// TILERT_GPU_IDX_CP=1/2 ran the indexer scores with each warp's key
	// groups staged in shared memory by cp.async (indexer_scores_mma_cp /
	// _rows_cp; =2 also _cp2 / _rows_cp2, two groups a warp at a time for
	// rows over 32768 keys); session 26's opt-in, the same bits as _pf,
	// slower in session 27.
	{name: "TILERT_GPU_IDX_CP", keep: zero,
		what: "the indexer scores with the key groups staged in shared memory by cp.async (indexer_scores_mma_cp / _rows_cp, =1; _cp2 / _rows_cp2 two groups a warp, =2) were measured slower on the H200 in session 27 and removed: graph-timed scores + histogram 14.42 (=1) and 14.48 (=2) against _pf's 11.39 us at 131072 keys, 1 row; decode p50 at 131072, 1 slot: DeepSeek-V3.2 dims 2.850 / 2.850 (=1) and 2.898 / 2.901 (=2) against 2.785 / 2.791 ms, GLM-5 dims 2.910 / 2.911 and 2.948 / 2.947 against 2.830 / 2.836",
		hint: `: indexer_scores_mma_pf runs (the default); the code last exists at 6348421, the record is in docs/measured/h200-2026-12-04-s27`},
	// TILERT_GPU_GROUP_NN=1/2/3 ran the layer input's one-row grouped GEMV
	// without the norm's predicated multiplies (gemv_group_r8_m1_nn), also
	// with two rounds' weight loads issued at once (_nn2 held to three
	// blocks an SM, _nn2b unbounded); sessions 24-25. The same bits, faster
	// alone (but _nn2b), never faster in the step.
	{name: "TILERT_GPU_GROUP_NN", keep: zero,
		what: "the layer input's grouped GEMV without the norm's multiplies (gemv_group_r8_m1_nn, =1) and with two rounds' loads at once (_nn2 =2, _nn2b =3) was measured on the H200 in session 25 and removed: graph-timed 9.69 us for gemv_group_r8_m1 against 9.18 (=1), 9.10 (=2), 11.41 (=3), but decode p50 at 8192, 1 slot, A/B/A/B no faster: =1 DeepSeek-V3.2 dims 2.666 / 2.659 against 2.660 / 2.662 ms, GLM-5 dims 2.688 / 2.692 against 2.685 / 2.694; =2 2.671 / 2.669 against 2.665 / 2.664, GLM-5 2.712 / 2.713 against 2.694 / 2.693",
		hint: `: gemv_group_r8_m1 runs (the default); the code last exists at ba59126, the record is in docs/measured/h200-2026-12-04-s25 and cuda/kernels/NOTES.md "The indexer scores' key scales with the keys"`},
	// TILERT_GPU_ROUTE_IN_GEMV=1 routed a MoE layer inside the experts'
	// gate/up launch (gemv_tile_fp8_r*_m1_d16_route: every block ranked the
	// router's logits itself, helper routein, session 22); correct, slower
	// in session 23, removed.
	{name: "TILERT_GPU_ROUTE_IN_GEMV", keep: zero,
		what: "the routing inside the experts' gate/up launch (gemv_tile_fp8_r*_m1_d16_route) was removed in session 23: measured on the H200 it was slower (graph-timed router -> gate/up, DeepSeek-V3.2 1 row, uncapped: 85.13 against 71.03 us for the three launches; decode p50 at 8192: DeepSeek-V3.2 dims 1 slot 2.785 against 2.661 ms, 4 slots 6.032 against 5.514; GLM-5 dims 1 slot 2.892 against 2.699, 4 slots 6.006 against 5.315)",
		hint: `: the routing (moe_route_sort) runs in its own launch before the gate/up (the default); the code last exists at 6ef9bd6, the record is in cuda/kernels/NOTES.md "The routing inside the experts' gate/up"`},
	// TILERT_GPU_TOPK_ONE=v1 ran the one-block top-k on its first kernel
	// (topk_radix_one8/16/32: block_excl_scan's scans, both 10-bit passes
	// always) instead of topk_radix_one_w (session 22, helper topk1): the
	// same selection, slower; removed in session 22. =0 (the candidate list)
	// stays.
	{name: "TILERT_GPU_TOPK_ONE", only: []string{"v1"},
		what: "the first one-block top-k (=v1, topk_radix_one8/16/32 on block-wide scans) was removed in session 22: measured on the H200 topk_radix_one_w makes the same selection faster (graph-timed after the histogram, one row of 8192 keys in the 8448-key bucket, 13.40 -> 6.19 us; decode p50 at 8192, v1 -> topk_radix_one_w: DeepSeek-V3.2 dims 1 slot 2.692 -> 2.688 ms, 4 slots 5.597 -> 5.523; GLM-5 dims 1 slot 2.745 -> 2.717, 4 slots 5.360 -> 5.316)",
		hint: ` for topk_radix_one_w (the one-block top-k, the default) or set it to 0 for the candidate list (topk_radix_mark_l); the code last exists at e0514ba, the record is in cuda/kernels/NOTES.md "topk_radix_one_w"`},
	// TILERT_GPU_TOPK_FAST=2 ran the indexer's scores and its top-k in one
	// launch (indexer_scores_topk, sessions 9-11); slower than the two
	// launches every time, removed in session 12. 0 and 1 stay.
	{name: "TILERT_GPU_TOPK_FAST", keep: []string{"0", "1"},
		what: "the one-launch scores + top-k (=2, indexer_scores_topk) was removed in session 12: measured on the H200 it was slower (17.69 against 14.91 us at 8192 keys; decode p50 2.792 against 2.772 ms)",
		hint: ` (topk_fast after the scores, the default) or set it to 0 (topk_radix_one_w); the record is in cuda/kernels/NOTES.md "Few-heads sparse MLA"`},
	// TILERT_GPU_SIDE_MOE=route turned the MoE fork round (the router and the
	// routing on the side stream, the shared expert on the main one at its
	// full grid; session 11); slower on both models in session 12, removed
	// then. No value stays.
	{name: "TILERT_GPU_SIDE_MOE",
		what: "the turned-round MoE fork (router and routing on the side stream) was removed in session 12: measured on the H200 it was slower (decode p50 at 8192, 1 slot: DeepSeek-V3.2 dims 2.809 against 2.771 ms, GLM-5 dims 2.973 against 2.933)",
		hint: ": the shared expert runs on the side stream beside the routing (TILERT_GPU_SIDE=q keeps only the attention's fork); the record is in docs/measured/h200-2026-12-02-s12"},
	// TILERT_GPU_NORM_FUSE=1|2 deferred a MoE layer's closing norm into the
	// next layer's grouped input launch and, at =2, the post-attention norm
	// into the router's launch (session 6); bit for bit the default but
	// slower on the H200 in sessions 6 and 12, removed in session 12.
	{name: "TILERT_GPU_NORM_FUSE", keep: zero,
		what: "the deferred norms (residual MoE combine, staged grouped-launch prologue, normed router launch) were removed in session 12: bit for bit the default but slower on the H200 (decode p50 at 8192, 1 slot: session 6, =2, 2.987 against 2.975 ms; session 12, =1 at DeepSeek-V3.2 dims, 2.802 against 2.771 ms)",
		hint: ": each norm runs in its own launch or fused with its residual add (add_rmsnorm); the code last exists at 84f17b3, the record is in docs/measured/h200-2026-12-02-s12 and engine/gpu/NOTES.md"},
	// TILERT_GPU_L2PF=1|attn|in added blocks that prefetched weights into the
	// L2 to the attention epilogue (attn_epilogue_pf) and a layer's closing
	// add+norm (add_rmsnorm_pf); TILERT_GPU_L2PF_OPROJ_MB sized the o_proj
	// share. Slower on the H200 (session 4), removed in session 12.
	{name: "TILERT_GPU_L2PF", keep: zero, what: l2pfWhat, hint: l2pfHint},
	{name: "TILERT_GPU_L2PF_OPROJ_MB", what: l2pfWhat, hint: l2pfHint},
	// TILERT_GPU_FUSE=2 ran the router GEMV with the routing (router_route)
	// and the MoE combine with the block's closing norm
	// (moe_combine_add_rmsnorm) each as one launch, =3 only the router's
	// (issue 10); bit for bit the default but slower on the H200 every time
	// measured, removed in session 15. 0 and 1 stay (the attention
	// epilogue's fusion, the default, off or on).
	{name: "TILERT_GPU_FUSE", keep: []string{"0", "1"},
		what: "the fused router (=2 and =3, router_route) and the fused MoE combine + norm (=2, moe_combine_add_rmsnorm) were removed in session 15: measured on the H200 they were slower (decode p50 at 8192, 1 slot, DeepSeek-V3.2 dims, session 14: =3 2.746, =2 2.808 against 2.697 ms; graph-timed at 1 row: router_route 10.62 against 8.31 us for its two launches, combine + norm 9.5 against 6.2 us)",
		hint: ` (the attention epilogue fused, the default) or set it to 0 (no fusion); the code last exists at commit ca3f1b5, the record is in docs/measured/h200-2026-12-03-s14 call D, docs/measured/h200-2026-12-01-fuse and -post, and cuda/kernels/NOTES.md "Fused per-row epilogues"`},
	// TILERT_GPU_IDX_ONE=1|plain ran the indexer's scores and the top-k of
	// rows over 32768 keys as one launch with two grid barriers
	// (indexer_topk_one), TILERT_GPU_IDX_F8=1|wg the indexer's scores on the
	// fp8 mma.sync or on wgmma e4m3; both session 15, correct, slower on the
	// H200 in its calls A1 / A2, removed in session 15.
	{name: "TILERT_GPU_IDX_ONE", keep: zero,
		what: "the one-launch indexer scores + long-row top-k (indexer_topk_one, =1 cooperative, =plain) was removed in session 15: correct, but measured on the H200 (call A1) it was slower (graph-timed 1 row x 131072 keys 29.8 against the pair's 28.3 us; decode p50 at 131072, 1 slot, 3.030 (=1) / 3.015 (=plain) against 2.904 ms)",
		hint: ": indexer_scores_mma_pf and the radix top-k run as two launches" + idxRecord + `"Scores and the long-row top-k in one launch"`},
	{name: "TILERT_GPU_IDX_F8", keep: zero,
		what: "the indexer scores on fp8 tensor cores (=1 indexer_scores_f8, mma.sync e4m3; =wg indexer_scores_wg, wgmma e4m3) were removed in session 15: measured on the H200 (call A2) they were slower (graph-timed at 131072 keys 13.96 (=1) / 27.14 (=wg) against indexer_scores_mma_pf's 13.00 us; decode p50 at 131072, 1 slot, 2.923 / 3.159 against 2.910 ms), and wgmma e4m3 accumulates with ~13 bits",
		hint: ": indexer_scores_mma_pf (f16 mma.sync, f32 accumulation) runs" + idxRecord + `"The indexer scores on the fp8 mma.sync and on wgmma"`},
	// TILERT_GPU_GEMV_MMA=x put the GEMVs of 2..8 rows on the second
	// iteration's cp.async variants (=xall with every shape on the tensor
	// cores); slower on the H200 in sessions 18 and 19, removed in session 19
	// with the other unpicked gemv_mma_x.cu variants. The switch's other
	// values stay (switchValues).
	{name: "TILERT_GPU_GEMV_MMA", only: []string{"x", "xall"},
		what: "the cp.async tensor-core GEMVs (gemv_mmx_fp8/bf16_r1_u1_a, _r2_u1_a) were removed in session 19: measured on the H200 they were the slowest variants (graph-timed o_proj at 4 rows 69.9 / 118.1 against 44.0 us for the default `_p`, session 19 call A; decode p50 at 8192, 4 slots, DeepSeek-V3.2 dims 6.503 against 6.013 ms, session 18 call B)",
		hint: " for run 2's tensor-core GEMVs (the default), or set it to all for every shape on the tensor cores (=xall's other half); the code last exists at commit cb41896, the record is in docs/measured/h200-2026-12-03-s18 call B, docs/measured/h200-2026-12-03-s19 call A and cuda/kernels/NOTES.md"},
	// TILERT_GPU_IDX_LONG (the indexer's long rows on a cp.async-ring score
	// kernel and a cluster top-k) and TILERT_GPU_GROUP_SPLIT (the layer
	// input's grouped GEMV with every block's weights in flight through
	// shared memory) were built and measured in session 14, slower both, and
	// never kept; =0 named the path that runs.
	{name: "TILERT_GPU_IDX_LONG", keep: zero,
		what: "the long-row indexer pair (indexer_scores_mma_d2..d4 + topk_cl) was measured slower on the H200 in session 14 and not kept (graph-timed pair at 131072 keys 38.5 against 27.6 us; decode p50 at 131072, 1 slot, 3.210 against 2.920 ms)",
		hint: ": indexer_scores_mma_pf and the radix top-k run; the code is at commit ad57728, the record in docs/measured/h200-2026-12-03-s14 call B"},
	{name: "TILERT_GPU_GROUP_SPLIT", keep: zero,
		what: "the split grouped GEMV (gemv_group_split) was measured slower on the H200 in session 14 and not kept (2304 x 7168 one row 10.29 against gemv_group's 9.74 us; decode p50 at 8192, 1 slot, 2.726 against 2.699 ms DeepSeek-V3.2 dims, 2.972 against 2.918 GLM-5)",
		hint: ": gemv_group runs; the code is at commit ad57728, the record in docs/measured/h200-2026-12-03-s14 call C"},
	// TILERT_GPU_L2WARM=PCT[,b=B][,p=P] forked a side chain after the
	// query's absorption that read PCT percent of every P bytes of o_proj's
	// weights (l2_warm, B blocks) so that o_proj found them in the L2;
	// built and measured in session 30, slower, removed.
	{name: "TILERT_GPU_L2WARM", keep: zero,
		what: "o_proj's weights read into the L2 beside the attention's tail (l2_warm on a side stream) were measured slower on the H200 in session 30 call B and removed (decode p50 at 8192, 1 slot, DeepSeek-V3.2 dims: 25% 2.634 / 2.634 against 2.609 / 2.615 ms, 12% 2.614, 50% 2.776, 25% by 33 blocks 2.998; 131072 +14 / +16 us; GLM-5 +9 / +13 us: o_proj took as long with a quarter of its bytes warmed, 33.5 against 32.7 us, and the sparse MLA beside the warm-up 3 us longer)",
		hint: `: nothing is read ahead; the code last exists at commit 707f692, the record is in docs/measured/h200-2026-12-04-s30 and engine/gpu/NOTES.md "o_proj's weights warmed in the L2"`},
	// TILERT_GPU_TILE_M2=d16 put the dense fp8 GEMVs of two rows on
	// gemv_tile_fp8_r4_m2_d16 (16 loads in flight a thread); built in
	// session 30, measured slower in session 31, removed.
	{name: "TILERT_GPU_TILE_M2", keep: zero,
		what: "the two-row dense GEMVs on gemv_tile_fp8_r4_m2_d16 (16 loads in flight) were measured slower on the H200 in session 31 call B and removed (decode p50 at 8192, 2 slots: DeepSeek-V3.2 dims 4.019 / 4.016 against 3.697 / 3.703 ms, GLM-5 dims 4.054 / 4.054 against 3.676 / 3.674; the MTP verify 5.151-5.232 against 4.795-4.904; traced, o_proj at two rows took 75.1 us against ~39 on gemv_tile_fp8_r8_m2)",
		hint: `: the two-row GEMVs run gemv_tile_fp8_r8_m2; the code last exists at commit 9b4d269, the record is in docs/measured/h200-2026-12-04-s31 and cuda/kernels/NOTES.md "gemv_tile_fp8_r4_m2_d16"`},
	// TILERT_GPU_SOLO=1|<prefixes> launched the one-row layer's one-block
	// critical-path kernels with all the shared memory a block may have,
	// so each ran alone on its SM; built in session 33, measured slower in
	// session 34, removed.
	{name: "TILERT_GPU_SOLO", keep: zero,
		what: "the one-block critical-path kernels launched alone on their SMs (all of a block's shared memory asked for) were measured slower on the H200 in session 34 call A and removed (decode p50 at 8192, 1 slot, A/B/A/B: DeepSeek-V3.2 dims 2.628 / 2.631 against 2.615 / 2.617 ms, GLM-5 dims 2.700 / 2.701 against 2.685 / 2.685)",
		hint: `: those kernels share their SMs as the block scheduler places them; the code last exists at commit ca46bb0, the record is in docs/measured/h200-2026-12-05-s34 and cuda/kernels/NOTES.md "TILERT_GPU_SOLO"`},
	// TILERT_GPU_OPROJ_NORM=1 ran a one-row layer's o_proj with the
	// post-attention add + RMSNorm in its last tile (one launch,
	// gemv_tile_fp8_r*_m1*_an, kernels.GemvAddNorm); built in session 32,
	// measured slower in session 34, removed.
	{name: "TILERT_GPU_OPROJ_NORM", keep: zero,
		what: "o_proj with the post-attention add + RMSNorm in its last tile (gemv_tile_fp8_r*_m1*_an, one launch) was measured slower on the H200 in session 34 call A and removed (graph-timed 43.24 against 37.97 us for the two launches it replaces at DeepSeek-V3.2's 7168x16384, 39.13 against 31.38 at GLM-5's 6144x16384; decode p50 at 8192, 1 slot, A/B/A/B with TILERT_GPU_IDX_QFUSE=1 also on: DeepSeek-V3.2 dims 2.771 / 2.775 against 2.610 / 2.613 ms, GLM-5 dims 2.871 / 2.873 against 2.690 / 2.688)",
		hint: `: o_proj and the post-attention add + RMSNorm run as two launches (gemv_tile_fp8 then add_rmsnorm_reg); the code last exists at commit e430c60, the record is in docs/measured/h200-2026-12-05-s34 and cuda/kernels/NOTES.md "gemv_tile_fp8_r*_m1*_an"`},
	// TILERT_GPU_ROUTER_FOLD=1 folded each MoE layer's router through
	// o_proj (A x beside the sparse MLA, M v beside o_proj, the routing in
	// the post-attention norm's launch, add_rmsnorm_route); built in
	// session 35, measured slower in session 38, removed.
	{name: "TILERT_GPU_ROUTER_FOLD", keep: zero,
		what: "the router folded through o_proj (router_fold_a / _m at load; its two GEMVs beside the sparse MLA and o_proj, the routing in the post-attention norm's launch, add_rmsnorm_route) was measured slower on the H100 in session 38 call A and removed (the fused launch graph-timed 8.45 against 11.81 us for the three it replaces, but its two fold GEMVs read 24 MB a layer beside the sparse MLA and o_proj; decode p50, A/B/A/B, 1 slot: DeepSeek-V3.2 dims 8192 +6 / +8 us, 131072 +10 / +5; GLM-5 dims 8192 +11 / +15, 131072 +11 / +12; DeepSeek-V3.2 dims 4 slots at 8192 +107 / +110)",
		hint: `: the post-attention add + RMSNorm, the router GEMV and the routing (moe_route_sort) run as three launches (the default); the code last exists at commit bab6987, the record is in docs/measured/h100-2026-12-05-s38 and engine/gpu/NOTES.md "TILERT_GPU_ROUTER_FOLD=1"`},
	// TILERT_GPU_SIDE_SH_AT=router forked the shared expert after the router
	// GEMV, beside the routing alone; built in session 33, measured in
	// session 38 (no gain), removed. =norm named the default fork.
	{name: "TILERT_GPU_SIDE_SH_AT", keep: []string{"norm"},
		what: "the shared expert forked after the router GEMV, beside the routing alone (=router), was measured on the H100 in session 38 call B and removed: no gain (decode p50 at 8192, 1 slot, A/B/A/B: DeepSeek-V3.2 dims 1.730 / 1.727 against 1.728 / 1.731 ms, +2 / -4 us, within spread)",
		hint: ` (or set it to norm): the shared expert forks after the post-attention norm, beside the router GEMV and the routing (the default); the code last exists at commit 4a23dd2, the record is in docs/measured/h100-2026-12-05-s38 and engine/gpu/NOTES.md "TILERT_GPU_SIDE_SH_AT=router"`},
	// TILERT_GPU_IDX_QFUSE=1 ran a one-row step's indexer wq_b GEMV and the
	// attention epilogue as one launch (gemv_tile_fp8_r*_m1*_iq,
	// kernels.WQBIdxQ); built in session 32, measured slower in session 38,
	// removed.
	{name: "TILERT_GPU_IDX_QFUSE", keep: zero,
		what: "a one-row step's wq_b GEMV and attention epilogue in one launch (gemv_tile_fp8_r*_m1*_iq) were measured on the H100 in session 38 call B and removed: slower on GLM-5 dims, no gain on DeepSeek-V3.2's (decode p50 at 8192, 1 slot, A/B/A/B: GLM-5 dims 1.987 / 1.986 against 1.979 / 1.982 ms, +8 / +4 us; DeepSeek-V3.2 dims 1.735 / 1.736 against 1.727 / 1.734, +8 / +2, within spread)",
		hint: `: wq_b's tile GEMV and attn_epilogue run as two launches (the default); the code last exists at commit c3728a6, the record is in docs/measured/h100-2026-12-05-s38, engine/gpu/NOTES.md "TILERT_GPU_IDX_QFUSE=1" and cuda/kernels/NOTES.md "gemv_tile_fp8_r*_m1*_iq"`},
	// TILERT_GPU_L2_EVICT=first marked the weight streams alone evict-first
	// in the L2 (session 47 call C); the keys' loads joined them for the
	// default.
	// =noabsorb kept the absorbed MLA products' weights at normal priority
	// (kernels.AbsorbNormal); built and measured slower in session 48,
	// removed.
	{name: "TILERT_GPU_L2_EVICT", only: []string{"first", "noabsorb"},
		what: "two evict-first variants were measured on the H100 and dropped (decode p50, 9 MoE layers, 1 slot, A/B/A/B): first, the weight streams alone evict-first in the L2 (the indexer keys' loads as before; session 47 calls C-D), faster at 8192 but slower at 131072 (DeepSeek-V3.2 dims 8192 3.178 / 3.184 against 3.216 / 3.217 ms; GLM-5 dims 131072 3.358 / 3.358 against 3.339 / 3.339, +19 / +19 us); noabsorb, the absorbed MLA products' weights (W_UK, W_UV) at normal priority (session 48 call F), slower on every row (DeepSeek-V3.2 dims 8192 3.195 / 3.195 against 3.160 / 3.158 ms, +35 / +37 us; GLM-5 dims 131072 +32 / +27, 8192 +32 / +26; DeepSeek-V3.2 dims 131072 +29 / +28)",
		hint: ` (or set it to nogroup) for the weight streams, the absorbed products and the indexer keys evict-first but the grouped input GEMVs (the default), keys for those evict-first too, or normal for none; the noabsorb code last exists at commit 454f910, the record is in docs/measured/h100-2026-12-06-s47, docs/measured/h100-2026-12-06-s48 and engine/gpu/NOTES.md "TILERT_GPU_L2_EVICT"`},
	// TILERT_GPU_L2_NEXT=group|wqb asked the next layer's input projections
	// (and wq_b) into the L2 beside a MoE layer's routed experts
	// (l2_prefetch on the shared expert's side stream); built and measured
	// slower in session 49, removed.
	{name: "TILERT_GPU_L2_NEXT", keep: zero,
		what: "the next layer's input projections asked into the L2 beside a MoE layer's routed experts (l2_prefetch behind the shared expert's down on its side stream) were measured slower on the H100 in session 49 call A and removed (decode p50, 9 MoE layers, A/B/A/B: =group DeepSeek-V3.2 dims 8192 3.192 / 3.196 against 3.154 / 3.160 ms, +38 / +36 us; GLM-5 dims 8192 +17 / +16, 131072 +22 / +30; 4 slots +30 / +37; =wqb, wq_b too, DeepSeek-V3.2 dims 8192 +63 / +65, GLM-5 dims +31 / +26)",
		hint: `: a layer's input projections read their weights from HBM (the default); the code last exists at commit b538f47, the record is in docs/measured/h100-2026-12-06-s49 and engine/gpu/NOTES.md "Session 49"`},
	// TILERT_GPU_STAGE_CARVEOUT=PCT asked the layer-input grouped GEMVs for
	// PCT% shared memory, so the staged wq_b's blocks could be resident
	// beside them; built in session 53, slower at 100, 60 and 50, removed in
	// session 54.
	{name: "TILERT_GPU_STAGE_CARVEOUT", keep: zero,
		what: "the layer-input grouped GEMVs' shared memory carveout for the staged wq_b beside them was measured slower on H100s and removed in session 54 (decode p50, 9 MoE layers, one expert bank, A/B/A/B: 100 DeepSeek-V3.2 dims 8192 +9 / +7 us, GLM-5 dims 131072 +31 / +26, session 53 call B; GLM-5 dims 8192 60 +23 / +20, 50 +15 / +15, session 54 calls A-B)",
		hint: `: the grouped GEMVs keep the driver's carveout and the staged blocks become resident once they leave (the default); the code last exists at commit 343b9ac, the record is in docs/measured/h100-2026-12-06-s54 and cuda/kernels/NOTES.md "gemv_stage"`},
	// TILERT_GPU_EPI_PRE=1 ran the one-row scaled attention epilogue as
	// attn_epilogue_qsp (its position, RoPE entries and norm weights loaded
	// before its PDL wait); TILERT_GPU_SCORES_PRE=1 the one-row indexer
	// scores as indexer_scores_wgh2p (each warpgroup's first page of keys
	// before the wait). Built and measured in session 50, no gain, removed.
	{name: "TILERT_GPU_EPI_PRE", keep: zero,
		what: "the one-row attention epilogue with its position, RoPE table entries and norm weights loaded before its PDL wait (attn_epilogue_qsp, attn_epilogue_qs's bits) was measured on the H100 in session 50 call A, gained nothing and was removed (decode p50, 9 MoE layers, A/B/A/B: GLM-5 dims 8192 3.188 / 3.187 against 3.181 / 3.188 ms, +7 / -1 us; with TILERT_GPU_SCORES_PRE=1 GLM-5 dims 131072 3.288 / 3.290 against 3.274 / 3.275, +14 / +15, DeepSeek-V3.2 dims 8192 +1 / 0; traced, GLM-5 dims 8192: charged 6.3 us a layer against attn_epilogue_qs's 4.3)",
		hint: `: the epilogue loads everything after its wait (attn_epilogue_qs, the default); the code last exists at commit 3a8fbb2, the record is in docs/measured/h100-2026-12-06-s50 and engine/gpu/NOTES.md "Session 50"`},
	{name: "TILERT_GPU_SCORES_PRE", keep: zero,
		what: "the one-row indexer scores with each warpgroup's first page of keys loaded before its PDL wait (indexer_scores_wgh2p, indexer_scores_wgh2's bits) were measured on the H100 in session 50 call A, gained nothing and were removed (decode p50, 9 MoE layers, A/B/A/B: GLM-5 dims 8192 3.189 / 3.189 against 3.187 / 3.187 ms, +2 / +2 us; with TILERT_GPU_EPI_PRE=1 GLM-5 dims 131072 +14 / +15, DeepSeek-V3.2 dims 8192 +1 / 0; traced, GLM-5 dims 8192: the scores charged 1.8 us a layer against 3.0, the epilogue before them 2.0 more)",
		hint: `: the scores load their keys after the wait (indexer_scores_wgh2, the default); the code last exists at commit 3a8fbb2, the record is in docs/measured/h100-2026-12-06-s50 and engine/gpu/NOTES.md "Session 50"`},
	// TILERT_GPU_MLA_HEADS=16 ran the one-tile decode MLA blocks on 16 heads
	// (mla_decode_wg2q); built in session 31, measured slower in session 38,
	// removed. The switch's other values stay (switchValues).
	{name: "TILERT_GPU_MLA_HEADS", only: []string{"16"},
		what: "the one-tile decode MLA blocks of 16 heads (mla_decode_wg2q) were measured slower on the H100 in session 38 call B and removed (decode p50 at 8192, 1 slot, A/B/A/B: GLM-5 dims 1.980 / 1.982 against 1.976 / 1.974 ms, +4 / +8 us)",
		hint: ` for 32 heads a block (mla_decode_wg2h) on one row of 64 heads and 64 elsewhere (the default), or set it to 32 or 64 for that many everywhere a block takes one tile; the code last exists at commit 43f2b09, the record is in docs/measured/h100-2026-12-05-s38 and cuda/kernels/NOTES.md "mla_decode_wg2h / wg2q"`},
	// TILERT_GPU_SAMPLE_ONE=1 ran the sampled pick as one cooperative launch
	// with grid barriers between its passes (sample_wide_one,
	// kernels.SampleWideOne); built in session 38, measured slower in
	// session 39, removed.
	{name: "TILERT_GPU_SAMPLE_ONE", keep: zero,
		what: "the sampled pick as one cooperative launch with grid barriers (sample_wide_one) was measured slower on the H100 in session 39 call B and removed (graph-timed, 129280 logits, one row: T 0.6 / top-p 0.95 44.38 against 41.73 us for the five launches, T 0.7 / top-k 50 / top-p 0.9 68.82 against 64.77, T 1 10.10 against 8.90; sampled step p50 at 8192, A/B/A/B: DeepSeek-V3.2 dims 1 slot 1.776 / 1.777 against 1.776 / 1.774 ms, GLM-5 dims 2.005 / 2.006 against 2.005 / 2.002, DeepSeek-V3.2 dims 4 slots T 0.7 / k 50 / p 0.9 3.315 / 3.315 against 3.283 / 3.283, +32 us)",
		hint: `: the sampled pick runs kernels.SampleWide's five launches (sample_wide_max, the sample_wide_hist passes, sample_wide_draw; the default); the code last exists at commit e79e3e4, the record is in docs/measured/h100-2026-12-05-s39, engine/gpu/NOTES.md "TILERT_GPU_SAMPLE_ONE=1" and cuda/kernels/NOTES.md "sample_wide_one"`},
	// TILERT_GPU_EMBED_VEC=1 (session 39) issued an embedding row's loads
	// before its stores; session 40 measured it faster and made it the
	// embedding kernels' only form, so =0's element loop is gone.
	{name: "TILERT_GPU_EMBED_VEC", keep: []string{"1"},
		what: "the embedding's element loop (=0) was removed in session 40: the row's 16-byte loads issued before its stores measured faster on the H200 (decode p50 at 8192, 9 MoE layers, A/B/A/B: DeepSeek-V3.2 dims 2.602 / 2.603 -> 2.596 / 2.595 ms, GLM-5 dims 2.658 / 2.657 -> 2.647 / 2.648)",
		hint: `: embed_bf16 and embed_bf16_checked issue a row's loads before its stores (the only form); the element loop last exists at d8d9211, the record is in docs/measured/h200-2026-12-05-s40 and cuda/kernels/NOTES.md "embed_bf16_v"`},
	// TILERT_GPU_MTP_PAIRS=1 (session 46) ran a pipelined MTP step's MTP
	// layer over both candidate rows of every slot, launched behind the
	// verify's picks before they reached the host (engine.PairsAhead,
	// mtp_pair_select); measured slower in session 46 once the MTP head
	// ran in one launch, removed.
	{name: "TILERT_GPU_MTP_PAIRS", keep: zero,
		what: "the MTP forward over both candidate rows of every slot, launched before the verify's picks reach the host (engine.PairsAhead, mtp_pair_select), was measured slower on the H100 in session 46 and removed (MTP step p50 at 8192, 3 MoE layers, A/B/A/B: DeepSeek-V3.2 dims 1 slot 3.264 / 3.264 against 3.205 / 3.212 ms, 4 slots 6.372 / 6.371 against 5.981 / 5.978): the host round trip it hides (~80 us) costs less than the MTP layer and head over twice the rows",
		hint: `: the host takes the verify's picks, then launches the MTP forward over the rows it keeps (the default); the code last exists at commit 40299cf, the record is in docs/measured/h100-2026-12-06-s46 and engine/gpu/NOTES.md "Session 46"`},
	// TILERT_GPU_GEMM_H2=1 ran a prefill chunk's fp8 GEMMs on x split into
	// fp16 parts (gemm_h2.cu; TILERT_GPU_GEMM_H2_PARTS 2 or 3), opt-in
	// since session 4: no faster than the three bf16 parts and past the
	// tiny models' cache bound; removed in session 55 with its 9 kernels.
	{name: "TILERT_GPU_GEMM_H2", keep: zero, what: gemmH2What, hint: gemmH2Hint},
	{name: "TILERT_GPU_GEMM_H2_PARTS", what: gemmH2What, hint: gemmH2Hint},
	// Session 63 measured four opt-ins on an H100 (sessions 62-63's, none
	// the default) slower or no faster, and removed them.
	{name: "TILERT_GPU_QB_STAGE", keep: zero,
		what: "qb_absorb's W_UK slice staged in shared memory (=1) or read in one round trip (=2), its RoPE entries read before q_b and every absorb kernel's query rotation rounded product by product, was measured slower on an H100 in session 63 call A and removed (decode p50, DeepSeek-V3.2 dims, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: =1 3.115 / 3.118 against 3.090 / 3.091 ms, +25 / +27 us; =2 3.126 / 3.123 against 3.094 / 3.089, +32 / +34)",
		hint: `: qb_absorb reads W_UK a column block a round trip after q_b (the default); the code last exists at commit 116e252, the record is in docs/measured/h100-2026-12-07-s63 and cuda/kernels/NOTES.md "qb_absorb's W_UK rows off the chain"`},
	{name: "TILERT_GPU_MLA_CLUSTER", keep: zero,
		what: "the one-tile decode MLA's partials merged in clusters of 8 ranges over distributed shared memory (mla_decode_wg2bc / wg2hc) was measured no faster or slower on an H100 in session 63 call A and removed (decode p50, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: DeepSeek-V3.2 dims 3.092 / 3.092 against 3.092 / 3.093 ms, 0 / -1 us; GLM-5 dims 3.162 / 3.163 against 3.134 / 3.135, +28 / +28; the MLA's blocks ran 16.2 against 11.6 us)",
		hint: `: every block writes its float32 partial for mla_combine_wide (the default); the code last exists at commit 116e252, the record is in docs/measured/h100-2026-12-07-s63 and cuda/kernels/NOTES.md "mla_decode_wg2bc / wg2hc"`},
	{name: "TILERT_GPU_POST_NORM",
		what: "a one-row step's post-attention add + RMSNorm on the MoE close's 8-block cluster launch (=cl, session 62) was measured slower on an H100 in session 63 call B and removed (decode p50, DeepSeek-V3.2 dims, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: 3.100 / 3.102 against 3.094 / 3.090 ms, +6 / +12 us)",
		hint: `: the post-attention norm runs on add_rmsnorm_reg (the default); the code last exists at commit 116e252, the record is in docs/measured/h100-2026-12-07-s63 and engine/gpu/NOTES.md "Session 62"`},
	{name: "TILERT_GPU_MLA_SPLITS",
		what: "a cap on mla_decode_wg2's token ranges (=8|16, session 62) was measured slower on an H100 in session 63 call B and removed (decode p50, DeepSeek-V3.2 dims, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: =16 3.115 / 3.115 against 3.091 / 3.088 ms, +24 / +27 us)",
		hint: `: the ranges fill the SMs once, at most 32 (kernels.MLAWG2Splits, the default); the code last exists at commit 116e252, the record is in docs/measured/h100-2026-12-07-s63 and engine/gpu/NOTES.md "Session 62"`},
	// Session 64 measured two opt-ins on an H100 (call A) slower or no
	// faster, and removed them.
	{name: "TILERT_GPU_QB_ONE", keep: zero,
		what: "qb_absorb's one-barrier forms (_1: the four absorbed column blocks' warp partials in four shared buffers, one barrier, the same bits) were measured slower on an H100 in session 64 call A and removed (decode p50, DeepSeek-V3.2 dims, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: 3.102 / 3.104 against 3.088 / 3.092 ms, +14 / +12 us; traced, the absorption 6.6 us after q_b's rows against 6.0)",
		hint: `: qb_absorb sums each column block behind a barrier pair (the default); the code last exists at commit ` + s64Code + `, the record is in docs/measured/h100-2026-12-08-s64 and engine/gpu/NOTES.md "Session 64"`},
	{name: "TILERT_GPU_SIDE_PDL", only: []string{"q"},
		what: "the q chain's side launches programmatic and the shared expert's plain (=q) were measured no faster or slower on an H100 in session 64 call A and removed (decode p50, 8192, 9 MoE layers, one expert bank, 1 slot, A/B/A/B: DeepSeek-V3.2 dims 3.090 / 3.091 against 3.092 / 3.091 ms, -2 / 0 us; GLM-5 dims 3.151 / 3.151 against 3.137 / 3.137, +14 / +14): the fork's edge through an event stays a full one in the captured graph whatever the launch's attribute, so qb_absorb's launch did not move",
		hint: ` for the side stream's launches plain (the default), or set it to 1 for all of them programmatic; TILERT_GPU_SIDE_EDGE=1 forks the q chain on a programmatic edge; the code last exists at commit ` + s64Code + `, the record is in docs/measured/h100-2026-12-08-s64 and engine/gpu/NOTES.md "Session 64"`},
	// TILERT_GPU_MLA_TC32=1 ran the tensor-core MLA decode with 32 heads a
	// block (mla_decode_tc32), the same bits as mla_decode_tc; no faster in
	// session 4, and the decode has run tcf2 / wg2 / wg2b since session 6.
	{name: "TILERT_GPU_MLA_TC32", keep: zero,
		what: "the tensor-core MLA decode with 32 heads a block (mla_decode_tc32) was removed in session 55: measured on the H200 it was no faster than mla_decode_tc at 16 heads a block (128 heads x 2048 tokens, 1 row, with the combine: 24.60 against 24.30 us at 32 splits, 37.36 / 30.62 at 16 / 64), and the decode runs mla_decode_wg2b / wg2 / tcf2 since",
		hint: `: the MLA decode runs mla_decode_wg2b, mla_decode_wg2 or mla_decode_tcf2 by its shape (the default); the code last exists at commit 4020bd8, the record is in docs/measured/h200-2026-12-01-idxmla and cuda/kernels/NOTES.md "Indexer top-k candidate list, MLA query staging"`},
}

// s64Code is the commit where session 64's removed switches last exist.
const s64Code = "66528df"

// zero: the switch's =0 asked for the path that runs, by name.
var zero = []string{"0"}

// Texts shared by more than one entry of removedTable.
const (
	clusterMLAMeasured = "measured on the H200 it was slower than mla_decode_tcf2 with its combine at every shape " +
		"(1 x 128 heads: tcq8/tcq16 36.4/46.3 us, tcfq8/tcfq16 28.5/37.8 us against 17.50; " +
		"16 heads: 36.0/23.5 and 28.1/19.1 us against 11.02; 4 x 128 heads: tcq4 127 us, tcfq4 99 us against 44.98)"
	clusterMLARecord = `; the record is in cuda/kernels/NOTES.md "Sparse MLA with fp16 fragments from the raw fp8 tiles", the code last in commit 0781d7c`
	moePersistWhat   = "the persistent MoE kernel (moe_persist) was removed in session 11: measured on the H200 it was slower than the chain of launches (138.98 against 129.92 us at DeepSeek-V3.2 dims, 58.62 against 45.76 us on the TP-8 shard)"
	moePersistHint   = `: the MoE half runs as the chain of launches; the record is in cuda/kernels/NOTES.md "Persistent MoE half"`
	l2pfWhat         = "the L2 weight prefetch (attn_epilogue_pf, add_rmsnorm_pf) was removed in session 12: measured on the H200 it was slower (decode step at 8192 3.012 against 2.998 ms; attention tail 99.54-104.86 against 97.61 us with 0-48 MB of o_proj prefetched; layer end 39.29 against 38.00 us)"
	l2pfHint         = `: nothing is prefetched; the record is in cuda/kernels/NOTES.md "Small per-layer kernels" and docs/measured/h200-2026-12-01-s4-round2; the code last exists at commit 0781d7c`
	idxRecord        = "; the code last exists at commit 99c4e9a, the record is in docs/measured/h200-2026-12-03-s15 and cuda/kernels/NOTES.md "
	gemmH2What       = "the fp16-part fp8 GEMMs of a prefill chunk (gemm_split_h2, gemm_fp8_h2, gemm_fp8_experts_h2) were removed in session 55: on the H200 their three parts ran no faster than the three bf16 parts (89 against 91 TFLOP/s at 2048 rows), and with two or three parts glm-5-tiny's prefill caches differed from the CPU's in 1.26-1.55% of bytes against a bound of 1% (session 4)"
	gemmH2Hint       = `: a prefill chunk's fp8 GEMMs run gemm_tc.cu's three bf16 parts (the default) or, with --prefill-precision fast, gemm_p1.cu's one part; the code last exists at commit ed1487e, the record is in docs/measured/h200-2026-12-01-s4-pfill2 and cuda/kernels/NOTES.md "gemm_h2 removed (session 55)"`
)

// removedSwitches refuses the first switch of removedTable set to a value
// whose code was removed. getenv is os.Getenv outside tests.
func removedSwitches(getenv func(string) string) error {
	for _, r := range removedTable {
		v := getenv(r.name)
		if v == "" || slices.Contains(r.keep, v) || r.only != nil && !slices.Contains(r.only, v) {
			continue
		}
		return errors.WithHint(errors.Newf("%s=%q: %s", r.name, v, r.what), "unset "+r.name+r.hint)
	}
	return nil
}

func removedSwitchesEnv() error {
	if err := removedSwitches(os.Getenv); err != nil {
		return err
	}
	return switchValues(os.Getenv)
}

// switchValues refuses a value a kept switch does not know, so that a typo
// is not measured as the default path.
func switchValues(getenv func(string) string) error {
	for _, sw := range []struct {
		name  string
		known []string
		hint  string
	}{
		{"TILERT_GPU_GEMV_MMA", []string{"", "0", "1", "all", "g", "g1", "g3", "u2"},
			"unset it for run 2's tensor-core GEMVs of 2..8 rows (the default); 1 run 1's choices, 0 the tile kernels, all every shape, g1 / g3 the attention-input group from 1 / 3 rows (g: the default's 2), u2 session 18's group (u2 kernel from 3 rows) (engine/gpu/device.go)"},
		{"TILERT_GPU_MLA_WG", []string{"", "0", "1"},
			"unset it for the decode MLA on mla_decode_wg2 where it measured faster (64 heads or more), 1 for every launch, 0 for mla_decode_tcf2"},
		{"TILERT_GPU_L2_EVICT", []string{"", "normal", "keys", "nogroup"},
			"unset it (or nogroup) for the weight streams' and the indexer keys' loads evict-first in the L2 but the grouped input GEMVs' (kernels.EvictFirst and GroupNormal, the default since session 48), keys for those evict-first too (session 47's default), normal for the loads before session 47"},
		{"TILERT_GPU_WHOLE_CHUNKS", []string{"", "0", "1"},
			"unset it (or 1) for a single row's dense 1536-byte fp8 rows (q_b and wq_b of DeepSeek-V3.2 dims) on 32-thread groups, whole chunks a thread (kernels.OneRowWholeChunks, session 49), 0 for the tile rule's 64"},
		{"TILERT_GPU_MLA_WG2B", []string{"", "0", "1"},
			"unset it (or 1) for mla_decode_wg2b (mla_decode_wg2's bits, shorter latency chains), 0 for session 19's mla_decode_wg2"},
		{"TILERT_GPU_TOPK_W12", []string{"", "0", "1"},
			"unset it (or 1) for topk_radix_one_w12 on rows of 8193..12288 keys (kernels.TopKOneW12, the default since session 38), 0 for the 16-key one-block top-k there"},
		{"TILERT_GPU_MLA_HEADS", []string{"", "64", "32", "0"},
			"unset it for 32 heads a one-tile decode MLA block on one row of 64 heads (GLM-5) and 64 elsewhere (kernels.MLAHeadsPerBlock, the default since session 38); 64 or 32 for that many everywhere a block takes one tile; 0 (with TILERT_GPU_MLA_WG=0 TILERT_GPU_MLA_TC=0) for mla_decode's one block a head, for comparisons"},
		{"TILERT_GPU_IDX_WGH", []string{"", "0", "1", "2", "2short", "long"},
			"unset it (or 2) for the indexer scores on indexer_scores_wgh (wgmma with the keys as M, sm_90a), launches of fewer than 2^19 keys on its two-warpgroup blocks (the default); 2short for the two-warpgroup blocks at 65536 keys or fewer only; long for indexer_scores_wgh over 65536 keys a launch only, 1 for indexer_scores_wgh everywhere, 0 for indexer_scores_mma_pf everywhere"},
		{"TILERT_GPU_PIPELINE", []string{"", "0", "1", "2"},
			"unset it (or 2) for pipelined plain and MTP steps (the next step's forward queued before the host reads the picks; MTP steps since session 38), 1 for plain steps only, 0 for none"},
		{"TILERT_GPU_EPI_ROWS", []string{"", "0", "1"},
			"unset it (or 1) for one attention-epilogue launch across slots, 0 for a launch per slot"},
		{"TILERT_GPU_EXPERT_SHAPE", []string{"", "0", "1", "30", "o4", "d16"},
			"unset it (or 1) for a single row's routed-expert launches on their own shapes (kernels.OneRowExperts: gate/up on _o4 on an H200, down on groups of 32 where its last wave is fuller; session 48), 30 for session 30's (gate/up _o4 and down groups of 32 on every card), o4 or d16 for the default with the gate/up on that variant on every card, 0 for the tile rule's"},
		{"TILERT_GPU_ROUTE_SORT", []string{"", "0", "1"},
			"unset it (or 1) for the routing on moe_route_sort, each warp's experts sorted in registers first (kernels.RouteSort, the default since session 52); 0 for moe_route_rank, the same outputs"},
		{"TILERT_GPU_BLOCK_CLOCKS", []string{"", "0", "1"},
			"unset it (or 0) for the kernels as they ship; 1 compiles them with block clocks, which a traced step (bench decode --timeline) reads: each block's entry, release from its PDL wait and exit (a diagnostic; kernels.BlockClocks)"},
		{"TILERT_GPU_WQB_STAGE", []string{"", "0", "1"},
			"unset it (or 1) for a one-row step's indexer wq_b on the staged GEMV (its weights into shared memory before its PDL wait: wqb.go, the default since session 53), 0 for the tile rule's kernel"},
		{"TILERT_GPU_MOE_NORM_FUSED", []string{"", "0", "1"},
			"unset it (or 1) for a decode MoE layer's combine fused with the next add + RMSNorm (one launch), 0 for the two launches"},
		{"TILERT_GPU_MOE_UNIQUE", []string{"", "0", "1", "x"},
			"unset it for every round of 2 or more rows' routed experts grouped by expert on the tensor-core kernel where the dense GEMVs of several rows take the tensor cores (the real models' dims), else rounds of 3 or 4 rows on the tile kernels (each expert's weights stream once for the rows that share it; moe_unique.go); 1 for every round of 2 or more rows on the tile kernels, x on the tensor-core kernel, 0 for the per-slot launches"},
		{"TILERT_GPU_OPROJ_SPLIT", []string{"", "0", "1"},
			"unset it (or 0) for a one-row step's o_proj as one GEMV; 1 for split-K slices on the routed down's shape, summed by the post-attention add + RMSNorm's launch (osplit.go)"},
		{"TILERT_GPU_QB_ABSORB", []string{"", "0", "1", "2"},
			"unset it for a one-row step's q_b and query absorption as one launch, a block a head, where the heads give 3/4 of the SMs a block and no row is past 32768 keys (qb_absorb.go); 1 or 2 for one or a cluster of two blocks a head wherever the kernel takes the shape; 0 for the two launches"},
		{"TILERT_GPU_QB_ABSORB_PF", []string{"", "0", "1"},
			"unset it (or 0) for TILERT_GPU_QB_ABSORB's blocks without an L2 prefetch; 1 for each block asking its W_UK slice into the L2 while q_b streams"},
		{"TILERT_GPU_SIDE_EDGE", []string{"", "0", "1"},
			"unset it (or 0) for the side stream's q chain forked on a full graph edge; 1 for a one-row step's q chain's first waiting launch on a programmatic edge from the grouped input GEMV (side.go sideEdgeOn)"},
		{"TILERT_GPU_SIDE_PDL", []string{"", "0", "1"},
			"unset it (or 0) for the side stream's kernels launched plainly (the default since session 14); 1 for every side launch programmatic"},
		{"TILERT_GPU_SIDE_SH_ONCE", []string{"", "0", "1"},
			"unset it for the side stream's shared expert read once for all rows of a step where the dense GEMVs of several rows take the tensor cores (the real models' dims), else a dense slot a row; 1 for once everywhere, 0 for a dense slot a row everywhere (moe_unique.go)"},
	} {
		if v := getenv(sw.name); !slices.Contains(sw.known, v) {
			return errors.WithHint(errors.Newf("%s=%q: not a value this switch knows", sw.name, v), sw.hint)
		}
	}
	return nil
}
