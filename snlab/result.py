"""The shared base of planner results: one JSON form, one text table, one HTML table.

A result is a frozen dataclass whose fields are numbers, strings and (nested) dicts of
them, in SI units with the unit in the name. Subclasses say what their headline and
summary rows are; the base turns them into text (``str``), HTML for Jupyter and JSON
(which refuses NaN and infinity: a result never holds one).
"""

from __future__ import annotations

import dataclasses
import json


class Result:
    """Mixin for the planners' frozen result dataclasses."""

    def headline(self) -> str:
        """One line saying what was computed."""
        raise NotImplementedError

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows of the readable summary."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """JSON-ready dictionary; keys mirror the attributes."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self, **kw) -> str:
        """The result as JSON (strict: a NaN or infinity would be an error, not ``NaN``)."""
        return json.dumps(self.to_dict(), allow_nan=False, **kw)

    def __str__(self) -> str:
        rows = self.summary_rows()
        width = max(len(a) for a, _ in rows)
        return self.headline() + "\n" + "\n".join(f"  {a:<{width}}  {b}" for a, b in rows)

    def _repr_html_(self) -> str:
        from html import escape         # (imported here: a planner call needs no HTML)
        body = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td></tr>" for a, b in self.summary_rows())
        return f"<table><caption style='text-align:left'><b>{escape(self.headline())}</b></caption>{body}</table>"


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value
