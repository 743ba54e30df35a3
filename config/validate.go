package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/tilert-go/tilert/openai/parsers"
)

// problem is one invalid value with what to do about it.
type problem struct{ path, msg, hint string }

// ValidationError lists every invalid value at once, so a user fixes a
// config in one pass.
type ValidationError struct{ problems []problem }

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid configuration (%d problem", len(e.problems))
	if len(e.problems) != 1 {
		b.WriteString("s")
	}
	b.WriteString("):")
	for _, p := range e.problems {
		fmt.Fprintf(&b, "\n  %s: %s (%s)", p.path, p.msg, p.hint)
	}
	return b.String()
}

// Paths returns the dotted paths of the invalid values, for tests.
func (e *ValidationError) Paths() []string {
	out := make([]string, len(e.problems))
	for i, p := range e.problems {
		out[i] = p.path
	}
	return out
}

type checker struct{ problems []problem }

func (k *checker) bad(path, hint, format string, args ...any) {
	k.problems = append(k.problems, problem{path: path, msg: fmt.Sprintf(format, args...), hint: hint})
}

func (k *checker) oneOf(path, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	k.bad(path, "use one of "+strings.Join(allowed, ", "), "%q is not allowed", v)
}

func (k *checker) port(path string, v int, zeroOK bool) {
	if (v == 0 && zeroOK) || (v >= 1 && v <= 65535) {
		return
	}
	hint := "use a TCP port between 1 and 65535"
	if zeroOK {
		hint += ", or 0"
	}
	k.bad(path, hint, "port %d is out of range", v)
}

func (k *checker) between(path string, v, lo, hi int) {
	if v < lo || v > hi {
		k.bad(path, fmt.Sprintf("use a value from %d to %d", lo, hi), "%d is out of range", v)
	}
}

func (k *checker) positive(path string, v float64) {
	if !(v > 0) {
		k.bad(path, "use a number of seconds greater than 0", "%v is not positive", v)
	}
}

func (k *checker) existingDir(path, dir string) {
	if dir == "" {
		return
	}
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		k.bad(path, "point it at an existing directory", "%s does not exist", dir)
	case !st.IsDir():
		k.bad(path, "point it at a directory, not a file", "%s is not a directory", dir)
	}
}

