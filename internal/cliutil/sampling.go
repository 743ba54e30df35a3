package cliutil

import (
	"github.com/cockroachdb/errors"
	"github.com/urfave/cli/v2"

	"github.com/tilert-go/tilert/engine"
)

// SamplingFlags are the sampling flags of generate and bench decode; the
// defaults are greedy decoding.
func SamplingFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Float64Flag{Name: "temperature", Value: 0, Usage: "0 is greedy"},
		&cli.Float64Flag{Name: "top-p", Value: 1, Usage: "nucleus sampling threshold"},
		&cli.IntFlag{Name: "top-k", Value: 0, Usage: "keep the k most likely tokens; 0 or -1 disables"},
		&cli.Float64Flag{Name: "min-p", Value: 0, Usage: "keep the tokens at least this share of the most likely one's probability; 0 disables"},
	}
}

// Sampling reads SamplingFlags, refusing values outside vLLM's ranges
// rather than quietly treating them as off.
func Sampling(c *cli.Context) (engine.Params, error) {
	p := engine.Params{Temperature: c.Float64("temperature"), TopP: c.Float64("top-p"), TopK: c.Int("top-k"), MinP: c.Float64("min-p")}
	switch {
	case !(p.Temperature >= 0):
		return p, errors.WithHint(usageErr("--temperature %g is negative", p.Temperature), "0 is greedy; 0.6-1.0 samples")
	case !(p.TopP > 0 && p.TopP <= 1):
		return p, errors.WithHint(usageErr("--top-p %g is outside (0, 1]", p.TopP), "1 keeps every token")
	case p.TopK < -1:
		return p, errors.WithHint(usageErr("--top-k %d is below -1", p.TopK), "0 or -1 keeps every token")
	case !(p.MinP >= 0 && p.MinP <= 1):
		return p, errors.WithHint(usageErr("--min-p %g is outside [0, 1]", p.MinP), "0 keeps every token")
	}
	p.TopK = max(p.TopK, 0)
	return p, nil
}
