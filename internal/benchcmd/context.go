package benchcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/cuda/cupti"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/internal/buildinfo"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/model"
)

// Context mode (--context): each slot gets a cache of C positions imported
// through the engine's hand-off path (Import, as a prefill node would ship
// it; random but valid fp8_ds_mla and indexer entries) instead of a prefill,
// so contexts up to 128K cost seconds, and each row is held against the byte
// floor of a step measured on the same device.

// ContextRow is one context length of a context-mode run.
type ContextRow struct {
	Context      int              `json:"context"`
	Slots        int              `json:"slots"`
	Steps        int              `json:"steps"`
	StepP50MS    float64          `json:"step_p50_ms"`
	StepP90MS    float64          `json:"step_p90_ms"`
	TokensPerSec float64          `json:"tokens_per_second"`
	FloorBytes   int64            `json:"floor_bytes"`
	CacheBytes   int64            `json:"floor_cache_bytes"`
	FloorMS      float64          `json:"floor_ms"`
	GBps         float64          `json:"floor_gb_per_s"` // floor bytes / step p50
	Efficiency   float64          `json:"efficiency"`     // floor / step p50
	UsPerLayer   float64          `json:"us_per_layer"`   // step p50 / layers
	Profile      *gpu.StepProfile `json:"profile,omitempty"`
	// Host is the host's share of the timed steps (per step, --profile on
	// the unsharded GPU engine): recording the calls, the meta upload,
	// launching the graph, waiting for the token.
	Host *HostPerStep `json:"host_per_step,omitempty"`
	// With --mtp: tokens a slot got per timed step (1 + accepted drafts)
	// and the draft acceptance over those steps. A step verifies one draft
	// per slot (two rows through the main layers) and drafts the next.
	MTP           bool    `json:"mtp,omitempty"`
	TokensPerStep float64 `json:"tokens_per_step,omitempty"`
	AcceptRate    float64 `json:"mtp_accept_rate,omitempty"`
	// Tensor parallel (--devices with several ranks): what rank 0 (it runs
	// the indexer) must read per step: its heads, its slice of every
	// expert and of the vocabulary, the replicated parts, the caches.
	RankFloorBytes int64   `json:"rank_floor_bytes,omitempty"`
	RankFloorMS    float64 `json:"rank_floor_ms,omitempty"`
	// The routed experts one probed step's rows touched (the unsharded GPU
	// engine's routing probe: a step after the graph captures, not timed),
	// the mean over the main MoE layers, against uniform routing's
	// expectation; the floor and efficiency on the touched experts.
	TouchedExperts    float64 `json:"touched_experts_per_layer,omitempty"`
	UniformExperts    float64 `json:"uniform_experts_per_layer,omitempty"`
	TouchedFloorBytes int64   `json:"touched_floor_bytes,omitempty"`
	TouchedFloorMS    float64 `json:"touched_floor_ms,omitempty"`
	TouchedEfficiency float64 `json:"touched_efficiency,omitempty"`
}

// routingProber is an engine that hands back a step's routing
// (engine/gpu's routing probe).
type routingProber interface {
	SetRoutingProbe(on bool) error
	RoutedLayers() []gpu.RoutedLayer
}

// touchedExperts counts each layer's distinct routed experts in a probed
// step's routing.
func touchedExperts(layers []gpu.RoutedLayer) map[int]int {
	seen := map[int]map[int32]bool{}
	for _, l := range layers {
		if seen[l.Layer] == nil {
			seen[l.Layer] = map[int32]bool{}
		}
		for _, id := range l.IDs {
			seen[l.Layer][id] = true
		}
	}
	out := make(map[int]int, len(seen))
	for l, s := range seen {
		out[l] = len(s)
	}
	return out
}

// touchedFloor fills row's touched-expert fields from a probed step's
// distinct experts by layer: rows and mtpRows rows through the main layers
// and the MTP layer, each distinct row copies times.
func touchedFloor(row *ContextRow, cfg *model.Config, touched map[int]int, rows, mtpRows, copies int, copyGBps float64) {
	var sum, n float64
	for l, d := range touched {
		if l < cfg.NumLayers {
			sum, n = sum+float64(d), n+1
		}
	}
	if n == 0 {
		return
	}
	row.TouchedExperts, row.UniformExperts = sum/n, uniformExperts(cfg, rows/copies)
	row.TouchedFloorBytes = weightFloorWith(cfg, rows, mtpRows, copies, func(layer, r int) float64 {
		if d, ok := touched[layer]; ok {
			return float64(d)
		}
		return uniformExperts(cfg, r)
	}) + row.CacheBytes
	if copyGBps > 0 && row.StepP50MS > 0 {
		row.TouchedFloorMS = float64(row.TouchedFloorBytes) / (copyGBps * 1e9) * 1e3
		row.TouchedEfficiency = row.TouchedFloorMS / row.StepP50MS
	}
}

