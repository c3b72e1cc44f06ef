"""What an exploration returns: the best rows, the Pareto front, why rows were refused and
each axis value's best, as pandas DataFrames, with a readable summary."""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class ExploreResult:
    """The reductions of an exploration.

    ``top``: the best ``k`` feasible rows by the objective (a sweep's columns, with
    ``row``, the row's place in the grid, as ``snlab.sweep`` of the same axes numbers it);
    ``pareto``: the rows no other feasible row beats in every objective (one per distinct
    point); ``refused``: rows that break a rule or do not fit, by reason; ``by_axis``: per
    value of each swept axis, its rows, feasible rows and best objective.
    """
    kind: str
    objective: str
    pareto_objectives: tuple
    top: object
    pareto: object
    refused: object
    by_axis: object
    rows: int
    evaluated: int
    feasible: int
    chunks: int
    chunks_done: int
    chunk_rows: int
    interrupted: bool
    elapsed_s: float
    scheduler: str
    workers: int
    out: str | None = None
    axes: tuple = field(default_factory=tuple)

    @property
    def configs_per_s(self) -> float:
        """Configurations evaluated per second of wall time [1/s]."""
        return self.evaluated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def complete(self) -> bool:
        return not self.interrupted and self.evaluated == self.rows

    def summary(self) -> str:
        workers = f"{self.workers} worker" + ("s" if self.workers != 1 else "")
        lines = [f"Exploration of {self.rows:,} {'plans' if self.kind == 'train' else 'deployments'} "
                 f"({self.scheduler}, {workers}, chunks of up to {self.chunk_rows:,} rows): "
                 f"{self.feasible:,} feasible of {self.evaluated:,} evaluated in {self.elapsed_s:.3g} s "
                 f"({self.configs_per_s:,.0f} configurations/s)"]
        if self.interrupted:
            lines.append(f"INTERRUPTED after {self.chunks_done:,} of {self.chunks:,} chunks "
                         f"({self.evaluated / max(self.rows, 1):.0%}): everything below covers those rows alone")
        if self.out:
            lines.append(f"valid rows written to {self.out}")
        return "\n".join(lines)

    def _shown(self, frame):
        metrics = [self.objective] + [o for o in self.pareto_objectives if o != self.objective]
        columns = [c for c in ("model", "system") if frame[c].nunique() > 1] if len(frame) else []
        columns += [a for a in self.axes if a in frame.columns and a not in columns]
        columns += [m for m in metrics if m in frame.columns and m not in columns]
        return frame[["row"] + columns]

    def __repr__(self) -> str:
        lines = [self.summary()]
        if len(self.top):
            lines += [f"best {len(self.top)} by {self._label(self.objective)}:",
                      self._shown(self.top).to_string(index=False, max_rows=20)]
        else:
            lines.append("no feasible row")
        if self.pareto is not None:
            lines += [f"Pareto front over {', '.join(self._labels())}: {len(self.pareto):,} rows",
                      self._shown(self.pareto).to_string(index=False, max_rows=20)]
        if len(self.refused):
            lines += ["refused:", self.refused.to_string(index=False)]
        return "\n".join(lines)

    def _label(self, name):
        return self.top.attrs.get("objective_label", name)

    def _labels(self):
        return self.pareto.attrs.get("objective_labels", self.pareto_objectives) if self.pareto is not None else ()

    def _repr_html_(self) -> str:
        parts = [f"<p><b>{html.escape(self.summary()).replace(chr(10), '<br>')}</b></p>"]
        if len(self.top):
            parts += [f"<p>best {len(self.top)} by <code>{html.escape(self._label(self.objective))}</code></p>",
                      self._shown(self.top).to_html(index=False, max_rows=20)]
        if self.pareto is not None:
            parts += [f"<p>Pareto front over {html.escape(', '.join(self._labels()))}: {len(self.pareto):,} rows</p>",
                      self._shown(self.pareto).to_html(index=False, max_rows=20)]
        if len(self.refused):
            parts += ["<p>refused</p>", self.refused.to_html(index=False)]
        return "\n".join(parts)

    def to_dict(self) -> dict:
        """Plain data for JSON: the summary and the four tables as lists of records."""
        import json

        def records(frame):
            return None if frame is None else json.loads(frame.to_json(orient="records", double_precision=15))
        return {"kind": self.kind, "objective": self._label(self.objective), "pareto_objectives": list(self._labels()),
                "rows": self.rows, "evaluated": self.evaluated, "feasible": self.feasible, "chunks": self.chunks,
                "chunks_done": self.chunks_done, "chunk_rows": self.chunk_rows, "interrupted": self.interrupted,
                "elapsed_s": self.elapsed_s, "scheduler": self.scheduler, "workers": self.workers, "out": self.out,
                "top": records(self.top), "pareto": records(self.pareto), "refused": records(self.refused),
                "by_axis": records(self.by_axis)}
