import pytest

from chexnet_utils import envcheck


def test_report_on_this_machine_has_what_setup_promises():
    report = envcheck.environment_report()
    status = envcheck.capability_status(report)
    # make setup ends with this same requirement; the test environment is that environment
    envcheck.require_capabilities(report, ["tensorflow", "horovod", "mpi", "gloo"])
    assert status["tensorflow"] and status["horovod"] and status["mpi"] and status["gloo"]
    rows = dict(envcheck.versions_table(report))
    assert rows["TensorFlow"].startswith("2.")
    assert "Open MPI" in rows["MPI"]


def test_missing_capability_is_loud():
    fake = {"tensorflow": {"tensorflow": "2.18.1", "gpus": []},
            "horovod_build": {"horovod": "0.28.1", "mpi": True, "gloo": False}, "mpi": "x"}
    with pytest.raises(RuntimeError, match=r"missing \['gloo'\].*HOROVOD_WITH_GLOO"):
        envcheck.require_capabilities(fake, ["tensorflow", "gloo"])
    with pytest.raises(ValueError, match="unknown capability"):
        envcheck.require_capabilities(fake, ["quantum"])
    assert envcheck.capability_status(fake)["gpu"] is False