// ContextResult is a context-mode run.
type ContextResult struct {
	Version     string  `json:"version"`
	Device      string  `json:"device"`
	Model       string  `json:"model"`
	Weights     string  `json:"weights"`
	Layers      int     `json:"layers"`
	MoELayers   int     `json:"moe_layers"`
	Slots       []int   `json:"slots"`
	Tokens      int     `json:"tokens_per_slot"`
	Sampling    string  `json:"sampling"` // greedy, or the --temperature ... flags
	CopyGBps    float64 `json:"copy_gb_per_s"`
	WeightBytes int64   `json:"floor_weight_bytes"`
	LoadSeconds float64 `json:"load_seconds"`
	// SameRows: every slot the same state and first token (--same-rows),
	// so a batch's rows hit the same experts.
	SameRows bool `json:"same_rows,omitempty"`
	// OneState: every slot the same synthetic state, first tokens apart
	// (--one-state; each slot its own state otherwise).
	OneState bool `json:"one_state,omitempty"`
	// Tensor parallel: the GPU of each rank, the collective, and whether
	// ranks share a GPU (then a step is the sum of their work).
	Devices      []int        `json:"devices,omitempty"`
	Comm         string       `json:"comm,omitempty"`
	SharedDevice bool         `json:"ranks_share_a_device,omitempty"`
	Note         string       `json:"note,omitempty"`
	Rows         []ContextRow `json:"contexts"`
}

func parseContexts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, cliutil.WithExitCode(errors.WithHint(errors.Newf("--context %q: %q is not a positive length", s, f),
				"e.g. --context 1024,8192,32768,131072"), cliutil.ExitUsage)
		}
		out = append(out, n)
	}
	return out, nil
}

// weightFloorBytes is what one step must read of the weights for slots rows
// (checkpoint bytes: fp8 with its scales, bf16, f32): every tensor of the
// main layers, the embedding rows used, and of each MoE layer's routed
// experts the expected number of distinct ones hit by slots rows of
// top-k picks among E (all of them for one row).
func weightFloorBytes(c *model.Config, slots int) int64 { return weightFloorBytesMTP(c, slots, 0, 1) }

// weightFloorBytesMTP is weightFloorBytes for rows rows through the main
// layers plus mtpRows rows through the MTP layer (0: not run), where each
// distinct row comes copies times (--same-rows: as many as the slots; 1
// otherwise): the copies of a row read its embedding row and hit its
// experts once.
func weightFloorBytesMTP(c *model.Config, rows, mtpRows, copies int) int64 {
	return weightFloorWith(c, rows, mtpRows, copies, func(_, rows int) float64 { return uniformExperts(c, rows) })
}

// uniformExperts is the expected number of distinct routed experts rows
// rows of top-k picks among E hit when each row picks uniformly (all k of
// them for one row).
func uniformExperts(c *model.Config, rows int) float64 {
	E, K := c.NRoutedExperts, c.NumExpertsPerTok
	if E > 0 && rows > 1 {
		return float64(E) * (1 - math.Pow(1-float64(K)/float64(E), float64(rows)))
	}
	return float64(K)
}

