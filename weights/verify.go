package weights

import (
	"encoding/json"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/safetensors"
)

// VerifyOptions select how deep Verify looks.
type VerifyOptions struct {
	// Checksums reads every tensor and compares its CRC-32C with the manifest. Without it Verify
	// checks structure only: manifest, completeness against the config, shard sizes and headers.
	Checksums bool
}

// Verify checks a converted directory completely: the manifest, that every tensor the model needs
// is present with its layout, the shard files and their headers, and every tensor's checksum.
// The error names the file and tensor at fault. Decode loaders run it before serving.
func Verify(dir string) error {
	_, _, err := check(dir, VerifyOptions{Checksums: true})
	return err
}

// VerifyWith is Verify with options (a structural check skips reading the tensors).
func VerifyWith(dir string, o VerifyOptions) error {
	_, _, err := check(dir, o)
	return err
}

var hintReconvert = "re-run tilert convert for this directory (with --force to replace it)"

// ReadManifest reads and parses dir's manifest without checking the directory further.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, errors.WithHint(errors.Newf("%s is not a TileRT weights directory: %s is missing", dir, ManifestFile),
			"the manifest is written last, so a conversion that did not finish has none; "+hintReconvert)
	}
	if err != nil {
		return nil, errors.Wrapf(err, "read %s", path)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "parse %s", path), hintReconvert)
	}
	if m.Format != FormatName {
		return nil, errors.WithHint(errors.Newf("%s: format %q, want %q", path, m.Format, FormatName), "point at a directory written by tilert convert")
	}
	if m.LayoutVersion != LayoutVersion {
		return nil, errors.WithHint(errors.Newf("%s: layout version %d, this build reads version %d", path, m.LayoutVersion, LayoutVersion),
			"convert the checkpoint again with this build's tilert convert")
	}
	return &m, nil
}

// check verifies dir and returns its manifest and model config (NumNextNLayers reflects the MTP
// layers actually stored).
func check(dir string, o VerifyOptions) (*Manifest, *model.Config, error) {
	clean := filepath.Clean(dir)
	if strings.HasSuffix(clean, PartialSuffix) {
		return nil, nil, errors.WithHint(errors.Newf("%s is an unfinished conversion (its name ends in %s)", dir, PartialSuffix),
			"an interrupted tilert convert leaves this directory behind; "+hintReconvert)
	}
	if st, err := os.Stat(dir); err != nil {
		return nil, nil, errors.WithHint(errors.Wrapf(err, "converted weights %s", dir), "pass the --save-dir of a finished tilert convert")
	} else if !st.IsDir() {
		return nil, nil, errors.Newf("converted weights %s is not a directory", dir)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, nil, err
	}
	mpath := filepath.Join(dir, ManifestFile)
	cfg, err := model.ParseConfig(m.HFConfig)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "%s: hf_config", mpath)
	}
	if cfg.Family != m.ModelType {
		return nil, nil, errors.Newf("%s: model_type %q but hf_config is %q", mpath, m.ModelType, cfg.Family)
	}
	if m.MTPLayers != 0 && m.MTPLayers != cfg.NumNextNLayers {
		return nil, nil, errors.Newf("%s: mtp_layers %d, the config has %d", mpath, m.MTPLayers, cfg.NumNextNLayers)
	}
	if m.MTPLayers == 0 {
		cfg.NumNextNLayers = 0
	}
	if err := checkEntries(mpath, m, cfg); err != nil {
		return nil, nil, errors.WithHint(err, hintReconvert)
	}
	if err := checkShards(dir, m); err != nil {
		return nil, nil, errors.WithHint(err, hintReconvert)
	}
	if err := checkFiles(dir, m); err != nil {
		return nil, nil, errors.WithHint(err, hintReconvert)
	}
	if o.Checksums {
		if err := checkSums(dir, m); err != nil {
			return nil, nil, errors.WithHint(err, hintReconvert)
		}
	}
	return m, cfg, nil
}

