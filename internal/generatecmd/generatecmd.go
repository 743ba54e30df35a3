// Package generatecmd is `tilert generate`: a one-shot local run of the
// engine on a prompt, like `ollama run`, for checking a model end to end.
package generatecmd

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/tokenizer"
)

// Command is `tilert generate`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "generate",
		Usage: "generate from a prompt locally (HF checkpoint or converted weights) and print ids and text",
		Flags: append(append(append(cliutil.Flags(nil), cliutil.PromptFlags()...), cliutil.SamplingFlags()...),
			&cli.StringFlag{Name: "model-dir", Usage: "HF checkpoint directory (also where the tokenizer is read from)"},
			&cli.StringFlag{Name: "weights-dir", Usage: "converted TileRT weights (tilert convert); the tokenizer comes from --model-dir if given"},
			&cli.IntFlag{Name: "max-tokens", Value: 32, Usage: "tokens to generate"},
			&cli.StringFlag{Name: "mode", Value: "serving", Usage: "exact (float32 caches) or serving (caches in vLLM's layouts)"},
			&cli.StringFlag{Name: "kv-cache-dtype", Value: "fp8", Usage: "serving-mode MLA cache: fp8 (fp8_ds_mla) or bf16"},
			&cli.BoolFlag{Name: "mtp", Usage: "speculative decoding with the MTP layer"},
			&cli.StringFlag{Name: "prefill-precision", Value: "float32", Usage: "prompt arithmetic: float32 (products exact) or fast (x rounded once to fp16, as a bf16 prefill; GPU serving mode)"},
			&cli.Uint64Flag{Name: "seed", Value: 0, Usage: "sampling seed"},
			&cli.BoolFlag{Name: "ignore-eos", Usage: "do not stop at the end-of-sequence token"},
			&cli.StringFlag{Name: "device", Value: engineload.DefaultDevice, Usage: "auto (GPU 0 when usable, else the CPU), cuda or cpu"},
		),
		Action: run,
	}
}

func usage(format string, args ...any) error {
	return cliutil.WithExitCode(errors.Newf(format, args...), cliutil.ExitUsage)
}

func run(c *cli.Context) error {
	if _, _, err := cliutil.Load(c, nil); err != nil {
		return err
	}
	p, err := cliutil.Sampling(c)
	if err != nil {
		return err
	}
	p.Seed = c.Uint64("seed")
	device, why, err := engineload.ResolveDevice(c.String("device"))
	if err != nil {
		return err
	}
	slog.Debug("generate: device", "device", device, "why", why)
	modelDir, weightsDir := c.String("model-dir"), c.String("weights-dir")
	if modelDir == "" && weightsDir == "" {
		return errors.WithHint(usage("generate needs a model"), "pass --model-dir HF_DIR or --weights-dir CONVERTED_DIR")
	}
	for flag, dir := range map[string]string{"--model-dir": modelDir, "--weights-dir": weightsDir} {
		if dir != "" {
			if err := engineload.CheckDir(flag, dir); err != nil {
				return err
			}
		}
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

	var tok *tokenizer.Tokenizer
	if modelDir != "" {
		if _, err := os.Stat(filepath.Join(modelDir, "tokenizer.json")); err == nil {
			if tok, err = tokenizer.Load(modelDir); err != nil {
				return err
			}
		}
	}
	prompt, err := cliutil.PromptIDs(c, tok)
	if err != nil {
		return err
	}

	maxTokens := c.Int("max-tokens")
	if maxTokens < 1 {
		return errors.WithHint(usage("--max-tokens %d is not positive", maxTokens), "ask for at least one token")
	}
	opts := engine.Options{
		Mode: mode, MLACache: cache, Slots: 1, MaxSeqLen: len(prompt) + maxTokens + 2, MTP: c.Bool("mtp"), Prefill: prec,
	}
	dir := weightsDir
	if dir == "" {
		dir = modelDir
	}
	e, cfg, closeEngine, err := engineload.Open(device, dir, opts)
	if err != nil {
		return err
	}
	defer closeEngine()

	p.MaxTokens = maxTokens
	if !c.Bool("ignore-eos") {
		p.StopIDs = cfg.EOS
		if tok != nil {
			p.StopIDs = append(append([]int(nil), p.StopIDs...), tok.EOS()...)
		}
	}
	return generate(c.App.Writer, e, tok, prompt, p)
}

// generate runs prefill then decode steps, streaming text as it goes.
func generate(w io.Writer, e engine.Engine, tok *tokenizer.Tokenizer, prompt []int, p engine.Params) error {
	start := time.Now()
	first, err := e.Prefill(0, prompt, p)
	if err != nil {
		return err
	}
	prefill := time.Since(start)
	ids := []int{first}
	var dec *tokenizer.Decoder
	if tok != nil {
		dec = tok.NewDecoder()
		fmt.Fprint(w, printable(dec.Add(first)))
	}
	finish, err := e.Start(0, first, p)
	if err != nil {
		return err
	}
	decStart := time.Now()
	for finish == engine.FinishNone {
		res, err := e.Step([]int{0})
		if err != nil {
			return err
		}
		for _, r := range res {
			for _, t := range r.Tokens {
				ids = append(ids, t)
				if dec != nil {
					fmt.Fprint(w, printable(dec.Add(t)))
				}
			}
			finish = r.Finish
		}
	}
	decode := time.Since(decStart)
	if dec != nil {
		fmt.Fprintln(w, printable(dec.Flush()))
	}
	st := e.Stats()
	idStr := make([]string, len(ids))
	for i, id := range ids {
		idStr[i] = strconv.Itoa(id)
	}
	fmt.Fprintf(w, "ids: %s\n", strings.Join(idStr, ","))
	fmt.Fprintf(w, "finish: %s  prompt: %d tokens in %s  decode: %d tokens in %s (%.1f tok/s)",
		finish, len(prompt), prefill.Round(time.Millisecond), len(ids)-1, decode.Round(time.Millisecond),
		float64(len(ids)-1)/decode.Seconds())
	if st.DraftTokens > 0 {
		fmt.Fprintf(w, "  mtp accept: %.2f", st.AcceptRate())
	}
	fmt.Fprintln(w)
	return nil
}

// printable escapes what a terminal would act on instead of show (control
// characters other than newline and tab, invalid UTF-8): a model with random
// weights emits any token, and its text must not garble the terminal.
func printable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\n' || r == '\t' || !unicode.IsControl(r):
			b.WriteString(s[:n])
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		s = s[n:]
	}
	return b.String()
}
