package engine

import (
	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/model"
)

// Resolve applies opts' defaults for cfg (mode defMode when unset, one
// slot, 4096 positions capped at the model's max_position_embeddings) and
// checks them; it returns the resolved options, the slot layout and the
// positions a slot holds. Every backend starts here, so they agree.
func Resolve(cfg *model.Config, opts Options, defMode Mode) (Options, Layout, int, error) {
	if opts.Mode == "" {
		opts.Mode = defMode
	}
	if _, err := ParseMode(string(opts.Mode)); err != nil {
		return opts, Layout{}, 0, err
	}
	dt, err := ParseCacheDType(string(opts.MLACache))
	if err != nil {
		return opts, Layout{}, 0, err
	}
	opts.MLACache = dt
	pp, err := ParsePrefillPrecision(string(opts.Prefill))
	if err != nil {
		return opts, Layout{}, 0, err
	}
	opts.Prefill = pp
	if opts.Slots <= 0 {
		opts.Slots = 1
	}
	if opts.MaxSeqLen <= 0 {
		opts.MaxSeqLen = 4096
	}
	if cfg.MaxPositionEmbeddings > 0 && opts.MaxSeqLen > cfg.MaxPositionEmbeddings {
		opts.MaxSeqLen = cfg.MaxPositionEmbeddings
	}
	if opts.MTP && cfg.NumNextNLayers < 1 {
		return opts, Layout{}, 0, errors.WithHint(errors.New("MTP requested but the model has no MTP layer (num_nextn_predict_layers = 0)"),
			"run without --mtp")
	}
	lay, err := NewLayout(opts.MLACache, cfg.KVLoraRank, cfg.QKRopeHeadDim, cfg.IndexHeadDim, opts.MaxSeqLen, IndexerLayers(cfg))
	if err != nil {
		return opts, Layout{}, 0, err
	}
	return opts, lay, min(lay.MaxPages*BlockSize, opts.MaxSeqLen), nil
}

// IndexerLayers says, per layer (the MTP layer last), whether it has its
// own indexer.
func IndexerLayers(cfg *model.Config) []bool {
	has := make([]bool, cfg.NumAllLayers())
	for i := range has {
		has[i] = cfg.HasIndexer(i)
	}
	return has
}

// NewBookFor is NewBook with the config Resolve's results and cfg give.
func NewBookFor(be Backend, cfg *model.Config, opts Options, lay Layout, maxSeq, prefillRows int) *Book {
	return NewBook(be, BookConfig{Options: opts, Layout: lay, MaxSeq: maxSeq, VocabSize: cfg.VocabSize,
		HasMTP: cfg.NumNextNLayers > 0, PrefillRows: prefillRows})
}
