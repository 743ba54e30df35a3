// Package engineload builds an engine on a device from a weights directory,
// so every command (generate, decode, bench) loads models the same way.
package engineload

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/cuda"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/cpu"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/model/synth"
	"github.com/tilert-go/tilert/weights"
)

// Devices lists the accepted --device values.
var Devices = []string{"auto", "cuda", "cpu"}

// DefaultDevice is the --device default of every command that runs an
// engine (decode, generate, bench): the GPU when one is usable, else the
// CPU reference backend. ResolveDevice says which, and why.
const DefaultDevice = "auto"

// ResolveDevice turns "auto" into "cuda" when a GPU is usable here and
// "cpu" otherwise; why says what was found (for the log). Other values are
// returned as they are, or refused with a hint.
func ResolveDevice(device string) (resolved, why string, err error) {
	switch device {
	case "cuda", "cpu":
		return device, "asked for", nil
	case "auto", "":
		n, err := cuda.DeviceCount()
		if err != nil || n == 0 {
			why := "no usable GPU"
			if err != nil {
				why += ": " + err.Error()
			}
			return "cpu", why, nil
		}
		return "cuda", fmt.Sprintf("%d GPU(s) found", n), nil
	}
	return "", "", cliutil.WithExitCode(errors.WithHintf(errors.Newf("unknown --device %q", device),
		"use --device auto (the GPU if there is one), cuda (NVIDIA GPU) or cpu (the pure-Go reference backend)"), cliutil.ExitUsage)
}

// IsConverted reports whether dir holds converted TileRT weights.
func IsConverted(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, weights.ManifestFile))
	return err == nil
}

// CheckDir reports a model directory given by flag (e.g. "--model-dir")
// that does not exist or is not a directory, naming the flag, so that this
// and not a later symptom (a missing tokenizer, say) is what the user reads.
func CheckDir(flag, dir string) error {
	st, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return cliutil.WithExitCode(errors.WithHintf(errors.Newf("%s %s: no such directory", flag, dir),
			"pass an HF checkpoint directory (tilert synth --out DIR makes a tiny one) or converted weights (tilert convert --save-dir)"), cliutil.ExitUsage)
	case err != nil:
		return errors.Wrapf(err, "%s %s", flag, dir)
	case !st.IsDir():
		return cliutil.WithExitCode(errors.WithHintf(errors.Newf("%s %s is a file, not a directory", flag, dir),
			"pass the directory that holds config.json (or tilert_manifest.json)"), cliutil.ExitUsage)
	}
	return nil
}

