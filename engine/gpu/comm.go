package gpu

import (
	"os"
	"runtime"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/cuda/kernels"
)

// CommKind names a communicator of the sharded engine.
type CommKind string

const (
	// CommLocal sums with the device's own add and copy kernels: ranks on
	// one device, and the emulator.
	CommLocal CommKind = "local"
	// CommOneShot sums every rank's buffer in one kernel that reads each
	// rank once and writes each rank once (ranks on one device; across GPUs
	// the same kernel over peer-mapped buffers).
	CommOneShot CommKind = "oneshot"
	// CommNCCL is NCCL's all-reduce and broadcast (libnccl opened at run
	// time); NCCL refuses two ranks on one device.
	CommNCCL CommKind = "nccl"
)

// ParseComm accepts auto (returned as ""), local, oneshot or nccl.
func ParseComm(s string) (CommKind, error) {
	switch k := CommKind(s); k {
	case CommLocal, CommOneShot, CommNCCL:
		return k, nil
	case "auto", "":
		return "", nil
	}
	return "", errors.WithHint(errors.Newf("unknown communicator %q", s), "use auto, oneshot, local or nccl")
}

// rankExec is the ranks as a communicator sees them (the sharded engine
// drives its ranks in lockstep and calls a collective once for all).
type rankExec interface {
	// singleDevice is the device every rank is on (inside its run), or nil.
	singleDevice() device
	// onRanks runs f for every rank on that rank's device.
	onRanks(f func(k int, b device) error) error
}

// communicator is a collective over every rank's device buffer bufs[k].
// After allReduce every buffer holds the same bits (sums in rank order).
type communicator interface {
	name() string
	allReduce(x rankExec, bufs []cuda.DevPtr, n int) error
	// allReduceAddNorm, where the communicator fuses it, sums parts (rows x
	// D each, rank order) and for every rank k adds the sum into xs[k] and
	// writes hs[k] = rmsnorm(xs[k]) * ws[k]: the same bits as allReduce
	// then addRMSNorm on every rank. false: not fused here, the caller runs
	// that pair.
	allReduceAddNorm(x rankExec, parts, xs, hs, ws []cuda.DevPtr, rows, D int, eps float32) (bool, error)
	broadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error
	close(b device) error
}

func newComm(kind CommKind, runners []runner, N int, ordinals []int) (communicator, error) {
	_, emu := runners[0].(*emuRunner)
	switch kind {
	case CommLocal:
		return localComm{}, nil
	case CommOneShot:
		if len(runners) > 1 {
			return nil, errors.WithHint(errors.New("the one-shot all-reduce across GPUs needs peer-mapped buffers, not built yet"),
				"use --comm nccl (or auto) for ranks on several GPUs")
		}
		return &oneShotComm{tables: map[string]cuda.DevPtr{}}, nil
	case CommNCCL:
		if emu {
			return nil, errors.WithHint(errors.New("NCCL needs GPUs"), "use the local communicator on the emulator")
		}
		return newNCCLComm(ordinals)
	}
	_, err := ParseComm(string(kind))
	if err == nil {
		err = errors.Newf("communicator %q", kind)
	}
	return nil, err
}

// localComm adds rank buffers into rank 0's in rank order with the device's
// add kernel and copies the sum back, every rank on one device; across
// devices it goes through host memory (a baseline: correct, not fast).
type localComm struct{}

func (localComm) name() string { return string(CommLocal) }

func (localComm) allReduce(x rankExec, bufs []cuda.DevPtr, n int) error {
	b := x.singleDevice()
	if b == nil {
		return hostAllReduce(x, bufs, n)
	}
	for k := 1; k < len(bufs); k++ {
		if err := b.add(bufs[0], bufs[0], bufs[k], n); err != nil {
			return err
		}
	}
	for k := 1; k < len(bufs); k++ {
		if err := b.copyDD(bufs[k], bufs[0], int64(4*n)); err != nil {
			return err
		}
	}
	return nil
}

