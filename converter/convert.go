package converter

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/internal/buildinfo"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/safetensors"
	"github.com/tilert-go/tilert/weights"
)

// ConverterVersion is the converter's own version (independent of the weight format's layout).
const ConverterVersion = "1.0.0"

func converterVersion() string {
	return fmt.Sprintf("%s (tilert %s)", ConverterVersion, buildinfo.Version)
}

// Options configure a conversion.
type Options struct {
	ModelDir string // HF checkpoint directory
	SaveDir  string // output directory (written as SaveDir.partial, renamed when complete)
	// ModelName is the user's --model; when set it must name the checkpoint's family.
	ModelName string
	Devices   int  // experts are grouped for this many devices (>= 1)
	AppendMTP bool // store the MTP layers
	Force     bool // replace an existing SaveDir (only once the new one is complete)

	MaxShardBytes int64 // 0: weights.DefaultMaxShardBytes
	// Workers tensors are converted at once, each through one buffer of ChunkBytes: the data
	// memory bound is Workers*ChunkBytes (defaults min(GOMAXPROCS, 4) and 8 MiB).
	Workers    int
	ChunkBytes int
	FS         FS // nil: OSFS
	// Progress, when set, is called after every chunk written with the bytes done and the total.
	Progress func(done, total int64)
}

// Summary reports a finished conversion.
type Summary struct {
	Dir         string
	Bytes       int64 // tensor bytes written
	SourceBytes int64 // tensor bytes read from the checkpoint
	Tensors     int
	Shards      int
	Duration    time.Duration
}

// GBps is the write rate in GB/s (10^9 bytes).
func (s *Summary) GBps() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.Bytes) / 1e9 / s.Duration.Seconds()
}

// copiedFiles are the small files a decode node needs besides the weights.
var copiedFiles = []string{
	"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"special_tokens_map.json", "chat_template.jinja",
}

// Convert converts an HF checkpoint into the TileRT format. It streams tensor by tensor (memory is
// bounded by Workers*ChunkBytes plus the plan, whatever the model size), writes into
// SaveDir.partial and renames it to SaveDir only once every shard, the copied files and finally
// the manifest are written and fsynced. On error the partial directory is removed and SaveDir is
// left as it was.
func Convert(ctx context.Context, o Options) (*Summary, error) {
	start := time.Now()
	if err := o.defaults(); err != nil {
		return nil, err
	}
	out := filepath.Clean(o.SaveDir)
	partial := out + weights.PartialSuffix
	if err := checkTarget(out, partial, o.Force); err != nil {
		return nil, err
	}

	cfg, err := model.LoadConfig(o.ModelDir)
	if err != nil {
		return nil, errors.Wrapf(err, "convert %s", o.ModelDir)
	}
	if o.ModelName != "" {
		fam, err := model.ParseModelName(o.ModelName)
		if err != nil {
			return nil, err
		}
		if fam != cfg.Family {
			return nil, errors.WithHint(errors.Newf("--model %s is %s but %s/config.json is %s", o.ModelName, fam, o.ModelDir, cfg.Family),
				"pass the --model that matches the checkpoint, or the right --model-dir")
		}
	}
	ck, err := safetensors.OpenDir(o.ModelDir)
	if err != nil {
		return nil, errors.Wrapf(err, "convert %s", o.ModelDir)
	}
	defer ck.Close()
	src := newSource(ck, cfg)
	ts, err := src.plan(o.Devices, o.AppendMTP)
	if err != nil {
		return nil, errors.Wrapf(err, "convert %s", o.ModelDir)
	}
	logUnused(ck, ts)
	shards, err := assignShards(ts, o.MaxShardBytes)
	if err != nil {
		return nil, err
	}
	mtp := 0
	if o.AppendMTP {
		mtp = cfg.NumNextNLayers
	}
	m := &weights.Manifest{
		Format: weights.FormatName, LayoutVersion: weights.LayoutVersion, ConverterVersion: converterVersion(),
		ModelType: cfg.Family, ModelName: o.ModelName, HFConfig: cfg.Raw, Devices: o.Devices,
		ExpertPlacement: weights.ExpertPlacement, MTPLayers: mtp, Checksum: weights.ChecksumAlgo,
	}
	if q := cfg.Quant; q != nil {
		m.Quantization = &weights.Quant{Fmt: q.Fmt, BlockSize: q.WeightBlockSize, ScaleFmt: q.ScaleFmt}
	}
	var total, srcTotal int64
	for i := range ts {
		total += ts[i].Bytes
		for _, s := range ts[i].segs {
			srcTotal += s.n
		}
	}
	m.TotalBytes = total
	slog.Info("convert: plan", "model", cfg.Family, "from", o.ModelDir, "to", out, "tensors", len(ts),
		"shards", len(shards), "bytes", total, "devices", o.Devices, "mtp_layers", mtp)

	fs := o.FS
	if err := fs.RemoveAll(partial); err != nil {
		return nil, errors.Wrapf(err, "remove stale %s", partial)
	}
	if err := fs.MkdirAll(partial); err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "create %s", partial), "check that the parent of --save-dir is writable")
	}
	ok := false
	defer func() {
		if !ok {
			if err := fs.RemoveAll(partial); err != nil {
				slog.Warn("convert: could not remove the partial output", "dir", partial, "err", err)
			}
		}
	}()

	w := &writer{o: &o, dir: partial, ts: ts, total: total}
	if err := w.run(ctx, shards); err != nil {
		return nil, err
	}
	for _, s := range shards {
		m.Shards = append(m.Shards, weights.ShardInfo{File: s.file, Bytes: s.bytes, Device: s.device, Tensors: len(s.tensors)})
	}
	m.Tensors = make([]weights.Entry, len(ts))
	for i := range ts {
		m.Tensors[i] = ts[i].Entry
	}
	if m.Files, err = copyFiles(fs, o.ModelDir, partial); err != nil {
		return nil, err
	}
	if err := writeManifest(fs, partial, m); err != nil {
		return nil, err
	}
	if err := fs.SyncDir(partial); err != nil {
		return nil, errors.Wrapf(err, "fsync %s", partial)
	}
	if err := publish(fs, partial, out, o.Force); err != nil {
		return nil, err
	}
	ok = true
	sum := &Summary{Dir: out, Bytes: total, SourceBytes: srcTotal, Tensors: len(ts), Shards: len(shards), Duration: time.Since(start)}
	return sum, nil
}

