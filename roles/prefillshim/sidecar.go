// Package prefillshim is the connector sidecar that runs beside vLLM
// prefill: the Python KVConnector hands it staged state over a local
// socket and it ships that state to decode nodes.
package prefillshim

import (
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
)

// Flags are the sidecar's bindings.
var Flags = []config.Flag{
	{Key: "sidecar.socket", Name: "socket"},
	{Key: "sidecar.metrics_port", Name: "metrics-port"},
	{Key: "sidecar.staging_mib", Name: "staging-mib"},
	{Key: "transfer.engine", Name: "transfer-engine"},
}

// Command is `tilert connector-sidecar`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "connector-sidecar",
		Usage: "beside vLLM prefill: ship each claimed request's KV and indexer state to its decode node",
		Flags: cliutil.Flags(Flags),
		Action: func(c *cli.Context) error {
			if _, _, err := cliutil.Load(c, Flags); err != nil {
				return err
			}
			return cliutil.NotBuilt("connector-sidecar", "the connector sidecar and the vLLM plugin have not landed yet")
		},
	}
}