func (localComm) allReduceAddNorm(rankExec, []cuda.DevPtr, []cuda.DevPtr, []cuda.DevPtr, []cuda.DevPtr, int, int, float32) (bool, error) {
	return false, nil
}

func (localComm) broadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error {
	b := x.singleDevice()
	if b == nil {
		return hostBroadcast(x, bufs, root, nbytes)
	}
	for k := range bufs {
		if k != root {
			if err := b.copyDD(bufs[k], bufs[root], nbytes); err != nil {
				return err
			}
		}
	}
	return nil
}

// hostAllReduce downloads every rank's buffer, adds them in rank order in
// float32 (the same bits as the device's add) and uploads the sum.
func hostAllReduce(x rankExec, bufs []cuda.DevPtr, n int) error {
	parts := make([][]byte, len(bufs))
	err := x.onRanks(func(k int, b device) error {
		parts[k] = make([]byte, 4*n)
		return b.download(parts[k], bufs[k])
	})
	if err != nil {
		return err
	}
	sum := bytesF32(parts[0])
	for _, p := range parts[1:] {
		v := bytesF32(p)
		for i := range sum {
			sum[i] += v[i]
		}
	}
	out := f32Bytes(sum)
	return x.onRanks(func(k int, b device) error {
		if err := b.upload(bufs[k], out); err != nil {
			return err
		}
		return b.sync()
	})
}

func hostBroadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error {
	data := make([]byte, nbytes)
	err := x.onRanks(func(k int, b device) error {
		if k == root {
			return b.download(data, bufs[k])
		}
		return nil
	})
	if err != nil {
		return err
	}
	return x.onRanks(func(k int, b device) error {
		if k == root {
			return nil
		}
		if err := b.upload(bufs[k], data); err != nil {
			return err
		}
		return b.sync()
	})
}

func (localComm) close(device) error { return nil }

// oneShotComm runs the one-shot kernels over device tables of the rank
// buffers (one table per buffer set, kept: the engine reuses the same
// workspace buffers every layer), through the device interface, so a
// sharded step on one device is captured in its CUDA graph like any other
// launch and the emulator runs the same calls.
type oneShotComm struct {
	tables map[string]cuda.DevPtr
}

func (*oneShotComm) name() string { return string(CommOneShot) }

// fusedAROn: TILERT_GPU_AR_FUSED=0 keeps the all-reduce and the residual
// add + RMSNorm as separate launches (comparisons).
var fusedAROn = os.Getenv("TILERT_GPU_AR_FUSED") != "0"

func (c *oneShotComm) table(b device, ptrs []cuda.DevPtr) (cuda.DevPtr, error) {
	key := make([]byte, 8*len(ptrs))
	for i, p := range ptrs {
		for j := 0; j < 8; j++ {
			key[8*i+j] = byte(uint64(p) >> (8 * j))
		}
	}
	if t, ok := c.tables[string(key)]; ok {
		return t, nil
	}
	t, err := b.alloc(int64(len(key)))
	if err != nil {
		return 0, err
	}
	if err := b.upload(t, key); err != nil {
		return 0, err
	}
	// The upload is from pageable memory: staged before it returns.
	c.tables[string(key)] = t
	return t, nil
}

func (c *oneShotComm) allReduce(x rankExec, bufs []cuda.DevPtr, n int) error {
	b := x.singleDevice()
	if b == nil {
		return errors.New("one-shot all-reduce needs every rank on one device")
	}
	t, err := c.table(b, bufs)
	if err != nil {
		return err
	}
	return b.allReduceOneShot(t, len(bufs), n)
}

func (c *oneShotComm) allReduceAddNorm(x rankExec, parts, xs, hs, ws []cuda.DevPtr, rows, D int, eps float32) (bool, error) {
	b := x.singleDevice()
	if b == nil || !fusedAROn {
		return false, nil
	}
	pt, err := c.table(b, parts)
	if err != nil {
		return true, err
	}
	outs := make([]cuda.DevPtr, 0, 3*len(xs))
	for k := range xs {
		outs = append(outs, xs[k], hs[k], ws[k])
	}
	ot, err := c.table(b, outs)
	if err != nil {
		return true, err
	}
	return true, b.allReduceAddRMSNorm(pt, len(parts), ot, len(xs), rows, D, eps)
}

