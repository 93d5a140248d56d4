# chexnet-at-scale: `make tutorial` runs everything, `make test` checks everything.
SHELL := /bin/bash
# PYTHON: the interpreter `make setup` makes the venv with; unset, it takes the newest
# python3.13/3.12/3.11/3.10/python3 on PATH that TensorFlow supports (scripts/python_choice.sh).
PYTHON ?=
VENV ?= .venv
ifeq ($(CONDA),1)
  PY := $(CONDA_PREFIX)/bin/python
else
  PY := $(abspath $(VENV))/bin/python
endif
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
BUILD ?= build
PYTEST_ARGS ?=

export PYTHON VENV
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYDEVD_DISABLE_FILE_VALIDATION = 1
# (no MPLBACKEND: a kernel with MPLBACKEND set, Agg say, shows no figure inline; matplotlib
# picks Agg by itself where there is no display, and the tests that draw choose it)

.PHONY: help setup lint test unit tf mpi notebooks tutorial book book-check lab browser-check data bench bench-cluster bench-preset fresh-check nonroot-check gpu-build-check gpu-smoke lock python-matrix clean distclean

help:
	@echo "make tutorial   set up, make the sample data, run every notebook, print the results"
	@echo "make test       set up, run tests/ on 2 parallel workers, then every notebook under nbval alone"
	@echo "make lab        set up and start JupyterLab with the project kernel, in a network namespace of your own (PRIVATE=1: on a Unix socket for ssh -L)"
	@echo "make book       the executed course as a static site -> $(BUILD)/book/index.html (after make tutorial; offline)"
	@echo "make book-check the site opened page by page in headless Chromium (links, figures, search)"
	@echo "make browser-check  every notebook in headless Chromium, a learner's session (run, interrupt, restart, sidebar) -> $(BUILD)/browser/*.png"
	@echo "make lint       ruff, the import layers (import-linter) and mypy; make test runs it first"
	@echo "make setup      only the environment (idempotent)"
	@echo "make data       only the synthetic data set for CHEXNET_SCALE (default ci)"
	@echo "make bench      conversion, old vs new pipeline, tf.data service, Horovod scaling -> $(BUILD)/bench-*.json"
	@echo "make bench-cluster  MPICluster start + stop: ipyparallel's and Open MPI's defaults vs the project's, side by side"
	@echo "make bench-preset  notebooks 02 and 07 with 8 and with 5 timed batches, alternating: does a shorter ci preset still show their effects?"
	@echo "make fresh-check  (root) make setup + notebook 00 in a bare Debian chroot, then removed (SUITE=bookworm|trixie)"
	@echo "make nonroot-check  (root) unit tests, notebook 00 and an engine cluster as a new normal user beside another account"
	@echo "make gpu-build-check  the GPU stack (CUDA TensorFlow, Horovod + NCCL) built in .venv-gpu and checked, no GPU needed"
	@echo "make gpu-smoke  on a GPU node: notebook 03 to section 4, the minimal script on every GPU, bench gpu-node quick (CPU=1: the CPU stand-in)"
	@echo "make setup GPU=1  the GPU build in .venv (automatic where nvidia-smi -L lists GPUs)"
	@echo "make setup PYTHON=python3.12  the venv made with that Python (3.10-3.13; default: the newest on PATH)"
	@echo "make lock       rewrite requirements/lock/ (hash-locked pins) for every supported Python"
	@echo "make python-matrix  setup, horovodrun --check-build, unit + tf layers, notebook 00 with Python 3.10, 3.12, 3.13"

setup:
	@bash scripts/setup.sh

