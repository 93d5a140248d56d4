#!/usr/bin/env bash
# make gpu-build-check: the GPU stack is built and proven on a machine without a GPU.
#   1. `GPU=1 make setup` into its own environment (.venv-gpu): tensorflow[and-cuda] and the
#      nvcc route from requirements/gpu.txt, Horovod built with HOROVOD_GPU_OPERATIONS=NCCL
#      through scripts/cuda_toolchain.sh (or taken from the wheel cache)
#   2. it imports that stack and requires what a GPU build is made of:
#      tf.test.is_built_with_cuda(), hvd.cuda_built(), hvd.nccl_built(), hvd.mpi_built(),
#      hvd.gloo_built(); every library Horovod's mpi_lib needs resolves (ldd, with TensorFlow's
#      folder as TensorFlow itself provides it); an allreduce of CPU tensors on 2 MPI ranks
#   3. it prints the CUDA route, the times and the disk taken, and exits non-zero naming each
#      missing piece. It cannot pass without a CUDA + NCCL build of Horovod: no GPU is needed
#      for these facts, and none is used (whether the kernels run on a GPU needs one).
# Environment: GPU_VENV (default .venv-gpu); the rest as scripts/setup.sh (CHEXNET_CACHE,
# HOROVOD_REBUILD=1, CUDA_HOME, HOROVOD_BUILD_CUDA_CC_LIST).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
VENV=${GPU_VENV:-.venv-gpu}
say() { printf '\033[1m[gpu-build-check]\033[0m %s\n' "$*"; }
t0=$(date +%s)
missing=()

# 1. the GPU stack ---------------------------------------------------------------------------
if ! grep -q 'cuda_toolchain.sh' scripts/setup.sh; then
  echo "scripts/setup.sh has no GPU=1 build (it does not use scripts/cuda_toolchain.sh)" >&2
  exit 1
fi
say "GPU=1 setup into $VENV"
setup_log=$(mktemp)
trap 'rm -f "$setup_log"' EXIT
# its own kernel name: the GPU environment must not take over the project kernel
VENV="$VENV" GPU=1 KERNEL_NAME=chexnet-at-scale-gpu KERNEL_USER=0 bash scripts/setup.sh 2>&1 | tee "$setup_log"
setup_rc=${PIPESTATUS[0]}
t_setup=$(( $(date +%s) - t0 ))
[ "$setup_rc" = 0 ] || missing+=("GPU=1 setup failed (exit $setup_rc; its output above)")
case "$VENV" in /*) PY="$VENV/bin/python" ;; *) PY="$ROOT/$VENV/bin/python" ;; esac
if [ ! -x "$PY" ]; then
  echo "no environment $VENV: nothing to check" >&2
  printf '[gpu-build-check] MISSING: %s\n' "${missing[@]}" >&2
  exit 1
fi

# 2. what the build is made of ---------------------------------------------------------------
t1=$(date +%s)
say "checking the GPU build in $VENV (no GPU is used)"
facts=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" - <<'PY' 2>&1
import importlib.metadata as m
def ver(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print("tensorflow_version", ver("tensorflow"))
print("horovod_version", ver("horovod"))
try:
    import tensorflow as tf
    info = tf.sysconfig.get_build_info()
    print("tf_cuda_version", info.get("cuda_version"))
    print("check tf.test.is_built_with_cuda()", bool(tf.test.is_built_with_cuda()))
except Exception as e:
    print("check tf.test.is_built_with_cuda()", False, f"(import tensorflow: {type(e).__name__}: {e})")
try:
    import horovod.tensorflow as hvd
    print("imported horovod.tensorflow")
    for f in ("cuda_built", "nccl_built", "mpi_built", "gloo_built"):
        print(f"check hvd.{f}()", bool(getattr(hvd, f)()))
except Exception as e:
    for f in ("cuda_built", "nccl_built", "mpi_built", "gloo_built"):
        print(f"check hvd.{f}()", False, f"(import horovod.tensorflow: {type(e).__name__}: {e})")
PY
)
echo "$facts" | grep -E '^(tensorflow_version|horovod_version|tf_cuda_version|check) ' | sed 's/^/  /'
while read -r _ what ok rest; do
  [ "$ok" = True ] || missing+=("$what is $ok ${rest}")
done < <(echo "$facts" | grep '^check ')

# the library itself, also when it does not import (ldd then names what it lacks)
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mpi_lib=$(ls "$site"/horovod/tensorflow/mpi_lib*.so 2>/dev/null | head -n1)
[ -n "$mpi_lib" ] || missing+=("Horovod's TensorFlow library (horovod/tensorflow/mpi_lib*.so in $site)")
if [ -n "$mpi_lib" ]; then
  # NEEDED libraries of Horovod's op library: libtensorflow_*.so.2 are loaded by TensorFlow
  # before it (given here as its folder); NCCL must come from the library's own RUNPATH.
  unresolved=$(LD_LIBRARY_PATH="$site/tensorflow" ldd "$mpi_lib" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//')
  nccl=$(LD_LIBRARY_PATH="$site/tensorflow" ldd "$mpi_lib" 2>/dev/null | sed -n 's/^[[:space:]]*\(libnccl[^ ]*\) => \([^ ]*\).*/\1 => \2/p')
  say "Horovod's mpi_lib links ${nccl:-no libnccl}; runpath: $(readelf -d "$mpi_lib" | sed -n 's/.*R.*PATH.*\[\(.*\)\]/\1/p')"
  [ -z "$unresolved" ] || missing+=("libraries of $mpi_lib that do not resolve: $(echo $unresolved)")
  [ -n "$nccl" ] || missing+=("$mpi_lib does not link libnccl")
