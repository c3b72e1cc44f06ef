"""Python-side time of one dashboard update (aim: under 50 ms).

Moves one control of each dashboard back and forth and times ``control.value = x``:
the observer recomputes the numbers, builds the new Altair spec and hands it to the
same JupyterChart (serialised, ready for the websocket). The browser's redraw is not
included. ``cold`` clears the training dashboard's plan cache before every move (a
setting never seen before: two plan searches); ``warm`` revisits settings.

Run: ``.venv/bin/python benchmarks/bench_widgets.py`` (prints a table; exit 0).
"""

from __future__ import annotations

import statistics
import time

from snlab import widgets


def _moves(dash, name, values, repeats, before=None):
    control = dash.controls[name]
    times = []
    for _ in range(repeats):
        for value in values:
            if before:
                before()
            start = time.perf_counter()
            control.value = value
            times.append(time.perf_counter() - start)
            assert dash.error is None, dash.error
    return times


def main(repeats: int = 5) -> None:
    cases = [
        ("training: micro-batch, warm", widgets.training_dashboard, "micro_batch", [2, 4, 1], None),
        ("training: micro-batch, cold", widgets.training_dashboard, "micro_batch", [2, 4, 1],
         widgets.best_plan.cache_clear),
        ("training: overlap, warm", widgets.training_dashboard, "overlap", ["all", "none", "standard"], None),
        ("pipeline: pp", widgets.pipeline_dashboard, "pp", [4, 16, 8], None),
        ("memory: recompute", widgets.memory_dashboard, "recompute", ["full", "none", "selective"], None),
        ("compute: tokens", widgets.compute_dashboard, "tokens", [256, 4096, 16], None),
        ("collective: group size", widgets.collective_dashboard, "group_size", [64, 512, 16], None),
        ("serving: prompt length", widgets.serving_dashboard, "prompt_len", [1048576, 4096, 131072], None),
        ("planner: tokens, warm", widgets.planner_dashboard, "tokens", [1e12, 5e12, 2e12], None),
    ]
    print(f"{'dashboard update':32} {'median [ms]':>12} {'min [ms]':>10} {'max [ms]':>10}  runs")
    for label, build, control, values, before in cases:
        dash = build()
        _moves(dash, control, values, 1, before)            # warm up imports and compiled formulas
        times = [t * 1e3 for t in _moves(dash, control, values, repeats, before)]
        print(f"{label:32} {statistics.median(times):12.1f} {min(times):10.1f} {max(times):10.1f}  {len(times)}")


if __name__ == "__main__":
    main()