# make test in two stages (both always run; it fails if either failed):
#   1. tests/ on TEST_WORKERS pytest-xdist workers (default 2): most of those tests wait on
#      engines, daemons, subprocesses and browsers, so a second worker fills the waits; tests
#      that must not run side by side share a worker (XDIST_GROUPS in tests/conftest.py);
#   2. every notebook under nbval in one serial process, with nothing else running: their
#      cells time pipelines, training steps and allreduces (conftest.py refuses notebooks
#      under xdist). What nbval executes is saved in $(BUILD)/test/executed (emptied first;
#      CHEXNET_SAVE_EXECUTED), and the stage ends with the course site built from it and checked
#      in Chromium (tests/notebooks/test_course_site.py: $(BUILD)/test/book, screenshots in
#      $(BUILD)/browser). make tutorial's executed/ and book/ are left alone.
#      Its closing table adds stage 1's wall time (handed over in a temporary file) and
#      judges the total against the 15-minute budget.
TEST_WORKERS ?= 2
# PRIVATE_NET: run a command in a network namespace of this user's own with only loopback up
# (python -m chexnet_utils.platform.exposure private; no root needed): the tf.data service and
# the MultiWorkerMirroredStrategy server, which run any graph a client sends, start only there
# (or with CHEXNET_ALLOW_SHARED_HOST=1), and mpiexec's listener on "every interface" is on that
# namespace's only. make test, make tutorial, make notebooks, make mpi and make lab use it.
PRIVATE_NET = "$(PY)" -m chexnet_utils.platform.exposure private --
# (make test's tests stage: each pytest-xdist worker in a namespace of its own, as its python,
# so that a test that adds a link to its namespace (tests/mpi/test_remote_engines.py) changes
# nothing for the other worker's servers)
# make lint (make test's first step, about ten seconds): ruff (pycodestyle, pyflakes, bugbear,
# complexity, import order, no private imports across modules: [tool.ruff] in pyproject.toml),
# import-linter (the package's layers, function-local imports included:
# [tool.importlinter]) and mypy (the package's types: [tool.mypy]). None leaves a cache
# folder behind.
lint: setup
	"$(PY)" -m ruff check --no-cache chexnet_utils tests conftest.py scripts
	"$(patsubst %/python,%/lint-imports,$(PY))" --no-cache
	"$(PY)" -m mypy

test: setup lint
	@times=$$(mktemp); trap 'rm -f "$$times"' EXIT; rc=0; \
	CHEXNET_TEST_TIMES="$$times" "$(PY)" -m pytest tests \
	  --tx "$(TEST_WORKERS)*popen//python='$(PY)' -m chexnet_utils.platform.exposure private -- '$(PY)'" \
	  --dist loadscope --durations=25 $(PYTEST_ARGS) || rc=$$?; \
	CHEXNET_TEST_TIMES="$$times" CHEXNET_SAVE_EXECUTED="$(abspath $(BUILD))/test/executed" \
	  CHEXNET_EXECUTED_DIR="$(abspath $(BUILD))/test/executed" \
	  CHEXNET_BROWSER_SHOTS="$(abspath $(BUILD))/browser" \
	  $(PRIVATE_NET) "$(PY)" -m pytest $(NOTEBOOKS) tests/notebooks/test_course_site.py \
	  --nbval-lax --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=0 $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" != 0 ]; then echo "make test: FAILED (a stage above failed; exit $$rc)"; fi; \
	exit $$rc

# The test layers (tests/conftest.py marks each test with its folder): `make unit` is the
# fast pure layer (no TensorFlow, no MPI; under a minute), `make tf` the in-process
# TensorFlow tests, `make mpi` the MPI, engine, service and kill tests. `make test` runs all.
unit: setup
	"$(PY)" -m pytest tests/unit $(PYTEST_ARGS)

tf: setup
	"$(PY)" -m pytest tests/tf $(PYTEST_ARGS)

mpi: setup
	$(PRIVATE_NET) "$(PY)" -m pytest tests/mpi $(PYTEST_ARGS)

notebooks: setup
	$(PRIVATE_NET) "$(PY)" -m pytest $(NOTEBOOKS) --nbval-lax --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg --durations=0 $(PYTEST_ARGS)

data: setup
	"$(PY)" -m chexnet_utils data

tutorial: setup data
	$(PRIVATE_NET) "$(PY)" -m chexnet_utils tutorial --out "$(BUILD)" $(NOTEBOOKS)

