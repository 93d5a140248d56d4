"""The alpha-beta cost model of gradient averaging, and both algorithms simulated in numpy.

Sending ``m`` bytes costs ``alpha + m * beta``: ``alpha`` is the latency of one message,
``beta`` the time per byte (1 / bandwidth). Then::

    ring:  t = 2 (N - 1) alpha + 2 (N - 1) / N * size * beta
    PS:    t = 2 alpha         + 2 N * size * beta        (server link bound)

:func:`fit_alpha_beta` recovers ``alpha, beta`` from the times measured by
:mod:`chexnet_utils.comm.collectives` by least squares, :func:`predict_ring` / :func:`predict_ps`
extrapolate to many workers, and :func:`scaling_efficiency_prediction` turns that into the
scaling efficiency ``compute / (compute + exposed communication)``
(:func:`predict_efficiencies`: both algorithms for several models and worker counts at once).
:func:`algbw` / :func:`busbw` turn a time into a bandwidth.

Also here: the numpy walk-through of both algorithms (:func:`simulate_ring_allreduce`,
:func:`simulate_parameter_server`), CheXNet's gradient sizes (:func:`gradient_sizes`,
:func:`chexnet_gradient_sizes`) and the scaling efficiencies Horovod's paper reported
(:data:`REPORTED_HOROVOD_2018`). Pure functions: nothing here communicates.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chexnet_utils.model.architectures import FULL_SIZE_ARCHITECTURES
from chexnet_utils.platform.atomic import write_text_atomic

REPORTED_HOROVOD_2018: dict[str, dict[str, float]] = {
    "Inception V3": {"gpus": 512, "efficiency": 0.90, "params_millions": 23.8},
    "ResNet-101": {"gpus": 512, "efficiency": 0.90, "params_millions": 44.5},
    "VGG-16": {"gpus": 512, "efficiency": 0.68, "params_millions": 138.0},
}
"""Scaling efficiencies *reported* (not measured here) by Sergeev & Del Balso, "Horovod: fast
and easy distributed deep learning in TensorFlow", arXiv:1802.05799 (2018): TensorFlow
benchmarks on 128 servers with 4 Pascal GPUs each (512 GPUs), 25 Gbit/s RoCE. The parameter
counts are the usual ones of the architectures (for context: VGG-16 sends by far the largest
gradient for its compute, and scales worst)."""


# ---------------------------------------------------------------------------------------
# Bandwidth and the alpha-beta cost model (pure functions)
# ---------------------------------------------------------------------------------------


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: tensor size / time (what the user sees)."""
    return float(size_bytes) / float(seconds)


def busbw(algorithm: str, size_bytes: float, seconds: float, n: int,
          colocated_server: bool = False) -> float:
    """Bus bandwidth in bytes/s: the traffic on the busiest link / time, comparable with the
    hardware's link bandwidth whatever the number of workers (NCCL-tests' definition).

    ``ring``: ``algbw * 2 (N - 1) / N``: in reduce-scatter plus allgather each worker sends
    ``2 (N - 1)`` chunks of ``size / N``. ``ps``: the server's link carries ``N x size`` in
    (and as much out, in a second phase): ``busbw = N * size / time``; ``(N - 1) x size``
    when the server is one of the workers (``colocated_server``: its own tensor does not
    cross the link).
    """
    if algorithm == "ring":
        return algbw(size_bytes, seconds) * 2 * (n - 1) / n
    if algorithm == "ps":
        k = n - 1 if colocated_server else n
        return algbw(size_bytes, seconds) * k
    raise ValueError(f"algorithm must be 'ring' or 'ps', got {algorithm!r}")


