"""The training planner API: ``snlab.train``, ``snlab.sweep`` and ``snlab.search``.

Checks the public contract of issue 3: what goes in (preset names, preset objects,
TOML paths; plan fields; bad input), what comes out (result keys, units, JSON), the
utilisation definitions against the published equations, and that sweep and search
agree with ``train`` row by row. Validation against published runs and the
cluster-vs-supernode story live in test_validation_training.py and test_story.py.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import snlab
from snlab.training import plan as pl
from snlab import presets
from snlab.errors import SnlabError
from snlab.specs import Model, MoE

from conftest import gpt

#: the plan of the issue's "done means" command (Narayanan 2021 Table 1, 1T row)
PLAN_1T = dict(tp=8, pp=64, dp=6, micro_batch=1, global_batch=3072, recompute="full")

#: a grouped-query model whose heads admit a tp that neither divides nor is a
#: multiple of the key/value heads (48 heads, 8 kv heads, tp = 6)
GQA = Model(name="gqa-test", description="test GQA model", layers=8, hidden_size=3072, heads=48, kv_heads=8,
            head_dim=64, ffn_hidden_size=8192, vocab_size=32000, seq_len=4096, gated_mlp=True)

#: a small mixture-of-experts model (16 experts, top-2, one shared expert)
MOE = Model(name="moe-test", description="test MoE model", layers=16, hidden_size=2048, heads=16, kv_heads=16,
            head_dim=128, ffn_hidden_size=8192, vocab_size=32000, seq_len=2048, gated_mlp=True,
            moe=MoE(experts=16, experts_per_token=2, expert_ffn_hidden_size=1408, shared_experts=1,
                    dense_layers=1))

RESULT_KEYS = {"step_time_s", "mfu", "hfu", "model_tflops_per_device", "hardware_tflops_per_device",
               "tokens_per_s", "fits", "memory_bytes_per_device", "time_s"}
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations")
TIME_PARTS = ("compute", "recompute", "tp", "ep", "cp", "pp", "dp", "bubble", "optimizer", "offload")


def peak(system: str, precision: str = "bf16") -> float:
    return snlab.system(system).device.peak_flops[precision]


# --- inputs: names, objects, TOML paths -----------------------------------------------------

def test_names_objects_and_toml_paths_give_identical_results(tmp_path):
    model_path = tmp_path / "my-model.toml"
    system_path = tmp_path / "my-system.toml"
    model_path.write_text(presets.to_toml(snlab.model("megatron-1t")))
    system_path.write_text(presets.to_toml(snlab.system("dgx-a100")))
    by_name = snlab.train("megatron-1t", "dgx-a100", **PLAN_1T).to_dict()
    by_object = snlab.train(snlab.model("megatron-1t"), snlab.system("dgx-a100"), **PLAN_1T).to_dict()
    by_str_path = snlab.train(str(model_path), str(system_path), **PLAN_1T).to_dict()
    by_path = snlab.train(model_path, system_path, **PLAN_1T).to_dict()
    mixed = snlab.train("megatron-1t", system_path, **PLAN_1T).to_dict()
    assert by_name == by_object == by_str_path == by_path == mixed


def test_an_edited_toml_copy_is_used(tmp_path):
    """A TOML path is really read: a copy with the scale-out bandwidth edited to
    50 Gb/s gives what the preset gives with ``scale_out_bandwidth=6.25e9``."""
    text = presets.to_toml(snlab.system("dgx-a100"))
    head, sep, tail = text.partition("[scale_out]")
    assert sep
    lines = tail.split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith("bandwidth"))
    lines[i] = 'bandwidth = { value = 50, unit = "Gb/s", source = "test edit" }'
    path = tmp_path / "slow.toml"
    path.write_text(head + sep + "\n".join(lines))
    edited = snlab.train("megatron-1t", path, **PLAN_1T)
    override = snlab.train("megatron-1t", "dgx-a100", scale_out_bandwidth=50e9 / 8, **PLAN_1T)
    original = snlab.train("megatron-1t", "dgx-a100", **PLAN_1T)
    assert edited.to_dict() == override.to_dict()
    assert edited.step_time_s > original.step_time_s
    assert edited.time_s["pp"] > original.time_s["pp"]


# --- the result -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def result_1t():
    return snlab.train("megatron-1t", "dgx-a100", **PLAN_1T)


def test_to_dict_has_the_issue_keys_and_is_json(result_1t):
    d = result_1t.to_dict()
    assert RESULT_KEYS <= set(d)
    mem = d["memory_bytes_per_device"]
    assert set(MEMORY_PARTS) | {"total"} <= set(mem)
    assert set(TIME_PARTS) <= set(d["time_s"])
    assert set(d["time_s"]["exposed"]) >= {"tp", "ep", "cp", "pp", "dp"}
    text = json.dumps(d)                      # plain JSON, no numpy scalars
    back = json.loads(text)
    assert back == d
    assert isinstance(back["fits"], bool)
    for key in RESULT_KEYS - {"fits", "memory_bytes_per_device", "time_s"}:
        assert isinstance(back[key], float) and math.isfinite(back[key]) and back[key] > 0, key


def test_plan_is_echoed(result_1t):
    p = result_1t.to_dict()["plan"]
    assert (p["tp"], p["pp"], p["dp"], p["micro_batch"], p["global_batch"], p["recompute"]) == \
        (8, 64, 6, 1, 3072, "full")
    assert result_1t.devices == 8 * 64 * 6
    assert result_1t.to_dict()["devices"] == 3072
    # sequence parallelism defaults to on when tp > 1, off when tp = 1
    assert p["sequence_parallel"] is True
    small = snlab.train("megatron-1.7b", "dgx-a100", tp=1, dp=8, global_batch=64)
    assert small.plan["sequence_parallel"] is False


def test_memory_total_is_the_sum_of_its_parts(result_1t):
    mem = result_1t.memory_bytes_per_device
    assert mem["total"] == pytest.approx(sum(mem[p] for p in MEMORY_PARTS), rel=1e-12)
    assert all(mem[p] >= 0 for p in MEMORY_PARTS)
    assert result_1t.fits == (mem["total"] <= snlab.system("dgx-a100").device.hbm_capacity)


def test_weights_per_device_follow_the_parameter_count():
    """pp = 1, tp = 1: every device holds all the bf16 weights (2 bytes each) and, at
    ZeRO 0, all the fp32 gradients (4 bytes) and the 12-byte Adam state."""
    model = snlab.model("megatron-1.7b")
    r = snlab.train(model, "dgx-a100", tp=1, pp=1, dp=8, global_batch=64, zero=0, grad_dtype="fp32")
    n = model.params
    mem = r.memory_bytes_per_device
    assert mem["weights"] == pytest.approx(2 * n, rel=1e-3)
    assert mem["grads"] == pytest.approx(4 * n, rel=1e-3)
    assert mem["optimizer"] == pytest.approx(12 * n, rel=1e-3)
    # ZeRO 1 shards the optimizer over dp = 8
    r1 = snlab.train(model, "dgx-a100", tp=1, pp=1, dp=8, global_batch=64, zero=1, grad_dtype="fp32")
    assert r1.memory_bytes_per_device["optimizer"] == pytest.approx(12 * n / 8, rel=1e-3)


def test_throughput_and_time_to_train(result_1t):
    r = result_1t
    tokens_per_step = 3072 * 2048
    assert r.tokens_per_s == pytest.approx(tokens_per_step / r.step_time_s, rel=1e-12)
    assert r.time_to_train_s(450e9) == pytest.approx(450e9 / r.tokens_per_s, rel=1e-12)
    # training on 10 steps' worth of tokens takes 10 steps
    assert r.time_to_train_s(10 * tokens_per_step) == pytest.approx(10 * r.step_time_s, rel=1e-12)


def test_compute_includes_recompute_and_exposed_is_at_most_total(result_1t):
    t = result_1t.time_s
    assert t["recompute"] > 0 and t["compute"] > t["recompute"]
    for cls in ("tp", "ep", "cp", "pp", "dp"):
        assert 0 <= t["exposed"][cls] <= t[cls] * (1 + 1e-12), cls
    assert t["exposed_communication"] == pytest.approx(sum(t["exposed"][c] for c in ("tp", "ep", "cp", "pp", "dp")),
                                                       rel=1e-12)


def korthikanti_eq7(B, s, L, h, V):
    """Model FLOPs per iteration, Korthikanti et al. 2022 Eq. 7 (no recomputation)."""
    return 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def causal_eq7(B, s, L, h, V):
    """Eq. 7 with half the attention scores: the FLOPs a causal model needs (snlab's MFU)."""
    return korthikanti_eq7(B, s, L, h, V) - 72 * B * s * L * h**2 * s / (6 * h) / 2


def narayanan_eq3(B, s, L, h, V):
    """FLOPs per iteration with full activation recomputation, Narayanan et al. 2021 Eq. 3."""
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * h * L))


