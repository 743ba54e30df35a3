package cupti

import (
	"encoding/binary"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// Byte offsets of the fields read from a CUpti_ActivityKernel10 record
// (cupti_activity.h, CUDA 13.0), taken with offsetof from a compiler over
// that header with its GCC definition of PACKED_ALIGNMENT (packed, aligned
// to 8); without the packing the offsets are the same. CUpti_ActivityKernel8
// and 9 have these fields at the same offsets, so a record of an older
// CUPTI parses as well.
const (
	offKind          = 0   // CUpti_ActivityKind (uint32)
	offStart         = 16  // uint64, ns
	offEnd           = 24  // uint64, ns
	offDeviceID      = 40  // uint32
	offContextID     = 44  // uint32
	offStreamID      = 48  // uint32
	offGridX         = 52  // int32, then gridY, gridZ
	offBlockX        = 64  // int32, then blockY, blockZ
	offCorrelationID = 92  // uint32
	offName          = 104 // const char *
	offGraphNodeID   = 144 // uint64
	offGraphID       = 156 // uint32

	// kernelReadBytes is where the last field read ends: a record must
	// hold at least this many bytes. sizeof(CUpti_ActivityKernel10) is 216.
	kernelReadBytes = 160
	kernel10Size    = 216

	// kindConcurrentKernel is CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL.
	kindConcurrentKernel = 10
)

// KernelRecord is one kernel execution as CUPTI saw it. Start and End are
// CUPTI timestamps in ns.
type KernelRecord struct {
	Name        string   `json:"name"`
	Start       uint64   `json:"start_ns"`
	End         uint64   `json:"end_ns"`
	Device      uint32   `json:"device"`
	Context     uint32   `json:"context"`
	Stream      uint32   `json:"stream"`
	Correlation uint32   `json:"correlation"`
	GraphID     uint32   `json:"graph_id"`
	GraphNodeID uint64   `json:"graph_node_id"`
	Grid        [3]int32 `json:"grid"`
	Block       [3]int32 `json:"block"`
	// Blocks, with block clocks (bench decode under
	// TILERT_GPU_BLOCK_CLOCKS=1), is what the kernel's blocks recorded.
	Blocks *BlockTimes `json:"blocks,omitempty"`
}

// BlockTimes sums up one launch's block clocks (kernels.BlockClock), in
// the record's time base (ns; a LayerKernel's: from its layer's start).
// In: the blocks' entries (resident, before their PDL wait); Released:
// past the wait (the kernels they wait on done); Out: their exits.
type BlockTimes struct {
	Blocks        int   `json:"blocks"`
	SMs           int   `json:"sms"`
	FirstIn       int64 `json:"first_in_ns"`
	LastIn        int64 `json:"last_in_ns"`
	FirstReleased int64 `json:"first_released_ns"`
	LastReleased  int64 `json:"last_released_ns"`
	FirstOut      int64 `json:"first_out_ns"`
	LastOut       int64 `json:"last_out_ns"`
	// RunP50Ns is the median block's time from release to exit.
	RunP50Ns int64 `json:"run_p50_ns"`
	// Each lists every block of a launch of at most EachMax blocks, by
	// block index (the one-block and few-block kernels of the chain).
	Each []BlockRun `json:"each,omitempty"`
	// Marks: a kernel opened by PDL_WAIT_MARKED (cuda/kernels common.cuh),
	// each phase its thread 0 passed, in mark order.
	Marks []MarkStat `json:"marks,omitempty"`
}

// MarkStat is one block mark over a launch: the median block's time from
// its release to the mark, over the blocks that took it.
type MarkStat struct {
	Label  string `json:"label"`
	Blocks int    `json:"blocks"`
	P50Ns  int64  `json:"p50_from_release_ns"`
}

// MarkAt is one block's mark, from that block's release.
type MarkAt struct {
	Label string `json:"label"`
	Ns    int64  `json:"from_release_ns"`
}

// EachMax is the most blocks a launch may have for BlockTimes.Each.
const EachMax = 8

// BlockRun is one block's clocks.
type BlockRun struct {
	Block    int      `json:"block"`
	SM       int      `json:"sm"`
	In       int64    `json:"in_ns"`
	Released int64    `json:"released_ns"`
	Out      int64    `json:"out_ns"`
	Marks    []MarkAt `json:"marks,omitempty"`
}

// Shift returns b with every time less t (nil stays nil).
func (b *BlockTimes) Shift(t int64) *BlockTimes {
	if b == nil {
		return nil
	}
	s := *b
	for _, p := range []*int64{&s.FirstIn, &s.LastIn, &s.FirstReleased, &s.LastReleased, &s.FirstOut, &s.LastOut} {
		*p -= t
	}
	if b.Each != nil {
		s.Each = make([]BlockRun, len(b.Each))
		for i, r := range b.Each {
			r.In, r.Released, r.Out = r.In-t, r.Released-t, r.Out-t
			s.Each[i] = r
		}
	}
	return &s
}

// recordKind is the kind field every activity record starts with.
func recordKind(rec []byte) (uint32, error) {
	if len(rec) < 4 {
		return 0, errors.Newf("cupti: activity record of %d bytes", len(rec))
	}
	return binary.LittleEndian.Uint32(rec[offKind:]), nil
}

// parseKernel reads a CONCURRENT_KERNEL record at the start of rec and
// checks it, so that a layout that is not the one above fails instead of
// giving garbage. The name is copied.
func parseKernel(rec []byte) (KernelRecord, error) {
	if len(rec) < kernelReadBytes {
		return KernelRecord{}, errors.Newf("cupti: kernel record cut short: %d bytes, need %d", len(rec), kernelReadBytes)
	}
	le := binary.LittleEndian
	if k := le.Uint32(rec[offKind:]); k != kindConcurrentKernel {
		return KernelRecord{}, errors.Newf("cupti: record kind %d, want %d (CONCURRENT_KERNEL)", k, kindConcurrentKernel)
	}
	r := KernelRecord{
		Start:       le.Uint64(rec[offStart:]),
		End:         le.Uint64(rec[offEnd:]),
		Device:      le.Uint32(rec[offDeviceID:]),
		Context:     le.Uint32(rec[offContextID:]),
		Stream:      le.Uint32(rec[offStreamID:]),
		Correlation: le.Uint32(rec[offCorrelationID:]),
		GraphNodeID: le.Uint64(rec[offGraphNodeID:]),
		GraphID:     le.Uint32(rec[offGraphID:]),
	}
	for i := range 3 {
		r.Grid[i] = int32(le.Uint32(rec[offGridX+4*i:]))
		r.Block[i] = int32(le.Uint32(rec[offBlockX+4*i:]))
	}
	// The name pointer is read as a pointer value (not through uintptr)
	// so no integer becomes a pointer; it points to CUPTI's memory.
	name := *(**byte)(unsafe.Pointer(&rec[offName]))
	if name == nil {
		return KernelRecord{}, errors.Newf("cupti: kernel record (correlation %d) without a name", r.Correlation)
	}
	r.Name = cString(name, 4096)
	switch {
	case r.Start == 0 || r.End == 0:
		return KernelRecord{}, errors.WithHint(errors.Newf("cupti: kernel %s has no timestamps (start %d, end %d)", r.Name, r.Start, r.End),
			"CUPTI could not time it (device memory for timestamps); synchronise before stopping the tracer")
	case r.End < r.Start:
		return KernelRecord{}, errors.Newf("cupti: kernel %s ends (%d) before it starts (%d)", r.Name, r.End, r.Start)
	case r.End-r.Start > 60e9:
		return KernelRecord{}, errors.Newf("cupti: kernel %s lasts %d ns: not a kernel record of the expected layout", r.Name, r.End-r.Start)
	}
	for i := range 3 {
		if r.Grid[i] < 1 || r.Block[i] < 1 || r.Block[i] > 1024 {
			return KernelRecord{}, errors.Newf("cupti: kernel %s has grid %v block %v: not a kernel record of the expected layout", r.Name, r.Grid, r.Block)
		}
	}
	return r, nil
}

// cString copies a NUL-terminated string of at most max bytes.
func cString(p *byte, max int) string {
	n := 0
	for n < max && *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
