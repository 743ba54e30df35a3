// Package nixl is the rdma.Engine over NVIDIA NIXL, reached through NIXL's
// C API (libnixl_capi.so, shipped in the nixl-cu12 / nixl-cu13 wheels next
// to a bundled UCX). The library is opened at run time with purego, so
// binaries build with CGO_ENABLED=0 and run where NIXL is not installed;
// only New fails there.
package nixl

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/ebitengine/purego"
)

// Status codes of nixl_capi_status_t.
const (
	capiSuccess    = 0
	capiInProgress = 1
)

var statusNames = map[int32]string{
	-1: "invalid parameter", -2: "backend error", -3: "invalid state", -4: "exception",
	-5: "no telemetry", -6: "not found",
}

// Memory types and transfer ops of the C API.
const (
	memDRAM   = 0
	memVRAM   = 1
	opWrite   = 1
	libEnvVar = "TILERT_NIXL_LIB"
)

// capi holds the C API's functions. Handles are opaque pointers.
type capi struct {
	isStub func() bool

	createAgent  func(name string, agent *uintptr) int32
	destroyAgent func(agent uintptr) int32

	getPluginParams func(agent uintptr, plugin string, mems *uintptr, params *uintptr) int32
	destroyMemList  func(l uintptr) int32
	destroyParams   func(p uintptr) int32
	paramsAdd       func(p uintptr, key, value string) int32
	createBackend   func(agent uintptr, plugin string, params uintptr, backend *uintptr) int32
	destroyBackend  func(backend uintptr) int32

	createOptArgs     func(args *uintptr) int32
	destroyOptArgs    func(args uintptr) int32
	optArgsAddBackend func(args, backend uintptr) int32
	optArgsSetNotif   func(args uintptr, data unsafe.Pointer, n uintptr) int32
	optArgsHasNotif   func(args uintptr, has bool) int32

	createRegDlist  func(mem int32, dl *uintptr) int32
	destroyRegDlist func(dl uintptr) int32
	regDlistAdd     func(dl uintptr, addr uintptr, n uintptr, dev uint64, md unsafe.Pointer, mdLen uintptr) int32
	registerMem     func(agent, dl, args uintptr) int32
	deregisterMem   func(agent, dl, args uintptr) int32

	getLocalMD        func(agent uintptr, data *unsafe.Pointer, n *uintptr) int32
	getLocalPartialMD func(agent, dl uintptr, data *unsafe.Pointer, n *uintptr, args uintptr) int32
	loadRemoteMD      func(agent uintptr, data unsafe.Pointer, n uintptr, name **byte) int32
	invalidateRemote  func(agent uintptr, name string) int32

	createXferDlist  func(mem int32, dl *uintptr) int32
	destroyXferDlist func(dl uintptr) int32
	xferDlistAdd     func(dl uintptr, addr uintptr, n uintptr, dev uint64) int32

	createXferReq  func(agent uintptr, op int32, local, remote uintptr, remoteAgent string, req *uintptr, args uintptr) int32
	postXferReq    func(agent, req, args uintptr) int32
	getXferStatus  func(agent, req uintptr) int32
	releaseXferReq func(agent, req uintptr) int32
	destroyXferReq func(req uintptr) int32

	createNotifMap  func(m *uintptr) int32
	destroyNotifMap func(m uintptr) int32
	getNotifs       func(agent, m, args uintptr) int32
	notifMapSize    func(m uintptr, n *uintptr) int32
	notifMapAgentAt func(m uintptr, i uintptr, name **byte) int32
	notifMapCount   func(m uintptr, name string, n *uintptr) int32
	notifMapGet     func(m uintptr, name string, i uintptr, data *unsafe.Pointer, n *uintptr) int32
	notifMapClear   func(m uintptr) int32

	free func(p unsafe.Pointer)
}

var (
	loadOnce sync.Once
	loaded   *capi
	loadErr  error
	loadPath string
)

// ErrUnavailable marks a machine where NIXL's C API cannot be loaded.
var ErrUnavailable = errors.New("nixl: C API library unavailable")

// FindLibrary returns the path of libnixl_capi.so: $TILERT_NIXL_LIB, or
// the first match in the Python site-packages directories this machine
// has (the wheel keeps it in .nixl_cu1X.mesonpy.libs/ or nixl_cu1X.libs/).
func FindLibrary() (string, error) {
	if p := os.Getenv(libEnvVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", errors.Mark(errors.Wrapf(err, "nixl: %s=%s", libEnvVar, p), ErrUnavailable)
		}
		return p, nil
	}
	var roots []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		roots = append(roots, v+"/lib/python3*/site-packages")
	}
	home, _ := os.UserHomeDir()
	roots = append(roots,
		"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3*/dist-packages", "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
		home+"/.local/lib/python3*/site-packages", home+"/.pyenv/versions/*/lib/python3*/site-packages",
		"/opt/conda/lib/python3*/site-packages", "/work/pyenv/lib/python3*/site-packages")
	for _, root := range roots {
		for _, sub := range []string{".nixl_cu1*.mesonpy.libs", "nixl_cu1*.libs", ".nixl*.libs", "nixl*.libs"} {
			m, _ := filepath.Glob(filepath.Join(root, sub, "libnixl_capi.so"))
			sort.Strings(m)
			if len(m) > 0 {
				return m[len(m)-1], nil
			}
		}
	}
	return "", errors.WithHint(errors.Mark(errors.New("nixl: libnixl_capi.so not found"), ErrUnavailable),
		"pip install --no-deps nixl-cu12 (or nixl-cu13), or set "+libEnvVar+" to the library's path")
}

