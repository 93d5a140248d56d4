"""Every GPU-only branch that needs no TensorFlow, exercised on a CPU with fakes: visible-GPU
counting (``CUDA_VISIBLE_DEVICES``), workers per node, the mixed-precision and XLA switches,
the NVML sampler, ``nvidia-smi topo -m`` parsing and socket binding, and the ``bench gpu-node``
report and command. The TensorFlow ones are in tests/tf, the engine one in tests/mpi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from chexnet_utils.bench import gpu_node
from chexnet_utils.bench.engine_steps import StepConfig
from chexnet_utils.cli import main
from chexnet_utils.hardware import devices, gpu_monitor, gpu_topology
from chexnet_utils.model import accelerator

# --------------------------------------------------------------------------------------------
# fixtures: illustrative driver output (written for these tests, not captured from a machine)
# --------------------------------------------------------------------------------------------

SMI_LIST = """\
GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-3f5f2d4a-0000-1111-2222-aaaaaaaaaaaa)
GPU 1: Tesla V100-SXM2-16GB (UUID: GPU-3f5f9e01-0000-1111-2222-bbbbbbbbbbbb)
GPU 2: Tesla V100-SXM2-16GB (UUID: GPU-77c0aa11-0000-1111-2222-cccccccccccc)
GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-9a9a0b0b-0000-1111-2222-dddddddddddd)
  MIG 3g.20gb     Device  0: (UUID: MIG-5c5c1d1d-0000-1111-2222-eeeeeeeeeeee)
  MIG 3g.20gb     Device  1: (UUID: MIG-6d6d2e2e-0000-1111-2222-ffffffffffff)
"""

# Illustrative 2-socket, 8-GPU DGX-1-like node, as `nvidia-smi topo -m` prints it with a
# recent driver: underlined header (ANSI codes), an extra "GPU NUMA ID" column, NIC rows.
TOPO_DGX1 = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tCPU Affinity\t"
    "NUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0\t\tN/A\n"
    "GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0\t\tN/A\n"
    "GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\tSYS\t0-19,40-59\t0\t\tN/A\n"
    "GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\tSYS\t0-19,40-59\t0\t\tN/A\n"
    "GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\tPIX\t20-39,60-79\t1\t\tN/A\n"
    "GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\tPIX\t20-39,60-79\t1\t\tN/A\n"
    "GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\tPHB\t20-39,60-79\t1\t\tN/A\n"
    "GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\tPHB\t20-39,60-79\t1\t\tN/A\n"
    "NIC0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPHB\tPHB\tSYS\t X \n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP "
    "interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)

# Illustrative single-socket node with 4 PCIe GPUs (a workstation-class server), spaces
# instead of tabs as when the output is copied from a terminal.
TOPO_4GPU_ONE_SOCKET = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      PHB     SYS     SYS     0-31    0
GPU1    PHB      X      SYS     SYS     0-31    0
GPU2    SYS     SYS      X      PHB     0-31    0
GPU3    SYS     SYS     PHB      X      0-31    0

Legend:

  X    = Self
"""


def fake_gpus(n: int) -> list[devices.GpuDevice]:
    return [devices.GpuDevice(i, "Fake V100", f"GPU-{i:08x}-fake") for i in range(n)]


def test_nvidia_smi_list_is_parsed_with_mig_instances() -> None:
    gpus = devices.parse_nvidia_smi_list(SMI_LIST)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].name == "Tesla V100-SXM2-16GB" and gpus[3].name == "NVIDIA A100-SXM4-40GB"
    assert gpus[1].uuid == "GPU-3f5f9e01-0000-1111-2222-bbbbbbbbbbbb"
    assert gpus[3].mig_uuids == ("MIG-5c5c1d1d-0000-1111-2222-eeeeeeeeeeee",
                                 "MIG-6d6d2e2e-0000-1111-2222-ffffffffffff")
    assert gpus[0].mig_uuids == ()


