package gpu

import "os"

// groupSplitOn: the one-row grouped GEMVs without a norm (the layer input's
// q_a, kv_a, indexer wk and weights_proj) run on the split kernel
// (kernels.GemvGroupSplit, cu/gemv_group_split.cu; helper grp, session 14,
// issue 10) where its plan takes the launch (at most one wave of blocks:
// DeepSeek-V3.2's 2304 x 7168 and GLM-5's 2816 x 6144 groups): every block's
// weights copied into shared memory at once instead of one chunk of each
// row per round, each segment's group size (so every output's bits) kept.
// TILERT_GPU_GROUP_SPLIT=0 keeps gemv_group for them (comparisons).
// Expected (not yet measured on the H200): the 9.70 us of gemv_group for
// the DeepSeek group toward the 5.24 us of a copy of its bytes.
var groupSplitOn = os.Getenv("TILERT_GPU_GROUP_SPLIT") != "0"