GPT_CASES = [  # (layers, hidden, heads, tp, pp, dp, micro_batch, global_batch)
    (24, 2304, 24, 1, 1, 8, 4, 512),
    (48, 6144, 64, 8, 1, 4, 1, 64),
    (96, 12288, 96, 8, 8, 2, 1, 64),
    (128, 25600, 160, 8, 64, 6, 1, 3072),
]


@pytest.mark.parametrize("layers, hidden, heads, tp, pp, dp, b, B", GPT_CASES)
def test_mfu_is_korthikanti_eq7_over_time_devices_peak(layers, hidden, heads, tp, pp, dp, b, B):
    model = gpt(layers, hidden, heads)
    # Eq. 7 counts the full s x s scores, as Megatron-LM's kernels of the time computed them
    r = snlab.train(model, "dgx-a100", tp=tp, pp=pp, dp=dp, micro_batch=b, global_batch=B, recompute="full",
                    flash_attention=False)
    palm = korthikanti_eq7(B, model.seq_len, layers, hidden, model.vocab_size)
    flops = causal_eq7(B, model.seq_len, layers, hidden, model.vocab_size)
    n = tp * pp * dp
    assert r.devices == n
    assert r.mfu == pytest.approx(flops / (r.step_time_s * n * peak("dgx-a100")), rel=1e-9)
    assert r.model_tflops_per_device == pytest.approx(flops / r.step_time_s / n / 1e12, rel=1e-9)
    assert r.palm_tflops_per_device == pytest.approx(palm / r.step_time_s / n / 1e12, rel=1e-9)


@pytest.mark.parametrize("layers, hidden, heads, tp, pp, dp, b, B", GPT_CASES)
def test_hfu_over_mfu_with_full_recomputation_is_eq3_over_eq7(layers, hidden, heads, tp, pp, dp, b, B):
    model = gpt(layers, hidden, heads)
    r = snlab.train(model, "dgx-a100", tp=tp, pp=pp, dp=dp, micro_batch=b, global_batch=B, recompute="full",
                    flash_attention=False)
    s, V = model.seq_len, model.vocab_size
    expected = narayanan_eq3(B, s, layers, hidden, V) / korthikanti_eq7(B, s, layers, hidden, V)
    assert 1.25 < expected < 4 / 3          # below 4/3: the logits are not recomputed
    # materialised scores: the hardware runs the full square, as Eq. 3 and Eq. 7 count it
    assert r.hardware_tflops_per_device / r.palm_tflops_per_device == pytest.approx(expected, rel=1e-9)
    assert r.hfu / r.mfu > expected


def test_without_recomputation_the_hardware_runs_the_full_square_of_scores():
    """Scores materialised and nothing recomputed: the hardware runs the model FLOPs plus
    the masked half of the scores, which is exactly PaLM's count."""
    r = snlab.train(gpt(24, 2304, 24), "dgx-a100", tp=1, dp=8, micro_batch=4, global_batch=512,
                    recompute="none", flash_attention=False)
    assert r.hardware_tflops_per_device == pytest.approx(r.palm_tflops_per_device, rel=1e-12)
    assert r.mfu < r.hfu


def test_selective_recomputation_costs_between_none_and_full():
    model = gpt(48, 6144, 64)
    plan = dict(tp=8, dp=4, micro_batch=1, global_batch=64, flash_attention=False)
    ratios = {rc: snlab.train(model, "dgx-a100", recompute=rc, **plan) for rc in ("none", "selective", "full")}
    def executed_over_palm(r):
        return r.hardware_tflops_per_device / r.palm_tflops_per_device

    assert executed_over_palm(ratios["none"]) == pytest.approx(1.0, rel=1e-12)
    sel, full = executed_over_palm(ratios["selective"]), executed_over_palm(ratios["full"])
    assert 1.0 < sel < full
    # MFU counts no recomputation: more recomputation, same model FLOPs, more time
    assert ratios["none"].step_time_s < ratios["selective"].step_time_s < ratios["full"].step_time_s


def test_fp8_precision_divides_by_the_fp8_peak():
    model = gpt(96, 12288, 96)
    plan = dict(tp=8, pp=8, dp=2, micro_batch=1, global_batch=64, recompute="full", flash_attention=False)
    r = snlab.train(model, "dgx-h100", precision="fp8", **plan)
    flops = causal_eq7(64, model.seq_len, 96, 12288, model.vocab_size)
    assert r.mfu == pytest.approx(flops / (r.step_time_s * 128 * peak("dgx-h100", "fp8")), rel=1e-9)
    bf16 = snlab.train(model, "dgx-h100", precision="bf16", **plan)
    assert r.step_time_s < bf16.step_time_s          # twice the peak: faster matmuls
    with pytest.raises(SnlabError, match="fp8"):
        snlab.train(model, "dgx-a100", precision="fp8", **plan)   # the A100 has no FP8


