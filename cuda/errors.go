package cuda

import (
	"fmt"

	"github.com/cockroachdb/errors"
)

// ErrNoGPU marks errors meaning "no usable CUDA driver or device here".
// Callers test it with errors.Is to fall back to the CPU backend.
var ErrNoGPU = errors.New("no CUDA GPU available")

// cpuHint is attached to every no-GPU error so the user knows the way out.
const cpuHint = "run on the CPU backend with --device cpu, or install the NVIDIA driver (libcuda.so.1) on a machine with an NVIDIA GPU"

// CUresult is a CUDA driver API status code.
type CUresult int32

// cuErrorNames is the fallback when cuGetErrorName is unavailable (and what
// tests check); values are from cuda.h.
var cuErrorNames = map[CUresult]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	5:   "CUDA_ERROR_PROFILER_DISABLED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	218: "CUDA_ERROR_INVALID_PTX",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	999: "CUDA_ERROR_UNKNOWN",
}

// cuErrorHints says what to do about the errors a user can act on.
var cuErrorHints = map[CUresult]string{
	2:   "the GPU is out of memory: free other processes' memory (nvidia-smi) or lower max_seq_len / slots",
	3:   "cuInit was not called or failed; this is a bug in the gpu package",
	34:  "libcuda.so.1 is the toolkit's stub library, not the driver's: put the driver's libcuda.so.1 first on the library path",
	46:  "the GPU is busy or in exclusive-process mode and owned by another process",
	100: cpuHint,
	101: "the device ordinal does not exist; list GPUs with nvidia-smi",
	201: "CUDA context not current on this OS thread: CUDA calls must run inside (*Device).Do",
	209: "the kernel binary was built for another GPU architecture; delete the kernel cache ($XDG_CACHE_HOME/tilert/kernels)",
	218: "the driver cannot JIT this PTX: the NVRTC library is newer than the driver; point TILERT_NVRTC at an NVRTC no newer than the driver",
	222: "the driver cannot JIT this PTX: the NVRTC library is newer than the driver; point TILERT_NVRTC at an NVRTC no newer than the driver",
	700: "a kernel read or wrote out of bounds; the context is unusable now, restart the process (compute-sanitizer helps locate it)",
	701: "a kernel asked for more registers or shared memory than the GPU has for its block size",
	716: "a kernel used a misaligned address (16-byte vector loads need 16-byte aligned pointers and strides)",
	719: "a kernel failed; the context is unusable now, restart the process",
	803: "the driver and its user-space library disagree in version; reboot or reinstall the NVIDIA driver",
	804: "this CUDA compatibility package does not support this GPU",
	901: "a stream capture was invalidated by an illegal call during capture (a synchronous copy or a sync)",
	908: "a CUDA call from another thread broke the capture; capture and launch on the device's own thread",
}

// CUDAError is a failed driver API call.
type CUDAError struct {
	Call   string
	Code   CUresult
	Name   string
	Detail string // cuGetErrorString when the driver provided it
}

func (e *CUDAError) Error() string {
	if e.Detail != "" && e.Detail != e.Name {
		return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, int(e.Code), e.Detail)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, int(e.Code))
}

// cuErrorName returns the table name, or a generic name for unknown codes.
func cuErrorName(r CUresult) string {
	if n, ok := cuErrorNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// newCUDAError builds the error for call failing with r; name/detail come
// from the driver when it is loaded (may be empty).
func newCUDAError(call string, r CUresult, name, detail string) error {
	if name == "" {
		name = cuErrorName(r)
	}
	var err error = &CUDAError{Call: call, Code: r, Name: name, Detail: detail}
	if r == 100 || r == 34 {
		err = errors.Mark(err, ErrNoGPU)
	}
	if h, ok := cuErrorHints[r]; ok {
		err = errors.WithHint(err, h)
	}
	return err
}

// NVRTCResult is an NVRTC status code.
type NVRTCResult int32

var nvrtcErrorNames = map[NVRTCResult]string{
	0:  "NVRTC_SUCCESS",
	1:  "NVRTC_ERROR_OUT_OF_MEMORY",
	2:  "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
	3:  "NVRTC_ERROR_INVALID_INPUT",
	4:  "NVRTC_ERROR_INVALID_PROGRAM",
	5:  "NVRTC_ERROR_INVALID_OPTION",
	6:  "NVRTC_ERROR_COMPILATION",
	7:  "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
	8:  "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
	9:  "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
	10: "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
	11: "NVRTC_ERROR_INTERNAL_ERROR",
}

func nvrtcErrorName(r NVRTCResult) string {
	if n, ok := nvrtcErrorNames[r]; ok {
		return n
	}
	return fmt.Sprintf("NVRTC_ERROR_%d", int(r))
}

// ErrNVRTCInvalidOption marks NVRTC's NVRTC_ERROR_INVALID_OPTION.
var ErrNVRTCInvalidOption = errors.New("NVRTC refused an option")

func newNVRTCError(call string, r NVRTCResult) error {
	err := errors.Newf("%s: %s (%d)", call, nvrtcErrorName(r), int(r))
	if r == 5 {
		err = errors.Mark(errors.WithHint(err, "this NVRTC does not know an option or the target architecture; set TILERT_NVRTC to a newer libnvrtc"),
			ErrNVRTCInvalidOption)
	}
	return err
}
