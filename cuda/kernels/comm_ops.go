package kernels

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
)

// AllReduceOneShot sums n float32 across nranks buffers in one launch:
// table holds the nranks device pointers (each addressable from this
// device); every buffer ends with the sum, added in rank order.
func (k *Set) AllReduceOneShot(s cuda.Stream, table cuda.DevPtr, nranks, n int) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("allreduce_oneshot: nranks=%d n=%d", nranks, n)
	}
	return k.launch("allreduce_oneshot_f32", cuda.D1(min(cdiv(n, 256), 1024)), cuda.D1(256), 0, s, table, int32(nranks), int64(n))
}