// checkEntries compares the manifest's tensors with the layout the config implies.
func checkEntries(mpath string, m *Manifest, cfg *model.Config) error {
	byName := make(map[string]*Entry, len(m.Tensors))
	var total int64
	for i := range m.Tensors {
		e := &m.Tensors[i]
		if _, dup := byName[e.Name]; dup {
			return errors.Newf("%s: tensor %q listed twice", mpath, e.Name)
		}
		byName[e.Name] = e
		dt := safetensors.DType(e.DType)
		want := int64(dt.Size())
		for _, d := range e.Shape {
			want *= d
		}
		if !dt.Valid() || e.Bytes != want || e.Bytes < 0 {
			return errors.Newf("%s: tensor %q: %d bytes for %s %v", mpath, e.Name, e.Bytes, e.DType, e.Shape)
		}
		total += e.Bytes
	}
	if total != m.TotalBytes {
		return errors.Newf("%s: tensors hold %d bytes, total_bytes says %d", mpath, total, m.TotalBytes)
	}
	logs, err := Plan(cfg, m.Devices, m.MTPLayers > 0)
	if err != nil {
		return errors.Wrapf(err, "%s", mpath)
	}
	seen := make(map[string]bool, len(m.Tensors))
	for i := range logs {
		g := &logs[i]
		e, ok := byName[g.Name]
		if !ok {
			return errors.Newf("%s: tensor %q is missing (the model needs it)", mpath, g.Name)
		}
		seen[g.Name] = true
		kind := g.Kind
		fp8 := e.DType == string(safetensors.F8E4M3)
		if fp8 && kind == KindPlain {
			kind = KindFP8Block
		}
		if e.Kind != kind || !slices.Equal(e.Shape, g.Shape) || e.Device != g.Device {
			return errors.Newf("%s: tensor %q is %s %v on device %d, want %s %v on device %d",
				mpath, g.Name, e.Kind, e.Shape, e.Device, kind, g.Shape, g.Device)
		}
		if !fp8 {
			if e.Scale != "" {
				return errors.Newf("%s: tensor %q is %s but names a scale tensor", mpath, g.Name, e.DType)
			}
			continue
		}
		sn := ScaleNameOf(g.Name)
		s, ok := byName[sn]
		if e.Scale != sn || !ok {
			return errors.Newf("%s: fp8 tensor %q has no scale tensor %q", mpath, g.Name, sn)
		}
		seen[sn] = true
		if s.Kind != g.ScaleKind() || s.DType != string(safetensors.F32) || !slices.Equal(s.Shape, g.ScaleShape()) || s.Device != g.Device {
			return errors.Newf("%s: scale tensor %q is %s %s %v, want %s F32 %v", mpath, sn, s.Kind, s.DType, s.Shape, g.ScaleKind(), g.ScaleShape())
		}
	}
	for _, e := range m.Tensors {
		if !seen[e.Name] {
			return errors.Newf("%s: tensor %q is not part of the %s layout", mpath, e.Name, cfg.Family)
		}
	}
	return nil
}

