"""The environment report of this machine (imports TensorFlow and Horovod in-process): it has
what ``make setup`` promises."""

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
