package cuda

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/cockroachdb/errors"
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

// edgeTestSource: a kernel that spins ~20 us before it writes, and one that
// waits for its programmatic predecessors (griddepcontrol.wait) before it
// reads what the first wrote.
const edgeTestSource = `
extern "C" __global__ void edge_spin_write(int* p, unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
  p[threadIdx.x] = 1000 + (int)threadIdx.x;
}
extern "C" __global__ void edge_wait_copy(const int* p, int* q) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  q[threadIdx.x] = p[threadIdx.x] + 1;
}
`

// TestProgrammaticDeps (GPU, sm_90): a graph captured on two streams, the
// second's kernel behind the first's through an event, with the edge made
// programmatic (ProgrammaticDeps: one edge); replayed, the second kernel
// reads the first's writes (its wait holds it until they are visible).
// Outside a capture ProgrammaticDeps changes nothing.
func TestProgrammaticDeps(t *testing.T) {
	d := openTestDevice(t)
	if d.Info.CCMajor < 9 {
		t.Skipf("%s: griddepcontrol needs sm_90", d.Info.Arch())
	}
	nv, err := LoadNVRTC()
	if err != nil {
		t.Skipf("NVRTC: %v", err)
	}
	ptx, log, err := nv.CompileLog(edgeTestSource, "edge.cu", []string{"--gpu-architecture=" + d.Info.Arch()}, false)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	const n = 64
	noAPI := false
	err = d.Do(func(c *Ctx) error {
		if c.drv.cuStreamUpdateCaptureDependencies == 0 || c.drv.cuStreamGetCaptureInfo == 0 {
			noAPI = true // skipped below: t.Skip only from the test's goroutine
			return nil
		}
		m, err := c.LoadModule("edge", ptx)
		if err != nil {
			return err
		}
		fw, err := c.Function(m, "edge_spin_write")
		if err != nil {
			return err
		}
		fc, err := c.Function(m, "edge_wait_copy")
		if err != nil {
			return err
		}
		var ss [2]Stream
		var ev [2]Event
		for i := range ss {
			if ss[i], err = c.NewStream(); err != nil {
				return err
			}
			defer func(s Stream) { _ = c.DestroyStream(s) }(ss[i])
			if ev[i], err = c.NewSyncEvent(); err != nil {
				return err
			}
			defer func(e Event) { _ = c.DestroyEvent(e) }(ev[i])
		}
		if got, err := c.ProgrammaticDeps(ss[1]); err != nil || got != 0 {
			t.Errorf("outside a capture: %d edges changed, %v (want 0, nil)", got, err)
		}
		p, err := c.memAlloc(4 * n)
		if err != nil {
			return err
		}
		defer c.memFree(p)
		q, err := c.memAlloc(4 * n)
		if err != nil {
			return err
		}
		defer c.memFree(q)
		if err := c.BeginCapture(ss[0]); err != nil {
			return err
		}
		if err := c.LaunchWith(fw, D1(1), D1(n), 0, ss[0], LaunchOpts{}, p, uint64(20000)); err != nil {
			return err
		}
		if err := c.Record(ev[0], ss[0]); err != nil {
			return err
		}
		if err := c.WaitEvent(ss[1], ev[0]); err != nil {
			return err
		}
		changed, perr := c.ProgrammaticDeps(ss[1])
		if perr == nil {
			perr = c.LaunchWith(fc, D1(1), D1(n), 0, ss[1], LaunchOpts{}, p, q)
		}
		if perr == nil {
			perr = c.Record(ev[1], ss[1])
		}
		if perr == nil {
			perr = c.WaitEvent(ss[0], ev[1])
		}
		g, err := c.EndCapture(ss[0])
		if perr != nil || err != nil {
			return errors.CombineErrors(perr, err)
		}
		defer func() { _ = c.DestroyGraph(g) }()
		if changed != 1 {
			t.Errorf("%d edges made programmatic, want 1", changed)
		}
		if err := c.Upload(q, make([]byte, 4*n)); err != nil {
			return err
		}
		if err := c.LaunchGraph(g, ss[0]); err != nil {
			return err
		}
		if err := c.SyncStream(ss[0]); err != nil {
			return err
		}
		got := make([]byte, 4*n)
		if err := c.Download(got, q); err != nil {
			return err
		}
		for i := range n {
			if v := int32(binary.LittleEndian.Uint32(got[4*i:])); v != int32(1001+i) {
				t.Errorf("thread %d read %d after the wait, want %d", i, v-1, 1000+i)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if noAPI {
		t.Skip("the driver has no cuStreamUpdateCaptureDependencies_v2")
	}
}
