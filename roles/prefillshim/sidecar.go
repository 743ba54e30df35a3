// Package prefillshim is the connector sidecar that runs beside vLLM
// prefill: the Python KVConnector (python/tilert/pd_vllm) stages each
// claimed request's state in a shared-memory file and announces it over a
// local unix socket; the sidecar ships it to the request's decode node over
// the ctrl protocol and a transfer engine, in the background, and deletes
// the file. docs/PROTOCOL.md, "Connector sidecar socket", is the contract.
package prefillshim

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"
	"github.com/valyala/fasthttp"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/fastserve"
	"github.com/tilert-go/tilert/internal/netguard"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/rdma/transfer"
)

// Flags are the sidecar's bindings.
var Flags = []config.Flag{
	{Key: "sidecar.socket", Name: "socket"},
	{Key: "sidecar.metrics_port", Name: "metrics-port"},
	{Key: "sidecar.staging_mib", Name: "staging-mib"},
	{Key: "transfer.engine", Name: "transfer-engine"},
	{Key: "sidecar.metrics_host", Name: "metrics-host"},
	{Key: "security.secret_file", Name: "secret-file"},
}

// Command is `tilert connector-sidecar`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "connector-sidecar",
		Usage: "beside vLLM prefill: ship each claimed request's KV and indexer state to its decode node",
		Flags: cliutil.Flags(Flags),
		Action: func(c *cli.Context) error {
			return cliutil.RunRole(c, Flags, func(ctx context.Context, cfg *config.Config) error {
				return Run(ctx, cfg, nil)
			})
		},
	}
}

// StagingDirFor is the staging directory of a sidecar on socket: in
// /dev/shm (memory, not disk) when there is one. The sidecar announces it in
// its hello, so the plugin never guesses it.
func StagingDirFor(socket string) string {
	root := "/dev/shm"
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		root = os.TempDir()
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, strings.TrimSuffix(filepath.Base(socket), ".sock"))
	return filepath.Join(root, "tilert-staging-"+name+"-"+strconv.Itoa(os.Getuid()))
}

// Ready reports the bound addresses once the sidecar listens (tests).
type Ready struct {
	Socket     string
	Metrics    string // empty when metrics_port is 0
	StagingDir string
}

// Run serves the sidecar for cfg until ctx ends, then drains for up to 10 s.
func Run(ctx context.Context, cfg *config.Config, ready func(Ready)) error {
	log := slog.Default()
	sc := cfg.Sidecar
	secret, err := cfg.Secret()
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	sec := cfg.Security
	// With a GPU here, vLLM's caches can be sent straight from its memory
	// (zero-copy); without, the plugin stages through /dev/shm.
	var dev DeviceAccess
	var reader rdma.DeviceReader
	if g, gerr := newGPUAccess(); gerr == nil {
		dev, reader = g, g
		defer g.close()
	} else {
		log.Info("sidecar: no GPU access; zero-copy off, the plugin stages through /dev/shm", "reason", gerr)
	}
	tr, err := transfer.NewDeviceSender(cfg.Transfer, secret, reader)
	if err != nil {
		return err
	}
	defer tr.Close()
	dir := StagingDirFor(sc.Socket)
	if err := PrivateDir(dir); err != nil {
		return err
	}
	if n := clearStaging(dir); n > 0 {
		log.Warn("sidecar: removed staging files left by an earlier run (their requests were never shipped)", "dir", dir, "files", n)
	}
	ln, err := listenUnix(sc.Socket)
	if err != nil {
		return err
	}
	s, err := New(Options{StagingDir: dir, StagingBytes: int64(sc.StagingMiB) << 20, Transfer: tr, Device: dev, Secret: secret, Log: log,
		Socket: pd.Security{MaxConns: sec.MaxConns, ReadTimeout: sec.ReadTimeout(), IdleTimeout: sec.IdleTimeout(),
			WriteTimeout: sec.WriteTimeout(), MaxFrame: sec.MaxFrameBytes}})
	if err != nil {
		_ = ln.Close()
		return err
	}
	var hs *fasthttp.Server
	r := Ready{Socket: sc.Socket, StagingDir: dir}
	if sc.MetricsPort > 0 {
		mln, err := net.Listen("tcp", cfg.SidecarMetricsAddr())
		if err != nil {
			_ = ln.Close()
			s.Close(0)
			return errors.WithHint(errors.Wrap(err, "sidecar: metrics listener"), "pick a free --metrics-port, or 0 to turn it off")
		}
		hs = &fasthttp.Server{Handler: s.Handler(), Name: "tilert-sidecar", ReadTimeout: sec.ReadTimeout(),
			WriteTimeout: sec.WriteTimeout(), IdleTimeout: sec.IdleTimeout(), ReadBufferSize: sec.MaxHeaderBytes,
			Logger: fastserve.Logger{Log: log, Name: "sidecar"}}
		lim := netguard.Wrap(mln, netguard.Limits{MaxConns: sec.MaxConns, MaxPerPeer: sec.MaxConnsPerPeer, Name: "sidecar metrics"})
		go func() { _ = hs.Serve(lim) }()
		r.Metrics = mln.Addr().String()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.Serve(ln) }()
	log.Info("sidecar: listening", "socket", sc.Socket, "metrics", r.Metrics, "staging_dir", dir,
		"staging_mib", sc.StagingMiB, "transfer", tr.Kind(), "zero_copy", dev != nil)
	if ready != nil {
		ready(r)
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	}
	_ = ln.Close()
	s.Close(10 * time.Second)
	if hs != nil {
		_ = hs.Shutdown()
	}
	_ = os.Remove(sc.Socket)
	return runErr
}

// listenUnix listens on path, replacing a socket file nobody listens on.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, errors.WithHint(errors.Newf("sidecar: %s exists and is not a socket", path), "pick another --socket")
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = c.Close()
			return nil, errors.WithHint(errors.Newf("sidecar: another process listens on %s", path), "stop it or pick another --socket")
		}
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "sidecar: listen on %s", path), "pick a writable --socket path")
	}
	// Only this user (vLLM runs as the same user) may hand over state.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, errors.Wrapf(err, "sidecar: chmod %s", path)
	}
	return ln, nil
}

func clearStaging(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if e.Type().IsRegular() && os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}

// PrivateDir makes dir the sidecar's own staging directory: created 0700
// when missing; an existing one must be a real directory (not a link)
// owned by this user and closed to everyone else, or the sidecar refuses
// it (another user could plant or read staged state in it).
func PrivateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if err != nil && !os.IsExist(err) {
		return errors.WithHint(errors.Wrapf(err, "sidecar: staging dir %s", dir), "the sidecar needs a writable /dev/shm (or temp dir)")
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return errors.Wrapf(err, "sidecar: staging dir %s", dir)
	}
	if !fi.IsDir() {
		return errors.WithHintf(errors.Newf("sidecar: staging dir %s is not a directory (%s)", dir, fi.Mode().Type()),
			"remove %s; the sidecar creates its staging dir itself", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return errors.WithHintf(errors.Newf("sidecar: staging dir %s belongs to uid %d, not this user (%d)", dir, st.Uid, os.Getuid()),
			"another user created it: remove it (or run with another --socket name); the sidecar creates its own")
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return errors.WithHintf(errors.Newf("sidecar: staging dir %s has mode %#o, wider than 0700", dir, perm),
			"remove it or chmod 700 %s; staged state must be private to this user", dir)
	}
	return nil
}
