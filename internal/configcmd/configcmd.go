// Package configcmd is `tilert config`: check and print the configuration.
package configcmd

import (
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
)

var setFlag = &cli.StringSliceFlag{
	Name:  "set",
	Usage: "override a key as a flag would, KEY=VALUE with KEY dotted (decode.ctrl_port=5600); repeatable",
}

// load reads --config, the environment and --set overrides.
func load(c *cli.Context) (*config.Config, config.Sources, error) {
	flags := map[string]any{}
	for _, kv := range c.StringSlice("set") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, nil, cliutil.WithExitCode(errors.WithHint(errors.Newf("--set %q has no '='", kv),
				"write --set section.key=value"), cliutil.ExitUsage)
		}
		f, found := config.Lookup(k)
		if !found {
			return nil, nil, cliutil.WithExitCode(errors.WithHint(errors.Newf("--set: unknown key %q", k),
				"keys are section.key as in tilert.toml.example, e.g. decode.ctrl_port"), cliutil.ExitUsage)
		}
		tmp := config.Default()
		if err := f.SetString(tmp, v); err != nil {
			return nil, nil, err
		}
		flags[k] = f.Get(tmp)
	}
	return config.Load(config.Options{File: c.String("config"), Flags: flags})
}

// Command is `tilert config`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "check or print the configuration (flag > environment > file > default)",
		Subcommands: []*cli.Command{
			{
				Name:  "check",
				Usage: "validate the config file and environment; exit 0 when valid, 1 otherwise",
				Flags: []cli.Flag{config.ConfigFlag, setFlag},
				Action: func(c *cli.Context) error {
					cfg, _, err := load(c)
					if err != nil {
						return err
					}
					for _, w := range cfg.Warnings() {
						fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", w)
					}
					where := "defaults and environment"
					if f := c.String("config"); f != "" {
						where = f
					}
					fmt.Fprintf(c.App.Writer, "config OK (%s)\n", where)
					return nil
				},
			},
			{
				Name:  "print",
				Usage: "print the effective configuration as TOML, with the source of each value",
				Flags: []cli.Flag{config.ConfigFlag, setFlag},
				Action: func(c *cli.Context) error {
					cfg, src, err := load(c)
					if err != nil {
						return err
					}
					return config.Print(c.App.Writer, cfg, src)
				},
			},
			{
				Name:  "example",
				Usage: "print the documented example config (every key with its default)",
				Action: func(c *cli.Context) error {
					_, err := fmt.Fprint(c.App.Writer, config.Example())
					return err
				},
			},
		},
	}
}