// Verify checks dir before serving from it: converted weights are verified
// in full (completeness and checksums); an HF checkpoint needs config.json.
func Verify(dir string) error {
	if dir == "" {
		return errors.WithHint(errors.New("no model weights directory"),
			"pass converted weights (tilert convert --save-dir) or an HF checkpoint directory")
	}
	if err := CheckDir("model directory", dir); err != nil {
		return err
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

// Open builds an engine for device ("cpu", "cuda", or "auto": see
// ResolveDevice) over dir. The returned close releases the engine and the
// weights.
func Open(device, dir string, opts engine.Options) (engine.Engine, *model.Config, func(), error) {
	return OpenOn(device, dir, opts, Placement{})
}

// Placement puts a GPU engine on its GPUs (decode.devices, decode.comm).
type Placement struct {
	// Devices is the GPU ordinal of each tensor-parallel rank; empty: GPU
	// 0, unsharded; one: that GPU, unsharded.
	Devices []int
	// Comm is the collective between ranks (gpu.ParseComm; "" or auto:
	// one-shot on one GPU, NCCL across GPUs).
	Comm string
}

// OpenOn is Open with the GPU engine placed by pl.
func OpenOn(device, dir string, opts engine.Options, pl Placement) (engine.Engine, *model.Config, func(), error) {
	device, _, err := ResolveDevice(device)
	if err != nil {
		return nil, nil, nil, err
	}
	if device == "cpu" && len(pl.Devices) > 0 {
		return nil, nil, nil, cliutil.WithExitCode(errors.WithHint(errors.Newf("devices %v given, but the engine runs on the CPU", pl.Devices),
			"pass --device cuda on a GPU machine, or leave --devices empty for the CPU backend"), cliutil.ExitUsage)
	}
	switch device {
	case "cpu":
		if opts.Prefill == engine.PrefillFast {
			slog.Warn("prefill precision fast applies to the GPU backend; the CPU engine prefills in float32")
		}
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
		if len(pl.Devices) > 0 {
			e, closeE, err := openPlaced(src, opts, pl)
			if err != nil {
				_ = closeSrc()
				return nil, nil, nil, err
			}
			return e, src.Config(), func() { closeE(); _ = closeSrc() }, nil
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

// openPlaced builds the unsharded engine on the one GPU listed, or the
// tensor-parallel engine over every listed GPU.
func openPlaced(src gpu.Source, opts engine.Options, pl Placement) (engine.Engine, func(), error) {
	if len(pl.Devices) == 1 {
		dev, err := cuda.Open(pl.Devices[0])
		if err != nil {
			return nil, nil, errors.Wrapf(err, "decode.devices: GPU %d", pl.Devices[0])
		}
		e, err := gpu.NewOnDevice(dev, src, opts)
		if err != nil {
			_ = dev.Close()
			return nil, nil, err
		}
		return e, func() { _ = e.Close(); _ = dev.Close() }, nil
	}
	comm, err := gpu.ParseComm(pl.Comm)
	if err != nil {
		return nil, nil, err
	}
	e, err := gpu.NewSharded(src, opts, gpu.ShardOptions{Devices: pl.Devices, Comm: comm})
	if err != nil {
		return nil, nil, err
	}
	return e, func() { _ = e.Close() }, nil
}

// DummyModels lists the --dummy-weights models: real dimensions of each
// family (DeepSeek-V3.2; GLM-5 as in its HF config) with random weights.
var DummyModels = []string{"deepseek-v3.2", "glm-5"}

// DummyConfig is the config of a --dummy-weights model with moeLayers MoE
// layers after the family's dense ones and no MTP layer.
func DummyConfig(name string, moeLayers int) (*model.Config, error) {
	return DummyConfigMTP(name, moeLayers, false)
}

// DummyConfigMTP is DummyConfig with the model's MTP layer when mtp is set
// (bench decode --context --mtp).
func DummyConfigMTP(name string, moeLayers int, mtp bool) (*model.Config, error) {
	if moeLayers < 0 || moeLayers > 200 {
		return nil, errors.WithHintf(errors.Newf("--layers %d", moeLayers), "give 0..200 MoE layers (8 fit one H200)")
	}
	var p synth.Preset
	switch name {
	case "deepseek-v3.2":
		var err error
		if p, err = synth.Lookup("deepseek-v3.2-moe"); err != nil {
			return nil, err
		}
		p.FirstKDenseReplace = 1
	case "glm-5":
		p = synth.Preset{
			Name: "glm-5-dummy", Family: model.GLMMoEDSA,
			VocabSize: 154880, HiddenSize: 6144, IntermediateSize: 12288, MoEIntermediateSize: 2048,
			FirstKDenseReplace: 3,
			NumHeads:           64, QLoraRank: 2048, KVLoraRank: 512, QKNopeHeadDim: 192, QKRopeHeadDim: 64, VHeadDim: 256,
			NRoutedExperts: 256, NSharedExperts: 1, NumExpertsPerTok: 8, NGroup: 1, TopKGroup: 1,
			IndexNHeads: 32, IndexHeadDim: 128, IndexTopK: 2048,
			MaxPositionEmbeddings: 202752, RMSNormEps: 1e-5, RopeTheta: 1e6,
			TokenizerVocab: 4096, MaxShardBytes: 1 << 30,
		}
	default:
		return nil, errors.WithHintf(errors.Newf("unknown --dummy-weights model %q", name), "use one of %v", DummyModels)
	}
	p.NumLayers = p.FirstKDenseReplace + moeLayers
	p.NumNextN = 0
	if mtp {
		p.NumNextN = 1
	}
	b, err := synth.Build(p, 0)
	if err != nil {
		return nil, err
	}
	return b.Config, nil
}

// OpenDummy builds a GPU engine over random weights with cfg's dimensions
// (gpu.Dummy), generated here and uploaded tensor by tensor: no files.
// oneBank: every MoE layer reads one bank of routed experts
// (gpu.DummyOneBank: the same bytes a step, a ninth of the memory at 9 MoE
// layers).
func OpenDummy(cfg *model.Config, opts engine.Options, oneBank bool) (*gpu.Engine, func(), error) {
	var src gpu.Source
	if oneBank {
		src = gpu.DummyOneBank(cfg, 1)
	} else {
		src = gpu.Dummy(cfg, 1)
	}
	e, err := gpu.New(src, opts)
	var ce *cuda.CUDAError
	if err != nil && !oneBank && errors.As(err, &ce) && ce.Name == "CUDA_ERROR_OUT_OF_MEMORY" {
		err = errors.WithHintf(err, "%d MoE layers of routed experts do not fit this GPU: add --one-expert-bank (every MoE layer reads one bank, the same bytes a step) or lower --layers", cfg.NumLayers-cfg.FirstKDenseReplace)
	}
	if err != nil {
		return nil, nil, err
	}
	return e, func() { _ = e.Close() }, nil
}
