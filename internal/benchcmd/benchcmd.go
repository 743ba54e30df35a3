// Package benchcmd is `tilert bench`: measured figures for the engine on a
// device, printed as a table and optionally written as JSON.
package benchcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/engine/gpu"
	"github.com/tilert-go/tilert/internal/buildinfo"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/model"
	"github.com/tilert-go/tilert/tokenizer"
)

// Command is `tilert bench`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "benchmark the engine (tilert bench decode)",
		Subcommands: []*cli.Command{{
			Name:  "decode",
			Usage: "prefill random prompts into N slots, then time batched decode steps",
			Flags: append(append(cliutil.Flags(nil), cliutil.SamplingFlags()...),
				&cli.StringFlag{Name: "model-dir", Usage: "converted weights or an HF checkpoint directory (required)"},
				&cli.StringFlag{Name: "device", Value: engineload.DefaultDevice, Usage: "auto (the GPU when usable, else the CPU), cuda or cpu"},
				&cli.StringFlag{Name: "mode", Value: "serving", Usage: "exact (float32 caches) or serving (caches in vLLM's layouts)"},
				&cli.StringFlag{Name: "kv-cache-dtype", Value: "fp8", Usage: "MLA cache: fp8 or bf16"},
				&cli.IntFlag{Name: "prompt-len", Value: 128, Usage: "prompt tokens per slot"},
				&cli.IntFlag{Name: "tokens", Value: 64, Usage: "tokens generated per slot"},
				&cli.IntFlag{Name: "slots", Value: 1, Usage: "requests decoded together (--max-inflight)"},
				&cli.BoolFlag{Name: "mtp", Usage: "speculative decoding with the MTP layer"},
				&cli.StringFlag{Name: "prefill-precision", Value: "float32", Usage: "prompt arithmetic: float32 (products exact) or fast (x rounded once to fp16, as a bf16 prefill; GPU serving mode)"},
				&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the random prompts (and of the draws with --temperature)"},
				&cli.StringFlag{Name: "prompt-file", Usage: "text file: each slot's prompt is a --prompt-len window of it (tokenized with the model's tokenizer.json) instead of random ids, so MTP acceptance is that of real text"},
				&cli.StringFlag{Name: "json", Usage: "also write the result as JSON to this file"},
				&cli.StringFlag{Name: "prefill-lens", Usage: "comma-separated prompt lengths also prefilled (timed, into slot 0, after the decode run) in the same engine, e.g. 1024,8192 (each at most --prompt-len); on the GPU engine each also gets a line with the device time of the same run (busy, span) beside its wall time"},
				&cli.StringFlag{Name: "context", Usage: "comma-separated context lengths (e.g. 1024,8192,32768,131072): each slot gets an imported cache of that many positions (random valid entries) instead of a prefill, and each row is held against the step's byte floor at the copy rate measured in the same run"},
				&cli.StringFlag{Name: "dummy-weights", Usage: "random weights with the real dimensions of " + strings.Join(engineload.DummyModels, " or ") + ", made here and uploaded to the GPU (no files; replaces --model-dir)"},
				&cli.IntFlag{Name: "layers", Value: 8, Usage: "with --dummy-weights: MoE layers after the model's dense ones"},
				&cli.BoolFlag{Name: "one-expert-bank", Usage: "with --dummy-weights: every MoE layer's routed experts are one bank in GPU memory, so 9 MoE layers of DeepSeek-V3.2 dims fit an 80 GB card (~21 GB against ~110); a step reads the same bytes, each layer its own routed experts from HBM"},
				&cli.StringFlag{Name: "batches", Usage: "with --context: comma-separated slot counts timed at each context in one engine (e.g. 1,4; default --slots)"},
				&cli.BoolFlag{Name: "one-state", Usage: "with --context: every slot imports the same synthetic state (the bench before session 58: the rows then route to more of the same experts than distinct requests would); by default each slot gets its own"},
				&cli.BoolFlag{Name: "same-rows", Usage: "with --context, greedy: every slot imports the same state and starts from the same token, so the rows route to the same experts (a batch's best case, the weights read once); the floor counts one slot's experts"},
				&cli.StringFlag{Name: "timeline", Usage: "with --context on the GPU: after each row's timed steps, trace one step's kernels as the GPU ran them (CUPTI: libcupti of the CUDA toolkit, or the file $TILERT_CUPTI names) and write them with their analysis (span, busy, idle gaps, time by kernel, layers) as JSON to this file; a summary prints under each row"},
				&cli.BoolFlag{Name: "profile", Usage: "on the GPU: with --context a per-kernel breakdown of a step at each context; without, of a prefill of --prompt-len tokens"},
				&cli.StringFlag{Name: "devices", Usage: "GPUs of the tensor-parallel engine, one per rank (e.g. 0,1,2,3,4,5,6,7; as decode --devices); an ordinal may repeat (0,0,0,0: four ranks on GPU 0); empty: GPU 0, unsharded"},
				&cli.StringFlag{Name: "comm", Value: "auto", Usage: "with --devices: collective between ranks: auto (oneshot on one GPU, nccl across GPUs), oneshot (the fused one-shot all-reduce; across GPUs over peer-mapped memory), local or nccl (one rank per GPU)"},
			),
			Action: runDecode,
		}},
	}
}