func (o *Options) defaults() error {
	if o.ModelDir == "" || o.SaveDir == "" {
		return errors.WithHint(errors.New("convert needs a checkpoint directory and an output directory"),
			"pass --model-dir HF_DIR --save-dir OUT")
	}
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.Devices < 0 {
		return errors.Newf("--devices must be >= 1, got %d", o.Devices)
	}
	if o.MaxShardBytes == 0 {
		o.MaxShardBytes = weights.DefaultMaxShardBytes
	}
	if o.ChunkBytes == 0 {
		o.ChunkBytes = 8 << 20
	}
	o.ChunkBytes = max(o.ChunkBytes&^7, 4096) // whole bf16 and f32 elements per chunk
	if o.Workers <= 0 {
		o.Workers = min(runtime.GOMAXPROCS(0), 4)
	}
	if o.FS == nil {
		o.FS = OSFS{}
	}
	if strings.HasSuffix(filepath.Clean(o.SaveDir), weights.PartialSuffix) {
		return errors.WithHint(errors.Newf("--save-dir %s ends in %s, which marks unfinished conversions", o.SaveDir, weights.PartialSuffix),
			"choose another output name")
	}
	return nil
}

// checkTarget refuses an existing output without force, and anything at the partial path that the
// converter did not write.
func checkTarget(out, partial string, force bool) error {
	if st, err := os.Stat(out); err == nil {
		if !st.IsDir() {
			return errors.WithHint(errors.Newf("--save-dir %s exists and is not a directory", out), "choose another output path")
		}
		if !force {
			return errors.WithHint(errors.Newf("--save-dir %s already exists", out),
				"pass --force to replace it (the old directory stays until the new one is complete), or choose another --save-dir")
		}
	} else if !os.IsNotExist(err) {
		return errors.Wrapf(err, "stat %s", out)
	}
	ents, err := os.ReadDir(partial)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return errors.WithHint(errors.Wrapf(err, "%s exists", partial), "remove it; it is where an interrupted conversion leaves its files")
	}
	for _, e := range ents {
		if !ownFile(e.Name()) || !e.Type().IsRegular() {
			return errors.WithHint(errors.Newf("%s holds %q, which tilert convert did not write", partial, e.Name()),
				"the .partial directory belongs to tilert convert; move your files elsewhere or remove it")
		}
	}
	slog.Warn("convert: removing the output of an interrupted conversion", "dir", partial)
	return nil
}