def test_str_and_html(result_1t):
    text = str(result_1t)
    for needle in ("megatron-1t", "dgx-a100", "MFU", "step time", "tp=8", "pp=64", "dp=6"):
        assert needle in text
    html = result_1t._repr_html_()
    assert html.lstrip().startswith("<table") and html.rstrip().endswith("</table>")
    assert "megatron-1t" in html and "MFU" in html and "<script" not in html


def test_devices_keyword_accepts_the_right_count():
    assert snlab.train("megatron-1t", "dgx-a100", devices=3072, **PLAN_1T).devices == 3072


# --- bad input: each rule ----------------------------------------------------------------

RULE_CASES = [  # (id, model, plan, field, phrase of the rule's message)
    ("tp-heads", "megatron-1t", dict(PLAN_1T, tp=3, dp=16), "tp", "attention heads"),
    ("tp-kv-heads", GQA, dict(tp=6, dp=1, global_batch=8), "tp", "key/value heads"),
    ("pp-layers", "megatron-1t", dict(PLAN_1T, pp=256, dp=1), "pp", "number of layers"),
    ("interleave-pp1", "megatron-1t", dict(PLAN_1T, pp=1, interleave=2), "interleave", "pp > 1"),
    ("interleave-layers", "megatron-1t", dict(PLAN_1T, interleave=3), "interleave", "pp x interleave"),
    ("interleave-groups", "megatron-1t", dict(PLAN_1T, pp=16, dp=24, global_batch=24 * 24, interleave=2),
     "interleave", "groups of pp"),
    ("stage-layers", "megatron-1t", dict(PLAN_1T, first_stage_layers=100), "first_stage_layers", "every other stage"),
    ("cp-seq", "megatron-1t", dict(PLAN_1T, cp=3), "cp", "sequence length"),
    ("ep-dense", "megatron-1t", dict(PLAN_1T, ep=2), "ep", "experts"),
    ("ep-experts", MOE, dict(tp=1, dp=6, ep=3, global_batch=48), "ep", "experts"),
    ("global-batch", "megatron-1t", dict(PLAN_1T, global_batch=3070), "global_batch", "micro_batch x dp"),
    ("global-batch-mb", "megatron-1t", dict(PLAN_1T, micro_batch=5), "global_batch", "micro_batch x dp"),
    ("zero3-pp", "megatron-1t", dict(PLAN_1T, zero=3), "zero", "ZeRO stage 3"),
    ("devices", "megatron-1t", dict(PLAN_1T, devices=1024), "devices", "number of devices"),
    ("degrees", "megatron-1t", dict(PLAN_1T, micro_batch=0), None, "whole number >= 1"),
]


def _train_error(model, plan) -> SnlabError:
    with pytest.raises(SnlabError) as info:
        snlab.train(model, "dgx-a100", **plan)
    return info.value


