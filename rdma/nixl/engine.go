package nixl

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/rdma"
)

// endpointPrefix starts an endpoint: the agent's metadata blob, base64.
const endpointPrefix = "nixl:"

// Config configures an engine.
type Config struct {
	// Lib is the path of libnixl_capi.so; empty: FindLibrary. The library
	// is opened once per process, by the first New.
	Lib string
	// Name is the agent name, unique among the agents that meet; default
	// "tilert-<pid>-<random>".
	Name string
	// Backend is the NIXL plugin (default "UCX").
	Backend string
	// Params override the plugin's default parameters.
	Params map[string]string
	// Poll is the pause between transfer-status polls (default 20 µs).
	Poll time.Duration
}

type region struct {
	rdma.Region
	registered bool
	key        uint64
}

// Engine is an rdma.Engine over one NIXL agent with one backend.
//
// Mapping: Register registers the memory with the agent (pinning it);
// Open (re-)registers the region if Revoke dropped it and returns the
// agent's metadata for it in Remote.Meta; Revoke deregisters it, so RDMA
// hardware refuses late writes with the stale remote key; Write builds one
// WRITE request per batch whose notification names every (region, key) it
// wrote, posts it, and polls its status to completion.
type Engine struct {
	c    *capi
	cfg  Config
	name string

	mu       sync.Mutex // NIXL calls and the tables below
	agent    uintptr
	backend  uintptr
	optArgs  uintptr // carries the backend for register/deregister
	regions  map[rdma.RegionID]*region
	endpoint string
	closed   bool
	notifs   []Notif
}

// Notif is a notification a peer attached to a finished write.
type Notif struct {
	Agent string
	Msg   []byte
}

// New creates an agent and its backend. It fails with ErrUnavailable where
// the C API library cannot be loaded.
func New(cfg Config) (*Engine, error) {
	c, err := load(cfg.Lib)
	if err != nil {
		return nil, err
	}
	if cfg.Backend == "" {
		cfg.Backend = "UCX"
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 20 * time.Microsecond
	}
	if cfg.Name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Name = fmt.Sprintf("tilert-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	}
	e := &Engine{c: c, cfg: cfg, name: cfg.Name, regions: map[rdma.RegionID]*region{}}
	if err := check(c.createAgent(cfg.Name, &e.agent), "create agent "+cfg.Name); err != nil {
		return nil, err
	}
	var mems, params uintptr
	if err := check(c.getPluginParams(e.agent, cfg.Backend, &mems, &params), "plugin "+cfg.Backend+" parameters"); err != nil {
		_ = e.Close()
		return nil, errors.WithHint(err, "the wheel's plugins/ folder must sit next to libnixl.so")
	}
	_ = c.destroyMemList(mems)
	for k, v := range cfg.Params {
		if err := check(c.paramsAdd(params, k, v), "backend parameter "+k); err != nil {
			_ = c.destroyParams(params)
			_ = e.Close()
			return nil, err
		}
	}
	st := c.createBackend(e.agent, cfg.Backend, params, &e.backend)
	_ = c.destroyParams(params)
	if err := check(st, "create backend "+cfg.Backend); err != nil {
		_ = e.Close()
		return nil, errors.WithHint(err, "UCX could not start; on machines without a GPU driver see NIXL issue #838, and try UCX_TLS=tcp")
	}
	if err := check(c.createOptArgs(&e.optArgs), "opt args"); err != nil {
		_ = e.Close()
		return nil, err
	}
	if err := check(c.optArgsAddBackend(e.optArgs, e.backend), "opt args backend"); err != nil {
		_ = e.Close()
		return nil, err
	}
	md, err := e.localMD()
	if err != nil {
		_ = e.Close()
		return nil, err
	}
	e.endpoint = endpointPrefix + base64.StdEncoding.EncodeToString(md)
	return e, nil
}

// LibraryPath is the C API library in use.
func LibraryPath() string { return loadPath }

// Name is the agent name.
func (e *Engine) Name() string { return e.name }

// Kind implements rdma.Engine.
func (e *Engine) Kind() string { return "nixl" }

// Endpoint implements rdma.Engine: "nixl:" + base64 of the agent metadata
// (connection info; memory descriptors travel per Open in Remote.Meta).
func (e *Engine) Endpoint() string { return e.endpoint }

func (e *Engine) localMD() ([]byte, error) {
	var p unsafe.Pointer
	var n uintptr
	if err := check(e.c.getLocalMD(e.agent, &p, &n), "get local metadata"); err != nil {
		return nil, err
	}
	defer e.c.free(p)
	return append([]byte(nil), unsafe.Slice((*byte)(p), n)...), nil
}

func memType(k rdma.MemKind) int32 {
	if k == rdma.DeviceMem {
		return memVRAM
	}
	return memDRAM
}

func addrOf(r rdma.Region) uintptr {
	if r.Kind == rdma.DeviceMem {
		return r.Addr
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(r.Host)))
}

