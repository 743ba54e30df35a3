package cliutil

import (
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/tokenizer"
)

func usageErr(format string, args ...any) error {
	return WithExitCode(errors.Newf(format, args...), ExitUsage)
}

// PromptFlags are --prompt and --prompt-ids, which PromptIDs reads.
func PromptFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "prompt", Usage: "prompt text (needs a tokenizer)"},
		&cli.StringFlag{Name: "prompt-ids", Usage: "prompt as comma-separated token ids"},
	}
}

// PromptIDs reads the prompt of a command from --prompt (encoded with tok)
// or --prompt-ids (comma-separated ids): exactly one of them.
func PromptIDs(c *cli.Context, tok *tokenizer.Tokenizer) ([]int, error) {
	text, ids := c.String("prompt"), c.String("prompt-ids")
	switch {
	case text != "" && ids != "":
		return nil, usageErr("give --prompt or --prompt-ids, not both")
	case ids != "":
		var out []int
		for _, f := range strings.Split(ids, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return nil, errors.WithHint(usageErr("--prompt-ids: %q is not a token id", f), "write ids as 1,2,3")
			}
			out = append(out, n)
		}
		return out, nil
	case text != "":
		if tok == nil {
			return nil, errors.WithHint(usageErr("--prompt needs a tokenizer"), "use a --model-dir with tokenizer.json, or --prompt-ids")
		}
		return tok.Encode(text, true)
	}
	return nil, errors.WithHint(usageErr("no prompt"), "pass --prompt TEXT or --prompt-ids 1,2,3")
}
