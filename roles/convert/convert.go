// Package convert is the converter role: HF checkpoint to TileRT weights.
package convert

import (
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
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

// Command is `tilert convert`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "convert",
		Usage: "convert an HF checkpoint (FP8 safetensors) to TileRT weights",
		Flags: cliutil.Flags(Flags),
		Action: func(c *cli.Context) error {
			if _, _, err := cliutil.Load(c, Flags); err != nil {
				return err
			}
			return cliutil.NotBuilt("convert", "the checkpoint converter has not landed yet")
		},
	}
}
