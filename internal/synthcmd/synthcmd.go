// Package synthcmd is `tilert synth`: deterministic synthetic checkpoints
// in the real HF layout, for tests, the demo and benchmarks.
package synthcmd

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/model/synth"
)

// Command is `tilert synth`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "synth",
		Usage: "write a synthetic HF checkpoint (FP8 weights, tokenizer, configs); same bytes for the same seed",
		Flags: append(cliutil.Flags(nil),
			&cli.StringFlag{Name: "preset", Required: true, Usage: "one of " + strings.Join(synth.Names(), ", ")},
			&cli.StringFlag{Name: "out", Required: true, Usage: "output directory (must not exist or be empty)"},
			&cli.Int64Flag{Name: "seed", Value: 0, Usage: "random seed"},
		),
		Action: func(c *cli.Context) error {
			if _, _, err := cliutil.Load(c, nil); err != nil {
				return err
			}
			if _, err := synth.Lookup(c.String("preset")); err != nil {
				return cliutil.WithExitCode(err, cliutil.ExitUsage)
			}
			start := time.Now()
			last := time.Now()
			err := synth.Write(c.String("preset"), c.String("out"), c.Int64("seed"), func(done, total int64) {
				if time.Since(last) > 2*time.Second {
					last = time.Now()
					slog.Info("synth progress", "done_mb", done>>20, "total_mb", total>>20)
				}
			})
			if err != nil {
				return errors.Wrapf(err, "synth %s", c.String("preset"))
			}
			fmt.Fprintf(c.App.Writer, "wrote %s (preset %s, seed %d) in %s\n", c.String("out"), c.String("preset"),
				c.Int64("seed"), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
