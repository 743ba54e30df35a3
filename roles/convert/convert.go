// Package convert is the converter role: HF checkpoint to TileRT weights.
package convert

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/converter"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/weights"
)

// Flags accept the launch post's python spellings as aliases.
var Flags = []config.Flag{
	{Key: "model.name", Name: "model", Aliases: []string{"model-type", "model_type"}},
	{Key: "convert.model_dir", Name: "model-dir", Aliases: []string{"model_dir"}},
	{Key: "convert.save_dir", Name: "save-dir", Aliases: []string{"save_dir"}},
	{Key: "convert.devices", Name: "devices"},
	{Key: "convert.append_mtp", Name: "append-mtp", Aliases: []string{"append_mtp"}},
	{Key: "convert.force", Name: "force"},
}

// verifyFlag checks a converted directory instead of converting; it is an action, not a setting,
// so it has no config key.
var verifyFlag = &cli.StringFlag{
	Name:  "verify",
	Usage: "check a converted directory (manifest, completeness, every tensor's checksum) and exit",
}

// Command is `tilert convert`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "convert",
		Usage: "convert an HF checkpoint (FP8 safetensors) to TileRT weights",
		Description: "Streams the checkpoint tensor by tensor into SAVE_DIR.partial and renames it to SAVE_DIR\n" +
			"when complete; `--verify DIR` checks a converted directory. Layouts: docs/LAYOUTS.md.",
		Flags: append(cliutil.Flags(Flags), verifyFlag),
		Action: func(c *cli.Context) error {
			cfg, src, err := cliutil.Load(c, Flags)
			if err != nil {
				return err
			}
			if dir := c.String("verify"); dir != "" {
				return verify(c, dir)
			}
			return run(c, cfg, src)
		},
	}
}

func verify(c *cli.Context, dir string) error {
	start := time.Now()
	if err := weights.Verify(dir); err != nil {
		return err
	}
	m, err := weights.ReadManifest(dir)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s: ok: %s, %d tensors in %d shards, %.2f GB checked in %.1f s\n",
		dir, m.ModelType, len(m.Tensors), len(m.Shards), float64(m.TotalBytes)/1e9, time.Since(start).Seconds())
	return err
}

func run(c *cli.Context, cfg *config.Config, src config.Sources) error {
	cc := cfg.Convert
	if cc.ModelDir == "" || cc.SaveDir == "" {
		return cliutil.WithExitCode(errors.WithHint(errors.New("tilert convert needs --model-dir and --save-dir"),
			"tilert convert --model deepseek-v3.2 --model-dir HF_DIR --save-dir OUT, or --verify OUT"), cliutil.ExitUsage)
	}
	name := cfg.Model.Name
	if src["model.name"] == config.SourceDefault {
		name = "" // the default model name must not veto a checkpoint the user did not name
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := converter.NewProgress(os.Stderr)
	sum, err := converter.Convert(ctx, converter.Options{
		ModelDir: cc.ModelDir, SaveDir: cc.SaveDir, ModelName: name, Devices: cc.Devices,
		AppendMTP: cc.AppendMTP, Force: cc.Force, Progress: p.Update,
	})
	p.Finish()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "converted %s -> %s: %.2f GB in %d tensors, %d shards, %.1f s, %.2f GB/s\n",
		cc.ModelDir, sum.Dir, float64(sum.Bytes)/1e9, sum.Tensors, sum.Shards, sum.Duration.Seconds(), sum.GBps())
	return err
}
