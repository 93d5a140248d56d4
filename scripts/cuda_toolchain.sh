#!/usr/bin/env bash
# Which nvcc, CUDA headers and NCCL Horovod's GPU build (HOROVOD_GPU_OPERATIONS=NCCL) uses, for
# the environment of --python (a venv with requirements/gpu.txt installed). Two routes:
#   1. node-toolkit: the machine's CUDA toolkit ($CUDA_HOME, nvcc on PATH, /usr/local/cuda),
#      the normal case on GPU clusters, used only if its CUDA major equals TensorFlow's (the
#      major TensorFlow was built with: tensorflow/python/platform/build_info.py).
#   2. pip-wheels: no such toolkit. PyPI has no CUDA 12 nvcc (nvidia-cuda-nvcc-cu12 ships only
#      ptxas), so nvcc, cicc and crt/ come from the CUDA 13 wheels (nvidia-cuda-nvcc,
#      nvidia-nvvm, nvidia-cuda-crt) and compile against the CUDA 12 headers of
#      nvidia-cuda-runtime-cu12 (+ nvidia-cuda-cccl-cu12), the runtime TensorFlow runs with:
#      Horovod's library calls the CUDA runtime (and the kernel registration nvcc generates)
#      through libtensorflow_framework.so.2, which exports that API and loads the wheel's
#      libcudart.so.12. They are put together as one CUDA home of symlinks,
#      $VENV/cuda-home, whose bin/nvcc.profile points nvcc at it (nvcc reads the profile beside
#      argv[0], without resolving symlinks). Proven here to compile and link Horovod 0.28.1;
#      that such a build *runs* on a GPU needs a GPU to show (kernels are built for sm_75+,
#      what CUDA 13 can still target, and a CUDA 13 compiler may want a 580+ driver).
# NCCL is always the nvidia-nccl-cu12 wheel's, the one TensorFlow loads, linked shared, and the
# build gets an $ORIGIN-relative RUNPATH to it, so the cached wheel works in any such venv.
# Before it says yes, a small kernel is compiled with the chosen nvcc and linked with
# --no-undefined against that toolkit's libcudart (CHEXNET_CUDA_SMOKE=0 skips this).
#
# Usage: bash scripts/cuda_toolchain.sh --python VENV/bin/python
#   stdout: `export` lines for eval (HOROVOD_* for the build, PATH, LDFLAGS, CHEXNET_CUDA_*)
#   stderr: which route it took and why; exit 2 naming what is missing when there is no route.
# Environment: CUDA_HOME (a toolkit to consider first), HOROVOD_BUILD_CUDA_CC_LIST (compute
# capabilities; default 75,80,90 with a CUDA 13 nvcc, 70,75,80,90 with CUDA 12: see
# default_cc), CHEXNET_CUDA_DEFAULT_HOMES (default /usr/local/cuda).
#
# For setup.sh:  eval "$(bash scripts/cuda_toolchain.sh --python "$PY")"
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
GPU_REQ="$HERE/../requirements/gpu.txt"
PY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=${2:-}; shift 2 ;;
    --python=*) PY=${1#--python=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cuda_toolchain.sh: unknown argument $1" >&2; exit 64 ;;
  esac
done
say() { echo "[cuda_toolchain] $*" >&2; }
die() { echo "[cuda_toolchain] no CUDA toolchain for Horovod's GPU build: $*" >&2; exit 2; }
[ -n "$PY" ] || die "give the environment's interpreter: --python VENV/bin/python"
[ -x "$PY" ] || die "$PY is not an executable Python"

# The pinned version of a wheel in requirements/gpu.txt, for messages ("pip install X==V").
pin() { local v; v=$(sed -n "s/^$1==\([^ ;#]*\).*/\1/p" "$GPU_REQ" 2>/dev/null | head -n1); echo "$1${v:+==$v}"; }
nvcc_version() {   # "13.0.88" from `nvcc --version` ("... release 13.0, V13.0.88")
  "$1" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9][0-9.]*\).*/\1/p' | head -n1
}
q() { printf '%q' "$1"; }

{ read -r PREFIX && read -r SITE; } < <("$PY" -c 'import sys, sysconfig; print(sys.prefix); print(sysconfig.get_paths()["purelib"])') ||
  die "$PY does not run"
PREFIX_REAL=$(readlink -f "$PREFIX")
NV="$SITE/nvidia"

