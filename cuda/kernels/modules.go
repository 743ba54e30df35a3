package kernels

import (
	"log/slog"

	"github.com/tilert-go/tilert/cuda"
)

// extraModule is one of the modules compiled beside the default one and
// loaded on first use (wg, mid, few, absorb): their own sources,
// so the default module's source and its kernel cache entry stay as they
// are.
type extraModule struct {
	// name is the loaded module's name (tilert_kernels_NAME).
	name string
	// need, when set, says why this device cannot take the module.
	need func(cuda.DeviceInfo) error
	// compile compiles it through the default kernel cache.
	compile func(nv *cuda.NVRTC, i cuda.DeviceInfo) (*cuda.Compiled, error)
}

// moduleState is a context's extraModule, or why there is none (kept, so a
// failed compile is not retried on every launch).
type moduleState struct {
	mod *cuda.Module
	err error
}

// load compiles and loads m in k's context on first use; m itself is the
// context value's key, so each module var loads once a context.
func (m *extraModule) load(k *Set) (*cuda.Module, error) {
	v, _ := k.c.Value(m, func() (any, error) {
		st := &moduleState{}
		i := k.c.Info()
		if m.need != nil {
			if st.err = m.need(i); st.err != nil {
				return st, nil
			}
		}
		nv, err := cuda.LoadNVRTC()
		if err != nil {
			st.err = err
			return st, nil
		}
		ck, err := m.compile(nv, i)
		if err != nil {
			st.err = err
			return st, nil
		}
		st.mod, st.err = k.c.LoadModule(m.name, ck.Image)
		slog.Debug("cuda: module loaded", "module", m.name, "arch", ck.Arch, "cache_hit", ck.CacheHit, "took", ck.Took,
			"nvrtc", nv.Version(), "err", st.err)
		return st, nil
	})
	st := v.(*moduleState)
	return st.mod, st.err
}
