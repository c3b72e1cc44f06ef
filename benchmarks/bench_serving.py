"""Speed of the serving planner: single ``snlab.serve`` calls in a loop (fixed batch and
offline), and configurations per second of ``snlab.serve_sweep`` over a grid of
deployments and over one long hardware axis. Run:
``.venv/bin/python benchmarks/bench_serving.py``.

Figures are the best of several repeats on one core; the first call, which compiles the
formulas, is reported apart. Targets on the reference machine (2 cores): a single call
under 1 ms, a sweep above 300,000 configurations per second.
"""

from __future__ import annotations

import time

import numpy as np

import snlab
from bench_training import best_of


def main() -> None:
    start = time.perf_counter()
    snlab.serve("llama3-70b", "dgx-h100", tp=8, batch=16, prompt_len=1000, output_len=500)
    print(f"first serve() call (imports and formula compilation): {time.perf_counter() - start:.2f} s")

    calls = 1000
    lengths = [1000 * (1 + i % 16) for i in range(calls)]
    t = best_of(lambda: [snlab.serve("llama3-70b", "dgx-h100", tp=8, batch=16, prompt_len=n, output_len=500)
                         for n in lengths])
    print(f"serve, {calls:,} single calls in a loop: {t:.2f} s = {t / calls * 1e3:.2f} ms per call")
    t = best_of(lambda: [snlab.serve("llama3-70b", "dgx-h100", tp=2, scenario="offline", requests=3000,
                                     prompt_len=n, output_len=1000, weight_dtype="fp8", kv_dtype="fp8")
                         for n in lengths[:200]])
    print(f"serve offline, 200 single calls in a loop: {t:.2f} s = {t / 200 * 1e3:.2f} ms per call")
    t = best_of(lambda: [snlab.serve("deepseek-v3", "cloudmatrix384", dp=32, ep=32, batch=32 * b,
                                     prompt_len=4096, output_len=256, weight_dtype="int8", microbatches=2)
                         for b in range(1, 201)])
    print(f"serve MoE with two-batch overlap, 200 single calls: {t:.2f} s = {t / 200 * 1e3:.2f} ms per call")

    axes = dict(tp=[1, 2, 4, 8], pp=[1, 2], batch=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
                prompt_len=[1000, 4000, 16000, 64000, 256000, 1000000], output_len=[100, 500, 1000, 2000],
                weight_dtype=["bf16", "fp8"], kv_dtype=["bf16", "fp8"], draft_tokens=[0, 1, 2],
                hbm_bandwidth=np.linspace(2e12, 5e12, 8))
    n = int(np.prod([len(v) for v in axes.values()]))
    t = best_of(lambda: snlab.serve_sweep("llama3-70b", "dgx-h100", **axes), repeats=3)
    print(f"serve_sweep, {n:,} mixed deployments: {t:.2f} s = {n / t:,.0f} configurations/s")

    long = dict(tp=8, batch=16, prompt_len=100_000, output_len=1000, pool_bandwidth=np.linspace(1e9, 1e12, 1_000_000))
    t = best_of(lambda: snlab.serve_sweep("llama3-70b", "cloudmatrix384", **long), repeats=3)
    print(f"serve_sweep, 1,000,000 configurations along one axis: {t:.2f} s = {1e6 / t:,.0f} configurations/s")

    offline = dict(tp=[1, 2, 4, 8], scenario="offline", requests=[1000, 3000, 10000, 30000],
                   prompt_len=[128, 500, 1000, 2048, 5000, 20000], output_len=[128, 500, 1000, 2000, 4096],
                   weight_dtype=["fp8", "fp4"], kv_dtype="fp8", kv_fraction=np.linspace(0.5, 0.95, 40))
    n = int(np.prod([len(v) if isinstance(v, (list, np.ndarray)) else 1 for v in offline.values()]))
    t = best_of(lambda: snlab.serve_sweep("llama3-70b", "dgx-b200", **offline), repeats=3)
    print(f"serve_sweep offline, {n:,} benchmarks: {t:.2f} s = {n / t:,.0f} configurations/s")


if __name__ == "__main__":
    main()