func (c *oneShotComm) broadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error {
	return localComm{}.broadcast(x, bufs, root, nbytes)
}

func (c *oneShotComm) close(b device) error {
	var errs error
	for k, t := range c.tables {
		errs = errors.CombineErrors(errs, b.free(t))
		delete(c.tables, k)
	}
	return errs
}

// commDevice is the device's part for the one-shot communicator: the
// kernels of cuda/kernels/comm_ops.go for ranks on one device (tables of
// that device's pointers, no barrier).
type commDevice interface {
	// allReduceOneShot is kernels.Set.AllReduceOneShot.
	allReduceOneShot(table cuda.DevPtr, nranks, n int) error
	// allReduceAddRMSNorm is kernels.Set.AllReduceAddRMSNorm without a
	// barrier: parts lists nranks buffers, outs nout (x, h, w) triples.
	allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32) error
}

func (b *cudaDevice) allReduceOneShot(table cuda.DevPtr, nranks, n int) error {
	return b.k.AllReduceOneShot(b.s, table, nranks, n)
}

func (b *cudaDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32) error {
	return b.k.AllReduceAddRMSNorm(b.s, parts, nranks, outs, nout, rows, D, eps, kernels.PeerBarrier{})
}

func (gb *graphDevice) allReduceOneShot(table cuda.DevPtr, nranks, n int) error {
	return gb.rec("allReduceOneShot", int64(8*nranks*n), func(b device) error { return b.allReduceOneShot(table, nranks, n) },
		ku(table), ki(nranks), ki(n))
}

func (gb *graphDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32) error {
	return gb.rec("allReduceAddRMSNorm", int64(4*rows*D*(nranks+3*nout)), func(b device) error {
		return b.allReduceAddRMSNorm(parts, nranks, outs, nout, rows, D, eps)
	}, ku(parts), ki(nranks), ku(outs), ki(nout), ki(rows), ki(D), kf(eps))
}

// allReduceOneShot: the sum in rank order, written to every buffer.
func (m *emuDevice) allReduceOneShot(table cuda.DevPtr, nranks, n int) error {
	if nranks < 1 || n <= 0 {
		return errors.Newf("emu allreduce_oneshot: nranks=%d n=%d", nranks, n)
	}
	bufs := m.ptrs(table, nranks)
	s := make([]float32, n)
	copy(s, m.f32(bufs[0], n))
	for _, p := range bufs[1:] {
		for i, v := range m.f32(p, n) {
			s[i] += v
		}
	}
	for _, p := range bufs {
		copy(m.f32(p, n), s)
	}
	return nil
}

// allReduceAddRMSNorm: the sum in rank order added into the first
// output's residual, copied to every output's, then each output's RMSNorm:
// the kernel's arithmetic (the same as the unfused pair's).
func (m *emuDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32) error {
	if nranks < 1 || nout < 1 || rows <= 0 || D <= 0 {
		return errors.Newf("emu allreduce_add_rmsnorm: nranks=%d nout=%d rows=%d D=%d", nranks, nout, rows, D)
	}
	ps, ov := m.ptrs(parts, nranks), m.ptrs(outs, 3*nout)
	n := rows * D
	x0 := m.f32(ov[0], n)
	pv := make([][]float32, nranks)
	for k, p := range ps {
		pv[k] = m.f32(p, n)
	}
	for i := range x0 {
		s := pv[0][i]
		for _, p := range pv[1:] {
			s += p[i]
		}
		x0[i] += s
	}
	for o := 0; o < nout; o++ {
		if o > 0 {
			copy(m.f32(ov[3*o], n), x0)
		}
		if err := m.rmsnorm(ov[3*o+1], ov[3*o], ov[3*o+2], rows, D, D, D, eps); err != nil {
			return err
		}
	}
	return nil
}