@pytest.mark.parametrize(("spec", "expected"), [
    (None, [0, 1, 2, 3]),
    ("", []),
    ("  ", []),
    ("-1", []),
    ("2,0", [2, 0]),
    ("0,-1,1", [0]),           # the list ends at the first invalid entry
    ("1,7,2", [1]),            # out of range ends it too
    ("1, 1 ,3", [1, 3]),       # a repeat counts once, blanks around entries are fine
    ("GPU-77c0aa11-0000-1111-2222-cccccccccccc", [2]),
    ("GPU-9a9a,GPU-3f5f9", [3, 1]),  # unique UUID prefixes
    ("GPU-3f5f", []),          # ambiguous prefix: matches GPUs 0 and 1
    ("GPU-deadbeef,0", []),    # unknown UUID first
])
def test_cuda_visible_devices_as_cuda_reads_it(spec: str | None, expected: list[int]) -> None:
    physical = devices.parse_nvidia_smi_list(SMI_LIST)
    env = {} if spec is None else {"CUDA_VISIBLE_DEVICES": spec}
    assert [g.index for g in devices.visible_gpus(env, physical)] == expected


def test_mig_uuids_count_as_devices() -> None:
    physical = devices.parse_nvidia_smi_list(SMI_LIST)
    env = {"CUDA_VISIBLE_DEVICES": "MIG-5c5c1d1d,MIG-6d6d2e2e"}
    seen = devices.visible_gpus(env, physical)
    assert len(seen) == 2 and all(g.index == 3 for g in seen)
    assert [g.uuid for g in seen] == ["MIG-5c5c1d1d", "MIG-6d6d2e2e"]


