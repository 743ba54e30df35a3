// Package config holds the one TOML configuration every tilert role reads.
//
// Values come from, in order of precedence: command-line flags, environment
// variables (TILERT_<SECTION>_<KEY>), the TOML file, and built-in defaults.
// Every key is described once, by the struct tags below; the flag help, the
// environment names, `tilert config print` and tilert.toml.example are all
// derived from them so they cannot drift apart.
package config

// Config is the whole configuration. Sections map to TOML tables.
type Config struct {
	Log      Log      `toml:"log" help:"Logging for every role."`
	Model    Model    `toml:"model" help:"The model served, shared by every role."`
	Transfer Transfer `toml:"transfer" help:"The transfer engine that moves request state from prefill to decode."`
	Convert  Convert  `toml:"convert" help:"tilert convert: HF checkpoint to TileRT weights."`
	Decode   Decode   `toml:"decode" help:"tilert decode: the decode engine node."`
	Router   Router   `toml:"router" help:"tilert router: OpenAI-compatible ingress for the TileRT pool."`
	Sidecar  Sidecar  `toml:"sidecar" help:"tilert connector-sidecar: ships prefill state from vLLM to decode nodes."`
	Security Security `toml:"security" help:"Authentication and limits on every port (docs/SECURITY.md)."`
}

// Log configures log/slog output.
type Log struct {
	Level  string `toml:"level" help:"Log level: debug, info, warn or error."`
	Format string `toml:"format" help:"Log format: text or json."`
}

// Model names the model and where its files are.
type Model struct {
	Name         string `toml:"name" help:"Model family: glm5 (glm-5, glm-5.1) or deepseek-v3.2 (dsv32)."`
	Path         string `toml:"path" help:"HF model directory (config.json, tokenizer); the router reads the tokenizer from it."`
	WeightsDir   string `toml:"weights_dir" help:"Directory of converted TileRT weights (output of tilert convert)."`
	MaxSeqLen    int    `toml:"max_seq_len" help:"Longest sequence (prompt + generated tokens) a request may reach."`
	KVCacheDType string `toml:"kv_cache_dtype" help:"Decode-side MLA cache: fp8 (vLLM fp8_ds_mla, 656 B/token/layer) or bf16 (1152 B/token/layer)."`
	WithMTP      bool   `toml:"with_mtp" help:"Use the MTP layer for speculative decoding (vLLM prefill must run with the MTP speculative config)."`
}

// Transfer selects the one-sided write engine.
type Transfer struct {
	Engine  string `toml:"engine" help:"Transfer engine: tcp (built in, any network) or nixl (NVIDIA NIXL over UCX)."`
	Listen  string `toml:"listen" help:"Decode side: host:port the transfer engine listens on (tcp); port 0 picks a free port; empty: decode.host's bind address, port 0."`
	Streams int    `toml:"streams" help:"Parallel TCP streams per peer for the tcp engine."`
	NixlLib string `toml:"nixl_lib" help:"Path to libnixl_capi.so; empty searches Python site-packages (nixl-cu12/nixl-cu13 wheels)."`
}

// Convert configures tilert convert.
type Convert struct {
	ModelDir  string `toml:"model_dir" help:"HF checkpoint directory to convert (safetensors shards + config.json)."`
	SaveDir   string `toml:"save_dir" help:"Output directory for TileRT weights; written as SAVE_DIR.partial and renamed when complete."`
	Devices   int    `toml:"devices" help:"Number of GPUs the weights are laid out for (experts grouped per device)."`
	AppendMTP bool   `toml:"append_mtp" help:"Convert the MTP layer too (needed for decode --with-mtp)."`
	Force     bool   `toml:"force" help:"Replace an existing output directory."`
}

