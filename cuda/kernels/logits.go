package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// AdjustWords is the int32 words of one adjust_logits entry: row, token,
// bias, rep, sub (float bits) and block.
const AdjustWords = 6

// AdjustLogits applies n entries (AdjustWords int32 each, see
// cu/logits.cu) to logits [rows][ld] in place.
func (k *Set) AdjustLogits(s cuda.Stream, x, entries cuda.DevPtr, n, ld int) error {
	if n < 0 || ld <= 0 {
		return errors.Newf("adjust logits: n=%d ld=%d", n, ld)
	}
	if n == 0 {
		return nil
	}
	return k.launch("adjust_logits", cuda.D1((n+255)/256), cuda.D1(256), 0, s, x, ld, entries, n)
}

// MaxTopLogprobs bounds Logprobs' k (vLLM's default max_logprobs is 20).
const MaxTopLogprobs = 32

// Logprobs writes, per row of raw logits x [rows][ld], lp[row] = the
// log-softmax at tok[row] and the k most likely tokens with their
// log-softmax into topID/topLP [rows][k].
func (k *Set) Logprobs(s cuda.Stream, x, tok, lp, topID, topLP cuda.DevPtr, rows, n, ld, kk int) error {
	if rows <= 0 || n <= 0 || ld < n || kk < 0 || kk > MaxTopLogprobs {
		return errors.Newf("logprobs: rows=%d n=%d ld=%d k=%d", rows, n, ld, kk)
	}
	return k.launch("logprob_rows", cuda.D1(rows), cuda.D1(1024), 0, s, x, n, ld, tok, lp, kk, topID, topLP)
}
