"""Pure parts of the two-node link benchmark: expected link bytes, names, the CLI's exit 3."""

from __future__ import annotations

import pytest

from chexnet_utils import cli
from chexnet_utils.bench import link as linkbench
from chexnet_utils.cluster import netns


def test_expected_link_bytes_ring_and_hierarchical() -> None:
    s = 64 * 2**20
    # two nodes, one rank each: every rank sends 2 (n-1)/n * S = S
    assert linkbench.expected_link_bytes(s) == s
    # 2 x 2 ranks, flat ring: 2 * 3/4 * S = 1.5 S cross each node's link
    assert linkbench.expected_link_bytes(s, ranks_per_node=2) == 1.5 * s
    # hierarchical: only the cross-node ring of 2 uses the link, whatever the ranks per node
    assert linkbench.expected_link_bytes(s, ranks_per_node=2, hierarchical=True) == s
    assert linkbench.expected_link_bytes(s, ranks_per_node=4, hierarchical=True) == s


def test_relative_error_sign() -> None:
    assert linkbench.relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert linkbench.relative_error(0.5, 1.0) == pytest.approx(-0.5)


def test_names_fit_interface_limits_and_differ() -> None:
    prefixes = {netns.new_prefix() for _ in range(50)}
    assert len(prefixes) == 50
    for p in prefixes:
        assert len(p + "l") <= 15  # IFNAMSIZ - 1


def test_tbf_command_burst_above_one_gso_segment() -> None:
    cmd = netns.tbf_command("eth9", 1e9)
    assert cmd[:7] == ["tc", "qdisc", "replace", "dev", "eth9", "root", "tbf"]
    burst = int(cmd[cmd.index("burst") + 1])
    assert burst == 125000  # 1 ms at 1 Gbit/s
    assert int(netns.tbf_command("eth9", 1e6)[cmd.index("burst") + 1]) == 64 * 1024


def test_bench_link_exits_3_without_namespaces(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(linkbench, "link_unavailable", lambda: "needs root (test)")
    args = cli.build_parser().parse_args(["bench", "link", "--quick"])
    assert args.handler(args) == 3
    assert "needs root (test)" in capsys.readouterr().err


def test_unknown_launcher_is_refused_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*a: object, **k: object) -> None:
        raise AssertionError("must not build namespaces")

    monkeypatch.setattr(linkbench, "two_nodes", no_build)
    with pytest.raises(ValueError, match="unknown launcher"):
        linkbench.bench_link("quick", launchers=["ssh"])


def test_loopback_comparison_puts_each_fit_in_one_row() -> None:
    link = {"rate_bit": 1e9, "launchers": ["mpirun", "gloo"],
            "unshaped": {"mpirun": {"alpha_s": 50e-6, "beta_s_per_byte": 1 / 1.0e9},
                         "gloo": {"alpha_s": 80e-6, "beta_s_per_byte": 1 / 0.5e9}},
            "shaped": {"mpirun": {"alpha_s": 60e-6, "beta_s_per_byte": 8 / 0.9e9},
                       "gloo": {"alpha_s": 90e-6, "beta_s_per_byte": 0.0}}}
    rows = linkbench.loopback_comparison(link, {"Horovod ring": (20e-6, 1 / 2e9)})
    assert [(r["where"].split(",")[0], r["launcher"]) for r in rows] == [
        ("one machine (loopback", "Horovod ring"), ("two nodes", "mpirun"),
        ("two nodes", "gloo"), ("two nodes", "mpirun"), ("two nodes", "gloo")]
    assert rows[0]["alpha us"] == pytest.approx(20.0)
    assert rows[0]["1/beta Gbit/s"] == pytest.approx(16.0)      # 2 GB/s
    assert rows[1]["1/beta Gbit/s"] == pytest.approx(8.0)
    assert rows[3]["where"] == "two nodes, tbf 1 Gbit/s"
    assert rows[3]["1/beta Gbit/s"] == pytest.approx(0.9)
    assert rows[4]["1/beta Gbit/s"] == float("inf")             # a fit with no slope
