package convert

import (
	"context"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/numeric"
)

// chunk is a piece of an output tensor's bytes travelling from the reader to the writer.
type chunk struct {
	tensor int
	data   []byte
	buf    []byte // the pool buffer data lives in
	err    error
}

// writer streams the planned tensors into shard files. One goroutine reads the source (pread,
// so the checkpoint's pages never count against this process's memory) while the caller's
// goroutine checksums and writes; they share a fixed pool of buffers.
type writer struct {
	o     *Options
	dir   string
	ts    []outTensor
	total int64
	done  int64
}

func (w *writer) run(ctx context.Context, shards []shardPlan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool := make(chan []byte, w.o.Buffers)
	for range w.o.Buffers {
		pool <- make([]byte, w.o.ChunkBytes)
	}
	chunks := make(chan chunk, w.o.Buffers)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(chunks)
		r := &reader{files: map[string]*os.File{}}
		defer r.close()
		for _, s := range shards {
			for _, i := range s.tensors {
				if err := r.produce(ctx, i, &w.ts[i], pool, chunks); err != nil {
					select {
					case chunks <- chunk{tensor: i, err: err}:
					case <-ctx.Done():
					}
					return
				}
			}
		}
	}()
	err := w.consume(shards, chunks, pool)
	if err != nil && ctx.Err() != nil && errors.IsAssertionFailure(err) {
		err = errors.Wrap(ctx.Err(), "conversion stopped")
	}
	cancel()
	for range chunks { // let the reader finish
	}
	<-readerDone
	return err
}

func (w *writer) consume(shards []shardPlan, chunks <-chan chunk, pool chan<- []byte) error {
	for _, s := range shards {
		path := filepath.Join(w.dir, s.file)
		f, err := w.o.FS.Create(path)
		if err != nil {
			return errors.WithHint(errors.Wrapf(err, "create %s", path), "check that the output directory is writable")
		}
		if err := w.writeShard(f, path, &s, chunks, pool); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return errors.WithHint(errors.Wrapf(err, "fsync %s", path), "check free disk space and the disk's health")
		}
		if err := f.Close(); err != nil {
			return errors.Wrapf(err, "close %s", path)
		}
	}
	return nil
}

func (w *writer) writeShard(f WFile, path string, s *shardPlan, chunks <-chan chunk, pool chan<- []byte) error {
	if _, err := f.Write(s.header); err != nil {
		return errors.WithHint(errors.Wrapf(err, "write %s: header", path), "check free disk space")
	}
	for _, i := range s.tensors {
		t := &w.ts[i]
		var crc uint32
		for left := t.Bytes; left > 0; {
			c, ok := <-chunks
			if !ok {
				return errors.AssertionFailedf("reader stopped before tensor %q was complete", t.Name)
			}
			if c.err != nil {
				return c.err
			}
			if c.tensor != i || int64(len(c.data)) > left {
				return errors.AssertionFailedf("chunk for tensor %d (%d bytes) while writing %q (%d left)", c.tensor, len(c.data), t.Name, left)
			}
			crc = crc32.Update(crc, castagnoli, c.data)
			_, err := f.Write(c.data)
			left -= int64(len(c.data))
			w.done += int64(len(c.data))
			pool <- c.buf
			if err != nil {
				return errors.WithHint(errors.Wrapf(err, "write %s: tensor %q", path, t.Name), "check free disk space")
			}
			if w.o.Progress != nil {
				w.o.Progress(w.done, w.total)
			}
		}
		t.CRC32C = crcHex(crc)
	}
	return nil
}

// reader produces the chunks of output tensors from the source files.
type reader struct {
	files map[string]*os.File
	tmp   []byte
}

func (r *reader) close() {
	for _, f := range r.files {
		f.Close()
	}
}

func (r *reader) file(path string) (*os.File, error) {
	if f, ok := r.files[path]; ok {
		return f, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r.files[path] = f
	return f, nil
}

func (r *reader) produce(ctx context.Context, i int, t *outTensor, pool chan []byte, out chan<- chunk) error {
	var buf []byte
	var fill int
	get := func() error {
		select {
		case buf = <-pool:
			fill = 0
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	flush := func() error {
		if buf == nil || fill == 0 {
			return nil
		}
		select {
		case out <- chunk{tensor: i, data: buf[:fill], buf: buf}:
			buf = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, sg := range t.segs {
		if sg.gen != nil {
			// Generated segments are small (one head's row scales); give them a buffer of their own
			// size when they would not fit the chunk.
			if buf != nil && fill+int(sg.outN) > len(buf) {
				if err := flush(); err != nil {
					return err
				}
			}
			if buf == nil {
				if err := get(); err != nil {
					return err
				}
			}
			if int(sg.outN) > len(buf) {
				return errors.AssertionFailedf("tensor %q: generated segment of %d bytes exceeds the %d byte chunk", t.Name, sg.outN, len(buf))
			}
			sg.gen(buf[fill : fill+int(sg.outN)])
			fill += int(sg.outN)
			continue
		}
		f, err := r.file(sg.src.path)
		if err != nil {
			return errors.WithHint(errors.Wrapf(err, "open %s (tensor %q)", sg.src.path, sg.src.name), "check that the checkpoint is readable")
		}
		widen := 1
		if sg.conv == convBF16toF32 {
			widen = 2
		}
		for off := sg.off; off < sg.off+sg.n; {
			if buf == nil {
				if err := get(); err != nil {
					return err
				}
			}
			room := (len(buf) - fill) / widen
			if room < 8 {
				if err := flush(); err != nil {
					return err
				}
				continue
			}
			n := min(int64(room), sg.off+sg.n-off)
			if widen == 2 {
				n &^= 1 // whole bf16 elements
			}
			dst := buf[fill : fill+int(n)]
			if widen == 2 {
				if cap(r.tmp) < int(n) {
					r.tmp = make([]byte, n)
				}
				dst = r.tmp[:n]
			}
			if _, err := f.ReadAt(dst, sg.src.off+off); err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("file is shorter than its header says (truncated)")
				}
				return errors.WithHint(errors.Wrapf(err, "read %s: tensor %q at byte %d", sg.src.path, sg.src.name, off),
					"the checkpoint file is damaged or was changed during the conversion; re-download it")
			}
			if widen == 2 {
				vals := make([]float32, n/2)
				numeric.DecodeBF16(vals, dst)
				numeric.EncodeF32(buf[fill:fill+int(2*n)], vals)
			}
			fill += int(n) * widen
			off += n
			if fill == len(buf) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}
