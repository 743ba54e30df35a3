// Package decode is the decode-node role: the engine with its ctrl port for
// state handoff and its http port for token streams.
//
// One goroutine owns the engine (the scheduler): it admits requests whose
// state has arrived, runs one batched Step over every active slot and fans
// the tokens out to per-request streams. The ctrl server (package pd) and
// the transfer engine (package rdma) write request state straight into the
// engine's slot buffers, which in serving mode are its live caches.
package decode

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/pd"
	"github.com/tilert-go/tilert/rdma"
	"github.com/tilert-go/tilert/rdma/nixl"
)

// Flags are the decode role's bindings; the launch post's spellings are the
// primary names already.
var Flags = []config.Flag{
	{Key: "decode.engine", Name: "engine"},
	{Key: "model.name", Name: "model"},
	{Key: "model.weights_dir", Name: "model-weights-dir", Aliases: []string{"model_weights_dir"}},
	{Key: "model.with_mtp", Name: "with-mtp", Aliases: []string{"with_mtp"}},
	{Key: "model.max_seq_len", Name: "max-seq-len", Aliases: []string{"max_seq_len"}},
	{Key: "model.kv_cache_dtype", Name: "kv-cache-dtype", Aliases: []string{"kv_cache_dtype"}},
	{Key: "decode.ctrl_port", Name: "ctrl-port", Aliases: []string{"ctrl_port"}},
	{Key: "decode.http_port", Name: "http-port", Aliases: []string{"http_port"}},
	{Key: "decode.host", Name: "host"},
	{Key: "decode.device", Name: "device"},
	{Key: "decode.max_inflight", Name: "max-inflight"},
	{Key: "decode.state_timeout_s", Name: "state-timeout"},
	{Key: "transfer.engine", Name: "transfer-engine"},
	{Key: "transfer.listen", Name: "transfer-listen"},
	{Key: "security.secret_file", Name: "secret-file"},
	{Key: "security.pd_token_file", Name: "pd-token-file"},
}

// addrFileFlag is a run-time convenience, not configuration: with ports 0
// the kernel picks them, and scripts read the real ones from this file.
var addrFileFlag = &cli.StringFlag{Name: "addr-file", Usage: "write the bound ctrl/http addresses as JSON to this file once listening (for scripts using port 0)"}

// Command is `tilert decode`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "decode",
		Usage: "run a decode node: ctrl port for state handoff, http port for token streams",
		Flags: append(cliutil.Flags(Flags), addrFileFlag),
		Action: func(c *cli.Context) error {
			cfg, _, err := cliutil.Load(c, Flags)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return Run(ctx, cfg, c.String("addr-file"))
		},
	}
}

func usage(err error) error { return cliutil.WithExitCode(err, cliutil.ExitUsage) }

// Addrs are the bound addresses, written to --addr-file.
type Addrs struct {
	Ctrl string `json:"ctrl"`
	HTTP string `json:"http"`
}

// Run serves a decode node for cfg until ctx ends (SIGINT/SIGTERM), then
// shuts down gracefully.
func Run(ctx context.Context, cfg *config.Config, addrFile string) error {
	log := slog.Default()
	d := cfg.Decode
	if d.Device != "cpu" && d.Device != "cuda" {
		return usage(errors.WithHint(errors.Newf("unknown --device %q", d.Device), "use --device cuda (NVIDIA GPU) or --device cpu (pure-Go reference backend)"))
	}
	if d.Engine != "tilert" {
		return usage(errors.WithHint(errors.Newf("unknown decode engine %q", d.Engine), "use --engine tilert"))
	}
	if d.MaxInflight < 1 {
		return usage(errors.WithHint(errors.Newf("--max-inflight %d", d.MaxInflight), "decode at least one request at a time"))
	}
	dt, err := engine.ParseCacheDType(cfg.Model.KVCacheDType)
	if err != nil {
		return usage(err)
	}
	t0 := time.Now()
	if cfg.Model.WeightsDir == "" {
		return usage(errors.WithHint(errors.New("no model weights directory"),
			"pass --model-weights-dir (converted weights from tilert convert, or an HF checkpoint directory)"))
	}
	if err := engineload.Verify(cfg.Model.WeightsDir); err != nil {
		return err
	}
	// The GPU backend's slot buffers are host staging copies that Import
	// uploads, so the transfer engines register host memory on both devices.
	eng, mcfg, closeEngine, err := engineload.Open(d.Device, cfg.Model.WeightsDir, engine.Options{Mode: engine.ModeServing,
		MLACache: dt, Slots: d.MaxInflight, MaxSeqLen: cfg.Model.MaxSeqLen, MTP: cfg.Model.WithMTP})
	if err != nil {
		return err
	}
	defer closeEngine()
	if fam, err := model.ParseModelName(cfg.Model.Name); err != nil {
		return usage(err)
	} else if fam != mcfg.Family {
		return usage(errors.WithHintf(errors.Newf("--model %s is %s, but %s holds %s", cfg.Model.Name, fam, cfg.Model.WeightsDir, mcfg.Family),
			"pass --model %s, or the weights of %s", ModelName(mcfg.Family), cfg.Model.Name))
	}
	log.Info("decode: engine ready", "device", d.Device, "model", ModelName(mcfg.Family), "weights", cfg.Model.WeightsDir,
		"layers", mcfg.NumLayers, "mtp", cfg.Model.WithMTP, "kv_cache_dtype", dt, "max_seq_len", eng.Options().MaxSeqLen,
		"slots", d.MaxInflight, "slot_bytes", eng.Layout().SlotBytes, "load", time.Since(t0).Round(time.Millisecond))

	sec, err := SecurityFrom(cfg)
	if err != nil {
		return usage(err)
	}
	host := cfg.DecodeHost()
	tcfg := cfg.Transfer
	tcfg.Listen = cfg.TransferListen()
	tr, err := NewTransfer(tcfg, host, sec.Ctrl)
	if err != nil {
		return err
	}
	defer tr.Close()

	node, err := New(Options{Engine: eng, Transfer: tr, Model: ModelName(mcfg.Family), VocabSize: mcfg.VocabSize, EOS: mcfg.EOS,
		StateTimeout:    time.Duration(d.StateTimeoutS * float64(time.Second)),
		ReserveDeadline: time.Duration(d.SlotReserveTTL * float64(time.Second)), Security: sec, Log: log})
	if err != nil {
		return err
	}
	if sec.Ctrl.Secret == nil {
		log.Warn("decode: no security.secret_file: the ctrl, transfer and /pd/* ports authenticate nobody; keep them on loopback or a private network",
			"host", host)
	}
	ctrlLn, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(d.CtrlPort)))
	if err != nil {
		_ = node.Close()
		return errors.WithHint(errors.Wrap(err, "decode: ctrl port"), "pick a free --ctrl-port (0 lets the kernel choose)")
	}
	httpLn, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(d.HTTPPort)))
	if err != nil {
		_ = ctrlLn.Close()
		_ = node.Close()
		return errors.WithHint(errors.Wrap(err, "decode: http port"), "pick a free --http-port (0 lets the kernel choose)")
	}
	errc := make(chan error, 2)
	go func() { errc <- node.ServeCtrl(ctrlLn) }()
	go func() { errc <- node.ServeHTTP(httpLn) }()
	addrs := Addrs{Ctrl: ctrlLn.Addr().String(), HTTP: httpLn.Addr().String()}
	if addrFile != "" {
		if err := writeAddrs(addrFile, addrs); err != nil {
			_ = node.Close()
			return err
		}
	}
	log.Info("decode: node serving", "ctrl", addrs.Ctrl, "http", addrs.HTTP, "transport", tr.Kind(), "endpoint", shortEndpoint(tr.Endpoint()))

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("decode: shutting down; letting requests in flight finish")
	case serveErr = <-errc:
		log.Error("decode: a listener failed; shutting down", "err", serveErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.Shutdown(sctx); err != nil {
		log.Warn("decode: http shutdown", "err", err.Error())
	}
	log.Info("decode: stopped")
	return serveErr
}

