package safetensors

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
)

// IndexFile is the name of the shard index HF sharded checkpoints carry.
const IndexFile = "model.safetensors.index.json"

// Index is the content of model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any    `json:"metadata,omitempty"`
	WeightMap map[string]string `json:"weight_map"`
}

// ReadIndex reads dir/model.safetensors.index.json.
func ReadIndex(dir string) (*Index, error) {
	path := filepath.Join(dir, IndexFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "safetensors: read %s", path),
			"a sharded checkpoint needs its index file")
	}
	var idx Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, errors.WithHint(errors.Wrapf(err, "safetensors: parse %s", path),
			"the index must be a JSON object with a weight_map of tensor name -> shard file")
	}
	if idx.WeightMap == nil {
		return nil, errors.WithHint(errors.Newf("safetensors: %s has no weight_map", path),
			"the index must be a JSON object with a weight_map of tensor name -> shard file")
	}
	return &idx, nil
}

// Checkpoint is a directory of safetensors files seen as one set of tensors.
type Checkpoint struct {
	dir   string
	files []*File
	where map[string]*File
	names []string
}

// OpenDir opens a checkpoint directory: the shards named by
// model.safetensors.index.json if present, else model.safetensors, else
// every *.safetensors file. Each tensor must be stored exactly once.
func OpenDir(dir string) (*Checkpoint, error) {
	c := &Checkpoint{dir: dir, where: map[string]*File{}}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err == nil {
		if err := c.openIndexed(); err != nil {
			return nil, err
		}
	} else {
		if err := c.openPlain(); err != nil {
			return nil, err
		}
	}
	for n := range c.where {
		c.names = append(c.names, n)
	}
	slices.Sort(c.names)
	ok = true
	return c, nil
}

func (c *Checkpoint) openIndexed() error {
	idx, err := ReadIndex(c.dir)
	if err != nil {
		return err
	}
	indexPath := filepath.Join(c.dir, IndexFile)
	// Group tensors by shard so each shard is opened once and a missing shard
	// error can name a tensor that needs it.
	byShard := map[string][]string{}
	for name, shard := range idx.WeightMap {
		byShard[shard] = append(byShard[shard], name)
	}
	shards := make([]string, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	for _, shard := range shards {
		names := byShard[shard]
		slices.Sort(names)
		if shard == "" || filepath.IsAbs(shard) || shard != filepath.Base(shard) || strings.HasPrefix(shard, ".") {
			return errors.WithHint(
				errors.Newf("safetensors: %s: tensor %q maps to shard %q outside the checkpoint directory",
					indexPath, names[0], shard),
				"weight_map values must be plain file names in the same directory")
		}
		path := filepath.Join(c.dir, shard)
		if _, err := os.Stat(path); err != nil {
			return errors.WithHint(
				errors.Wrapf(err, "safetensors: %s: shard %s (holding tensor %q and %d more) is missing",
					indexPath, path, names[0], len(names)-1),
				"the download is incomplete; fetch every shard listed in the index")
		}
		f, err := Open(path)
		if err != nil {
			return err
		}
		c.files = append(c.files, f)
		for _, n := range names {
			if _, ok := f.Lookup(n); !ok {
				return errors.WithHint(
					errors.Newf("safetensors: %s: tensor %q is listed in %s but not stored in it",
						path, n, indexPath),
					"the index and the shards do not belong together; re-download the checkpoint")
			}
			c.where[n] = f
		}
	}
	return nil
}

func (c *Checkpoint) openPlain() error {
	var paths []string
	single := filepath.Join(c.dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		paths = []string{single}
	} else {
		m, err := filepath.Glob(filepath.Join(c.dir, "*.safetensors"))
		if err != nil {
			return errors.Wrapf(err, "safetensors: list %s", c.dir)
		}
		paths = m
	}
	if len(paths) == 0 {
		return errors.WithHint(errors.Newf("safetensors: %s holds no %s and no *.safetensors file", c.dir, IndexFile),
			"point at the checkpoint directory (the one with config.json and the shards)")
	}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			return err
		}
		c.files = append(c.files, f)
		for _, t := range f.header.Tensors {
			if prev, dup := c.where[t.Name]; dup {
				return errors.WithHint(
					errors.Newf("safetensors: tensor %q is stored in both %s and %s", t.Name, prev.Path(), p),
					"remove the stray file or add a model.safetensors.index.json")
			}
			c.where[t.Name] = f
		}
	}
	return nil
}

// Close unmaps every shard.
func (c *Checkpoint) Close() error {
	var errs error
	for _, f := range c.files {
		errs = errors.CombineErrors(errs, f.Close())
	}
	c.files = nil
	return errs
}

// Dir is the checkpoint directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Files lists the open shards (index order, or file name order).
func (c *Checkpoint) Files() []*File { return slices.Clone(c.files) }

// Names lists every tensor name, sorted.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Lookup finds a tensor and the shard holding it.
func (c *Checkpoint) Lookup(name string) (TensorInfo, *File, bool) {
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, nil, false
	}
	t, _ := f.Lookup(name)
	return t, f, true
}

// Data is a zero-copy view of a tensor's bytes, valid until Close.
func (c *Checkpoint) Data(name string) ([]byte, error) {
	f, ok := c.where[name]
	if !ok {
		return nil, errors.WithHint(errors.Newf("safetensors: checkpoint %s has no tensor %q", c.dir, name),
			"the checkpoint does not match the model config, or the name is misspelt")
	}
	return f.Data(name)
}
