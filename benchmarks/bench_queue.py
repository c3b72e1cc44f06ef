"""Speed of serving under load: a 1,000-request discrete-event run (colocated and
disaggregated, instance tables built), the closed forms over a sweep of rates, and a
capacity plan. Run: ``.venv/bin/python benchmarks/bench_queue.py``.

Figures are the best of several repeats on one core; the first call, which builds the
instance's step-time tables, is reported apart. Target on the reference machine (2
cores): a 1,000-request run under 2 s, tables included.
"""

from __future__ import annotations

import time

from bench_training import best_of

import snlab
from snlab.serving import approx
from snlab.serving.service import instance
from snlab.serving.workload import workload

KW = dict(lengths="sharegpt-distserve", requests=1000, ttft_target=1.0, tpot_target=0.05)


def main() -> None:
    start = time.perf_counter()
    snlab.serve_load("llama3-70b", "dgx-h100", tp=8, rate=4, **KW)
    print(f"first serve_load (imports, formula compilation, step-time tables): {time.perf_counter() - start:.2f} s")

    def cold(**kw):
        from snlab.serving import service
        service._instance.cache_clear()            # the tables are built again, as on a first call
        return snlab.serve_load("llama3-70b", "dgx-h100", rate=8, **KW, **kw)

    t = best_of(lambda: cold(tp=8))
    print(f"1,000 requests, colocated, tables built: {t:.2f} s")
    t = best_of(lambda: cold(prefill=dict(tp=8), decode=dict(tp=8)))
    print(f"1,000 requests, disaggregated (1P1D), tables built: {t:.2f} s")
    t = best_of(lambda: snlab.serve_load("llama3-70b", "dgx-h100", tp=8, rate=8, **KW))
    print(f"1,000 requests, colocated, tables cached: {t:.2f} s")
    t = best_of(lambda: snlab.serve_load("llama3-8b", "dgx-h100", rate=30, **{**KW, "requests": 10000}), repeats=2)
    print(f"10,000 requests, colocated Llama 3 8B at 30 requests/s: {t:.2f} s")

    svc = instance("llama3-70b", "dgx-h100", max_context=4096, tp=8)
    requests = workload(1.0, lengths="sharegpt-distserve", requests=1000).sample()
    m = approx.moments(svc, requests)
    rates = [0.5 * (i + 1) for i in range(40)]
    t = best_of(lambda: [approx.colocated(svc, r, m, "chunked") for r in rates])
    print(f"closed forms, 40 rates: {t * 1e3:.0f} ms = {t / 40 * 1e3:.1f} ms per rate")

    t = best_of(lambda: snlab.serve_capacity("llama3-70b", "dgx-h100", rate=10, lengths="sharegpt-distserve",
                                             ttft_target=1.0, tpot_target=0.05), repeats=2)
    print(f"capacity plan, colocated and disaggregated, one system: {t:.2f} s")


if __name__ == "__main__":
    main()
