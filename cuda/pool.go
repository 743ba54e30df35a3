package cuda

import (
	"sort"

	"github.com/cockroachdb/errors"
)

// Allocation granularity: every buffer starts 256-byte aligned (what
// cuMemAlloc gives and what 16-byte vector loads need), small sizes are
// rounded to 512 B and large ones to 2 MiB so freed buffers are reused.
const (
	poolSmallQuantum = 512
	poolLargeQuantum = 2 << 20
	poolLargeFrom    = 1 << 20
	arenaAlign       = 256
)

func poolRound(n int64) int64 {
	if n <= 0 {
		n = 1
	}
	q := int64(poolSmallQuantum)
	if n >= poolLargeFrom {
		q = poolLargeQuantum
	}
	return (n + q - 1) / q * q
}

// Pool is a caching device allocator: Free keeps buffers in per-size free
// lists for reuse, Trim gives them back to the driver. Not safe for
// concurrent use; each Ctx owns one and uses it on its thread.
type Pool struct {
	raw     func(int64) (DevPtr, error)
	rawFree func(DevPtr) error
	free    map[int64][]DevPtr
	live    map[DevPtr]int64
	inUse   int64
	cached  int64
	peak    int64
}

func newPool(raw func(int64) (DevPtr, error), rawFree func(DevPtr) error) *Pool {
	return &Pool{raw: raw, rawFree: rawFree, free: map[int64][]DevPtr{}, live: map[DevPtr]int64{}}
}

// Alloc returns a buffer of at least n bytes.
func (p *Pool) Alloc(n int64) (DevPtr, error) {
	sz := poolRound(n)
	if l := p.free[sz]; len(l) > 0 {
		ptr := l[len(l)-1]
		p.free[sz] = l[:len(l)-1]
		p.cached -= sz
		p.live[ptr] = sz
		p.inUse += sz
		p.peak = max(p.peak, p.inUse)
		return ptr, nil
	}
	ptr, err := p.raw(sz)
	if err != nil && p.cached > 0 {
		// Out of memory with buffers parked: give them back and retry once.
		if terr := p.Trim(); terr != nil {
			return 0, errors.CombineErrors(err, terr)
		}
		ptr, err = p.raw(sz)
	}
	if err != nil {
		return 0, errors.Wrapf(err, "allocating %d bytes of device memory (%d in use)", sz, p.inUse)
	}
	p.live[ptr] = sz
	p.inUse += sz
	p.peak = max(p.peak, p.inUse)
	return ptr, nil
}

// Free parks a buffer from Alloc for reuse.
func (p *Pool) Free(ptr DevPtr) error {
	sz, ok := p.live[ptr]
	if !ok {
		return errors.Newf("gpu pool: free of unknown pointer %#x", uint64(ptr))
	}
	delete(p.live, ptr)
	p.inUse -= sz
	p.free[sz] = append(p.free[sz], ptr)
	p.cached += sz
	return nil
}

// Trim returns every parked buffer to the driver.
func (p *Pool) Trim() error {
	var errs error
	sizes := make([]int64, 0, len(p.free))
	for sz := range p.free {
		sizes = append(sizes, sz)
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] < sizes[j] })
	for _, sz := range sizes {
		for _, ptr := range p.free[sz] {
			errs = errors.CombineErrors(errs, p.rawFree(ptr))
			p.cached -= sz
		}
		delete(p.free, sz)
	}
	return errs
}

// releaseAll frees live and parked buffers (device shutdown).
func (p *Pool) releaseAll() error {
	errs := p.Trim()
	for ptr, sz := range p.live {
		errs = errors.CombineErrors(errs, p.rawFree(ptr))
		p.inUse -= sz
		delete(p.live, ptr)
	}
	return errs
}

// PoolStats reports bytes handed out, parked for reuse, and the peak in use.
type PoolStats struct{ InUse, Cached, Peak int64 }

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats { return PoolStats{p.inUse, p.cached, p.peak} }

// Arena hands out 256-byte aligned pieces of one device buffer by bumping an
// offset; Reset recycles all of them at once (per-step scratch, weights).
type Arena struct {
	Base DevPtr
	Size int64
	off  int64
}

// NewArena wraps [base, base+size) (base must be 256-byte aligned).
func NewArena(base DevPtr, size int64) *Arena { return &Arena{Base: base, Size: size} }

// Alloc returns n bytes from the arena.
func (a *Arena) Alloc(n int64) (DevPtr, error) {
	off := (a.off + arenaAlign - 1) / arenaAlign * arenaAlign
	if n < 0 || off+n > a.Size {
		return 0, errors.Newf("gpu arena: %d bytes requested, %d of %d free", n, a.Size-off, a.Size)
	}
	a.off = off + n
	return a.Base.Add(off), nil
}

// Used reports the bytes handed out since the last Reset (with padding).
func (a *Arena) Used() int64 { return a.off }

// Reset makes the whole arena free again.
func (a *Arena) Reset() { a.off = 0 }
