package cuda

import (
	"math"
	"runtime"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// maxKernelParams bounds the arguments of one launch. It was raised to 64
// for the persistent MoE kernel (41 arguments; removed in session 11) and
// kept: a generic bound (TestParamArenaPack checks it).
const maxKernelParams = 64

// paramBits encodes one kernel argument as the little-endian bits CUDA reads
// from its slot: 4 bytes for int/int32/uint32/float32, 8 for pointers and
// 64-bit values, 1 for bool. Go int means C int (32-bit) and must fit.
func paramBits(v any) (uint64, error) {
	switch x := v.(type) {
	case DevPtr:
		return uint64(x), nil
	case uintptr:
		return uint64(x), nil
	case int:
		if x < math.MinInt32 || x > math.MaxInt32 {
			return 0, errors.Newf("kernel argument %d does not fit a C int", x)
		}
		return uint64(uint32(int32(x))), nil
	case int32:
		return uint64(uint32(x)), nil
	case uint32:
		return uint64(x), nil
	case int64:
		return uint64(x), nil
	case uint64:
		return x, nil
	case float32:
		return uint64(math.Float32bits(x)), nil
	case float64:
		return math.Float64bits(x), nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	default:
		return 0, errors.Newf("unsupported kernel argument type %T", v)
	}
}

// paramArena is the kernel argument block handed to cuLaunchKernel: vals
// holds one 8-byte slot per argument and ptrs the void* array pointing at
// them. Both are pinned for the arena's life, so the driver may read them
// without Go moving them, and reused by every launch on the owning thread
// (cuLaunchKernel copies the arguments before it returns).
type paramArena struct {
	vals [maxKernelParams]uint64
	ptrs [maxKernelParams]uintptr
	// cuLaunchKernelEx's config and its attributes (launch.go: programmatic
	// serialization, priority), here so they are pinned too: cfg.attrs
	// holds attrs' address as a uintptr.
	cfg   launchConfig
	attrs [2]launchAttribute
	pin   runtime.Pinner
}

func newParamArena() *paramArena {
	a := &paramArena{}
	a.pin.Pin(a)
	for i := range a.vals {
		a.ptrs[i] = uintptr(unsafe.Pointer(&a.vals[i]))
	}
	a.cfg.attrs = uintptr(unsafe.Pointer(&a.attrs[0]))
	return a
}

// pack writes args into the slots and returns the void** to pass.
func (a *paramArena) pack(args []any) (uintptr, error) {
	if len(args) > maxKernelParams {
		return 0, errors.Newf("%d kernel arguments, at most %d", len(args), maxKernelParams)
	}
	for i, v := range args {
		b, err := paramBits(v)
		if err != nil {
			return 0, errors.Wrapf(err, "argument %d", i)
		}
		a.vals[i] = b
	}
	if len(args) == 0 {
		return 0, nil
	}
	return uintptr(unsafe.Pointer(&a.ptrs[0])), nil
}

func (a *paramArena) release() { a.pin.Unpin() }