// regList builds a one-descriptor registration list for r.
func (e *Engine) regList(r rdma.Region) (uintptr, error) {
	var dl uintptr
	if err := check(e.c.createRegDlist(memType(r.Kind), &dl), "create registration list"); err != nil {
		return 0, err
	}
	if err := check(e.c.regDlistAdd(dl, addrOf(r), uintptr(r.Size()), uint64(r.Device), nil, 0), "add registration descriptor"); err != nil {
		_ = e.c.destroyRegDlist(dl)
		return 0, err
	}
	return dl, nil
}

func (e *Engine) registerLocked(r *region, on bool) error {
	if r.registered == on {
		return nil
	}
	dl, err := e.regList(r.Region)
	if err != nil {
		return err
	}
	defer e.c.destroyRegDlist(dl)
	if on {
		err = check(e.c.registerMem(e.agent, dl, e.optArgs), fmt.Sprintf("register region %d", r.ID))
	} else {
		err = check(e.c.deregisterMem(e.agent, dl, e.optArgs), fmt.Sprintf("deregister region %d", r.ID))
	}
	if err == nil {
		r.registered = on
	}
	return err
}

// Register implements rdma.Engine. Host and device (VRAM) memory; device
// pointers come from the GPU backend.
func (e *Engine) Register(r rdma.Region) error {
	if r.Kind == "" {
		r.Kind = rdma.HostMem
	}
	if r.Size() <= 0 || (r.Kind == rdma.DeviceMem && r.Addr == 0) {
		return errors.Newf("nixl: region %d: no memory", r.ID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return rdma.ErrClosed
	}
	if _, ok := e.regions[r.ID]; ok {
		return errors.Newf("nixl: region %d already registered", r.ID)
	}
	reg := &region{Region: r}
	if err := e.registerLocked(reg, true); err != nil {
		return err
	}
	e.regions[r.ID] = reg
	return nil
}

// Deregister implements rdma.Engine.
func (e *Engine) Deregister(id rdma.RegionID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.regions[id]
	if r == nil {
		return errors.Newf("nixl: deregister: region %d not registered", id)
	}
	err := e.registerLocked(r, false)
	delete(e.regions, id)
	return err
}

// Open implements rdma.Engine.
func (e *Engine) Open(id rdma.RegionID, key uint64) (rdma.Remote, error) {
	if key == 0 {
		return rdma.Remote{}, errors.Newf("nixl: open region %d: key must be non-zero", id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.regions[id]
	if r == nil {
		return rdma.Remote{}, errors.Newf("nixl: open: region %d not registered", id)
	}
	if err := e.registerLocked(r, true); err != nil {
		return rdma.Remote{}, err
	}
	r.key = key
	dl, err := e.regList(r.Region)
	if err != nil {
		return rdma.Remote{}, err
	}
	defer e.c.destroyRegDlist(dl)
	var p unsafe.Pointer
	var n uintptr
	if err := check(e.c.getLocalPartialMD(e.agent, dl, &p, &n, e.optArgs), fmt.Sprintf("metadata of region %d", id)); err != nil {
		return rdma.Remote{}, err
	}
	meta := append([]byte(nil), unsafe.Slice((*byte)(p), n)...)
	e.c.free(p)
	return rdma.Remote{ID: id, Key: key, Len: r.Size(), Kind: r.Kind, Addr: uint64(addrOf(r.Region)), Device: r.Device, Meta: meta}, nil
}

// Revoke implements rdma.Engine by deregistering the memory: remote keys
// the peer holds become invalid on RDMA hardware. UCX's TCP transport
// emulates one-sided writes in software and does not check them, so there
// the ctrl protocol (no write before accept, done checksum) is the guard.
func (e *Engine) Revoke(id rdma.RegionID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.regions[id]
	if r == nil {
		return errors.Newf("nixl: revoke: region %d not registered", id)
	}
	r.key = 0
	return e.registerLocked(r, false)
}

// Notifs returns and clears the notifications peers attached to finished
// writes: "tilert:<region>:<key>" per written region.
func (e *Engine) Notifs() ([]Notif, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, rdma.ErrClosed
	}
	var m uintptr
	if err := check(e.c.createNotifMap(&m), "create notification map"); err != nil {
		return nil, err
	}
	defer e.c.destroyNotifMap(m)
	if err := check(e.c.getNotifs(e.agent, m, 0), "get notifications"); err != nil {
		return nil, err
	}
	var agents uintptr
	if err := check(e.c.notifMapSize(m, &agents), "notification map size"); err != nil {
		return nil, err
	}
	for i := uintptr(0); i < agents; i++ {
		var np *byte
		if err := check(e.c.notifMapAgentAt(m, i, &np), "notification agent"); err != nil {
			return nil, err
		}
		name := goString(np)
		var cnt uintptr
		if err := check(e.c.notifMapCount(m, name, &cnt), "notification count"); err != nil {
			return nil, err
		}
		for j := uintptr(0); j < cnt; j++ {
			var p unsafe.Pointer
			var n uintptr
			if err := check(e.c.notifMapGet(m, name, j, &p, &n), "notification"); err != nil {
				return nil, err
			}
			e.notifs = append(e.notifs, Notif{Agent: name, Msg: append([]byte(nil), unsafe.Slice((*byte)(p), n)...)})
		}
	}
	out := e.notifs
	e.notifs = nil
	return out, nil
}

// Close implements rdma.Engine.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	for _, r := range e.regions {
		_ = e.registerLocked(r, false)
	}
	e.regions = nil
	if e.optArgs != 0 {
		_ = e.c.destroyOptArgs(e.optArgs)
	}
	if e.backend != 0 {
		_ = e.c.destroyBackend(e.backend)
	}
	var err error
	if e.agent != 0 {
		err = check(e.c.destroyAgent(e.agent), "destroy agent")
	}
	return err
}