// Validate checks every value and returns a *ValidationError listing all
// problems, or nil.
func (c *Config) Validate() error {
	k := &checker{}
	k.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	k.oneOf("log.format", c.Log.Format, "text", "json")

	if _, err := CanonicalModel(c.Model.Name); err != nil {
		k.bad("model.name", errors.FlattenHints(err), "%v", err)
	}
	k.between("model.max_seq_len", c.Model.MaxSeqLen, 1, 1<<22)
	k.oneOf("model.kv_cache_dtype", c.Model.KVCacheDType, "fp8", "bf16")
	k.existingDir("model.path", c.Model.Path)
	k.existingDir("model.weights_dir", c.Model.WeightsDir)

	k.oneOf("transfer.engine", c.Transfer.Engine, "tcp", "nixl")
	if c.Transfer.Listen == "" {
		// decode.host's bind address, port 0
	} else if _, p, err := net.SplitHostPort(c.Transfer.Listen); err != nil {
		k.bad("transfer.listen", "write host:port, e.g. 0.0.0.0:0", "%q is not host:port", c.Transfer.Listen)
	} else if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
		k.bad("transfer.listen", "use a port from 0 to 65535", "bad port in %q", c.Transfer.Listen)
	}
	k.between("transfer.streams", c.Transfer.Streams, 1, 64)
	if c.Transfer.NixlLib != "" {
		if _, err := os.Stat(c.Transfer.NixlLib); err != nil {
			k.bad("transfer.nixl_lib", "point it at libnixl_capi.so, or leave it empty to search site-packages", "%s does not exist", c.Transfer.NixlLib)
		}
	}

	k.existingDir("convert.model_dir", c.Convert.ModelDir)
	k.between("convert.devices", c.Convert.Devices, 1, 64)
	if c.Convert.SaveDir != "" {
		if parent := filepath.Dir(filepath.Clean(c.Convert.SaveDir)); parent != "" {
			if st, err := os.Stat(parent); err != nil || !st.IsDir() {
				k.bad("convert.save_dir", "create the parent directory first", "parent directory %s does not exist", parent)
			}
		}
	}

	k.oneOf("decode.engine", c.Decode.Engine, "tilert")
	k.oneOf("decode.device", c.Decode.Device, "auto", "cuda", "cpu")
	if _, err := ParseDevices(c.Decode.Devices); err != nil {
		k.bad("decode.devices", "list GPU ordinals separated by commas, e.g. 0,1,2,3,4,5,6,7", "%v", err)
	}
	k.oneOf("decode.comm", c.Decode.Comm, "auto", "oneshot", "local", "nccl")
	// Port 0 lets the kernel choose (tests, demos); --addr-file reports it.
	k.port("decode.ctrl_port", c.Decode.CtrlPort, true)
	k.port("decode.http_port", c.Decode.HTTPPort, true)
	if c.Decode.CtrlPort == c.Decode.HTTPPort && c.Decode.CtrlPort != 0 {
		k.bad("decode.http_port", "give the ctrl and http ports different numbers", "same as decode.ctrl_port (%d)", c.Decode.CtrlPort)
	}
	k.between("decode.max_inflight", c.Decode.MaxInflight, 1, 256)
	k.oneOf("decode.prefill_precision", c.Decode.PrefillPrec, "float32", "fast")
	k.positive("decode.state_timeout_s", c.Decode.StateTimeoutS)
	k.positive("decode.slot_reserve_ttl_s", c.Decode.SlotReserveTTL)

	k.port("router.port", c.Router.Port, true)
	if u, err := url.Parse(c.Router.VLLMURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		k.bad("router.vllm_url", "write it as http://host:port", "%q is not an http(s) URL", c.Router.VLLMURL)
	}
	for i, d := range c.Router.Decode {
		if _, err := ParseDecodeNode(d); err != nil {
			k.bad(fmt.Sprintf("router.decode[%d]", i), errors.FlattenHints(err), "%v", err)
		}
	}
	k.between("router.queue_size", c.Router.QueueSize, 0, 1<<20)
	k.positive("router.queue_timeout_s", c.Router.QueueTimeoutS)
	if err := parsers.CheckToolParser(c.Router.ToolCallParser); err != nil {
		k.bad("router.tool_call_parser", errors.FlattenHints(err), "%v", err)
	}
	if err := parsers.CheckReasoningParser(c.Router.ReasoningParser); err != nil {
		k.bad("router.reasoning_parser", errors.FlattenHints(err), "%v", err)
	}
	if c.Router.EnableAutoToolChoice && c.Router.ToolCallParser == "" {
		k.bad("router.enable_auto_tool_choice", "set router.tool_call_parser (--tool-call-parser) too", "needs a tool-call parser")
	}
	if c.Router.SpillURL != "" {
		if u, err := url.Parse(c.Router.SpillURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			k.bad("router.spill_url", "write it as http://host:port", "%q is not an http(s) URL", c.Router.SpillURL)
		}
	}
	k.positive("router.health_interval_s", c.Router.HealthIntervalS)

	if c.Sidecar.Socket == "" {
		k.bad("sidecar.socket", "give a filesystem path for the unix socket", "empty")
	}
	k.port("sidecar.metrics_port", c.Sidecar.MetricsPort, true)
	k.between("sidecar.staging_mib", c.Sidecar.StagingMiB, 1, 1<<20)
	k.security(c)

	if len(k.problems) == 0 {
		return nil
	}
	return errors.WithHint(&ValidationError{problems: k.problems},
		"fix the values named above in the config file, environment or flags; `tilert config print` shows where each came from")
}

// DecodeNode is one decode node address as the router takes it.
type DecodeNode struct {
	Host     string
	CtrlPort int
	HTTPPort int
}

func (d DecodeNode) String() string { return fmt.Sprintf("%s:%d:%d", d.Host, d.CtrlPort, d.HTTPPort) }

// ParseDecodeNode parses host:ctrl_port:http_port.
func ParseDecodeNode(s string) (DecodeNode, error) {
	i := strings.LastIndex(s, ":")
	j := -1
	if i > 0 {
		j = strings.LastIndex(s[:i], ":")
	}
	if j <= 0 {
		return DecodeNode{}, errors.WithHint(errors.Newf("decode node %q is not host:ctrl_port:http_port", s),
			"write it like decode-node:5556:5557")
	}
	host := strings.Trim(s[:j], "[]")
	ctrl, err1 := strconv.Atoi(s[j+1 : i])
	http, err2 := strconv.Atoi(s[i+1:])
	if err1 != nil || err2 != nil || ctrl < 1 || ctrl > 65535 || http < 1 || http > 65535 {
		return DecodeNode{}, errors.WithHint(errors.Newf("decode node %q has a bad port", s),
			"both ports must be numbers from 1 to 65535, e.g. decode-node:5556:5557")
	}
	return DecodeNode{Host: host, CtrlPort: ctrl, HTTPPort: http}, nil
}

// ParseDevices reads decode.devices: comma-separated GPU ordinals, one per
// tensor-parallel rank (empty: none given).
func ParseDevices(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 64 {
		return nil, errors.Newf("%d devices (at most 64 ranks)", len(parts))
	}
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, errors.Newf("%q is not a GPU ordinal", strings.TrimSpace(p))
		}
		out[i] = n
	}
	return out, nil
}