// weightFloorWith is weightFloorBytesMTP with distinct(layer, rows) routed
// experts read by a MoE layer's rows (the distinct rows, copies apart).
func weightFloorWith(c *model.Config, rows, mtpRows, copies int, distinct func(layer, rows int) float64) int64 {
	rows, mtpRows = rows/copies, mtpRows/copies
	var total float64
	E := c.NRoutedExperts
	for _, s := range model.Specs(c) {
		n := int64(1)
		for _, d := range s.Shape {
			n *= int64(d)
		}
		var b int64
		switch {
		case s.Quantized(c):
			sc := model.ScaleShape(s.Shape)
			b = n + 4*int64(sc[0]*sc[1])
		case s.Storage == model.StoreF32:
			b = 4 * n
		default:
			b = 2 * n
		}
		layer, expert := specLayer(s.Name)
		r := rows
		if layer >= c.NumLayers {
			r = mtpRows // the MTP layer
		}
		switch {
		case r == 0:
		case s.Name == model.EmbedTokensName:
			total += float64(b) / float64(s.Shape[0]) * float64(rows)
		case strings.HasSuffix(s.Name, ".embed_tokens.weight"): // the MTP layer's own table
			total += float64(b) / float64(s.Shape[0]) * float64(r)
		case expert:
			total += float64(b) * distinct(layer, r) / float64(E)
		default:
			total += float64(b)
		}
	}
	return int64(total)
}

// specLayer returns the block index of a tensor name (-1 outside blocks)
// and whether it is a routed expert's.
func specLayer(name string) (int, bool) {
	const p = "model.layers."
	if !strings.HasPrefix(name, p) {
		return -1, false
	}
	rest := name[len(p):]
	i := strings.IndexByte(rest, '.')
	n, err := strconv.Atoi(rest[:i])
	if err != nil {
		return -1, false
	}
	return n, strings.Contains(rest, ".mlp.experts.")
}

// cacheFloorBytes is what one step must read of one slot's caches at
// context C: per layer the selected MLA entries (min(C, index_topk)) and,
// where the layer has its own indexer, every key of the context.
func cacheFloorBytes(c *model.Config, lay engine.Layout, C int) int64 {
	return cacheFloorBytesMTP(c, lay, C, false)
}

// cacheFloorBytesMTP is cacheFloorBytes for an MTP step (mtp set): two rows
// through the main layers, each attending over its own selection (the
// indexer keys are read once), and one through the MTP layer.
func cacheFloorBytesMTP(c *model.Config, lay engine.Layout, C int, mtp bool) int64 {
	var b int64
	rows, layers := int64(1), c.NumLayers
	if mtp {
		rows, layers = 2, c.NumLayers+c.NumNextNLayers
	}
	for l := 0; l < layers; l++ {
		r := rows
		if l >= c.NumLayers {
			r = 1
		}
		b += r * int64(min(C, c.IndexTopK)) * int64(lay.MLATokenBytes)
		if c.HasIndexer(l) {
			b += int64(C) * int64(lay.IndexerPageBytes) / engine.BlockSize
		}
	}
	return b
}

// syntheticState is a slot state of C positions in the exchange layout:
// 64 random token entries (valid fp8, scales as the encoders make them)
// repeated over every used page of every region.
func syntheticState(lay engine.Layout, C int, r *rand.Rand) []engine.Segment {
	R, P, D := lay.KVLoraRank, lay.RopeDim, lay.IndexHeadDim
	mlaPage := make([]byte, engine.BlockSize*lay.MLATokenBytes)
	idxPage := make([]byte, lay.IndexerPageBytes)
	lat, rope, key := make([]float32, R), make([]float32, P), make([]float32, D)
	for t := range engine.BlockSize {
		for i := range lat {
			lat[i] = float32(r.NormFloat64())
		}
		for i := range rope {
			rope[i] = float32(r.NormFloat64())
		}
		for i := range key {
			key[i] = float32(r.NormFloat64())
		}
		dst := mlaPage[t*lay.MLATokenBytes : (t+1)*lay.MLATokenBytes]
		if lay.MLACache == engine.CacheBF16 {
			engine.EncodeMLABF16(dst, lat, rope)
		} else {
			engine.EncodeMLAFP8(dst, lat, rope)
		}
		engine.EncodeIndexerKey(idxPage, t, key)
	}
	pages := (C + engine.BlockSize - 1) / engine.BlockSize
	fill := func(page []byte) []byte {
		b := make([]byte, pages*len(page))
		for p := range pages {
			copy(b[p*len(page):], page)
		}
		return b
	}
	mla, idx := fill(mlaPage), fill(idxPage)
	segs := make([]engine.Segment, 0, len(lay.Regions))
	for _, rg := range lay.Regions {
		d := mla
		if rg.Kind == engine.RegionIndexer {
			d = idx
		}
		segs = append(segs, engine.Segment{Offset: rg.Offset, Data: d})
	}
	return segs
}

