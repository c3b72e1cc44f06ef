"""Golden values from Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models" (SC'20, arXiv 1910.02054), Figure 1."""

import pytest

from snlab.walls import memory as mw

# Figure 1: 7.5 B parameters, N_d = 64, K = 12; per-device model-state memory in GB.
FIGURE_1 = [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)]


@pytest.mark.parametrize("stage, gigabytes", FIGURE_1)
def test_figure_1_model_state_memory(stage, gigabytes):
    total = mw.model_state_memory(params_per_device=7.5e9, weight_bytes=2, grad_bytes=2,
                                  optimizer_bytes=12, zero_stage=stage, zero_shards=64)
    assert round(total / 1e9, 1) == pytest.approx(gigabytes)


def test_section_3_1_sixteen_bytes_per_parameter():
    """Sec. 3.1: mixed-precision Adam needs (2 + 2 + K) = 16 bytes per parameter."""
    assert mw.model_state_memory(params_per_device=1, weight_bytes=2, grad_bytes=2,
                                 optimizer_bytes=12, zero_stage=0, zero_shards=1) == 16
