package rdma

import (
	"context"
	"sync"

	"github.com/cockroachdb/errors"
)

// DeviceSeg is one span of device memory to read.
type DeviceSeg struct {
	Addr uintptr
	Len  int64
}

// DeviceReader gives an engine without a device path (tcp) read access to
// GPU memory: the sender copies device regions through host buffers the
// reader hands out (pinned, so the copies are DMA), a chunk at a time.
type DeviceReader interface {
	// HostBuffer returns n bytes of host memory that Gather copies into
	// fastest (page-locked); FreeHostBuffer gives it back.
	HostBuffer(n int) ([]byte, error)
	FreeHostBuffer(b []byte) error
	// Gather copies segs of device memory on device back to back into dst
	// (len(dst) is their total) and returns when dst holds them.
	Gather(device int, dst []byte, segs []DeviceSeg) error
}

// deviceStaging is the tcp engine's pool of host buffers for device sources.
type deviceStaging struct {
	r     DeviceReader
	bytes int
	mu    sync.Mutex
	free  [][]byte
	all   [][]byte
}

func (d *deviceStaging) get() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n := len(d.free); n > 0 {
		b := d.free[n-1]
		d.free = d.free[:n-1]
		return b, nil
	}
	b, err := d.r.HostBuffer(d.bytes)
	if err != nil {
		return nil, errors.Wrap(err, "rdma/tcp: host buffer for device reads")
	}
	d.all = append(d.all, b)
	return b, nil
}

func (d *deviceStaging) put(b []byte) {
	d.mu.Lock()
	d.free = append(d.free, b)
	d.mu.Unlock()
}

func (d *deviceStaging) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var err error
	for _, b := range d.all {
		err = errors.CombineErrors(err, d.r.FreeHostBuffer(b))
	}
	d.all, d.free = nil, nil
	return err
}

// devPiece is one piece of a device-sourced op inside a staging chunk.
type devPiece struct {
	rem    Remote
	remOff uint64
	at, n  int64 // position in the chunk
}

type devChunk struct {
	device int
	segs   []DeviceSeg
	pieces []devPiece
	bytes  int64
}

// chunkDeviceOps cuts the device-sourced ops into chunks of at most
// staging bytes (pieces of at most pieceBytes, as host writes), each read
// with one Gather. Adjacent spans coalesce into one segment.
func chunkDeviceOps(ops []*WriteOp, regions func(RegionID) *tcpRegion, staging, pieceBytes int64) []*devChunk {
	var out []*devChunk
	var cur *devChunk
	for _, op := range ops {
		lr := regions(op.Local)
		for o := int64(0); o < op.Len; {
			if cur == nil || cur.bytes == staging || cur.device != lr.Device {
				cur = &devChunk{device: lr.Device}
				out = append(out, cur)
			}
			n := min(op.Len-o, pieceBytes, staging-cur.bytes)
			addr := lr.Addr + uintptr(op.LocalOff+o)
			if k := len(cur.segs); k > 0 && cur.segs[k-1].Addr+uintptr(cur.segs[k-1].Len) == addr {
				cur.segs[k-1].Len += n
			} else {
				cur.segs = append(cur.segs, DeviceSeg{Addr: addr, Len: n})
			}
			cur.pieces = append(cur.pieces, devPiece{rem: op.Remote, remOff: uint64(op.RemoteOff + o), at: cur.bytes, n: n})
			cur.bytes += n
			o += n
		}
	}
	return out
}

// sendDevice sends the device-sourced ops' chunks: the next chunk is read
// from the device while the current one goes out. It returns the number of
// pieces handed to streams and the first error.
func (p *tcpPeer) sendDevice(ctx context.Context, b *batch, chunks []*devChunk) (int64, error) {
	st := p.e.devStage
	type filled struct {
		c   *devChunk
		buf []byte
		err error
	}
	next := make(chan filled, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(next)
		for _, c := range chunks {
			buf, err := st.get()
			if err == nil {
				if err = st.r.Gather(c.device, buf[:c.bytes], c.segs); err != nil {
					err = errors.Wrap(err, "rdma/tcp: reading device memory")
				}
			}
			select {
			case next <- filled{c, buf, err}:
			case <-stop:
				if buf != nil {
					st.put(buf)
				}
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		for f := range next {
			if f.buf != nil {
				st.put(f.buf)
			}
		}
		wg.Wait()
	}()
	sent := int64(0)
	for f := range next {
		if f.err != nil {
			if f.buf != nil {
				st.put(f.buf)
			}
			return sent, f.err
		}
		for _, pc := range f.c.pieces {
			s := p.streams[int(p.next.Add(1))%len(p.streams)]
			// send returns once the payload is in the socket: the
			// buffer is free for the next chunk afterwards.
			if err := s.send(ctx, b, pc.rem, pc.remOff, f.buf[pc.at:pc.at+pc.n]); err != nil {
				st.put(f.buf)
				return sent, err
			}
			sent++
		}
		st.put(f.buf)
	}
	return sent, nil
}
