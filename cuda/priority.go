package cuda

import (
	"unsafe"

	"github.com/cockroachdb/errors"
)

// Scheduling priorities. When blocks of several grids wait for room on the
// SMs, the block scheduler takes those of higher-priority streams first; a
// resident block is never preempted. Lower numbers are higher priorities:
// the default, 0, is the least on every device so far, so a stream can be
// raised above the others but none lowered below the default.
//
// A captured graph records each kernel node's priority from the stream it
// was captured on, but replays every node at the priority of the stream it
// is launched into unless it was instantiated with
// CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (EndCaptureWith).
const graphInstantiateUseNodePriority = 8

// StreamPriorityRange returns the context's least and greatest stream
// priorities (greatest <= least), or an error where the driver has no
// cuCtxGetStreamPriorityRange.
func (c *Ctx) StreamPriorityRange() (least, greatest int, err error) {
	if c.drv.cuCtxGetStreamPriorityRange == 0 {
		return 0, 0, errors.WithHint(errors.New("gpu: the driver has no cuCtxGetStreamPriorityRange"),
			"stream priorities need a newer NVIDIA driver; leave the priority switch unset")
	}
	var lo, hi int32
	if err := c.check("cuCtxGetStreamPriorityRange", call(c.drv.cuCtxGetStreamPriorityRange,
		uintptr(unsafe.Pointer(&lo)), uintptr(unsafe.Pointer(&hi)))); err != nil {
		return 0, 0, err
	}
	return int(lo), int(hi), nil
}

// NewStreamWithPriority creates a non-blocking stream of priority p, which
// must lie in StreamPriorityRange.
func (c *Ctx) NewStreamWithPriority(p int) (Stream, error) {
	least, greatest, err := c.StreamPriorityRange()
	if err != nil {
		return 0, err
	}
	if p > least || p < greatest {
		return 0, errors.Newf("gpu: stream priority %d is outside the device's range %d (least) to %d (greatest)", p, least, greatest)
	}
	if c.drv.cuStreamCreateWithPriority == 0 {
		return 0, errors.WithHint(errors.New("gpu: the driver has no cuStreamCreateWithPriority"),
			"stream priorities need a newer NVIDIA driver; leave the priority switch unset")
	}
	var s uintptr
	err = c.check("cuStreamCreateWithPriority", call(c.drv.cuStreamCreateWithPriority,
		uintptr(unsafe.Pointer(&s)), streamNonBlocking, uintptr(uint32(int32(p)))))
	return Stream(s), err
}