# Benchmarks (numbers for docs/benchmarks.md): the data set's full-size TFRecords, converted
# once by the same code the notebooks use (build/tfrecords-full), then
#   conversion: images/s with 1 worker vs all cores (original bytes and resized to 320 px)
#   pipelines:  old vs new tf.data pipeline, decode ceiling, idle fractions, and the share of
#               a 100 ms emulated accelerator's time spent waiting for data
#   service:    a one-core trainer decoding locally vs fed by a tf.data service worker
#   scaling:    Horovod images/s on 1..N MPI engines, old vs new pipeline, efficiency
BENCH_WORKERS ?= 1,2

bench: setup data
	CHEXNET_WORK_DIR="$(BUILD)" "$(PY)" -c 'from chexnet_utils.data.prepare import prepare_tfrecords; prepare_tfrecords()'
	"$(PY)" -m chexnet_utils bench conversion --json "$(BUILD)/bench-conversion.json" --data-dir \
	  "$$("$(PY)" -c 'from chexnet_utils.config import data_dir; print(data_dir())')"
	"$(PY)" -m chexnet_utils bench pipelines --tfrecords "$(BUILD)/tfrecords-full" \
	  --emulate-accelerator 100 --json "$(BUILD)/bench-pipelines.json"
	$(PRIVATE_NET) "$(PY)" -m chexnet_utils bench service --json "$(BUILD)/bench-service.json"
	"$(PY)" -m chexnet_utils bench scaling --workers $(BENCH_WORKERS) --emulate-accelerator 20 \
	  --tfrecords "$(BUILD)/tfrecords-full" --json "$(BUILD)/bench-scaling.json"

# How long a cluster of engines takes to start and stop (every notebook from 04 on and many
# tests start several): the controller's heartbeat and mpiexec's kill sequence, side by side.
bench-cluster: setup
	"$(PY)" scripts/bench_cluster.py --repeats 3 --json "$(BUILD)/bench-cluster.json"
	"$(PY)" scripts/bench_cluster.py --repeats 3 --busy --json "$(BUILD)/bench-cluster-busy.json"

# Does a shorter ci preset still show the notebooks' effects? Notebook 02 runs whole,
# alternately with the timed batches the preset had (8) and those it has now (5), and notebook
# 07 with 8 and 5 (the trim it did not take: its cache speed-up moved; config.Scale's
# docstrings). scripts/bench_preset.py: every run's headline figures, medians and spreads.
bench-preset: setup data
	"$(PY)" scripts/bench_preset.py --notebook 02_input_pipeline_old_vs_new --record 02_input_pipeline \
	  --a CHEXNET_BENCH_BATCHES=8 --b CHEXNET_BENCH_BATCHES=$(PRESET_BATCHES) --repeats 2 \
	  --keys new_over_old new_over_ceiling idle_fraction_old idle_fraction_new \
	  emulated_gpu_wait_old emulated_gpu_wait_new --json "$(BUILD)/bench-preset-02.json"
	"$(PY)" scripts/bench_preset.py --notebook 07_feeding_at_scale --record 07_feeding_at_scale \
	  --a CHEXNET_FEEDING_BATCHES=8 --b CHEXNET_FEEDING_BATCHES=5 --repeats 2 \
	  --keys cache_speedup tfdata_img_per_s service_over_local --json "$(BUILD)/bench-preset-07.json"
PRESET_BATCHES ?= $(shell "$(PY)" -c 'from chexnet_utils.config import SCALES; print(SCALES["ci"].bench_batches)' 2>/dev/null)

