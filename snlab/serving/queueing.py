"""A discrete-event run of requests through engine instances, step by step.

An engine is a step machine: at each step boundary its scheduler looks at what has
arrived and what it holds, picks the next step and runs it; nothing happens inside a
step that changes the next decision. So the run is a loop over steps, jumping over idle
time to the next arrival, with each step's time from the instance's
:class:`~snlab.serving.service.Service` (the serving step model). Schedulers:

* ``chunked`` (vLLM V1, SGLang, TensorRT-LLM's in-flight batching with chunked context,
  Sarathi-Serve): every step runs all decoding sequences and fills the rest of the token
  budget with prefill chunks, first come first served, oldest prompt first;
* ``mixed`` (Orca; TensorRT-LLM's in-flight batching with chunked context off, its
  default): as ``chunked``, but a prompt is prefilled whole, in one step, with the decodes;
* ``prefill-first`` (vLLM before V1 without chunked prefill, the engine of DistServe's
  and vLLM v0.6's published runs): a step prefills whole waiting prompts, as many as the
  budget takes, whenever there are some; decodes wait meanwhile;
* ``prefill-only`` and ``decode-only``: the two pools of a disaggregated deployment
  (:mod:`snlab.serving.disaggregation`); a decode instance takes each request's KV cache
  over its link first, one transfer after another, into memory it reserves first.

A request is admitted while the instance keeps fewer than ``max_sequences`` and its KV
cache has room for the request's prompt and output, in whole blocks (TensorRT-LLM's
GUARANTEED_NO_EVICT policy, SGLang's pre-allocation: nothing is ever preempted). A run
records each request's arrival, admission, first token and last token, and each decode
step's gap and batch (the inter-token latencies of its sequences).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import SnlabError
from .service import POLICIES, Service
from .workload import Requests

#: the most steps one instance runs before the run is cut short (a queue that never drains)
MAX_STEPS = 2_000_000


@dataclass(frozen=True)
class Run:
    """What happened to each request [s]: arrival, admission (start of prefill, or of
    the KV transfer on a decode instance), first token, last token; with the KV transfer's
    start and end on decode instances (NaN elsewhere), every decode step's gap since the
    previous decode step and its batch, the peak KV tokens held, and the run's end."""

    arrival: np.ndarray
    admitted: np.ndarray
    first: np.ndarray
    last: np.ndarray
    transfer_start: np.ndarray
    transfer_end: np.ndarray
    gaps: np.ndarray
    batches: np.ndarray
    peak_kv_tokens: float
    end: float