// Result is one bench decode run.
type Result struct {
	Version       string  `json:"version"`
	Device        string  `json:"device"`
	Model         string  `json:"model"`
	Mode          string  `json:"mode"`
	KVCacheDType  string  `json:"kv_cache_dtype"`
	Prefill       string  `json:"prefill_precision"`
	MTP           bool    `json:"mtp"`
	Sampling      string  `json:"sampling"` // greedy, or the --temperature ... flags
	Slots         int     `json:"slots"`
	PromptLen     int     `json:"prompt_len"`
	PromptFile    string  `json:"prompt_file,omitempty"`
	Tokens        int     `json:"tokens_per_slot"`
	PrefillMS     float64 `json:"prefill_ms_per_slot"`
	Steps         int     `json:"steps"`
	StepP50MS     float64 `json:"step_p50_ms"`
	StepP90MS     float64 `json:"step_p90_ms"`
	DecodeSeconds float64 `json:"decode_seconds"`
	TokensPerSec  float64 `json:"tokens_per_second"`
	PerUserTokS   float64 `json:"per_user_tokens_per_second"`
	MTPAccept     float64 `json:"mtp_accept_rate"`
	// PrefillProfile: --profile, a second prefill of a prompt as long
	// with every device call timed alone.
	PrefillProfile *gpu.PrefillProfile `json:"prefill_profile,omitempty"`
	// PrefillMSByLen: --prefill-lens, prefill ms per prompt length.
	PrefillMSByLen map[string]float64 `json:"prefill_ms_by_len,omitempty"`
	// PrefillClockByLen: --prefill-lens on the GPU engine, each of those
	// prefills' wall time beside the device time of the same run
	// (gpu.PrefillClock).
	PrefillClockByLen map[string]gpu.PrefillClock `json:"prefill_clock_by_len,omitempty"`
}

// sampling is the steps' sampling (greedy by default) and its description:
// real traffic often samples (DeepSeek-V3.2's generation_config asks for
// temperature 0.6, top-p 0.95), and the pick is on every step's critical
// path.
func sampling(c *cli.Context) (engine.Params, string, error) {
	p, err := cliutil.Sampling(c)
	if err != nil {
		return p, "", err
	}
	if p.Greedy() {
		return p, "greedy", nil
	}
	p.Seed = c.Uint64("seed")
	return p, fmt.Sprintf("temperature %g, top-p %g, top-k %d, min-p %g", p.Temperature, p.TopP, p.TopK, p.MinP), nil
}

