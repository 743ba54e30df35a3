// Package decode is the decode-node role: the engine with its ctrl port for
// state handoff and its http port for token streams.
package decode

import (
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
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
}

// Command is `tilert decode`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "decode",
		Usage: "run a decode node: ctrl port for state handoff, http port for token streams",
		Flags: cliutil.Flags(Flags),
		Action: func(c *cli.Context) error {
			if _, _, err := cliutil.Load(c, Flags); err != nil {
				return err
			}
			return cliutil.NotBuilt("decode", "the decode node (handoff protocol, transfer engines, token streaming) has not landed yet")
		},
	}
}
