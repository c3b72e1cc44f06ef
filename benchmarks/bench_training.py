"""Speed of the planners: single ``snlab.train`` / ``snlab.serve`` calls in a loop, as
users write them; configurations per second of ``snlab.sweep``; the time of a full
``snlab.search``. Run: ``.venv/bin/python benchmarks/bench_training.py``.

Figures are the best of several repeats on one core (numpy's element-wise work is
single-threaded); the first call in a fresh process, which imports snlab and compiles the
formulas (or loads them from the disk cache), is reported apart in CPU seconds, with
Python's bytecode cached as an installed package has it (in a temporary directory that
one earlier run fills, whatever ``PYTHONDONTWRITEBYTECODE`` says). A single call repeated in a loop
runs its plan's scalar kernel (:mod:`snlab.kernel`) from the second call of each structure
on; the loops below change a continuous field (the global batch, the prompt length), as a
slider does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import snlab


def best_of(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


FIRST_CALL = ("import time; t = time.process_time(); import snlab; "
              "snlab.train('megatron-1t', 'dgx-a100', tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072); "
              "print(time.process_time() - t)")


def first_call_cpu_s(cache_dir: str, bytecode_dir: str) -> float:
    """CPU seconds of ``import snlab`` and one ``train()`` in a fresh process, with the
    compiled formulas' disk cache in ``cache_dir`` and Python's bytecode in ``bytecode_dir``."""
    env = {**os.environ, "SNLAB_CACHE_DIR": cache_dir, "PYTHONPYCACHEPREFIX": bytecode_dir}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as bytecode, tempfile.TemporaryDirectory() as primed, \
            tempfile.TemporaryDirectory() as cache:
        first_call_cpu_s(primed, bytecode)          # Python's bytecode, as an installed package has it
        cold = first_call_cpu_s(cache, bytecode)
        warm = min(first_call_cpu_s(cache, bytecode) for _ in range(3))
    print(f"first train() call in a fresh process, import included: {cold:.2f} CPU-s compiling the formulas, "
          f"{warm:.2f} CPU-s with them cached on disk")
    snlab.train("megatron-1t", "dgx-a100", tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072)

    calls = 1000
    batches = [8 * (1 + i % 16) for i in range(calls)]       # a loop that changes its plan
    t = best_of(lambda: [snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=b) for b in batches])
    print(f"train, {calls:,} single calls in a loop: {t:.2f} s = {t / calls * 1e3:.2f} ms per call")
    lengths = [1000 * (1 + i % 16) for i in range(calls)]
    t = best_of(lambda: [snlab.serve("llama3-70b", "dgx-h100", tp=8, batch=16, prompt_len=n, output_len=500)
                         for n in lengths])
    print(f"serve, {calls:,} single calls in a loop: {t:.2f} s = {t / calls * 1e3:.2f} ms per call")

    grid = dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072,
                scale_out_bandwidth=np.linspace(1e9, 100e9, 1_000_000))
    t = best_of(lambda: snlab.sweep("megatron-1t", "dgx-a100", **grid), repeats=3)
    print(f"sweep, 1,000,000 configurations along one axis: {t:.2f} s = {1e6 / t:,.0f} configurations/s")

    axes = dict(tp=[1, 2, 4, 8, 16], pp=[1, 2, 4, 8, 16, 32, 64, 128], dp=[1, 2, 3, 4, 6, 8, 12, 16],
                micro_batch=[1, 2, 4, 8], global_batch=3072, recompute=["none", "selective", "full"],
                zero=[0, 1, 2, 3], interleave=[1, 2], sequence_parallel=[False, True],
                scale_out_bandwidth=np.linspace(12.5e9, 100e9, 8))
    n = int(np.prod([len(v) if isinstance(v, (list, np.ndarray)) else 1 for v in axes.values()]))
    t = best_of(lambda: snlab.sweep("megatron-1t", "dgx-a100", **axes), repeats=3)
    print(f"sweep, {n:,} mixed plans (a third break a rule): {t:.2f} s = {n / t:,.0f} configurations/s")

    result = {}
    t = best_of(lambda: result.update(df=snlab.search("megatron-1t", "dgx-a100", devices=4096,
                                                      global_batch=3072)), repeats=3)
    print(f"search, megatron-1t on 4,096 devices: {t:.2f} s over {result['df'].attrs['evaluated']:,} valid plans")


if __name__ == "__main__":
    main()
