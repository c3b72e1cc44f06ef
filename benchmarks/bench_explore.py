"""Speed and memory of ``snlab.explore``: configurations per second per worker, and the
peak memory, for co-design grids of about 1e7 and 1e8 configurations, in this process
and on a local Dask cluster of one and two worker processes.

Run: ``.venv/bin/python benchmarks/bench_explore.py`` (``--sizes 1e7`` for the small
grid alone). Each measurement runs in a fresh interpreter so that its peak resident
memory (``resource.getrusage``'s ``ru_maxrss``) is its own; a Dask run reports the
client's peak and the largest worker's. Times are wall time from the call to its result,
the Dask cluster started beforehand (as a user's cluster is). Targets: at least 1e6
configurations per second per worker, two workers at least 1.6 times one, a 1e8 run
under 2 GB. ``busy`` is the CPU time the evaluating processes got over the wall time, per
worker: below 1, other work on the machine had the cores, and two workers cannot reach
twice one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

#: 8,640 training plans of llama3-70b: every degree, micro-batch, recomputation, ZeRO stage
#: and sequence parallelism for a global batch of 1,024 sequences
PLANS = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4, 8, 16], dp=[1, 2, 4, 8, 16, 32], micro_batch=[1, 2, 4, 8],
             recompute=["none", "selective", "full"], zero=[0, 1, 2], sequence_parallel=[False, True],
             global_batch=1024)
#: the machine a user would build: scale-up domain, its bandwidth, HBM per device
#: (9,953,280 configurations with the plans), and the scale-out bandwidth for 1e8
HARDWARE = dict(scale_up_domain_size=[8, 16, 32, 72, 144, 288, 384, 576],
                scale_up_bandwidth=np.geomspace(100e9, 1.8e12, 12), hbm_capacity=np.linspace(80e9, 288e9, 12))
SCALE_OUT = dict(scale_out_bandwidth=np.geomspace(12.5e9, 200e9, 10))
PARETO = ("tokens_per_s", "min:scale_up_bandwidth", "min:hbm_capacity")


def axes(size: float) -> dict:
    return {**PLANS, **HARDWARE, **(SCALE_OUT if size >= 5e7 else {})}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # Linux reports kB


def _cpu_s(client) -> float:
    """CPU seconds used so far by this process, or by the Dask workers."""
    def used():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    return used() if client is None else sum(client.run(used).values())


def one(mode: str, size: float) -> dict:
    """One measurement in this interpreter: ``mode`` is ``inproc`` or ``dask-N``."""
    import snlab
    snlab.train("llama3-70b", "gb200-nvl72", tp=8, pp=4, dp=8, global_batch=1024)   # compile the formulas
    cluster = client = None
    scheduler, workers = None, 1
    if mode.startswith("dask-"):
        from dask import distributed
        from snlab.exploration.schedule import local_cluster
        workers = int(mode.split("-")[1])
        cluster = local_cluster(workers)     # what scheduler="dask" starts: no worker profiler
        client = distributed.Client(cluster)
        client.run(lambda: __import__("snlab").train("llama3-70b", "gb200-nvl72", tp=8, pp=4, dp=8,
                                                       global_batch=1024) and None)
        scheduler = client
    cpu = _cpu_s(client)
    start = time.perf_counter()
    result = snlab.explore("llama3-70b", "gb200-nvl72", pareto=PARETO, top=10, scheduler=scheduler,
                           progress=False, **axes(size))
    seconds = time.perf_counter() - start
    out = {"mode": mode, "workers": workers, "rows": result.rows, "seconds": seconds,
           "configs_per_s": result.rows / seconds, "per_worker": result.rows / seconds / workers,
           "feasible": result.feasible, "front": len(result.pareto), "peak_mb": peak_mb(),
           "best": float(result.top["tokens_per_s"].iloc[0]), "chunk_rows": result.chunk_rows}
    # CPU seconds the evaluating processes got over the wall time: 1 per worker when each had
    # a core to itself; less when other work on the machine took the cores
    out["busy"] = (_cpu_s(client) - cpu) / seconds / workers
    if client is not None:
        peaks = client.run(lambda: __import__("resource").getrusage(
            __import__("resource").RUSAGE_SELF).ru_maxrss / 1024)
        out["worker_peak_mb"] = max(peaks.values())
        client.close()
        cluster.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e7,1e8", help="grid sizes, comma-separated (about 1e7 and 1e8)")
    parser.add_argument("--modes", default="inproc,dask-1,dask-2")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], float(args.one[1]))))
        return
    print(f"{'configurations':>15} {'where':>10} {'workers':>7} {'s':>7} {'configs/s':>12} {'per worker':>12} "
          f"{'peak MB':>8} {'worker MB':>9} {'busy':>5}")
    for size in (float(s) for s in args.sizes.split(",")):
        rates = {}
        for mode in args.modes.split(","):
            done = subprocess.run([sys.executable, __file__, "--one", mode, str(size)], capture_output=True,
                                  text=True, env=os.environ)
            if done.returncode:
                print(f"{mode} at {size:g}: failed\n{done.stderr[-2000:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rates[mode] = r["configs_per_s"]
            print(f"{r['rows']:>15,} {mode:>10} {r['workers']:>7} {r['seconds']:>7.1f} {r['configs_per_s']:>12,.0f} "
                  f"{r['per_worker']:>12,.0f} {r['peak_mb']:>8.0f} {r.get('worker_peak_mb', float('nan')):>9.0f} "
                  f"{r['busy']:>5.2f}"
                  f"   front {r['front']}, best {r['best']:,.0f} tokens/s")
        if "dask-2" in rates and "dask-1" in rates:
            print(f"{'':>15} two Dask workers over one: {rates['dask-2'] / rates['dask-1']:.2f}x; "
                  f"over this process: {rates['dask-2'] / rates.get('inproc', float('nan')):.2f}x")


if __name__ == "__main__":
    main()
