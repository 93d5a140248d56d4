"""scripts/cuda_toolchain.sh: which nvcc Horovod's GPU build takes (issue 13), with fakes.

Each case builds a fake environment in a temporary folder: a fake ``python`` that answers
``sys.prefix`` and the site-packages folder, a site-packages with just the files the script
reads (TensorFlow's ``build_info.py``, the ``nvidia/*`` wheels' headers and libraries as empty
files), fake ``nvcc`` scripts that print a given version, and a PATH of only the standard tools
the script uses plus the fakes. So the machine's own CUDA (if any) is never seen, and no case
needs a GPU, a compiler or a network. The real compile-and-link smoke test of the script is off
here (CHEXNET_CUDA_SMOKE=0); ``make gpu-build-check`` runs the real thing.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cuda_toolchain.sh"
BASH = "/bin/bash"
TOOLS = ("sed", "awk", "grep", "cat", "head", "tr", "readlink", "dirname", "mktemp", "rm",
         "mkdir", "ln", "mv", "env")


def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _file(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_nvcc(path: Path, version: str) -> Path:
    """An nvcc that reports ``version`` (like 12.4.131) and the targets of its CUDA major."""
    major_minor = ".".join(version.split(".")[:2])
    archs = "75 80 86 89 90" if int(version.split(".")[0]) >= 13 else "70 75 80 86 89 90"
    listing = "\\n".join(f"compute_{a}" for a in archs.split())
    return _exe(path, f"""case "$1" in
  --version) echo "Cuda compilation tools, release {major_minor}, V{version}" ;;
  --list-gpu-arch) printf '{listing}\\n' ;;
  *) exit 1 ;;
