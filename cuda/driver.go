package cuda

import (
	"strings"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// DevPtr is a device address (CUdeviceptr).
type DevPtr uint64

// Add offsets a device pointer by n bytes.
func (p DevPtr) Add(n int64) DevPtr { return DevPtr(int64(p) + n) }

// driver holds the driver API entry points (all _v2 where one exists).
type driver struct {
	lib string

	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString                  uintptr
	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute          uintptr
	cuDeviceTotalMem, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease         uintptr
	cuCtxSetCurrent, cuCtxSynchronize, cuMemGetInfo                               uintptr
	cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost                          uintptr
	cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync              uintptr
	cuMemcpyDtoDAsync, cuMemsetD8Async, cuMemsetD32Async                          uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction, cuFuncSetAttribute     uintptr
	cuFuncGetAttribute, cuLaunchKernel                                            uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize                          uintptr
	cuStreamBeginCapture, cuStreamEndCapture                                      uintptr
	cuGraphInstantiate, cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy         uintptr
	cuEventCreate, cuEventRecord, cuEventSynchronize, cuEventElapsedTime          uintptr
	cuEventDestroy, cuStreamWaitEvent                                             uintptr
	cuCtxEnablePeerAccess, cuDeviceCanAccessPeer                                  uintptr // optional (peer.go)
	cuLaunchKernelEx                                                              uintptr // optional (launch.go; CUDA 11.8+)
	cuOccupancyMaxActiveBlocksPerMultiprocessor                                   uintptr // optional (device.go MaxActiveBlocks)
	cuCtxGetStreamPriorityRange, cuStreamCreateWithPriority                       uintptr // optional (priority.go)
	cuModuleGetGlobal                                                             uintptr // optional (device.go ModuleGlobal)
	cuStreamGetCaptureInfo, cuStreamUpdateCaptureDependencies, cuGraphNodeGetType uintptr // optional (edge.go; CUDA 12.3+)
}

var (
	drvOnce sync.Once
	drv     *driver
	drvErr  error
)

// loadDriver opens libcuda.so.1 and calls cuInit once per process.
func loadDriver() (*driver, error) {
	drvOnce.Do(func() { drv, drvErr = openDriver() })
	return drv, drvErr
}

func openDriver() (*driver, error) {
	h, path, fails := dlopenFirst(cudaCandidates())
	if h == 0 {
		err := errors.Newf("no NVIDIA driver: libcuda.so.1 could not be loaded (tried %s)", strings.Join(cudaCandidates(), ", "))
		if len(fails) > 0 {
			err = errors.WithDetail(err, strings.Join(fails, "\n"))
		}
		return nil, errors.WithHint(errors.Mark(err, ErrNoGPU), cpuHint)
	}
	s := symbols{lib: path, handle: h}
	d := &driver{lib: path}
	type sym struct {
		dst   *uintptr
		names []string
	}
	req := []sym{
		{&d.cuInit, []string{"cuInit"}},
		{&d.cuDriverGetVersion, []string{"cuDriverGetVersion"}},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&d.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}},
		{&d.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&d.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&d.cuCtxSynchronize, []string{"cuCtxSynchronize"}},
		{&d.cuMemGetInfo, []string{"cuMemGetInfo_v2"}},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&d.cuMemFree, []string{"cuMemFree_v2"}},
		{&d.cuMemHostAlloc, []string{"cuMemHostAlloc"}},
		{&d.cuMemFreeHost, []string{"cuMemFreeHost"}},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&d.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}},
		{&d.cuMemcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}},
		{&d.cuMemcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}},
		{&d.cuMemsetD8Async, []string{"cuMemsetD8Async"}},
		{&d.cuMemsetD32Async, []string{"cuMemsetD32Async"}},
		{&d.cuModuleLoadData, []string{"cuModuleLoadData"}},
		{&d.cuModuleUnload, []string{"cuModuleUnload"}},
		{&d.cuModuleGetFunction, []string{"cuModuleGetFunction"}},
		{&d.cuFuncSetAttribute, []string{"cuFuncSetAttribute"}},
		{&d.cuFuncGetAttribute, []string{"cuFuncGetAttribute"}},
		{&d.cuLaunchKernel, []string{"cuLaunchKernel"}},
		{&d.cuStreamCreate, []string{"cuStreamCreate"}},
		{&d.cuStreamDestroy, []string{"cuStreamDestroy_v2"}},
		{&d.cuStreamSynchronize, []string{"cuStreamSynchronize"}},
		{&d.cuStreamBeginCapture, []string{"cuStreamBeginCapture_v2"}},
		{&d.cuStreamEndCapture, []string{"cuStreamEndCapture"}},
		{&d.cuGraphInstantiate, []string{"cuGraphInstantiateWithFlags"}},
		{&d.cuGraphLaunch, []string{"cuGraphLaunch"}},
		{&d.cuGraphExecDestroy, []string{"cuGraphExecDestroy"}},
		{&d.cuGraphDestroy, []string{"cuGraphDestroy"}},
		{&d.cuEventCreate, []string{"cuEventCreate"}},
		{&d.cuEventRecord, []string{"cuEventRecord"}},
		{&d.cuEventSynchronize, []string{"cuEventSynchronize"}},
		{&d.cuEventElapsedTime, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
		{&d.cuEventDestroy, []string{"cuEventDestroy_v2"}},
		{&d.cuStreamWaitEvent, []string{"cuStreamWaitEvent"}},
	}
	for _, r := range req {
		if err := s.must(r.dst, r.names...); err != nil {
			return nil, errors.WithHint(errors.Wrap(err, "NVIDIA driver too old"), "this needs a CUDA 11.4+ driver; "+cpuHint)
		}
	}
	s.optional(&d.cuGetErrorName, "cuGetErrorName")
	s.optional(&d.cuGetErrorString, "cuGetErrorString")
	s.optional(&d.cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")
	s.optional(&d.cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")
	s.optional(&d.cuLaunchKernelEx, "cuLaunchKernelEx")
	s.optional(&d.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
	s.optional(&d.cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange")
	s.optional(&d.cuStreamCreateWithPriority, "cuStreamCreateWithPriority")
	s.optional(&d.cuModuleGetGlobal, "cuModuleGetGlobal_v2")
	s.optional(&d.cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo_v3")
	s.optional(&d.cuStreamUpdateCaptureDependencies, "cuStreamUpdateCaptureDependencies_v2")
	s.optional(&d.cuGraphNodeGetType, "cuGraphNodeGetType")
	if err := d.check("cuInit", call(d.cuInit, 0)); err != nil {
		return nil, errors.WithHint(errors.Mark(err, ErrNoGPU), cpuHint)
	}
	return d, nil
}

// check turns a CUresult into an error carrying the CUDA error name.
func (d *driver) check(callName string, r int32) error {
	if r == 0 {
		return nil
	}
	var name, detail string
	if d != nil && d.cuGetErrorName != 0 {
		var p *byte
		if call(d.cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
			name = gostr(p)
		}
	}
	if d != nil && d.cuGetErrorString != 0 {
		var p *byte
		if call(d.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
			detail = gostr(p)
		}
	}
	return newCUDAError(callName, CUresult(r), name, detail)
}

// Driver API constants used here (cuda.h).
const (
	attrMaxThreadsPerBlock     = 1
	attrMultiprocessorCount    = 16
	attrL2CacheSize            = 38
	attrComputeCapMajor        = 75
	attrComputeCapMinor        = 76
	attrMaxSharedPerBlockOptin = 97
	attrMaxSharedPerSM         = 81
	attrReservedSharedPerBlock = 111

	funcAttrMaxDynamicShared  = 8
	funcAttrNumRegs           = 4
	funcAttrPreferredCarveout = 9 // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (percent of the maximum)

	memHostAllocPortable = 1

	streamNonBlocking      = 1
	captureModeThreadLocal = 1
	eventDefault           = 0
	eventDisableTiming     = 2 // CU_EVENT_DISABLE_TIMING
)

// DeviceCount reports how many CUDA devices the driver sees. It fails with an
// error marked ErrNoGPU when there is no driver or no device.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check("cuDeviceGetCount", call(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.WithHint(errors.Mark(errors.New("the NVIDIA driver is loaded but sees no GPU"), ErrNoGPU), cpuHint)
	}
	return int(n), nil
}