@pytest.mark.parametrize("model, plan, field, phrase", [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_each_rule_raises_naming_its_field(model, plan, field, phrase):
    err = _train_error(model, plan)
    text = str(err)
    assert "\n" not in text
    assert phrase in text
    if field is not None:
        assert err.field == field
        assert text.startswith(f"{field}:")


def test_every_rule_has_a_case_above():
    messages = [str(_train_error(model, plan)) for _, model, plan, _, _ in RULE_CASES]
    for rule in pl.RULES:
        if rule.field == "degrees":   # reported under the degree's own name: see the test below
            continue
        assert any(rule.message in m for m in messages), f"no test triggers rule {rule}"


def test_the_error_shows_the_offending_values():
    err = _train_error("megatron-1t", dict(PLAN_1T, tp=3, dp=16))
    assert "tp=3" in str(err) and "160" in str(err)          # the degree and the heads
    err = _train_error("megatron-1t", dict(PLAN_1T, global_batch=3070))
    assert "3070" in str(err)
    err = _train_error("megatron-1t", dict(PLAN_1T, devices=1024))
    assert "3072" in str(err)                                 # what the degrees multiply to


BAD_VALUES = [  # (plan change, field, phrase of the allowed values)
    (dict(tp=0), "tp", "whole number >= 1"),
    (dict(tp=-1), "tp", "whole number >= 1"),
    (dict(micro_batch=float("nan")), "micro_batch", "whole number"),
    (dict(tp=float("inf")), "tp", "whole number"),
    (dict(recompute="sometimes"), "recompute", "none, selective, full"),
    (dict(overlap="dp=2"), "overlap", "[0, 1]"),
    (dict(overlap="often"), "overlap", "none, gradients, standard, all"),
    (dict(overlap="dp=1,xx=0.5"), "overlap", "dp, zero, tp, pp, ep, cp, offload"),
    (dict(offload="disk"), "offload", "none, optimizer, activations, both"),
    (dict(grad_dtype="fp8"), "grad_dtype", "bf16, fp32"),
    (dict(sequence_parallel="yes"), "sequence_parallel", "true or false"),
    (dict(tp=True), "tp", "whole number"),
    (dict(tpp=2), "tpp", "tp, pp, dp"),
    (dict(tp=[8, 4]), "tp", "sweep"),
    (dict(tp=(8,)), "tp", "sweep"),
    (dict(tp=np.array([8])), "tp", "sweep"),
]


@pytest.mark.parametrize("change, field, allowed", BAD_VALUES, ids=[f"{k}={v!r}" for c, _, _ in BAD_VALUES
                                                                    for k, v in c.items()])
def test_bad_values_name_the_field_and_the_allowed_values(change, field, allowed):
    err = _train_error("megatron-1t", dict(PLAN_1T, **change))
    text = str(err)
    assert err.field.split(".")[0] == field
    assert text.startswith(err.field + ":")
    assert allowed in text
    assert "\n" not in text


NOT_NAMED = [  # a non-whole or sub-1 value reported under the generic "degrees" rule
    dict(tp=2.5), dict(dp=2.5), dict(pp=2.5), dict(dp=0), dict(micro_batch=0),
]


@pytest.mark.parametrize("change", NOT_NAMED, ids=[f"{k}={v}" for c in NOT_NAMED for k, v in c.items()])
def test_non_whole_degree_errors_name_the_degree(change):
    (field, value), = change.items()
    err = _train_error("megatron-1t", dict(PLAN_1T, **change))
    assert err.field == field, str(err)


SILENTLY_ACCEPTED = [  # (plan change, field): out of the documented range, yet no error
    (dict(zero=4), "zero"),
    (dict(zero=-1), "zero"),
    (dict(zero=1.5), "zero"),
    (dict(seq_len=0), "seq_len"),
    (dict(seq_len=-2048), "seq_len"),
    (dict(seq_len=2048.5), "seq_len"),
    (dict(optimizer_bytes=-1), "optimizer_bytes"),
]


@pytest.mark.parametrize("change, field", SILENTLY_ACCEPTED,
                         ids=[f"{k}={v}" for c, _ in SILENTLY_ACCEPTED for k, v in c.items()])
def test_out_of_range_plan_values_are_rejected(change, field):
    err = _train_error("megatron-1t", dict(PLAN_1T, **change))
    assert err.field == field


UNREAD = [  # (model, plan, field, phrase): a field given where the plan never reads it
    ("llama3-8b", dict(dp=8, expert_imbalance=1.3), "expert_imbalance", "no routed experts"),
    ("llama3-8b", dict(dp=8, capacity_factor=1.25), "capacity_factor", "no routed experts"),
    ("llama3-8b", dict(dp=8, ep_dispatcher="alltoall"), "ep_dispatcher", "no routed experts"),
    ("mixtral-8x7b", dict(tp=8, expert_imbalance=1.3), "expert_imbalance", "ep 1"),
    ("mixtral-8x7b", dict(tp=8, capacity_factor=1.25), "capacity_factor", "ep 1"),
    ("llama3-8b", dict(dp=8, expert_tp=1), "expert_tp", "no routed experts"),
    ("llama3-8b", dict(dp=8, offload_layers=2), "offload_layers", "offload 'none'"),
    ("llama3-8b", dict(dp=8, offload="optimizer", offload_layers=2), "offload_layers", "offload 'optimizer'"),
    ("llama3-8b", dict(dp=8, chunk_overhead_s=1e-3), "chunk_overhead_s", "interleave 1"),
    ("llama3-8b", dict(dp=8, recompute="mla_up_proj"), "recompute", "'mla_up_proj' for llama3-8b, which has none"),
    ("llama3-8b", dict(dp=8, recompute="layernorm,moe_act"), "recompute", "'moe_act'"),
    ("mixtral-8x7b", dict(tp=8, recompute="layernorm,shared_experts"), "recompute", "'shared_experts'"),
]


@pytest.mark.parametrize("model, plan, field, phrase", UNREAD, ids=[f"{m}-{f}-{i}" for i, (m, _, f, _) in
                                                                     enumerate(UNREAD)])
def test_a_field_the_plan_never_reads_is_refused(model, plan, field, phrase):
    """Away from its default where nothing reads it, a field is an error naming it; at
    its default it passes (where it is read, the next test shows it changes the result)."""
    base = dict(global_batch=64, **plan)
    err = _train_error(model, base)
    assert err.field == field and phrase in str(err) and "allowed" in str(err)
    snlab.train(model, "dgx-h100", **{**base, field: pl.DEFAULTS[field]})


def test_a_sweep_refuses_a_plan_field_no_point_of_it_reads():
    """As train, a sweep refuses a field read at no point of its grid, and keeps it when
    some point reads it (an ep above 1, a MoE model in its list, interleave above 1)."""
    base = dict(dp=[8], global_batch=64)
    for model, kw, field in [("llama3-8b", dict(capacity_factor=[1.0, 1.25]), "capacity_factor"),
                             ("mixtral-8x7b", dict(tp=8, dp=1, ep=[1], expert_imbalance=[1.2]), "expert_imbalance"),
                             ("llama3-8b", dict(interleave=[1], chunk_overhead_s=[1e-3]), "chunk_overhead_s"),
                             ("llama3-8b", dict(offload=["none", "optimizer"], offload_layers=2), "offload_layers")]:
        with pytest.raises(SnlabError) as info:
            snlab.sweep(model, "dgx-h100", **{**base, **kw})
        assert info.value.field == field and "allowed" in str(info.value)
    df = snlab.sweep(["llama3-8b", "mixtral-8x7b"], "dgx-h100", tp=1, dp=8, ep=[1, 8], global_batch=64,
                     expert_imbalance=1.2)
    assert set(df.model) == {"llama3-8b", "mixtral-8x7b"}
    assert len(snlab.sweep("llama3-8b", "dgx-h100", dp=8, global_batch=64, offload=["none", "activations"],
                           offload_layers=2)) == 2


def test_the_plan_fields_pass_where_they_are_read():
    moe = dict(tp=1, dp=8, ep=8, global_batch=64)
    snlab.train("moonlight-16b-a3b", "dgx-h100", recompute="layernorm,mla_up_proj,moe_act,shared_experts", **moe)
    even = snlab.train("mixtral-8x7b", "dgx-h100", expert_imbalance=1.0, **moe).step_time_s
    assert snlab.train("mixtral-8x7b", "dgx-h100", expert_imbalance=1.5, **moe).step_time_s > even
    snlab.train("mixtral-8x7b", "dgx-h100", capacity_factor=1.25, ep_dispatcher="alltoall", **moe)
    dense = dict(tp=1, dp=8, global_batch=64)
    kept = snlab.train("llama3-8b", "dgx-h100", offload="activations", **dense).memory_bytes_per_device
    fewer = snlab.train("llama3-8b", "dgx-h100", offload="activations", offload_layers=8,
                        **dense).memory_bytes_per_device
    assert fewer["offloaded"] < kept["offloaded"] and fewer["activations"] > kept["activations"]
    staged = dict(tp=8, pp=4, dp=1, interleave=2, global_batch=64)
    quick = snlab.train("llama3-70b", "dgx-h100", chunk_overhead_s=0.0, **staged).step_time_s
    assert snlab.train("llama3-70b", "dgx-h100", chunk_overhead_s=1e-3, **staged).step_time_s > quick


def test_non_whole_degrees_are_never_accepted():
    """Degrees that happen to divide evenly as floats (pp x 2.5 = 20 divides 80 layers;
    cp = 2.5 divides seq_len = 2000) must still be rejected."""
    for model, plan in (("megatron-145.6b", dict(tp=8, pp=8, dp=1, interleave=2.5, global_batch=64)),
                        ("megatron-145.6b", dict(tp=8, pp=1, dp=2, cp=2.5, seq_len=2000, global_batch=64)),
                        (MOE, dict(tp=1, dp=8, ep=1.6, global_batch=64))):
        with pytest.raises(SnlabError):
            snlab.train(model, "dgx-a100", **plan)


@pytest.mark.parametrize("kind, arg", [("model", 0), ("system", 1)])
def test_unknown_preset_names_list_the_valid_ones(kind, arg):
    args = ["megatron-1t", "dgx-a100"]
    args[arg] = "no-such-preset"
    with pytest.raises(SnlabError) as info:
        snlab.train(*args, **PLAN_1T)
    text = str(info.value)
    assert "no-such-preset" in text
    for name in presets.names(kind):
        assert name in text


def test_missing_global_batch_is_an_error():
    with pytest.raises(SnlabError, match="global_batch"):
        snlab.train("megatron-1t", "dgx-a100", tp=8, pp=64, dp=6)


def test_a_missing_toml_file_is_an_error(tmp_path):
    with pytest.raises(SnlabError):
        snlab.train("megatron-1t", tmp_path / "nope.toml", **PLAN_1T)


# --- sweep ----------------------------------------------------------------------------

SWEEP_AXES = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], micro_batch=[1, 2], recompute=["none", "selective", "full"],
                  zero=[0, 1, 3])