# JupyterLab offering only the project kernel, with ipyparallel's sidebar (chexnet_utils/lab.py),
# in a network namespace of your own made without root, with everything it starts (kernels,
# MPI engines and mpiexec, the tf.data service, the MultiWorkerMirroredStrategy server), so no
# other account or host can reach any of it; JupyterLab listens there on a Unix socket and
# http://127.0.0.1:8888/lab?token=... (printed) is forwarded to it (the next free port when
# 8888 is taken; LAB_ARGS="--port 8801" to choose). Extra options through LAB_ARGS.
# PRIVATE=1 (a remote host): the same namespace, JupyterLab on a Unix socket only (mode 0600;
# LAB_SOCKET, default $(BUILD)/lab.sock), reached with ssh -L 8888:<socket> you@host, then the
# http://127.0.0.1:8888/lab?token=... it prints (the host part of its URL aside).
# LAB_NETWORK=host: the lab in the host's network (the two servers above then refuse to start
# unless CHEXNET_ALLOW_SHARED_HOST=1).
LAB_ARGS ?=
PRIVATE ?=
LAB_SOCKET ?=
LAB_NETWORK ?= private
lab: setup
ifeq ($(PRIVATE),1)
	mkdir -p "$(BUILD)"
	sock="$(LAB_SOCKET)"; [ -n "$$sock" ] || sock="$$(cd "$(BUILD)" && pwd)/lab.sock"; \
	echo "JupyterLab on $$sock: from your laptop, ssh -L '8888:$$sock' $$USER@$$(hostname)"; \
	exec $(PRIVATE_NET) "$(PY)" -m chexnet_utils.lab \
	  --notebook-dir=notebooks --ServerApp.sock="$$sock" $(LAB_ARGS)
else ifeq ($(LAB_NETWORK),host)
	"$(PY)" -m chexnet_utils.lab --notebook-dir=notebooks $(LAB_ARGS)
else
	"$(PY)" -m chexnet_utils.lab --private --notebook-dir=notebooks $(LAB_ARGS)
endif

# The same JupyterLab headless; Chromium opens each notebook, checks its title and kernel,
# and saves build/browser/NN_*.png; then a learner's session: notebook 00 run with Run All,
# a scratch notebook's MPI cluster and %%px cells, Interrupt, Kernel > Restart, the tab
# closed, a cluster from the IPython Parallel sidebar, the browser closed, each checked for
# leftover processes by pid (build/browser/learner-*.png). Also part of `make test`.
# make book: the executed course as a static site, $(BUILD)/book/index.html (Sphinx, MyST-NB
# and sphinx-book-theme, pinned in requirements/base.txt; chexnet_utils.notebook.book), built
# from the notebooks make tutorial (or make test) executed in $(BUILD)/executed: nothing is run
# again. Offline: no download at build or view time; a broken internal link, a missing figure
# or a request to another host fails it. REPO_URL=https://... adds a repository button.
# make book-check: the site built again the same way (REPO_URL too) and opened page by page in
# headless Chromium (links, figures, search, collapsed blocks, no outside request; screenshots
# in $(BUILD)/browser; skipped, with the reason printed, where Chromium is missing).
book: setup
	"$(PY)" -m chexnet_utils book --executed "$(BUILD)/executed" --out "$(BUILD)" \
	  $(if $(REPO_URL),--repo-url "$(REPO_URL)")
	@echo "open $(abspath $(BUILD))/book/index.html, or serve it: $(PY) -m http.server -d $(BUILD)/book -b 127.0.0.1"

book-check: setup
	CHEXNET_EXECUTED_DIR="$(abspath $(BUILD))/executed" CHEXNET_BROWSER_SHOTS="$(abspath $(BUILD))/browser" \
	  CHEXNET_BOOK_REPO_URL="$(REPO_URL)" \
	  "$(PY)" -m pytest tests/notebooks/test_course_site.py -s -rs $(PYTEST_ARGS)

browser-check: setup
	CHEXNET_BROWSER_SHOTS="$(BUILD)/browser" "$(PY)" -m pytest tests/notebooks/test_browser.py \
	  tests/notebooks/test_learner_session.py $(PYTEST_ARGS)

# The README's commands on a bare Debian (debootstrap minbase + python3 make git
# ca-certificates): make setup and notebook 00 in a chroot of this commit, then everything
# unmounted and removed (scripts/fresh_check.sh; SUITE=bookworm: Debian 12, Python 3.11;
# SUITE=trixie: Debian 13, Python 3.13; FRESH_NO_CACHE=1 builds Horovod there too,
# FRESH_KEEP=1 keeps the root). Needs root; CI runs it on both after make test.
SUITE ?= bookworm
fresh-check:
	@SUITE="$(SUITE)" bash scripts/fresh_check.sh

