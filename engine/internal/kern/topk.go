package kern

import "sort"

// TopK returns the indices of the k largest values of s, largest first; ties
// go to the lower index. torch.topk does not specify its tie order, so where
// scores tie exactly (e.g. indexer scores that are all zero after ReLU) the
// chosen set can differ from PyTorch's.
func TopK(s []float32, k int) []int {
	n := len(s)
	if k > n {
		k = n
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	less := func(a, b int) bool {
		if s[a] != s[b] {
			return s[a] > s[b]
		}
		return a < b
	}
	if k < n/4 && k < 64 {
		// partial selection: keep a sorted prefix of length k
		out := make([]int, 0, k)
		for i := 0; i < n; i++ {
			if len(out) < k {
				out = append(out, i)
				for j := len(out) - 1; j > 0 && less(out[j], out[j-1]); j-- {
					out[j], out[j-1] = out[j-1], out[j]
				}
				continue
			}
			if !less(i, out[k-1]) {
				continue
			}
			out[k-1] = i
			for j := k - 1; j > 0 && less(out[j], out[j-1]); j-- {
				out[j], out[j-1] = out[j-1], out[j]
			}
		}
		return out
	}
	sort.Slice(idx, func(a, b int) bool { return less(idx[a], idx[b]) })
	return idx[:k]
}
