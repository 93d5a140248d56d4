#!/usr/bin/env bash
# make setup: everything the notebooks and tests need, from nothing, idempotently.
#   0. the Python (scripts/python_choice.sh): PYTHON if set, else the newest python3.13 ..
#      python3.10 / python3 on PATH that TensorFlow 2.21 supports (3.10-3.13); none: one message
#      naming the versions and this distribution's package, nothing installed. An existing
#      environment keeps the Python it was made with ($VENV/.chexnet-python records it): another
#      PYTHON for it stops with a message instead of mixing two Pythons
#   1. the system packages it needs (scripts/system_packages.sh: venv module, g++, Open MPI,
#      Chromium for the browser test, Slurm + munge for the one-machine Slurm), with apt-get
#      as root, else it prints the apt-get line
#   2. a virtual environment with the pinned stack, hash-locked: requirements/lock/py3XX-cpu.txt
#      (made by `make lock` from requirements/base.txt, build.txt, tf-cpu.txt) or py3XX-gpu.txt
#      on a GPU node (gpu.txt: the same TensorFlow with CUDA), installed with
#      pip install --require-hashes (a file whose sha256 is not in the lock is refused)
#   3. Horovod built from its PyPI sdist (checked against PyPI's sha256 in
#      requirements/horovod.txt before it is unpacked), patched by
#      patches/horovod-<version>/*.patch, with MPI + Gloo (+ NCCL and CUDA on a GPU node)
#      against that TensorFlow, the wheel cached under $CHEXNET_CACHE keyed by Horovod,
#      patches, TensorFlow, Python, MPI (and CUDA, NCCL), with a digest file written next to it
#      at build time and checked before every install (scripts/digests.sh)
#   4. chexnet_utils (editable), a Jupyter kernel, ipyparallel's JupyterLab extension,
#      and a loud capability check
# Environment: VENV (default .venv), PYTHON (interpreter to create it with; default: step 0), CONDA=1 to use
# the active conda env instead of a venv, HOROVOD_REBUILD=1 to ignore the wheel cache,
# SETUP_SLURM=0 to leave out slurm-wlm and munge,
# GPU=1 for the GPU build (tensorflow[and-cuda], Horovod with NCCL; the nvcc it compiles with
# comes from scripts/cuda_toolchain.sh), GPU=0 for the CPU build, GPU=auto (default): the GPU
# build when `nvidia-smi -L` lists a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-}
CACHE=${CHEXNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chexnet-at-scale}
KERNEL_NAME=${KERNEL_NAME:-chexnet-at-scale}
KERNEL_DISPLAY=${KERNEL_DISPLAY:-Python ($KERNEL_NAME)}
KERNEL_USER=${KERNEL_USER:-1}   # 0: register the kernel only inside the environment
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; exit 1; }
t0=$(date +%s)
GPU=${GPU:-auto}
if [ "$GPU" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    GPU=1; say "nvidia-smi -L lists GPUs: GPU build (GPU=0 for the CPU build)"
  else
    GPU=0
  fi
fi
case "$GPU" in
  0|1) ;;
  *) echo "GPU must be 0, 1 or auto, not '$GPU'" >&2; exit 2 ;;
esac

