// Package engineload builds an engine on a device from a weights directory,
// so every command (generate, decode, bench) loads models the same way.
package engineload

import (
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/weights"
)

// Devices lists the accepted --device values.
var Devices = []string{"cpu", "cuda"}

// IsConverted reports whether dir holds converted TileRT weights.
func IsConverted(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, weights.ManifestFile))
	return err == nil
}

// Verify checks dir before serving from it: converted weights are verified
// in full (completeness and checksums); an HF checkpoint needs config.json.
func Verify(dir string) error {
	if dir == "" {
		return errors.WithHint(errors.New("no model weights directory"),
			"pass converted weights (tilert convert --save-dir) or an HF checkpoint directory")
	}
	if IsConverted(dir) {
		return errors.Wrapf(weights.Verify(dir), "verifying converted weights %s", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return errors.WithHintf(errors.Newf("%s holds neither converted weights (%s) nor an HF checkpoint (config.json)", dir, weights.ManifestFile),
			"pass the --save-dir of tilert convert, or an HF checkpoint directory")
	}
	return nil
}

// OpenWeights verifies dir (Verify) and opens it (Weights): converted
// weights are checked in full before serving. The caller calls the returned
// close.
func OpenWeights(dir string) (model.Weights, *model.Config, func(), error) {
	if err := Verify(dir); err != nil {
		return nil, nil, nil, err
	}
	return Weights(dir)
}

// Weights opens dir (converted or HF) as float32 weights for the CPU engine.
func Weights(dir string) (model.Weights, *model.Config, func(), error) {
	var (
		w   model.Weights
		cfg *model.Config
		err error
	)
	if IsConverted(dir) {
		w, cfg, err = weights.OpenWeights(dir)
	} else if cfg, err = model.LoadConfig(dir); err == nil {
		w, err = model.OpenWeights(dir)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	return w, cfg, func() {
		if c, ok := w.(io.Closer); ok {
			_ = c.Close()
		}
	}, nil
}

// Open builds an engine for device ("cpu" or "cuda") over dir. The returned
// close releases the engine and the weights.
func Open(device, dir string, opts engine.Options) (engine.Engine, *model.Config, func(), error) {
	switch device {
	case "cpu":
		w, cfg, closeW, err := Weights(dir)
		if err != nil {
			return nil, nil, nil, err
		}
		e, err := cpu.New(cfg, w, opts)
		if err != nil {
			closeW()
			return nil, nil, nil, err
		}
		return e, cfg, func() { _ = e.Close(); closeW() }, nil
	case "cuda":
		src, closeSrc, err := gpu.Open(dir)
		if err != nil {
			return nil, nil, nil, err
		}
		e, err := gpu.New(src, opts)
		if err != nil {
			_ = closeSrc()
			return nil, nil, nil, err
		}
		return e, src.Config(), func() { _ = e.Close(); _ = closeSrc() }, nil
	}
	return nil, nil, nil, errors.WithHintf(errors.Newf("unknown device %q", device), "use --device cpu or --device cuda")
}
