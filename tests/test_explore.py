"""snlab.explore: a grid walked in chunks gives what one sweep of the whole grid gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snlab
from snlab.errors import SnlabError
from snlab.exploration import schedule, space, spec
from snlab.exploration.reduce import front_index, objective, top_index

ROOT = Path(__file__).resolve().parents[1]
MODEL, SYSTEM = "megatron-1t", "dgx-a100"
#: 491,520 plans, a third of them breaking a rule, most of the rest too large
MIXED = dict(tp=[1, 2, 4, 8, 16], pp=[1, 2, 4, 8, 16, 32, 64, 128], dp=[1, 2, 3, 4, 6, 8, 12, 16],
             micro_batch=[1, 2, 4, 8], global_batch=3072, recompute=["none", "selective", "full"],
             zero=[0, 1, 2, 3], interleave=[1, 2], sequence_parallel=[False, True],
             scale_out_bandwidth=np.linspace(12.5e9, 100e9, 8))
SMALL = dict(tp=[2, 8], pp=[4, 8, 16], dp=[4, 8], micro_batch=[1, 2], global_batch=1024,
             recompute=["selective", "full"], zero=[0, 1], scale_out_bandwidth=["25 GB/s", "50 GB/s", "100 GB/s"])


def feasible_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["valid"] & frame["fits"]]


def reference_top(frame: pd.DataFrame, column: str, sign: int, k: int) -> np.ndarray:
    ok = feasible_rows(frame)
    order = np.lexsort((ok.index.to_numpy(), -sign * ok[column].to_numpy(dtype=float)))
    return ok.index.to_numpy()[order[:k]]


def reference_front(frame: pd.DataFrame, objectives: list[tuple[str, int]]) -> set:
    """Rows no feasible row dominates, one per distinct point (the first), by brute force."""
    ok = feasible_rows(frame)
    keys = np.stack([sign * ok[c].to_numpy(dtype=float) for c, sign in objectives], axis=1)
    rows = ok.index.to_numpy()
    keep = set()
    for i in range(len(rows)):
        dominated = np.all(keys >= keys[i], axis=1) & np.any(keys > keys[i], axis=1)
        same = np.all(keys == keys[i], axis=1)
        if not dominated.any() and rows[same].min() == rows[i]:
            keep.add(int(rows[i]))
    return keep


# --- the grid and its chunks -----------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=0, max_size=5), st.integers(1, 400), st.integers(1, 3))
def test_chunks_are_consecutive_bounded_and_cover_the_grid(lengths, chunk_rows, n_specs):
    dims = {f"a{i}": list(range(n)) for i, n in enumerate(lengths)}
    sp = space.Space([None] * n_specs, {"model": [0] * n_specs}, dims, {}, chunk_rows)
    start = 0
    for i in range(sp.chunks):
        c = sp.chunk(i)
        assert c.start == start and 1 <= c.rows <= max(chunk_rows, 1)
        # the chunk's axes hold exactly its rows, and decode back to the same spec
        axes = sp.axes_of(c)
        assert int(np.prod([len(axes[n]) for n in dims])) == c.rows
        assert sp.decode(np.array([c.start]))[0][0] == c.spec
        start += c.rows
    assert start == sp.rows == n_specs * int(np.prod(lengths))


def test_the_chunk_size_follows_the_memory_available():
    assert space.chunk_rows_for(1e12) == space.DEFAULT_CHUNK_ROWS
    small = space.chunk_rows_for(100e6)                  # 100 MB free: a quarter, 1.5 kB a row
    assert small == int(100e6 * space.MEMORY_SHARE // space.BYTES_PER_ROW) < space.DEFAULT_CHUNK_ROWS
    assert space.chunk_rows_for(1.0) == space.MIN_CHUNK_ROWS


# --- the reductions ------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=60),
       st.integers(2, 3), st.randoms(use_true_random=False))
def test_the_front_is_every_undominated_point_once(points, d, rnd):
    keys = np.asarray(points, dtype=float)[:, :d]
    rows = np.arange(len(points)) * 3 + 7
    order = list(range(len(points)))
    rnd.shuffle(order)                       # the order rows arrive in does not matter
    got = set(rows[order][front_index(keys[order], rows[order])].tolist())
    frame = pd.DataFrame({f"k{j}": keys[:, j] for j in range(d)}, index=rows)
    frame["valid"] = frame["fits"] = True
    assert got == reference_front(frame, [(f"k{j}", 1) for j in range(d)])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=50), st.integers(1, 12))
def test_top_rows_are_the_best_then_the_first_in_the_grid(values, k):
    key = np.asarray(values, dtype=float)
    rows = np.arange(len(values))[::-1].copy()         # rows need not arrive in order
    got = rows[top_index(key, rows, k)]
    want = sorted(range(len(values)), key=lambda i: (-key[i], rows[i]))[:k]
    assert got.tolist() == rows[want].tolist()


def test_objectives_read_which_way_is_better():
    outputs, inputs = ("tokens_per_s", "mfu", "step_time_s", "memory_headroom_bytes", "memory_total_bytes"), \
        ("hbm_capacity",)
    assert objective("tokens_per_s", outputs, inputs).sign == 1
    assert objective("mfu", outputs, inputs).sign == 1
    assert objective("step_time_s", outputs, inputs).sign == -1
    assert objective("memory_headroom_bytes", outputs, inputs).sign == 1
    assert objective("memory_total_bytes", outputs, inputs).sign == -1
    assert objective("hbm_capacity", outputs, inputs).sign == -1          # less hardware
    assert objective("max:hbm_capacity", outputs, inputs).sign == 1
    assert objective(("tokens_per_s", "min"), outputs, inputs).label == "min:tokens_per_s"
    with pytest.raises(SnlabError, match="objective: unknown column 'speed'"):
        objective("speed", outputs, inputs)
    with pytest.raises(SnlabError, match="objective: got 'best'"):
        objective("best:mfu", outputs, inputs)


# --- chunked equals one sweep ---------------------------------------------------------------

OBJECTIVES = ["tokens_per_s", "mfu", "memory_headroom_bytes", "min:step_time_s", "min:memory_total_bytes"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_chunked_top_and_front_equal_one_sweep_of_the_grid(data):
    pick = lambda name, values: data.draw(st.lists(st.sampled_from(values), min_size=1, max_size=len(values),
                                                   unique=True), label=name)
    axes = dict(tp=pick("tp", [1, 2, 4, 8]), pp=pick("pp", [1, 2, 8, 16, 32]), dp=pick("dp", [1, 2, 4, 8]),
                micro_batch=pick("micro_batch", [1, 2, 4]), global_batch=512,
                recompute=pick("recompute", ["none", "selective", "full"]), zero=pick("zero", [0, 1, 3]),
                scale_out_bandwidth=pick("bw", [12.5e9, 25e9, 50e9, 100e9]))
    main = data.draw(st.sampled_from(OBJECTIVES), label="objective")
    front = data.draw(st.lists(st.sampled_from(OBJECTIVES + ["min:scale_out_bandwidth"]), min_size=2, max_size=3,
                               unique_by=lambda s: s.split(":")[-1]), label="pareto")
    k = data.draw(st.integers(1, 15), label="top")
    chunk_rows = data.draw(st.integers(5, 400), label="chunk_rows")
    result = snlab.explore(MODEL, SYSTEM, objective=main, top=k, pareto=front, chunk_rows=chunk_rows,
                           progress=False, **axes)
    frame = snlab.sweep(MODEL, SYSTEM, **axes)
    sign = lambda o: -1 if o.startswith("min:") else 1
    column = lambda o: o.split(":")[-1]
    assert result.top["row"].tolist() == reference_top(frame, column(main), sign(main), k).tolist()
    assert set(result.pareto["row"]) == reference_front(frame, [(column(o), sign(o)) for o in front])
    # the rows themselves are the sweep's, column for column
    for table in (result.top, result.pareto):
        ref = frame.loc[table["row"]].reset_index(drop=True)
        got = table.drop(columns="row")
        pd.testing.assert_frame_equal(got, ref[got.columns], check_categorical=False)
    assert result.evaluated == result.rows == len(frame) and result.feasible == len(feasible_rows(frame))


def test_refusals_and_axis_summaries_count_what_one_sweep_counts():
    result = snlab.explore(MODEL, SYSTEM, chunk_rows=7, progress=False, **SMALL)
    frame = snlab.sweep(MODEL, SYSTEM, **SMALL)
    counts = frame["reason"].value_counts()
    for reason, rows in zip(result.refused["reason"], result.refused["rows"]):
        assert counts[reason] == rows
    assert result.refused["rows"].sum() == len(frame) - result.feasible
    ok = feasible_rows(frame)
    for axis in ("tp", "pp", "recompute", "scale_out_bandwidth"):
        table = result.by_axis[result.by_axis["axis"] == axis]
        for value, rows, feasible, best in zip(table["value"], table["rows"], table["feasible"],
                                               table["best_tokens_per_s"]):
            assert rows == (frame[axis] == value).sum()
            assert feasible == (ok[axis] == value).sum()
            chosen = ok.loc[ok[axis] == value, "tokens_per_s"]
            assert (best is pd.NA and chosen.empty) or best == chosen.max()


def test_lists_of_models_systems_and_precisions_are_outer_axes_in_sweep_order():
    axes = dict(tp=[4, 8], pp=[2, 4], dp=[2, 4], global_batch=256, micro_batch=[1, 2])
    models, systems = ["llama3-70b", "llama3-8b"], ["dgx-h100", "gb200-nvl72"]
    result = snlab.explore(models, systems, precision=["bf16", "fp8"], top=7, chunk_rows=3, progress=False,
                           pareto=("tokens_per_s", "min:memory_total_bytes"), **axes)
    frame = snlab.sweep(models, systems, precision=["bf16", "fp8"], **axes)
    assert result.top["row"].tolist() == reference_top(frame, "tokens_per_s", 1, 7).tolist()
    assert set(result.pareto["row"]) == reference_front(frame, [("tokens_per_s", 1), ("memory_total_bytes", -1)])
    assert list(result.top["model"]) == list(frame.loc[result.top["row"], "model"])
    models_rows = result.by_axis[result.by_axis["axis"] == "model"]
    assert models_rows["rows"].tolist() == [len(frame) // 2] * 2


def test_serving_deployments_explore_as_serve_sweep_evaluates_them():
    axes = dict(tp=[1, 2, 4, 8], batch=[1, 8, 32, 128, 512], prompt_len=[1000, 4000], output_len=500,
                hbm_bandwidth=["2 TB/s", "3.35 TB/s", "8 TB/s"])
    result = snlab.explore_serve("llama3-70b", "dgx-h100", pareto=("decode_tokens_per_s_per_device", "min:tpot_s"),
                                 chunk_rows=11, progress=False, top=6, **axes)
    frame = snlab.serve_sweep("llama3-70b", "dgx-h100", **axes)
    assert result.top["row"].tolist() == reference_top(frame, "decode_tokens_per_s_per_device", 1, 6).tolist()
    assert set(result.pareto["row"]) == reference_front(frame, [("decode_tokens_per_s_per_device", 1),
                                                                ("tpot_s", -1)])
    ref = frame.loc[result.top["row"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(result.top.drop(columns="row"), ref, check_categorical=False)


# --- schedulers ---------------------------------------------------------------------------

def assert_same(a, b) -> None:
    for name in ("top", "pareto", "refused", "by_axis"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert (a.rows, a.evaluated, a.feasible) == (b.rows, b.evaluated, b.feasible)


def test_dask_gives_what_this_process_gives_on_a_million_row_grid():
    distributed = pytest.importorskip("dask.distributed")
    axes = {**MIXED, "scale_out_bandwidth": np.linspace(12.5e9, 200e9, 16)}          # 983,040 plans
    kwargs = dict(pareto=("tokens_per_s", "memory_headroom_bytes", "min:scale_out_bandwidth"), top=25,
                  progress=False, chunk_rows=100_000)
    here = snlab.explore(MODEL, SYSTEM, **kwargs, **axes)
    assert here.rows == 983_040 and len(here.top) == 25 and len(here.pareto) > 3
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        there = snlab.explore(MODEL, SYSTEM, scheduler=client, **kwargs, **axes)
    assert there.scheduler.startswith("dask") and there.workers == 2
    assert_same(here, there)


def test_local_processes_give_what_this_process_gives():
    kwargs = dict(pareto=("tokens_per_s", "min:memory_total_bytes"), top=9, progress=False, chunk_rows=20)
    here = snlab.explore(MODEL, SYSTEM, **kwargs, **SMALL)
    there = snlab.explore(MODEL, SYSTEM, scheduler="processes", workers=2, **kwargs, **SMALL)
    assert there.scheduler == "processes" and there.workers == 2
    assert_same(here, there)


def test_tasks_group_consecutive_chunks():
    groups = schedule.tasks(100, 2)
    assert [i for g in groups for i in g] == list(range(100))
    assert len(groups) >= 8 and max(len(g) for g in groups) <= schedule.MAX_CHUNKS_PER_TASK
    assert schedule.tasks(3, 8) == [range(0, 1), range(1, 2), range(2, 3)]


# --- Ctrl-C, Parquet --------------------------------------------------------------------------

def interrupt_after(monkeypatch, calls: int):
    real = schedule.reduce_chunk
    seen = []

    def reduce_chunk(problem, index):
        if len(seen) == calls:
            raise KeyboardInterrupt
        seen.append(index)
        return real(problem, index)
    monkeypatch.setattr(schedule, "reduce_chunk", reduce_chunk)


def test_ctrl_c_returns_what_was_reduced_and_says_so(monkeypatch):
    interrupt_after(monkeypatch, 2)
    axes = {**SMALL, "tp": [8, 2]}
    # chunks of 96 and 48 rows: tp at one value, two values of pp then one, the rest whole
    result = snlab.explore(MODEL, SYSTEM, chunk_rows=100, top=5, progress=False, **axes)
    assert result.interrupted and not result.complete and result.chunks_done == 2
    frame = snlab.sweep(MODEL, SYSTEM, **axes)
    done = frame.iloc[:result.evaluated]
    assert result.evaluated == 144 < result.rows and len(feasible_rows(done)) >= 5
    assert result.top["row"].tolist() == reference_top(done, "tokens_per_s", 1, 5).tolist()
    assert "INTERRUPTED after 2 of" in repr(result)


def test_ctrl_c_on_the_command_line_prints_the_partial_result_and_exits_130(monkeypatch, tmp_path, capsys):
    from snlab.cli import main
    interrupt_after(monkeypatch, 1)
    grid = tmp_path / "grid.toml"
    grid.write_text('model = "megatron-1t"\nsystem = "dgx-a100"\n[axes]\ntp = [2, 8]\npp = [4, 8, 16]\n'
                    'dp = [4, 8]\nglobal_batch = 1024\n')
    assert main(["explore", "--spec", str(grid), "--chunk-rows", "3", "--no-progress"]) == 130
    assert "INTERRUPTED after 1 of 6 chunks" in capsys.readouterr().out


def test_every_valid_row_is_written_to_parquet_and_reads_back(tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "rows"
    result = snlab.explore(MODEL, SYSTEM, out=out, chunk_rows=50, progress=False, **SMALL)
    frame = snlab.sweep(MODEL, SYSTEM, **SMALL)
    back = pd.read_parquet(out).sort_values("row").reset_index(drop=True)
    valid = frame[frame["valid"]]
    assert back["row"].tolist() == valid.index.tolist()
    for column in ("tp", "pp", "recompute", "scale_out_bandwidth", "tokens_per_s", "fits", "reason"):
        assert back[column].astype(str).tolist() == valid[column].astype(str).tolist()
    assert set(back["model"].astype(str)) == {MODEL}
    manifest = json.loads((out / "_explore.json").read_text())
    assert manifest["complete"] and manifest["rows"] == result.rows == len(frame)
    assert len(manifest["files"]) == len(list(out.rglob("part-*.parquet")))


def test_nothing_is_half_written_after_ctrl_c_during_a_write(monkeypatch, tmp_path):
    pytest.importorskip("pyarrow")
    import snlab.files
    real, calls = snlab.files.os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 3:                     # in the middle of the third file
            raise KeyboardInterrupt
        return real(fd)
    monkeypatch.setattr(snlab.files.os, "fsync", fsync)
    out = tmp_path / "rows"
    result = snlab.explore(MODEL, SYSTEM, out=out, chunk_rows=20, progress=False, **SMALL)
    monkeypatch.undo()
    assert result.interrupted
    names = [p.name for p in out.rglob("*") if p.is_file()]
    assert not [n for n in names if n.endswith(".part") or n.startswith(".")]
    parts = list(out.rglob("part-*.parquet"))
    assert len(parts) == 2
    import pyarrow.parquet as pq
    assert sum(pq.read_table(p).num_rows for p in parts) > 0
    manifest = json.loads((out / "_explore.json").read_text())
    assert manifest["interrupted"] and not manifest["complete"] and len(manifest["files"]) == 2


def test_out_must_be_new_or_empty(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(SnlabError, match="^out: .* exists and is not an empty directory"):
        snlab.explore(MODEL, SYSTEM, out=tmp_path, progress=False, **SMALL)


# --- the result, progress, bad input -----------------------------------------------------------

def test_the_result_shows_itself_and_serialises():
    result = snlab.explore(MODEL, SYSTEM, pareto="tokens_per_s,min:scale_out_bandwidth", progress=False, **SMALL)
    text = repr(result)
    assert text.startswith("Exploration of 288 plans (in-process, 1 worker")
    assert "best 10 by max:tokens_per_s" in text and "Pareto front over max:tokens_per_s, min:scale_out_bandwidth" \
        in text
    assert "<table" in result._repr_html_()
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["rows"] == 288 and len(data["top"]) == 10 and data["objective"] == "max:tokens_per_s"
    assert not result.top.isna().any().any() or set(result.top.columns[result.top.isna().any()]) <= {
        "step_time_s_low", "step_time_s_high", "mfu_low", "mfu_high"}


def test_a_progress_bar_counts_configurations(capsys):
    pytest.importorskip("tqdm")
    snlab.explore(MODEL, SYSTEM, chunk_rows=50, progress=True, **SMALL)
    err = capsys.readouterr().err
    assert "explore" in err and "288/288" in err


@pytest.mark.parametrize("kwargs, message", [
    (dict(tpp=[1, 2]), "^tpp: not a plan or system field"),
    (dict(tp=[]), "^tp: empty list"),
    (dict(scale_out_bandwidth=["25 GB", "50 GB/s"]), "^scale_out_bandwidth: unit 'GB' is not a unit of bytes/s"),
    (dict(tp=[1, 2, 1e12]), "^tp: got 1e\\+12"),
    (dict(top=0), "^top: got 0"),
    (dict(chunk_rows=0), "^chunk_rows: got 0"),
    (dict(scheduler="mpi"), "^scheduler: got 'mpi'"),
    (dict(objective="speed"), "^objective: unknown column 'speed'"),
    (dict(pareto=("tokens_per_s",)), "^pareto: got"),
    (dict(pareto=("tokens_per_s", "max:tokens_per_s")), "^pareto: .*different objectives"),
    (dict(progress="yes"), "^progress: got 'yes'"),
    (dict(kind="infer"), "^kind: got 'infer'"),
])
def test_bad_input_is_one_line_naming_the_field(kwargs, message):
    axes = {**SMALL, **{k: v for k, v in kwargs.items() if k in ("tpp", "tp", "scale_out_bandwidth")}}
    options = {k: v for k, v in kwargs.items() if k not in axes}
    with pytest.raises(SnlabError, match=message) as info:
        snlab.explore(MODEL, SYSTEM, **{"progress": False, **options}, **axes)
    assert "\n" not in str(info.value)


def test_a_field_no_point_of_the_space_reads_is_refused_before_any_chunk():
    """As the sweeps, explore refuses a field read nowhere in its space (a dense model's
    expert settings) and keeps one some point reads (ep 1 and 2 with an imbalance)."""
    with pytest.raises(SnlabError, match="^capacity_factor: .*no routed experts"):
        snlab.explore("llama3-8b", "dgx-h100", dp=[4, 8], global_batch=64, capacity_factor=[1.0, 1.25], progress=False)
    with pytest.raises(SnlabError, match="^expert_imbalance: .*ep 1"):
        snlab.explore("mixtral-8x7b", "dgx-h100", kind="serve", tp=2, ep=1, batch=[8, 16], prompt_len=100,
                      output_len=10, expert_imbalance=1.2, progress=False)
    with pytest.raises(SnlabError, match="^kv_fraction: .*scenario 'fixed'"):
        snlab.explore("llama3-8b", "dgx-h100", kind="serve", batch=[8, 16], prompt_len=100, output_len=10,
                      kv_fraction=0.5, progress=False)
    kept = snlab.explore("mixtral-8x7b", "dgx-h100", kind="serve", tp=2, ep=[1, 2], batch=[8, 16], prompt_len=100,
                         output_len=10, expert_imbalance=1.2, progress=False)
    assert kept.rows == 4


# --- the spec and the command ---------------------------------------------------------------

def test_ranges_read_units_round_counts_and_keep_each_value_once():
    from snlab.exploration.kinds import kind
    k = kind("train")
    bw = spec.axis("scale_up_bandwidth", {"from": "100 GB/s", "to": "1.8 TB/s", "steps": 8}, k)
    assert bw[0] == 100e9 and bw[-1] == 1.8e12 and len(bw) == 8
    assert spec.axis("micro_batch", {"from": 1, "to": 8, "steps": 4, "scale": "log"}, k).tolist() == [1, 2, 4, 8]
    assert spec.axis("dp", {"from": 1, "to": 4, "steps": 9, "scale": "log"}, k).tolist() == [1, 2, 3, 4]
    assert spec.axis("dp", {"from": 8, "to": 32, "step": 8}, k).tolist() == [8, 16, 24, 32]
    assert spec.axis("hbm_capacity", {"from": "80 GB", "to": "80 GB", "steps": 1}, k).tolist() == [80e9]


def write(tmp_path, text: str) -> str:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return str(path)


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "snlab", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


HEAD = 'model = "megatron-1t"\nsystem = "dgx-a100"\n'


@pytest.mark.parametrize("body, message", [
    ("[axes]\ntpp = [1, 2]\n", "snlab: error: tpp: not a plan or system field"),
    ("[axes]\ndp = { from = 8, to = 1, step = 1 }\n", "snlab: error: dp: empty range"),
    ("[axes]\ndp = { from = 8, to = 8, steps = 3 }\n", "snlab: error: dp: empty range"),
    ("[axes]\ntp = { from = 8, to = 1, steps = 3 }\n", "snlab: error: tp: from 8 above to 1 (allowed: from <= to)"),
    ('[axes]\nscale_up_bandwidth = { from = "100 GB", to = "1.8 TB/s", steps = 8 }\n',
     "snlab: error: scale_up_bandwidth: unit 'GB' is not a unit of bytes/s"),
    ('[axes]\nhbm_capacity = { from = "80 GB", upto = "1 TB", steps = 2 }\n',
     "snlab: error: hbm_capacity: 'upto' is not a key of a range"),
    ('[axes]\ntp = { from = "1 GB", to = 8, steps = 4 }\n', "snlab: error: tp: from = '1 GB'"),
    ("colour = 1\n", "snlab: error: colour: not a key of an exploration spec"),
    ("[axes\n", "snlab: error: spec: "),
])
def test_bad_specs_get_one_line_naming_the_axis(tmp_path, body, message):
    from snlab.cli import main
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["explore", "--spec", write(tmp_path, HEAD + body)]) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)


def test_the_command_explores_a_spec_and_prints_json(tmp_path):
    path = write(tmp_path, HEAD + 'top = 3\n[axes]\ntp = [2, 8]\npp = [4, 8, 16]\ndp = [4, 8]\nglobal_batch = 1024\n'
                 'scale_out_bandwidth = { from = "25 GB/s", to = "100 GB/s", steps = 4 }\n')
    done = run_cli("explore", "--spec", path, "--pareto", "tokens_per_s,min:scale_out_bandwidth", "--json",
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["rows"] == 48 and len(data["top"]) == 3 and data["pareto_objectives"] == \
        ["max:tokens_per_s", "min:scale_out_bandwidth"]
    frame = snlab.sweep(MODEL, SYSTEM, tp=[2, 8], pp=[4, 8, 16], dp=[4, 8], global_batch=1024,
                        scale_out_bandwidth=np.linspace(25e9, 100e9, 4))
    assert [r["row"] for r in data["top"]] == reference_top(frame, "tokens_per_s", 1, 3).tolist()
    text = run_cli("explore", "--spec", path, "--top", "2", "--no-progress")
    assert text.returncode == 0 and "best 2 by max:tokens_per_s" in text.stdout


def test_a_grid_of_more_than_32_dimensions_explores_and_sweeps():
    """Four swept hardware fields next to the plan's make an open grid of 33 dimensions,
    past what numpy.broadcast and numpy.select take (the 1e8 co-design benchmark's grid)."""
    axes = dict(tp=[1, 8], pp=[1, 2], dp=[1, 8], micro_batch=[1, 2], recompute=["none", "full"], zero=[0, 1],
                sequence_parallel=[False, True], global_batch=1024, scale_up_domain_size=[8, 72],
                scale_up_bandwidth=[100e9, 900e9], hbm_capacity=[80e9, 192e9], scale_out_bandwidth=[25e9, 50e9])
    result = snlab.explore("llama3-70b", "gb200-nvl72", top=3, progress=False, **axes)
    frame = snlab.sweep("llama3-70b", "gb200-nvl72", **axes)
    assert result.rows == len(frame) == 2 ** 11
    best = feasible_rows(frame)["tokens_per_s"].nlargest(3).to_numpy()
    np.testing.assert_array_equal(result.top["tokens_per_s"].to_numpy(), best)


def test_explore_places_each_plan_on_its_slice_of_a_torus_as_sweep_does():
    axes = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], dp=[1, 2, 4, 8], micro_batch=1, global_batch=64)
    for system in ("tpu7x-pod", "tpu-v5p-pod"):
        swept = snlab.sweep("llama3-8b", system, **axes)
        best = swept[swept.valid & swept.fits].sort_values("tokens_per_s", ascending=False).iloc[0]
        top = snlab.explore("llama3-8b", system, **axes).top.iloc[0]
        assert top.tokens_per_s == pytest.approx(best.tokens_per_s) and top.slice == best.slice != ""
    given = dict(tp=8, pp=4, dp=2, micro_batch=1, global_batch=64, slice="4x4x4")
    assert snlab.explore("llama3-70b", "tpu7x-pod", **given).top.step_time_s.iloc[0] == \
        pytest.approx(snlab.train("llama3-70b", "tpu7x-pod", **given).step_time_s)
    for bad, system in (("3x3x3", "tpu7x-pod"), ("4x4x4", "dgx-h100")):
        with pytest.raises(snlab.SnlabError, match="^slice:"):
            snlab.explore("llama3-70b", system, **{**given, "slice": bad})