fi

# an allreduce of CPU tensors on 2 MPI ranks: the GPU build still works without a GPU
if echo "$facts" | grep -q '^imported horovod.tensorflow'; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
    TF_CPP_MIN_LOG_LEVEL=3 CUDA_VISIBLE_DEVICES="" timeout 180 \
    mpirun -np 2 --oversubscribe "$PY" -c '
import sys, tensorflow as tf, horovod.tensorflow as hvd
hvd.init()
s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)] * 3), op=hvd.Sum)
sys.stdout.write(f"rank {hvd.rank()}/{hvd.size()} allreduce {s.numpy().tolist()}\n")  # one write: ranks share the pipe
' 2>&1)
  rc=$?
  echo "$out" | grep '^rank ' | sed 's/^/  /'
  if [ "$rc" != 0 ] || [ "$(echo "$out" | grep -o 'allreduce \[3.0, 3.0, 3.0\]' | wc -l)" != 2 ]; then
    echo "$out" | tail -n 15 >&2
    missing+=("a 2-rank MPI allreduce of CPU tensors with this build (exit $rc, output above)")
  fi
fi
t_check=$(( $(date +%s) - t1 ))

# 3. route, times, disk ----------------------------------------------------------------------
route=$(grep -a -o 'CUDA route: .*' "$setup_log" | tail -n1)
built_for=$(cat "$("$PY" -c 'import sys; print(sys.prefix)')/.chexnet-horovod-built-for" 2>/dev/null || true)
say "${route:-CUDA route: (setup did not say: Horovod taken as installed)}"
[ -z "$built_for" ] || say "Horovod wheel: $built_for ($(du -sh "$built_for" 2>/dev/null | cut -f1))"
say "disk: $VENV $(du -sh "$VENV" 2>/dev/null | cut -f1), pip cache $(du -sh "$("$PY" -m pip cache dir 2>/dev/null)" 2>/dev/null | cut -f1)"
say "times: setup ${t_setup} s, checks ${t_check} s, total $(( $(date +%s) - t0 )) s"
if [ ${#missing[@]} -gt 0 ]; then
  printf '\033[1m[gpu-build-check]\033[0m FAILED, missing:\n' >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi
say "OK: TensorFlow built with CUDA; Horovod built with CUDA, NCCL, MPI and Gloo"
