package gpu

import (
	"os"
	"runtime"
	"sync"

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
	// reduceToRoot leaves the sum of every rank's buffer in rank 0's (the
	// others' may hold it too).
	reduceToRoot(x rankExec, bufs []cuda.DevPtr, n int) error
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
			return nil, errors.New("the one-shot all-reduce across GPUs is newPeerComm's")
		}
		return &oneShotComm{tables: map[string]cuda.DevPtr{}, scratch: map[int]cuda.DevPtr{}}, nil
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

func (c localComm) reduceToRoot(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.allReduce(x, bufs, n)
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
	tables  map[string]cuda.DevPtr
	scratch map[int]cuda.DevPtr // the fused kernel's, by hidden size (zeroed once)
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
	// Ranks on one device share their residual and norm buffers (the
	// sharded engine aliases them): one output triple per distinct pair.
	outs := make([]cuda.DevPtr, 0, 3*len(xs))
	seen := map[[2]cuda.DevPtr]bool{}
	for k := range xs {
		if !seen[[2]cuda.DevPtr{xs[k], hs[k]}] {
			seen[[2]cuda.DevPtr{xs[k], hs[k]}] = true
			outs = append(outs, xs[k], hs[k], ws[k])
		}
	}
	ot, err := c.table(b, outs)
	if err != nil {
		return true, err
	}
	sc, ok := c.scratch[D]
	if !ok {
		n := kernels.ArScratchBytes(kernels.ArMaxRows, D)
		if sc, err = b.alloc(n); err != nil {
			return true, err
		}
		c.scratch[D] = sc
		if err := b.zero(sc, n); err != nil {
			return true, err
		}
	}
	return true, b.allReduceAddRMSNorm(pt, len(parts), ot, len(outs)/3, rows, D, eps, sc)
}

func (c *oneShotComm) reduceToRoot(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.allReduce(x, bufs, n)
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
	for k, t := range c.scratch {
		errs = errors.CombineErrors(errs, b.free(t))
		delete(c.scratch, k)
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
	// barrier: parts lists nranks buffers, outs nout (x, h, w) triples,
	// scratch kernels.ArScratchBytes(rows, D) with zeroed counters.
	allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, scratch cuda.DevPtr) error
}

func (b *cudaDevice) allReduceOneShot(table cuda.DevPtr, nranks, n int) error {
	return b.k.AllReduceOneShot(b.s, table, nranks, n)
}

func (b *cudaDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, scratch cuda.DevPtr) error {
	return b.k.AllReduceAddRMSNorm(b.s, parts, nranks, outs, nout, rows, D, eps, scratch, kernels.PeerBarrier{})
}

func (gb *graphDevice) allReduceOneShot(table cuda.DevPtr, nranks, n int) error {
	return gb.rec("allReduceOneShot", int64(8*nranks*n), func(b device) error { return b.allReduceOneShot(table, nranks, n) },
		ku(table), ki(nranks), ki(n))
}

