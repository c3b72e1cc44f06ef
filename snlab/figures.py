"""The README's pictures, exported offline by the library.

    .venv/bin/python -m snlab.figures                 # writes notebooks/figures/*.png
    .venv/bin/python -m snlab.figures --out DIR --format svg
    make figures                                      # the same as the first line

Each figure is a chart from :mod:`snlab.charts` over numbers from the planners, written
by vl-convert (no browser, no internet). The output is byte-identical from run to run
for the same presets and library versions, so a changed image in a diff means a
changed number.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import charts, compare
from .files import interruptible
from .compare import CLUSTER, SCALE_MODELS, SUPERNODE

DEFAULT_OUT = Path("notebooks") / "figures"            # relative to the working directory (the repo root)


def _scale():
    return compare.best_plans(SCALE_MODELS, [CLUSTER, SUPERNODE], devices=384, global_batch=768)


def figures() -> dict:
    """The README's charts by file stem."""
    best = _scale()
    order = compare.model_order(best)
    trillion = best[best["model"] == "megatron-1t"]
    return {
        "mfu-by-model-scale": charts.mfu_chart(
            best, x="model", sort=order, width=520,
            title="MFU of the fastest plan on 384 devices: cluster against supernode"),
        "step-breakdown-by-model-scale": charts.step_breakdown(
            best, by=("model", "system"), normalize=True,
            sort=[f"{m} / {s}" for m in order for s in (CLUSTER, SUPERNODE)],
            title="Share of the training step: compute, exposed communication, bubble"),
        "step-breakdown-1t-by-overlap": charts.step_breakdown(
            compare.vary(trillion, overlap=charts.OVERLAP_ORDER), by=("system", "overlap"),
            title="megatron-1t on 384 devices: the step at each overlap level"),
        "all-reduce-time": charts.collective_time(
            [CLUSTER, "dgx-h100", SUPERNODE], "all-reduce", 16, levels=False,
            title="All-reduce over 16 devices: latency-bound, then bandwidth-bound"),
    }


def export(out=DEFAULT_OUT, formats=("png",), scale: float = 2.0) -> list[Path]:
    """Write every figure in each format to ``out``; returns the paths written."""
    out = Path(out)
    written = []
    for stem, chart in figures().items():
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            charts.save(chart, path, scale=scale)
            written.append(path)
    return written


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snlab.figures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder to write to (default: notebooks/figures)")
    parser.add_argument("--format", action="append", choices=["png", "svg", "pdf", "html"],
                        help="image format; repeat for several (default: png)")
    parser.add_argument("--scale", type=float, default=2.0, help="pixel scale of PNG images (default 2)")
    args = parser.parse_args(argv)
    for path in export(args.out, tuple(args.format or ["png"]), args.scale):
        print(path)
    return 0


main = interruptible(_main, "python -m snlab.figures")


if __name__ == "__main__":
    sys.exit(main())
