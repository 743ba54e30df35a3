package safetensors

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"

	"github.com/cockroachdb/errors"
)

// Writer streams a safetensors file: the header is computed from the full
// tensor list up front, then tensor data is written in that order, so memory
// stays bounded by one tensor (or one chunk, with WriteTensorPart).
type Writer struct {
	path    string
	f       *os.File
	bw      *bufio.Writer
	infos   []TensorInfo
	next    int   // index of the tensor being written
	written int64 // bytes of infos[next] written so far
	err     error // sticky: after a failure the writer only cleans up
	closed  bool
}

// Create starts a file at path holding infos in the given order; their
// Begin/End are filled in by Create (the caller's slice is not modified).
// meta becomes __metadata__ (HF loaders expect {"format": "pt"}).
func Create(path string, infos []TensorInfo, meta map[string]string) (*Writer, error) {
	laid := make([]TensorInfo, len(infos))
	seen := make(map[string]bool, len(infos))
	var pos int64
	for i, t := range infos {
		if t.Name == "" || t.Name == metadataKey {
			return nil, errors.WithHint(errors.Newf("safetensors: create %s: invalid tensor name %q", path, t.Name),
				"tensor names must be non-empty and not __metadata__")
		}
		if seen[t.Name] {
			return nil, errors.WithHint(errors.Newf("safetensors: create %s: tensor %q listed twice", path, t.Name),
				"each tensor goes into a file once")
		}
		seen[t.Name] = true
		n, err := checkInfo(t)
		if err != nil {
			return nil, errors.Wrapf(err, "safetensors: create %s", path)
		}
		t.Shape = slices.Clone(t.Shape)
		t.Begin, t.End = pos, pos+n
		pos += n
		laid[i] = t
	}
	hdr := encodeHeader(laid, meta)
	f, err := os.Create(path)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "safetensors: create %s", path),
			"check that the directory exists and is writable")
	}
	w := &Writer{path: path, f: f, bw: bufio.NewWriterSize(f, 4<<20), infos: laid}
	if _, err := w.bw.Write(hdr); err != nil {
		w.fail(errors.Wrapf(err, "safetensors: write header of %s", path))
		return nil, w.err
	}
	return w, nil
}

// Infos returns the tensors with their assigned byte ranges.
func (w *Writer) Infos() []TensorInfo { return slices.Clone(w.infos) }

// skipEmptyUntil advances past zero-byte tensors before name (or all of
// them for ""): they need no WriteTensor call but accept one.
func (w *Writer) skipEmptyUntil(name string) {
	for w.written == 0 && w.next < len(w.infos) && w.infos[w.next].Name != name &&
		w.infos[w.next].End == w.infos[w.next].Begin {
		w.next++
	}
}

func (w *Writer) fail(err error) {
	if w.err == nil {
		w.err = err
	}
	if !w.closed {
		w.closed = true
		w.f.Close()
		os.Remove(w.path)
	}
}

// WriteTensor writes the whole of tensor name, which must be the next one in
// order and exactly its byte size.
func (w *Writer) WriteTensor(name string, data []byte) error {
	if err := w.expect(name); err != nil {
		return err
	}
	t := w.infos[w.next]
	if w.written != 0 || int64(len(data)) != t.End-t.Begin {
		return errors.WithHint(
			errors.Newf("safetensors: %s: tensor %q: got %d bytes, want %d (%s %v)",
				w.path, name, len(data), t.End-t.Begin, t.DType, t.Shape),
			"write each tensor whole with WriteTensor, or in pieces with WriteTensorPart")
	}
	return w.WriteTensorPart(name, data)
}