// Decode configures the decode node.
type Decode struct {
	Engine         string  `toml:"engine" help:"Decode engine implementation; tilert is the only one."`
	Device         string  `toml:"device" help:"Compute device: auto (the GPU when one is usable, else the CPU, with a warning), cuda (require the GPU) or cpu (the pure-Go reference backend). generate and bench take the same values and default."`
	Devices        string  `toml:"devices" help:"GPUs of this decode node, one per tensor-parallel rank, e.g. 0,1,2,3,4,5,6,7 (each GPU driven by its own thread); empty: GPU 0, unsharded. An ordinal repeated (0,0,0,0) runs several ranks on one GPU (tests). Needs device cuda or auto."`
	Comm           string  `toml:"comm" help:"Collective between the ranks of decode.devices: auto (oneshot on one GPU, nccl across GPUs), oneshot (the all-reduce fused with the residual add and RMSNorm in one kernel; ranks on one GPU, or one rank per GPU reading its peers' buffers over peer-mapped memory after a flag barrier), local (add and copy kernels on one GPU, host memory across GPUs) or nccl (one rank per GPU)."`
	Host           string  `toml:"host" help:"Address the ctrl and http ports bind to; empty: 0.0.0.0 with security.secret_file set, else 127.0.0.1."`
	CtrlPort       int     `toml:"ctrl_port" help:"Ctrl port: state handoff protocol with the connector sidecar (0: kernel-chosen)."`
	HTTPPort       int     `toml:"http_port" help:"HTTP port: /pd/decode token streams, /health, /metrics (0: kernel-chosen)."`
	MaxInflight    int     `toml:"max_inflight" help:"Requests decoded together in one batched step; 1 is latency-optimal."`
	PrefillPrec    string  `toml:"prefill_precision" help:"Arithmetic of prompts this node prefills itself (states from vLLM arrive prefilled): float32 (products exact: greedy tokens equal the CPU engine's) or fast (x rounded once to fp16 per GEMM and the MLA operands once, as a bf16 prefill; GPU serving mode, ~3.5x faster). generate and bench take --prefill-precision too."`
	StateTimeoutS  float64 `toml:"state_timeout_s" help:"Seconds /pd/decode waits for a request's state before 504 kv_transfer_timeout."`
	SlotReserveTTL float64 `toml:"slot_reserve_ttl_s" help:"Seconds an admitted slot may wait for its writes before it expires."`
}

// Router configures the OpenAI-compatible ingress.
type Router struct {
	Host           string   `toml:"host" help:"Address the router binds to; empty: 0.0.0.0 with API keys (router.api_keys_file) set, else 127.0.0.1."`
	Port           int      `toml:"port" help:"Port of the OpenAI-compatible API (0: kernel-chosen)."`
	VLLMURL        string   `toml:"vllm_url" help:"Base URL of the vLLM prefill server."`
	Decode         []string `toml:"decode" help:"Decode nodes as host:ctrl_port:http_port; repeat the flag for several."`
	QueueSize      int      `toml:"queue_size" help:"Requests that may wait for a free decode slot; past it, 429 with Retry-After."`
	QueueTimeoutS  float64  `toml:"queue_timeout_s" help:"Seconds a queued request waits for a slot before 429."`
	ServedModel    string   `toml:"served_model_name" help:"Model name clients send and responses report; empty uses vLLM's served name, else the model path's base name."`
	APIKeysFile    string   `toml:"api_keys_file" help:"File of API keys (one a line, mode 0600) clients must send as Authorization: Bearer KEY; empty with api_key empty: no key needed."`
	APIKey         string   `toml:"api_key" help:"One API key clients must send as Bearer (like vLLM's --api-key); prefer api_keys_file or the environment, a flag shows in ps. Never printed."`
	TLSCert        string   `toml:"tls_cert" help:"PEM certificate (chain) for HTTPS on the router's port; with tls_key. Empty: plain HTTP."`
	TLSKey         string   `toml:"tls_key" help:"PEM private key for tls_cert."`
	KeyConcurrency int      `toml:"max_concurrent_per_key" help:"Requests one API key may have in flight at once; past it, 429 naming this limit (0: no per-key limit)."`
	MaxBodyBytes   int      `toml:"max_body_bytes" help:"Largest request body the router reads; larger ones get 413 before anything is forwarded."`
	// Named as vLLM's flags, so a vLLM command line's tool and reasoning
	// settings carry over to the router unchanged.
	ToolCallParser       string  `toml:"tool_call_parser" help:"Tool-call format the router parses from decoded text, as vLLM's --tool-call-parser: glm47 (GLM-4.7, GLM-5), glm45 or deepseek_v32; empty: requests with tools are refused or spilled."`
	ReasoningParser      string  `toml:"reasoning_parser" help:"Reasoning format split into reasoning_content, as vLLM's --reasoning-parser: glm45 (GLM), deepseek_v3 (DeepSeek-V3.2, with chat_template_kwargs.thinking) or deepseek_r1; empty: none."`
	EnableAutoToolChoice bool    `toml:"enable_auto_tool_choice" help:"Allow tool_choice \"auto\" (needs tool_call_parser), as vLLM's --enable-auto-tool-choice."`
	SpillURL             string  `toml:"spill_url" help:"Native vLLM P/D endpoint that takes, unchanged, requests the TileRT pool would refuse (full, no node up, n > 1, best_of, echo, structured output); empty refuses them."`
	HealthIntervalS      float64 `toml:"health_interval_s" help:"Seconds between health checks of each decode node; a failing node is retried with backoff up to 30 s."`
}

