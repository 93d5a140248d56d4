"""The environment report of this machine (imports TensorFlow and Horovod in-process): it has
what ``make setup`` promises."""

from chexnet_utils.hardware import envcheck


def test_report_on_this_machine_has_what_setup_promises():
    report = envcheck.environment_report()
    status = envcheck.capability_status(report)
    # make setup ends with this same requirement; the test environment is that environment
    envcheck.require_capabilities(report, ["tensorflow", "horovod", "mpi", "gloo"])
    assert status["tensorflow"] and status["horovod"] and status["mpi"] and status["gloo"]
    rows = dict(envcheck.versions_table(report))
    assert rows["TensorFlow"].startswith("2.")
    assert "Open MPI" in rows["MPI"]


def test_horovodrun_check_build_says_what_was_built_with_one_tensorflow_import():
    """``patches/horovod-0.28.1/05-*.patch``: the released check printed ``[X] PyTorch`` for
    this TensorFlow-only build (``horovod.torch`` imports as a stub; horovod/horovod#3858)
    and imported TensorFlow once per question, six times."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([str(Path(sys.executable).parent / "horovodrun"), "--check-build",
                          "--verbose"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    marks = dict((name.strip(), mark == "X") for mark, name in re.findall(r"\[(X| )\] (\w+)", out))
    assert marks["TensorFlow"] and not marks["PyTorch"] and not marks["MXNet"], out
    assert marks["MPI"] and marks["Gloo"] and not marks["NCCL"], out
    # --verbose: one line per forked check; the released check asked TensorFlow's six times
    assert out.count("Checking whether extension tensorflow") == 1, out
