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
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/handoff"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/rdma/transfer"
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
	{Key: "decode.devices", Name: "devices"},
	{Key: "decode.comm", Name: "comm"},
	{Key: "decode.max_inflight", Name: "max-inflight"},
	{Key: "decode.prefill_precision", Name: "prefill-precision"},
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
			return cliutil.RunRole(c, Flags, func(ctx context.Context, cfg *config.Config) error {
				return Run(ctx, cfg, c.String("addr-file"))
			})
		},
	}
}

func usage(err error) error { return cliutil.WithExitCode(err, cliutil.ExitUsage) }

// Run serves a decode node for cfg until ctx ends (SIGINT/SIGTERM), then
// shuts down gracefully.
func Run(ctx context.Context, cfg *config.Config, addrFile string) error {
	log := slog.Default()
	d := cfg.Decode
	device, why, err := engineload.ResolveDevice(d.Device)
	if err != nil {
		return err
	}
	if device == "cpu" && d.Device != "cpu" {
		log.Warn("decode: no GPU; decoding on the CPU reference backend (for tests and tiny models; pass --device cuda to require the GPU)", "why", why)
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
	pp, err := engine.ParsePrefillPrecision(d.PrefillPrec)
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
	devs, err := config.ParseDevices(d.Devices)
	if err != nil {
		return usage(errors.WithHint(err, "list GPU ordinals separated by commas, e.g. --devices 0,1,2,3,4,5,6,7"))
	}
	eng, mcfg, closeEngine, err := engineload.OpenOn(device, cfg.Model.WeightsDir, engine.Options{Mode: engine.ModeServing,
		MLACache: dt, Slots: d.MaxInflight, MaxSeqLen: cfg.Model.MaxSeqLen, MTP: cfg.Model.WithMTP, Prefill: pp},
		engineload.Placement{Devices: devs, Comm: d.Comm})
	if err != nil {
		return err
	}
	defer closeEngine()
	if fam, err := model.ParseModelName(cfg.Model.Name); err != nil {
		return usage(err)
	} else if fam != mcfg.Family {
		return usage(errors.WithHintf(errors.Newf("--model %s is %s, but %s holds %s", cfg.Model.Name, fam, cfg.Model.WeightsDir, mcfg.Family),
			"pass --model %s, or the weights of %s", handoff.ModelName(mcfg.Family), cfg.Model.Name))
	}
	log.Info("decode: engine ready", "device", device, "devices", devs, "comm", d.Comm, "model", handoff.ModelName(mcfg.Family), "weights", cfg.Model.WeightsDir,
		"layers", mcfg.NumLayers, "mtp", cfg.Model.WithMTP, "kv_cache_dtype", dt, "max_seq_len", eng.Options().MaxSeqLen,
		"slots", d.MaxInflight, "slot_bytes", eng.Layout().SlotBytes, "load", time.Since(t0).Round(time.Millisecond))

	sec, err := SecurityFrom(cfg)
	if err != nil {
		return usage(err)
	}
	host := cfg.DecodeHost()
	tcfg := cfg.Transfer
	tcfg.Listen = cfg.TransferListen()
	tr, err := transfer.NewReceiver(tcfg, host, sec.Ctrl)
	if err != nil {
		return err
	}
	defer tr.Close()

	node, err := New(Options{Engine: eng, Transfer: tr, Model: handoff.ModelName(mcfg.Family), VocabSize: mcfg.VocabSize, EOS: mcfg.EOS,
		Device: device, Devices: devs,
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
	addrs := decodeapi.Addrs{Ctrl: ctrlLn.Addr().String(), HTTP: httpLn.Addr().String()}
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
func writeAddrs(path string, a decodeapi.Addrs) error {
	b, _ := json.Marshal(a)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return errors.Wrapf(err, "decode: --addr-file %s", path)
	}
	return errors.Wrapf(os.Rename(tmp, path), "decode: --addr-file %s", path)
}