// load opens the C API once per process: lib, or FindLibrary's choice.
func load(lib string) (*capi, error) {
	loadOnce.Do(func() {
		if runtime.GOOS != "linux" {
			loadErr = errors.Mark(errors.Newf("nixl: not supported on %s", runtime.GOOS), ErrUnavailable)
			return
		}
		path := lib
		if path == "" {
			p, err := FindLibrary()
			if err != nil {
				loadErr = err
				return
			}
			path = p
		} else if _, err := os.Stat(path); err != nil {
			loadErr = errors.Mark(errors.WithHint(errors.Wrapf(err, "nixl: library %s", path), "fix transfer.nixl_lib (--nixl-lib), or leave it empty to search Python site-packages"), ErrUnavailable)
			return
		}
		loadPath = path
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			loadErr = errors.Mark(errors.Wrapf(err, "nixl: open %s", path), ErrUnavailable)
			return
		}
		libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			loadErr = errors.Mark(errors.Wrap(err, "nixl: open libc.so.6"), ErrUnavailable)
			return
		}
		c := &capi{}
		defer func() {
			// RegisterLibFunc panics on a missing symbol: an older or
			// different library.
			if r := recover(); r != nil {
				loadErr = errors.Mark(errors.Newf("nixl: %s lacks a needed function: %v", path, r), ErrUnavailable)
			}
		}()
		reg := func(fn any, name string) { purego.RegisterLibFunc(fn, h, name) }
		reg(&c.isStub, "nixl_capi_is_stub")
		reg(&c.createAgent, "nixl_capi_create_agent")
		reg(&c.destroyAgent, "nixl_capi_destroy_agent")
		reg(&c.getPluginParams, "nixl_capi_get_plugin_params")
		reg(&c.destroyMemList, "nixl_capi_destroy_mem_list")
		reg(&c.destroyParams, "nixl_capi_destroy_params")
		reg(&c.paramsAdd, "nixl_capi_params_add")
		reg(&c.createBackend, "nixl_capi_create_backend")
		reg(&c.destroyBackend, "nixl_capi_destroy_backend")
		reg(&c.createOptArgs, "nixl_capi_create_opt_args")
		reg(&c.destroyOptArgs, "nixl_capi_destroy_opt_args")
		reg(&c.optArgsAddBackend, "nixl_capi_opt_args_add_backend")
		reg(&c.optArgsSetNotif, "nixl_capi_opt_args_set_notif_msg")
		reg(&c.optArgsHasNotif, "nixl_capi_opt_args_set_has_notif")
		reg(&c.createRegDlist, "nixl_capi_create_reg_dlist")
		reg(&c.destroyRegDlist, "nixl_capi_destroy_reg_dlist")
		reg(&c.regDlistAdd, "nixl_capi_reg_dlist_add_desc")
		reg(&c.registerMem, "nixl_capi_register_mem")
		reg(&c.deregisterMem, "nixl_capi_deregister_mem")
		reg(&c.getLocalMD, "nixl_capi_get_local_md")
		reg(&c.getLocalPartialMD, "nixl_capi_get_local_partial_md")
		reg(&c.loadRemoteMD, "nixl_capi_load_remote_md")
		reg(&c.invalidateRemote, "nixl_capi_invalidate_remote_md")
		reg(&c.createXferDlist, "nixl_capi_create_xfer_dlist")
		reg(&c.destroyXferDlist, "nixl_capi_destroy_xfer_dlist")
		reg(&c.xferDlistAdd, "nixl_capi_xfer_dlist_add_desc")
		reg(&c.createXferReq, "nixl_capi_create_xfer_req")
		reg(&c.postXferReq, "nixl_capi_post_xfer_req")
		reg(&c.getXferStatus, "nixl_capi_get_xfer_status")
		reg(&c.releaseXferReq, "nixl_capi_release_xfer_req")
		reg(&c.destroyXferReq, "nixl_capi_destroy_xfer_req")
		reg(&c.createNotifMap, "nixl_capi_create_notif_map")
		reg(&c.destroyNotifMap, "nixl_capi_destroy_notif_map")
		reg(&c.getNotifs, "nixl_capi_get_notifs")
		reg(&c.notifMapSize, "nixl_capi_notif_map_size")
		reg(&c.notifMapAgentAt, "nixl_capi_notif_map_get_agent_at")
		reg(&c.notifMapCount, "nixl_capi_notif_map_get_notifs_size")
		reg(&c.notifMapGet, "nixl_capi_notif_map_get_notif")
		reg(&c.notifMapClear, "nixl_capi_notif_map_clear")
		purego.RegisterLibFunc(&c.free, libc, "free")
		if c.isStub() {
			loadErr = errors.Mark(errors.Newf("nixl: %s is a stub build without NIXL", path), ErrUnavailable)
			return
		}
		loaded = c
	})
	return loaded, loadErr
}

// Setenv sets an environment variable in the C environment too (UCX reads
// its UCX_* settings with getenv; os.Setenv without cgo does not reach it).
func Setenv(key, value string) error {
	if err := os.Setenv(key, value); err != nil {
		return err
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return errors.Wrap(err, "nixl: open libc.so.6")
	}
	var setenv func(k, v string, overwrite int32) int32
	purego.RegisterLibFunc(&setenv, libc, "setenv")
	if setenv(key, value, 1) != 0 {
		return errors.Newf("nixl: setenv %s failed", key)
	}
	return nil
}

func check(st int32, what string) error {
	if st == capiSuccess {
		return nil
	}
	name := statusNames[st]
	if name == "" {
		name = "unknown status"
	}
	return errors.Newf("nixl: %s: %s (%d)", what, name, st)
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