# 0. Which Python (scripts/python_choice.sh prints NAME<TAB>PATH<TAB>VERSION, or says why none).
#    A venv records the one that made it in $VENV/.chexnet-python (same format); a venv made
#    before that record existed is described by its pyvenv.cfg.
py_xy() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
case "$VENV" in /*) VENV_PY="$VENV/bin/python" ;; *) VENV_PY="$ROOT/$VENV/bin/python" ;; esac
needs_venv=0
if [ "${CONDA:-0}" = 1 ]; then
  [ -n "${CONDA_PREFIX:-}" ] || die "CONDA=1 but no conda env is active"
  PY="$CONDA_PREFIX/bin/python"
  PYTHON="$PY" bash scripts/python_choice.sh >/dev/null || exit 1
  SYS_PYTHON=$PY
elif [ -x "$VENV_PY" ]; then
  if IFS=$'\t' read -r rec_name rec_path rec_version < "$VENV/.chexnet-python" 2>/dev/null; then
    made_with="$rec_name ($([ "$rec_name" = "$rec_path" ] || printf '%s, ' "$rec_path")$rec_version)"
  else   # a venv made before the record: what its pyvenv.cfg says
    made_with=$(sed -n 's/^ *\(home\|version\) *= *//p' "$VENV/pyvenv.cfg" 2>/dev/null | tr '\n' ' ')
  fi
  venv_xy=$(py_xy "$VENV_PY") || die "$VENV/bin/python does not run (its Python was removed?):" \
    "remove $VENV (rm -rf $VENV) and make setup again"
  if [ -n "$PYTHON" ]; then
    choice=$(bash scripts/python_choice.sh) || exit 1
    IFS=$'\t' read -r _ chosen_path chosen_version <<<"$choice"
    if [ "${chosen_version%.*}" != "$venv_xy" ]; then
      die "$VENV was made with Python $venv_xy (${made_with% }); PYTHON=$PYTHON is Python" \
          "$chosen_version ($chosen_path). setup does not mix two Pythons in one environment:" \
          "use another folder (make setup PYTHON=$PYTHON VENV=.venv-py$(tr -d . <<<"${chosen_version%.*}")), or remove" \
          "this one first (rm -rf $VENV) to make it again with $PYTHON."
    fi
  fi
  PYTHON="$VENV_PY" bash scripts/python_choice.sh >/dev/null ||
    die "$VENV was made with a Python setup no longer supports (above): remove it (rm -rf $VENV)"
  say "using $VENV: Python $venv_xy, made with ${made_with% }"
  PY=$VENV_PY
  SYS_PYTHON=$VENV_PY
else
  choice=$(bash scripts/python_choice.sh) || exit 1
  IFS=$'\t' read -r chosen_name chosen_path chosen_version <<<"$choice"
  say "Python: $chosen_name ($chosen_path, $chosen_version)${PYTHON:+, from PYTHON}"
  needs_venv=1
  SYS_PYTHON=$chosen_name
fi

# 1. System packages: the table in scripts/system_packages.sh (the venv module for that Python,
#    g++, Open MPI, Chromium), installed with apt-get as root, else the exact apt-get line and a
#    stop. The venv module is needed only when the venv is still to be made.
#    With them (optional, SETUP_SLURM=0 skips): slurm-wlm and munge for the one-machine Slurm
#    (chexnet_utils.cluster.slurm_local: make slurm, tests/mpi/test_slurm.py, which skip without them).
PYTHON="$SYS_PYTHON" SETUP_NEEDS_VENV=$needs_venv SETUP_SLURM=${SETUP_SLURM:-1} \
  bash scripts/system_packages.sh
MPI_VERSION=$(mpirun --version 2>/dev/null | head -n1 | sed 's/[^0-9.]*\([0-9][0-9.]*\).*/\1/')
say "MPI: $(mpirun --version 2>/dev/null | head -n1)"

# As the host's root (not in a container, uid 0 not mapped from another account), pip and
# Horovod's setup.py run as root: say so once, with the route that needs root only for apt
# (security review 19cb1e5, section 5; chexnet_utils/platform/root.py decides the same for
# Jupyter and Open MPI).
if [ "$(id -u)" = 0 ] && [ ! -e /.dockerenv ] && [ ! -e /run/.containerenv ] \
   && [ -z "${container:-}" ] && awk '$1 == 0 && $2 != 0 {m=1} END {exit m}' /proc/self/uid_map 2>/dev/null; then
  say "note: running as root outside a container: pip and Horovod's setup.py run as root here;" \
      "the route without: root runs 'bash scripts/system_packages.sh', a normal account runs 'make setup'"
fi

# 2. Python environment ----------------------------------------------------------------
if [ "$needs_venv" = 1 ]; then
  say "creating $VENV with $chosen_name"
  "$chosen_path" -m venv "$VENV"
  printf '%s\t%s\t%s\n' "$chosen_name" "$chosen_path" "$chosen_version" > "$VENV/.chexnet-python"
  PY=$VENV_PY