# TensorFlow's CUDA major ------------------------------------------------------------------
build_info="$SITE/tensorflow/python/platform/build_info.py"
[ -f "$build_info" ] || die "TensorFlow is not installed in $PREFIX (pip install -r requirements/gpu.txt)"
grep -q "'is_cuda_build', True" "$build_info" ||
  die "the TensorFlow in $PREFIX is not a CUDA build (tensorflow-cpu?); install requirements/gpu.txt"
TF_CUDA=$(sed -n "s/.*'cuda_version', '\([0-9][0-9.]*\)'.*/\1/p" "$build_info" | head -n1)
[ -n "$TF_CUDA" ] || die "cannot read cuda_version from $build_info"
TF_MAJOR=${TF_CUDA%%.*}

# NCCL: the wheel TensorFlow loads (nvidia-nccl-cu12) --------------------------------------
nccl_h="$NV/nccl/include/nccl.h"
missing=()
if [ -f "$nccl_h" ] && [ -e "$NV/nccl/lib/libnccl.so.2" ]; then
  NCCL_VERSION=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END{print v["NCCL_MAJOR"]"."v["NCCL_MINOR"]"."v["NCCL_PATCH"]}' "$nccl_h")
else
  missing+=("NCCL headers and libnccl.so.2 ($NV/nccl: pip install $(pin nvidia-nccl-cu12))")
fi

