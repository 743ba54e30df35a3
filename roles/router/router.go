// Package router is the OpenAI-compatible ingress for the TileRT pool.
package router

import (
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
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
}

// Command is `tilert router`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "router",
		Usage: "OpenAI-compatible ingress: prefill on vLLM, decode on TileRT nodes, gated dispatch",
		Flags: cliutil.Flags(Flags),
		Action: func(c *cli.Context) error {
			if _, _, err := cliutil.Load(c, Flags); err != nil {
				return err
			}
			return cliutil.NotBuilt("router", "the OpenAI-compatible router has not landed yet")
		},
	}
}