func checkShards(dir string, m *Manifest) error {
	inShard := map[string][]*Entry{}
	for i := range m.Tensors {
		e := &m.Tensors[i]
		inShard[e.Shard] = append(inShard[e.Shard], e)
	}
	listed := map[string]bool{}
	for _, s := range m.Shards {
		if s.File != filepath.Base(s.File) || strings.HasPrefix(s.File, ".") {
			return errors.Newf("manifest: shard %q is not a plain file name", s.File)
		}
		listed[s.File] = true
		path := filepath.Join(dir, s.File)
		es := inShard[s.File]
		st, err := os.Stat(path)
		if err != nil {
			name := ""
			if len(es) > 0 {
				name = es[0].Name
			}
			return errors.Wrapf(err, "shard %s (holding tensor %q and %d more) is missing", path, name, max(len(es)-1, 0))
		}
		if st.Size() != s.Bytes {
			return errors.Newf("shard %s has %d bytes, the manifest says %d (truncated or replaced)", path, st.Size(), s.Bytes)
		}
		f, err := safetensors.Open(path)
		if err != nil {
			return err
		}
		infos := f.Tensors()
		off := f.DataOffset()
		f.Close()
		if len(infos) != len(es) || len(es) != s.Tensors {
			return errors.Newf("shard %s holds %d tensors, the manifest lists %d", path, len(infos), len(es))
		}
		hdr := make(map[string]safetensors.TensorInfo, len(infos))
		for _, t := range infos {
			hdr[t.Name] = t
		}
		for _, e := range es {
			t, ok := hdr[e.Name]
			if !ok {
				return errors.Newf("shard %s: tensor %q is missing", path, e.Name)
			}
			if string(t.DType) != e.DType || !slices.Equal(t.Shape, e.Shape) || off+t.Begin != e.Offset || t.End-t.Begin != e.Bytes {
				return errors.Newf("shard %s: tensor %q is %s %v at %d, the manifest says %s %v at %d",
					path, e.Name, t.DType, t.Shape, off+t.Begin, e.DType, e.Shape, e.Offset)
			}
		}
	}
	for name, es := range inShard {
		if !listed[name] {
			return errors.Newf("manifest: tensor %q is in shard %q, which is not listed", es[0].Name, name)
		}
	}
	return nil
}

func checkFiles(dir string, m *Manifest) error {
	for _, fi := range m.Files {
		if fi.Name != filepath.Base(fi.Name) || strings.HasPrefix(fi.Name, ".") {
			return errors.Newf("manifest: file %q is not a plain file name", fi.Name)
		}
		path := filepath.Join(dir, fi.Name)
		data, err := os.ReadFile(path)
		if err != nil {
			return errors.Wrapf(err, "read %s", path)
		}
		if int64(len(data)) != fi.Bytes || CRCHex(crc32.Checksum(data, Castagnoli)) != fi.CRC32C {
			return errors.Newf("%s does not match its checksum in the manifest (changed after conversion)", path)
		}
	}
	return nil
}

// checkSums reads every tensor (several at once) and compares its CRC-32C; the error reported is
// the one of the first bad tensor in manifest order.
func checkSums(dir string, m *Manifest) error {
	var (
		mu    sync.Mutex
		files = map[string]*os.File{}
		errs  = make([]error, len(m.Tensors))
		next  atomic.Int64
		bad   atomic.Bool
		wg    sync.WaitGroup
	)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	open := func(path string) (*os.File, error) {
		mu.Lock()
		defer mu.Unlock()
		if f := files[path]; f != nil {
			return f, nil
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, errors.Wrapf(err, "open %s", path)
		}
		files[path] = f
		return f, nil
	}
	for range min(runtime.GOMAXPROCS(0), 4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 8<<20)
			for !bad.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(m.Tensors) {
					return
				}
				if errs[i] = checkSum(dir, &m.Tensors[i], open, buf); errs[i] != nil {
					bad.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func checkSum(dir string, e *Entry, open func(string) (*os.File, error), buf []byte) error {
	path := filepath.Join(dir, e.Shard)
	f, err := open(path)
	if err != nil {
		return err
	}
	var crc uint32
	for off := int64(0); off < e.Bytes; {
		n := min(int64(len(buf)), e.Bytes-off)
		if _, err := f.ReadAt(buf[:n], e.Offset+off); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("unexpected end of file")
			}
			return errors.Wrapf(err, "read %s: tensor %q", path, e.Name)
		}
		crc = crc32.Update(crc, Castagnoli, buf[:n])
		off += n
	}
	if got := CRCHex(crc); got != e.CRC32C {
		return errors.Newf("%s: tensor %q has checksum %s, the manifest says %s (the data is corrupt)", path, e.Name, got, e.CRC32C)
	}
	return nil
}