esac""")


def fake_toolkit(home: Path, version: str) -> Path:
    """A node CUDA toolkit: bin/nvcc and include/cuda_runtime.h."""
    fake_nvcc(home / "bin" / "nvcc", version)
    _file(home / "include" / "cuda_runtime.h")
    return home


class FakeEnv:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.prefix = tmp / "venv"
        self.site = self.prefix / "lib" / "python3.11" / "site-packages"
        self.nv = self.site / "nvidia"
        self.python = _exe(self.prefix / "bin" / "python",
                           f'printf "%s\\n%s\\n" "{self.prefix}" "{self.site}"')
        self.bin = tmp / "bin"          # extra PATH entries (fake nvcc) go here
        self.bin.mkdir()
        self.tools = tmp / "tools"      # the standard tools the script uses, nothing else
        self.tools.mkdir()
        for name in TOOLS:
            found = shutil.which(name)
            assert found, f"{name} is needed to run the script"
            (self.tools / name).symlink_to(found)

    def tensorflow(self, cuda: str = "12.5.1", cuda_build: bool = True) -> None:
        _file(self.site / "tensorflow/python/platform/build_info.py",
              "import collections\n"
              "build_info = collections.OrderedDict([('cpu_compiler', 'clang'), "
              f"('cuda_version', '{cuda}'), ('cudnn_version', '9'), "
              f"('is_cuda_build', {cuda_build}), ('is_rocm_build', False)])\n")

    def cu12_wheels(self, cudart: int = 12090, nccl=(2, 32, 3), cccl: bool = True) -> None:
        """What tensorflow[and-cuda] + nvidia-cuda-cccl-cu12 install."""
        rt = self.nv / "cuda_runtime"
        _file(rt / "include/cuda_runtime_api.h", f"#define CUDART_VERSION  {cudart}\n")
        _file(rt / "include/cuda_runtime.h")
        _file(rt / "lib/libcudart_static.a")
        _file(rt / "lib/libcudart.so.12")
        _file(self.nv / "nccl/include/nccl.h",
              ("#define NCCL_MAJOR {}\n#define NCCL_MINOR {}\n"
               "#define NCCL_PATCH {}\n").format(*nccl))
        _file(self.nv / "nccl/lib/libnccl.so.2")
        if cccl:
            _file(self.nv / "cuda_cccl/include/nv/target")

    def nvcc_wheels(self, version: str = "13.0.88", nvvm: bool = True, crt: bool = True) -> None:
        """nvidia-cuda-nvcc (+ nvidia-nvvm, nvidia-cuda-crt) of CUDA 13: nvidia/cu13/..."""
        top = self.nv / f"cu{version.split('.')[0]}"
        fake_nvcc(top / "bin" / "nvcc", version)
        _exe(top / "bin" / "cudafe++", "exit 0")
        _file(top / "bin" / "nvcc.profile", "TOP = $(_HERE_)/..\n")
        if nvvm:
            _exe(top / "nvvm/bin/cicc", "exit 0")
        if crt:
            _file(top / "include/crt/host_runtime.h")

    def run(self, *, path_extra=(), cuda_home=None, default_homes="", **env):
        path = ":".join([*(str(p) for p in path_extra), str(self.bin), str(self.tools)])
        full = {"PATH": path, "CHEXNET_CUDA_SMOKE": "0",
                "CHEXNET_CUDA_DEFAULT_HOMES": default_homes, **env}
        if cuda_home is not None:
            full["CUDA_HOME"] = str(cuda_home)
        return subprocess.run([BASH, str(SCRIPT), "--python", str(self.python)], env=full,
                              capture_output=True, text=True, timeout=60)


def exports(stdout: str) -> dict[str, str]:
    """The variables the script's output sets, read back by bash's own eval."""
    out = subprocess.run(
        [BASH, "-c", 'PATH=/FAKE; LDFLAGS=; eval "$1"; for v in '
         'HOROVOD_GPU_OPERATIONS HOROVOD_CUDA_HOME HOROVOD_NCCL_INCLUDE HOROVOD_NCCL_LIB '
         'HOROVOD_NCCL_LINK HOROVOD_BUILD_CUDA_CC_LIST PATH LDFLAGS CMAKE_GENERATOR '
         'CHEXNET_CUDA_ROUTE CHEXNET_CUDA_VERSION CHEXNET_NVCC_VERSION CHEXNET_NCCL_VERSION '
         'CHEXNET_CUDA_KEY; do printf "%s=%s\\n" "$v" "${!v-<unset>}"; done', "_", stdout],
        capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


@pytest.fixture
def env(tmp_path):
    return FakeEnv(tmp_path)


def test_node_toolkit_with_tensorflows_cuda_major_is_used(env):
    env.tensorflow("12.5.1")
    env.cu12_wheels()
    env.nvcc_wheels()                      # present, but a matching node toolkit comes first
    home = fake_toolkit(env.tmp / "cuda-12.4", "12.4.131")
    (env.bin / "nvcc").symlink_to(home / "bin" / "nvcc")
    r = env.run()
    assert r.returncode == 0, r.stderr
    v = exports(r.stdout)
    assert v["CHEXNET_CUDA_ROUTE"] == f"node-toolkit 12.4.131 at {home}"
    assert v["HOROVOD_CUDA_HOME"] == str(home)
    assert v["CHEXNET_CUDA_VERSION"] == "12.4.131"
    assert v["CHEXNET_NCCL_VERSION"] == "2.32.3"
    assert v["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert v["HOROVOD_NCCL_LINK"] == "SHARED"
    assert v["HOROVOD_NCCL_INCLUDE"] == str(env.nv / "nccl/include")
    assert ((Path(v["HOROVOD_NCCL_LIB"]) / "libnccl.so").resolve()
            == env.nv / "nccl/lib/libnccl.so.2")
    assert v["HOROVOD_BUILD_CUDA_CC_LIST"] == "70,75,80,90"   # CUDA 12 still targets V100
    assert v["PATH"] == f"{home}/bin:/FAKE"
    assert "node toolkit CUDA 12.4.131" in r.stderr
    assert not (env.prefix / "cuda-home").exists()


def test_cuda_home_is_tried_before_nvcc_on_path(env):
    env.tensorflow()
    env.cu12_wheels()
    on_path = fake_toolkit(env.tmp / "cuda-12.2", "12.2.140")
    (env.bin / "nvcc").symlink_to(on_path / "bin" / "nvcc")
    chosen = fake_toolkit(env.tmp / "cuda-12.8", "12.8.93")
    v = exports(env.run(cuda_home=chosen).stdout)
    assert v["HOROVOD_CUDA_HOME"] == str(chosen)


def test_mismatching_node_toolkit_falls_back_to_pip_wheels(env):
    env.tensorflow("12.5.1")
    env.cu12_wheels()
    env.nvcc_wheels("13.0.88")
    node = fake_toolkit(env.tmp / "cuda-13.0", "13.0.88")
    r = env.run(path_extra=[node / "bin"])
    assert r.returncode == 0, r.stderr
    # says why the node's toolkit was not used
    assert (f"node toolkit CUDA 13.0.88 at {node}: its major 13 is not TensorFlow's CUDA 12"
            in r.stderr)
    v = exports(r.stdout)
    home = env.prefix / "cuda-home"
    assert v["CHEXNET_CUDA_ROUTE"] == "pip-wheels: nvcc 13.0.88 + CUDA 12.9 headers"
    assert v["HOROVOD_CUDA_HOME"] == str(home)
    assert v["CHEXNET_CUDA_VERSION"] == "12.9"
    assert v["CHEXNET_NVCC_VERSION"] == "13.0.88"
    assert v["CHEXNET_CUDA_KEY"] == "12.9-nvcc13.0.88-sm75.80.90"
    assert v["HOROVOD_BUILD_CUDA_CC_LIST"] == "75,80,90"      # CUDA 13 cannot target sm_70
    assert v["PATH"] == f"{home}/bin:/FAKE"                  # before the node's nvcc
    # the assembled CUDA home: the wheel's nvcc, a profile pointing it here, the cu12 headers,
    # the compiler's own crt/, static libcudart and NCCL under the names the build looks for
    assert (home / "bin/nvcc").resolve() == env.nv / "cu13/bin/nvcc"
    assert "$(_HERE_)/.." in (home / "bin/nvcc.profile").read_text()
    assert not (home / "bin/nvcc.profile").is_symlink()
    assert ((home / "include/cuda_runtime_api.h").resolve()
            == env.nv / "cuda_runtime/include/cuda_runtime_api.h")
    assert (home / "include/crt").resolve() == env.nv / "cu13/include/crt"
    assert (home / "include/nv/target").exists()
    assert (home / "nvvm/bin/cicc").exists()
    assert (home / "lib64/libcudart.so").resolve() == env.nv / "cuda_runtime/lib/libcudart.so.12"
    assert (home / "lib64/libnccl.so").resolve() == env.nv / "nccl/lib/libnccl.so.2"
    assert v["HOROVOD_NCCL_LIB"] == str(home / "lib64")


def test_output_keeps_origin_literal_for_the_runpath(env):
    env.tensorflow()
    env.cu12_wheels()
    env.nvcc_wheels()
    v = exports(env.run().stdout)
    assert v["LDFLAGS"] == "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib"
    assert v["CMAKE_GENERATOR"] == "Unix Makefiles"


def test_own_cuda_home_left_on_path_is_not_a_node_toolkit(env):
    env.tensorflow()
    env.cu12_wheels()
    env.nvcc_wheels()
    first = env.run()
    assert first.returncode == 0, first.stderr
    again = env.run(path_extra=[env.prefix / "cuda-home" / "bin"])   # after an earlier eval
    assert again.returncode == 0, again.stderr
    assert exports(again.stdout)["CHEXNET_CUDA_ROUTE"].startswith("pip-wheels:")
    assert "not used" not in again.stderr


def test_mismatching_toolkit_and_no_nvcc_wheel_names_what_is_missing(env):
    env.tensorflow("12.5.1")
    env.cu12_wheels()
    node = fake_toolkit(env.tmp / "cuda-13.0", "13.0.88")
    r = env.run(default_homes=str(node))
    assert r.returncode == 2
    assert r.stdout == ""
    assert "its major 13 is not TensorFlow's CUDA 12" in r.stderr
    assert "nvcc: no CUDA toolkit whose major is 12" in r.stderr
    assert "pip install nvidia-cuda-nvcc==13.0.88" in r.stderr  # the pin of requirements/gpu.txt


def test_no_nvcc_anywhere_and_no_wheel_fails(env):
    env.tensorflow()
    env.cu12_wheels(cccl=False)
    r = env.run()
    assert r.returncode == 2
    assert r.stdout == ""
    assert "missing: nvcc" in r.stderr
    assert "nvidia-cuda-cccl-cu12==12.9.27" in r.stderr


def test_nvcc_wheel_without_cicc_and_crt_names_both(env):
    env.tensorflow()
    env.cu12_wheels()
    env.nvcc_wheels(nvvm=False, crt=False)
    r = env.run()
    assert r.returncode == 2
    assert "cicc" in r.stderr and "nvidia-nvvm==13.0.88" in r.stderr
    assert "crt/ headers" in r.stderr and "nvidia-cuda-crt==13.0.88" in r.stderr
    assert not (env.prefix / "cuda-home").exists()


def test_no_nccl_wheel_fails_even_with_a_matching_toolkit(env):
    env.tensorflow()
    env.cu12_wheels()
    shutil.rmtree(env.nv / "nccl")
    home = fake_toolkit(env.tmp / "cuda-12.4", "12.4.131")
    r = env.run(cuda_home=home)
    assert r.returncode == 2
    assert "nvidia-nccl-cu12==2.32.3" in r.stderr


def test_cpu_tensorflow_is_refused(env):
    env.tensorflow(cuda="", cuda_build=False)
    env.cu12_wheels()
    env.nvcc_wheels()
    r = env.run()
    assert r.returncode == 2
    assert "not a CUDA build" in r.stderr


def test_no_tensorflow_is_refused(env):
    r = env.run()
    assert r.returncode == 2
    assert "TensorFlow is not installed" in r.stderr


def test_runtime_headers_of_another_major_are_refused(env):
    env.tensorflow("12.5.1")
    env.cu12_wheels(cudart=11080)
    env.nvcc_wheels()
    r = env.run()
    assert r.returncode == 2
    assert "has CUDA 11.8" in r.stderr


def test_compute_capability_the_compiler_cannot_target_is_refused(env):
    env.tensorflow()
    env.cu12_wheels()
    env.nvcc_wheels("13.0.88")
    r = env.run(HOROVOD_BUILD_CUDA_CC_LIST="70,80")
    assert r.returncode == 2
    assert "cannot target 70" in r.stderr
    ok = env.run(HOROVOD_BUILD_CUDA_CC_LIST="80,90")
    assert exports(ok.stdout)["HOROVOD_BUILD_CUDA_CC_LIST"] == "80,90"


def test_gpu_requirements_pin_every_wheel_the_route_names():
    text = (ROOT / "requirements" / "gpu.txt").read_text()
    for name in ("tensorflow[and-cuda]", "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt",
                 "nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12", "nvidia-nccl-cu12"):
        assert f"\n{name}==" in text, name
    tf_cpu = ROOT / "requirements" / "tf-cpu.txt"
    if tf_cpu.exists():   # the same TensorFlow version on CPU and GPU
        cpu = [ln.split("==")[1] for ln in tf_cpu.read_text().splitlines()
               if ln.startswith("tensorflow-cpu==")]
        gpu = [ln.split("==")[1] for ln in text.splitlines()
               if ln.startswith("tensorflow[and-cuda]==")]
        assert cpu == gpu