// rankConfig is rank 0's shard of cfg as the floor counts it: its heads,
// its columns of the dense MLP and of every expert, its vocabulary rows;
// everything else (q_a, kv_a, norms, router, indexer: rank 0 runs it)
// whole.
func rankConfig(cfg *model.Config, se *gpu.ShardEngine) *model.Config {
	heads, inter, moe, vocab := se.Plan(0)
	return sliceConfig(cfg, heads, inter, moe, vocab)
}

// sliceConfig is cfg cut to a rank's ranges ([lo, hi) of heads, dense and
// expert intermediate columns, vocabulary rows).
func sliceConfig(cfg *model.Config, heads, inter, moe, vocab [2]int) *model.Config {
	rc := *cfg
	rc.NumHeads = heads[1] - heads[0]
	rc.IntermediateSize = inter[1] - inter[0]
	rc.MoEIntermediateSize = moe[1] - moe[0]
	rc.VocabSize = vocab[1] - vocab[0]
	return &rc
}

// profiler is the GPU engine's per-call breakdown of a step.
type profiler interface {
	ProfileStep(ids []int, reps int) (*gpu.StepProfile, error)
	HostTimes() gpu.HostTimes
}

// HostPerStep is gpu.HostTimes averaged over the timed steps, in us.
type HostPerStep struct {
	RecordUs float64 `json:"record_us"`
	UploadUs float64 `json:"upload_us"`
	LaunchUs float64 `json:"launch_us"`
	WaitUs   float64 `json:"wait_us"`
	Steps    int     `json:"steps"`
	// The runs a step through the graph cache: replayed, captured, run
	// directly (gpu.HostTimes).
	Replays  float64 `json:"graph_replays"`
	Captures float64 `json:"graph_captures"`
	Eager    float64 `json:"eager_runs"`
}

// hostPerStep averages h over n steps.
func hostPerStep(h gpu.HostTimes, n int) *HostPerStep {
	us := func(ns int64) float64 { return float64(ns) / 1e3 / float64(n) }
	per := func(k int) float64 { return float64(k) / float64(n) }
	return &HostPerStep{RecordUs: us(h.RecordNs), UploadUs: us(h.UploadNs), LaunchUs: us(h.LaunchNs), WaitUs: us(h.WaitNs), Steps: n,
		Replays: per(h.Replays), Captures: per(h.Captures), Eager: per(h.Eager)}
}