KEY = ["tp", "pp", "micro_batch", "recompute", "zero"]


@pytest.fixture(scope="module")
def grid():
    return snlab.sweep("megatron-7.5b", "dgx-a100", dp=2, global_batch=64, **SWEEP_AXES)


def test_sweep_is_the_cartesian_product(grid):
    expected = set(itertools.product(*SWEEP_AXES.values()))
    assert len(grid) == len(expected) == 4 * 3 * 2 * 3 * 3
    got = [tuple(row) for row in grid[KEY].astype(object).itertuples(index=False)]
    got = [(int(t), int(p), int(b), str(r), int(z)) for t, p, b, r, z in got]
    assert len(set(got)) == len(got)
    assert set(got) == expected
    assert (grid["dp"] == 2).all() and (grid["global_batch"] == 64).all()
    assert (grid["model"] == "megatron-7.5b").all() and (grid["system"] == "dgx-a100").all()


def test_sweep_columns_carry_units(grid):
    for col in ("step_time_s", "memory_total_bytes", "tokens_per_s", "model_tflops_per_device",
                "hardware_tflops_per_device", "mfu", "hfu", "fits", "valid", "reason"):
        assert col in grid.columns, col
    for part in MEMORY_PARTS:
        assert f"memory_{part}_bytes" in grid.columns
    for col in grid.columns:
        if col.startswith(("time_", "exposed_")):
            assert col.endswith("_s"), col
        if col.startswith("memory_"):
            assert col.endswith("_bytes"), col


def test_sweep_flags_broken_rules_without_raising(grid):
    bad = grid[~grid["valid"]]
    assert len(bad) == 4 * 3 * 2 * 3 * 1 - 4 * 1 * 2 * 3   # ZeRO 3 with pp > 1: tp x pp(2,4) x b x r
    assert (bad["zero"] == 3).all() and (bad["pp"] > 1).all()
    zero_rule = next(r for r in pl.RULES if r.field == "zero")
    assert (bad["reason"] == zero_rule.message).all()
    for col in ("step_time_s", "mfu", "memory_total_bytes", "tokens_per_s"):
        assert bad[col].isna().all(), col
    assert not bad["fits"].any()
    good = grid[grid["valid"]]
    assert good["step_time_s"].notna().all() and (good["step_time_s"] > 0).all()


def test_sweep_reason_matches_the_error_train_raises():
    df = snlab.sweep("megatron-1t", "dgx-a100", devices=3072, tp=[3, 8], pp=[64, 256], dp=[6, 12],
                     micro_batch=1, global_batch=[3072, 3070], interleave=[1, 3], zero=[1, 3])
    assert len(df) == 2 ** 6
    reasons = set(df.loc[~df["valid"], "reason"])
    assert len(reasons) >= 5                    # tp, pp, interleave, global batch, zero, devices
    for _, row in df[~df["valid"]].iterrows():
        plan = dict(tp=int(row.tp), pp=int(row.pp), dp=int(row.dp), micro_batch=1, interleave=int(row.interleave),
                    global_batch=int(row.global_batch), zero=int(row.zero))
        err = _train_error("megatron-1t", dict(plan, devices=3072))
        assert row.reason in str(err)
    ok = df[df["valid"]]
    assert len(ok) >= 1 and ((ok.tp * ok.pp * ok.dp * ok.cp) == 3072).all()


def test_sweep_flags_plans_that_do_not_fit(grid):
    capacity = snlab.system("dgx-a100").device.hbm_capacity
    big = snlab.sweep("megatron-1t", "dgx-a100", tp=8, pp=[16, 64], dp=6, global_batch=3072,
                      recompute=["none", "full"], zero=[0, 1])
    assert big["valid"].all()
    over = big["memory_total_bytes"] > capacity
    assert over.any() and (~over).any()          # the grid straddles the capacity
    assert (big.loc[over, "fits"] == False).all()  # noqa: E712
    assert (big.loc[over, "reason"] == "does not fit in device memory").all()
    assert (big.loc[~over, "fits"]).all() and (big.loc[~over, "reason"] == "ok").all()
    # outputs are still given for plans that do not fit, so one can see by how much
    assert big.loc[over, "step_time_s"].notna().all()


COMPARED = ["step_time_s", "mfu", "hfu", "memory_total_bytes", "tokens_per_s", "time_compute_s", "exposed_comm_s"]


def _plan_of(row) -> dict:
    return dict(tp=int(row.tp), pp=int(row.pp), dp=int(row.dp), ep=int(row.ep), cp=int(row.cp),
                micro_batch=int(row.micro_batch), global_batch=int(row.global_batch), zero=int(row.zero),
                recompute=str(row.recompute), interleave=int(row.interleave),
                sequence_parallel=bool(row.sequence_parallel), offload=str(row.offload))


def test_sweep_rows_equal_train(grid):
    good = grid[grid["valid"]]
    sample = good.iloc[np.linspace(0, len(good) - 1, 8).astype(int)]
    for _, row in sample.iterrows():
        r = snlab.train("megatron-7.5b", "dgx-a100", **_plan_of(row)).to_dict()
        flat = dict(r, memory_total_bytes=r["memory_bytes_per_device"]["total"],
                    time_compute_s=r["time_s"]["compute"], exposed_comm_s=r["time_s"]["exposed_communication"])
        for col in COMPARED:
            assert row[col] == pytest.approx(flat[col], rel=1e-9), (col, _plan_of(row))
        assert bool(row.fits) == r["fits"]


def test_sweep_rows_equal_train_for_moe_overlap_and_offload():
    df = snlab.sweep(MOE, "cloudmatrix384", tp=[1, 2], dp=8, ep=[1, 4, 8], cp=[1, 2], micro_batch=[1, 4],
                     global_batch=64, overlap=["none", "all"], offload=["none", "both"])
    assert len(df) == 2 * 3 * 2 * 2 * 2 * 2
    assert df["valid"].all()
    for _, row in df.iloc[::11].iterrows():
        plan = dict(_plan_of(row), overlap=str(row.overlap))
        r = snlab.train(MOE, "cloudmatrix384", **plan)
        assert row.step_time_s == pytest.approx(r.step_time_s, rel=1e-9), plan
        assert row.memory_total_bytes == pytest.approx(r.memory_bytes_per_device["total"], rel=1e-9), plan
        assert row.mfu == pytest.approx(r.mfu, rel=1e-9), plan


