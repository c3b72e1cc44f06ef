"""``snlab.explore``: a design space of any size, walked in chunks and reduced as it goes."""

from __future__ import annotations

import time

import numpy as np

from .. import grid
from ..errors import SnlabError
from ..presets import model as load_model
from ..presets import system as load_system
from . import kinds, parquet, schedule
from .problem import Problem, build_specs, check_axis
from .reduce import objective as read_objective
from .reduce import take
from .result import ExploreResult
from .space import Space, check_chunk_rows, chunk_rows_for, normalise_axis

#: the most rows ``top`` keeps
MAX_TOP = 100_000


def explore(model, system, *, precision="bf16", devices=None, objective=None, top: int = 10, pareto=None,
            out=None, scheduler=None, workers=None, chunk_rows=None, progress=None, kind: str = "train",
            **axes) -> ExploreResult:
    """Walk the Cartesian product of the axes, of any size, in chunks, and reduce it.

    The axes are those of :func:`snlab.sweep` (``kind="train"``) or
    :func:`snlab.serve_sweep` (``kind="serve"``): any plan, deployment or system field
    as a list, array or range (system fields in SI units or strings such as
    ``"400 Gb/s"``); ``model``, ``system`` and ``precision`` may be lists. Each chunk is
    evaluated with the planner's own open-grid kernels and reduced at once, so memory
    stays bounded by the chunk (``chunk_rows``, default from the memory available) and
    the grid may hold 1e8 rows or more.

    Parameters
    ----------
    objective : column to rank by: an output (``"tokens_per_s"``, ``"mfu"``,
        ``"memory_headroom_bytes"``, ``"step_time_s"``...) or a swept numeric input,
        with ``"max:"`` or ``"min:"`` to say which way is better (default: larger for
        rates and headroom, smaller for times, bytes used, devices and swept inputs).
        Default ``tokens_per_s`` (training), ``decode_tokens_per_s_per_device`` (serving).
    top : how many of the best feasible rows to keep (ties: the first in the grid).
    pareto : two or three objectives; keeps the feasible rows no other beats in all.
    out : a new or empty directory: every valid row is written there as Parquet, one
        file a chunk, partitioned by model, system and precision (needs pyarrow).
    scheduler : ``None`` (this process), ``"processes"`` (local processes), ``"dask"``
        (the current Dask client, else a local cluster), a ``dask.distributed.Client``,
        or a scheduler address (``"tcp://10.0.0.1:8786"``). The answer is the same.
    workers : processes for ``"processes"`` or a local Dask cluster (default: cores).
    chunk_rows : rows a chunk evaluates at once (default: 262,144, fewer if memory is short).
    progress : a progress bar with the time left (tqdm; ``None``: when tqdm is there
        and the run has more than a few chunks).

    Returns an :class:`~snlab.exploration.result.ExploreResult` (``.top``, ``.pareto``,
    ``.refused``, ``.by_axis``). Ctrl-C returns what was reduced so far, marked
    ``interrupted``.
    """
    started = time.perf_counter()
    k = kinds.kind(kind)
    top = grid.whole_number("top", top, 1, MAX_TOP, f"a whole number of rows from 1 to {MAX_TOP:,}")
    chunk_rows = check_chunk_rows(chunk_rows) or chunk_rows_for()
    workers = schedule.check_workers(workers)
    schedule.kind_of(scheduler)
    grid.unknown_fields(axes, k.fields, "plan or system" if kind == "train" else "deployment or system")
    models = [load_model(m) for m in grid.axis_values("model", model)]
    systems = [load_system(s) for s in grid.axis_values("system", system)]
    precisions = _precisions(k, precision)
    specs = build_specs(models, systems, precisions)
    values, dims, singles, labels = _axes(k, specs, axes, devices)
    probe = k.evaluate({}, *specs[0], {**singles, **{n: v[:1] for n, v in dims.items()}}, devices)
    numeric_inputs = tuple(n for n, v in values.items() if isinstance(v, np.ndarray))
    main = read_objective(objective or k.default_objective, tuple(probe.outputs), numeric_inputs)
    fronts = _fronts(pareto, tuple(probe.outputs), numeric_inputs)
    spec_axes = {"model": [m.name for m in models], "system": [s.name for s in systems], "precision": precisions}
    space = Space(specs, spec_axes, dims, singles, chunk_rows)
    target = parquet.prepare(out) if out is not None else None
    problem = Problem(kind, models, systems, precisions, space, main, fronts, top, devices,
                      {"overlap": labels.get("overlap", [])} if kind == "train" else {}, target)
    bar = _bar(progress, space)
    try:
        outcome = schedule.run(problem, scheduler, workers, bar)
    finally:
        bar.close()
    result = _result(problem, outcome, time.perf_counter() - started)
    if target is not None:
        parquet.write_manifest(target, {
            "complete": result.complete, "interrupted": result.interrupted, "kind": kind,
            "rows": result.rows, "evaluated": result.evaluated, "chunks": result.chunks,
            "chunks_done": result.chunks_done, "files": sorted(outcome.partial.files)})
    return result