fi
PIP=("$PY" -m pip --disable-pip-version-check)
stamp_dir=$("$PY" -c 'import sys; print(sys.prefix)')
# uv_install_locks LOCK NODEPS_LOCK: install both locks with uv (itself pip-installed from
# requirements/uv.txt, hash-checked), from the index URLs and find-links pip is configured
# with (scripts/pip_indexes.py), all indexes searched as pip does (the hashes pin every
# file), byte-compiled as pip would. Returns non-zero, saying why, where uv is not
# installable or fails: the caller then installs with pip.
uv_install_locks() {
  local log args
  log=$(mktemp)
  if ! "${PIP[@]}" install -q --require-hashes --only-binary :all: -r requirements/uv.txt >"$log" 2>&1; then
    say "uv not installable here ($(grep -m1 -i 'error' "$log" || tail -n1 "$log")): installing with pip"
    rm -f "$log"; return 1
  fi
  mapfile -t args < <("$PY" scripts/pip_indexes.py)
  if "$PY" -m uv pip install -q --python "$PY" --require-hashes --no-build --compile-bytecode \
       --index-strategy unsafe-best-match "${args[@]}" -r "$1" >"$log" 2>&1 &&
     "$PY" -m uv pip install -q --python "$PY" --require-hashes --no-build --compile-bytecode \
       --index-strategy unsafe-best-match --no-deps "${args[@]}" -r "$2" >>"$log" 2>&1; then
    rm -f "$log"; return 0
  fi
  say "uv could not install the lock ($(grep -m1 -i 'error' "$log" || tail -n1 "$log")): installing with pip"
  rm -f "$log"; return 1
}
# The lock for this Python and build (`make lock` writes them from the pins; scripts/lock_requirements.py)
PY_LOCK=py$(py_xy "$PY" | tr -d .)
flavour=cpu; [ "$GPU" = 1 ] && flavour=gpu
LOCK=requirements/lock/$PY_LOCK-$flavour.txt
LOCK_NODEPS=requirements/lock/$PY_LOCK-no-deps.txt
for f in "$LOCK" "$LOCK_NODEPS"; do
  [ -f "$f" ] || die "no lock $f for Python $(py_xy "$PY"): make lock writes it from requirements/*.txt"
done
req_hash=$(cat "$LOCK" "$LOCK_NODEPS" | sha256sum | cut -c1-16)
if [ ! -f "$stamp_dir/.chexnet-req-$req_hash" ]; then
  say "installing the pinned stack, hash-locked ($LOCK, $LOCK_NODEPS)"
  # tensorflow-cpu and tensorflow (the CUDA build) install the same files: the other flavour
  # goes first, so switching GPU=0 <-> GPU=1 in one environment leaves no half of either.
  other_tf=tensorflow; [ "$GPU" = 1 ] && other_tf=tensorflow-cpu
  if "$PY" -m pip show -q "$other_tf" >/dev/null 2>&1; then
    say "removing $other_tf (switching TensorFlow build)"
    "${PIP[@]}" uninstall -q -y "$other_tf"
    rm -f "$stamp_dir/.chexnet-horovod-built-for"
  fi
  # every file's sha256 must be in the lock; wheels only (an sdist's build dependencies would
  # be fetched unchecked). uv (requirements/uv.txt) installs the same files about 3x faster,
  # from the indexes pip is configured with; pip does it where uv cannot (SETUP_INSTALLER=pip
  # skips uv).
  t_install=$(date +%s)
  if [ "${SETUP_INSTALLER:-uv}" = uv ] && uv_install_locks "$LOCK" "$LOCK_NODEPS"; then
    say "installed with uv in $(( $(date +%s) - t_install )) s"
  else
    "${PIP[@]}" install -q --require-hashes --only-binary :all: -r "$LOCK"
    "${PIP[@]}" install -q --require-hashes --only-binary :all: --no-deps -r "$LOCK_NODEPS"  # see requirements/no-deps.txt
    say "installed with pip in $(( $(date +%s) - t_install )) s"
  fi
  rm -f "$stamp_dir"/.chexnet-req-*
  touch "$stamp_dir/.chexnet-req-$req_hash"
else
  say "pinned stack already installed ($LOCK)"
fi

