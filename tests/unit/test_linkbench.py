"""Pure parts of the two-node link benchmark: expected link bytes, names, the CLI's exit 3,
the typed results (built from known numbers: fits, bus bandwidth, the model's errors, the
tables and the JSON layout of the old dict)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from chexnet_utils import cli
from chexnet_utils.bench import link as linkbench
from chexnet_utils.cluster import netns
from chexnet_utils.comm.costmodel import predict_ring
from chexnet_utils.platform.atomic import json_safe
from chexnet_utils.platform.markdown import markdown_table

MIB = 2**20
SIZES = linkbench.PRESETS["quick"].sizes_bytes


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


def _fit(alpha: float, beta: float, tcp_bps: float, wall_s: float = 9.0
         ) -> linkbench.SweepFit:
    """A sweep whose times are the ring model's exactly (2 ranks)."""
    return linkbench.SweepFit(sizes_bytes=list(SIZES),
                              times_s=[predict_ring(2, s, alpha, beta) for s in SIZES],
                              ranks=2, tcp_Bps=tcp_bps, wall_s=wall_s)


def _counts(ratio: float, local_size: int = 1, hierarchical: bool = False
            ) -> linkbench.LinkCounts:
    expected = linkbench.expected_link_bytes(16 * MIB, local_size)
    return linkbench.LinkCounts(count_bytes=16 * MIB, count_iters=2,
                                tx_per_allreduce=ratio * expected,
                                rx_per_allreduce=ratio * expected, sum_ok=True,
                                local_size=local_size, hierarchical_env=hierarchical,
                                slots=local_size)


def _result(hierarchical: bool = True) -> linkbench.LinkResult:
    """1 Gbit/s shaping; unshaped: mpirun alpha 50 us, 1/beta 1 GB/s, gloo 80 us, 0.5 GB/s;
    shaped: exactly the model with the unshaped alpha and beta = 8 / rate; raw TCP 2 GB/s
    unshaped, 0.96 x the rate shaped."""
    rate = 1e9
    free_tcp = linkbench.TcpThroughput(bytes=64 * MIB, seconds=64 * MIB / 2e9)
    slow_tcp = linkbench.TcpThroughput(bytes=16 * MIB, seconds=16 * MIB / (0.96 * rate / 8))
    alphas = {"mpirun": 50e-6, "gloo": 80e-6}
    free = linkbench.LinkBlock(tcp=free_tcp, fits={
        "mpirun": _fit(alphas["mpirun"], 1 / 1.0e9, free_tcp.bytes_per_s),
        "gloo": _fit(alphas["gloo"], 1 / 0.5e9, free_tcp.bytes_per_s)})
    slow = linkbench.LinkBlock(tcp=slow_tcp, fits={
        name: _fit(a, 8 / rate, slow_tcp.bytes_per_s) for name, a in alphas.items()})
    rows = [linkbench.HierarchicalRow(launcher="gloo",
                                      counts=_counts(1.0, local_size=2, hierarchical=True),
                                      time_s=0.031, wall_s=12.0)]
    return linkbench.LinkResult(
        preset="quick", rate_bit=rate, sizes_bytes=list(SIZES), launchers=["mpirun", "gloo"],
        ips=("10.77.0.1", "10.77.0.2"), prefix="cxabc123", unshaped=free, shaped=slow,
        qdisc="qdisc tbf 8001: root", counts={"mpirun": _counts(1.01), "gloo": _counts(1.02)},
        hierarchical=rows if hierarchical else None, wall_s=44.4)


def test_presets_are_frozen_and_give_the_sweep() -> None:
    quick, full = linkbench.PRESETS["quick"], linkbench.PRESETS["full"]
    assert quick.name == "quick" and full.name == "full"
    assert quick.sizes_bytes == [4 * 2**10 * 4**k for k in range(7)]   # 4 KiB .. 16 MiB
    assert full.sizes_bytes[0] == 4 * 2**10 and full.sizes_bytes[-1] == 64 * MIB
    assert quick.launchers == ("mpirun", "gloo") and not quick.hier_flat
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.repeats = 9  # type: ignore[misc]


def test_tcp_throughput_result() -> None:
    tcp = linkbench.TcpThroughput(bytes=64 * MIB, seconds=0.5)
    assert tcp.bytes_per_s == 128 * MIB
    assert tcp.as_dict() == {"bytes": 64 * MIB, "seconds": 0.5, "bytes_per_s": 128 * MIB}
    assert str(tcp) == "64 MiB in 0.5 s: 1.07 Gbit/s"