def _precisions(k, precision) -> list:
    if k.name != "train":
        if precision not in (None, "bf16"):
            k.check_spec(precision)
        return [None]
    precisions = list(grid.axis_values("precision", precision))
    for p in precisions:
        k.check_spec(p)
    return precisions


def _axes(k, specs: list, axes: dict, devices):
    """The axes read once (numbers as arrays, quantities in SI units) and refused as the
    planner would refuse them, before any chunk runs: (values, the axes of more than one
    value in grid order, the others, the labels of the named choices)."""
    values = {name: normalise_axis(name, v, k.dimension(name), k.allowed(name)) for name, v in axes.items()}
    dims = {n: values[n] for n in k.order(values) if n in values and len(values[n]) > 1}
    singles = {n: v for n, v in values.items() if n not in dims}
    base = {**singles, **{n: v[:1] for n, v in dims.items()}}
    labels = {}
    for m, s, p in specs:
        labels = k.check(m, s, p, base, devices)
    for name in dims:
        got = check_axis(k, *specs[0], {**base, name: dims[name]}, name, devices)
        if name == "overlap":
            labels = got
    # a field no point of the whole space reads is refused, as by the sweeps
    grid.fails_everywhere(lambda m, s, p: k.check_read(m, s, axes), specs)
    return values, dims, singles, labels


def _fronts(pareto, outputs: tuple, inputs: tuple) -> tuple:
    if pareto is None:
        return ()
    if isinstance(pareto, str):
        pareto = [x for x in pareto.split(",") if x.strip()]
    if not isinstance(pareto, (list, tuple)) or not 2 <= len(pareto) <= 3:
        raise SnlabError("pareto", f"got {pareto!r}", "two or three objectives, e.g. ('tokens_per_s', "
                                                      "'memory_headroom_bytes')")
    fronts = tuple(read_objective(o, outputs, inputs, "pareto") for o in pareto)
    if len({o.name for o in fronts}) != len(fronts):
        raise SnlabError("pareto", f"got {pareto!r}", "different objectives")
    return fronts


def explore_serve(model, system, **kwargs) -> ExploreResult:
    """:func:`explore` over serving deployments (``kind="serve"``)."""
    return explore(model, system, kind="serve", precision=None, **kwargs)


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _bar(progress, space: Space):
    if progress is None:
        if space.chunks <= 4:
            return _NoBar()
        try:
            import tqdm  # noqa: F401
        except ImportError:
            return _NoBar()
        progress = True
    if not isinstance(progress, (bool, np.bool_)):
        raise SnlabError("progress", f"got {progress!r}", "true, false or none (a bar when tqdm is installed)")
    if not progress:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise SnlabError("progress", "a progress bar needs tqdm", "pip install 'snlab[explore]', or progress=False") \
            from None
    return tqdm(total=space.rows, unit=" configs", unit_scale=True, desc="explore", mininterval=0.5, smoothing=0.05)


