package cuda

import (
	"runtime"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// graphEdgeData is CUgraphEdgeData: the ports and type of a graph edge.
type graphEdgeData struct {
	fromPort, toPort, typ uint8
	_                     [5]uint8
}

const (
	captureStatusActive    = 1 // CU_STREAM_CAPTURE_STATUS_ACTIVE
	graphNodeTypeKernel    = 0 // CU_GRAPH_NODE_TYPE_KERNEL
	graphDependencyProgram = 1 // CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
	graphKernelPortProgram = 1 // CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
	setCaptureDependencies = 1 // CU_STREAM_SET_CAPTURE_DEPENDENCIES
)

// ProgrammaticDeps makes the edges from the kernel nodes that the next node
// captured on s will depend on programmatic: that node may then become
// resident while they run, as a programmatic launch behind a kernel on one
// stream does, and must wait for them (griddepcontrol.wait) before it reads
// what they write. Stream capture makes only a programmatic launch's edge
// from the kernel before it on its own stream programmatic; an edge from
// another stream's kernel, through an event, stays a full one (as session
// 64's trace read it: a programmatic launch there did not start early;
// engine/gpu NOTES "Session 64"). It returns
// the edges it changed (0 outside a capture, or where no dependency is a
// kernel node).
func (c *Ctx) ProgrammaticDeps(s Stream) (int, error) {
	d := c.drv
	if d.cuStreamGetCaptureInfo == 0 || d.cuStreamUpdateCaptureDependencies == 0 || d.cuGraphNodeGetType == 0 {
		return 0, errors.WithHint(errors.New("the driver has no cuStreamGetCaptureInfo_v3 / cuStreamUpdateCaptureDependencies_v2"),
			"programmatic edges between streams need a CUDA 12.3+ driver: update it, or unset the switch that asked for them")
	}
	var status uint32
	var id uint64
	var graph uintptr
	var deps, edges unsafe.Pointer
	var n uintptr
	if err := c.check("cuStreamGetCaptureInfo_v3", call(d.cuStreamGetCaptureInfo, uintptr(s), uintptr(unsafe.Pointer(&status)),
		uintptr(unsafe.Pointer(&id)), uintptr(unsafe.Pointer(&graph)), uintptr(unsafe.Pointer(&deps)),
		uintptr(unsafe.Pointer(&edges)), uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	if status != captureStatusActive || n == 0 || deps == nil {
		return 0, nil
	}
	nodes := append([]uintptr(nil), unsafe.Slice((*uintptr)(deps), n)...)
	data := make([]graphEdgeData, n)
	if edges != nil {
		copy(data, unsafe.Slice((*graphEdgeData)(edges), n))
	}
	changed := 0
	for i, nd := range nodes {
		var typ uint32
		if err := c.check("cuGraphNodeGetType", call(d.cuGraphNodeGetType, nd, uintptr(unsafe.Pointer(&typ)))); err != nil {
			return 0, err
		}
		if typ == graphNodeTypeKernel && data[i].typ != graphDependencyProgram {
			data[i] = graphEdgeData{fromPort: graphKernelPortProgram, typ: graphDependencyProgram}
			changed++
		}
	}
	if changed == 0 {
		return 0, nil
	}
	err := c.check("cuStreamUpdateCaptureDependencies_v2", call(d.cuStreamUpdateCaptureDependencies, uintptr(s),
		uintptr(unsafe.Pointer(&nodes[0])), uintptr(unsafe.Pointer(&data[0])), n, setCaptureDependencies))
	runtime.KeepAlive(nodes)
	runtime.KeepAlive(data)
	if err != nil {
		return 0, err
	}
	return changed, nil
}
