package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/cockroachdb/errors"
)

// envKernelCache overrides the kernel cache folder; "off" disables caching.
const envKernelCache = "TILERT_KERNEL_CACHE"

// KernelCache stores compiled kernel images on disk. Dir "" disables it.
type KernelCache struct{ Dir string }

// DefaultKernelCache is $TILERT_KERNEL_CACHE, else $XDG_CACHE_HOME/tilert/kernels,
// else ~/.cache/tilert/kernels.
func DefaultKernelCache() KernelCache {
	return KernelCache{Dir: defaultCacheDir(os.Getenv, os.UserHomeDir)}
}

func defaultCacheDir(getenv func(string) string, home func() (string, error)) string {
	if v := getenv(envKernelCache); v != "" {
		if v == "off" {
			return ""
		}
		return v
	}
	if v := getenv("XDG_CACHE_HOME"); v != "" {
		return filepath.Join(v, "tilert", "kernels")
	}
	if h, err := home(); err == nil && h != "" {
		return filepath.Join(h, ".cache", "tilert", "kernels")
	}
	return ""
}

// CacheKey names a compiled image: a hash of everything that changes the
// output (source, options, target architecture, NVRTC version).
func CacheKey(src string, opts []string, arch, nvrtcVersion string) string {
	h := sha256.New()
	for _, part := range []string{"tilert-kernel-v1", src, strings.Join(opts, "\x00"), arch, nvrtcVersion} {
		h.Write([]byte(part))
		h.Write([]byte{0xff}) // separator no part contains as valid UTF-8
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (k KernelCache) path(key, ext string) string { return filepath.Join(k.Dir, key+"."+ext) }

// Load returns the cached image for key, if any.
func (k KernelCache) Load(key, ext string) ([]byte, bool) {
	if k.Dir == "" {
		return nil, false
	}
	b, err := os.ReadFile(k.path(key, ext))
	if err != nil || len(b) == 0 {
		return nil, false
	}
	return b, true
}

// Store writes the image atomically: a temporary file in the same folder
// renamed into place, so concurrent processes never read a partial image.
func (k KernelCache) Store(key, ext string, data []byte) error {
	if k.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(k.Dir, 0o755); err != nil {
		return errors.Wrapf(err, "kernel cache %s", k.Dir)
	}
	f, err := os.CreateTemp(k.Dir, ".tmp-"+key+"-*")
	if err != nil {
		return errors.Wrapf(err, "kernel cache %s", k.Dir)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.CombineErrors(werr, errors.CombineErrors(serr, cerr)); err != nil {
		_ = os.Remove(tmp)
		return errors.Wrapf(err, "writing kernel cache file %s", tmp)
	}
	if err := os.Rename(tmp, k.path(key, ext)); err != nil {
		_ = os.Remove(tmp)
		return errors.Wrapf(err, "kernel cache %s", k.Dir)
	}
	return nil
}
