"""The environment check's verdicts on a made-up report: a missing capability is loud. The
report of this machine is in tests/tf/test_envcheck.py."""

import pytest

from chexnet_utils.hardware import envcheck


def test_missing_capability_is_loud():
    fake = {"tensorflow": {"tensorflow": "2.18.1", "gpus": []},
            "horovod_build": {"horovod": "0.28.1", "mpi": True, "gloo": False}, "mpi": "x"}
    with pytest.raises(RuntimeError, match=r"missing \['gloo'\].*HOROVOD_WITH_GLOO"):
        envcheck.require_capabilities(fake, ["tensorflow", "gloo"])
    with pytest.raises(ValueError, match="unknown capability"):
        envcheck.require_capabilities(fake, ["quantum"])
    assert envcheck.capability_status(fake)["gpu"] is False
