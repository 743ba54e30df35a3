package kernels

import "testing"

// The heads kernel's split plan: whole tiles, bounded by the token count and
// mlaHeadsSplits, the SMs filled once, and a scratch bound that covers every
// plan (including tensor-parallel ranks left without heads).
func TestMLAHeadsPlan(t *testing.T) {
	for _, tc := range []struct{ sms, nq, H, nidx, want int }{
		{132, 1, 128, 2048, 17}, // 8 head groups: 17 ranges of 4 tiles -> 136 blocks
		{132, 4, 128, 2048, 5},
		{132, 1, 128, 40, 2}, // 2 tiles of tokens
		{132, 32, 128, 2048, 1},
		{132, 1, 4, 2048, 64}, // one head group: one range per tile
		{132, 1, 0, 2048, 64},
		{1000, 1, 16, 1 << 20, mlaHeadsSplits},
	} {
		got := mlaHeadsSplitsFor(tc.sms, tc.nq, tc.H, tc.nidx)
		if got != tc.want {
			t.Errorf("splits(sms=%d nq=%d H=%d nidx=%d) = %d, want %d", tc.sms, tc.nq, tc.H, tc.nidx, got, tc.want)
		}
		if tc.H > 0 && MLAWorkspaceBytes(tc.nq, tc.H, got) > MLAHeadsWorkspaceBytes(tc.nq, tc.H) {
			t.Errorf("nq=%d H=%d: plan needs %d bytes, bound %d", tc.nq, tc.H, MLAWorkspaceBytes(tc.nq, tc.H, got), MLAHeadsWorkspaceBytes(tc.nq, tc.H))
		}
	}
	if b := MLAHeadsWorkspaceBytes(4, 0); b != 0 {
		t.Errorf("no heads: %d bytes of scratch", b)
	}
}
