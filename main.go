// Command tilert plays every TileRT role by subcommand. main only wires the
// roles together; each lives in its own package.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/internal/benchcmd"
	"github.com/tilert-go/tilert/internal/buildinfo"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/configcmd"
	"github.com/tilert-go/tilert/internal/devprefill"
	"github.com/tilert-go/tilert/internal/devvllm"
	"github.com/tilert-go/tilert/internal/generatecmd"
	"github.com/tilert-go/tilert/internal/synthcmd"
	"github.com/tilert-go/tilert/roles/convert"
	"github.com/tilert-go/tilert/roles/decode"
	"github.com/tilert-go/tilert/roles/prefillshim"
	"github.com/tilert-go/tilert/roles/router"
)

func newApp() *cli.App {
	app := &cli.App{
		Name:    "tilert",
		Usage:   "per-user-latency decode engine for disaggregated vLLM serving",
		Version: buildinfo.Version,
		Commands: []*cli.Command{
			convert.Command(),
			decode.Command(),
			router.Command(),
			prefillshim.Command(),
			configcmd.Command(),
			synthcmd.Command(),
			generatecmd.Command(),
			benchcmd.Command(),
			devprefill.Command(),
			devvllm.Command(),
			{
				Name:  "version",
				Usage: "print version, commit and Go version",
				Action: func(c *cli.Context) error {
					_, err := fmt.Fprintln(c.App.Writer, buildinfo.String())
					return err
				},
			},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return cliutil.WithExitCode(err, cliutil.ExitUsage)
		},
		// Errors are reported once, by main, with their hints.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	markUsageErrors(app.Commands)
	cliutil.SuggestCommands(app)
	return app
}

// markUsageErrors makes a bad flag on any subcommand exit 2, like the app's.
func markUsageErrors(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
			return cliutil.WithExitCode(err, cliutil.ExitUsage)
		}
		markUsageErrors(c.Subcommands)
	}
}

func main() {
	os.Exit(cliutil.Report(os.Stderr, newApp().Run(os.Args)))
}
