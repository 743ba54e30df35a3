package devvllm

import (
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
)

// Command is `tilert dev-vllm`.
func Command() *cli.Command {
	return &cli.Command{
		Name: "dev-vllm",
		Usage: "dev stand-in for vLLM prefill + TileRT connector + sidecar: an OpenAI-style server that prefills on the CPU engine " +
			"and hands the state to a decode node (for running the whole stack without a GPU; not vLLM)",
		Flags: append(cliutil.Flags(secretFlags),
			&cli.StringFlag{Name: "model-dir", Usage: "HF checkpoint (or converted weights with tokenizer files) of the decode node's model"},
			&cli.StringFlag{Name: "host", Value: "127.0.0.1", Usage: "address to bind"},
			&cli.IntFlag{Name: "port", Value: 8000, Usage: "port (0 lets the kernel choose; see --addr-file)"},
			&cli.StringFlag{Name: "served-model-name", Usage: "model name in the API (default: the model directory's base name)"},
			&cli.StringFlag{Name: "transfer-engine", Value: "tcp", Usage: "tcp or nixl (must match the decode node)"},
			&cli.IntFlag{Name: "max-seq-len", Value: 4096, Usage: "longest prompt prefilled"},
			&cli.StringFlag{Name: "addr-file", Usage: "write the bound address as JSON {\"http\":...} once listening"},
		),
		Action: func(c *cli.Context) error {
			cfg, _, err := cliutil.Load(c, secretFlags)
			if err != nil {
				return err
			}
			secret, err := cfg.Secret()
			if err != nil {
				return err
			}
			if c.String("model-dir") == "" {
				return cliutil.WithExitCode(errors.WithHint(errors.New("dev-vllm: no --model-dir"),
					"pass the decode node's model directory (e.g. the output of tilert synth)"), cliutil.ExitUsage)
			}
			ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return Run(ctx, RunOptions{ModelDir: c.String("model-dir"), Host: c.String("host"), Port: c.Int("port"),
				ServedModel: c.String("served-model-name"), Transfer: c.String("transfer-engine"),
				MaxSeqLen: c.Int("max-seq-len"), AddrFile: c.String("addr-file"), Secret: secret})
		},
	}
}

// secretFlags: with a shared secret the stand-in authenticates to the
// decode nodes' ctrl and transfer ports, as the sidecar does.
var secretFlags = []config.Flag{{Key: "security.secret_file", Name: "secret-file"}}

var loadWeights = engineload.OpenWeights

func baseName(dir string) string { return filepath.Base(filepath.Clean(dir)) }

func writeAddr(path, addr string) error {
	b, _ := json.Marshal(map[string]string{"http": addr})
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return errors.Wrapf(err, "dev-vllm: --addr-file %s", path)
	}
	return errors.Wrapf(os.Rename(tmp, path), "dev-vllm: --addr-file %s", path)
}
