"""The one NVML enumeration and the one nvidia-smi runner that devices, gpu_monitor and
gpu_topology share (fakes: no GPU here)."""

import subprocess

import pytest

from chexnet_utils.hardware import devices, gpu_monitor


class _Nvml:
    def __init__(self, names, fail=None):
        self.names, self.fail, self.shutdowns = names, fail, 0

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError(self.fail)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:04d}"


def test_nvml_inventory_lists_and_shuts_down():
    fake = _Nvml(["A100", "A100"])
    gpus = devices.nvml_inventory(fake)
    assert [(g.index, g.name, g.uuid) for g in gpus] == [(0, "A100", "GPU-0000"),
                                                         (1, "A100", "GPU-0001")]
    assert fake.shutdowns == 1


def test_nvml_inventory_unavailable_carries_the_reason_into_nvml_status():
    with pytest.raises(devices.NvmlUnavailable, match="Driver Not Loaded"):
        devices.nvml_inventory(_Nvml([], fail="Driver Not Loaded"))
    status = gpu_monitor.nvml_status(_Nvml([], fail="Driver Not Loaded"))
    assert not status.available and status.reason.endswith("Driver Not Loaded")


def test_run_nvidia_smi_stdout_or_none():
    calls = []

    def ok(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "GPU 0: X (UUID: GPU-1)\n", "")

    def bad(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 9, "", "NVIDIA-SMI has failed")

    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, 30)

    assert (devices.run_nvidia_smi(["-L"], ok).startswith("GPU 0")
            and calls == [["nvidia-smi", "-L"]])
    assert devices.run_nvidia_smi(["-L"], bad) is None
    assert devices.run_nvidia_smi(["topo", "-m"], hang) is None


def test_usable_cpus_matches_affinity_and_count():
    import os

    assert set(devices.usable_cpus()) == os.sched_getaffinity(0)
    assert devices.usable_cores() == len(devices.usable_cpus())