// Sidecar configures the process beside vLLM prefill.
type Sidecar struct {
	Socket      string `toml:"socket" help:"Unix socket the vLLM connector plugin talks to."`
	MetricsPort int    `toml:"metrics_port" help:"Port for /metrics and /health; 0 disables it."`
	MetricsHost string `toml:"metrics_host" help:"Address the metrics port binds to; empty: 0.0.0.0 with security.secret_file set, else 127.0.0.1."`
	StagingMiB  int    `toml:"staging_mib" help:"Staging memory (files in /dev/shm) for requests waiting to ship, in MiB; past it new stages are refused."`
}

// Security is authentication and the limits every server applies.
type Security struct {
	SecretFile      string  `toml:"secret_file" help:"File with the shared secret (at least 16 bytes, mode 0600) decode nodes, sidecars and dev tools prove on the ctrl and transfer data ports (HMAC-SHA256 challenge-response). Empty: no authentication, and listeners default to loopback."`
	PDTokenFile     string  `toml:"pd_token_file" help:"File of bearer tokens (one a line, mode 0600) the decode node's /pd/* endpoints accept; the router presents the first. Empty: a token derived from secret_file, or none without a secret."`
	MaxConns        int     `toml:"max_conns" help:"Connections each listener (ctrl, transfer data, http, sidecar socket) holds at once; past it new ones are closed at once."`
	MaxConnsPerPeer int     `toml:"max_conns_per_peer" help:"Connections one remote IP may hold on each TCP listener; past it its new ones are closed at once."`
	ReadTimeoutS    float64 `toml:"read_timeout_s" help:"Seconds a handshake, a started ctrl frame or an HTTP request (headers and body) may take to arrive; slower peers are cut off (slowloris)."`
	IdleTimeoutS    float64 `toml:"idle_timeout_s" help:"Seconds a connection may sit idle between frames, writes or HTTP requests before it is closed."`
	WriteTimeoutS   float64 `toml:"write_timeout_s" help:"Seconds one reply frame or non-streamed HTTP response may take to be written to a peer that does not read."`
	MaxFrameBytes   int     `toml:"max_frame_bytes" help:"Largest ctrl or sidecar-socket frame after authentication (an admit with prompt token ids); before it, frames are capped at 4096 bytes."`
	AdmitsPerS      float64 `toml:"admits_per_s" help:"Admits per second one ctrl peer (remote IP) may send, with as many in a burst; past it the admit is rejected busy naming this limit (0: no limit)."`
	CancelledRIDs   int     `toml:"cancelled_rids" help:"Cancelled request ids a decode node remembers (each is refused for a minute); past it the oldest are forgotten."`
	MaxRIDBytes     int     `toml:"max_rid_bytes" help:"Longest request id (printable ASCII) the ctrl and http ports take."`
	MaxBodyBytes    int     `toml:"max_body_bytes" help:"Largest HTTP request body on the decode node's http port and the sidecar's metrics port."`
	MaxHeaderBytes  int     `toml:"max_header_bytes" help:"Largest HTTP request header block on every HTTP port."`
}

// Default returns the built-in defaults. The values match the launch post's
// command lines where those set one.
func Default() *Config {
	return &Config{
		Log:   Log{Level: "info", Format: "text"},
		Model: Model{Name: "glm5", MaxSeqLen: 202752, KVCacheDType: "fp8", WithMTP: false},
		Transfer: Transfer{
			Engine: "tcp", Listen: "", Streams: 4,
		},
		Convert: Convert{Devices: 1, AppendMTP: true},
		Decode: Decode{
			Engine: "tilert", Device: "auto", Host: "", Comm: "auto",
			CtrlPort: 5556, HTTPPort: 5557, MaxInflight: 1, PrefillPrec: "float32",
			StateTimeoutS: 30, SlotReserveTTL: 10,
		},
		Router: Router{
			Host: "", Port: 23333, VLLMURL: "http://127.0.0.1:8000",
			QueueSize: 64, QueueTimeoutS: 30, Decode: []string{},
			KeyConcurrency: 64, MaxBodyBytes: 4 << 20, HealthIntervalS: 1,
		},
		Sidecar: Sidecar{Socket: "/tmp/tilert-sidecar.sock", MetricsPort: 5558, StagingMiB: 4096},
		Security: Security{
			MaxConns: 1024, MaxConnsPerPeer: 128, ReadTimeoutS: 10, IdleTimeoutS: 300, WriteTimeoutS: 30,
			MaxFrameBytes: 16 << 20, AdmitsPerS: 1000, CancelledRIDs: 65536, MaxRIDBytes: 128,
			MaxBodyBytes: 64 << 10, MaxHeaderBytes: 16 << 10,
		},
	}
}
