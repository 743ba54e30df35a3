package kernels

import (
	"fmt"
	"strings"
	"testing"
)

// TestGroupSplitPlan checks the split plan's arithmetic (no GPU): each
// segment keeps gemv_group's group size G (its sums), R is the most rows
// whose block fits the shared memory, and the launches that would not fit
// one wave, or whose one row a group would not fit, stay on gemv_group.
func TestGroupSplitPlan(t *testing.T) {
	defer func(r int) { TileRule = r }(TileRule)
	TileRule = 3
	const sms = 132
	type want struct {
		R      []int
		blocks int
		smem   int
		rm     int
	}
	for _, tc := range []struct {
		name string
		K    int
		segs []GroupSeg
		smem int
		rmax int
		ok   bool
		want want
	}{
		// DeepSeek-V3.2's layer input: 4 fp8 rows (28 KiB and a 56-float
		// scale row) or 2 bf16 rows a block; 592 blocks.
		{"deepseek", 7168, []GroupSeg{{N: 1536}, {N: 576}, {N: 128}, {N: 64, BF16: true}}, GroupSplitSmem, GroupSplitMaxRows, true,
			want{[]int{4, 4, 4, 2}, 384 + 144 + 32 + 32, 4*7168 + 4*56, 4}},
		// GLM-5's: hidden 6144, q_lora 2048, kv 576, wk 128, 64 heads.
		{"glm5", 6144, []GroupSeg{{N: 2048}, {N: 576}, {N: 128}, {N: 64, BF16: true}}, GroupSplitSmem, GroupSplitMaxRows, true,
			want{[]int{4, 4, 4, 2}, 512 + 144 + 32 + 32, 4*6144 + 4*48, 4}},
		// 64 KiB: 8 rows a block (the dynamic-shared attribute).
		{"deepseek 64k", 7168, []GroupSeg{{N: 1536}, {N: 576}, {N: 128}, {N: 64, BF16: true}}, 64 << 10, 8, true,
			want{[]int{8, 8, 8, 4}, 192 + 72 + 16 + 16, 8*7168 + 4*56, 8}},
		{"one row", 512, []GroupSeg{{N: 1}}, GroupSplitSmem, GroupSplitMaxRows, true,
			// K = 512: G = 32, 8 groups a block of 4 rows each.
			want{[]int{4}, 1, 8 * (4*512 + 4*4), 4}},
		// q_b + wq_b (50 MB): more than one wave holds.
		{"q_b", 1536, []GroupSeg{{N: 24576}, {N: 8192}}, GroupSplitSmem, GroupSplitMaxRows, false, want{}},
		// A row over the shared memory.
		{"long row", 40000, []GroupSeg{{N: 1}}, GroupSplitSmem, GroupSplitMaxRows, false, want{}},
		{"none", 512, nil, GroupSplitSmem, GroupSplitMaxRows, false, want{}},
	} {
		shapes, rm, blocks, smem, ok := groupSplitPlan(sms, tc.K, tc.segs, tc.smem, tc.rmax)
		if ok != tc.ok {
			t.Errorf("%s: ok=%v, want %v", tc.name, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		for i, sh := range shapes {
			G, _ := groupShape(sms, tc.segs[i], tc.K, 1)
			if sh.G != G || sh.R != tc.want.R[i] {
				t.Errorf("%s seg %d: G=%d R=%d, want G=%d (gemv_group's) R=%d", tc.name, i, sh.G, sh.R, G, tc.want.R[i])
			}
		}
		if rm != tc.want.rm || blocks != tc.want.blocks || smem != tc.want.smem {
			t.Errorf("%s: R bound %d, %d blocks, %d B shared, want %d, %d, %d", tc.name, rm, blocks, smem, tc.want.rm, tc.want.blocks, tc.want.smem)
		}
		if smem > tc.smem {
			t.Errorf("%s: %d B of shared memory over the %d given", tc.name, smem, tc.smem)
		}
	}
	// Every variant the launcher names is compiled and launched
	// programmatically (it starts with PDL_WAIT, TestPDLKernelsWait).
	src := KernelSource()
	for _, r := range []int{1, 2, 4, 8} {
		// (written out by GEMV_SPLIT_KERNEL(R, min blocks))
		name, def := fmt.Sprintf("gemv_group_split_r%d", r), fmt.Sprintf("GEMV_SPLIT_KERNEL(%d,", r)
		if !strings.Contains(src, def) || !pdlKernels[name] {
			t.Errorf("%s: compiled %v, in pdlKernels %v", name, strings.Contains(src, def), pdlKernels[name])
		}
	}
	for r, want := range map[int]int{1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8} {
		if got := splitRMax(r); got != want {
			t.Errorf("splitRMax(%d) = %d, want %d", r, got, want)
		}
	}
}