func runDecode(c *cli.Context) error {
	if _, _, err := cliutil.Load(c, nil); err != nil {
		return err
	}
	mode, err := engine.ParseMode(c.String("mode"))
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	cache, err := engine.ParseCacheDType(c.String("kv-cache-dtype"))
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	prec, err := engine.ParsePrefillPrecision(c.String("prefill-precision"))
	if err != nil {
		return cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	if err := checkTimeline(c); err != nil {
		return err
	}
	if c.Bool("one-expert-bank") && c.String("dummy-weights") == "" {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--one-expert-bank needs --dummy-weights"),
			"a checkpoint's experts are its own; add --dummy-weights deepseek-v3.2 (or glm-5), or drop --one-expert-bank"), cliutil.ExitUsage)
	}
	p, _, err := sampling(c)
	if err != nil {
		return err
	}
	if c.Bool("same-rows") && (c.String("context") == "" || !p.Greedy()) {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--same-rows needs --context and greedy decoding"),
			"the rows stay the same only from the same imported state without draws; add --context 8192 and drop --temperature, or drop --same-rows"), cliutil.ExitUsage)
	}
	if cs := c.String("context"); cs != "" {
		ctxs, err := parseContexts(cs)
		if err != nil {
			return err
		}
		return runContexts(c, ctxs)
	}
	slots, plen, ntok := c.Int("slots"), c.Int("prompt-len"), c.Int("tokens")
	if slots < 1 || plen < 1 || ntok < 1 {
		return cliutil.WithExitCode(errors.WithHint(errors.New("--slots, --prompt-len and --tokens must be positive"),
			"e.g. --slots 1 --prompt-len 128 --tokens 64"), cliutil.ExitUsage)
	}
	dir, dummy := c.String("model-dir"), c.String("dummy-weights")
	opts := engine.Options{Mode: mode, MLACache: cache, Slots: slots, MaxSeqLen: plen + ntok + 4, MTP: c.Bool("mtp"), Prefill: prec}
	var (
		e           engine.Engine
		cfg         *model.Config
		closeEngine func()
		device      = "cuda"
	)
	switch {
	case dummy != "" && dir != "":
		return cliutil.WithExitCode(errors.WithHint(errors.New("--dummy-weights and --model-dir both given"),
			"pick one: real weights from a directory, or random ones of a model's dimensions"), cliutil.ExitUsage)
	case dummy != "":
		if cfg, err = engineload.DummyConfigMTP(dummy, c.Int("layers"), c.Bool("mtp")); err != nil {
			return cliutil.WithExitCode(err, cliutil.ExitUsage)
		}
		ge, cl, err := engineload.OpenDummy(cfg, opts, c.Bool("one-expert-bank"))
		if err != nil {
			return err
		}
		e, closeEngine = ge, cl
	case dir == "":
		return cliutil.WithExitCode(errors.WithHint(errors.New("bench decode needs --model-dir"),
			"pass converted weights or an HF checkpoint directory; for a quick try: tilert synth --preset glm-5-tiny --out /tmp/tiny && tilert bench decode --model-dir /tmp/tiny"), cliutil.ExitUsage)
	default:
		if err := engineload.CheckDir("--model-dir", dir); err != nil {
			return err
		}
		if err := engineload.Verify(dir); err != nil {
			return err
		}
		if device, _, err = engineload.ResolveDevice(c.String("device")); err != nil {
			return err
		}
		pl, err := placement(c)
		if err != nil {
			return err
		}
		if e, cfg, closeEngine, err = engineload.OpenOn(device, dir, opts, pl); err != nil {
			return err
		}
	}
	defer closeEngine()

	r := Result{
		Version: buildinfo.Version, Device: device, Model: string(cfg.Family), Mode: string(mode),
		KVCacheDType: string(cache), Prefill: string(prec), MTP: c.Bool("mtp"), Slots: slots, PromptLen: plen, Tokens: ntok,
	}
	rng := rand.New(rand.NewPCG(c.Uint64("seed"), 7))
	var text []int
	if f := c.String("prompt-file"); f != "" {
		if text, err = textIDs(dir, f, plen); err != nil {
			return err
		}
		r.PromptFile = f
	}
	p, how, _ := sampling(c) // no stop ids: every slot runs to ntok
	p.MaxTokens = ntok
	r.Sampling = how
	active := make([]int, 0, slots)
	var prompt0 []int
	start := time.Now()
	for s := 0; s < slots; s++ {
		prompt := make([]int, plen)
		if text != nil {
			at := rng.IntN(len(text) - plen + 1)
			copy(prompt, text[at:at+plen])
		} else {
			for i := range prompt {
				// Stay below the top of the vocabulary, where the special tokens live.
				prompt[i] = rng.IntN(cfg.VocabSize * 3 / 4)
			}
		}
		if s == 0 {
			prompt0 = prompt
		}
		first, err := e.Prefill(s, prompt, p)
		if err != nil {
			return err
		}
		fin, err := e.Start(s, first, p)
		if err != nil {
			return err
		}
		if fin == engine.FinishNone {
			active = append(active, s)
		}
	}
	r.PrefillMS = float64(time.Since(start).Microseconds()) / 1e3 / float64(slots)

	var steps []float64
	generated := slots // the first tokens
	decStart := time.Now()
	for len(active) > 0 {
		t0 := time.Now()
		res, err := e.Step(active)
		if err != nil {
			return err
		}
		steps = append(steps, float64(time.Since(t0).Microseconds())/1e3)
		next := active[:0]
		for _, sr := range res {
			generated += len(sr.Tokens)
			if sr.Finish == engine.FinishNone {
				next = append(next, sr.Slot)
			}
		}
		active = next
	}
	r.DecodeSeconds = time.Since(decStart).Seconds()
	r.Steps = len(steps)
	slices.Sort(steps)
	if len(steps) > 0 {
		r.StepP50MS = steps[len(steps)/2]
		r.StepP90MS = steps[len(steps)*9/10]
	}
	// The first token of each slot comes from prefill; decode made the rest.
	if r.DecodeSeconds > 0 {
		r.TokensPerSec = float64(generated-slots) / r.DecodeSeconds
		r.PerUserTokS = r.TokensPerSec / float64(slots)
	}
	r.MTPAccept = e.Stats().AcceptRate()
	if pl := c.String("prefill-lens"); pl != "" {
		lens, err := parseContexts(pl)
		if err != nil {
			return err
		}
		r.PrefillMSByLen = map[string]float64{}
		for _, L := range lens {
			if L > plen {
				return cliutil.WithExitCode(errors.WithHintf(errors.Newf("--prefill-lens %d is longer than --prompt-len %d", L, plen),
					"raise --prompt-len to the longest prefill length"), cliutil.ExitUsage)
			}
			e.Release(0)
			if ck, ok := e.(prefillClocker); ok {
				// The same prefill, its device time taken beside (two
				// event records per host wait).
				t0 := time.Now()
				_, pc, err := ck.ClockPrefill(0, prompt0[:L], p)
				if err != nil {
					return err
				}
				r.PrefillMSByLen[strconv.Itoa(L)] = float64(time.Since(t0).Microseconds()) / 1e3
				if pc.Segments > 0 {
					if r.PrefillClockByLen == nil {
						r.PrefillClockByLen = map[string]gpu.PrefillClock{}
					}
					r.PrefillClockByLen[strconv.Itoa(L)] = pc
				}
				continue
			}
			t0 := time.Now()
			if _, err := e.Prefill(0, prompt0[:L], p); err != nil {
				return err
			}
			r.PrefillMSByLen[strconv.Itoa(L)] = float64(time.Since(t0).Microseconds()) / 1e3
		}
		e.Release(0)
	}
	if c.Bool("profile") {
		// Slot 0's prompt once more, every device call timed alone.
		pp, ok := e.(prefillProfiler)
		if !ok {
			return cliutil.WithExitCode(errors.WithHint(errors.New("--profile without --context needs the GPU engine"),
				"run with --device cuda (unsharded)"), cliutil.ExitUsage)
		}
		e.Release(0)
		if _, r.PrefillProfile, err = pp.ProfilePrefill(0, prompt0, p); err != nil {
			return err
		}
		e.Release(0)
	}
	report(c.App.Writer, r)
	if f := c.String("json"); f != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(f, append(b, '\n'), 0o644); err != nil {
			return errors.Wrapf(err, "writing %s", f)
		}
	}
	return nil
}