// ncclComm is NCCL with one communicator per rank, created together in
// this process (ncclCommInitAll); the ranks' calls are issued in one group.
// NCCL switches the calling thread's current device, so every NCCL call
// runs on a thread of its own, never on a device thread.
type ncclComm struct {
	lib   *cuda.NCCL
	comms []cuda.NCCLComm
	th    *osThread
}

func newNCCLComm(ordinals []int) (communicator, error) {
	seen := map[int]bool{}
	for _, d := range ordinals {
		if seen[d] {
			return nil, errors.WithHint(errors.Newf("NCCL cannot run two ranks on GPU %d", d),
				"use --comm oneshot or local for several ranks on one GPU; NCCL needs one GPU per rank")
		}
		seen[d] = true
	}
	lib, err := cuda.LoadNCCL()
	if err != nil {
		return nil, err
	}
	c := &ncclComm{lib: lib, th: newOSThread()}
	err = c.th.do(func() error {
		var err error
		c.comms, err = lib.CommInitAll(ordinals)
		return err
	})
	if err != nil {
		c.th.stop()
		return nil, err
	}
	return c, nil
}

func (c *ncclComm) name() string { return string(CommNCCL) }

func (c *ncclComm) allReduce(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.group(x, func(k int, s cuda.Stream) error {
		return c.lib.AllReduceSumF32(bufs[k], bufs[k], int64(n), c.comms[k], s)
	})
}

func (c *ncclComm) allReduceAddNorm(rankExec, []cuda.DevPtr, []cuda.DevPtr, []cuda.DevPtr, []cuda.DevPtr, int, int, float32) (bool, error) {
	return false, nil
}

func (c *ncclComm) broadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error {
	return c.group(x, func(k int, s cuda.Stream) error {
		return c.lib.Broadcast(bufs[k], bufs[k], nbytes, root, c.comms[k], s)
	})
}

// group issues f for every rank, on its device's stream, in one NCCL group
// on the NCCL thread; work queued before it on those streams runs first.
func (c *ncclComm) group(x rankExec, f func(k int, s cuda.Stream) error) error {
	streams := make([]cuda.Stream, len(c.comms))
	if b := x.singleDevice(); b != nil {
		cd, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("NCCL needs CUDA devices")
		}
		for k := range streams {
			streams[k] = cd.s
		}
	} else if err := x.onRanks(func(k int, b device) error {
		cd, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("NCCL needs CUDA devices")
		}
		streams[k] = cd.s
		return nil
	}); err != nil {
		return err
	}
	err := c.th.do(func() error {
		if err := c.lib.GroupStart(); err != nil {
			return err
		}
		var errs error
		for k, s := range streams {
			if err := f(k, s); err != nil {
				errs = err
				break
			}
		}
		return errors.CombineErrors(errs, c.lib.GroupEnd())
	})
	// Several devices: the collective is queued on every rank's stream
	// after the phase before it, and the phase after it queues behind it:
	// no host wait.
	return err
}

func (c *ncclComm) close(device) error {
	err := c.th.do(func() error {
		var errs error
		for _, cm := range c.comms {
			errs = errors.CombineErrors(errs, c.lib.CommDestroy(cm))
		}
		return errs
	})
	c.comms = nil
	c.th.stop()
	return err
}

// osThread runs functions on one locked OS thread, which ends with it.
type osThread struct{ ch chan func() }

func newOSThread() *osThread {
	t := &osThread{ch: make(chan func())}
	go func() {
		// Never unlocked: the thread exits with the goroutine, taking
		// whatever current device NCCL left on it.
		runtime.LockOSThread()
		for f := range t.ch {
			f()
		}
	}()
	return t
}

func (t *osThread) do(f func() error) error {
	done := make(chan error, 1)
	t.ch <- func() { done <- f() }
	return <-done
}

func (t *osThread) stop() { close(t.ch) }
