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
	if grid.X <= 0 || grid.Y <= 0 || grid.Z <= 0 || block.X <= 0 || block.Y <= 0 || block.Z <= 0 {
		return errors.Newf("gpu: launch of %s with empty shape grid=%v block=%v", f.Name, grid, block)
	}
	p, err := c.params.pack(args)
	if err != nil {
		return errors.Wrapf(err, "launch %s", f.Name)
	}
	c.queued()
	if !pdl || !c.PDLSupported() {
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
	a.cfg.numAttrs = 1
	a.attr = launchAttribute{id: launchAttrProgrammaticStreamSerialization}
	a.attr.value[0] = 1 // programmaticStreamSerializationAllowed (int, little-endian)
	r := call(c.drv.cuLaunchKernelEx, uintptr(unsafe.Pointer(&a.cfg)), f.h, p, 0)
	if r != 0 {
		err := errors.Wrapf(c.check("cuLaunchKernelEx", r), "kernel %s grid=%v block=%v, programmatic dependent launch", f.Name, grid, block)
		return errors.WithHint(err, "unset TILERT_GPU_PDL (or set it to 0) to launch every kernel plainly")
	}
	return nil
}