// placement reads --devices and --comm.
func placement(c *cli.Context) (engineload.Placement, error) {
	devs, err := config.ParseDevices(c.String("devices"))
	if err != nil {
		return engineload.Placement{}, cliutil.WithExitCode(errors.WithHint(errors.Wrap(err, "--devices"),
			"list GPU ordinals, one per rank, e.g. --devices 0,1,2,3 (or 0,0,0,0 for four ranks on GPU 0)"), cliutil.ExitUsage)
	}
	if _, err := gpu.ParseComm(c.String("comm")); err != nil {
		return engineload.Placement{}, cliutil.WithExitCode(err, cliutil.ExitUsage)
	}
	return engineload.Placement{Devices: devs, Comm: c.String("comm")}, nil
}

// textIDs tokenizes a prompt file with the model directory's tokenizer.
func textIDs(modelDir, file string, plen int) ([]int, error) {
	tok, err := tokenizer.Load(modelDir)
	if err != nil {
		return nil, errors.WithHint(err, "--prompt-file needs the model's tokenizer.json in --model-dir (an HF checkpoint directory)")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, errors.WithHint(errors.Wrap(err, "reading --prompt-file"), "give a readable text file")
	}
	ids, err := tok.Encode(string(b), false)
	if err != nil {
		return nil, errors.Wrapf(err, "tokenizing %s", file)
	}
	if len(ids) < plen {
		return nil, errors.WithHintf(errors.Newf("--prompt-file %s has %d tokens, fewer than --prompt-len %d", file, len(ids), plen),
			"use a longer file or a smaller --prompt-len")
	}
	return ids, nil
}

