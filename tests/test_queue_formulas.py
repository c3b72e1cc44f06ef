"""The closed-form queueing approximations against the discrete-event run, where both
apply: within 10% (snlab.serving.approx's domain: Poisson arrivals, a stable server, a
decode batch inside the KV cache). Long runs, so that the run's own sampling noise stays
a few percent."""

import numpy as np
import pytest

from snlab.serving import approx
from snlab.serving.queueing import run_instance
from snlab.serving.service import instance
from snlab.serving.workload import Requests, workload

AGREE = 0.10


@pytest.fixture(scope="module")
def svc():
    return instance("llama3-8b", "dgx-h100", max_context=4096)


@pytest.fixture(scope="module")
def unbatched():
    """A prefill server that takes one prompt per pass: the M/G/1 queue."""
    return instance("llama3-8b", "dgx-h100", max_context=4096, max_sequences=1, max_step_tokens=1)


def _requests(rate, n, seed=3):
    return workload(rate, lengths="sharegpt-distserve", requests=n, seed=seed).sample()


def _tpot(run, r):
    many = r.output > 1
    return float(np.mean((run.last - run.first)[many] / (r.output[many] - 1)))


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.8])
def test_prefill_pool_mean_ttft_is_pollaczek_khinchine(unbatched, rho):
    probe = _requests(1.0, 20000)
    m = approx.moments(unbatched, probe)
    rate = rho / m["service_mean"]
    r = Requests(probe.arrival_s / rate, probe.prompt, probe.output)
    run = run_instance(unbatched, r, "prefill-only")
    closed = approx.prefill_pool(unbatched, rate, m)
    assert closed.applies
    assert float(np.mean(run.first - run.arrival)) == pytest.approx(closed.ttft_mean_s, rel=AGREE)


@pytest.mark.parametrize("rate", [2.0, 8.0, 24.0])
def test_decode_pool_tpot_is_littles_fixed_point(svc, rate):
    r = _requests(rate, 4000)
    run = run_instance(svc, r, "decode-only", first_token=r.arrival_s, transfer_s=np.zeros(len(r)))
    closed = approx.decode_pool(svc, rate, approx.moments(svc, r))
    assert closed.applies
    assert _tpot(run, r) == pytest.approx(closed.tpot_mean_s, rel=AGREE)
    assert float(np.mean(run.batches)) == pytest.approx(closed.decode_batch, rel=0.15)


@pytest.mark.parametrize("rate", [2.0, 8.0])
def test_prefill_first_colocated_tpot_and_ttft(svc, rate):
    r = _requests(rate, 4000)
    run = run_instance(svc, r, "prefill-first")
    closed = approx.colocated(svc, rate, approx.moments(svc, r), "prefill-first")
    assert closed.applies
    assert _tpot(run, r) == pytest.approx(closed.tpot_mean_s, rel=AGREE)
    assert float(np.mean(run.first - run.arrival)) == pytest.approx(closed.ttft_mean_s, rel=AGREE)


@pytest.mark.parametrize("rate", [2.0, 8.0])
def test_chunked_colocated_tpot(svc, rate):
    r = _requests(rate, 4000)
    run = run_instance(svc, r, "chunked")
    closed = approx.colocated(svc, rate, approx.moments(svc, r), "chunked")
    assert closed.applies
    assert _tpot(run, r) == pytest.approx(closed.tpot_mean_s, rel=AGREE)


def test_the_approximations_say_where_they_stop(svc, unbatched):
    """Past saturation there is no steady state: the closed forms say so instead of
    answering."""
    probe = _requests(1.0, 2000)
    m = approx.moments(unbatched, probe)
    over = approx.prefill_pool(unbatched, 1.2 / m["service_mean"], m)
    assert not over.applies and np.isinf(over.ttft_mean_s)
    assert not approx.decode_pool(svc, 1e4, approx.moments(svc, probe)).applies
