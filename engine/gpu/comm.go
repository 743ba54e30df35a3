package gpu

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
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

// ParseComm accepts local, oneshot or nccl.
func ParseComm(s string) (CommKind, error) {
	switch k := CommKind(s); k {
	case CommLocal, CommOneShot, CommNCCL:
		return k, nil
	}
	return "", errors.WithHint(errors.Newf("unknown communicator %q", s), "use local, oneshot or nccl")
}

// communicator is a collective over every rank's device buffer, called once
// for all ranks (the sharded engine drives its ranks in lockstep); devs[k]
// is rank k's device. After allReduce every buffer holds the same bits.
type communicator interface {
	name() string
	allReduce(devs []device, bufs []cuda.DevPtr, n int) error
	broadcast(devs []device, bufs []cuda.DevPtr, root int, nbytes int64) error
	close(b device) error
}

func newComm(kind CommKind, r runner, N int) (communicator, error) {
	switch kind {
	case CommLocal:
		return localComm{}, nil
	case CommOneShot:
		if _, ok := r.(*emuRunner); ok {
			return nil, errors.WithHint(errors.New("the one-shot all-reduce is a CUDA kernel: no emulation"), "use the local communicator on the emulator")
		}
		return &oneShotComm{tables: map[string]cuda.DevPtr{}}, nil
	case CommNCCL:
		return newNCCLComm(r, N)
	}
	_, err := ParseComm(string(kind))
	return nil, err
}

// localComm adds rank buffers into rank 0's in rank order with the device's
// add kernel and copies the sum back: every rank on one device.
type localComm struct{}

func (localComm) name() string { return string(CommLocal) }

func (localComm) allReduce(devs []device, bufs []cuda.DevPtr, n int) error {
	b := devs[0]
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

func (localComm) broadcast(devs []device, bufs []cuda.DevPtr, root int, nbytes int64) error {
	for k := range bufs {
		if k != root {
			if err := devs[root].copyDD(bufs[k], bufs[root], nbytes); err != nil {
				return err
			}
		}
	}
	return nil
}

func (localComm) close(device) error { return nil }

// oneShotComm runs kernels.AllReduceOneShot over a device table of the
// rank buffers (one table per buffer set, kept: the engine reuses the same
// workspace buffers every layer).
type oneShotComm struct {
	tables map[string]cuda.DevPtr
}

func (*oneShotComm) name() string { return string(CommOneShot) }

func (c *oneShotComm) table(b device, bufs []cuda.DevPtr) (cuda.DevPtr, error) {
	key := make([]byte, 8*len(bufs))
	for i, p := range bufs {
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

func (c *oneShotComm) allReduce(devs []device, bufs []cuda.DevPtr, n int) error {
	cd, ok := devs[0].(*cudaDevice)
	if !ok {
		return errors.New("one-shot all-reduce needs a CUDA device")
	}
	t, err := c.table(cd, bufs)
	if err != nil {
		return err
	}
	return cd.k.AllReduceOneShot(cd.s, t, len(bufs), n)
}

func (c *oneShotComm) broadcast(devs []device, bufs []cuda.DevPtr, root int, nbytes int64) error {
	return localComm{}.broadcast(devs, bufs, root, nbytes)
}

func (c *oneShotComm) close(b device) error {
	var errs error
	for k, t := range c.tables {
		errs = errors.CombineErrors(errs, b.free(t))
		delete(c.tables, k)
	}
	return errs
}

// ncclComm is NCCL with one communicator per rank, created together in
// this process (ncclCommInitAll); several ranks are issued in one group.
type ncclComm struct {
	lib   *cuda.NCCL
	comms []cuda.NCCLComm
}

func newNCCLComm(r runner, N int) (communicator, error) {
	cr, ok := r.(*cudaRunner)
	if !ok {
		return nil, errors.WithHint(errors.New("NCCL needs GPUs"), "use the local communicator on the emulator")
	}
	if N > 1 {
		return nil, errors.WithHint(errors.Newf("NCCL cannot run %d ranks on one device", N),
			"use --comm oneshot or local for several ranks on one GPU; NCCL needs one GPU per rank")
	}
	lib, err := cuda.LoadNCCL()
	if err != nil {
		return nil, err
	}
	c := &ncclComm{lib: lib}
	err = cr.run(func(device) error {
		var err error
		c.comms, err = lib.CommInitAll([]int{cr.info.Ordinal})
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *ncclComm) name() string { return string(CommNCCL) }

func (c *ncclComm) allReduce(devs []device, bufs []cuda.DevPtr, n int) error {
	return c.group(func(k int, cd *cudaDevice) error {
		return c.lib.AllReduceSumF32(bufs[k], bufs[k], int64(n), c.comms[k], cd.s)
	}, devs)
}

func (c *ncclComm) broadcast(devs []device, bufs []cuda.DevPtr, root int, nbytes int64) error {
	return c.group(func(k int, cd *cudaDevice) error {
		return c.lib.Broadcast(bufs[k], bufs[k], nbytes, root, c.comms[k], cd.s)
	}, devs)
}

func (c *ncclComm) group(f func(k int, cd *cudaDevice) error, devs []device) error {
	if err := c.lib.GroupStart(); err != nil {
		return err
	}
	var errs error
	for k, d := range devs {
		cd, ok := d.(*cudaDevice)
		if !ok {
			errs = errors.CombineErrors(errs, errors.New("NCCL needs CUDA devices"))
			break
		}
		if err := f(k, cd); err != nil {
			errs = errors.CombineErrors(errs, err)
			break
		}
	}
	return errors.CombineErrors(errs, c.lib.GroupEnd())
}

func (c *ncclComm) close(device) error {
	var errs error
	for _, cm := range c.comms {
		errs = errors.CombineErrors(errs, c.lib.CommDestroy(cm))
	}
	c.comms = nil
	return errs
}
