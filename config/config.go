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
	Listen  string `toml:"listen" help:"Decode side: host:port the transfer engine listens on (tcp); port 0 picks a free port."`
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
	Device         string  `toml:"device" help:"Compute device: cuda or cpu (the pure-Go reference backend)."`
	Host           string  `toml:"host" help:"Address the ctrl and http ports bind to."`
	CtrlPort       int     `toml:"ctrl_port" help:"Ctrl port: state handoff protocol with the connector sidecar (0: kernel-chosen)."`
	HTTPPort       int     `toml:"http_port" help:"HTTP port: /pd/decode token streams, /health, /metrics (0: kernel-chosen)."`
	MaxInflight    int     `toml:"max_inflight" help:"Requests decoded together in one batched step; 1 is latency-optimal."`
	StateTimeoutS  float64 `toml:"state_timeout_s" help:"Seconds /pd/decode waits for a request's state before 504 kv_transfer_timeout."`
	SlotReserveTTL float64 `toml:"slot_reserve_ttl_s" help:"Seconds an admitted slot may wait for its writes before it expires."`
}

// Router configures the OpenAI-compatible ingress.
type Router struct {
	Host          string   `toml:"host" help:"Address the router binds to."`
	Port          int      `toml:"port" help:"Port of the OpenAI-compatible API (0: kernel-chosen)."`
	VLLMURL       string   `toml:"vllm_url" help:"Base URL of the vLLM prefill server."`
	Decode        []string `toml:"decode" help:"Decode nodes as host:ctrl_port:http_port; repeat the flag for several."`
	QueueSize     int      `toml:"queue_size" help:"Requests that may wait for a free decode slot; past it, 429 with Retry-After."`
	QueueTimeoutS float64  `toml:"queue_timeout_s" help:"Seconds a queued request waits for a slot before 429."`
	ServedModel   string   `toml:"served_model_name" help:"Model name clients send and responses report; empty uses vLLM's served name, else the model path's base name."`
}

// Sidecar configures the process beside vLLM prefill.
type Sidecar struct {
	Socket      string `toml:"socket" help:"Unix socket the vLLM connector plugin talks to."`
	MetricsPort int    `toml:"metrics_port" help:"Port for /metrics and /health; 0 disables it."`
	StagingMiB  int    `toml:"staging_mib" help:"Staging memory (files in /dev/shm) for requests waiting to ship, in MiB; past it new stages are refused."`
}

// Default returns the built-in defaults. The values match the launch post's
// command lines where those set one.
func Default() *Config {
	return &Config{
		Log:   Log{Level: "info", Format: "text"},
		Model: Model{Name: "glm5", MaxSeqLen: 202752, KVCacheDType: "fp8", WithMTP: false},
		Transfer: Transfer{
			Engine: "tcp", Listen: "0.0.0.0:0", Streams: 4,
		},
		Convert: Convert{Devices: 1, AppendMTP: true},
		Decode: Decode{
			Engine: "tilert", Device: "cuda", Host: "0.0.0.0",
			CtrlPort: 5556, HTTPPort: 5557, MaxInflight: 1,
			StateTimeoutS: 30, SlotReserveTTL: 10,
		},
		Router: Router{
			Host: "0.0.0.0", Port: 23333, VLLMURL: "http://127.0.0.1:8000",
			QueueSize: 64, QueueTimeoutS: 30, Decode: []string{},
		},
		Sidecar: Sidecar{Socket: "/tmp/tilert-sidecar.sock", MetricsPort: 5558, StagingMiB: 4096},
	}
}
