package cuda

import (
	"testing"
	"unsafe"
)

// CUgraphEdgeData is 8 bytes (from_port, to_port, type, 5 reserved): the
// driver reads an array of them.
func TestGraphEdgeDataLayout(t *testing.T) {
	var e graphEdgeData
	if n := unsafe.Sizeof(e); n != 8 {
		t.Fatalf("graphEdgeData is %d bytes, want 8", n)
	}
	if o := unsafe.Offsetof(e.typ); o != 2 {
		t.Fatalf("graphEdgeData.typ at byte %d, want 2", o)
	}
}