def test_physical_gpus_from_nvidia_smi_or_nothing() -> None:
    def ok(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert cmd == ["nvidia-smi", "-L"]
        return subprocess.CompletedProcess(cmd, 0, SMI_LIST, "")

    def no_driver(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 9, "", "NVIDIA-SMI has failed")

    def missing(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("nvidia-smi")

    assert len(devices.physical_gpus(run=ok)) == 4
    assert devices.physical_gpus(run=no_driver) == []
    assert devices.physical_gpus(run=missing) == []


def test_worker_plan_counts_gpus_else_cores() -> None:
    # CPU only: exactly the notebooks' old rule, min(max_workers, max(2, cores))
    for max_workers in (1, 2, 4, 8):
        for cores in (1, 2, 3, 16):
            plan = devices.worker_plan(max_workers, min_workers=2, gpus=0, cores=cores)
            assert plan.n == min(max_workers, max(2, cores))
            assert plan.device == "CPU" and plan.engine_env == {}
    # the case: a 4-GPU node at the gpu-node scale (8 workers max) gets 4, not 8
    plan = devices.worker_plan(8, min_workers=2, gpus=4, cores=64)
    assert (plan.n, plan.device) == (4, "GPU")
    assert "4 GPU(s) visible" in plan.reason
    assert devices.worker_plan(8, gpus=8, cores=2).n == 8   # cores do not matter on GPUs
    assert devices.worker_plan(8, gpus=16, cores=64).n == 8  # the scale's ceiling
    assert devices.worker_plan(2, min_workers=2, gpus=4, cores=64).n == 2
    # one GPU, a notebook that needs two workers: CPU workers, the GPU hidden from them
    one = devices.worker_plan(4, min_workers=2, gpus=1, cores=8)
    assert (one.n, one.device) == (4, "CPU")
    assert one.engine_env == {"CUDA_VISIBLE_DEVICES": ""}
    assert devices.worker_plan(4, min_workers=1, gpus=1, cores=8).n == 1
    with pytest.raises(ValueError):
        devices.worker_plan(0)


def test_worker_plan_reads_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "physical_gpus", lambda run=None: fake_gpus(4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert devices.worker_plan(8, gpus=None, cores=64).n == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    plan = devices.worker_plan(8, gpus=None, cores=3)
    assert (plan.n, plan.device, plan.gpus) == (3, "CPU", 0)


def test_xla_under_horovod_needs_its_xla_ops() -> None:
    sw = accelerator.resolve_switches(has_gpu=True, distributed=True, env={})
    assert sw.mixed_precision and sw.device_feed and not sw.xla
    assert "HOROVOD_ENABLE_XLA_OPS" in sw.why["xla"]
    assert accelerator.resolve_switches(has_gpu=True, distributed=True,
                                        env={"HOROVOD_ENABLE_XLA_OPS": "1"}).xla


@pytest.mark.parametrize("asked", [{"xla": True}, {"env": {"CHEXNET_XLA": "on"}},
                                   {"env": {"CHEXNET_XLA": "on", "HOROVOD_ENABLE_XLA_OPS": "1"}}])
def test_xla_asked_for_under_horovod_without_a_gpu_is_off_saying_why(asked: dict) -> None:
    """Issue 45 (d): XLA cannot compile Horovod's allreduce on a CPU (tests/mpi shows the
    compile error), so under Horovod it is off on purpose however it was asked for; one
    worker keeps it."""
    env = asked.get("env", {})
    sw = accelerator.resolve_switches(xla=asked.get("xla"), has_gpu=False, distributed=True,
                                      env=env)
    assert not sw.xla and sw.why["xla"].startswith("off although")
    assert "cannot compile Horovod's allreduce on a CPU" in sw.why["xla"]
    assert accelerator.resolve_switches(xla=asked.get("xla"), has_gpu=False, env=env).xla


def test_switch_overrides_arguments_then_environment() -> None:
    env = {"CHEXNET_MIXED_PRECISION": "off", "CHEXNET_XLA": "1"}
    sw = accelerator.resolve_switches(has_gpu=True, env=env)
    assert (sw.mixed_precision, sw.xla) == (False, True)
    assert sw.why["mixed_precision"] == "CHEXNET_MIXED_PRECISION=off"
    sw = accelerator.resolve_switches(mixed_precision=True, xla="off", has_gpu=False, env=env)
    assert (sw.mixed_precision, sw.xla) == (True, False)
    feed = accelerator.resolve_switches(has_gpu=False, env={"CHEXNET_DEVICE_FEED": "on"})
    assert feed.device_feed and feed.why["device_feed"] == "CHEXNET_DEVICE_FEED=on"
    assert accelerator.resolve_switches(has_gpu=True, env={"CHEXNET_XLA": "auto"}).xla
    with pytest.raises(ValueError, match="CHEXNET_XLA"):
        accelerator.resolve_switches(has_gpu=True, env={"CHEXNET_XLA": "maybe"})


def test_float16_sigmoid_saturates_which_is_why_the_head_is_float32() -> None:
    logits = np.array([9.0, 10.0, 12.0])
    p32 = 1 / (1 + np.exp(-logits.astype(np.float32)))
    p16 = (1 / (1 + np.exp(-logits))).astype(np.float16)
    assert np.all(p16 == 1.0)               # log(1 - p) = -inf in float16
    assert np.all(p32 < 1.0)
    # the docstring's threshold: probabilities above ~0.9998 round to 1 in float16
    assert np.float16(0.99976) == 1.0 and np.float16(0.9997) < 1.0


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """The part of ``pynvml`` the sampler uses; utilisation follows ``pattern`` per GPU."""

    def __init__(self, names: list[str], pattern: list[int], fail: str | None = None) -> None:
        self.names, self.pattern, self.fail = names, pattern, fail
        self.calls = 0
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.fail:
            raise FakeNVMLError(self.fail)
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:  # noqa: N802
        return self.names[h].encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:  # noqa: N802
        self.calls += 1
        return SimpleNamespace(gpu=self.pattern[(self.calls - 1) % len(self.pattern)], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=(h + 1) * 2**30, total=16 * 2**30)


def test_nvml_status_without_a_gpu_says_so() -> None:
    down = gpu_monitor.nvml_status(FakeNvml([], [0], fail="NVML Shared Library Not Found"))
    assert not down.available
    assert down.reason == f"{gpu_monitor.NO_GPU}: NVML Shared Library Not Found"
    none = gpu_monitor.nvml_status(FakeNvml([], [0]))
    assert not none.available and none.reason.startswith(gpu_monitor.NO_GPU)
    up = gpu_monitor.nvml_status(FakeNvml(["Tesla V100", "Tesla V100"], [0]))
    assert up.available and up.names == ("Tesla V100", "Tesla V100")
    # the real machine: without a GPU the sentence starts the same way
    real = gpu_monitor.nvml_status()
    if not devices.physical_gpus():
        assert not real.available and real.reason.startswith(gpu_monitor.NO_GPU)
    with pytest.raises(RuntimeError, match="no NVIDIA GPU"):
        gpu_monitor.UtilisationSampler(nvml=FakeNvml([], [0], fail="no driver")).start()


def test_sampler_records_every_gpu_while_the_work_runs() -> None:
    import threading

    class CountingNvml(FakeNvml):
        """Tells the workload when the sampler has read every GPU ``rounds`` times."""

        def __init__(self, rounds: int) -> None:
            super().__init__(["Tesla V100", "Tesla V100"], [0, 90, 0, 90, 85])
            self.rounds, self.enough = rounds, threading.Event()

        def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:  # noqa: N802
            reading = super().nvmlDeviceGetUtilizationRates(h)
            if self.calls >= self.rounds * len(self.names):
                self.enough.set()
            return reading

    nvml = CountingNvml(rounds=5)

    def work() -> str:  # runs until the sampler has taken 5 rounds, however busy the machine
        assert nvml.enough.wait(timeout=60), "the sampler thread never took 5 rounds"
        return "done"

    # a fake clock: 0.01 s per reading so far, so the stamps do not depend on the machine
    with gpu_monitor.UtilisationSampler(0.001, None, nvml,
                                        clock=lambda: 0.01 * nvml.calls) as sampler:
        result = work()
    samples = sampler.samples
    assert result == "done"
    assert {s.gpu for s in samples} == {0, 1}
    per_gpu = [s for s in samples if s.gpu == 0]
    assert len(per_gpu) >= 6            # the first, 4+ from the thread, one last at stop
    times = [s.t for s in per_gpu]      # one round of 2 readings = 0.02 s
    assert times == pytest.approx([0.02 * k for k in range(len(times))])
    assert {s.mem_used_mib for s in samples if s.gpu == 1} == {2048.0}
    assert nvml.shutdowns >= nvml.inits - 1  # every init of the sampler is shut down
    summary = gpu_monitor.summarise(samples)
    utils = [s.util_percent for s in samples]
    assert summary["mean_util_percent"] == pytest.approx(sum(utils) / len(utils))
    assert summary["idle_share"] == pytest.approx(sum(u < 10 for u in utils) / len(utils))
    with pytest.raises(ValueError):
        gpu_monitor.summarise([])


def test_cpu_lists() -> None:
    assert gpu_topology.parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert gpu_topology.parse_cpu_list("5") == (5,)
    with pytest.raises(ValueError):
        gpu_topology.parse_cpu_list("0-x")


def test_topology_of_a_dgx1_like_node() -> None:
    rows = gpu_topology.parse_topology(TOPO_DGX1)
    assert [r.gpu for r in rows] == list(range(8))          # NIC rows skipped
    assert [r.numa for r in rows] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert rows[0].cpus == (*range(0, 20), *range(40, 60))
    assert rows[7].cpus == (*range(20, 40), *range(60, 80))
    # the package's own illustrative example parses the same way
    example = gpu_topology.parse_topology(gpu_topology.EXAMPLE_DGX1_TOPOLOGY)
    assert [(r.gpu, r.numa, r.cpus) for r in example] == [(r.gpu, r.numa, r.cpus) for r in rows]


def test_binding_on_a_dgx1_like_node() -> None:
    rows = gpu_topology.parse_topology(TOPO_DGX1)
    plan = gpu_topology.binding_plan(rows, 8)
    # GPUs 0-3 on socket 0, 4-7 on socket 1: 4 ranks per socket, filled in order
    assert plan.mpirun_args == ("--map-by", "ppr:4:socket", "--bind-to", "socket")
    assert not plan.self_bind
    assert plan.rank_domains == (0, 0, 0, 0, 1, 1, 1, 1)
    assert "rank 5 -> GPU 5: NUMA node 1, cores 20-39,60-79" in plan.explanation
    # round-robin --map-by socket would be wrong here; it is right when the GPUs alternate
    alternating = gpu_topology.binding_plan(rows, 4, visible=[0, 4, 1, 5])
    assert alternating.mpirun_args == ("--map-by", "socket", "--bind-to", "socket")
    assert alternating.rank_gpus == (0, 4, 1, 5)
    # only socket 1's GPUs: ranks would start on socket 0, so each rank binds itself
    upper = gpu_topology.binding_plan(rows, 4, visible=[4, 5, 6, 7])
    assert upper.self_bind and upper.mpirun_args == ("--bind-to", "none")
    assert upper.rank_cpus[0] == (*range(20, 40), *range(60, 80))
    # 6 ranks: 4 on socket 0, 2 on socket 1
    assert gpu_topology.binding_plan(rows, 6).mpirun_args[:2] == ("--map-by", "ppr:4:socket")
    assert gpu_topology.binding_plan(rows, 4, unit="numa").mpirun_args == (
        "--map-by", "ppr:4:numa", "--bind-to", "numa")
    with pytest.raises(ValueError, match="not in the topology"):
        gpu_topology.binding_plan(rows, 2, visible=[0, 9])


def test_binding_on_a_single_socket_4gpu_node() -> None:
    rows = gpu_topology.parse_topology(TOPO_4GPU_ONE_SOCKET)
    assert [(r.gpu, r.numa, len(r.cpus)) for r in rows] == [(i, 0, 32) for i in range(4)]
    plan = gpu_topology.binding_plan(rows, 4)
    assert plan.mpirun_args == ("--map-by", "ppr:4:socket", "--bind-to", "socket")
    assert plan.rank_cpus == tuple(tuple(range(32)) for _ in range(4))
    with pytest.raises(ValueError, match=r"GPU\(s\) \[4\] not in the topology"):
        gpu_topology.binding_plan(rows, 5)
    with pytest.raises(ValueError, match="3 rank.* but 2 visible"):
        gpu_topology.binding_plan(rows, 3, visible=[0, 1])


def test_topology_without_numa_column_binds_explicitly() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-7\nGPU1\tSYS\t X \t8-15\n"
    rows = gpu_topology.parse_topology(text)
    assert [r.numa for r in rows] == [None, None]
    plan = gpu_topology.binding_plan(rows, 2)
    assert plan.self_bind and plan.rank_cpus == (tuple(range(8)), tuple(range(8, 16)))
    with pytest.raises(ValueError, match="CPU Affinity"):
        gpu_topology.parse_topology("GPU 0: Tesla V100 (UUID: GPU-1)")


def test_read_topology_runs_nvidia_smi() -> None:
    def ok(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert cmd == ["nvidia-smi", "topo", "-m"]
        return subprocess.CompletedProcess(cmd, 0, TOPO_DGX1, "")

    assert gpu_topology.read_topology(run=ok) == TOPO_DGX1
    assert gpu_topology.read_topology(
        run=lambda cmd, **_: subprocess.CompletedProcess(cmd, 9, "", "failed")) is None


def test_bind_this_process_in_a_child() -> None:
    core = min(os.sched_getaffinity(0))
    code = ("from chexnet_utils.hardware.gpu_topology import bind_this_process; "
            f"print(bind_this_process([{core}, 100000]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == f"({core},)"
    with pytest.raises(ValueError, match="exists"):
        gpu_topology.bind_this_process([100000])  # raises before touching this process


def fake_run(rate_1: float = 300.0, loss_per_gpu: float = 0.03):
    """A "train on k GPUs" stand-in: each extra GPU costs ``loss_per_gpu`` of efficiency."""
    calls: list[tuple[int, StepConfig]] = []

    def run(k: int, cfg: StepConfig) -> dict[str, Any]:
        calls.append((k, cfg))
        return {"rank": 0, "size": k, "img_per_s": rate_1 * k * (1 - loss_per_gpu * (k - 1)),
                "mixed_precision": True, "xla": False, "window": [0.0, 1.0]}

    return run, calls


def test_gpu_counts() -> None:
    assert gpu_node.gpu_counts(8) == [1, 2, 3, 4, 8]
    assert gpu_node.gpu_counts(4) == [1, 2, 3, 4]
    assert gpu_node.gpu_counts(6) == [1, 2, 3, 4, 6]
    assert gpu_node.gpu_counts(4, [4, 1, 2]) == [1, 2, 4]
    with pytest.raises(ValueError, match="8 GPUs but 4"):
        gpu_node.gpu_counts(4, [1, 2, 4, 8])
    with pytest.raises(ValueError, match="include 1"):
        gpu_node.gpu_counts(4, [2, 4])
    with pytest.raises(gpu_node.NoGPUError, match="no NVIDIA GPU visible"):
        gpu_node.gpu_counts(0)


def test_bench_gpu_node_with_a_fake_runner() -> None:
    run, calls = fake_run()
    r = gpu_node.bench_gpu_node("/nowhere", [1, 2, 4], visible=fake_gpus(4), run=run,
                                topology=TOPO_4GPU_ONE_SOCKET, steps=7, batch_size=24)
    assert [k for k, _ in calls] == [1, 2, 4]
    cfg = calls[-1][1]
    assert (cfg.arch, cfg.image_size, cfg.batch_size, cfg.steps, cfg.pipeline) == (
        "densenet121", 224, 24, 7, "new")
    rates = {k: run(k, cfg)["img_per_s"] for k in (1, 2, 4)}
    assert isinstance(r, gpu_node.GpuNodeResult) and r.gpus == [1, 2, 4]
    for k in (1, 2, 4):
        assert r.img_per_s[k] == pytest.approx(rates[k])
        assert r.speedup[k] == pytest.approx(rates[k] / rates[1])
        assert r.efficiency[k] == pytest.approx(rates[k] / (k * rates[1]))
    assert r.runs[4]["mpirun_args"] == ["--map-by", "ppr:4:socket", "--bind-to", "socket"]
    assert r.mixed_precision is True and r.xla is False
    assert r.gpu_names == [g.name for g in fake_gpus(4)]
    assert (r.arch, r.image_size, r.batch_size_per_gpu, r.steps, r.pipeline) == (
        "densenet121", 224, 24, 7, "new")
    # the per-GPU batch defaults to the gpu-node scale's
    from chexnet_utils import config

    run2, calls2 = fake_run()
    gpu_node.bench_gpu_node("/nowhere", [1], visible=fake_gpus(1), run=run2, topology="")
    assert calls2[0][1].batch_size == config.scale("gpu-node").batch_size
    with pytest.raises(gpu_node.NoGPUError):
        gpu_node.bench_gpu_node("/nowhere", visible=[], run=run)


def test_both_archs_side_by_side() -> None:
    runners = {"densenet121": fake_run(300.0, 0.05), "resnet50": fake_run(500.0, 0.02)}
    tables = {arch: gpu_node.bench_gpu_node("/nowhere", [1, 2], arch=arch, visible=fake_gpus(2),
                                            run=runners[arch][0], topology="")
              for arch in gpu_node.ARCHS}
    for arch, (_, calls) in runners.items():
        assert [cfg.arch for _, cfg in calls] == [arch, arch]
    lines = gpu_node.format_arch_comparison(tables).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["1", "2"]
    assert lines[0].split() == ["GPUs", "densenet121", "img/s", "eff.",
                                "resnet50", "img/s", "eff."]
    row = lines[2].split()
    assert row[0] == "2"
    for arch, (rate, eff) in zip(gpu_node.ARCHS, [row[1:3], row[3:5]], strict=True):
        assert float(rate) == pytest.approx(tables[arch].img_per_s[2], abs=0.05)
        assert eff == f"{tables[arch].efficiency[2]:.0%}"


def test_report_table_and_reference_points() -> None:
    run, _ = fake_run()
    r = gpu_node.bench_gpu_node("/nowhere", None, visible=fake_gpus(8), run=run, topology="")
    text = str(r)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["GPUs", "images/s"])
    rows = [line.split() for line in lines[header + 1:header + 6]]
    assert [int(row[0]) for row in rows] == [1, 2, 3, 4, 8]      # the articles' GPU counts
    for row in rows:
        k = int(row[0])
        assert float(row[1]) == pytest.approx(r.img_per_s[k], abs=0.05)
        assert row[2] == f"{r.speedup[k]:.2f}x"
        assert row[3] == f"{r.efficiency[k]:.0%}"
    assert "published, not measured here" in text
    for ref in gpu_node.REFERENCES:
        assert ref["source"] in text and ref["machine"] in text
    assert "Fake V100" in text


def test_gpu_node_result_from_known_numbers_and_its_json() -> None:
    """Derived figures from two runs (300 and 540 img/s), the table's text, and the JSON: the
    old report's keys, GPU counts as strings, the same numbers after a round trip."""
    from chexnet_utils.platform.atomic import json_safe

    runs = {1: {"img_per_s": 300.0, "mixed_precision": True, "xla": None},
            2: {"img_per_s": 540.0, "mixed_precision": True, "xla": None}}
    r = gpu_node.GpuNodeResult(gpus=[1, 2], gpu_names=["V100", "V100"], arch="densenet121",
                               image_size=224, batch_size_per_gpu=32, pipeline="new", steps=5,
                               warmup_steps=2, runs=runs)
    assert r.img_per_s == {1: 300.0, 2: 540.0}
    assert r.speedup == pytest.approx({1: 1.0, 2: 1.8})
    assert r.efficiency == pytest.approx({1: 1.0, 2: 0.9})
    assert (r.mixed_precision, r.xla) == (True, None)
    assert r.references == [dict(ref) for ref in gpu_node.REFERENCES]
    lines = str(r).splitlines()
    assert lines[0] == ("CheXNet densenet121 at 224 px, batch 32 per GPU, new pipeline, mixed "
                        "precision on, XLA ?; measured on this node (V100)")
    assert lines[2:4] == ["    1      300.0     1.00x       100%",
                          "    2      540.0     1.80x        90%"]
    d = json.loads(json.dumps(json_safe(r)))
    assert list(d) == ["gpus", "gpu_names", "arch", "image_size", "batch_size_per_gpu",
                       "pipeline", "steps", "warmup_steps", "mixed_precision", "xla",
                       "img_per_s", "speedup", "efficiency", "runs", "references"]
    assert d["img_per_s"] == {"1": 300.0, "2": 540.0} and d["efficiency"]["2"] == 0.9
    assert d["speedup"]["2"] == pytest.approx(1.8) and d["runs"]["2"]["img_per_s"] == 540.0
    assert d["mixed_precision"] is True and d["xla"] is None and d["gpus"] == [1, 2]


def test_utilisation_old_vs_new_with_fakes_and_its_figure() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from chexnet_utils import plots

    run, calls = fake_run()
    nvml = FakeNvml(["Tesla V100"], [0, 0, 90, 0, 95])
    out = gpu_node.utilisation_old_vs_new("/nowhere", nvml=nvml, run=run, interval=0.01)
    assert list(out) == ["old", "new"] and [c.pipeline for _, c in calls] == ["old", "new"]
    assert all(k == 1 for k, _ in calls)
    for p in out.values():
        assert (p["samples"]
                and {"t", "gpu", "util_percent", "mem_used_mib"} <= set(p["samples"][0]))
        assert 0 <= p["summary"]["idle_share"] <= 1
    fig = plots.gpu_utilisation(out)
    assert len(fig.axes) == 2 and "old pipeline" in fig.axes[0].get_title()
    with pytest.raises(gpu_node.NoGPUError, match="no NVIDIA GPU / NVML"):
        gpu_node.utilisation_old_vs_new("/nowhere", nvml=FakeNvml([], [0], fail="x"), run=run)


def test_cli_gpu_node_without_gpu_exits_non_zero(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(devices, "visible_gpus", lambda env=None, physical=None: [])
    out = tmp_path / "r.json"
    assert main(["bench", "gpu-node", "--gpus", "1,2,4,8", "--json", str(out)]) == 3
    assert "no NVIDIA GPU visible" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(bool(devices.visible_gpus()), reason="this machine has a GPU")
def test_cli_gpu_node_on_this_cpu_machine() -> None:
    res = subprocess.run([sys.executable, "-m", "chexnet_utils", "bench", "gpu-node", "--gpus",
                          "1,2,4,8"], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert res.stderr.startswith("no NVIDIA GPU visible:")


def test_cli_gpu_node_with_fake_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    run, calls = fake_run()
    monkeypatch.setattr(devices, "visible_gpus", lambda env=None, physical=None: fake_gpus(4))
    monkeypatch.setattr(gpu_node, "cluster_runner", lambda *a, **k: run)
    monkeypatch.setattr("chexnet_utils.hardware.gpu_topology.read_topology", lambda run=None: None)
    out = tmp_path / "r.json"
    rc = main(["bench", "gpu-node", "--gpus", "1,2,4", "--json", str(out), "--tfrecords",
               str(tmp_path), "--steps", "5", "--xla", "off"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "GPUs" in printed and "reference points" in printed
    report = json.loads(out.read_text())
    assert report["gpus"] == [1, 2, 4] and [k for k, _ in calls] == [1, 2, 4]
    assert calls[0][1].xla is False and calls[0][1].mixed_precision is None
    assert report["efficiency"]["4"] == pytest.approx(
        report["img_per_s"]["4"] / (4 * report["img_per_s"]["1"]))
