package cuda

import (
	"unsafe"

	"github.com/cockroachdb/errors"
)

// Programmatic dependent launch (PDL, compute capability 9.0+): a kernel
// launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may
// start while the previous kernel on its stream still runs (once every block
// of that kernel has executed griddepcontrol.launch_dependents or exited);
// it must execute griddepcontrol.wait, which returns when the previous
// kernel has completed and its writes are visible, before it reads anything
// that kernel may write or writes anything. Stream capture keeps the
// relation as a programmatic graph edge. Only the caller knows whether a
// kernel has the wait, so LaunchEx takes it as an argument
// (cuda/kernels keeps the list).

// launchConfig is CUlaunchConfig (cuda.h of CUDA 11.8 to 13.1, all the
// same: 7 unsigned ints, padding, CUstream, CUlaunchAttribute*, unsigned
// int numAttrs; 56 bytes).
type launchConfig struct {
	gridDimX, gridDimY, gridDimZ    uint32
	blockDimX, blockDimY, blockDimZ uint32
	sharedMemBytes                  uint32
	_                               uint32
	hStream                         uintptr
	attrs                           uintptr // *launchAttribute (pinned in the paramArena)
	numAttrs                        uint32
	_                               uint32
}

// launchAttribute is CUlaunchAttribute: a 4-byte CUlaunchAttributeID,
// padding to 8, then the 64-byte CUlaunchAttributeValue union (8-byte
// aligned: it holds pointers); 72 bytes.
type launchAttribute struct {
	id    uint32
	_     uint32
	value [8]uint64
}

const (
	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; its value is
	// the int programmaticStreamSerializationAllowed at the union's start.
	launchAttrProgrammaticStreamSerialization = 6
	// CU_LAUNCH_ATTRIBUTE_PRIORITY; its value is the int priority at the
	// union's start.
	launchAttrPriority = 8
	// Programmatic launch needs the grid dependency control of sm_90.
	pdlMinCCMajor = 9
)

// PDLSupported reports whether LaunchEx can launch with the programmatic
// attribute here: the driver has cuLaunchKernelEx and the device is Hopper
// or newer. Elsewhere LaunchEx launches plainly (the kernels' wait is then
// a no-op).
func (c *Ctx) PDLSupported() bool {
	return c.drv.cuLaunchKernelEx != 0 && c.dev.Info.CCMajor >= pdlMinCCMajor
}

// LaunchEx queues f on s like Launch; with pdl (and PDLSupported) it is a
// programmatic dependent launch, which f must support: griddepcontrol.wait
// before touching anything the previous kernel writes, and before any write.
func (c *Ctx) LaunchEx(f *Function, grid, block Dim3, smem int, s Stream, pdl bool, args ...any) error {
	return c.LaunchWith(f, grid, block, smem, s, LaunchOpts{PDL: pdl}, args...)
}

// LaunchOpts are a launch's attributes beyond its shape.
type LaunchOpts struct {
	// PDL: a programmatic dependent launch where PDLSupported (LaunchEx).
	PDL bool
	// Priority, when not 0, is the launch's scheduling priority
	// (priority.go: lower numbers first, StreamPriorityRange's range),
	// kept by a captured graph's kernel node; 0 leaves the stream's.
	Priority int
}

// LaunchWith queues f on s with o's attributes. A priority needs
// cuLaunchKernelEx (PriorityLaunchSupported).
func (c *Ctx) LaunchWith(f *Function, grid, block Dim3, smem int, s Stream, o LaunchOpts, args ...any) error {
	if grid.X <= 0 || grid.Y <= 0 || grid.Z <= 0 || block.X <= 0 || block.Y <= 0 || block.Z <= 0 {
		return errors.Newf("gpu: launch of %s with empty shape grid=%v block=%v", f.Name, grid, block)
	}
	pdl := o.PDL && c.PDLSupported()
	if o.Priority != 0 && c.drv.cuLaunchKernelEx == 0 {
		return errors.WithHint(errors.Newf("gpu: launch of %s at priority %d: the driver has no cuLaunchKernelEx", f.Name, o.Priority),
			"launch priorities need CUDA 11.8 or newer; unset TILERT_GPU_MAIN_PRIO")
	}
	p, err := c.params.pack(args)
	if err != nil {
		return errors.Wrapf(err, "launch %s", f.Name)
	}
	c.queued()
	if !pdl && o.Priority == 0 {
		r := call(c.drv.cuLaunchKernel, f.h,
			uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
			uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
			uintptr(smem), uintptr(s), p, 0)
		if r != 0 {
			return errors.Wrapf(c.check("cuLaunchKernel", r), "kernel %s grid=%v block=%v", f.Name, grid, block)
		}
		return nil
	}
	a := c.params
	a.cfg.gridDimX, a.cfg.gridDimY, a.cfg.gridDimZ = uint32(grid.X), uint32(grid.Y), uint32(grid.Z)
	a.cfg.blockDimX, a.cfg.blockDimY, a.cfg.blockDimZ = uint32(block.X), uint32(block.Y), uint32(block.Z)
	a.cfg.sharedMemBytes = uint32(smem)
	a.cfg.hStream = uintptr(s)
	n := 0
	if pdl {
		a.attrs[n] = launchAttribute{id: launchAttrProgrammaticStreamSerialization}
		a.attrs[n].value[0] = 1 // programmaticStreamSerializationAllowed (int, little-endian)
		n++
	}
	if o.Priority != 0 {
		a.attrs[n] = launchAttribute{id: launchAttrPriority}
		a.attrs[n].value[0] = uint64(uint32(int32(o.Priority))) // int priority, little-endian
		n++
	}
	a.cfg.numAttrs = uint32(n)
	r := call(c.drv.cuLaunchKernelEx, uintptr(unsafe.Pointer(&a.cfg)), f.h, p, 0)
	if r != 0 {
		err := errors.Wrapf(c.check("cuLaunchKernelEx", r), "kernel %s grid=%v block=%v, programmatic %v, priority %d", f.Name, grid, block, pdl, o.Priority)
		if o.Priority != 0 {
			return errors.WithHint(err, "unset TILERT_GPU_MAIN_PRIO to launch at the stream's priority")
		}
		return errors.WithHint(err, "unset TILERT_GPU_PDL (or set it to 0) to launch every kernel plainly")
	}
	return nil
}
