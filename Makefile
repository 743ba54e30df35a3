# TileRT-Go. `make demo` runs the main job on the embedded tiny model (CPU);
# `make test` runs the tests. Both work on a fresh clone.
GO      ?= go
BIN     ?= tilert
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/tilert-go/tilert/internal/buildinfo.Version=$(VERSION) \
           -X github.com/tilert-go/tilert/internal/buildinfo.Commit=$(COMMIT)
DEMO    ?= .demo

.PHONY: build test test-python test-vllm lint bench demo gpu-check hf-bench clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) .

# go test's JSON goes through internal/testsum: a line per package, the
# output of failed tests, and at the end every skipped test with its reason
# (GPU-only tests, NIXL without its library, goldens not generated yet...).
# -timeout 30m: the kernel and engine packages' emulator tests take 5-9
# minutes on a loaded 2-core machine, near go test's 10-minute default.
test: lint
	$(GO) test -json -timeout 30m ./... | $(GO) run ./internal/testsum
	@$(MAKE) --no-print-directory test-python

# The vLLM connector plugin's tests (python/): CPU torch + pytest, no vLLM
# (tests/fake_vllm stands in). Skipped, saying so, where no python has both.
PYTEST_PY ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import torch, pytest' 2>/dev/null && { command -v $$p; break; }; done)
test-python:
	@if [ -z "$(PYTEST_PY)" ]; then \
	  echo "== python (vLLM connector plugin, python/tests): SKIPPED: no python3 with torch and pytest (apt-get install python3-torch python3-pytest; .ci/run installs them)"; \
	else \
	  echo "== python (vLLM connector plugin, python/tests) with $(PYTEST_PY):"; \
	  PYTHONDONTWRITEBYTECODE=1 $(PYTEST_PY) -m pytest -q -p no:cacheprovider -rs python/tests; \
	fi

# The connector plugin inside real vLLM 0.33.0 (CPU): vLLM's config, KV-cache
# planning and allocation, Scheduler/AsyncScheduler, connector factory and V2
# worker wrapper; the stand-in's drift check; the Go end-to-end test through
# the real sidecar with vLLM's own base class; and (the venv has transformers)
# scripts/hf_bench.py end to end on the CPU (python/tests/test_hf_bench.py).
# The venv is built once at VLLM_VENV (scripts/vllm-venv.sh, ~1.5 min,
# ~6.6 GB) and reused; where it cannot be built the target says why and skips.
VLLM_VENV ?= /opt/tilert-vllm-venv
test-vllm:
	@if ! ./scripts/vllm-venv.sh $(VLLM_VENV) >.vllm-venv.log 2>&1; then \
	  echo "test-vllm: SKIPPED: the vLLM 0.33.0 venv could not be built at $(VLLM_VENV):"; \
	  tail -n 5 .vllm-venv.log | sed 's/^/  /'; \
	else \
	  tail -n 1 .vllm-venv.log; \
	  PYTHONDONTWRITEBYTECODE=1 VLLM_TARGET_DEVICE=cpu $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider python/tests && \
	  PATH=$(VLLM_VENV)/bin:$$PATH VLLM_TARGET_DEVICE=cpu $(GO) test -count=1 -run 'PythonPlugin' ./roles/prefillshim; \
	fi

# staticcheck is fetched through the Go module proxy (pinned); where it
# cannot be, lint says so and goes on.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if $(GO) run $(STATICCHECK) -version >/dev/null 2>&1; then \
	  echo "== staticcheck ($(STATICCHECK))"; $(GO) run $(STATICCHECK) ./...; \
	else \
	  echo "== staticcheck: SKIPPED: $(STATICCHECK) could not be fetched (no Go module proxy?)"; \
	fi

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The main job on the embedded default: a tiny synthetic model on the CPU.
demo: build
	./scripts/demo.sh ./$(BIN) $(DEMO)

# Every GPU kernel and model check on an NVIDIA GPU (run on the H200).
gpu-check:
	./scripts/gpu-check.sh

# HF transformers vs tilert on the deepseek-v3.2-moe checkpoint (GPU; scripts/README.md).
HF_BENCH_DIR ?= .device/hf-bench
hf-bench: build
	mkdir -p $(HF_BENCH_DIR)
	python3 scripts/hf_bench.py --tilert ./$(BIN) --preset deepseek-v3.2-moe --model-dir $(HF_BENCH_DIR)/ds-moe \
	  --contexts 1024,8192 --tokens 32 --before 1024 --json $(HF_BENCH_DIR)/hf-bench.json

clean:
	rm -rf $(BIN) $(DEMO)
