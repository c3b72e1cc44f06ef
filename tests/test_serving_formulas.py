"""The serving formulas against the numbers their sources print."""

import math

import numpy as np
import pytest

from snlab import model, sizing
from snlab.walls import serving as sv


def test_mtp_one_draft_at_70_percent_gives_1_7_tokens():
    """Zuo et al. 2025 (CloudMatrix384) Sec. 5: one MTP draft token at ~70% acceptance
    yields 1.7 tokens per decode step on average."""
    assert sv.speculative_tokens_per_step(draft_tokens=1, acceptance_rate=0.7) == pytest.approx(1.7)


@pytest.mark.parametrize("k, a, expected", [
    (0, 0.8, 1.0),            # no drafts: one token per step
    (4, 1.0, 5.0),            # every draft accepted: k + 1
    (4, 0.0, 1.0),            # none accepted: the target model's own token
    (3, 0.5, 1.875),          # 1 + 1/2 + 1/4 + 1/8
])
def test_speculative_expectation_limits(k, a, expected):
    """Leviathan et al. 2023 Eq. 1: E[tokens] = (1 - a^(k+1)) / (1 - a), a geometric sum."""
    with np.errstate(all="ignore"):   # numpy evaluates both branches of the a = 1 case
        assert sv.speculative_tokens_per_step(draft_tokens=k, acceptance_rate=a) == pytest.approx(expected)


def test_kv_cache_per_token_matches_the_primer_and_deepseek_v2():
    """A Llama-2/3-70B shape stores 327,680 bytes per token in 16 bits (PRIMER, Pope et
    al. 2022); DeepSeek's MLA stores (512 + 64) elements per layer (DeepSeek-V2 Table 1),
    61 layers in bf16: 70,272 bytes."""
    assert sizing.kv_cache_bytes_per_token(model("llama3-70b"), 2.0) == 327_680
    assert sizing.kv_cache_bytes_per_token(model("deepseek-v3"), 2.0) == 61 * 576 * 2


def test_absorbed_mla_attention_flops_per_key():
    """DeepSeek-V2 Sec. 2.1.3: with W_UK absorbed a score is a 576-long product (512 latent
    + 64 rotary) and the output a 512-long sum, per head: 2 x 128 x 1,088 FLOPs per key
    per layer."""
    f = sv.mla_absorbed_attention_flops(layers=1, heads=128, kv_lora_rank=512, qk_rope_head_dim=64, context_len=1)
    assert f == 2 * 128 * (512 + 64 + 512)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64, 1000])
def test_static_batch_waits_for_the_harmonic_number(n):
    """Expected maximum of n exponentials of mean 1 is H_n (David and Nagaraja 2003);
    the series used is accurate to 1/(120 n^4)."""
    exact = sum(1 / i for i in range(1, n + 1))
    approx = sv.static_steps_exponential(batch_sequences=n, mean_output_len=1.0)
    assert approx == pytest.approx(exact, abs=1 / (120 * n**4) + 1e-12)


def test_static_batch_uniform_lengths():
    """Maximum of n uniform draws on [0, 2 mu]: 2 mu n/(n+1) (order statistics)."""
    assert sv.static_steps_uniform(batch_sequences=1, mean_output_len=100.0) == pytest.approx(100.0)
    assert sv.static_steps_uniform(batch_sequences=99, mean_output_len=100.0) == pytest.approx(198.0)


def test_continuous_batching_beats_static_by_h_n_without_prefill():
    """Orca / vLLM: with no prefill cost, continuous over static = E[max]/mean."""
    n, mu, step = 64, 200.0, 0.03
    longest = sv.static_steps_exponential(batch_sequences=n, mean_output_len=mu)
    cont = sv.batching_throughput(batch_sequences=n, mean_output_len=mu, prefill_time=0.0, decode_steps=mu,
                                  step_time=step)
    stat = sv.batching_throughput(batch_sequences=n, mean_output_len=mu, prefill_time=0.0, decode_steps=longest,
                                  step_time=step)
    assert cont == pytest.approx(n / step)
    assert cont / stat == pytest.approx(sum(1 / i for i in range(1, n + 1)), rel=1e-6)


def test_expert_activation_small_and_large_batches():
    """A single token reaches k of E experts; thousands reach all of them."""
    assert sv.expert_activation(experts=256, experts_per_token=8, tokens=1) == pytest.approx(8 / 256)
    assert sv.expert_activation(experts=256, experts_per_token=8, tokens=10_000) == pytest.approx(1.0)


def test_domains_per_token():
    """One domain: always 1. Many domains: close to k (each expert on its own domain)."""
    assert sv.domains_per_token(outer_size=1, experts_per_token=8) == pytest.approx(1.0)
    assert sv.domains_per_token(outer_size=4, experts_per_token=8) == pytest.approx(4 * (1 - 0.75**8))
    assert 7.5 < sv.domains_per_token(outer_size=1000, experts_per_token=8) < 8


def test_direct_all_to_all_pays_each_latency_once():
    """One level: alpha_0 + alpha_1 + S_1/(eta beta); a far cheaper latency than the
    pairwise exchange's (n - 1) alpha at n = 256."""
    kw = dict(call_latency=10e-6, inner_latency=1.5e-6, inner_bandwidth=196e9, inner_efficiency=0.67,
              outer_latency=2e-6, outer_bandwidth=50e9, outer_efficiency=0.86)
    t = sv.direct_all_to_all_time(inner_bytes=7.3e6, outer_bytes=0.0, **kw)
    assert t == pytest.approx(10e-6 + 1.5e-6 + 7.3e6 / (0.67 * 196e9))
    both = sv.direct_all_to_all_time(inner_bytes=1e6, outer_bytes=4e6, **kw)
    assert both == pytest.approx(10e-6 + max(1.5e-6 + 1e6 / (0.67 * 196e9), 2e-6 + 4e6 / (0.86 * 50e9)))


def test_tiered_read_is_the_slower_stream():
    """FlexGen-style concurrent streams: HBM part and far part overlap."""
    far = sv.far_read_time(far_bytes=63e9, far_bandwidth=63e9, far_latency=1e-6, far_reads=80)
    assert far == pytest.approx(1.0 + 80e-6)
    t = sv.tiered_read_time(local_bytes=3e9, far_time=far, memory_bandwidth=3e12, memory_efficiency=1.0)
    assert t == pytest.approx(far)
    t = sv.tiered_read_time(local_bytes=6e12, far_time=far, memory_bandwidth=3e12, memory_efficiency=1.0)
    assert t == pytest.approx(2.0)


def test_max_sequences_1m_context_llama70b():
    """PRIMER: a 1M-token context of a 70B GQA model needs about 328 GB, so 8 x 54 GB of
    free HBM holds one such sequence, not two."""
    n = sv.max_sequences(capacity=8 * 54e9, context_len=1e6, kv_cache_memory=327_680)
    assert math.floor(n) == 1


def test_formulas_broadcast():
    with np.errstate(all="ignore"):
        out = sv.speculative_tokens_per_step(draft_tokens=np.array([0, 1, 2]),
                                             acceptance_rate=np.array([0.5, 1.0, 0.5]))
    assert out == pytest.approx([1.0, 2.0, 1.75])
