package converter

import (
	"io"
	"os"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"
)

// FS is the filesystem the converter writes through. Tests inject failures with it; OSFS is the
// real one. Paths are OS paths.
type FS interface {
	MkdirAll(dir string) error
	Create(path string) (WFile, error)
	Rename(oldpath, newpath string) error
	// Exchange atomically swaps two existing paths; errors.ErrUnsupported when the filesystem
	// cannot (the caller then falls back to two renames).
	Exchange(a, b string) error
	RemoveAll(path string) error
	SyncDir(dir string) error
}

// WFile is a file being written: shards with WriteAt (several tensors at once), small files
// with Write.
type WFile interface {
	io.Writer
	io.WriterAt
	Sync() error
	Close() error
}

// OSFS is the operating system's filesystem.
type OSFS struct{}

func (OSFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

func (OSFS) Create(path string) (WFile, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
}

func (OSFS) Rename(a, b string) error { return os.Rename(a, b) }

func (OSFS) Exchange(a, b string) error {
	err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return errors.ErrUnsupported
	}
	return err
}

func (OSFS) RemoveAll(path string) error { return os.RemoveAll(path) }

func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