def _frames(problem: Problem, records: dict, order: np.ndarray):
    """Records of rows (every input and output) as a sweep's DataFrame, in ``order``."""
    import pandas as pd
    k, space = problem.kind, problem.space
    records = take(records, order)
    rows = records["_row"]
    spec, index = space.decode(rows)
    axes = {**space.singles, **space.dims}
    frames = []
    for si in np.unique(spec):
        pick = np.flatnonzero(spec == si)
        m, s, p = space.specs[int(si)]
        inputs = {key[3:]: v[pick] for key, v in records.items() if key.startswith("in:")}
        outputs = {key[4:]: v[pick] for key, v in records.items() if key.startswith("out:")}
        labels = {}
        if problem.kind_name == "train":
            # the overlap choice as its place among every value given, not a chunk's
            inputs["overlap"] = (index["overlap"][pick] if "overlap" in index
                                 else np.zeros(len(pick))).astype(float)
            labels = {"overlap": problem.labels["overlap"]}
        frame = k.frame(m, s, p, inputs, labels, records["_broken"][pick], outputs, axes)
        frame.insert(0, "row", rows[pick])
        frame["_pos"] = pick
        frames.append(frame)
    if not frames:
        return None
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return frame.sort_values("_pos", kind="stable").drop(columns="_pos").reset_index(drop=True)


def _result(problem: Problem, outcome, elapsed_s: float) -> ExploreResult:
    import pandas as pd
    part, space, k = outcome.partial, problem.space, problem.kind
    main = problem.objective
    top = part.top
    if top:
        order = np.lexsort((top["_row"], -top["_key"]))
        top_frame = _frames(problem, top, order)
    else:
        top_frame = None
    if top_frame is None:
        top_frame = pd.DataFrame({"row": pd.Series([], dtype=np.int64)})
    top_frame.attrs["objective_label"] = main.label
    front_frame = None
    if problem.pareto:
        front = part.front
        if front:
            keys = front["_keys"]
            order = np.lexsort((front["_row"],) + tuple(-keys[:, j] for j in range(keys.shape[1] - 1, -1, -1)))
            front_frame = _frames(problem, front, order)
        if front_frame is None:
            front_frame = pd.DataFrame({"row": pd.Series([], dtype=np.int64)})
        front_frame.attrs["objective_labels"] = tuple(o.label for o in problem.pareto)
    counts = part.reasons if part.reasons is not None else np.zeros(len(k.reasons), np.int64)
    refused = pd.DataFrame({"reason": list(k.reasons), "rows": counts.astype(np.int64)})
    refused = refused[(refused["reason"] != "ok") & (refused["rows"] > 0)]
    refused = refused.sort_values("rows", ascending=False, kind="stable").reset_index(drop=True)
    refused["share"] = refused["rows"] / max(part.rows, 1)
    best_name = f"best_{main.name}"
    table = []
    axes_values = {**{n: v for n, v in space.spec_axes.items() if len(v) > 1}, **space.dims}
    for name, values in axes_values.items():
        if name not in part.axes:
            continue
        rows, ok, best = part.axes[name]
        for i, value in enumerate(values):
            v = value.item() if isinstance(value, np.generic) else value
            if isinstance(v, float) and k.dimension(name) in (None, "count") and v.is_integer():
                v = int(v)          # a degree, a batch: as the user typed it
            table.append({"axis": name, "value": v, "rows": int(rows[i]), "feasible": int(ok[i]),
                          best_name: float(best[i] * main.sign) if np.isfinite(best[i]) else None})
    by_axis = pd.DataFrame(table, columns=["axis", "value", "rows", "feasible", best_name])
    # no feasible row: missing (pd.NA), never NaN
    by_axis[best_name] = by_axis[best_name].astype("Float64")
    return ExploreResult(kind=problem.kind_name, objective=main.name,
                         pareto_objectives=tuple(o.name for o in problem.pareto), top=top_frame, pareto=front_frame,
                         refused=refused, by_axis=by_axis, rows=space.rows, evaluated=part.rows,
                         feasible=part.feasible, chunks=space.chunks, chunks_done=len(part.chunks),
                         chunk_rows=space.chunk_rows, interrupted=outcome.interrupted, elapsed_s=elapsed_s,
                         scheduler=outcome.scheduler, workers=outcome.workers, out=problem.out,
                         axes=tuple(n for n in (*space.spec_axes, *space.dims)
                                    if n in space.dims or len(space.spec_axes.get(n, ())) > 1))