func shortEndpoint(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// writeAddrs writes the file atomically, so a script polling for it never
// reads half of it.
func writeAddrs(path string, a Addrs) error {
	b, _ := json.Marshal(a)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return errors.Wrapf(err, "decode: --addr-file %s", path)
	}
	return errors.Wrapf(os.Rename(tmp, path), "decode: --addr-file %s", path)
}

// LoadWeights opens a model directory the way every command does
// (internal/engineload): converted TileRT weights, verified in full first,
// or, for the tiny synthetic models and checks, an HF checkpoint directory.
// The caller calls the returned close.
func LoadWeights(dir string) (model.Weights, *model.Config, func(), error) {
	if dir == "" {
		return nil, nil, nil, usage(errors.WithHint(errors.New("no model weights directory"),
			"pass --model-weights-dir (converted weights from tilert convert, or an HF checkpoint directory)"))
	}
	if err := engineload.Verify(dir); err != nil {
		return nil, nil, nil, err
	}
	return engineload.Weights(dir)
}

// NewTransfer starts the configured transfer engine for receiving; the tcp
// engine's streams prove sec.Secret and are capped and timed as the ctrl
// port's connections.
func NewTransfer(t config.Transfer, host string, sec pd.Security) (rdma.Engine, error) {
	sec.Defaults()
	switch t.Engine {
	case "tcp":
		cfg := rdma.TCPConfig{Listen: t.Listen, Streams: t.Streams, Secret: sec.Secret, MaxConns: sec.MaxConns,
			MaxConnsPerPeer: sec.MaxConnsPerPeer, HandshakeTimeout: sec.ReadTimeout, IdleTimeout: sec.IdleTimeout}
		e, err := rdma.NewTCP(cfg)
		if err != nil {
			return nil, err
		}
		if adv := advertise(e.Endpoint(), host); adv != "" {
			_ = e.Close()
			cfg.Advertise = adv
			// Listen again on the port the kernel picked, now advertised.
			cfg.Listen = listenAddr(t.Listen, adv)
			return rdma.NewTCP(cfg)
		}
		return e, nil
	case "nixl":
		if t.NixlLib != "" {
			if err := os.Setenv("TILERT_NIXL_LIB", t.NixlLib); err != nil {
				return nil, errors.Wrap(err, "decode: TILERT_NIXL_LIB")
			}
		}
		e, err := nixl.New(nixl.Config{})
		if err != nil {
			return nil, errors.Wrap(err, "decode: transfer engine nixl")
		}
		return e, nil
	}
	return nil, usage(errors.WithHint(errors.Newf("unknown transfer engine %q", t.Engine), "use --transfer-engine tcp or nixl"))
}

// advertise returns host:port to announce when the tcp engine listens on a
// wildcard address (peers cannot dial 0.0.0.0): the decode host when it is
// specific, else the first non-loopback IPv4 address, else loopback.
// Empty when the listen address is specific already.
func advertise(endpoint, host string) string {
	hp := endpoint[len("tcp://"):]
	h, port, err := net.SplitHostPort(hp)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
		return ""
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return net.JoinHostPort(host, port)
	}
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return net.JoinHostPort(ipn.IP.String(), port)
			}
		}
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func listenAddr(listen, adv string) string {
	h, _, _ := net.SplitHostPort(listen)
	_, port, _ := net.SplitHostPort(adv)
	return net.JoinHostPort(h, port)
}
