// Package devprefill is `tilert dev-prefill`: a development stand-in for
// vLLM prefill + the connector sidecar. It prefills a prompt on the local
// CPU engine, ships the state to a decode node over the ctrl protocol and a
// transfer engine, then calls the node's /pd/decode and prints the stream.
package devprefill

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/api/decodeapi"
	"github.com/tilert-go/tilert/config"
	"github.com/tilert-go/tilert/engine"
	"github.com/tilert-go/tilert/internal/cliutil"
	"github.com/tilert-go/tilert/internal/engineload"
	"github.com/tilert-go/tilert/rdma/transfer"
	"github.com/tilert-go/tilert/tokenizer"
)

// Command is `tilert dev-prefill`.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "dev-prefill",
		Usage: "dev tool: prefill a prompt on the local CPU engine, hand its state to a decode node, print the /pd/decode stream",
		Flags: append(append(cliutil.Flags(secretFlags), cliutil.PromptFlags()...),
			&cli.StringFlag{Name: "model-dir", Usage: "the decode node's model: HF checkpoint or converted weights (tokenizer read from it when present)"},
			&cli.StringFlag{Name: "addr-file", Usage: "the decode node's --addr-file (ctrl and http addresses)"},
			&cli.StringFlag{Name: "ctrl", Usage: "decode node ctrl address host:port (instead of --addr-file)"},
			&cli.StringFlag{Name: "http", Usage: "decode node http address host:port (instead of --addr-file)"},
			&cli.StringFlag{Name: "transfer-engine", Value: "tcp", Usage: "tcp or nixl (must match the node)"},
			&cli.StringFlag{Name: "rid", Usage: "request id (default: dev-<time>)"},
			&cli.IntFlag{Name: "max-tokens", Value: 32, Usage: "tokens to generate, the first (prefill's) included"},
			&cli.Float64Flag{Name: "temperature", Usage: "0 is greedy"},
			&cli.Float64Flag{Name: "top-p", Value: 1, Usage: "nucleus sampling threshold"},
			&cli.IntFlag{Name: "top-k", Usage: "keep the k most likely tokens; 0 disables"},
			&cli.Uint64Flag{Name: "seed", Usage: "sampling seed"},
			&cli.BoolFlag{Name: "ignore-eos", Usage: "do not stop at the end-of-sequence token"},
		),
		Action: run,
	}
}

func usage(format string, args ...any) error {
	return cliutil.WithExitCode(errors.Newf(format, args...), cliutil.ExitUsage)
}

// secretFlags: with a shared secret, dev-prefill authenticates to the
// node's ctrl and transfer ports and presents the /pd/* token.
var secretFlags = []config.Flag{
	{Key: "security.secret_file", Name: "secret-file"},
	{Key: "security.pd_token_file", Name: "pd-token-file"},
}

func run(c *cli.Context) error {
	cfg, _, err := cliutil.Load(c, secretFlags)
	if err != nil {
		return err
	}
	secret, err := cfg.Secret()
	if err != nil {
		return err
	}
	tokens, err := cfg.PDTokens()
	if err != nil {
		return err
	}
	out := c.App.Writer
	ctrl, httpAddr := c.String("ctrl"), c.String("http")
	if f := c.String("addr-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return errors.Wrapf(err, "--addr-file %s", f)
		}
		var a decodeapi.Addrs
		if err := json.Unmarshal(b, &a); err != nil {
			return errors.Wrapf(err, "--addr-file %s", f)
		}
		ctrl, httpAddr = a.Ctrl, a.HTTP
	}
	if ctrl == "" || httpAddr == "" {
		return errors.WithHint(usage("no decode node address"), "pass --addr-file (from tilert decode --addr-file) or --ctrl and --http")
	}
	dir := c.String("model-dir")
	w, mcfg, closeW, err := engineload.OpenWeights(dir)
	if err != nil {
		return err
	}
	defer closeW()
	var tok *tokenizer.Tokenizer
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		if tok, err = tokenizer.Load(dir); err != nil {
			return err
		}
	}
	prompt, err := cliutil.PromptIDs(c, tok)
	if err != nil {
		return err
	}
	p := engine.Params{Temperature: c.Float64("temperature"), TopP: c.Float64("top-p"), TopK: c.Int("top-k"), Seed: c.Uint64("seed"),
		MaxTokens: c.Int("max-tokens")}
	if !c.Bool("ignore-eos") {
		p.StopIDs = mcfg.EOS
	}

	ctx, cancel := context.WithTimeout(c.Context, 5*time.Minute)
	defer cancel()
	tr, err := transfer.NewSender(config.Transfer{Engine: c.String("transfer-engine")}, secret)
	if err != nil {
		return err
	}
	defer tr.Close()
	rid := c.String("rid")
	if rid == "" {
		rid = "dev-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	sh := NewShipper(w, mcfg, tr, len(prompt)+2).WithSecret(secret)
	defer sh.Close()
	h, err := sh.Ship(ctx, ctrl, rid, prompt, p)
	if err != nil {
		return err
	}
	first := h.First
	fmt.Fprintf(out, "prefill: %d prompt tokens in %s, first token %d\n", len(prompt), h.Prefill.Round(time.Millisecond), first)
	fmt.Fprintf(out, "handoff: rid %s -> slot %d gen %d, %d bytes in %d regions over %s in %s\n",
		rid, h.Ack.Slot, h.Ack.Generation, h.Bytes, h.Regions, h.Transport, h.Send.Round(time.Microsecond))

	body := map[string]any{"rid": rid, "first_token_id": first, "max_tokens": p.MaxTokens, "ignore_eos": c.Bool("ignore-eos"),
		"sampling": map[string]any{"temperature": p.Temperature, "top_p": p.TopP, "top_k": p.TopK, "seed": p.Seed}}
	b, _ := json.Marshal(body)
	fmt.Fprintf(out, "POST http://%s/pd/decode %s\n", httpAddr, b)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/pd/decode", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if len(tokens) > 0 {
		req.Header.Set("Authorization", "Bearer "+tokens[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Wrap(err, "POST /pd/decode")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return errors.Newf("/pd/decode: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	ids := []int{first}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		fmt.Fprintf(out, "  %s\n", line)
		var m struct {
			T     []int  `json:"t"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return errors.Wrapf(err, "/pd/decode line %q", line)
		}
		if m.Error != "" {
			return errors.Newf("/pd/decode ended with an error: %s", line)
		}
		ids = append(ids, m.T...)
	}
	if err := sc.Err(); err != nil {
		return errors.Wrap(err, "reading /pd/decode")
	}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = strconv.Itoa(id)
	}
	fmt.Fprintf(out, "ids: %s\n", strings.Join(strs, ","))
	if tok != nil {
		fmt.Fprintf(out, "text: %q\n", tok.Decode(ids, true))
	}
	return nil
}