def test_sweep_fit_recovers_the_model_and_its_bus_bandwidth() -> None:
    fit = _fit(50e-6, 1 / 1e9, tcp_bps=2e9)
    assert fit.alpha_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)
    assert fit.fit_bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
    # two ranks: bus bandwidth = size / time
    assert fit.busbw_Bps == pytest.approx([s / t for s, t in zip(SIZES, fit.times_s, strict=True)])
    assert fit.busbw_large_Bps == fit.busbw_Bps[-1]
    assert fit.busbw_fraction_of_tcp == pytest.approx(fit.busbw_large_Bps / 2e9)
    assert 0.49 < fit.busbw_fraction_of_tcp < 0.5    # 1 GB/s less the latency, over 2 GB/s
    assert list(fit.as_dict()) == ["sizes_bytes", "times_s", "busbw_Bps", "alpha_s",
                                   "beta_s_per_byte", "fit_bandwidth_Bps", "busbw_large_Bps",
                                   "busbw_fraction_of_tcp", "wall_s"]
    with pytest.raises(ValueError, match="7 sizes but 2 times"):
        dataclasses.replace(fit, times_s=[1.0, 2.0])


def test_sweep_summary_and_counts_read_the_probe_wire() -> None:
    sweep = {"sizes_bytes": SIZES, "times_s": _fit(50e-6, 1e-9, 2e9).times_s, "size": 2,
             "rank": 0, "min_s": [], "runs_s": []}
    fit = linkbench.sweep_summary(sweep, tcp_bps=2e9, wall_s=3.0)
    assert fit == _fit(50e-6, 1e-9, 2e9, wall_s=3.0)
    ranks = [{"rank": r, "count_bytes": 16 * MIB, "count_iters": 2, "local_size": 2,
              "tx_bytes": 2 * 24.5 * MIB, "rx_bytes": 2 * 24 * MIB, "sum_ok": True}
             for r in range(4)]
    c = linkbench._counts(ranks, slots=2, hierarchical=True)
    assert (c.tx_per_allreduce, c.rx_per_allreduce) == (24.5 * MIB, 24 * MIB)
    assert c.expected_flat == 24 * MIB              # 2 x 2 ranks, flat ring: 1.5 x 16 MiB
    assert c.expected_hierarchical == 16 * MIB
    assert c.ratio_to_flat == pytest.approx(24.5 / 24)
    assert c.sum_ok and c.hierarchical_env
    # ranks placed otherwise than asked (2 per node reported, 1 asked): the ratio says so
    assert linkbench._counts(ranks, slots=1).ratio_to_flat == pytest.approx(24.5 / 16)
    ranks[3]["sum_ok"] = False
    assert not linkbench._counts(ranks).sum_ok


def test_link_counts_as_dict_keeps_the_old_keys() -> None:
    assert list(_counts(1.0).as_dict()) == [
        "count_bytes", "count_iters", "tx_per_allreduce", "rx_per_allreduce", "expected_flat",
        "expected_hierarchical", "ratio_to_flat", "sum_ok", "local_size", "hierarchical_env"]
    row = linkbench.HierarchicalRow(launcher="mpirun", counts=_counts(1.0, 2, True),
                                    time_s=0.012, wall_s=5.0).as_dict()
    assert list(row) == ["launcher", *_counts(1.0).as_dict(), "time_s", "wall_s"]
    assert row["expected_flat"] == 24 * MIB and row["hierarchical_env"] is True


def test_shaped_prediction_of_the_model() -> None:
    link = _result()
    pred = link.predictions["gloo"]
    assert pred.alpha_s == pytest.approx(80e-6, rel=1e-6)
    # the shaped times are the model's with beta = 8 / rate: no error
    assert pred.rate.beta_s_per_byte == 8e-9
    assert pred.rate.predicted_s == pytest.approx(link.shaped.fits["gloo"].times_s, rel=1e-6)
    assert pred.rate.mean_abs_error_large == pytest.approx(0.0, abs=1e-6)
    # raw TCP was 0.96 x the rate: beta = 1 / raw TCP predicts the bytes' term 1/0.96 slower
    assert pred.tcp.beta_s_per_byte == pytest.approx(8 / 0.96e9)
    assert all(e > 0 for e in pred.tcp.rel_error)
    assert pred.tcp.rel_error[-1] == pytest.approx(1 / 0.96 - 1, rel=2e-3)
    assert pred.tcp.mean_abs_error_large == pytest.approx(1 / 0.96 - 1, rel=2e-2)
    direct = linkbench.predict_shaped(link.unshaped.fits["gloo"], link.shaped.fits["gloo"],
                                      link.rate_bit, min_bytes=16 * MIB)
    assert direct.tcp.mean_abs_error_large == pytest.approx(pred.tcp.rel_error[-1])