BANDWIDTHS = [12.5e9, 25e9, 50e9]          # 100, 200, 400 Gb/s in bytes/s


def test_sweeping_a_system_field_matches_train_with_it():
    plan = dict(tp=8, pp=4, dp=4, global_batch=256, overlap="none")
    df = snlab.sweep("megatron-39.1b", "dgx-a100", scale_out_bandwidth=BANDWIDTHS, **plan)
    assert len(df) == 3
    expected = [snlab.train("megatron-39.1b", "dgx-a100", scale_out_bandwidth=b, **plan).step_time_s
                for b in BANDWIDTHS]
    assert len(set(expected)) == 3                                  # the axis matters here
    assert sorted(df["step_time_s"]) == pytest.approx(sorted(expected), rel=1e-12)
    # and differs from the preset's own 200 Gb/s only where the bandwidth differs
    own = snlab.train("megatron-39.1b", "dgx-a100", **plan).step_time_s
    assert own == pytest.approx(expected[1], rel=1e-12)


def test_system_fields_accept_quantity_strings():
    plan = dict(tp=8, pp=4, dp=4, global_batch=256, overlap="none")
    si = snlab.sweep("megatron-39.1b", "dgx-a100", scale_out_bandwidth=BANDWIDTHS, **plan)
    text = snlab.sweep("megatron-39.1b", "dgx-a100", scale_out_bandwidth=["100 Gb/s", "200 Gb/s", "400 Gb/s"], **plan)
    assert list(text["step_time_s"]) == pytest.approx(list(si["step_time_s"]), rel=1e-12)
    one = snlab.train("megatron-39.1b", "dgx-a100", scale_out_bandwidth="400 Gb/s", **plan)
    assert one.step_time_s == pytest.approx(min(si["step_time_s"]), rel=1e-12)
    latency = snlab.train("megatron-39.1b", "dgx-a100", scale_out_latency="20 us", **plan)
    assert latency.step_time_s > snlab.train("megatron-39.1b", "dgx-a100", **plan).step_time_s


def test_a_swept_system_field_has_a_column():
    df = snlab.sweep("megatron-39.1b", "dgx-a100", tp=8, pp=4, dp=4, global_batch=256,
                     scale_out_bandwidth=BANDWIDTHS, grad_dtype=["bf16", "fp32"])
    col = [c for c in df.columns if c.startswith("scale_out_bandwidth")]
    assert col, "no scale_out_bandwidth column"
    assert sorted(set(df[col[0]])) == pytest.approx(BANDWIDTHS)
    assert any(c.startswith("grad") for c in df.columns)


@pytest.mark.parametrize("field", ["hbm_capacity", "memory_reserve", "allocator_efficiency"])
def test_a_memory_field_sweeps_into_fits_and_not_the_step(field):
    """HBM capacity, its reserve and the allocator change what fits, not the step time:
    the sweep still has one row per value, each what train() says."""
    values = {"hbm_capacity": [20e9, 40e9, 80e9], "memory_reserve": [50e9, 20e9, 1e9],
              "allocator_efficiency": [0.3, 0.6, 0.95]}[field]
    plan = dict(tp=8, pp=1, dp=1, global_batch=8)
    df = snlab.sweep("llama3-8b", "dgx-h100", **{field: values}, **plan)
    assert list(df[field]) == pytest.approx(values)
    assert df["step_time_s"].nunique() == 1
    usable = df["memory_usable_bytes"].to_numpy()
    assert list(usable) == sorted(usable) and usable[0] < usable[-1]
    assert list(df["fits"]) == sorted(df["fits"])            # more usable memory never stops a fit
    for value, row in zip(values, df.itertuples()):
        one = snlab.train("llama3-8b", "dgx-h100", **{field: value}, **plan)
        assert (one.fits, one.memory_bytes_per_device["usable"]) == (row.fits, pytest.approx(row.memory_usable_bytes))


def test_frames_can_be_edited_like_any_dataframe():
    sweep = snlab.sweep("llama3-8b", "dgx-h100", tp=[4, 8], global_batch=8, hbm_capacity=[40e9, 80e9])
    search = snlab.search("llama3-8b", "dgx-h100", devices=16, global_batch=16, top=3)
    serving = snlab.serve_sweep("llama3-8b", "dgx-h100", tp=8, batch=[1, 2], prompt_len=1000, output_len=10)
    for frame, column in ((sweep, "step_time_s"), (sweep, "tp"), (search, "mfu"), (serving, "tpot_s")):
        frame.loc[frame.index[0], column] = 1
        frame[column] = frame[column] * 2
        assert frame[column].iloc[0] == 2


@pytest.mark.parametrize("axes, field", [
    (dict(scale_out_bandwidth=[25e9, -1.0]), "scale_out_bandwidth"),
    (dict(scale_out_bandwidth=["400 furlongs"]), "scale_out_bandwidth"),
    (dict(scale_out_bandwidth=[]), "scale_out_bandwidth"),
    (dict(recompute=["full", "sometimes"]), "recompute"),
    (dict(tp=[8, float("nan")]), "tp"),
    (dict(overlap_dp=[0.5, 1.5]), "overlap_dp"),
    (dict(bogus=[1, 2]), "bogus"),
])
def test_sweep_raises_on_values_that_are_not_plans(axes, field):
    """Malformed values (wrong type, unit, range) raise; only rule-breaking plans are flagged."""
    with pytest.raises(SnlabError) as info:
        snlab.sweep("megatron-1t", "dgx-a100", **dict(PLAN_1T, **axes))
    assert str(info.value).startswith(field)


def test_lists_of_models_and_systems_concatenate():
    models = ["megatron-1.7b", "megatron-7.5b"]
    systems = ["dgx-a100", "cloudmatrix384", "pcie-ethernet-a100"]
    df = snlab.sweep(models, systems, tp=[1, 2], dp=4, micro_batch=[1, 2], global_batch=64)
    assert len(df) == 2 * 3 * 2 * 2
    counts = df.groupby(["model", "system"]).size()
    assert len(counts) == 6 and (counts == 4).all()
    for (model, system), sub in df.groupby(["model", "system"]):
        row = sub.iloc[-1]
        r = snlab.train(model, system, **_plan_of(row))
        assert row.step_time_s == pytest.approx(r.step_time_s, rel=1e-9)


def test_sweep_takes_numpy_arrays_and_ranges():
    a = snlab.sweep("megatron-7.5b", "dgx-a100", tp=np.array([1, 2, 4]), dp=2, micro_batch=range(1, 3),
                    global_batch=64)
    b = snlab.sweep("megatron-7.5b", "dgx-a100", tp=[1, 2, 4], dp=2, micro_batch=[1, 2], global_batch=64)
    assert len(a) == 6
    assert list(a["step_time_s"]) == pytest.approx(list(b["step_time_s"]), rel=1e-12)


