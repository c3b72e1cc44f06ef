"""Every valid row of an exploration as Parquet, one file a chunk, never all in memory.

The files are partitioned by model, system and precision the way pyarrow and pandas read
a directory (``model=llama3-70b/system=dgx-h100/precision=bf16/part-00000012.parquet``):
``pandas.read_parquet(out)`` reads them back as one frame, those three as columns. Each
file is written whole (:func:`snlab.files.write_bytes`: a temporary name, then a rename),
so an interrupted run leaves whole files only; ``_explore.json``, written last, says how
many chunks and rows the files hold and whether the run completed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .. import files
from ..errors import SnlabError

MANIFEST = "_explore.json"


def require() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SnlabError("out", "writing Parquet needs pyarrow", "pip install 'snlab[explore]'") from None


def prepare(out) -> str:
    """The directory to write into: absent or empty, or refused (rows of two runs must
    not mix)."""
    require()
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SnlabError("out", f"{str(path)!r} exists and is not an empty directory",
                         "a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)
    return str(path.resolve())


def _part(value: str) -> str:
    # a partition directory's value: no separators, nothing a reader would take apart
    return str(value).replace(os.sep, "_").replace("=", "_")


def write_chunk(problem, ev, chunk, axes: dict) -> list[str]:
    """The chunk's valid rows (every rule kept; ``fits`` says whether they fit) as one
    Parquet file; returns its path relative to ``out`` (none when no row is valid)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    kind = problem.kind
    cols, broken, out = kind.flat(ev, axes)
    valid = broken < 0
    if not valid.any():
        return []
    pick = np.flatnonzero(valid)
    model, system, precision = problem.spec(chunk.spec)
    frame = kind.frame(model, system, precision, {k: _take(v, pick) for k, v in cols.items()}, ev.labels,
                       broken[pick], {k: _take(v, pick) for k, v in out.items()}, axes)
    if "overlap" in problem.labels and hasattr(frame["overlap"], "cat"):
        # one set of categories in every file, whatever the chunk held
        frame["overlap"] = frame["overlap"].cat.set_categories(problem.labels["overlap"])
    frame.insert(0, "row", chunk.start + pick.astype(np.int64))
    keys = [("model", model.name), ("system", system.name)] + ([("precision", precision)] if precision else [])
    frame = frame.drop(columns=[k for k, _ in keys])
    relative = os.path.join(*[f"{k}={_part(v)}" for k, v in keys], f"part-{chunk.index:08d}.parquet")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink, compression="zstd")
    files.write_bytes(os.path.join(problem.out, relative), sink.getvalue().to_pybytes())
    return [relative]


def _take(v, pick):
    return v[pick] if np.ndim(v) else v


def write_manifest(out: str, info: dict) -> None:
    files.write_text(os.path.join(out, MANIFEST), json.dumps(info, indent=2, allow_nan=False) + "\n")
