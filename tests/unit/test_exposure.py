"""#30 item 1: the unauthenticated servers (tf.data service, MultiWorkerMirroredStrategy) are
started only where no other account can reach them, and refuse on a shared host."""

import os
import subprocess

import psutil
import pytest

from chexnet_utils import exposure
from chexnet_utils.exposure import SharedHostError, require_private_network

OTHER_UID = 4242  # a person's uid (>= UID_MIN) that no account here has


def test_uid_min_is_read_from_login_defs(tmp_path):
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 2000\nUID_MAX 60000\n")
    assert exposure.uid_min(defs) == 2000
    assert exposure.uid_min(tmp_path / "missing") == 1000


def test_refuses_on_a_shared_host_and_says_how_to_opt_in(monkeypatch):
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: False)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 3})
    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    with pytest.raises(SharedHostError) as e:
        require_private_network("tf.data service")
    message = str(e.value)
    assert "refusing to start the tf.data service" in message
    assert f"{OTHER_UID} (3 processes)" in message and "CHEXNET_ALLOW_SHARED_HOST=1" in message
    monkeypatch.setenv(exposure.ALLOW_ENV, "1")
    assert "started anyway" in require_private_network("tf.data service")


def test_says_why_it_is_safe(monkeypatch):
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: False)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {})
    assert "no other account" in require_private_network("x")
    monkeypatch.setattr(exposure, "in_private_network_namespace", lambda: True)
    monkeypatch.setattr(exposure, "other_accounts_running", lambda: {OTHER_UID: 1})
    assert "private network namespace" in require_private_network("x")


@pytest.fixture
def other_account_process():
    """A process of another person's account on this host, for the test's length (root
    only: it starts ``sleep`` as uid 4242); stopped and checked gone by pid."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as another account needs root")
    if exposure.in_private_network_namespace():
        pytest.skip("this test runs in a private network namespace: nothing to refuse")
    proc = subprocess.Popen(["sleep", "120"], user=OTHER_UID, group=OTHER_UID,
                            stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"


def test_tf_data_service_refuses_before_starting_anything(other_account_process, monkeypatch):
    from chexnet_utils.tfdata_service import TFDataService

    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    assert OTHER_UID in exposure.other_accounts_running()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    svc = TFDataService(num_workers=1)
    with pytest.raises(SharedHostError, match=str(OTHER_UID)):
        svc.start()
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - before == set() and svc.dispatcher is None and svc.workers == []


def test_mwms_server_refuses_before_tensorflow_starts_it(other_account_process, monkeypatch):
    from chexnet_utils import steptimer

    monkeypatch.delenv(exposure.ALLOW_ENV, raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SharedHostError, match="MultiWorkerMirroredStrategy server"):
        steptimer.mwms_setup_on_engine([12345, 12346])
    assert "TF_CONFIG" not in os.environ and not steptimer._MWMS