func runContexts(c *cli.Context, ctxs []int) error {
	ntok := c.Int("tokens")
	batches := []int{c.Int("slots")}
	if bs := c.String("batches"); bs != "" {
		var err error
		if batches, err = parseContexts(bs); err != nil {
			return cliutil.WithExitCode(errors.WithHint(errors.Newf("--batches %q: not a list of positive slot counts", bs), "e.g. --batches 1,4"), cliutil.ExitUsage)
		}
	}
	slots := slices.Max(batches)
	if slots < 1 || ntok < 5 {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--slots must be positive and --tokens at least 5"),
			"e.g. --slots 1 --tokens 32"), cliutil.ExitUsage)
	}
	mode, err := engine.ParseMode(c.String("mode"))
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	cache, err := engine.ParseCacheDType(c.String("kv-cache-dtype"))
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	pl, err := placement(c)
	if err != nil {
		return err
	}
	// --timeline: CUPTI is found before the model loads (checkTimeline
	// has refused the uses it cannot serve).
	tlPath := c.String("timeline")
	var tlFile TimelineFile
	if tlPath != "" {
		tr, err := cupti.Open()
		if err != nil {
			return errors.Wrap(err, "--timeline")
		}
		tlFile = TimelineFile{Version: buildinfo.Version, CUPTI: tr.Path()}
	}
	maxSeq := slices.Max(ctxs) + ntok + 4
	mtp := c.Bool("mtp")
	opts := engine.Options{Mode: mode, MLACache: cache, Slots: slots, MaxSeqLen: maxSeq, MTP: mtp}
	_, how, _ := sampling(c)
	same, oneState := c.Bool("same-rows"), c.Bool("one-state")
	res := ContextResult{Version: buildinfo.Version, Slots: batches, Tokens: ntok, Sampling: how, SameRows: same, OneState: oneState && !same}
	var (
		e     engine.Engine
		cfg   *model.Config
		close func()
	)
	t0 := time.Now()
	if dm := c.String("dummy-weights"); dm != "" {
		if c.String("model-dir") != "" {
			return cliutil.WithExitCode(errors.WithHint(errors.New("--dummy-weights and --model-dir both given"),
				"pick one: real weights from a directory, or random ones of a model's dimensions"), cliutil.ExitUsage)
		}
		if cfg, err = engineload.DummyConfigMTP(dm, c.Int("layers"), mtp); err != nil {
			return cliutil.WithExitCode(err, cliutil.ExitUsage)
		}
		if len(pl.Devices) > 1 && c.Bool("one-expert-bank") {
			return cliutil.WithExitCode(errors.WithHint(errors.New("--one-expert-bank with --devices: the sharded engine keeps a bank a layer"),
				"drop --one-expert-bank, or bench one GPU (no --devices)"), cliutil.ExitUsage)
		}
		if len(pl.Devices) > 1 {
			comm, _ := gpu.ParseComm(pl.Comm)
			se, err := gpu.NewSharded(gpu.Dummy(cfg, 1), opts, gpu.ShardOptions{Devices: pl.Devices, Comm: comm})
			if err != nil {
				return err
			}
			e, close = se, func() { _ = se.Close() }
		} else {
			ge, cl, err := engineload.OpenDummy(cfg, opts, c.Bool("one-expert-bank"))
			if err != nil {
				return err
			}
			e, close = ge, cl
		}
		res.Device, res.Weights = "cuda", "dummy "+dm
		if c.Bool("one-expert-bank") {
			res.Weights += ", one expert bank"
		}
	} else {
		dir := c.String("model-dir")
		if dir == "" {
			return cliutil.WithExitCode(errors.WithHint(errors.New("bench decode --context needs --model-dir or --dummy-weights"),
				"e.g. --dummy-weights deepseek-v3.2 --layers 8"), cliutil.ExitUsage)
		}
		if err := engineload.CheckDir("--model-dir", dir); err != nil {
			return err
		}
		device, _, err := engineload.ResolveDevice(c.String("device"))
		if err != nil {
			return err
		}
		if e, cfg, close, err = engineload.OpenOn(device, dir, opts, pl); err != nil {
			return err
		}
		res.Device, res.Weights = device, dir
	}
	defer close()
	res.LoadSeconds = time.Since(t0).Seconds()
	res.Model, res.Layers = string(cfg.Family), cfg.NumLayers
	for l := range cfg.NumLayers {
		if cfg.IsMoELayer(l) {
			res.MoELayers++
		}
	}
	var rankCfg *model.Config
	if se, ok := e.(*gpu.ShardEngine); ok && se.Ranks() > 1 {
		rankCfg = rankConfig(cfg, se)
		res.Devices, res.Comm, res.SharedDevice = pl.Devices, se.Comm(), se.SharesDevice()
		if res.SharedDevice {
			res.Note = fmt.Sprintf("the %d ranks share a GPU: a step runs every rank's work one after another on it (plus the collectives), so it is about %d times what one GPU of a %d-GPU node computes; the rank floor is what each GPU of such a node reads per step before communication",
				se.Ranks(), se.Ranks(), se.Ranks())
		}
	}
	if cg, ok := e.(interface{ CopyGBps(int) (float64, error) }); ok {
		if res.CopyGBps, err = cg.CopyGBps(9); err != nil {
			return err
		}
	}
	tl, canTrace := e.(timeliner)
	if tlPath != "" && !canTrace {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--timeline needs the unsharded GPU engine"),
			"run with --device cuda and one GPU"), cliutil.ExitUsage)
	}
	tlFile.Model, tlFile.Weights = string(cfg.Family), res.Weights
	lay := e.Layout()
	rng := rand.New(rand.NewPCG(c.Uint64("seed"), 11))
	ids := make([]int, slots)
	for i := range ids {
		ids[i] = i
	}
	rp, canProbe := e.(routingProber)
	for _, C := range ctxs {
		segs := syntheticState(lay, C, rng)
		// Slot s > 0's own state (not --one-state), made once a context:
		// its own context, as distinct requests have. One state for all
		// (before session 58) had the rows share attention outputs, so more
		// of their experts than uniform routing would (4 slots timed at 115%
		// of the floor). Its own generator: slot 0's state and the tokens
		// stay those of earlier runs.
		own := map[int][]engine.Segment{}
		stateOf := func(s int) []engine.Segment {
			if s == 0 || same || oneState {
				return segs
			}
			if own[s] == nil {
				own[s] = syntheticState(lay, C, rand.New(rand.NewPCG(c.Uint64("seed"), 1000+uint64(s))))
			}
			return own[s]
		}
		for _, slots := range batches {
			p, _, _ := sampling(c)
			p.MaxTokens = ntok
			if canProbe {
				p.MaxTokens += 2 // the probed step's tokens (an MTP step may make two)
			}
			ids := ids[:slots]
			last, first := rng.IntN(cfg.VocabSize*3/4), rng.IntN(cfg.VocabSize*3/4)
			for s := range slots {
				if s > 0 && !same {
					last, first = rng.IntN(cfg.VocabSize*3/4), rng.IntN(cfg.VocabSize*3/4)
				}
				if err := e.Import(s, engine.SlotMeta{SeqLen: C, MTPLen: C, LastToken: last}, stateOf(s)); err != nil {
					return errors.Wrapf(err, "importing a %d-position state into slot %d", C, s)
				}
				if _, err := e.Start(s, first, p); err != nil {
					return err
				}
			}
			row := ContextRow{Context: C, Slots: slots}
			var tlRow *TimelineRow
			var steps []float64
			var toks, drafted, accepted []int // per step, over its slots
			active := slices.Clone(ids)
			pr, canProfile := e.(profiler)
			var touched map[int]int
			// advance checks a step's results and drops the finished slots.
			advance := func(out []engine.StepResult) error {
				for _, sr := range out {
					if same && !slices.Equal(sr.Tokens, out[0].Tokens) {
						return errors.WithHint(errors.Newf("--same-rows: at context %d, %d slots, slot %d's tokens %v parted from slot %d's %v at step %d",
							C, slots, sr.Slot, sr.Tokens, out[0].Slot, out[0].Tokens, len(steps)),
							"the engine computed the same row differently in two slots, so the floor's one set of experts does not hold; report it, and bench without --same-rows")
					}
				}
				next := active[:0]
				for _, sr := range out {
					if sr.Finish == engine.FinishNone {
						next = append(next, sr.Slot)
					}
				}
				active = next
				return nil
			}
			for len(active) > 0 {
				if canProbe && touched == nil && len(steps) == 2 && len(active) == slots {
					// One step with the routing probe, after the graph
					// captures and outside the timed steps.
					if err := rp.SetRoutingProbe(true); err != nil {
						return err
					}
					out, err := e.Step(active)
					if perr := rp.SetRoutingProbe(false); err == nil {
						err = perr
					}
					if err != nil {
						return err
					}
					touched = touchedExperts(rp.RoutedLayers())
					if err := advance(out); err != nil {
						return err
					}
					continue
				}
				if canProfile && len(steps) == 2 {
					pr.HostTimes() // the count starts after the graph captures
				}
				t := time.Now()
				out, err := e.Step(active)
				if err != nil {
					return err
				}
				steps = append(steps, float64(time.Since(t).Microseconds())/1e3)
				nt, nd, na := 0, 0, 0
				for _, sr := range out {
					nt, nd, na = nt+len(sr.Tokens), nd+sr.Drafted, na+sr.Accepted
				}
				toks, drafted, accepted = append(toks, nt), append(drafted, nd), append(accepted, na)
				if err := advance(out); err != nil {
					return err
				}
				// The timeline (like the profile below) re-runs one step's
				// work after the timed steps, then the slots are done.
				if tlPath != "" && len(active) == slots && len(steps) == traceAfter(ntok, mtp) {
					tr, err := traceRow(tl, active, C, cfg.NumLayers, cfg.NumAllLayers())
					if err != nil {
						return err
					}
					tlRow = &tr
					break
				}
				// The profile re-runs one step's work after the timed steps
				// (it steps the slots once more and rewrites their latest
				// cache entries), then the slots are done.
				if c.Bool("profile") && len(active) == slots && len(steps) == ntok-3 && canProfile {
					if n := len(steps) - 2; n > 0 {
						row.Host = hostPerStep(pr.HostTimes(), n)
					}
					if row.Profile, err = pr.ProfileStep(active, 11); err != nil {
						return err
					}
					break
				}
			}
			if canProfile && row.Host == nil && tlRow == nil && len(steps) > 2 {
				// Every GPU row: where the host's share of a step went and
				// how its runs went through the graph cache.
				row.Host = hostPerStep(pr.HostTimes(), len(steps)-2)
			}
			for s := range slots {
				e.Release(s)
			}
			row.Steps = len(steps)
			// Steady state: the first two steps capture the CUDA graphs.
			skip := 0
			if len(steps) > 4 {
				skip = 2
			}
			timed := slices.Clone(steps[skip:])
			slices.Sort(timed)
			row.StepP50MS = timed[len(timed)/2]
			row.StepP90MS = timed[len(timed)*9/10]
			row.TokensPerSec = float64(slots) / (row.StepP50MS * 1e-3)
			dup := 1 // copies of each distinct row (--same-rows)
			if same {
				dup = slots
			}
			row.CacheBytes = int64(slots) * cacheFloorBytes(cfg, lay, C)
			row.FloorBytes = weightFloorBytesMTP(cfg, slots, 0, dup) + row.CacheBytes
			if mtp {
				nt, nd, na := 0, 0, 0
				for i := skip; i < len(steps); i++ {
					nt, nd, na = nt+toks[i], nd+drafted[i], na+accepted[i]
				}
				row.MTP = true
				row.TokensPerStep = float64(nt) / float64(slots*(len(steps)-skip))
				if nd > 0 {
					row.AcceptRate = float64(na) / float64(nd)
				}
				row.TokensPerSec = row.TokensPerStep * float64(slots) / (row.StepP50MS * 1e-3)
				row.CacheBytes = int64(slots) * cacheFloorBytesMTP(cfg, lay, C, true)
				row.FloorBytes = weightFloorBytesMTP(cfg, 2*slots, slots, dup) + row.CacheBytes
			}
			if touched != nil {
				rows, mtpRows := slots, 0
				if mtp {
					rows, mtpRows = 2*slots, slots
				}
				touchedFloor(&row, cfg, touched, rows, mtpRows, dup, res.CopyGBps)
			}
			if res.CopyGBps > 0 {
				row.FloorMS = float64(row.FloorBytes) / (res.CopyGBps * 1e9) * 1e3
				row.Efficiency = row.FloorMS / row.StepP50MS
			}
			if rankCfg != nil {
				row.RankFloorBytes = weightFloorBytesMTP(rankCfg, slots, 0, dup) + row.CacheBytes
				if res.CopyGBps > 0 {
					row.RankFloorMS = float64(row.RankFloorBytes) / (res.CopyGBps * 1e9) * 1e3
				}
			}
			row.GBps = float64(row.FloorBytes) / (row.StepP50MS * 1e-3) / 1e9
			row.UsPerLayer = row.StepP50MS * 1e3 / float64(cfg.NumLayers)
			res.Rows = append(res.Rows, row)
			reportRow(c.App.Writer, res, row, len(res.Rows) == 1)
			if tlRow != nil {
				tlRow.StepP50MS = row.StepP50MS
				reportTimeline(c.App.Writer, *tlRow)
				tlFile.Rows = append(tlFile.Rows, *tlRow)
			} else if tlPath != "" {
				return errors.WithHint(errors.Newf("--timeline: the slots at context %d, %d slots finished before the step to trace", C, slots),
					"give more --tokens")
			}
		}
	}
	if tlPath != "" {
		if err := writeTimeline(tlPath, tlFile); err != nil {
			return err
		}
	}
	if f := c.String("json"); f != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(f, append(b, '\n'), 0o644); err != nil {
			return errors.Wrapf(err, "writing %s", f)
		}
	}
	return nil
}