func (gb *graphDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, scratch cuda.DevPtr) error {
	return gb.rec("allReduceAddRMSNorm", int64(4*rows*D*(nranks+3*nout)), func(b device) error {
		return b.allReduceAddRMSNorm(parts, nranks, outs, nout, rows, D, eps, scratch)
	}, ku(parts), ki(nranks), ku(outs), ki(nout), ki(rows), ki(D), kf(eps), ku(scratch))
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
func (m *emuDevice) allReduceAddRMSNorm(parts cuda.DevPtr, nranks int, outs cuda.DevPtr, nout, rows, D int, eps float32, scratch cuda.DevPtr) error {
	if nranks < 1 || nout < 1 || rows <= 0 || D <= 0 || rows > kernels.ArMaxRows {
		return errors.Newf("emu allreduce_add_rmsnorm: nranks=%d nout=%d rows=%d D=%d", nranks, nout, rows, D)
	}
	m.mem(scratch, int(kernels.ArScratchBytes(rows, D))) // the kernel's scratch must be there
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

func (c *ncclComm) reduceToRoot(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.allReduce(x, bufs, n)
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

// peerComm is the one-shot communicator of ranks on several GPUs (or, in
// tests, on several streams of one GPU): one rank per device thread, each
// rank's kernels read its peers' buffers through peer-mapped memory after a
// flag barrier in device memory, so a collective is queued behind the
// rank's own work with no host wait. The barrier is its own one-block
// launch (kernels.PeerWait) before the data kernel: inside a data kernel
// every block waits, which needs all of a grid's blocks resident at once,
// and 8 ranks sharing one GPU's SMs (the tests) are not (a TP-8 prefill
// chunk hung that way on the H200); one block per rank always is.
// The buffers peers read must stay unchanged until they passed the next
// barrier: the engine's two per-layer partials alternate (attention's in
// its own buffer, shardBackend.attnPart; the MLP's in ws.mo), the selection
// is rewritten only a layer later, and the logits are summed by the root
// alone.
type peerComm struct {
	runners []*cudaRunner // rank k's
	flags   []cuda.DevPtr // rank k's flag array (kernels.PeerFlagBytes), on its GPU
	flagT   []cuda.DevPtr // rank k's table of every rank's flag array
	scratch []cuda.DevPtr // rank k's fused-kernel scratch
	sums    []cuda.DevPtr // rank k's sum buffer (allReduce), grown on demand
	sumN    []int
	tables  []map[string]cuda.DevPtr // rank k's pointer tables, on its GPU
	owned   [][]cuda.DevPtr
}

// newPeerComm maps every rank's GPU into every other's, loads the kernels
// and allocates the flags (zeroed) and scratch of each rank on its GPU.
func newPeerComm(s *shardBackend) (*peerComm, error) {
	N := len(s.ranks)
	c := &peerComm{runners: make([]*cudaRunner, N), flags: make([]cuda.DevPtr, N), flagT: make([]cuda.DevPtr, N),
		scratch: make([]cuda.DevPtr, N), sums: make([]cuda.DevPtr, N), sumN: make([]int, N),
		tables: make([]map[string]cuda.DevPtr, N), owned: make([][]cuda.DevPtr, N)}
	for ri, ks := range s.byRunner {
		cr, ok := s.runners[ri].(*cudaRunner)
		if len(ks) != 1 || !ok {
			return nil, errors.WithHint(errors.New("the one-shot all-reduce across GPUs runs one rank per GPU"),
				"list each GPU once in --devices (0,1,2,3,...), or put every rank on one GPU (0,0,0,0), or use --comm nccl")
		}
		c.runners[ks[0]] = cr
		c.tables[ks[0]] = map[string]cuda.DevPtr{}
	}
	maxRows := s.ranks[0].maxRows
	H := s.cfg.HiddenSize
	err := c.each(func(k int, cd *cudaDevice) error {
		if err := cd.k.Preload(); err != nil {
			return err
		}
		for j, pr := range c.runners {
			if j == k || pr.dev == c.runners[k].dev {
				continue
			}
			can, err := cd.c.CanAccessPeer(pr.dev)
			if err != nil {
				return err
			}
			if !can {
				return errors.WithHintf(errors.Newf("GPU %d cannot map GPU %d's memory (no peer-to-peer path)", c.runners[k].info.Ordinal, pr.info.Ordinal),
					"use --comm nccl on this machine (the one-shot all-reduce needs NVLink or PCIe peer-to-peer between every pair of GPUs)")
			}
			if err := cd.c.EnablePeerAccess(pr.dev); err != nil {
				return errors.Wrapf(err, "mapping GPU %d into GPU %d", pr.info.Ordinal, c.runners[k].info.Ordinal)
			}
		}
		var err error
		if c.flags[k], err = c.zeroed(k, cd, kernels.PeerFlagBytes(N)); err != nil {
			return err
		}
		c.scratch[k], err = c.zeroed(k, cd, kernels.ArScratchBytes(maxRows, H))
		return err
	})
	if err == nil {
		err = c.each(func(k int, cd *cudaDevice) error {
			var err error
			c.flagT[k], err = c.table(k, cd, c.flags)
			return err
		})
	}
	if err != nil {
		return nil, errors.CombineErrors(err, c.closeAll())
	}
	return c, nil
}

func (c *peerComm) zeroed(k int, cd *cudaDevice, n int64) (cuda.DevPtr, error) {
	p, err := cd.alloc(n)
	if err != nil {
		return 0, err
	}
	c.owned[k] = append(c.owned[k], p)
	return p, cd.zero(p, n)
}

// each runs f on every rank's device thread at once.
func (c *peerComm) each(f func(k int, cd *cudaDevice) error) error {
	errs := make([]error, len(c.runners))
	var wg sync.WaitGroup
	for k, r := range c.runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = r.run(func(b device) error { return f(k, b.(*cudaDevice)) })
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// table is rank k's device copy of ptrs (kept: the engine reuses the same
// buffers every layer).
func (c *peerComm) table(k int, b device, ptrs []cuda.DevPtr) (cuda.DevPtr, error) {
	key := make([]byte, 8*len(ptrs))
	for i, p := range ptrs {
		for j := 0; j < 8; j++ {
			key[8*i+j] = byte(uint64(p) >> (8 * j))
		}
	}
	if t, ok := c.tables[k][string(key)]; ok {
		return t, nil
	}
	t, err := b.alloc(int64(len(key)))
	if err != nil {
		return 0, err
	}
	c.owned[k] = append(c.owned[k], t)
	if err := b.upload(t, key); err != nil {
		return 0, err
	}
	c.tables[k][string(key)] = t
	return t, nil
}

func (c *peerComm) bar(k int) kernels.PeerBarrier {
	return kernels.PeerBarrier{Flags: c.flags[k], Table: c.flagT[k], Rank: k, Ranks: len(c.runners)}
}

func (*peerComm) name() string { return string(CommOneShot) }

// onRank runs f for every rank on its device (inside the engine's phase).
func (c *peerComm) onRank(x rankExec, f func(k int, cd *cudaDevice) error) error {
	return x.onRanks(func(k int, b device) error {
		cd, ok := b.(*cudaDevice)
		if !ok {
			return errors.New("the one-shot all-reduce across GPUs needs CUDA devices")
		}
		return f(k, cd)
	})
}

// allReduce: each rank sums every rank's buffer into its own sum buffer
// (after the barrier), waits until every rank has read (a second barrier),
// then copies the sum into its buffer.
func (c *peerComm) allReduce(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.onRank(x, func(k int, cd *cudaDevice) error {
		if c.sumN[k] < n {
			p, err := cd.alloc(int64(4 * n))
			if err != nil {
				return err
			}
			c.owned[k] = append(c.owned[k], p)
			c.sums[k], c.sumN[k] = p, n
		}
		t, err := c.table(k, cd, bufs)
		if err != nil {
			return err
		}
		if err := cd.k.PeerWait(cd.s, 1, c.bar(k)); err != nil {
			return err
		}
		if err := cd.k.AllReduceTo(cd.s, t, len(bufs), c.sums[k], n, kernels.PeerBarrier{}); err != nil {
			return err
		}
		if err := cd.k.PeerWait(cd.s, 1, c.bar(k)); err != nil {
			return err
		}
		return cd.copyDD(bufs[k], c.sums[k], int64(4*n))
	})
}

// reduceToRoot: rank 0 sums every rank's buffer into its own after the
// barrier; the others only take part in the barrier (theirs is written).
func (c *peerComm) reduceToRoot(x rankExec, bufs []cuda.DevPtr, n int) error {
	return c.onRank(x, func(k int, cd *cudaDevice) error {
		if err := cd.k.PeerWait(cd.s, 1, c.bar(k)); err != nil || k != 0 {
			return err
		}
		if c.sumN[0] < n {
			p, err := cd.alloc(int64(4 * n))
			if err != nil {
				return err
			}
			c.owned[0] = append(c.owned[0], p)
			c.sums[0], c.sumN[0] = p, n
		}
		t, err := c.table(0, cd, bufs)
		if err != nil {
			return err
		}
		if err := cd.k.AllReduceTo(cd.s, t, len(bufs), c.sums[0], n, kernels.PeerBarrier{}); err != nil {
			return err
		}
		return cd.copyDD(bufs[0], c.sums[0], int64(4*n))
	})
}

func (c *peerComm) allReduceAddNorm(x rankExec, parts, xs, hs, ws []cuda.DevPtr, rows, D int, eps float32) (bool, error) {
	return true, c.onRank(x, func(k int, cd *cudaDevice) error {
		pt, err := c.table(k, cd, parts)
		if err != nil {
			return err
		}
		ot, err := c.table(k, cd, []cuda.DevPtr{xs[k], hs[k], ws[k]})
		if err != nil {
			return err
		}
		if err := cd.k.PeerWait(cd.s, 1, c.bar(k)); err != nil {
			return err
		}
		return cd.k.AllReduceAddRMSNorm(cd.s, pt, len(parts), ot, 1, rows, D, eps, c.scratch[k], kernels.PeerBarrier{})
	})
}

// broadcast: every rank copies the root's buffer after the barrier (the
// root takes part in the barrier only).
func (c *peerComm) broadcast(x rankExec, bufs []cuda.DevPtr, root int, nbytes int64) error {
	return c.onRank(x, func(k int, cd *cudaDevice) error {
		if err := cd.k.PeerWait(cd.s, 1, c.bar(k)); err != nil || k == root {
			return err
		}
		return cd.k.BroadcastFrom(cd.s, bufs[root], bufs[k], nbytes, kernels.PeerBarrier{})
	})
}

// close: the shard backend calls closeAll instead (every rank's GPU).
func (c *peerComm) close(device) error { return nil }

func (c *peerComm) closeAll() error {
	var errs error
	for k, r := range c.runners {
		if r == nil || len(c.owned[k]) == 0 {
			continue
		}
		owned := c.owned[k]
		c.owned[k] = nil
		errs = errors.CombineErrors(errs, r.run(func(b device) error {
			var errs error
			for _, p := range owned {
				errs = errors.CombineErrors(errs, b.free(p))
			}
			return errs
		}))
	}
	return errs
}
