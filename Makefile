# Quickstart: `make demo` (index the bundled corpus under two conditions, query it) and `make test`.
# Both create .venv when missing. Where there is no CUDA, PyTorch's CPU build (torch==2.13.0)
# is installed first so that the package's `torch>=` requirement is already met. Everything else
# is installed at the versions in constraints.txt, those CI last passed with (see `constraints`).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.condsearch-installed
BROWSER_STAMP := $(VENV)/.condsearch-browser-installed
CONSTRAINTS := constraints.txt
DEMO_QUERY := A girl in an orange dress plays tennis

.PHONY: install upgrade constraints demo test test-numerics test-slow test-ray test-browser page-screenshot bench-smoke lint clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if $(BIN)/python -c "import torch" 2>/dev/null; then :; \
	elif command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/python -m pip install -q torch; \
	else $(BIN)/python -m pip install -q torch==2.13.0; fi
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

# the browser extra (Playwright) for the search page's tests; Chromium itself is the system's (Debian: chromium)
$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev,browser]'
	touch $(BROWSER_STAMP)

# constraints.txt pins every package of the dev and browser installs except torch (installed above, a CUDA or a
# CPU build, with its nvidia-*/triton) and condsearch itself, for the Python it was made with (the
# pins carry that python_version marker; on another Python, pip resolves afresh). Refresh it on
# purpose, never on the way: `make upgrade` (today's newest releases that pyproject allows, torch
# kept), then .ci/run; when that passes, `make constraints` and commit the diff, naming what moved.
upgrade:
	test -x $(BIN)/python
	mkdir -p build
	$(BIN)/python -m pip freeze | grep -i '^torch==' > build/torch-kept.txt
	$(BIN)/python -m pip install -q -U --upgrade-strategy eager -c build/torch-kept.txt -e '.[dev,browser]'
	touch $(STAMP)

constraints:
	test -x $(BIN)/python
	{ echo "# Written by \`make constraints\` from a venv that passed .ci/run; \`make install\` installs with it."; \
	  echo "# torch, nvidia-*, cuda-*, triton and condsearch are left out: the Makefile installs torch apart."; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -v -i -E '^(torch|triton|condsearch|nvidia-|cuda-)([=@ ]|$$)' \
	  | sed "s/\$$/ ; python_version == \"$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')\"/"; \
	} > $(CONSTRAINTS).tmp
	mv $(CONSTRAINTS).tmp $(CONSTRAINTS)

demo: $(STAMP)
	$(BIN)/condsearch demo-corpus build/demo_corpus.parquet
	$(BIN)/condsearch index build/demo_corpus.parquet \
		--condition "color of the dress" --condition "the sport being played"
	$(BIN)/condsearch query "$(DEMO_QUERY)" --condition "color of the dress" -k 5
	@echo
	$(BIN)/condsearch query "$(DEMO_QUERY)" --condition "the sport being played" -k 5
	@echo
	@echo "Captions are the text the shipped router learned on. On your own labelled text, condsearch adapt"
	@echo "learns your conditions and reports on rows it kept aside whether it paid (README: Your own conditions)."

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The tests marked numerics (backends, batchings, threads or cache paths compared within float32 tolerances)
# again, under other thread counts and other CPU kernels: torch's own (ATEN_CPU_CAPABILITY), MKL's and
# oneDNN's instruction sets. A tolerance that holds only on this CPU's kernels fails here, not on another CPU.
NUMERICS_RUNS := "CONDSEARCH_TEST_TORCH_THREADS=3 OMP_NUM_THREADS=1" \
	"ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" \
	"ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE"
test-numerics: $(STAMP)
	@set -e; for run in $(NUMERICS_RUNS); do \
		echo "test-numerics: $$run"; \
		env $$run $(BIN)/python -m pytest -q -m 'numerics and not slow and not gpu and not ray and not browser'; \
	done

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# --ray against the local path on a 2-CPU Ray instance (each test starts Ray: minutes, not seconds)
test-ray: $(STAMP)
	$(BIN)/python -m pytest -q -m ray

# the search page at / in Chromium (/usr/bin/chromium, or $$CONDSEARCH_CHROMIUM); skipped, saying why, without one
test-browser: $(BROWSER_STAMP)
	$(BIN)/python -m pytest -q -rs -m browser

# README's picture of the search page: the browser test's demo search, saved as docs/search-page.png
page-screenshot: $(BROWSER_STAMP)
	CONDSEARCH_PAGE_SCREENSHOT=docs/search-page.png $(BIN)/python -m pytest -q -m browser -k ranks_one_query

bench-smoke: $(STAMP)
	$(BIN)/python -m benchmarks.paper.csts --smoke --mode case

# ruff on everything, mypy on the package (its settings are in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check condsearch benchmarks tests tools
	$(BIN)/ruff format --check condsearch benchmarks tests tools
	$(BIN)/mypy

clean:
	rm -rf build
	find indexes -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +  # index links, .versions, temporaries