func reportRow(w io.Writer, r ContextResult, row ContextRow, first bool) {
	if first {
		fmt.Fprintf(w, "bench decode: %s (%s), %d layers (%d MoE) on %s, %d tokens/slot, %s; copy %.0f GB/s (read+write); loaded in %.1f s\n",
			r.Model, r.Weights, r.Layers, r.MoELayers, r.Device, r.Tokens, r.Sampling, r.CopyGBps, r.LoadSeconds)
		if r.SameRows {
			fmt.Fprintf(w, "same rows: every slot the same state and first token; the floor counts one slot's routed experts\n")
		} else if r.OneState {
			fmt.Fprintf(w, "one state: every slot the same synthetic state (first tokens apart); the floor counts uniform routing, which such rows beat\n")
		}
		if len(r.Devices) > 1 {
			fmt.Fprintf(w, "tensor parallel: %d ranks on GPUs %v, comm %s\n", len(r.Devices), r.Devices, r.Comm)
			if r.Note != "" {
				fmt.Fprintf(w, "note: %s\n", r.Note)
			}
		}
		fmt.Fprintf(w, "%8s %5s %9s %9s %9s %10s %9s %8s %6s %10s", "context", "slots", "p50 ms", "p90 ms", "tok/s", "floor GB", "floor ms", "GB/s", "eff", "us/layer")
		if len(r.Devices) > 1 {
			fmt.Fprintf(w, " %13s %13s", "rank floor GB", "rank floor ms")
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%8d %5d %9.3f %9.3f %9.1f %10.3f %9.3f %8.0f %5.0f%% %10.1f", row.Context, row.Slots, row.StepP50MS, row.StepP90MS,
		row.TokensPerSec, float64(row.FloorBytes)/1e9, row.FloorMS, row.GBps, 100*row.Efficiency, row.UsPerLayer)
	if row.RankFloorBytes > 0 {
		fmt.Fprintf(w, " %13.3f %13.3f", float64(row.RankFloorBytes)/1e9, row.RankFloorMS)
	}
	fmt.Fprintln(w)
	if row.TouchedFloorBytes > 0 {
		fmt.Fprintf(w, "  routed experts a MoE layer touched (one probed step): %.1f, uniform routing %.1f; floor on them %.3f GB, %.3f ms: efficiency %.0f%%\n",
			row.TouchedExperts, row.UniformExperts, float64(row.TouchedFloorBytes)/1e9, row.TouchedFloorMS, 100*row.TouchedEfficiency)
	}
	if row.MTP {
		fmt.Fprintf(w, "  mtp: %.2f tokens/slot per step (draft acceptance %.2f); floor: 2 rows/slot through the main layers, 1 through the MTP layer\n",
			row.TokensPerStep, row.AcceptRate)
	}
	if h := row.Host; h != nil {
		fmt.Fprintf(w, "  host per step (mean of %d): record %.0f us, meta upload %.0f us, launch %.0f us, wait for the token %.0f us; runs: %.2f graph replays, %.2f captures, %.2f direct\n",
			h.Steps, h.RecordUs, h.UploadUs, h.LaunchUs, h.WaitUs, h.Replays, h.Captures, h.Eager)
	}
	if p := row.Profile; p != nil {
		pdl := "plain launches"
		switch {
		case p.PDL:
			pdl = fmt.Sprintf("programmatic launches; %.0f us as graphs of plain launches", p.GraphPlainUs)
		case p.GraphPDLUs > 0:
			pdl = fmt.Sprintf("plain launches; %.0f us as graphs of programmatic launches (TILERT_GPU_PDL=1)", p.GraphPDLUs)
		}
		fmt.Fprintf(w, "  profile (each call alone; device %.0f us eager, %.0f us as graphs; %s;\n", p.EagerUs, p.GraphUs, pdl)
		fmt.Fprintf(w, "  in graph: what the graphs lose without the row's calls, its share of the critical path):\n")
		for _, op := range p.Ops {
			gbps := 0.0
			if op.Us > 0 {
				gbps = float64(op.Bytes) / (op.Us * 1e-6) / 1e9
			}
			fmt.Fprintf(w, "    %-22s %4d calls %9.1f us %8.0f GB/s   in graph %7.1f us\n", op.Name, op.Count, op.Us, gbps, op.InGraphUs)
		}
		fmt.Fprintf(w, "  %s\n", inGraphSummary(p))
	}
}

// inGraphSummary says how the profile's in-graph shares add up against the
// graphs' time: near it, the step is one serial chain; well below, calls
// overlap (side streams), and each share is only what that overlap leaves.
func inGraphSummary(p *gpu.StepProfile) string {
	sum := 0.0
	for _, op := range p.Ops {
		sum += op.InGraphUs
	}
	if p.GraphUs <= 0 {
		return fmt.Sprintf("in-graph shares add up to %.0f us", sum)
	}
	return fmt.Sprintf("in-graph shares add up to %.0f us of the graphs' %.0f us (%.0f%%; well under 100%%: calls overlap, and leaving one out also changes what overlaps)",
		sum, p.GraphUs, 100*sum/p.GraphUs)
}