# requirements/lock/py3XX-{cpu,gpu,no-deps}.txt from the pins in requirements/*.txt, for every
# Python setup accepts, with the sha256 of each file the package indexes serve
# (scripts/lock_requirements.py; interpreters: pythonX.Y on PATH, else pyenv's, or
# LOCK_ARGS="--python 3.10=/path/to/python3.10 ..."). Run it after changing a pin.
LOCK_ARGS ?=
lock:
	python3 scripts/lock_requirements.py $(LOCK_ARGS)

# Other Pythons on this machine (#26): for each of PYTHON_MATRIX, a venv .venv-py3XX made by
# make setup with it (KERNEL_USER=0), horovodrun --check-build (MPI and Gloo), the unit and
# TensorFlow layers and notebook 00, with the time of each step (scripts/python_matrix.sh).
PYTHON_MATRIX ?= 3.10 3.12 3.13
python-matrix:
	@PYTHON_MATRIX="$(PYTHON_MATRIX)" bash scripts/python_matrix.sh

# The package as a normal user on a multi-user host (#30; needs root, CI runs it after
# make test): a learner account and another account holding an Open MPI shared-memory
# segment with a process running; as the learner the unit layer, notebook 00, one
# engine-cluster test and the local Slurm's daemons as the learner; both accounts and their
# files removed and checked (scripts/nonroot_check.sh).
nonroot-check: setup
	@PY="$(PY)" bash scripts/nonroot_check.sh

# The GPU stack on a CPU-only machine: GPU=1 setup into .venv-gpu (tensorflow[and-cuda],
# Horovod with CUDA + NCCL, wheel cached with the CUDA and NCCL versions in its key), then it
# checks tf.test.is_built_with_cuda(), hvd.cuda_built(), hvd.nccl_built() and fails naming
# what is missing (scripts/gpu_build_check.sh). CI runs it after make test.
gpu-build-check:
	@bash scripts/gpu_build_check.sh

# Proves a real GPU node in minutes with the defaults a learner gets (mixed precision, XLA
# where it can compile, the device feed): notebook 03 up to section 4, the minimal script
# under horovodrun on every GPU with the ranks compared, bench gpu-node quick; one table, exit
# 1 on a failure, 2 without a GPU. CPU=1: the same on this CPU with the switches forced on
# (make test runs it: tests/mpi/test_gpu_smoke.py). docs/gpu.md lists what it proves.
gpu-smoke: setup
	"$(PY)" -m chexnet_utils.notebook.gpu_smoke $(if $(filter 1,$(CPU)),--cpu)

clean:
	rm -rf "$(BUILD)" .pytest_cache

distclean: clean
	rm -rf "$(VENV)" .venv-gpu .venv-py3* data/synthetic-*

# A real Slurm on this machine for the user who runs it (chexnet_utils/cluster/slurm_local.py; needs
# slurm-wlm + munge, which `make setup` installs as root, but not root itself): munged,
# slurmctld and slurmd as that user, listening on loopback where the host name resolves to it,
# munge's socket private to that user (no other account can submit), everything in
# $(SLURM_DIR) (refused if another account could swap a folder on its path for a link), the
# node idle; then it prints how to use it (export SLURM_CONF=..., sinfo, sbatch
# scripts/slurm_horovod.sbatch) and who can reach it, and runs until Ctrl-C, which cancels
# the jobs and stops every daemon. SLURM_ARGS=up / status / down: start and return, show, stop.
.PHONY: slurm
SLURM_ARGS ?= run
SLURM_DIR ?= $(BUILD)/slurm
slurm: setup
	"$(PY)" -m chexnet_utils.cluster.slurm_local $(SLURM_ARGS) --dir "$(SLURM_DIR)"
