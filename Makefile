# Two commands for a newcomer: `make run` (the daemon on its default config) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
DEMO   := var/demo

.PHONY: setup run test lint bench clean

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[cpu,video,dev]'
	# Only the PP-OCR model files of this wheel are used (tests, benchmarks): skip its deps,
	# which would pull a second OpenCV build.
	$(BIN)/pip install --quiet --no-deps rapidocr-onnxruntime
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

# The daemon on the default config, with the demo model repository and local state under var/.
run: setup
	@test -d $(DEMO)/models || $(BIN)/python tools/make_test_models.py $(DEMO)/models
	$(BIN)/edged run --config deploy/edged.yaml --models-dir $(DEMO)/models \
		--cache-dir $(DEMO)/cache --socket $(DEMO)/edged.sock

lint: setup
	$(BIN)/ruff check edged tools tests
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/edged bench core
	$(BIN)/edged bench api

clean:
	rm -rf $(VENV) var bench-results
