"""Where the chunks run: in this process (the default), in local worker processes, or on
a Dask cluster (a local one, an existing ``dask.distributed.Client``, or a scheduler's
address). Every scheduler merges the same partial results (:mod:`.reduce`), so the answer
does not depend on which ran it. Ctrl-C stops handing out chunks and returns what was
reduced so far."""

from __future__ import annotations

import math
import os
import signal
import sys
from dataclasses import dataclass

from ..errors import SnlabError
from .problem import Problem, reduce_chunk, reduce_chunks
from .reduce import Partial

ALLOWED = ("none (this process), 'processes' (local worker processes), 'dask' (the current Dask client, "
           "else a local cluster), a dask.distributed.Client, or a scheduler address such as tcp://10.0.0.1:8786")
#: the most chunks one task carries: enough to make a task's overhead small, few enough
#: that a progress bar moves and Ctrl-C answers within a few seconds
MAX_CHUNKS_PER_TASK = 8


@dataclass
class Outcome:
    partial: Partial
    interrupted: bool
    scheduler: str
    workers: int


def tasks(chunks: int, workers: int) -> list[range]:
    """The chunks in contiguous groups: at least four tasks a worker, at most
    :data:`MAX_CHUNKS_PER_TASK` chunks a task."""
    size = max(1, min(MAX_CHUNKS_PER_TASK, math.ceil(chunks / (4 * max(workers, 1)))))
    return [range(lo, min(lo + size, chunks)) for lo in range(0, chunks, size)]


def check_workers(workers):
    if workers is None:
        return None
    from .. import grid
    return grid.whole_number("workers", workers, 1, 4096, "a whole number of workers from 1 to 4,096")


def kind_of(scheduler) -> str:
    if scheduler is None or (isinstance(scheduler, str) and scheduler in ("inline", "in-process", "none")):
        return "inline"
    if isinstance(scheduler, str):
        if scheduler == "processes":
            return "processes"
        if scheduler == "dask" or "://" in scheduler or ":" in scheduler:
            return "dask"
        raise SnlabError("scheduler", f"got {scheduler!r}", ALLOWED)
    if type(scheduler).__name__ == "Client" and hasattr(scheduler, "submit"):
        return "dask"
    raise SnlabError("scheduler", f"got {type(scheduler).__name__}", ALLOWED)


def run(problem: Problem, scheduler, workers, bar) -> Outcome:
    which = kind_of(scheduler)
    if which == "inline":
        return _inline(problem, bar)
    if which == "processes":
        return _processes(problem, workers or os.cpu_count() or 1, bar)
    return _dask(problem, scheduler, workers, bar)


def _merge(total: Partial, part: Partial, problem: Problem, bar) -> None:
    total.merge(part, problem.top, bool(problem.pareto))
    bar.update(part.rows)


def _inline(problem: Problem, bar) -> Outcome:
    total = Partial()
    try:
        for index in range(problem.space.chunks):
            _merge(total, reduce_chunk(problem, index), problem, bar)
    except KeyboardInterrupt:
        return Outcome(total, True, "in-process", 1)
    return Outcome(total, False, "in-process", 1)


_PROBLEM: Problem | None = None


def _init_worker(problem: Problem) -> None:
    # the parent answers Ctrl-C; a worker finishes its task and stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _PROBLEM
    _PROBLEM = problem


def _worker_task(indices) -> Partial:
    return reduce_chunks(_PROBLEM, indices)


def _processes(problem: Problem, workers: int, bar) -> Outcome:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    total, interrupted = Partial(), False
    # fork on Linux: workers start at once, and a script needs no `if __name__ ==
    # "__main__"` guard; elsewhere a fresh interpreter (spawn), which does need one
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(problem,))
    pending = {pool.submit(_worker_task, group) for group in tasks(problem.space.chunks, workers)}
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                _merge(total, future.result(), problem, bar)
    except KeyboardInterrupt:
        interrupted = True
        for future in pending:
            future.cancel()
        # tasks already running finish (their files whole); keep what they reduced
        for future in pending:
            if not future.cancelled():
                try:
                    _merge(total, future.result(), problem, bar)
                except Exception:
                    pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return Outcome(total, interrupted, "processes", workers)


def _client(scheduler, workers):
    """A Dask client and whether this call made it (and so closes it)."""
    try:
        from dask import distributed
    except ImportError:
        raise SnlabError("scheduler", "Dask needs dask[distributed]", "pip install 'snlab[explore]'") from None
    if not isinstance(scheduler, str):
        return scheduler, False
    if scheduler == "dask":
        try:
            return distributed.get_client(), False
        except ValueError:
            return distributed.Client(local_cluster(workers or os.cpu_count() or 1)), True
    try:
        return distributed.Client(scheduler, timeout="10s"), True
    except (OSError, TimeoutError) as exc:
        raise SnlabError("scheduler", f"cannot reach {scheduler!r} ({type(exc).__name__})", ALLOWED) from None


def local_cluster(workers: int):
    """A local Dask cluster of ``workers`` single-threaded processes, without the
    workers' statistical profiler: sampling the task's stack every 10 ms halves the rate
    of numpy code that makes as many short calls as the planners' kernels do (a worker
    explores at about half the speed of this process with it, at the same speed without)."""
    import dask
    from dask import distributed
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None)


def _dask(problem: Problem, scheduler, workers, bar) -> Outcome:
    from dask import distributed
    client, owned = _client(scheduler, workers)
    total, interrupted = Partial(), False
    try:
        n = max(1, sum(client.nthreads().values()))
        shared = client.scatter(problem, broadcast=True)
        groups = [tuple(g) for g in tasks(problem.space.chunks, n)]
        futures = client.map(reduce_chunks, [shared] * len(groups), groups, pure=False)
        merged = set()
        try:
            for future in distributed.as_completed(futures):
                _merge(total, future.result(), problem, bar)
                merged.add(future.key)
        except KeyboardInterrupt:
            interrupted = True
            client.cancel([f for f in futures if f.status == "pending"])
            for future in futures:
                if future.status == "finished" and future.key not in merged:
                    _merge(total, future.result(), problem, bar)
        name = f"dask ({client.scheduler.address})" if getattr(client, "scheduler", None) else "dask"
        return Outcome(total, interrupted, name, n)
    finally:
        if owned:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