def cost_coefficients(algorithm: str, n: int = 2, colocated_server: bool = False
                      ) -> tuple[float, float]:
    """``(a, b)`` of ``t = a * alpha + b * size * beta`` for one reduction of ``size`` bytes.

    * ``"linear"``: ``(1, 1)``: one message, ``t = alpha + beta * size``.
    * ``"ring"``: ``(2 (N - 1), 2 (N - 1) / N)``: ``2 (N - 1)`` sequential steps, each a
      message of ``size / N`` (reduce-scatter then allgather). ``(0, 0)`` for ``N = 1``.
    * ``"ps"``: ``(2, 2 N)``: two phases (gather, broadcast), each bound by the server's
      link carrying ``N x size`` (``2 (N - 1)`` with a ``colocated_server``).
    """
    if algorithm == "linear":
        return 1.0, 1.0
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if algorithm == "ring":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if algorithm == "ps":
        return 2.0, 2.0 * (n - 1 if colocated_server else n)
    raise ValueError(f"algorithm must be 'linear', 'ring' or 'ps', got {algorithm!r}")


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   algorithm: str = "linear", n: int = 2, colocated_server: bool = False,
                   relative: bool = True) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` of ``t = a * alpha + b * size * beta``.

    ``a, b`` come from :func:`cost_coefficients` (``algorithm``, ``n``), so the fitted
    ``alpha`` (s per message) and ``beta`` (s per byte) describe the *link*, not the
    algorithm, and the same pair predicts every algorithm at every ``N``.

    ``relative=True`` minimises relative errors (each row divided by its measured time):
    the sizes span five orders of magnitude and plain least squares would fit only the big
    tensors, leaving ``alpha`` to chance. Neither parameter may be negative: if the
    unconstrained solution has one below zero it is fixed at 0 and the other refitted.
    """
    s = np.asarray(sizes_bytes, dtype=np.float64).reshape(-1)
    t = np.asarray(times_s, dtype=np.float64).reshape(-1)
    if s.shape != t.shape or s.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("times must be positive and finite")
    a, b = cost_coefficients(algorithm, n, colocated_server)
    if a == 0 and b == 0:
        raise ValueError("one worker does not communicate: nothing to fit")
    x = np.column_stack([np.full_like(s, a), b * s])
    w = 1.0 / t if relative else np.ones_like(t)
    xw, tw = x * w[:, None], t * w
    coef, *_ = np.linalg.lstsq(xw, tw, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0 or beta < 0:
        cands = []
        for keep in (0, 1):
            col = xw[:, keep]
            v = max(0.0, float(col @ tw / (col @ col))) if col @ col > 0 else 0.0
            pair = (v, 0.0) if keep == 0 else (0.0, v)
            resid = tw - xw @ np.array(pair)
            cands.append((float(resid @ resid), pair))
        alpha, beta = min(cands)[1]
    return alpha, beta


def predict(algorithm: str, n: int, size_bytes: float, alpha: float, beta: float,
            colocated_server: bool = False, overhead_s: float = 0.0) -> float:
    """Predicted seconds of one reduction of ``size_bytes`` over ``n`` workers.

    ``overhead_s`` is a fixed software cost per reduction, paid once whatever ``N`` (e.g.
    Horovod's negotiation and cycle wait), on top of the ``alpha``/``beta`` terms of the
    wire. 0 for one worker (nothing to reduce).
    """
    a, b = cost_coefficients(algorithm, n, colocated_server)
    if algorithm != "linear" and n == 1:
        return 0.0
    return overhead_s + a * alpha + b * float(size_bytes) * beta


def predict_ring(n: int, size_bytes: float, alpha: float, beta: float,
                 overhead_s: float = 0.0) -> float:
    """Ring-allreduce: ``2 (N - 1) alpha + 2 (N - 1) / N * size * beta`` (0 for one worker).

    The bandwidth term tends to ``2 * size * beta`` as N grows: ring-allreduce of a large
    tensor costs about the same on 8 or 512 workers. The latency term grows with N: small
    tensors, many workers -> fuse tensors, or use tree / hierarchical algorithms.
    """
    return predict("ring", n, size_bytes, alpha, beta, overhead_s=overhead_s)


def predict_ps(n: int, size_bytes: float, alpha: float, beta: float,
               colocated_server: bool = False, overhead_s: float = 0.0) -> float:
    """Parameter server: ``2 alpha + 2 N * size * beta``: linear in N (one server link).

    (Sharding the parameters over ``k`` servers divides the bandwidth term by ``k``; with
    ``k = N`` servers that is what allreduce does.)
    """
    return predict("ps", n, size_bytes, alpha, beta, colocated_server, overhead_s)


def scaling_efficiency_prediction(n_workers: int, grad_bytes: float, step_compute_s: float,
                                  alpha: float, beta: float, algorithm: str = "ring",
                                  overlap: float = 0.0, n_messages: int = 1,
                                  overhead_s: float = 0.0) -> float:
    """Predicted scaling efficiency ``compute / (compute + exposed communication)``.

    ``grad_bytes`` are averaged every step in ``n_messages`` equal reductions, one after
    the other (1: fully fused; one per gradient tensor: no fusion, every tensor pays the
    ``2 (N - 1) alpha`` latency of its own ring). ``overhead_s`` is paid once per step
    (Horovod negotiates all the tensors that are ready in one cycle together, fused or
    not). ``overlap`` in [0, 1] is the fraction of the compute time that can hide
    communication (Horovod starts reducing the last layers' gradients while backprop still
    computes the first ones): ``exposed = max(0, comm - overlap * compute)``. One worker:
    1.0. Throughput on N workers is then ``N x efficiency x`` one worker's.

    Left out: the copies into and out of the fusion buffer, and the cache effects that
    make a big buffer slower per byte than small messages on one machine.
    """
    if n_workers < 1 or step_compute_s <= 0 or n_messages < 1:
        raise ValueError("need n_workers >= 1, step_compute_s > 0, n_messages >= 1")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be in [0, 1], got {overlap}")
    if n_workers == 1:
        return 1.0
    comm = overhead_s + n_messages * predict(algorithm, n_workers, grad_bytes / n_messages,
                                             alpha, beta)
    exposed = max(0.0, comm - overlap * step_compute_s)
    return step_compute_s / (step_compute_s + exposed)


# ---------------------------------------------------------------------------------------
# The two algorithms step by step, in numpy (no communication: for understanding)
# ---------------------------------------------------------------------------------------


def simulate_ring_allreduce(arrays: Sequence[np.ndarray], average: bool = True
                            ) -> dict[str, Any]:
    """Ring-allreduce of one array per simulated worker, chunk by chunk, counting bytes.

    Worker ``i`` sends only to worker ``i + 1`` (mod N). Every array is cut into ``N``
    chunks. Reduce-scatter, ``N - 1`` steps: in step ``s`` worker ``i`` sends chunk
    ``(i - s) mod N`` and its right neighbour adds it to its own copy; afterwards worker
    ``i`` holds the complete sum of chunk ``(i + 1) mod N``. Allgather, ``N - 1`` steps: the
    complete chunks travel once round the ring, each receiver overwrites its copy.

    Returns ``result`` (every worker's final array: all equal to the sum, or the mean),
    ``sent_bytes`` per worker (``2 (N - 1) / N`` x the array's bytes) and ``steps``.
    """
    n = len(arrays)
    if n < 1:
        raise ValueError("need at least one array")
    work = [[c.copy() for c in np.array_split(np.asarray(a, dtype=np.float64), n)]
            for a in arrays]
    itemsize = np.asarray(arrays[0]).dtype.itemsize
    sent = [0] * n
    steps = 0
    for s in range(n - 1):  # reduce-scatter
        msgs = [((i + 1) % n, (i - s) % n, work[i][(i - s) % n].copy()) for i in range(n)]
        for i, (dst, c, chunk) in enumerate(msgs):
            work[dst][c] += chunk
            sent[i] += chunk.size * itemsize
        steps += 1
    for s in range(n - 1):  # allgather
        msgs = [((i + 1) % n, (i + 1 - s) % n, work[i][(i + 1 - s) % n].copy())
                for i in range(n)]
        for i, (dst, c, chunk) in enumerate(msgs):
            work[dst][c] = chunk
            sent[i] += chunk.size * itemsize
        steps += 1
    result = [np.concatenate(w) / (n if average else 1) for w in work]
    return {"result": result, "sent_bytes": sent, "steps": steps}


def simulate_parameter_server(arrays: Sequence[np.ndarray], server: int | None = None,
                              average: bool = True) -> dict[str, Any]:
    """Parameter-server reduction of one array per simulated worker, counting bytes.

    ``server=None``: a dedicated server process (the classic set-up): it receives ``N``
    arrays and sends ``N`` back. ``server=i``: worker ``i`` is also the server (as in
    :func:`parameter_server_times`): its own array does not travel, so ``N - 1`` each way.
    Returns ``result`` per worker, ``server_in_bytes``, ``server_out_bytes``,
    ``worker_sent_bytes`` (one array each, 0 for a co-located server) and ``steps`` (2).
    """
    n = len(arrays)
    if n < 1:
        raise ValueError("need at least one array")
    nbytes = np.asarray(arrays[0]).nbytes
    total = np.sum([np.asarray(a, dtype=np.float64) for a in arrays], axis=0)
    value = total / n if average else total
    remote = n if server is None else n - 1
    return {"result": [value.copy() for _ in range(n)],
            "server_in_bytes": remote * nbytes, "server_out_bytes": remote * nbytes,
            "worker_sent_bytes": [0 if i == server else nbytes for i in range(n)],
            "steps": 2}


# ---------------------------------------------------------------------------------------
# Gradient sizes of CheXNet
# ---------------------------------------------------------------------------------------


def gradient_sizes(arch: str, image_size: int = 224) -> dict[str, Any]:
    """Parameter counts of :func:`~chexnet_utils.model.models.build_chexnet` (``weights=None``).

    ``params``: all weights; ``trainable_params``: those that get a gradient (BatchNorm's
    moving mean/variance do not); ``grad_bytes = 4 x trainable_params`` (float32): what
    every worker must average every step; ``tensor_elems``: the size of each gradient
    tensor (how many separate allreduces without fusion). Builds the model (seconds).
    """
    from chexnet_utils.model.models import build_chexnet

    model = build_chexnet(arch, image_size, weights=None)
    elems = [int(np.prod(v.shape)) for v in model.trainable_variables]
    out = {"arch": arch, "params": int(model.count_params()),
           "trainable_params": int(sum(elems)), "grad_bytes": 4 * int(sum(elems)),
           "n_tensors": len(elems), "tensor_elems": elems}
    del model
    return out


def chexnet_gradient_sizes(archs: Sequence[str] = FULL_SIZE_ARCHITECTURES,
                           cache: str | os.PathLike[str] | None = None
                           ) -> dict[str, dict[str, Any]]:
    """:func:`gradient_sizes` of each arch, cached in ``<work dir>/gradient_sizes.json``
    (building DenseNet-121 and ResNet-50 takes a few seconds; the counts never change)."""
    from chexnet_utils.config import work_dir

    path = Path(cache) if cache is not None else work_dir() / "gradient_sizes.json"
    known: dict[str, dict[str, Any]] = {}
    if path.exists():
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            known = {}
    missing = [a for a in archs if a not in known]
    for arch in missing:
        known[arch] = gradient_sizes(arch)
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known), fsync=False)
    return {a: known[a] for a in archs}


def predict_efficiencies(grad_bytes: Mapping[str, float], workers: Sequence[int],
                         step_compute_s: float, alpha: float, beta: float,
                         overhead_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Ring and parameter-server predictions for every model and worker count.

    ``grad_bytes`` maps a model name to the bytes of its gradient (one fused reduction per
    step). Keys of the result are ``f"{model}_{n}"``; each value holds ``model``,
    ``workers``, the predicted seconds of one reduction (``ring_s``, ``ps_s``, with
    ``overhead_s`` once) and the scaling efficiencies (``ring_eff``, ``ps_eff``) of
    :func:`scaling_efficiency_prediction` for ``step_compute_s`` of compute per step.
    """
    out: dict[str, dict[str, Any]] = {}
    for model, size in grad_bytes.items():
        for n in workers:
            out[f"{model}_{n}"] = {
                "model": model, "workers": n,
                "ring_s": predict_ring(n, size, alpha, beta, overhead_s=overhead_s),
                "ps_s": predict_ps(n, size, alpha, beta, overhead_s=overhead_s),
                **{f"{alg}_eff": scaling_efficiency_prediction(
                    n, size, step_compute_s, alpha, beta, alg, overhead_s=overhead_s)
                   for alg in ("ring", "ps")},
            }
    return out