# --- search ---------------------------------------------------------------------------

def _divisors(n):
    return [i for i in range(1, n + 1) if n % i == 0]


def _check_search_rows(df, devices, global_batch):
    assert len(df) >= 1
    assert df["fits"].all() and df["valid"].all()
    assert ((df.tp * df.pp * df.dp * df.cp) == devices).all()
    assert (global_batch % (df.micro_batch * df.dp) == 0).all()
    assert (df["global_batch"] == global_batch).all()
    times = list(df["step_time_s"])
    assert times == sorted(times)


@pytest.fixture(scope="module")
def search_22b():
    return snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512)


def test_search_returns_fitting_valid_plans_fastest_first(search_22b):
    _check_search_rows(search_22b, 64, 512)
    assert len(search_22b) == 10                                  # the default top
    plans = [tuple(_plan_of(r).values()) for _, r in search_22b.iterrows()]
    assert len(set(plans)) == len(plans)                          # no duplicates


def test_search_rows_are_what_train_gives(search_22b):
    for _, row in search_22b.head(4).iterrows():
        r = snlab.train("megatron-22b", "pcie-ethernet-a100", devices=64, **_plan_of(row))
        assert r.fits
        assert row.step_time_s == pytest.approx(r.step_time_s, rel=1e-9)
        assert row.memory_total_bytes == pytest.approx(r.memory_bytes_per_device["total"], rel=1e-9)


HAND_PLANS = [  # plans one might write for 64 devices and 512 sequences of a 22B model
    dict(tp=8, pp=1, dp=8, micro_batch=1, recompute="full", zero=1),
    dict(tp=8, pp=2, dp=4, micro_batch=1, recompute="selective", zero=1),
    dict(tp=8, pp=4, dp=2, micro_batch=2, recompute="selective", zero=1, interleave=2),
    dict(tp=4, pp=4, dp=4, micro_batch=1, recompute="full", zero=1),
    dict(tp=2, pp=8, dp=4, micro_batch=1, recompute="selective", zero=1, interleave=2),
    dict(tp=1, pp=8, dp=8, micro_batch=1, recompute="full", zero=1),
    dict(tp=1, pp=1, dp=64, micro_batch=1, recompute="full", zero=3),
    dict(tp=1, pp=1, dp=64, micro_batch=8, recompute="full", zero=3),
    dict(tp=2, pp=1, dp=32, micro_batch=2, recompute="selective", zero=2),
    dict(tp=1, pp=4, dp=16, micro_batch=1, recompute="none", zero=1),
]


@pytest.mark.parametrize("system", ["pcie-ethernet-a100", "dgx-a100"])
def test_search_is_no_slower_than_hand_written_plans(system, search_22b):
    best = search_22b if system == "pcie-ethernet-a100" else \
        snlab.search("megatron-22b", system, devices=64, global_batch=512)
    results = [snlab.train("megatron-22b", system, devices=64, global_batch=512, **p) for p in HAND_PLANS]
    fitting = [r.step_time_s for r in results if r.fits]
    assert len(fitting) >= 3
    assert best["step_time_s"].iloc[0] <= min(fitting) * (1 + 1e-12)


@pytest.mark.parametrize("model, system, devices, batch", [
    ("megatron-22b", "pcie-ethernet-a100", 32, 256),
    (MOE, "cloudmatrix384", 32, 256),
])
def test_search_finds_the_best_of_a_brute_force_sweep(model, system, devices, batch):
    """The fastest fitting plan of an independent exhaustive sweep (every divisor
    degree, micro-batch, interleave, ZeRO, recomputation, sequence parallelism) is
    never faster than what the search returns."""
    n = _divisors(devices)
    ep = [e for e in n if MOE.moe.experts % e == 0] if model is MOE else 1
    df = snlab.sweep(model, system, devices=devices, global_batch=batch, tp=n, pp=n, dp=n, ep=ep,
                     micro_batch=[1, 2, 4, 8], interleave=[1, 2, 4], zero=[0, 1, 2, 3],
                     recompute=["none", "selective", "full"], sequence_parallel=[False, True])
    ok = df[df["valid"] & df["fits"]]
    assert len(ok) > 100
    brute = ok["step_time_s"].min()
    found = snlab.search(model, system, devices=devices, global_batch=batch)
    _check_search_rows(found, devices, batch)
    assert found["step_time_s"].iloc[0] <= brute * (1 + 1e-12)
    again = snlab.train(model, system, devices=devices, **_plan_of(found.iloc[0]))
    assert again.fits and again.step_time_s == pytest.approx(found["step_time_s"].iloc[0], rel=1e-9)


def test_search_with_experts_picks_valid_expert_degrees():
    df = snlab.search(MOE, "cloudmatrix384", devices=32, global_batch=256, top=20)
    _check_search_rows(df, 32, 256)
    assert ((df.dp * df.cp) % df.ep == 0).all() and (MOE.moe.experts % df.ep == 0).all()


def test_fixing_an_axis_restricts_the_search(search_22b):
    fixed = snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512, tp=8)
    _check_search_rows(fixed, 64, 512)
    assert (fixed["tp"] == 8).all()
    assert fixed["step_time_s"].iloc[0] >= search_22b["step_time_s"].iloc[0] * (1 - 1e-12)
    full = snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512, recompute="full",
                        micro_batch=1, top=3)
    assert len(full) == 3
    assert (full["recompute"] == "full").all() and (full["micro_batch"] == 1).all()
    assert full["step_time_s"].iloc[0] >= search_22b["step_time_s"].iloc[0] * (1 - 1e-12)


def test_search_honours_the_overlap_it_is_given():
    none = snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512, overlap="none", top=1)
    allv = snlab.search("megatron-22b", "pcie-ethernet-a100", devices=64, global_batch=512, overlap="all", top=1)
    assert allv["step_time_s"].iloc[0] <= none["step_time_s"].iloc[0]
    assert (none["overlap_dp"] == 0).all() and (allv["overlap_tp"] == 1).all()


@pytest.mark.parametrize("kw, field", [
    (dict(devices=131), "devices"),               # a prime above 128 layers: no split divides 3,072 sequences
    (dict(devices=0), "devices"),
    (dict(devices=2.5), "devices"),
    (dict(devices=64, global_batch=0), "global_batch"),
    (dict(devices=64, micro_batch=0), "micro_batch"),            # fixed axes no plan could take
    (dict(devices=64, micro_batch=[1, 2.5]), "micro_batch"),
    (dict(devices=64, micro_batch=4096), "micro_batch"),         # above the global batch
    (dict(devices=64, interleave=0), "interleave"),
    (dict(devices=64, interleave=66), "interleave"),             # pp x interleave above 128 layers + 2 at pp 2
    (dict(devices=64, expert_imbalance=1.3), "expert_imbalance"),  # fields no plan of the search reads
    (dict(devices=64, offload_layers=2), "offload_layers"),
])
def test_impossible_searches_are_clear_errors(kw, field):
    kw = dict(dict(global_batch=3072), **kw)
    with pytest.raises(SnlabError) as info:
        snlab.search("megatron-1t", "dgx-a100", **kw)
    assert str(info.value).startswith(field)