# Compute capabilities: small on purpose (2 builds of cuda_kernels.cu per capability).
#   CUDA <= 12: 70 V100, 75 T4, 80 A100 (its code also runs on 86/89: A10, L4, L40, RTX 30/40),
#               90 H100/H200, + compute_90 PTX that newer GPUs (Blackwell) JIT-compile.
#   CUDA >= 13 dropped sm_70 (V100): 75, 80, 90.
default_cc() { if [ "$1" -ge 13 ]; then echo 75,80,90; else echo 70,75,80,90; fi; }
check_cc() {   # $1 nvcc, $2 list: every capability must be one nvcc can target
  local supported cc bad=()
  supported=$("$1" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p' | tr '\n' ' ') || true
  [ -n "$supported" ] || return 0
  for cc in ${2//,/ }; do [[ " $supported" == *" $cc "* ]] || bad+=("$cc"); done
  [ ${#bad[@]} -eq 0 ] || die "HOROVOD_BUILD_CUDA_CC_LIST=$2: $1 cannot target ${bad[*]} (it can: ${supported% })"
}

# A tiny kernel through nvcc, linked with --no-undefined against the CUDA 12 libcudart: every
# runtime call and registration hook nvcc's generated code makes exists in that runtime.
smoke() {   # $1 CUDA home (bin/nvcc, include/, lib64/ or lib/), $2 compute capability
  [ "${CHEXNET_CUDA_SMOKE:-1}" = 1 ] || return 0
  local home=$1 dir libdir rc=0
  command -v g++ >/dev/null || die "g++ is missing (nvcc needs a host compiler): apt-get install -y g++"
  dir=$(mktemp -d)
  libdir="$home/lib64"; [ -e "$libdir/libcudart.so" ] || libdir="$home/lib"
  cat > "$dir/k.cu" <<'CU'
#include <cuda_runtime.h>
#include <cuda_fp16.h>
__global__ void k(float* a, __half h) { a[threadIdx.x] += __half2float(h); }
extern "C" int launch(float* a) { k<<<1, 32>>>(a, __float2half(1.f)); return (int)cudaGetLastError(); }
CU
  if ! (cd "$dir" && PATH="$home/bin:$PATH" "$home/bin/nvcc" -std=c++11 -O3 -Xcompiler -fPIC \
          -gencode "arch=compute_$2,code=sm_$2" -c k.cu -o k.o &&
        g++ -shared -Wl,--no-undefined -o k.so k.o -L"$libdir" -lcudart) >"$dir/log" 2>&1; then
    rc=1; sed 's/^/    /' "$dir/log" | tail -n 25 >&2
  fi
  rm -rf "$dir"
  return $rc
}

emit() {   # $1 route, $2 CUDA home, $3 NCCL lib dir, $4 CUDA version, $5 nvcc version, $6 cc list
  cat <<EOF
export HOROVOD_GPU_OPERATIONS=NCCL
export HOROVOD_CUDA_HOME=$(q "$2")
export HOROVOD_NCCL_INCLUDE=$(q "$NV/nccl/include")
export HOROVOD_NCCL_LIB=$(q "$3")
export HOROVOD_NCCL_LINK=SHARED
export HOROVOD_BUILD_CUDA_CC_LIST=$(q "$6")
export PATH=$(q "$2/bin"):"\$PATH"
export CMAKE_GENERATOR='Unix Makefiles'
export LDFLAGS='-Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib'"\${LDFLAGS:+ \$LDFLAGS}"
export CHEXNET_CUDA_ROUTE=$(q "$1")
export CHEXNET_CUDA_VERSION=$(q "$4")
export CHEXNET_NVCC_VERSION=$(q "$5")
export CHEXNET_NCCL_VERSION=$(q "$NCCL_VERSION")
export CHEXNET_CUDA_KEY=$(q "$4-nvcc$5-sm${6//,/.}")
EOF
}

# 1. The node's toolkit --------------------------------------------------------------------
candidates=()
[ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME")
if p=$(command -v nvcc 2>/dev/null); then
  real=$(readlink -f "$p"); candidates+=("$(dirname "$(dirname "$real")")" "$(dirname "$(dirname "$p")")")
fi
for h in ${CHEXNET_CUDA_DEFAULT_HOMES-/usr/local/cuda}; do candidates+=("$h"); done
seen=" "
rejected=()
for home in "${candidates[@]}"; do
  home=$(readlink -f "$home" 2>/dev/null || echo "$home")
  case "$seen" in *" $home "*) continue ;; esac
  seen="$seen$home "
  case "$home/" in "$PREFIX_REAL"/*) continue ;; esac   # our own pip-route home, left on PATH
  [ -x "$home/bin/nvcc" ] || continue
  ver=$(nvcc_version "$home/bin/nvcc")
  if [ -z "$ver" ]; then rejected+=("$home/bin/nvcc does not report a version"); continue; fi
  if [ "${ver%%.*}" != "$TF_MAJOR" ]; then
    rejected+=("node toolkit CUDA $ver at $home: its major ${ver%%.*} is not TensorFlow's CUDA $TF_MAJOR (TF built with $TF_CUDA)")
    continue
  fi
  if [ ! -f "$home/include/cuda_runtime.h" ]; then
    rejected+=("node toolkit CUDA $ver at $home has no include/cuda_runtime.h"); continue
  fi
  [ ${#missing[@]} -eq 0 ] || die "${missing[*]}"
  cc=${HOROVOD_BUILD_CUDA_CC_LIST:-$(default_cc "${ver%%.*}")}
  check_cc "$home/bin/nvcc" "$cc"
  smoke "$home" "${cc%%,*}" || die "the node toolkit CUDA $ver at $home cannot compile and link a kernel (output above)"
  nccl_dir="$PREFIX/cuda-nccl"   # libnccl.so (what CMake's find_library wants) -> the wheel's .so.2
  rm -rf "$nccl_dir"; mkdir -p "$nccl_dir"
  ln -s "$NV/nccl/lib/libnccl.so.2" "$nccl_dir/libnccl.so.2"; ln -s libnccl.so.2 "$nccl_dir/libnccl.so"
  for r in "${rejected[@]}"; do say "not used: $r"; done
  say "route: node toolkit CUDA $ver at $home (same major as TensorFlow's CUDA $TF_CUDA), NCCL $NCCL_VERSION from the nvidia-nccl-cu12 wheel, compute capabilities $cc"
  emit "node-toolkit $ver at $home" "$home" "$nccl_dir" "$ver" "$ver" "$cc"
  exit 0
done
for r in "${rejected[@]}"; do say "not used: $r"; done

# 2. PyPI wheels ---------------------------------------------------------------------------
rt_h="$NV/cuda_runtime/include/cuda_runtime_api.h"
CUDA_VERSION=""
if [ -f "$rt_h" ] && [ -f "$NV/cuda_runtime/lib/libcudart.so.12" ]; then
  code=$(sed -n 's/^#define CUDART_VERSION *\([0-9]*\).*/\1/p' "$rt_h" | head -n1)
  [ -n "$code" ] && CUDA_VERSION="$(( code / 1000 )).$(( code % 1000 / 10 ))"
  if [ "${CUDA_VERSION%%.*}" != "$TF_MAJOR" ]; then
    missing+=("CUDA $TF_MAJOR runtime headers: $NV/cuda_runtime has CUDA ${CUDA_VERSION:-?} (pip install $(pin nvidia-cuda-runtime-cu12))")
  fi
else
  missing+=("CUDA $TF_MAJOR headers and libcudart ($NV/cuda_runtime: pip install $(pin nvidia-cuda-runtime-cu12))")
fi
[ -f "$NV/cuda_cccl/include/nv/target" ] ||
  missing+=("CCCL headers (nv/target, included by cuda_fp16.h) ($NV/cuda_cccl: pip install $(pin nvidia-cuda-cccl-cu12))")
NVCC_DIR=""
for d in "$NV"/cu[0-9]*; do [ -x "$d/bin/nvcc" ] && NVCC_DIR=$d; done   # highest cuNN last
if [ -z "$NVCC_DIR" ]; then
  missing+=("nvcc: no CUDA toolkit whose major is $TF_MAJOR on this node (CUDA_HOME, nvcc on PATH, /usr/local/cuda), and no nvcc wheel in $NV (pip install $(pin nvidia-cuda-nvcc))")
else
  [ -x "$NVCC_DIR/nvvm/bin/cicc" ] || missing+=("cicc ($NVCC_DIR/nvvm/bin: pip install $(pin nvidia-nvvm))")
  [ -f "$NVCC_DIR/include/crt/host_runtime.h" ] || missing+=("nvcc's crt/ headers ($NVCC_DIR/include/crt: pip install $(pin nvidia-cuda-crt))")
fi
[ ${#missing[@]} -eq 0 ] || die "$(printf '\n  missing: %s' "${missing[@]}")"
NVCC_VERSION=$(nvcc_version "$NVCC_DIR/bin/nvcc")
[ -n "$NVCC_VERSION" ] || die "$NVCC_DIR/bin/nvcc does not run (\`$NVCC_DIR/bin/nvcc --version\` fails)"

# Assemble $PREFIX/cuda-home (symlinks only; rebuilt every time, a few milliseconds).
home="$PREFIX/cuda-home"
rm -rf "$home.tmp"; mkdir -p "$home.tmp/bin" "$home.tmp/include" "$home.tmp/lib64"
for f in "$NVCC_DIR"/bin/*; do [ "${f##*/}" = nvcc.profile ] || ln -s "$f" "$home.tmp/bin/"; done
ln -s "$NVCC_DIR/nvvm" "$home.tmp/nvvm"
cat > "$home.tmp/bin/nvcc.profile" <<'EOF'
# chexnet-at-scale (scripts/cuda_toolchain.sh): nvcc from the nvidia-cuda-nvcc wheel with the
# CUDA headers and libraries of this folder (the -cu12 wheels TensorFlow runs with).
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(CICC_PATH):$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
# include/: CUDA 12 runtime headers, CCCL 12 (nv/, cuda/, cub/, thrust/), and the compiler's own
# crt/ and fatbinary_section.h (they belong to the nvcc that generates code using them).
for f in "$NV"/cuda_runtime/include/* "$NV"/cuda_cccl/include/*; do
  case "${f##*/}" in __init__.py|__pycache__) continue ;; esac
  ln -s "$f" "$home.tmp/include/"
done
ln -s "$NVCC_DIR/include/crt" "$home.tmp/include/crt"
[ -f "$NVCC_DIR/include/fatbinary_section.h" ] && ln -s "$NVCC_DIR/include/fatbinary_section.h" "$home.tmp/include/"
for f in "$NV"/cuda_runtime/lib/*; do ln -s "$f" "$home.tmp/lib64/"; done
ln -s libcudart.so.12 "$home.tmp/lib64/libcudart.so"
ln -s "$NV/nccl/lib/libnccl.so.2" "$home.tmp/lib64/libnccl.so.2"; ln -s libnccl.so.2 "$home.tmp/lib64/libnccl.so"
rm -rf "$home"; mv "$home.tmp" "$home"

cc=${HOROVOD_BUILD_CUDA_CC_LIST:-$(default_cc "${NVCC_VERSION%%.*}")}
check_cc "$home/bin/nvcc" "$cc"
smoke "$home" "${cc%%,*}" ||
  die "nvcc $NVCC_VERSION (wheel) with the CUDA $CUDA_VERSION headers of the -cu12 wheels cannot compile and link a kernel (output above)"
say "route: pip wheels: nvcc $NVCC_VERSION (nvidia-cuda-nvcc) with the CUDA $CUDA_VERSION headers and libcudart of nvidia-cuda-runtime-cu12 (TensorFlow's CUDA $TF_MAJOR), assembled in $home; NCCL $NCCL_VERSION (nvidia-nccl-cu12); compute capabilities $cc"
if [ "${NVCC_VERSION%%.*}" != "$TF_MAJOR" ]; then
  say "note: nvcc's CUDA major (${NVCC_VERSION%%.*}) differs from the runtime's ($TF_MAJOR): proven to build and link here; whether its kernels run needs a GPU (and may need a driver for CUDA ${NVCC_VERSION%%.*})"
fi
emit "pip-wheels: nvcc $NVCC_VERSION + CUDA $CUDA_VERSION headers" "$home" "$home/lib64" "$CUDA_VERSION" "$NVCC_VERSION" "$cc"