# 3. Horovod ---------------------------------------------------------------------------
# requirements/horovod.txt: "horovod==<version> --hash=sha256:<PyPI's digest of the sdist>"
read -r HVD_SPEC HVD_HASH < <(grep -E '^horovod==' requirements/horovod.txt)
HVD_VERSION=${HVD_SPEC#horovod==}
HVD_SHA256=${HVD_HASH#--hash=sha256:}
[[ $HVD_SHA256 =~ ^[0-9a-f]{64}$ ]] || die "requirements/horovod.txt: no --hash=sha256:<digest> after $HVD_SPEC"
TF_VERSION=$("$PY" - <<'PY'
import importlib.metadata as m
for name in ("tensorflow-cpu", "tensorflow", "tensorflow-gpu"):
    try:
        print(m.version(name)); break
    except m.PackageNotFoundError:
        pass
else:
    raise SystemExit("TensorFlow is not installed in this environment")
PY
)
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# Patches applied to Horovod's sdist (each file says why); their hash is part of the cache key,
# so changing a patch rebuilds.
PATCH_DIR="patches/horovod-$HVD_VERSION"
PATCHES=()
if [ -d "$PATCH_DIR" ]; then mapfile -t PATCHES < <(ls "$PATCH_DIR"/*.patch 2>/dev/null | sort); fi
PATCH_HASH=$(cat /dev/null "${PATCHES[@]}" | sha256sum | cut -c1-8)
WHEEL_KEY="horovod-$HVD_VERSION-p$PATCH_HASH-tf$TF_VERSION-$PY_TAG-openmpi$MPI_VERSION"
if [ "$GPU" = 1 ]; then
  # Which nvcc, CUDA headers and NCCL the GPU build uses (the node's toolkit when its CUDA major
  # matches TensorFlow's, else the route proven on PyPI wheels); exports HOROVOD_* for the build.
  toolchain=$(bash scripts/cuda_toolchain.sh --python "$PY") || {
    echo "no CUDA toolchain for Horovod's GPU build (reason above)" >&2; exit 1; }
  eval "$toolchain"
  say "CUDA route: $CHEXNET_CUDA_ROUTE"
  # CUDA headers, nvcc and compute capabilities (CHEXNET_CUDA_KEY, e.g. 12.9-nvcc13.0.88-sm75.80.90)
  WHEEL_KEY="$WHEEL_KEY-cuda$CHEXNET_CUDA_KEY-nccl$CHEXNET_NCCL_VERSION"
fi
WHEEL_DIR="$CACHE/wheels/$WHEEL_KEY"
have_hvd=$("$PY" - "$HVD_VERSION" "$GPU" <<'PY' 2>/dev/null || true
import sys, importlib.metadata as m
try:
    ok = m.version("horovod") == sys.argv[1]
    import horovod.tensorflow as hvd
    ok = ok and hvd.mpi_built() and hvd.gloo_built()
    if sys.argv[2] == "1":
        ok = ok and hvd.nccl_built() and hvd.cuda_built()
except Exception:
    ok = False
print("yes" if ok else "no")
PY
)
# The build runs with the pinned cmake (requirements/build.txt) from this environment's bin/,
# never whatever cmake the machine has: pip runs the build with the caller's PATH, which may
# lack bin/.
BIN_DIR=$(dirname "$PY")
explain_build_log() {   # name the system package behind a known build failure in log $1
  if grep -q 'No CMAKE_CXX_COMPILER could be found' "$1"; then
    echo "g++ (package g++) is missing: CMake finds no C++ compiler. Run: sudo apt-get install -y g++" >&2
  fi
  if grep -q 'Could NOT find MPI' "$1"; then
    echo "MPI's development files (package libopenmpi-dev) are missing: CMake cannot find MPI." \
         "Run: sudo apt-get install -y libopenmpi-dev" >&2
  fi
  if grep -q 'Python.h: No such file' "$1"; then
    echo "Python's headers (package python$(py_xy "$PY")-dev) are missing." \
         "Run: sudo apt-get install -y python$(py_xy "$PY")-dev" >&2
  fi
}
# The toolchain a Horovod build needs (cmake, a C++ compiler, MPI), proven in a few seconds
# whenever Horovod is installed, also from the cache: the cache only saves time, this machine
# must still be able to rebuild (HOROVOD_REBUILD=1, another TensorFlow), and a missing
# compiler is named here instead of minutes into a build.
check_build_toolchain() {
  local dir rc=0
  [ -x "$BIN_DIR/cmake" ] || { echo "cmake from requirements/build.txt is missing in $BIN_DIR" >&2; exit 1; }
  dir=$(mktemp -d)
  printf '%s\n' 'cmake_minimum_required(VERSION 3.13)' 'project(horovod_toolchain CXX)' \
    'find_package(MPI REQUIRED)' > "$dir/CMakeLists.txt"
  PATH="$BIN_DIR:$PATH" "$BIN_DIR/cmake" -S "$dir" -B "$dir/build" >"$dir/cmake.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 15 "$dir/cmake.log" >&2
    explain_build_log "$dir/cmake.log"
    echo "the toolchain for Horovod's build is incomplete (cmake output above)" >&2
    rm -rf "$dir"; exit 1
  fi
  rm -rf "$dir"
}
# Horovod's sdist from the package index (pip download: no other source of code; pip checks it
# against requirements/horovod.txt's hash), checked again against that digest before it is
# unpacked in $1 (the cached copy too: scripts/digests.sh), and patched with every
# patches/horovod-<version>/*.patch in name order.
fetch_patched_sdist() {
  local dest=$1 sdist_dir="$CACHE/sdist" tarball p
  tarball="$sdist_dir/horovod-$HVD_VERSION.tar.gz"
  if [ ! -f "$tarball" ]; then
    mkdir -p "$sdist_dir"
    # --no-build-isolation: pip prepares the sdist's metadata in this environment (its hashed
    # setuptools), never in an isolated one it would fill from the index without hash checks
    # (pip #11974; pip 25.3 drops the legacy path that avoids it today)
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
      --require-hashes -d "$sdist_dir" -r requirements/horovod.txt ||
      die "could not download Horovod's source ($HVD_SPEC, sha256 $HVD_SHA256) from the package index"
  fi
  bash scripts/digests.sh unpack-sdist "$tarball" "$HVD_SHA256" "$dest" || exit 1
  for p in "${PATCHES[@]}"; do
    # GIT_CEILING_DIRECTORIES: git apply acts on the folder itself, never on an enclosing repo
    if ! (cd "$dest/horovod-$HVD_VERSION" && GIT_CEILING_DIRECTORIES="$dest" git apply -p1 "$ROOT/$p"); then
      echo "patch $p does not apply to Horovod $HVD_VERSION's sdist" >&2; exit 1
    fi
    say "applied $p"
  done
}
# A cached wheel is used only with its digest file (written at build time, scripts/digests.sh):
# 0 verified, 1 refused (the reason is printed: setup stops), 2 no digest (an entry made
# before digests were written: built again).
cached_wheel_state() {
  local whl rc=0
  whl=$(ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -n1)
  [ -n "$whl" ] || { echo none; return; }
  bash scripts/digests.sh verify-wheel "$whl" >&2 || rc=$?
  case "$rc" in 0) echo ok ;; 2) echo undigested ;; *) echo refused ;; esac
}
# An installed Horovod is only reused if it was built against this TensorFlow.
built_for=$(cat "$stamp_dir/.chexnet-horovod-built-for" 2>/dev/null || true)
if [ "$have_hvd" = yes ] && [ "$built_for" = "$WHEEL_DIR" ] && [ "${HOROVOD_REBUILD:-0}" != 1 ]; then
  say "Horovod $HVD_VERSION already installed for TensorFlow $TF_VERSION"
else
  check_build_toolchain
  say "build toolchain for Horovod: $("$BIN_DIR/cmake" --version | head -n1), C++ compiler and MPI found"
  if [ "${HOROVOD_REBUILD:-0}" = 1 ]; then rm -rf "$WHEEL_DIR"; fi
  state=$(cached_wheel_state)
  [ "$state" != refused ] || exit 1
  if [ "$state" = undigested ]; then
    say "the cached wheel in $WHEEL_DIR has no digest file: building it again"
  fi
  if [ "$state" != ok ]; then
    say "building Horovod $HVD_VERSION against TensorFlow $TF_VERSION (about 3-5 minutes on 2 cores)"
    tb=$(date +%s)
    rm -rf "$WHEEL_DIR.tmp"; mkdir -p "$WHEEL_DIR.tmp"
    build_log="$stamp_dir/horovod-build.log"
    # unpacked inside the environment, not in the shared /tmp: on this shared machine another
    # job removed unpacked horovod-0.28.1 folders under /tmp, once mid-compile ("No rule to
    # make target .../horovod/common/common.cc"); the environment is this checkout's own
    src_root=$(mktemp -d "$stamp_dir/horovod-src.XXXXXX")
    trap 'rm -rf "$src_root"' EXIT
    fetch_patched_sdist "$src_root"
    if ! PATH="$BIN_DIR:$PATH" HOROVOD_CMAKE="$BIN_DIR/cmake" \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir -w "$WHEEL_DIR.tmp" \
      "$src_root/horovod-$HVD_VERSION" >"$build_log" 2>&1; then
      grep -v '^WARNING: Location' "$build_log" | tail -n 40 >&2
      # the compiler's own errors come long before pip's traceback at the end
      if grep -q -E ': (fatal )?error: |No rule to make target' "$build_log"; then
        echo "the build's first errors:" >&2
        grep -E -m 12 ': (fatal )?error: |No rule to make target' "$build_log" | cut -c1-400 >&2
      fi
      explain_build_log "$build_log"
      echo "Horovod's build failed (last lines above; the whole output: $build_log)" >&2
      exit 1
    fi
    bash scripts/digests.sh seal-wheel "$(ls "$WHEEL_DIR.tmp"/horovod-*.whl)"
    rm -rf "$WHEEL_DIR" "$src_root" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"
    trap - EXIT
    say "Horovod built in $(( $(date +%s) - tb )) s; wheel and its sha256 cached in $WHEEL_DIR (build output: $build_log)"
  else
    say "using cached Horovod wheel from $WHEEL_DIR (sha256 verified)"
  fi
  bash scripts/digests.sh install-wheel "$(ls "$WHEEL_DIR"/horovod-*.whl)" "$PY" || exit 1
  echo "$WHEEL_DIR" > "$stamp_dir/.chexnet-horovod-built-for"
fi

# 4. the package, the kernel, the check ------------------------------------------------
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .
# In the environment (what `make lab` and the tests use: Jupyter prefers it over the user's
# folder, which another checkout's setup may have pointed at its own venv) and for the user
# (for a Jupyter outside this environment).
kernel_where=(--sys-prefix); [ "$KERNEL_USER" = 1 ] && kernel_where+=(--user)
# ipykernel 7 stages the kernel in a tempfile.mkdtemp(suffix="_kernels") folder and removes
# only the folder inside it (kernelspec.write_kernel_spec, then install's rmtree): two empty
# /tmp/tmp*_kernels per setup. Its TMPDIR is a folder of ours, removed after.
kernel_stage=$(mktemp -d)
for where in "${kernel_where[@]}"; do
  TMPDIR="$kernel_stage" "$PY" -m ipykernel install "$where" --name "$KERNEL_NAME" \
    --display-name "$KERNEL_DISPLAY" >/dev/null
done
rm -rf "$kernel_stage"
say "Jupyter kernel '$KERNEL_NAME' registered"
# ipyparallel's wheel ships its JupyterLab extension (the "IPython Parallel" sidebar) and
# server extension, enabled; enable them again only if something disabled them.
ipp_enabled() {   # (output captured first: grep -q closing the pipe early trips pipefail)
  local lab server
  lab=$("$PY" -m jupyter labextension list 2>&1) || return 1
  server=$("$PY" -m jupyter server extension list 2>&1) || return 1
  grep -Eq 'ipyparallel-labextension .*enabled' <<<"$lab" && grep -Eq '^ +ipyparallel .*enabled' <<<"$server"
}
if ! ipp_enabled; then
  say "enabling ipyparallel's JupyterLab and server extensions"
  "$PY" -m jupyter server extension enable --sys-prefix ipyparallel >/dev/null 2>&1 || true
  "$PY" -m jupyter labextension enable ipyparallel-labextension >/dev/null 2>&1 || true
  ipp_enabled || { echo "ipyparallel's JupyterLab extension is not enabled (jupyter labextension list)" >&2; exit 1; }
fi
say "ipyparallel JupyterLab extension enabled"
if [ "$GPU" = 1 ]; then
  # a GPU build is proven by what it was built with, not by a GPU being present (gpu-build-check)
  "$PY" -m chexnet_utils envcheck --require tensorflow,horovod,mpi,gloo,cuda,nccl
else
  "$PY" -m chexnet_utils envcheck --require tensorflow,horovod,mpi,gloo
fi
say "setup finished in $(( $(date +%s) - t0 )) s"
