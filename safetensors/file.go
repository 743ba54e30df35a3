package safetensors

import (
	"encoding/binary"
	"io"
	"maps"
	"os"
	"sync"
	"syscall"

	"github.com/cockroachdb/errors"
)

// File is an open, memory-mapped safetensors file. Slices returned by Data
// point into the mapping and must not be used after Close.
type File struct {
	path    string
	header  *Header
	byName  map[string]int
	mu      sync.Mutex
	mapping []byte // whole file, read-only
}

// Open maps path and validates its header against the file size.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "safetensors: open %s", path),
			"check the path and its permissions")
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Wrapf(err, "safetensors: stat %s", path)
	}
	if !st.Mode().IsRegular() {
		return nil, errors.WithHint(errors.Newf("safetensors: %s is not a regular file", path),
			"point at a .safetensors file")
	}
	size := st.Size()
	var lenBuf [8]byte
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, errors.Wrapf(err, "safetensors: read %s", path)
	}
	var h *Header
	if size < 8 {
		_, err = ParseHeader(lenBuf[:size], size)
	} else {
		n := binary.LittleEndian.Uint64(lenBuf[:])
		if n > MaxHeaderSize || int64(n) > size-8 {
			_, err = ParseHeader(lenBuf[:], size) // reports the bad length
		} else {
			buf := make([]byte, 8+n)
			if _, err = f.ReadAt(buf, 0); err == nil {
				h, err = ParseHeader(buf, size)
			}
		}
	}
	if err != nil {
		return nil, errors.Wrapf(err, "safetensors: %s", path)
	}
	sf := &File{path: path, header: h, byName: make(map[string]int, len(h.Tensors))}
	for i, t := range h.Tensors {
		sf.byName[t.Name] = i
	}
	// A header-only file with no data still needs no mapping; mmap of 0 bytes fails.
	if size > 0 {
		m, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			return nil, errors.WithHint(errors.Wrapf(err, "safetensors: mmap %s (%d bytes)", path, size),
				"check the address-space limit (ulimit -v) and that the filesystem supports mmap")
		}
		sf.mapping = m
	}
	return sf, nil
}

// Close unmaps the file; it is safe to call twice.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mapping == nil {
		return nil
	}
	err := syscall.Munmap(f.mapping)
	f.mapping = nil
	if err != nil {
		return errors.Wrapf(err, "safetensors: munmap %s", f.path)
	}
	return nil
}

// Path is the path the file was opened with.
func (f *File) Path() string { return f.path }

// Tensors lists the tensors in file (data) order; reading them in this order
// streams the file sequentially.
func (f *File) Tensors() []TensorInfo { return append([]TensorInfo(nil), f.header.Tensors...) }

// Lookup returns a tensor's description.
func (f *File) Lookup(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.header.Tensors[i], true
}

// Metadata is the header's __metadata__ (nil when absent). The map is a copy.
func (f *File) Metadata() map[string]string { return maps.Clone(f.header.Metadata) }

// DataOffset is the absolute offset of the data section in the file.
func (f *File) DataOffset() int64 { return f.header.DataOffset }

// Data returns the tensor's bytes as a zero-copy, read-only view of the
// mapping (writing to it faults). It is valid until Close.
func (f *File) Data(name string) ([]byte, error) {
	i, ok := f.byName[name]
	if !ok {
		return nil, errors.WithHint(errors.Newf("safetensors: %s: no tensor %q", f.path, name),
			"list the file's tensors to check the name")
	}
	f.mu.Lock()
	m := f.mapping
	f.mu.Unlock()
	if m == nil {
		return nil, errors.WithHint(errors.Newf("safetensors: %s: tensor %q read after Close", f.path, name),
			"keep the file open while its data is in use")
	}
	t := f.header.Tensors[i]
	lo, hi := f.header.DataOffset+t.Begin, f.header.DataOffset+t.End
	return m[lo:hi:hi], nil
}