// WriteTensorPart appends data to tensor name, the one being written; the
// tensor is complete when its byte size is reached. It lets a converter
// stream a multi-GB tensor through a small buffer.
func (w *Writer) WriteTensorPart(name string, data []byte) error {
	if err := w.expect(name); err != nil {
		return err
	}
	t := w.infos[w.next]
	if w.written+int64(len(data)) > t.End-t.Begin {
		return errors.WithHint(
			errors.Newf("safetensors: %s: tensor %q: %d bytes written past its size %d (%s %v)",
				w.path, name, w.written+int64(len(data)), t.End-t.Begin, t.DType, t.Shape),
			"the data does not match the declared dtype and shape")
	}
	if _, err := w.bw.Write(data); err != nil {
		w.fail(errors.WithHint(errors.Wrapf(err, "safetensors: write %s: tensor %q", w.path, name),
			"check free disk space"))
		return w.err
	}
	w.written += int64(len(data))
	if w.written == t.End-t.Begin {
		w.next++
		w.written = 0
	}
	return nil
}

func (w *Writer) expect(name string) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.Newf("safetensors: %s: tensor %q written after Close", w.path, name)
	}
	w.skipEmptyUntil(name)
	if w.next >= len(w.infos) {
		return errors.WithHint(errors.Newf("safetensors: %s: tensor %q written but all tensors are done", w.path, name),
			"pass every tensor to Create")
	}
	if want := w.infos[w.next].Name; name != want {
		return errors.WithHint(errors.Newf("safetensors: %s: tensor %q written out of order, expected %q", w.path, name, want),
			"write tensors in the order given to Create")
	}
	return nil
}

// Close flushes and fsyncs the file. If not every tensor was written, the
// file is removed and an error names the first missing tensor.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.skipEmptyUntil("")
	if w.next < len(w.infos) {
		t := w.infos[w.next]
		w.fail(errors.WithHint(
			errors.Newf("safetensors: %s: closed incomplete: tensor %q has %d of %d bytes, %d tensors missing; file removed",
				w.path, t.Name, w.written, t.End-t.Begin, len(w.infos)-w.next),
			"write every tensor given to Create before Close"))
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.fail(errors.WithHint(errors.Wrapf(err, "safetensors: flush %s", w.path), "check free disk space"))
		return w.err
	}
	if err := w.f.Sync(); err != nil {
		w.fail(errors.Wrapf(err, "safetensors: fsync %s", w.path))
		return w.err
	}
	w.closed = true
	if err := w.f.Close(); err != nil {
		w.err = errors.Wrapf(err, "safetensors: close %s", w.path)
		os.Remove(w.path)
		return w.err
	}
	return nil
}

// Abort stops writing and removes the file.
func (w *Writer) Abort() {
	w.fail(errors.Newf("safetensors: %s: aborted", w.path))
}

// Tensor is a tensor with its bytes, for WriteFile.
type Tensor struct {
	Info TensorInfo
	Data []byte
}

// WriteFile writes tensors (in the given order) to path and fsyncs it.
func WriteFile(path string, tensors []Tensor, meta map[string]string) error {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = t.Info
	}
	w, err := Create(path, infos, meta)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := w.WriteTensor(t.Info.Name, t.Data); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

// WriteIndex writes dir/model.safetensors.index.json atomically (temp file,
// fsync, rename). totalSize is the sum of tensor data bytes, as HF records it.
func WriteIndex(dir string, weightMap map[string]string, totalSize int64) error {
	idx := Index{Metadata: map[string]any{"total_size": totalSize}, WeightMap: weightMap}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return errors.Wrap(err, "safetensors: encode index")
	}
	data = append(data, '\n')
	path := filepath.Join(dir, IndexFile)
	tmp, err := os.CreateTemp(dir, ".index-*.tmp")
	if err != nil {
		return errors.WithHint(errors.Wrapf(err, "safetensors: write %s", path),
			"check that the directory exists and is writable")
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return errors.Wrapf(err, "safetensors: write %s", path)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return errors.Wrapf(err, "safetensors: fsync %s", path)
	}
	if err := tmp.Close(); err != nil {
		return errors.Wrapf(err, "safetensors: close %s", path)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return errors.Wrapf(err, "safetensors: chmod %s", path)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return errors.Wrapf(err, "safetensors: rename into %s", path)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so renames and new files in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return errors.Wrapf(err, "safetensors: open dir %s", dir)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return errors.Wrapf(err, "safetensors: fsync dir %s", dir)
	}
	return nil
}