// Connect implements rdma.Engine: it loads the peer's metadata.
func (e *Engine) Connect(_ context.Context, endpoint string) (rdma.Peer, error) {
	b64, ok := strings.CutPrefix(endpoint, endpointPrefix)
	if !ok {
		return nil, errors.WithHint(errors.Newf("nixl: endpoint %.40q is not nixl:<metadata>", endpoint),
			"both nodes must use the same transfer engine")
	}
	md, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(md) == 0 {
		return nil, errors.Newf("nixl: endpoint metadata is not base64 (%v)", err)
	}
	name, err := e.loadMD(md)
	if err != nil {
		return nil, err
	}
	return &peer{e: e, remote: name, loaded: map[string]bool{}}, nil
}

func (e *Engine) loadMD(md []byte) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return "", rdma.ErrClosed
	}
	var np *byte
	if err := check(e.c.loadRemoteMD(e.agent, unsafe.Pointer(unsafe.SliceData(md)), uintptr(len(md)), &np), "load remote metadata"); err != nil {
		return "", err
	}
	name := goString(np)
	e.c.free(unsafe.Pointer(np))
	return name, nil
}

type peer struct {
	e      *Engine
	remote string
	mu     sync.Mutex
	loaded map[string]bool // region metadata blobs already loaded
	closed bool
}

// Write implements rdma.Peer: one NIXL WRITE request per memory-type pair,
// with a notification naming every (region, key) written.
func (p *peer) Write(ctx context.Context, ops []rdma.WriteOp) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return rdma.ErrClosed
	}
	type kinds struct{ l, r int32 }
	groups := map[kinds][]rdma.WriteOp{}
	for _, op := range ops {
		if op.Len == 0 {
			continue
		}
		if op.RemoteOff < 0 || op.Len < 0 || op.RemoteOff > op.Remote.Len-op.Len {
			return errors.Newf("nixl: %s: outside the %d-byte remote region", op, op.Remote.Len)
		}
		if len(op.Remote.Meta) > 0 && !p.loaded[string(op.Remote.Meta)] {
			if _, err := p.e.loadMD(op.Remote.Meta); err != nil {
				return errors.Wrapf(err, "nixl: metadata of remote region %d", op.Remote.ID)
			}
			p.loaded[string(op.Remote.Meta)] = true
		}
		p.e.mu.Lock()
		lr := p.e.regions[op.Local]
		p.e.mu.Unlock()
		if lr == nil {
			return errors.Newf("nixl: %s: local region %d not registered", op, op.Local)
		}
		if op.LocalOff < 0 || op.LocalOff > lr.Size()-op.Len {
			return errors.Newf("nixl: %s: outside the %d-byte local region", op, lr.Size())
		}
		k := kinds{memType(lr.Kind), memType(op.Remote.Kind)}
		groups[k] = append(groups[k], op)
	}
	for k, g := range groups {
		if err := p.post(ctx, k.l, k.r, g); err != nil {
			return err
		}
	}
	return nil
}