def test_link_result_as_dict_has_the_old_layout_and_round_trips() -> None:
    link = _result()
    d = link.as_dict()
    assert list(d) == ["preset", "rate_bit", "sizes_bytes", "launchers", "ips", "prefix",
                       "unshaped", "shaped", "qdisc", "hierarchical", "wall_s"]
    sweep_keys = list(link.unshaped.fits["mpirun"].as_dict())
    for block in ("unshaped", "shaped"):
        assert list(d[block]) == ["tcp", "mpirun", "gloo"]
        assert list(d[block]["tcp"]) == ["bytes", "seconds", "bytes_per_s"]
    assert list(d["unshaped"]["gloo"]) == [*sweep_keys, "counts"]
    assert list(d["shaped"]["gloo"]) == [*sweep_keys, "prediction"]
    assert list(d["shaped"]["gloo"]["prediction"]) == ["alpha_s", "rate", "tcp"]
    assert list(d["shaped"]["gloo"]["prediction"]["rate"]) == [
        "beta_s_per_byte", "predicted_s", "rel_error", "mean_abs_error_large"]
    assert d["unshaped"]["gloo"]["counts"]["ratio_to_flat"] == pytest.approx(1.02)
    assert d["hierarchical"][0]["launcher"] == "gloo"
    assert d["ips"] == ["10.77.0.1", "10.77.0.2"]
    assert json.loads(json.dumps(json_safe(link))) == json.loads(json.dumps(json_safe(d)))
    back = json.loads(json.dumps(json_safe(link)))
    assert back["shaped"]["mpirun"]["busbw_fraction_of_tcp"] == \
        link.shaped.fits["mpirun"].busbw_fraction_of_tcp
    assert back["unshaped"]["tcp"]["bytes_per_s"] == pytest.approx(2e9)
    assert "hierarchical" not in _result(hierarchical=False).as_dict()


def test_link_result_str_is_the_tables_as_bench_link_printed_them() -> None:
    link = _result()
    tables = link.tables()
    assert len(tables) == 3
    main = next(iter(tables.values()))
    assert [(r["link"], r["launcher"]) for r in main] == [
        ("unshaped", "mpirun"), ("unshaped", "gloo"), ("tbf 1 Gbit/s", "mpirun"),
        ("tbf 1 Gbit/s", "gloo")]
    assert main[0]["raw TCP Gbit/s"] == pytest.approx(16.0)
    assert main[0]["1/beta Gbit/s"] == pytest.approx(8.0, rel=1e-6)
    assert main[3]["link bytes/expected"] == pytest.approx(1.02)
    hier = tables["2 ranks per node: bytes over the link per allreduce"]
    assert hier == [{"launcher": "gloo", "HOROVOD_HIERARCHICAL_ALLREDUCE": 1, "size": "16 MiB",
                     "link tx / allreduce": "24 MiB", "flat ring expects": "24 MiB",
                     "hierarchical expects": "16 MiB", "time ms": pytest.approx(31.0)}]
    # the text the command printed before: a header, then each table in markdown
    text = str(link)
    assert text == "preset quick, 44 s" + "".join(
        f"\n\n{caption}\n{markdown_table(rows, floatfmt='.3g')}"
        for caption, rows in tables.items())
    assert "| tbf 1 Gbit/s | gloo | 0.96 |" in text
    assert len(_result(hierarchical=False).tables()) == 2


def test_loopback_comparison_puts_each_fit_in_one_row() -> None:
    link = _result(hierarchical=False)
    flat = linkbench.SweepFit(sizes_bytes=list(SIZES),   # slower for smaller sizes: beta 0
                              times_s=[1e-3 * (1 - 0.01 * k) for k in range(len(SIZES))],
                              ranks=2, tcp_Bps=1e8, wall_s=1.0)
    link = dataclasses.replace(link, shaped=dataclasses.replace(
        link.shaped, fits={**link.shaped.fits, "gloo": flat}))
    rows = link.loopback_comparison({"Horovod ring": (20e-6, 1 / 2e9)})
    assert [(r["where"].split(",")[0], r["launcher"]) for r in rows] == [
        ("one machine (loopback", "Horovod ring"), ("two nodes", "mpirun"),
        ("two nodes", "gloo"), ("two nodes", "mpirun"), ("two nodes", "gloo")]
    assert rows[0]["alpha us"] == pytest.approx(20.0)
    assert rows[0]["1/beta Gbit/s"] == pytest.approx(16.0)      # 2 GB/s
    assert rows[1]["alpha us"] == pytest.approx(50.0, rel=1e-6)
    assert rows[1]["1/beta Gbit/s"] == pytest.approx(8.0, rel=1e-6)
    assert rows[2]["1/beta Gbit/s"] == pytest.approx(4.0, rel=1e-6)
    assert rows[3]["where"] == "two nodes, tbf 1 Gbit/s"
    assert rows[3]["1/beta Gbit/s"] == pytest.approx(1.0, rel=1e-6)
    assert rows[4]["1/beta Gbit/s"] == float("inf")             # a fit with no slope
