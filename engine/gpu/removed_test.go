package gpu

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
)

// TestRemovedSwitchRefused: the switches of removed paths (removed.go) are
// refused with an error naming the measurement and a hint naming the
// record (removedSays); unset, and the values that still mean a kept path,
// pass. The last part sets the environment and checks that backend
// creation itself refuses.
func TestRemovedSwitchRefused(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		fail string // part of the error's message, "" where it is accepted
	}{
		{nil, ""},
		{map[string]string{"TILERT_GPU_MOE_PERSIST": "0"}, ""},
		{map[string]string{"TILERT_GPU_MOE_PERSIST": "1"}, `TILERT_GPU_MOE_PERSIST="1"`},
		{map[string]string{"TILERT_GPU_MOE_PERSIST": "2"}, `TILERT_GPU_MOE_PERSIST="2"`},
		{map[string]string{"TILERT_GPU_MOE_PERSIST": "1", "TILERT_GPU_MOE_PERSIST_V": "d16"}, `TILERT_GPU_MOE_PERSIST="1"`},
		{map[string]string{"TILERT_GPU_MOE_PERSIST_V": "b3"}, `TILERT_GPU_MOE_PERSIST_V="b3"`},
		{map[string]string{"TILERT_GPU_MOE_PERSIST_V": "0"}, `TILERT_GPU_MOE_PERSIST_V="0"`},
		{map[string]string{"TILERT_GPU_MOE": "1", "TILERT_GPU_PERSIST": "1"}, ""},
		{map[string]string{"TILERT_GPU_SIDE_MOE": "route"}, `TILERT_GPU_SIDE_MOE="route"`},
		{map[string]string{"TILERT_GPU_SIDE_MOE": "0"}, `TILERT_GPU_SIDE_MOE="0"`},
		{map[string]string{"TILERT_GPU_SIDE": "moe"}, ""},
		{map[string]string{"TILERT_GPU_ROUTE_FUSED": "1"}, `TILERT_GPU_ROUTE_FUSED="1"`},
		{map[string]string{"TILERT_GPU_ROUTE_FUSED": "0"}, ""},
		{map[string]string{"TILERT_GPU_ROUTER_SMEM": "1"}, `TILERT_GPU_ROUTER_SMEM="1"`},
		{map[string]string{"TILERT_GPU_ROUTER_SMEM": "0"}, ""},
		{map[string]string{"TILERT_GPU_ABSORB_V_PRE": "1"}, `TILERT_GPU_ABSORB_V_PRE="1"`},
		{map[string]string{"TILERT_GPU_ABSORB_V_PRE": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_QPRO": "1"}, `TILERT_GPU_IDX_QPRO="1"`},
		{map[string]string{"TILERT_GPU_IDX_QPRO": "0"}, ""},
		{map[string]string{"TILERT_GPU_ABSORB_COMB": "1"}, `TILERT_GPU_ABSORB_COMB="1"`},
		{map[string]string{"TILERT_GPU_ABSORB_COMB": "0"}, ""},
		{map[string]string{"TILERT_GPU_TOPK_FAST": "0"}, ""},
		{map[string]string{"TILERT_GPU_TOPK_FAST": "1"}, ""},
		{map[string]string{"TILERT_GPU_TOPK_FAST": "2"}, `TILERT_GPU_TOPK_FAST="2"`},
		{map[string]string{"TILERT_GPU_NORM_FUSE": "0"}, ""},
		{map[string]string{"TILERT_GPU_NORM_FUSE": "1"}, `TILERT_GPU_NORM_FUSE="1"`},
		{map[string]string{"TILERT_GPU_NORM_FUSE": "2"}, `TILERT_GPU_NORM_FUSE="2"`},
		{map[string]string{"TILERT_GPU_NORM_FUSE": "on"}, `TILERT_GPU_NORM_FUSE="on"`},
		{map[string]string{"TILERT_GPU_L2PF": "0"}, ""},
		{map[string]string{"TILERT_GPU_L2PF": "1"}, `TILERT_GPU_L2PF="1"`},
		{map[string]string{"TILERT_GPU_L2PF": "attn"}, `TILERT_GPU_L2PF="attn"`},
		{map[string]string{"TILERT_GPU_L2PF": "in"}, `TILERT_GPU_L2PF="in"`},
		{map[string]string{"TILERT_GPU_L2PF_OPROJ_MB": "16"}, `TILERT_GPU_L2PF_OPROJ_MB="16"`},
		{map[string]string{"TILERT_GPU_L2PF_OPROJ_MB": "0"}, `TILERT_GPU_L2PF_OPROJ_MB="0"`},
		{map[string]string{"TILERT_GPU_L2PF": "0", "TILERT_GPU_L2PF_OPROJ_MB": "32"}, `TILERT_GPU_L2PF_OPROJ_MB="32"`},
		{map[string]string{"TILERT_GPU_L2": "1", "TILERT_GPU_PF": "1"}, ""},
		{map[string]string{"TILERT_GPU_MLA_TCQ": "0"}, ""},
		{map[string]string{"TILERT_GPU_MLA_TCF": "2"}, ""},
		{map[string]string{"TILERT_GPU_MLA_TCF": "8"}, ""},
		{map[string]string{"TILERT_GPU_MLA_TCF": "0"}, ""},
		{map[string]string{"TILERT_GPU_MLA_TCQ": "1"}, `TILERT_GPU_MLA_TCQ="1"`},
		{map[string]string{"TILERT_GPU_MLA_TCQ": "yes"}, `TILERT_GPU_MLA_TCQ="yes"`},
		{map[string]string{"TILERT_GPU_MLA_TCF": "q"}, `TILERT_GPU_MLA_TCF="q"`},
		{map[string]string{"TILERT_GPU_IDX_LONG": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_LONG": "1"}, `TILERT_GPU_IDX_LONG="1"`},
		{map[string]string{"TILERT_GPU_GROUP_SPLIT": "0"}, ""},
		{map[string]string{"TILERT_GPU_GROUP_SPLIT": "1"}, `TILERT_GPU_GROUP_SPLIT="1"`},
		{map[string]string{"TILERT_GPU_L2WARM": "0"}, ""},
		{map[string]string{"TILERT_GPU_L2WARM": "25"}, `TILERT_GPU_L2WARM="25"`},
		{map[string]string{"TILERT_GPU_TILE_M2": "0"}, ""},
		{map[string]string{"TILERT_GPU_TILE_M2": "d16"}, `TILERT_GPU_TILE_M2="d16"`},
		{map[string]string{"TILERT_GPU_SOLO": "0"}, ""},
		{map[string]string{"TILERT_GPU_SOLO": "topk_radix_one"}, `TILERT_GPU_SOLO="topk_radix_one"`},
		{map[string]string{"TILERT_GPU_OPROJ_NORM": "0"}, ""},
		{map[string]string{"TILERT_GPU_OPROJ_NORM": "1"}, `TILERT_GPU_OPROJ_NORM="1"`},
		{map[string]string{"TILERT_GPU_ROUTER_FOLD": "0"}, ""},
		{map[string]string{"TILERT_GPU_ROUTER_FOLD": "1"}, `TILERT_GPU_ROUTER_FOLD="1"`},
		{map[string]string{"TILERT_GPU_SIDE_SH_AT": "norm"}, ""},
		{map[string]string{"TILERT_GPU_SIDE_SH_AT": "router"}, `TILERT_GPU_SIDE_SH_AT="router"`},
		{map[string]string{"TILERT_GPU_IDX_QFUSE": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_QFUSE": "1"}, `TILERT_GPU_IDX_QFUSE="1"`},
		{map[string]string{"TILERT_GPU_MLA_HEADS": "32"}, ""},
		{map[string]string{"TILERT_GPU_MLA_HEADS": "64"}, ""},
		{map[string]string{"TILERT_GPU_MLA_HEADS": "0"}, ""},
		{map[string]string{"TILERT_GPU_MLA_HEADS": "16"}, `TILERT_GPU_MLA_HEADS="16"`},
		{map[string]string{"TILERT_GPU_L2_EVICT": "normal"}, ""},
		{map[string]string{"TILERT_GPU_L2_EVICT": "first"}, `TILERT_GPU_L2_EVICT="first"`},
		{map[string]string{"TILERT_GPU_SAMPLE_ONE": "0"}, ""},
		{map[string]string{"TILERT_GPU_SAMPLE_ONE": "1"}, `TILERT_GPU_SAMPLE_ONE="1"`},
		{map[string]string{"TILERT_GPU_SAMPLE_ONE": "yes"}, `TILERT_GPU_SAMPLE_ONE="yes"`},
		{map[string]string{"TILERT_GPU_EMBED_VEC": "1"}, ""},
		{map[string]string{"TILERT_GPU_EMBED_VEC": "0"}, `TILERT_GPU_EMBED_VEC="0"`},
		{map[string]string{"TILERT_GPU_IDX_ONE": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_ONE": "1"}, `TILERT_GPU_IDX_ONE="1"`},
		{map[string]string{"TILERT_GPU_IDX_ONE": "plain"}, `TILERT_GPU_IDX_ONE="plain"`},
		{map[string]string{"TILERT_GPU_IDX_F8": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_F8": "1"}, `TILERT_GPU_IDX_F8="1"`},
		{map[string]string{"TILERT_GPU_IDX_F8": "wg"}, `TILERT_GPU_IDX_F8="wg"`},
		{map[string]string{"TILERT_GPU_IDX_MMA": "0", "TILERT_GPU_TOPK_ONE": "0"}, ""},
		{map[string]string{"TILERT_GPU_TOPK_ONE": "1"}, ""},
		{map[string]string{"TILERT_GPU_IDX_SCALE_LATE": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_SCALE_LATE": "1"}, `TILERT_GPU_IDX_SCALE_LATE="1"`},
		{map[string]string{"TILERT_GPU_IDX_NOPF": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_NOPF": "1"}, `TILERT_GPU_IDX_NOPF="1"`},
		{map[string]string{"TILERT_GPU_IDX_CP": "0"}, ""},
		{map[string]string{"TILERT_GPU_IDX_CP": "2"}, `TILERT_GPU_IDX_CP="2"`},
		{map[string]string{"TILERT_GPU_GROUP_NN": "0"}, ""},
		{map[string]string{"TILERT_GPU_GROUP_NN": "2"}, `TILERT_GPU_GROUP_NN="2"`},
		{map[string]string{"TILERT_GPU_ROUTE_IN_GEMV": "0"}, ""},
		{map[string]string{"TILERT_GPU_ROUTE_IN_GEMV": "1"}, `TILERT_GPU_ROUTE_IN_GEMV="1"`},
		{map[string]string{"TILERT_GPU_TOPK_ONE": "v1"}, `TILERT_GPU_TOPK_ONE="v1"`},
		{map[string]string{"TILERT_GPU_TOPK_ONE": "0", "TILERT_GPU_TOPK_FAST": "2"}, `TILERT_GPU_TOPK_FAST="2"`},
		{map[string]string{"TILERT_GPU_FUSE": "0"}, ""},
		{map[string]string{"TILERT_GPU_FUSE": "1"}, ""},
		{map[string]string{"TILERT_GPU_FUSE": "2"}, `TILERT_GPU_FUSE="2"`},
		{map[string]string{"TILERT_GPU_FUSE": "3"}, `TILERT_GPU_FUSE="3"`},
		{map[string]string{"TILERT_GPU_GEMV_MMA": "all"}, ""},
		{map[string]string{"TILERT_GPU_GEMV_MMA": "u2"}, ""},
		{map[string]string{"TILERT_GPU_GEMV_MMA": "x"}, `TILERT_GPU_GEMV_MMA="x"`},
		{map[string]string{"TILERT_GPU_GEMV_MMA": "xall"}, `TILERT_GPU_GEMV_MMA="xall"`},
	} {
		err := removedSwitches(func(k string) string { return c.env[k] })
		if c.fail == "" {
			if err != nil {
				t.Errorf("%v: %v, want no error", c.env, err)
			}
			continue
		}
		checkRemovedErr(t, fmt.Sprint(c.env), err, c.fail)
	}

	cfg := synthConfig(t, "deepseek-v3.2-tiny")
	t.Setenv("TILERT_GPU_MOE_PERSIST", "1")
	e, err := NewEmulated(Dummy(cfg, 3), engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
	if err == nil {
		e.Close()
	}
	checkRemovedErr(t, "NewEmulated with TILERT_GPU_MOE_PERSIST=1", err, `TILERT_GPU_MOE_PERSIST="1"`)
	t.Setenv("TILERT_GPU_MOE_PERSIST", "")
	t.Setenv("TILERT_GPU_L2PF", "1")
	e, err = NewEmulated(Dummy(cfg, 3), engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
	if err == nil {
		e.Close()
	}
	checkRemovedErr(t, "NewEmulated with TILERT_GPU_L2PF=1", err, `TILERT_GPU_L2PF="1"`)
	t.Setenv("TILERT_GPU_L2PF", "")
	t.Setenv("TILERT_GPU_IDX_F8", "wg")
	e, err = NewEmulated(Dummy(cfg, 3), engine.Options{Mode: engine.ModeServing, Slots: 1, MaxSeqLen: 64})
	if err == nil {
		e.Close()
	}
	checkRemovedErr(t, "NewEmulated with TILERT_GPU_IDX_F8=wg", err, `TILERT_GPU_IDX_F8="wg"`)
}

// TestRemovedTable: every entry of removedTable, set alone, is refused for
// a value outside its kept ones (or for each of its only ones) with its
// name, its measurement and its hint (removedSays), and accepted unset and
// at each kept value. Every entry must also be pinned in removedGolden.
func TestRemovedTable(t *testing.T) {
	pinned := map[string]bool{}
	for _, c := range removedGolden {
		pinned[c.name] = true
	}
	seen := map[string]bool{}
	for _, r := range removedTable {
		if seen[r.name] {
			t.Errorf("%s: twice in removedTable", r.name)
		}
		seen[r.name] = true
		if r.keep != nil && r.only != nil || r.what == "" || r.hint == "" {
			t.Errorf("%s: want keep or only (not both), and what and hint", r.name)
		}
		if !pinned[r.name] {
			t.Errorf("%s: not in removedGolden (add it, then go test -run RemovedGolden -update)", r.name)
		}
		alone := func(v string) error {
			return removedSwitches(func(k string) string {
				if k == r.name {
					return v
				}
				return ""
			})
		}
		refused, kept := r.only, append([]string{""}, r.keep...)
		if r.only == nil {
			for _, v := range []string{"1", "2", "on", "0"} {
				if !slices.Contains(r.keep, v) {
					refused = append(refused, v)
				}
			}
		} else {
			kept = append(kept, "0", "1") // the kept switch's own values
		}
		for _, v := range refused {
			w := fmt.Sprintf("%s=%q", r.name, v)
			checkRemovedErr(t, w, alone(v), w)
		}
		for _, v := range kept {
			if err := alone(v); err != nil {
				t.Errorf("%s=%q: %v, want no error", r.name, v, err)
			}
		}
	}
}

// removedSays is what each removed switch's refusal must name: parts of
// the message (the measurement) and of the hint (what to do, where the
// record is), by the switch's name.
var removedSays = map[string][2][]string{
	"TILERT_GPU_ROUTER_SMEM": {{"removed in session 22", "7.00 against 3.34 us", "2.719 against 2.665 ms"},
		{"unset TILERT_GPU_ROUTER_SMEM", "27f493f", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_ABSORB_V_PRE": {{"removed in session 22", "2.719 against 2.710 ms"},
		{"unset TILERT_GPU_ABSORB_V_PRE", "ca9fc3f", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_IDX_QPRO": {{"removed in session 22", "13.66 against 6.74 us", "2.764 against 2.717"},
		{"unset TILERT_GPU_IDX_QPRO", "7599143", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_IDX_SCALE_LATE": {{"removed in session 24", "12.06 against 11.41 us", "2.852 / 2.854 against 2.845 / 2.843"},
		{"unset TILERT_GPU_IDX_SCALE_LATE", "da477d2", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_IDX_NOPF": {{"session 25", "12.96 against _pf's 11.50 us", "2.869 / 2.868 against 2.849 / 2.847"},
		{"unset TILERT_GPU_IDX_NOPF", "6af7a79", "h200-2026-12-04-s25"}},
	"TILERT_GPU_IDX_CP": {{"session 27", "14.42 (=1) and 14.48 (=2) against _pf's 11.39 us", "2.850 / 2.850 (=1)", "2.948 / 2.947"},
		{"unset TILERT_GPU_IDX_CP", "6348421", "h200-2026-12-04-s27"}},
	"TILERT_GPU_GROUP_NN": {{"session 25", "9.69 us for gemv_group_r8_m1 against 9.18", "2.712 / 2.713 against 2.694 / 2.693"},
		{"unset TILERT_GPU_GROUP_NN", "ba59126", "h200-2026-12-04-s25"}},
	"TILERT_GPU_ROUTE_IN_GEMV": {{"removed in session 23", "85.13 against 71.03 us", "2.785 against 2.661 ms", "2.892 against 2.699"},
		{"unset TILERT_GPU_ROUTE_IN_GEMV", "6ef9bd6", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_TOPK_ONE": {{"removed in session 22", "topk_radix_one8/16/32", "13.40 -> 6.19 us", "2.692 -> 2.688 ms", "5.597 -> 5.523", "2.745 -> 2.717", "5.360 -> 5.316"},
		{"unset TILERT_GPU_TOPK_ONE", "topk_radix_one_w", "set it to 0", "e0514ba", "cuda/kernels/NOTES.md", `"topk_radix_one_w"`}},
	"TILERT_GPU_ROUTE_FUSED": {{"removed in session 20", "7.71 -> 8.45 us", "10.75 -> 24.30"},
		{"unset TILERT_GPU_ROUTE_FUSED", "5643518", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_ABSORB_COMB": {{"removed in session 20", "2.720 against 2.657 ms"},
		{"unset TILERT_GPU_ABSORB_COMB", "5048476", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_MOE_PERSIST": {{"removed in session 11", "138.98 against 129.92 us", "58.62 against 45.76 us"},
		{"unset TILERT_GPU_MOE_PERSIST", "cuda/kernels/NOTES.md", `"Persistent MoE half"`}},
	"TILERT_GPU_TOPK_FAST": {{"removed in session 12", "17.69 against 14.91 us", "2.792 against 2.772 ms"},
		{"unset TILERT_GPU_TOPK_FAST", "topk_radix_one_w", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_MLA_TCQ": {{"removed in session 12", "46.3", "against 17.50", "against 44.98"},
		{"mla_decode_tcf2", "cuda/kernels/NOTES.md", "0781d7c"}},
	"TILERT_GPU_MLA_TCF": {{"removed in session 12", "46.3", "against 17.50", "against 44.98"},
		{"mla_decode_tcf2", "cuda/kernels/NOTES.md", "0781d7c"}},
	"TILERT_GPU_SIDE_MOE": {{"removed in session 12", "2.809 against 2.771 ms", "2.973 against 2.933"},
		{"unset TILERT_GPU_SIDE_MOE", "docs/measured/h200-2026-12-02-s12"}},
	"TILERT_GPU_NORM_FUSE": {{"removed in session 12", "2.987 against 2.975 ms", "2.802 against 2.771 ms"},
		{"unset TILERT_GPU_NORM_FUSE", "84f17b3", "docs/measured/h200-2026-12-02-s12"}},
	"TILERT_GPU_IDX_LONG": {{"session 14", "38.5 against 27.6 us", "3.210 against 2.920 ms"},
		{"unset TILERT_GPU_IDX_LONG", "ad57728", "docs/measured/h200-2026-12-03-s14"}},
	"TILERT_GPU_GROUP_SPLIT": {{"session 14", "10.29 against gemv_group's 9.74 us", "2.726 against 2.699 ms", "2.972 against 2.918"},
		{"unset TILERT_GPU_GROUP_SPLIT", "ad57728", "docs/measured/h200-2026-12-03-s14"}},
	"TILERT_GPU_L2WARM": {{"session 30 call B", "2.634 / 2.634 against 2.609 / 2.615 ms", "33.5 against 32.7 us"},
		{"unset TILERT_GPU_L2WARM", "707f692", "docs/measured/h200-2026-12-04-s30"}},
	"TILERT_GPU_TILE_M2": {{"session 31 call B", "4.019 / 4.016 against 3.697 / 3.703 ms", "75.1 us"},
		{"unset TILERT_GPU_TILE_M2", "9b4d269", "docs/measured/h200-2026-12-04-s31"}},
	"TILERT_GPU_SOLO": {{"session 34 call A", "2.628 / 2.631 against 2.615 / 2.617 ms", "2.700 / 2.701"},
		{"unset TILERT_GPU_SOLO", "ca46bb0", "docs/measured/h200-2026-12-05-s34"}},
	"TILERT_GPU_OPROJ_NORM": {{"session 34 call A", "43.24 against 37.97 us", "39.13 against 31.38", "2.771 / 2.775 against 2.610 / 2.613 ms", "2.871 / 2.873 against 2.690 / 2.688"},
		{"unset TILERT_GPU_OPROJ_NORM", "add_rmsnorm_reg", "e430c60", "docs/measured/h200-2026-12-05-s34", `"gemv_tile_fp8_r*_m1*_an"`}},
	"TILERT_GPU_ROUTER_FOLD": {{"session 38 call A", "8.45 against 11.81 us", "24 MB a layer", "8192 +6 / +8 us, 131072 +10 / +5", "8192 +11 / +15, 131072 +11 / +12", "+107 / +110"},
		{"unset TILERT_GPU_ROUTER_FOLD", "moe_route_sort", "bab6987", "docs/measured/h100-2026-12-05-s38", `engine/gpu/NOTES.md "TILERT_GPU_ROUTER_FOLD=1"`}},
	"TILERT_GPU_SIDE_SH_AT": {{"session 38 call B", "1.730 / 1.727 against 1.728 / 1.731 ms", "+2 / -4 us", "within spread"},
		{"unset TILERT_GPU_SIDE_SH_AT", "set it to norm", "4a23dd2", "docs/measured/h100-2026-12-05-s38", `engine/gpu/NOTES.md "TILERT_GPU_SIDE_SH_AT=router"`}},
	"TILERT_GPU_IDX_QFUSE": {{"session 38 call B", "1.987 / 1.986 against 1.979 / 1.982 ms", "+8 / +4 us", "1.735 / 1.736 against 1.727 / 1.734", "+8 / +2"},
		{"unset TILERT_GPU_IDX_QFUSE", "attn_epilogue", "c3728a6", "docs/measured/h100-2026-12-05-s38", `"gemv_tile_fp8_r*_m1*_iq"`}},
	"TILERT_GPU_L2_EVICT": {{"session 47 calls C-D", "8192 3.178 / 3.184 against 3.216 / 3.217 ms", "131072 3.358 / 3.358 against 3.339 / 3.339", "+19 / +19 us", "session 48 call F", "3.195 / 3.195 against 3.160 / 3.158 ms", "+35 / +37 us"},
		{"unset TILERT_GPU_L2_EVICT", "set it to nogroup", "keys", "normal", "454f910", "docs/measured/h100-2026-12-06-s47", "docs/measured/h100-2026-12-06-s48", `engine/gpu/NOTES.md "TILERT_GPU_L2_EVICT"`}},
	"TILERT_GPU_L2_NEXT": {{"session 49 call A", "3.192 / 3.196 against 3.154 / 3.160 ms", "+38 / +36 us", "+63 / +65"},
		{"unset TILERT_GPU_L2_NEXT", "b538f47", "docs/measured/h100-2026-12-06-s49", `engine/gpu/NOTES.md "Session 49"`}},
	"TILERT_GPU_STAGE_CARVEOUT": {{"session 53 call B", "+9 / +7 us", "+31 / +26", "60 +23 / +20", "50 +15 / +15", "session 54 calls A-B"},
		{"unset TILERT_GPU_STAGE_CARVEOUT", "driver's carveout", "343b9ac", "docs/measured/h100-2026-12-06-s54", `cuda/kernels/NOTES.md "gemv_stage"`}},
	"TILERT_GPU_EPI_PRE": {{"session 50 call A", "3.188 / 3.187 against 3.181 / 3.188 ms", "+7 / -1 us", "+14 / +15", "6.3 us"},
		{"unset TILERT_GPU_EPI_PRE", "attn_epilogue_qs", "3a8fbb2", "docs/measured/h100-2026-12-06-s50", `engine/gpu/NOTES.md "Session 50"`}},
	"TILERT_GPU_SCORES_PRE": {{"session 50 call A", "3.189 / 3.189 against 3.187 / 3.187 ms", "+2 / +2 us", "+14 / +15"},
		{"unset TILERT_GPU_SCORES_PRE", "indexer_scores_wgh2", "3a8fbb2", "docs/measured/h100-2026-12-06-s50", `engine/gpu/NOTES.md "Session 50"`}},
	"TILERT_GPU_MLA_HEADS": {{"session 38 call B", "mla_decode_wg2q", "1.980 / 1.982 against 1.976 / 1.974 ms", "+4 / +8 us"},
		{"unset TILERT_GPU_MLA_HEADS", "mla_decode_wg2h", "set it to 32 or 64", "43f2b09", "docs/measured/h100-2026-12-05-s38", `"mla_decode_wg2h / wg2q"`}},
	"TILERT_GPU_SAMPLE_ONE": {{"session 39 call B", "sample_wide_one", "44.38 against 41.73 us", "68.82 against 64.77", "10.10 against 8.90", "1.776 / 1.777 against 1.776 / 1.774 ms", "2.005 / 2.006 against 2.005 / 2.002", "3.315 / 3.315 against 3.283 / 3.283"},
		{"unset TILERT_GPU_SAMPLE_ONE", "kernels.SampleWide", "e79e3e4", "docs/measured/h100-2026-12-05-s39", `engine/gpu/NOTES.md "TILERT_GPU_SAMPLE_ONE=1"`, `cuda/kernels/NOTES.md "sample_wide_one"`}},
	"TILERT_GPU_MTP_PAIRS": {{"session 46", "mtp_pair_select", "3.264 / 3.264 against 3.205 / 3.212 ms", "6.372 / 6.371 against 5.981 / 5.978"},
		{"unset TILERT_GPU_MTP_PAIRS", "40299cf", "docs/measured/h100-2026-12-06-s46", `engine/gpu/NOTES.md "Session 46"`}},
	"TILERT_GPU_EMBED_VEC": {{"removed in session 40", "element loop", "2.602 / 2.603 -> 2.596 / 2.595 ms", "2.658 / 2.657 -> 2.647 / 2.648"},
		{"unset TILERT_GPU_EMBED_VEC", "embed_bf16", "d8d9211", "docs/measured/h200-2026-12-05-s40", `"embed_bf16_v"`}},
	"TILERT_GPU_FUSE": {{"removed in session 15", "=3 2.746, =2 2.808 against 2.697 ms", "10.62 against 8.31 us", "9.5 against 6.2 us"},
		{"unset TILERT_GPU_FUSE", "ca3f1b5", "docs/measured/h200-2026-12-03-s14"}},
	"TILERT_GPU_IDX_ONE": {{"removed in session 15", "call A1", "29.8 against the pair's 28.3 us", "3.030 (=1) / 3.015 (=plain) against 2.904 ms"},
		{"unset TILERT_GPU_IDX_ONE", "99c4e9a", "docs/measured/h200-2026-12-03-s15", `"Scores and the long-row top-k in one launch"`}},
	"TILERT_GPU_IDX_F8": {{"removed in session 15", "call A2", "13.96 (=1) / 27.14 (=wg) against indexer_scores_mma_pf's 13.00 us", "2.923 / 3.159 against 2.910 ms", "~13 bits"},
		{"unset TILERT_GPU_IDX_F8", "99c4e9a", "docs/measured/h200-2026-12-03-s15", `"The indexer scores on the fp8 mma.sync and on wgmma"`}},
	"TILERT_GPU_GEMV_MMA": {{"removed in session 19", "gemv_mmx_fp8/bf16_r1_u1_a", "69.9 / 118.1 against 44.0 us", "6.503 against 6.013 ms"},
		{"unset TILERT_GPU_GEMV_MMA", "cb41896", "docs/measured/h200-2026-12-03-s18", "docs/measured/h200-2026-12-03-s19", "cuda/kernels/NOTES.md"}},
	"TILERT_GPU_MLA_TC32": {{"removed in session 55", "24.60 against 24.30 us", "37.36 / 30.62"},
		{"unset TILERT_GPU_MLA_TC32", "mla_decode_wg2b", "4020bd8", "docs/measured/h200-2026-12-01-idxmla", `"Indexer top-k candidate list, MLA query staging"`}},
	"TILERT_GPU_QB_STAGE": {{"session 63 call A", "3.115 / 3.118 against 3.090 / 3.091 ms", "+25 / +27 us", "+32 / +34"},
		{"unset TILERT_GPU_QB_STAGE", "116e252", "docs/measured/h100-2026-12-07-s63", `"qb_absorb's W_UK rows off the chain"`}},
	"TILERT_GPU_MLA_CLUSTER": {{"session 63 call A", "mla_decode_wg2bc / wg2hc", "0 / -1 us", "+28 / +28", "16.2 against 11.6 us"},
		{"unset TILERT_GPU_MLA_CLUSTER", "mla_combine_wide", "116e252", "docs/measured/h100-2026-12-07-s63"}},
	"TILERT_GPU_POST_NORM": {{"session 63 call B", "3.100 / 3.102 against 3.094 / 3.090 ms", "+6 / +12 us"},
		{"unset TILERT_GPU_POST_NORM", "add_rmsnorm_reg", "116e252", "docs/measured/h100-2026-12-07-s63"}},
	"TILERT_GPU_MLA_SPLITS": {{"session 63 call B", "3.115 / 3.115 against 3.091 / 3.088 ms", "+24 / +27 us"},
		{"unset TILERT_GPU_MLA_SPLITS", "kernels.MLAWG2Splits", "116e252", "docs/measured/h100-2026-12-07-s63"}},
	"TILERT_GPU_QB_ONE": {{"session 64 call A", "3.102 / 3.104 against 3.088 / 3.092 ms", "+14 / +12 us", "6.6 us"},
		{"unset TILERT_GPU_QB_ONE", "66528df", "docs/measured/h100-2026-12-08-s64", `engine/gpu/NOTES.md "Session 64"`}},
	"TILERT_GPU_SIDE_PDL": {{"session 64 call A", "-2 / 0 us", "+14 / +14", "full one"},
		{"unset TILERT_GPU_SIDE_PDL", "TILERT_GPU_SIDE_EDGE=1", "66528df", "docs/measured/h100-2026-12-08-s64"}},
	"TILERT_GPU_GEMM_H2":       gemmH2Says,
	"TILERT_GPU_GEMM_H2_PARTS": gemmH2Says,
	"TILERT_GPU_L2PF":          l2pfSays,
	"TILERT_GPU_L2PF_OPROJ_MB": l2pfSays,
}

var gemmH2Says = [2][]string{
	{"removed in session 55", "89 against 91 TFLOP/s", "1.26-1.55% of bytes"},
	{"unset TILERT_GPU_GEMM_H2", "gemm_p1.cu", "ed1487e", "docs/measured/h200-2026-12-01-s4-pfill2", `"gemm_h2 removed (session 55)"`},
}

var l2pfSays = [2][]string{
	{"removed in session 12", "3.012 against 2.998 ms", "99.54-104.86 against 97.61 us", "39.29 against 38.00 us"},
	{"unset TILERT_GPU_L2PF", "cuda/kernels/NOTES.md", "docs/measured/h200-2026-12-01-s4-round2", "commit 0781d7c"},
}

func checkRemovedErr(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted, want a refusal", what)
		return
	}
	name, _, _ := strings.Cut(want, "=")
	says, ok := removedSays[strings.TrimSuffix(name, "_V")]
	if !ok {
		t.Fatalf("%s: no removedSays entry for %s", what, name)
	}
	for _, s := range append([]string{want}, says[0]...) {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: error %q does not say %q", what, err, s)
		}
	}
	h := errors.FlattenHints(err)
	for _, s := range says[1] {
		if !strings.Contains(h, s) {
			t.Errorf("%s: hint %q does not say %q", what, h, s)
		}
	}
}

// TestSwitchValues: a kept switch refuses values it does not know, with a
// hint naming the ones it does.
func TestSwitchValues(t *testing.T) {
	for _, c := range []struct {
		name, v string
		ok      bool
	}{
		{"TILERT_GPU_GEMV_MMA", "", true},
		{"TILERT_GPU_GEMV_MMA", "1", true},
		{"TILERT_GPU_GEMV_MMA", "g1", true},
		{"TILERT_GPU_GEMV_MMA", "u2", true},
		{"TILERT_GPU_MLA_WG", "0", true},
		{"TILERT_GPU_MLA_WG", "on", false},
		{"TILERT_GPU_GEMV_MMA", "all", true},
		{"TILERT_GPU_GEMV_MMA", "xall", false},
		{"TILERT_GPU_GEMV_MMA", "x", false},
		{"TILERT_GPU_GEMV_MMA", "X", false},
		{"TILERT_GPU_GEMV_MMA", "on", false},
		{"TILERT_GPU_EPI_ROWS", "0", true},
		{"TILERT_GPU_EPI_ROWS", "off", false},
		{"TILERT_GPU_MOE_NORM_FUSED", "0", true},
		{"TILERT_GPU_MOE_NORM_FUSED", "1", true},
		{"TILERT_GPU_MOE_NORM_FUSED", "off", false},
		{"TILERT_GPU_MOE_UNIQUE", "1", true},
		{"TILERT_GPU_MOE_UNIQUE", "yes", false},
		{"TILERT_GPU_MLA_HEADS", "32", true},
		{"TILERT_GPU_MLA_HEADS", "64", true},
		{"TILERT_GPU_MLA_HEADS", "0", true},
		{"TILERT_GPU_PIPELINE", "1", true},
		{"TILERT_GPU_PIPELINE", "2", true},
		{"TILERT_GPU_PIPELINE", "on", false},
		{"TILERT_GPU_IDX_WGH", "0", true},
		{"TILERT_GPU_IDX_WGH", "1", true},
		{"TILERT_GPU_IDX_WGH", "2", true},
		{"TILERT_GPU_IDX_WGH", "2short", true},
		{"TILERT_GPU_IDX_WGH", "auto", false},
		{"TILERT_GPU_MLA_HEADS", "16", false},
		{"TILERT_GPU_MLA_HEADS", "8", false},
		{"TILERT_GPU_L2_EVICT", "normal", true},
		{"TILERT_GPU_L2_EVICT", "keys", true},
		{"TILERT_GPU_L2_EVICT", "nogroup", true},
		{"TILERT_GPU_L2_EVICT", "first", false},
		{"TILERT_GPU_L2_EVICT", "noabsorb", false},
		{"TILERT_GPU_L2_EVICT", "0", false},
		{"TILERT_GPU_WHOLE_CHUNKS", "0", true},
		{"TILERT_GPU_WHOLE_CHUNKS", "off", false},
		{"TILERT_GPU_EXPERT_SHAPE", "30", true},
		{"TILERT_GPU_EXPERT_SHAPE", "o4", true},
		{"TILERT_GPU_EXPERT_SHAPE", "d16", true},
		{"TILERT_GPU_EXPERT_SHAPE", "d8", false},
		{"TILERT_GPU_SIDE_EDGE", "1", true},
		{"TILERT_GPU_SIDE_EDGE", "on", false},
		{"TILERT_GPU_SIDE_PDL", "1", true},
		{"TILERT_GPU_SIDE_PDL", "q", false},
		{"TILERT_GPU_SIDE_PDL", "0", true},
		{"TILERT_GPU_SIDE_PDL", "sh", false},
		{"TILERT_GPU_SIDE_PDL", "true", false},
	} {
		err := switchValues(func(k string) string {
			if k == c.name {
				return c.v
			}
			return ""
		})
		if c.ok != (err == nil) {
			t.Errorf("%s=%q: %v, want ok=%v", c.name, c.v, err, c.ok)
			continue
		}
		if err != nil && (!strings.Contains(err.Error(), c.name) || len(errors.GetAllHints(err)) == 0) {
			t.Errorf("%s=%q: %v (hints %q): want the switch named and a hint", c.name, c.v, err, errors.GetAllHints(err))
		}
	}
}

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// removedGolden: refused values of every removed switch, each set alone;
// testdata/removed.golden holds each one's message and hint as the code
// wrote them before the switches became one table (removedTable), so that
// rewriting how they are refused cannot change what a user reads.
var removedGolden = []struct{ name, v string }{
	{"TILERT_GPU_MLA_TCQ", "1"}, {"TILERT_GPU_MLA_TCQ", "yes"},
	{"TILERT_GPU_MLA_TCF", "q"},
	{"TILERT_GPU_MOE_PERSIST", "1"}, {"TILERT_GPU_MOE_PERSIST", "2"},
	{"TILERT_GPU_MOE_PERSIST_V", "0"}, {"TILERT_GPU_MOE_PERSIST_V", "b3"},
	{"TILERT_GPU_ROUTE_FUSED", "1"},
	{"TILERT_GPU_ROUTER_SMEM", "1"},
	{"TILERT_GPU_ABSORB_V_PRE", "1"},
	{"TILERT_GPU_IDX_QPRO", "1"},
	{"TILERT_GPU_TOPK_ONE", "v1"},
	{"TILERT_GPU_ROUTE_IN_GEMV", "1"},
	{"TILERT_GPU_IDX_SCALE_LATE", "1"},
	{"TILERT_GPU_IDX_NOPF", "1"},
	{"TILERT_GPU_IDX_CP", "1"},
	{"TILERT_GPU_GROUP_NN", "1"},
	{"TILERT_GPU_GROUP_NN", "2"},
	{"TILERT_GPU_ABSORB_COMB", "1"},
	{"TILERT_GPU_TOPK_FAST", "2"}, {"TILERT_GPU_TOPK_FAST", `a"b`},
	{"TILERT_GPU_SIDE_MOE", "route"}, {"TILERT_GPU_SIDE_MOE", "0"},
	{"TILERT_GPU_NORM_FUSE", "1"}, {"TILERT_GPU_NORM_FUSE", "2"},
	{"TILERT_GPU_L2PF", "1"}, {"TILERT_GPU_L2PF", "attn"}, {"TILERT_GPU_L2PF", "in"},
	{"TILERT_GPU_L2PF_OPROJ_MB", "16"}, {"TILERT_GPU_L2PF_OPROJ_MB", "0"},
	{"TILERT_GPU_FUSE", "2"}, {"TILERT_GPU_FUSE", "3"},
	{"TILERT_GPU_IDX_ONE", "1"}, {"TILERT_GPU_IDX_ONE", "plain"},
	{"TILERT_GPU_IDX_F8", "1"}, {"TILERT_GPU_IDX_F8", "wg"},
	{"TILERT_GPU_GEMV_MMA", "x"}, {"TILERT_GPU_GEMV_MMA", "xall"},
	{"TILERT_GPU_IDX_LONG", "1"},
	{"TILERT_GPU_GROUP_SPLIT", "1"},
	{"TILERT_GPU_L2WARM", "25"},
	{"TILERT_GPU_TILE_M2", "d16"},
	{"TILERT_GPU_SOLO", "1"},
	{"TILERT_GPU_OPROJ_NORM", "1"},
	{"TILERT_GPU_ROUTER_FOLD", "1"},
	{"TILERT_GPU_SIDE_SH_AT", "router"},
	{"TILERT_GPU_IDX_QFUSE", "1"},
	{"TILERT_GPU_MLA_HEADS", "16"},
	{"TILERT_GPU_L2_NEXT", "group"}, {"TILERT_GPU_L2_NEXT", "wqb"},
	{"TILERT_GPU_EPI_PRE", "1"}, {"TILERT_GPU_SCORES_PRE", "1"},
	{"TILERT_GPU_L2_EVICT", "first"}, {"TILERT_GPU_L2_EVICT", "noabsorb"},
	{"TILERT_GPU_SAMPLE_ONE", "1"},
	{"TILERT_GPU_EMBED_VEC", "0"},
	{"TILERT_GPU_MTP_PAIRS", "1"},
	{"TILERT_GPU_GEMM_H2", "1"}, {"TILERT_GPU_GEMM_H2_PARTS", "2"},
	{"TILERT_GPU_MLA_TC32", "1"},
	{"TILERT_GPU_STAGE_CARVEOUT", "50"}, {"TILERT_GPU_STAGE_CARVEOUT", "100"},
	{"TILERT_GPU_QB_STAGE", "1"}, {"TILERT_GPU_QB_STAGE", "2"},
	{"TILERT_GPU_MLA_CLUSTER", "1"},
	{"TILERT_GPU_POST_NORM", "cl"},
	{"TILERT_GPU_MLA_SPLITS", "16"}, {"TILERT_GPU_MLA_SPLITS", "8"},
	{"TILERT_GPU_QB_ONE", "1"},
	{"TILERT_GPU_SIDE_PDL", "q"},
}

// TestRemovedGolden pins every refusal's message and hint byte for byte
// (testdata/removed.golden; -update rewrites it), and which switch wins
// when several are set: every switch set at once (in name order, so the
// list does not carry the code's order), the refused one is unset and the
// next refusal read, until none is left.
func TestRemovedGolden(t *testing.T) {
	var buf strings.Builder
	say := func(err error) {
		fmt.Fprintf(&buf, "\terror: %s\n\thint: %s\n", err.Error(), errors.FlattenHints(err))
	}
	env := map[string]string{}
	for _, c := range removedGolden {
		fmt.Fprintf(&buf, "%s=%q\n", c.name, c.v)
		err := removedSwitches(func(k string) string {
			if k == c.name {
				return c.v
			}
			return ""
		})
		if err == nil {
			t.Fatalf("%s=%q: accepted, want a refusal", c.name, c.v)
		}
		say(err)
		if _, ok := env[c.name]; !ok {
			env[c.name] = c.v
		}
	}
	names := slices.Sorted(maps.Keys(env))
	fmt.Fprintf(&buf, "\nall of them set (%d), the refused one unset each time:\n", len(names))
	for range names {
		err := removedSwitches(func(k string) string { return env[k] })
		if err == nil {
			t.Fatalf("accepted with %v set, want a refusal", env)
		}
		var won string
		for _, n := range names {
			if v, ok := env[n]; ok && strings.HasPrefix(err.Error(), fmt.Sprintf("%s=%q: ", n, v)) {
				won = n
			}
		}
		if won == "" {
			t.Fatalf("refusal %q names none of %v", err, env)
		}
		fmt.Fprintf(&buf, "%s=%q\n", won, env[won])
		say(err)
		delete(env, won)
	}
	if err := removedSwitches(func(k string) string { return env[k] }); err != nil || len(env) != 0 {
		t.Fatalf("left %v: %v, want none set and no error", env, err)
	}

	golden := filepath.Join("testdata", "removed.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(buf.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if buf.String() != string(want) {
		t.Fatalf("refusals differ from %s:\n%s", golden, buf.String())
	}
}
