package converter

import (
	"context"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/numeric"
	"github.com/tilert-go/tilert/weights"
)

// writer streams the planned tensors into the shard files. Every tensor's place in its shard is
// known from the plan, so Workers goroutines each take the next tensor in stored order, read it
// chunk by chunk from the source (pread, so the checkpoint's pages never count against this
// process's memory), checksum it and write it at its offset. Memory: one chunk buffer per worker.
type writer struct {
	o     *Options
	dir   string
	ts    []outTensor
	total int64
	done  atomic.Int64

	srcMu sync.Mutex
	srcs  map[string]*os.File
}

// shardState is a shard file being written by several workers.
type shardState struct {
	plan    *shardPlan
	path    string
	once    sync.Once
	f       WFile
	err     error
	left    atomic.Int32 // tensors not yet written
	closed  bool
	closeMu sync.Mutex
}

func (s *shardState) open(fs FS) (WFile, error) {
	s.once.Do(func() {
		f, err := fs.Create(s.path)
		if err != nil {
			s.err = errors.WithHint(errors.Wrapf(err, "create %s", s.path), "check that the output directory is writable")
			return
		}
		if _, err := f.WriteAt(s.plan.header, 0); err != nil {
			f.Close()
			s.err = errors.WithHint(errors.Wrapf(err, "write %s: header", s.path), "check free disk space")
			return
		}
		s.f = f
	})
	return s.f, s.err
}

// finish fsyncs and closes the shard once its last tensor is written.
func (s *shardState) finish() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.closed = true
	if err := s.f.Sync(); err != nil {
		s.f.Close()
		return errors.WithHint(errors.Wrapf(err, "fsync %s", s.path), "check free disk space and the disk's health")
	}
	return errors.Wrapf(s.f.Close(), "close %s", s.path)
}

// abandon closes a shard left incomplete by an error.
func (s *shardState) abandon() {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.f != nil && !s.closed {
		s.closed = true
		s.f.Close()
	}
}

type workItem struct{ shard, tensor int }

func (w *writer) run(ctx context.Context, shards []shardPlan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.srcs = map[string]*os.File{}
	defer func() {
		for _, f := range w.srcs {
			f.Close()
		}
	}()
	states := make([]*shardState, len(shards))
	var items []workItem
	for k := range shards {
		states[k] = &shardState{plan: &shards[k], path: filepath.Join(w.dir, shards[k].file)}
		states[k].left.Store(int32(len(shards[k].tensors)))
		for _, i := range shards[k].tensors {
			items = append(items, workItem{k, i})
		}
	}
	var (
		next     atomic.Int64
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	for range w.o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, w.o.ChunkBytes)
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= len(items) {
					return
				}
				it := items[k]
				s := states[it.shard]
				f, err := s.open(w.o.FS)
				if err != nil {
					fail(err)
					return
				}
				if err := w.writeTensor(ctx, f, s.path, &w.ts[it.tensor], buf); err != nil {
					fail(err)
					return
				}
				if s.left.Add(-1) == 0 {
					if err := s.finish(); err != nil {
						fail(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, s := range states {
		s.abandon()
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil && errors.Is(firstErr, context.Canceled) {
		return errors.Wrap(firstErr, "conversion stopped")
	}
	return firstErr
}

func (w *writer) source(path string) (*os.File, error) {
	w.srcMu.Lock()
	defer w.srcMu.Unlock()
	if f, ok := w.srcs[path]; ok {
		return f, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	w.srcs[path] = f
	return f, nil
}

// writeTensor produces tensor t chunk by chunk into buf and writes it at its offset in f.
func (w *writer) writeTensor(ctx context.Context, f WFile, path string, t *outTensor, buf []byte) error {
	var crc uint32
	pos := t.Offset
	put := func(data []byte) error {
		crc = crc32.Update(crc, weights.Castagnoli, data)
		if _, err := f.WriteAt(data, pos); err != nil {
			return errors.WithHint(errors.Wrapf(err, "write %s: tensor %q", path, t.Name), "check free disk space")
		}
		pos += int64(len(data))
		done := w.done.Add(int64(len(data)))
		if w.o.Progress != nil {
			w.o.Progress(done, w.total)
		}
		return nil
	}
	var tmp []byte
	for _, sg := range t.segs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if sg.gen != nil {
			if int(sg.outN) > len(buf) {
				return errors.AssertionFailedf("tensor %q: generated segment of %d bytes exceeds the %d byte chunk", t.Name, sg.outN, len(buf))
			}
			sg.gen(buf[:sg.outN])
			if err := put(buf[:sg.outN]); err != nil {
				return err
			}
			continue
		}
		src, err := w.source(sg.src.path)
		if err != nil {
			return errors.WithHint(errors.Wrapf(err, "open %s (tensor %q)", sg.src.path, sg.src.name), "check that the checkpoint is readable")
		}
		widen := sg.conv == convBF16toF32
		step := int64(len(buf))
		if widen {
			step = int64(len(buf)/2) &^ 1 // whole bf16 elements that widen into buf
		}
		for off := sg.off; off < sg.off+sg.n; off += step {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(step, sg.off+sg.n-off)
			dst := buf[:n]
			if widen {
				if cap(tmp) < int(n) {
					tmp = make([]byte, step)
				}
				dst = tmp[:n]
			}
			if _, err := src.ReadAt(dst, sg.src.off+off); err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("file is shorter than its header says (truncated)")
				}
				return errors.WithHint(errors.Wrapf(err, "read %s: tensor %q at byte %d", sg.src.path, sg.src.name, off),
					"the checkpoint file is damaged or was changed during the conversion; re-download it")
			}
			out := dst
			if widen {
				vals := make([]float32, n/2)
				numeric.DecodeBF16(vals, dst)
				out = buf[:2*n]
				numeric.EncodeF32(out, vals)
			}
			if err := put(out); err != nil {
				return err
			}
		}
	}
	if pos != t.Offset+t.Bytes {
		return errors.AssertionFailedf("tensor %q: wrote %d bytes, planned %d", t.Name, pos-t.Offset, t.Bytes)
	}
	t.CRC32C = weights.CRCHex(crc)
	return nil
}