func (p *peer) post(ctx context.Context, lt, rt int32, ops []rdma.WriteOp) error {
	e, c := p.e, p.e.c
	var local, remote, args, req uintptr
	defer func() {
		if local != 0 {
			_ = c.destroyXferDlist(local)
		}
		if remote != 0 {
			_ = c.destroyXferDlist(remote)
		}
		if args != 0 {
			_ = c.destroyOptArgs(args)
		}
	}()
	var notif []byte
	e.mu.Lock()
	err := func() error {
		if err := check(c.createXferDlist(lt, &local), "create local list"); err != nil {
			return err
		}
		if err := check(c.createXferDlist(rt, &remote), "create remote list"); err != nil {
			return err
		}
		notif = append(notif, "tilert"...)
		for _, op := range ops {
			lr := e.regions[op.Local]
			if err := check(c.xferDlistAdd(local, addrOf(lr.Region)+uintptr(op.LocalOff), uintptr(op.Len), uint64(lr.Device)), "add local descriptor"); err != nil {
				return err
			}
			if err := check(c.xferDlistAdd(remote, uintptr(op.Remote.Addr)+uintptr(op.RemoteOff), uintptr(op.Len), uint64(op.Remote.Device)), "add remote descriptor"); err != nil {
				return err
			}
			notif = fmt.Appendf(notif, ":%d:%d", op.Remote.ID, op.Remote.Key)
		}
		if err := check(c.createOptArgs(&args), "opt args"); err != nil {
			return err
		}
		_ = c.optArgsAddBackend(args, e.backend)
		if err := check(c.optArgsSetNotif(args, unsafe.Pointer(unsafe.SliceData(notif)), uintptr(len(notif))), "notification"); err != nil {
			return err
		}
		if err := check(c.optArgsHasNotif(args, true), "notification flag"); err != nil {
			return err
		}
		if err := check(c.createXferReq(e.agent, opWrite, local, remote, p.remote, &req, args), "create WRITE request"); err != nil {
			return errors.WithHint(err, "the remote region must be open (its metadata loaded) and the local one registered")
		}
		return nil
	}()
	if err != nil {
		e.mu.Unlock()
		return err
	}
	st := c.postXferReq(e.agent, req, args)
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		_ = c.releaseXferReq(e.agent, req)
		_ = c.destroyXferReq(req)
		e.mu.Unlock()
	}()
	var tick *time.Timer
	for st == capiInProgress {
		if tick == nil {
			tick = time.NewTimer(e.cfg.Poll)
			defer tick.Stop()
		} else {
			tick.Reset(e.cfg.Poll)
		}
		select {
		case <-ctx.Done():
			// The request is still posted; NIXL aborts it on release.
			return errors.Wrap(ctx.Err(), "nixl: waiting for a WRITE")
		case <-tick.C:
		}
		e.mu.Lock()
		st = c.getXferStatus(e.agent, req)
		e.mu.Unlock()
	}
	if st != capiSuccess {
		return errors.Mark(check(st, "WRITE to "+p.remote), rdma.ErrRefused)
	}
	return nil
}

// Close implements rdma.Peer.
func (p *peer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.e.mu.Lock()
	defer p.e.mu.Unlock()
	if p.e.closed {
		return nil
	}
	return check(p.e.c.invalidateRemote(p.e.agent, p.remote), "invalidate remote metadata")
}

var _ rdma.Engine = (*Engine)(nil)

// ParseNotif reads a notification made by Write: the key written per region.
func ParseNotif(msg []byte) (map[rdma.RegionID]uint64, error) {
	parts := strings.Split(string(msg), ":")
	if len(parts) < 3 || parts[0] != "tilert" || len(parts)%2 != 1 {
		return nil, errors.Newf("nixl: notification %q is not tilert:<region>:<key>...", msg)
	}
	out := map[rdma.RegionID]uint64{}
	for i := 1; i < len(parts); i += 2 {
		var id uint32
		var key uint64
		if _, err := fmt.Sscanf(parts[i]+" "+parts[i+1], "%d %d", &id, &key); err != nil {
			return nil, errors.Wrapf(err, "nixl: notification %q", msg)
		}
		out[rdma.RegionID(id)] = key
	}
	return out, nil
}