func ownFile(name string) bool {
	if name == weights.ManifestFile || strings.HasPrefix(name, "model-") && strings.HasSuffix(name, ".safetensors") {
		return true
	}
	for _, f := range copiedFiles {
		if name == f {
			return true
		}
	}
	return false
}

// publish moves the complete partial directory to out. With force and an existing out, the two
// are swapped atomically (renameat2 RENAME_EXCHANGE) and the old one removed; where the
// filesystem cannot swap, out is first renamed aside, so a crash in between leaves either the old
// or the new complete directory, never a mix.
func publish(fs FS, partial, out string, force bool) error {
	parent := filepath.Dir(out)
	_, statErr := os.Stat(out)
	switch {
	case os.IsNotExist(statErr):
		if err := fs.Rename(partial, out); err != nil {
			return errors.Wrapf(err, "rename %s to %s", partial, out)
		}
	case statErr != nil:
		return errors.Wrapf(statErr, "stat %s", out)
	case !force:
		return errors.WithHint(errors.Newf("--save-dir %s appeared while converting", out), "pass --force to replace it")
	default:
		err := fs.Exchange(partial, out)
		if errors.Is(err, errors.ErrUnsupported) {
			old := fmt.Sprintf("%s.old-%d", out, os.Getpid())
			if err := fs.Rename(out, old); err != nil {
				return errors.Wrapf(err, "move the old %s aside", out)
			}
			if err := fs.Rename(partial, out); err != nil {
				return errors.Wrapf(err, "rename %s to %s (the previous output is at %s)", partial, out, old)
			}
			err = fs.RemoveAll(old)
			if err != nil {
				slog.Warn("convert: could not remove the replaced output", "dir", old, "err", err)
			}
			return fs.SyncDir(parent)
		}
		if err != nil {
			return errors.Wrapf(err, "swap %s into %s", partial, out)
		}
		// partial now holds the replaced directory.
		if err := fs.SyncDir(parent); err != nil {
			return errors.Wrapf(err, "fsync %s", parent)
		}
		if err := fs.RemoveAll(partial); err != nil {
			slog.Warn("convert: could not remove the replaced output", "dir", partial, "err", err)
		}
		return nil
	}
	if err := fs.SyncDir(parent); err != nil {
		return errors.Wrapf(err, "fsync %s", parent)
	}
	return nil
}

func writeSmall(fs FS, path string, data []byte) error {
	f, err := fs.Create(path)
	if err != nil {
		return errors.WithHint(errors.Wrapf(err, "create %s", path), "check free disk space and permissions")
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return errors.WithHint(errors.Wrapf(err, "write %s", path), "check free disk space")
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return errors.Wrapf(err, "fsync %s", path)
	}
	return errors.Wrapf(f.Close(), "close %s", path)
}

func copyFiles(fs FS, from, to string) ([]weights.FileInfo, error) {
	var out []weights.FileInfo
	for _, name := range copiedFiles {
		data, err := os.ReadFile(filepath.Join(from, name))
		if os.IsNotExist(err) && name != "config.json" {
			continue
		}
		if err != nil {
			return nil, errors.Wrapf(err, "read %s", filepath.Join(from, name))
		}
		if err := writeSmall(fs, filepath.Join(to, name), data); err != nil {
			return nil, err
		}
		out = append(out, weights.FileInfo{Name: name, Bytes: int64(len(data)), CRC32C: weights.CRCHex(crc32.Checksum(data, weights.Castagnoli))})
	}
	return out, nil
}

func writeManifest(fs FS, dir string, m *weights.Manifest) error {
	data, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return errors.Wrap(err, "encode manifest")
	}
	return writeSmall(fs, filepath.Join(dir, weights.ManifestFile), append(data, '\n'))
}

// logUnused reports checkpoint tensors the conversion leaves out (the MTP layers without
// --append-mtp, or tensors this model does not use).
func logUnused(ck *safetensors.Checkpoint, ts []outTensor) {
	used := map[string]bool{}
	for i := range ts {
		for _, s := range ts[i].segs {
			if s.src != nil {
				used[s.src.name] = true
			}
		}
	}
	var left []string
	for _, n := range ck.Names() {
		if !used[n] && !(model.IsScaleName(n) && used[strings.TrimSuffix(n, model.ScaleSuffix)+".weight"]) {
			left = append(left, n)
		}
	}
	if len(left) > 0 {
		slog.Info("convert: checkpoint tensors not converted", "count", len(left), "first", left[0])
	}
}