class _Instance:
    """One engine instance stepping through its requests (see the module docstring)."""

    def __init__(self, svc: Service, policy: str, arrival, prompt, output, cached, closed: int = 0,
                 transfer_s=None):
        if policy not in POLICIES:
            raise SnlabError("policy", f"got {policy!r}", ", ".join(POLICIES))
        self.svc, self.policy = svc, policy
        self.arrival = [float(x) for x in arrival]
        self.prompt, self.output = [float(x) for x in prompt], [float(x) for x in output]
        self.cached = [float(x) for x in cached]
        n = len(self.prompt)
        self.admitted, self.first, self.last = [math.nan] * n, [math.nan] * n, [math.nan] * n
        self.xfer_start, self.xfer_end = [math.nan] * n, [math.nan] * n
        self.transfer_s = transfer_s
        self.closed = closed           # users of a closed loop: each finish issues the next request
        self.issued = closed if closed else n
        self.next_arrival = 0
        self.waiting: deque = deque()
        self.prefilling: deque = deque()   # [id, tokens done] of admitted prompts
        self.xfers: list = []              # heap of (end, id) of transfers under way
        self.link_free = 0.0
        self.finishes: list = []           # heap of (counter, id)
        self.batch, self.s0 = 0, 0.0
        # decode steps run so far; a request's finish and context count from its value at joining
        self.counter = 0
        self.contrib = [math.nan] * n      # each decoding request's share of s0
        self.used, self.admitted_n = 0.0, 0
        self.peak = self.used
        self.now, self.last_decode = 0.0, math.nan
        self.gaps: list = []
        self.batches: list = []

    # --- arrivals and admission --------------------------------------------------------

    def _arrive(self) -> None:
        while self.next_arrival < self.issued and self.arrival[self.next_arrival] <= self.now:
            self.waiting.append(self.next_arrival)
            self.next_arrival += 1

    def _fits(self, i: int) -> bool:
        svc = self.svc
        return (self.admitted_n < svc.max_sequences
                and self.used + svc.reserve(self.prompt[i] + self.output[i]) <= svc.kv_tokens)

    def _take(self, i: int) -> None:
        self.used += self.svc.reserve(self.prompt[i] + self.output[i])
        self.peak = max(self.peak, self.used)
        self.admitted_n += 1
        self.admitted[i] = self.now

    def _admit(self) -> None:
        """Admit waiting requests first come first served while they fit; a decode
        instance starts their KV transfers, one after another on its link."""
        while self.waiting and self._fits(self.waiting[0]):
            i = self.waiting.popleft()
            self._take(i)
            if self.policy == "decode-only":
                start = max(self.now, self.link_free)
                self.link_free = start + self.transfer_s[i]
                self.xfer_start[i], self.xfer_end[i] = start, self.link_free
                heapq.heappush(self.xfers, (self.link_free, i))
            else:
                self.prefilling.append([i, self.cached[i]])

    # --- decode bookkeeping --------------------------------------------------------------

    def _join(self, i: int) -> None:
        """Request ``i`` has its first token: it decodes from the next step on."""
        left = self.output[i] - 1
        if left <= 0 or self.policy == "prefill-only":
            self._finish(i)
            return
        self.batch += 1
        self.contrib[i] = self.prompt[i] + 1 - self.counter * self.svc.tokens_per_step
        self.s0 += self.contrib[i]
        heapq.heappush(self.finishes, (self.counter + math.ceil(left / self.svc.tokens_per_step - 1e-9), i))

    def _finish(self, i: int) -> None:
        self.last[i] = self.now
        self.used -= self.svc.reserve(self.prompt[i] + self.output[i])
        self.admitted_n -= 1
        if self.closed and self.issued < len(self.prompt):
            self.arrival[self.issued] = self.now
            self.issued += 1

    def _decode_advance(self, step_start: float) -> None:
        self.counter += 1
        self.gaps.append(self.now - (step_start if math.isnan(self.last_decode) else self.last_decode))
        self.batches.append(self.batch)
        self.last_decode = self.now
        while self.finishes and self.finishes[0][0] <= self.counter:
            _, i = heapq.heappop(self.finishes)
            self.batch -= 1
            self.s0 -= self.contrib[i]
            self._finish(i)
        if self.batch == 0:
            self.s0, self.last_decode = 0.0, math.nan

    def _context(self) -> float:
        return (self.s0 + self.batch * self.counter * self.svc.tokens_per_step) / self.batch

    # --- steps -----------------------------------------------------------------------------

    def _chunk(self, budget: float, whole: bool) -> tuple[float, float, float, list]:
        """Prefill work of the next step: tokens, key-queries, cache reads [s], and the
        prompts it completes. ``whole``: prompts are not split (prefill-first)."""
        tokens = keys = load = 0.0
        completes = []
        for entry in self.prefilling:
            i, done = entry
            left = self.prompt[i] - done
            take = left if whole else min(left, budget - tokens)
            # a whole prompt waits for room, unless it is alone in a step of the full budget
            if take <= 0 or (whole and tokens + take > budget and (tokens > 0 or budget < self.svc.step_tokens)):
                break
            if done == self.cached[i] and self.cached[i] > 0:
                load += self.cached[i] * self.svc.cache_read_s_per_token + self.svc.cache_read_fixed_s
            keys += take * (done + take / 2)
            tokens += take
            entry[1] = done + take
            if entry[1] >= self.prompt[i]:
                completes.append(i)
            if tokens >= budget:
                break
        return tokens, keys, load, completes

    def _step(self) -> bool:
        """Run the next step; False when the instance has nothing left to do."""
        svc = self.svc
        decodes = self.batch if self.policy != "prefill-only" else 0
        prefill_first = self.policy in ("prefill-first", "prefill-only")
        whole = self.policy != "chunked"
        tokens = keys = load = 0.0
        completes = []
        room = svc.step_tokens - decodes * svc.decode_tokens
        if prefill_first and self.prefilling:
            tokens, keys, load, completes = self._chunk(svc.step_tokens, True)
            decodes = 0
        elif self.policy in ("chunked", "mixed") and room > 0:
            tokens, keys, load, completes = self._chunk(room, whole)
        if decodes == 0 and tokens == 0:
            return self._idle()
        start = self.now
        context = self._context() if decodes else math.nan
        self.now += svc.step_time(decodes, context, tokens, keys) + load
        if decodes:
            self._decode_advance(start)
        for i in completes:
            self.prefilling.popleft()
            self.first[i] = self.now
            self._join(i)
        return True

    def _idle(self) -> bool:
        """Nothing to run: jump to the next arrival or transfer; False when all is done."""
        if self.waiting and not self.xfers and self.admitted_n == 0:
            raise SnlabError("workload", "a request needs more KV cache than the instance holds",
                             f"prompt + output within {self.svc.kv_tokens:,.0f} tokens (kv_fraction of the memory "
                             f"the weights, the runtime's reserve and engine_memory_bytes leave)")
        upcoming = [self.arrival[self.next_arrival]] if self.next_arrival < self.issued else []
        if self.xfers:
            upcoming.append(self.xfers[0][0])
        if not upcoming:
            return False
        self.now = max(self.now, min(upcoming))
        return True

    def _land(self) -> None:
        """Transfers that have ended join the decode batch."""
        while self.xfers and self.xfers[0][0] <= self.now:
            _, i = heapq.heappop(self.xfers)
            self._join(i)

    def run(self) -> Run:
        for _ in range(MAX_STEPS):
            self._arrive()
            self._land()
            self._admit()
            if not self._step():
                break
        else:
            raise SnlabError("workload", f"the run did not drain in {MAX_STEPS:,} steps",
                             "a lower rate, fewer requests or a larger deployment")
        arr = np.asarray(self.arrival[:len(self.prompt)])
        return Run(arr, np.asarray(self.admitted), np.asarray(self.first), np.asarray(self.last),
                   np.asarray(self.xfer_start), np.asarray(self.xfer_end), np.asarray(self.gaps),
                   np.asarray(self.batches, dtype=float), self.peak, self.now)


def run_instance(svc: Service, requests: Requests, policy: str = "chunked", cached=None, closed: int = 0,
                 first_token=None, transfer_s=None) -> Run:
    """Run ``requests`` through one instance under ``policy``. ``cached``: prompt
    tokens per request found in the prefix cache; ``closed``: users of a closed loop
    (the requests' arrival times are then set as the run goes); for a decode instance,
    ``first_token`` the time each request's first token and KV cache are ready on its
    prefill instance and ``transfer_s`` the KV transfer of each."""
    n = len(requests)
    cached = np.zeros(n) if cached is None else np.minimum(cached, requests.prompt - 1)
    arrival = requests.arrival_s if first_token is None else first_token
    inst = _Instance(svc, policy, arrival, requests.prompt, requests.output, cached, closed,
                     None if transfer_s is None else [float(x) for x in transfer_s])
    if policy == "decode-only":
        for i in range(n):
            inst.first[i] = float(first_token[i])
    return inst.run()