def test_a_search_where_nothing_fits_is_empty():
    df = snlab.search("megatron-1t", "dgx-a100", devices=8, global_batch=8)
    assert len(df) == 0


def test_model_flops_do_not_depend_on_the_attention_kernel():
    """MFU's model FLOPs are the model's: half of Eq. 7's attention term (causal), with
    FlashAttention or with the scores materialised; PaLM's count keeps the full term;
    what the hardware executes differs with the kernel."""
    model = gpt(48, 6144, 64)
    plan = dict(tp=8, dp=4, micro_batch=1, global_batch=64, recompute="none")
    runs = {fa: snlab.train(model, "dgx-a100", flash_attention=fa, **plan) for fa in (True, False)}
    s, V, L, h = model.seq_len, model.vocab_size, 48, 6144
    for r in runs.values():
        seconds = r.step_time_s * r.devices * 1e12
        assert r.model_tflops_per_device * seconds == pytest.approx(causal_eq7(64, s, L, h, V), rel=1e-9)
        assert r.palm_tflops_per_device * seconds == pytest.approx(korthikanti_eq7(64, s, L, h, V), rel=1e-9)
    executed = {fa: r.hardware_tflops_per_device * r.step_time_s for fa, r in runs.items()}
    assert executed[True] != pytest.approx(executed[False], rel=1e-6)


def test_recomputation_by_module_names():
    from snlab.training import plan as pl
    assert pl.recompute_code("none") == 0 and pl.recompute_code("core_attn") == 1
    a, b = pl.recompute_code("mlp,layernorm"), pl.recompute_code(" layernorm , mlp")
    assert a == b and pl.RECOMPUTE_NAMES[a] == "layernorm,mlp"
    for bad in ("sometimes", "mlp,,", 3, 2.5, -1, len(pl.RECOMPUTE_NAMES), None):
        with pytest.raises(snlab.SnlabError, match="recompute"):
            pl.recompute_code(bad)
    r = snlab.train("deepseek-v3", "dgx-h100", tp=2, pp=8, interleave=4, ep=64, expert_tp=1, dp=64,
                    global_batch=16384, recompute="mlp,mla_up_proj", optimizer_bytes=6)
    assert r.plan["recompute"] == "mla_up_proj,mlp" and r.plan["expert_tp"] == 1 and r.fits
    df = snlab.sweep("llama3-8b", "dgx-h100", dp=8, global_batch=8, recompute=["none", "mlp", "layernorm,mlp"],
                     fp8_activations=["none", "linear", "all"], precision="fp8")
    assert list(df["recompute"].unique()) == ["none", "mlp", "layernorm,mlp"]
    assert (df.groupby("recompute", observed=True)["memory_activations_bytes"].max().diff().dropna() < 0).all()
    assert (df.groupby("fp8_activations", observed=True)["memory_activations_bytes"].max().diff().dropna() < 0).all()
    with pytest.raises(snlab.SnlabError, match="fp8_activations"):
        snlab.train("llama3-8b", "dgx-h100", dp=8, global_batch=8, fp8_activations="half")
    # FP8 activations only inside FP8 compute, as FP8 weights are
    for kept in ("linear", "all", ["none", "all"]):
        with pytest.raises(snlab.SnlabError, match="fp8_activations.*precision bf16"):
            snlab.sweep("llama3-8b", "dgx-h100", dp=8, global_batch=8, fp8_activations=kept)
    none = snlab.train("llama3-8b", "dgx-h100", dp=8, global_batch=8, fp8_activations="none")
    assert none.plan["fp8_activations"] == "none"
    # None, the default, is the precision's own choice: none under bf16, wherever it is given
    left = snlab.train("llama3-8b", "dgx-h100", dp=8, global_batch=8, fp8_activations=None)
    assert left.plan["fp8_activations"] == "none" and left.step_time_s == none.step_time_s
    assert len(snlab.search("llama3-8b", "dgx-h100", devices=8, global_batch=8, fp8_activations=None, top=1)) == 1
    with pytest.raises(snlab.SnlabError, match="expert_tp"):
        snlab.train("qwen3-30b-a3b", "dgx-h100", tp=2, dp=4, ep=8, expert_tp=3, global_batch=8)


@pytest.mark.parametrize("model, devices, global_batch, pp", [("deepseek-v3", 2048, 15360, 16),
                                                                ("llama3-405b", 16384, 2048, 16)])
def test_search_considers_the_uneven_pipelines_published_plans_ran(model, devices, global_batch, pp):
    """DeepSeek-V3 ran its 61 layers on 16 stages, Llama 3 405B its 126: degrees that do not
    divide the layers are candidates of search."""
    from snlab.presets import model as load_model
    from snlab.training.planner import search_space
    m = load_model(model)
    assert m.layers % pp
    base, _, _ = search_space(m, devices, global_batch)
    assert pp in set(base[:, 1].astype(int))


def test_the_expert_group_folds_the_context_parallel_ranks_in():
    """Megatron-Core builds expert groups with cp = 1 (ranks expert_tp apart): with cp 2 and
    ep 8 on 8-GPU servers the expert group is one server, as it is with cp 1 and the same
    tokens per device; and a 2-device MoE plan on a torus slice is priced, not NaN."""
    import dataclasses
    from snlab.presets import model as load_model
    a = snlab.train("mixtral-8x7b", "dgx-h100", tp=1, cp=2, dp=4, ep=8, global_batch=4, seq_len=8192)
    b = snlab.train("mixtral-8x7b", "dgx-h100", tp=1, cp=1, dp=8, ep=8, global_batch=8, seq_len=4096)
    assert a.time_s["ep"] == pytest.approx(b.time_s["ep"], rel=1e-9)
    m = load_model("mixtral-8x7b")
    small = m.replace(name="tiny-moe", layers=16, hidden_size=2048, heads=16, kv_heads=16,
                      moe=dataclasses.replace(m.moe, experts=16, expert_ffn_hidden_size=1408, shared_experts=1,
                                              dense_layers=1, load_imbalance=1.0))
    r = snlab.train(small, "tpu-v5p-pod", tp=1, cp=2, ep=2, pp=1, dp=1, global_batch=1)
    assert np.isfinite(r.step_time_s) and r.time_s["ep"] > 0