func report(w io.Writer, r Result) {
	src := "random ids"
	if r.PromptFile != "" {
		src = "text from " + r.PromptFile
	}
	prec := ""
	if r.Prefill != "" && r.Prefill != string(engine.PrefillFloat32) {
		prec = ", prefill " + r.Prefill
	}
	fmt.Fprintf(w, "bench decode: %s on %s, mode %s, cache %s%s, mtp %v, %d slot(s), prompt %d (%s), %d tokens/slot, %s\n",
		r.Model, r.Device, r.Mode, r.KVCacheDType, prec, r.MTP, r.Slots, r.PromptLen, src, r.Tokens, r.Sampling)
	fmt.Fprintf(w, "  prefill      %9.2f ms/slot\n", r.PrefillMS)
	fmt.Fprintf(w, "  decode step  %9.3f ms p50, %.3f ms p90 (%d steps)\n", r.StepP50MS, r.StepP90MS, r.Steps)
	fmt.Fprintf(w, "  throughput   %9.1f tok/s total, %.1f tok/s per user\n", r.TokensPerSec, r.PerUserTokS)
	if r.MTP {
		fmt.Fprintf(w, "  mtp accept   %9.2f\n", r.MTPAccept)
	}
	lens := make([]int, 0, len(r.PrefillMSByLen))
	for k := range r.PrefillMSByLen {
		n, _ := strconv.Atoi(k)
		lens = append(lens, n)
	}
	slices.Sort(lens)
	for _, L := range lens {
		fmt.Fprintf(w, "  prefill %6d %9.2f ms (--prefill-lens)\n", L, r.PrefillMSByLen[strconv.Itoa(L)])
	}
	for _, L := range lens {
		if pc, ok := r.PrefillClockByLen[strconv.Itoa(L)]; ok {
			fmt.Fprintf(w, "  prefill %6d wall %.2f ms, device busy %.2f ms in %d runs between host waits, span %.2f ms: device idle at host waits %.2f ms, host outside the span %.2f ms\n",
				L, pc.WallMs, pc.BusyMs, pc.Segments, pc.SpanMs, pc.IdleMs(), pc.HostMs())
		}
	}
	if p := r.PrefillProfile; p != nil {
		reportPrefillProfile(w, p, r.PromptLen)
	}
}

// prefillClocker is the GPU engine's ClockPrefill.
type prefillClocker interface {
	ClockPrefill(slot int, prompt []int, p engine.Params) (int, gpu.PrefillClock, error)
}

// prefillProfiler is the GPU engine's ProfilePrefill.
type prefillProfiler interface {
	ProfilePrefill(slot int, prompt []int, p engine.Params) (int, *gpu.PrefillProfile, error)
}

// reportPrefillProfile prints the prefill's device time by kind of call,
// then the costliest shapes.
func reportPrefillProfile(w io.Writer, p *gpu.PrefillProfile, plen int) {
	chunks := (plen + p.Chunk - 1) / p.Chunk
	fmt.Fprintf(w, "  prefill profile (each call alone, %d calls, %d chunks of <= %d rows): %.1f ms of device time\n",
		p.Calls, chunks, p.Chunk, p.SumUs/1e3)
	kinds := map[string]*gpu.OpTime{}
	var names []string
	for _, op := range p.Ops {
		n, _, _ := strings.Cut(op.Name, " ")
		k := kinds[n]
		if k == nil {
			k = &gpu.OpTime{Name: n}
			kinds[n] = k
			names = append(names, n)
		}
		k.Count += op.Count
		k.Us += op.Us
	}
	slices.SortFunc(names, func(a, b string) int {
		if kinds[a].Us != kinds[b].Us {
			if kinds[a].Us > kinds[b].Us {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, n := range names {
		k := kinds[n]
		fmt.Fprintf(w, "    %-22s %5d calls %10.1f us %5.1f%%  %8.1f us/call\n", n, k.Count, k.Us, 100*k.Us/max(p.SumUs, 1e-9), k.Us/float64(k.Count))
	}
	fmt.Fprintf(w, "  costliest shapes:\n")
	for i, op := range p.Ops {
		if i == 24 {
			break
		}
		fmt.Fprintf(w, "    %-36s %5d calls %10.1f us %8.1f us/call\n", op.Name, op.Count, op.Us, op.Us/float64(op.Count))
	}
}
