// Package router is the OpenAI-compatible ingress for the TileRT pool.
//
// Per request: admit through the gate (each up decode node's max_inflight
// slots, then a bounded queue with a deadline, then 429, or a spill to a
// native vLLM endpoint), pick a node, run the prompt on vLLM for one token
// with kv_transfer_params naming the node (vLLM's TileRT connector ships the
// state there), read that token's id from the logprobs ("token_id:N", vLLM
// runs with --return-tokens-as-token-ids), then stream the rest from the
// node's /pd/decode, detokenise incrementally, apply stop strings, split
// reasoning and tool calls (package openai/parsers) and answer as vLLM's
// OpenAI server does. Nodes are health-checked; a request whose node fails
// before its first decoded token moves to another node. A client that
// leaves is answered with /pd/cancel (see internal/fastserve/watch.go for how a fasthttp
// server notices).
package router

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/tokenizer"
)

// Flags are the router role's bindings.
var Flags = []config.Flag{
	{Key: "router.vllm_url", Name: "vllm-url", Aliases: []string{"vllm_url"}},
	{Key: "router.decode", Name: "decode", Usage: "Decode node as host:ctrl_port:http_port; repeat for several."},
	{Key: "model.path", Name: "model-path", Aliases: []string{"model_path"}},
	{Key: "router.port", Name: "port"},
	{Key: "router.host", Name: "host"},
	{Key: "router.queue_size", Name: "queue-size"},
	{Key: "router.queue_timeout_s", Name: "queue-timeout"},
	{Key: "router.served_model_name", Name: "served-model-name"},
	{Key: "router.tool_call_parser", Name: "tool-call-parser"},
	{Key: "router.reasoning_parser", Name: "reasoning-parser"},
	{Key: "router.enable_auto_tool_choice", Name: "enable-auto-tool-choice"},
	{Key: "router.spill_url", Name: "spill-url"},
	{Key: "router.health_interval_s", Name: "health-interval"},
}

var addrFileFlag = &cli.StringFlag{Name: "addr-file", Usage: "write the bound address as JSON {\"http\":...} to this file once listening (for scripts using --port 0)"}

// Command is `tilert router`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "router",
		Usage: "OpenAI-compatible ingress: prefill on vLLM, decode on TileRT nodes, gated dispatch",
		Flags: append(cliutil.Flags(Flags), addrFileFlag),
		Action: func(c *cli.Context) error {
			return cliutil.RunRole(c, Flags, func(ctx context.Context, cfg *config.Config) error {
				return Run(ctx, cfg, c.String("addr-file"))
			})
		},
	}
}

// Run serves the router for cfg until ctx ends.
func Run(ctx context.Context, cfg *config.Config, addrFile string) error {
	rc := cfg.Router
	if cfg.Model.Path == "" {
		return cliutil.WithExitCode(errors.WithHint(errors.New("router: no model path"),
			"pass --model-path, the HF model directory (the router reads its tokenizer)"), cliutil.ExitUsage)
	}
	if len(rc.Decode) == 0 {
		return cliutil.WithExitCode(errors.WithHint(errors.New("router: no decode nodes"),
			"pass --decode host:ctrl_port:http_port (repeat for several)"), cliutil.ExitUsage)
	}
	tok, err := tokenizer.Load(cfg.Model.Path)
	if err != nil {
		return errors.WithHintf(err, "--model-path %s must hold the model's tokenizer.json", cfg.Model.Path)
	}
	guard, err := NewGuard(cfg) // API keys, quotas, limits (guard.go)
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	pdToken, err := PDToken(cfg)
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	rt, err := New(pctx, Options{VLLMURL: rc.VLLMURL, Nodes: rc.Decode, Tokenizer: tok, ModelPath: cfg.Model.Path,
		ServedModel: rc.ServedModel, QueueSize: rc.QueueSize,
		QueueTimeout:   time.Duration(rc.QueueTimeoutS * float64(time.Second)),
		ToolCallParser: rc.ToolCallParser, ReasoningParser: rc.ReasoningParser, EnableAutoToolChoice: rc.EnableAutoToolChoice,
		SpillURL: rc.SpillURL, HealthInterval: time.Duration(rc.HealthIntervalS * float64(time.Second)), PDToken: pdToken, Log: slog.Default()})
	if err != nil {
		return err
	}
	defer rt.Close()
	ln, err := Listen(cfg) // bind address, connection caps, TLS (guard.go)
	if err != nil {
		return err
	}
	srv := rt.Server()
	srv.Handler = guard.Wrap(srv.Handler)
	guard.Limit(srv)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if addrFile != "" {
		b, _ := json.Marshal(map[string]string{"http": ln.Addr().String()})
		tmp := addrFile + ".tmp"
		if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
			return errors.Wrapf(err, "router: --addr-file %s", addrFile)
		}
		if err := os.Rename(tmp, addrFile); err != nil {
			return errors.Wrapf(err, "router: --addr-file %s", addrFile)
		}
	}
	slog.Info("router: serving", "addr", ln.Addr().String(), "model", rt.served, "vllm", rc.VLLMURL, "decode", rc.Decode,
		"queue_size", rc.QueueSize, "queue_timeout_s", rc.QueueTimeoutS)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return errors.Wrap(err, "router: serve")
	}
	slog.Info("router: shutting down; letting requests in flight finish")
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	_ = srv.ShutdownWithContext(sctx)
	return nil
}
