"""How a pipeline splits a model's layers over its stages and their virtual stages.

By default snlab balances the stages' work. The last stage also runs the output layer and the
loss, and any multi-token-prediction modules; they count as ``tail`` layers there, the whole
number of average layers their matrix multiplies amount to (:func:`tail_units`). Megatron-Core
does this by hand with ``--account-for-loss-in-pipeline-split`` (one layer) and the ``m`` of
its pipeline layouts (``transformer_block.get_num_layers_to_build``); the embedding, a table
lookup, counts for nothing. Where the units do not divide evenly, snlab spreads them as evenly
as possible, extra units going to the middle stages first, then to the first, then to the
last. Llama 3 405B's 126 layers on 16 stages come out as the paper trained them: one layer
fewer on the first and the last stage (Dubey et al. 2024, Sec. 3.3.2); DeepSeek-V3's 61 layers
and its MTP module on 16 stages leave the last stage its output head, its MTP module and
fewer layers.

``first`` / ``last`` > 0 fix the transformer layers of the first / last stage instead
(``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, which
Megatron-Core does not combine with the accounting); the other stages share the rest as
evenly as possible. A stage's units are spread over its ``interleave`` model chunks, and
every chunk needs at least one.

Everything here is integer arithmetic on numpy arrays, so that a sweep evaluates every
plan of a grid at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..grid import where
from .. import kernel as _kernel

_kernel.loaded(__name__)


def _int(x):
    """An integer input as int64: a numpy scalar for a scalar (a single plan stays in
    scalars), an array for an array."""
    if type(x) is np.int64:
        return x
    return np.int64(x) if np.ndim(x) == 0 else np.asarray(x, dtype=np.int64)


@dataclass(frozen=True)
class Split:
    """Transformer layers of the first stage, of the most loaded middle stage (0 when
    there is none) and of the last stage; the fewest units (layers, and the last stage's
    tail) any stage holds, and the fewest layers a middle stage holds [count]. With one
    stage, first and last are the same stage and hold every layer."""

    first: np.ndarray
    middle: np.ndarray
    last: np.ndarray
    fewest_units: np.ndarray
    fewest_middle: np.ndarray
    last_units: np.ndarray = 0


def tail_units(vocab_size, hidden_size, layers, matmul_params, mtp_matmul_params=0.0):
    """Whole average layers the last stage's extra work amounts to: the output layer's
    V h weights and the MTP modules' matrices, over one layer's share of the matrix
    weights, rounded down [count]."""
    per_layer = matmul_params / layers
    return np.floor((vocab_size * hidden_size + mtp_matmul_params) / per_layer)


def split(layers, pp, first=0, last=0, tail=0) -> Split:
    """The split of ``layers`` over ``pp`` stages (see the module's docstring); ``tail``
    layer-equivalents of extra work sit on the last stage when its count is automatic."""
    args = tuple(_int(x) for x in (layers, pp, first, last, tail))
    if all(type(x) is np.int64 for x in args):
        return _split_one(*args)       # a single plan: the rules and the step share it
    return _split(*args)


@lru_cache(maxsize=1024)
def _split_one(layers, pp, first, last, tail) -> Split:
    return _split(layers, pp, first, last, tail)


def _split(layers, pp, first, last, tail) -> Split:
    one = pp <= 1
    f_set, l_set = (first > 0) & ~one, (last > 0) & ~one
    explicit = f_set | l_set
    # units the last stage carries besides layers when the split is automatic, never more
    # than a stage's share of the layers (a last stage of no transformer layer at most)
    tail = np.minimum(tail, layers // np.maximum(pp - 1, 1))
    tail = where(explicit, 0, tail).astype(np.int64)
    middle_stages = np.maximum(pp - 2, 0)
    auto = np.maximum(pp - f_set - l_set, 1)                   # stages whose count is automatic
    units = layers + tail - where(f_set, first, 0) - where(l_set, last, 0)
    q, r = units // auto, units % auto
    # the r extra units go to the middle stages, then the first; fewer than the automatic
    # stages, they never reach the last
    middle = where(middle_stages > 0, q + (r > 0), 0)
    first_units = where(f_set, first, q + (r > middle_stages))
    last_units = where(l_set, last, q)
    fewest_middle = where(middle_stages > 0, q + (r >= middle_stages), layers)
    return Split(first=where(one, layers, first_units),
                 middle=where(one, 0, middle),
                 last=where(one, layers, last_units - where(l_set, 0, tail)),
                 fewest_units=where(one, layers + 1, np.minimum(np.minimum(first_units, last_units),
                                                                    fewest_middle)),
                 fewest_middle=fewest_middle, last_units=where(one, layers + 1, last_units))


def broken(layers, pp, interleave, first=0, last=0, tail=0):
    """True where a plan's split leaves a model chunk empty, a stage with fewer than no
    layers, or fixes an end stage without a pipeline or beyond the layers there are. The
    first stage's first chunk may hold the embedding alone and the last stage's last
    chunk the output layer and loss alone, as Megatron-Core lays them out with
    ``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``
    (Llama 3.1 405B on 16 stages of 8 chunks: 126 layers in 128 chunks)."""
    pp, interleave, first, last = (_int(x) for x in (pp, interleave, first, last))
    if type(pp) is type(interleave) is type(first) is type(last) is np.int64 and np.ndim(layers) == 0 \
            and np.ndim(tail) == 0:
        return _broken_one(_int(layers), pp, interleave, first, last, _int(tail))
    return _broken(layers, pp, interleave, first, last, tail)


@lru_cache(maxsize=1024)
def _broken_one(layers, pp, interleave, first, last, tail):
    """:func:`broken` of a single plan (integers), kept: the rules of a loop's plans repeat."""
    return _broken(layers, pp, interleave, first, last, tail)


def _broken(layers, pp, interleave, first, last, tail):
    s = split(layers, pp, first, last, tail)
    ends = (first > 0) | (last > 0)
    both = (first > 0) & (last > 0)
    # the accounting is Megatron-Core's automatic split only, with a pipeline; there the first
    # stage never holds fewer units than the last, so the last's are the ones to check
    relaxed = (pp > 1) & ~ends
    end_short = where(relaxed, s.last_units < interleave - 1, s.fewest_units < interleave)
    middle_short = (pp > 2) & (s.fewest_middle < interleave)
    # fixing more layers than there are leaves a stage fewer than none: s.last < 0
    return (end_short | middle_short | (s.last < 0) | (ends & (pp < 2)) | (first < 0) | (last < 0)
            | (both & (pp == 2) & (first + last != layers)))


def stage_layers(layers: int, pp: int, first: int = 0, last: int = 0, tail: int = 0) -> list[int]:
    """Transformer layers of each stage, first to last, for one plan."""
    if pp <= 1:
        return [int(layers)]
    s = split(layers, pp, first, last, tail)
    explicit = first > 0 or last > 0
    tail = min(int(tail), layers // max(pp - 1, 1))
    units = layers + (0 if explicit else tail) - max(first, 0) - max(last, 0)
    auto = pp - (first > 0) - (last > 0)
    q, r = divmod(units, max(auto, 1))
    middle = [q + (1 if i < r else 0) for i in range(pp - 2)]
    return [int(s.first)] + middle + [int(s.last)]


def chunk_layers(n: int, interleave: int) -> list[int]:
    """A stage's ``n`` units over its ``interleave`` chunks, as evenly as possible."""
    q, r = divmod(int(n), int(interleave))
    return [q + (1 if i >= interleave - r else 0) for i in range(int(interleave))]


def sizes_tail(sizes) -> np.ndarray:
    """:func:`tail_units` of a :class:`~snlab.sizing.ModelSizes`."""
    return tail_units(sizes.vocab_size, sizes.hidden_size, sizes.layers, sizes.matmul_params,
                      sizes.mtp_matmul_params)


def model_tail(model) -> np.ndarray:
    """:func:`tail_units` of a model preset."""
    from ..sizing import model_sizes
    return sizes_tail(model_sizes(model))


def stage_table(model, pp: int, interleave: int = 1, first_stage_layers: int = 0, last_stage_layers: int = 0):
    """The split of a model (a name, path or Model) over ``pp`` stages of ``interleave``
    chunks, one row per stage: its transformer layers, the layers of each chunk, and what
    else it runs. A pandas DataFrame; a split that leaves a chunk empty raises."""
    import pandas as pd

    from ..errors import SnlabError
    from ..presets import model as load_model
    m = load_model(model)
    tail = int(model_tail(m))
    if bool(broken(m.layers, pp, interleave, first_stage_layers, last_stage_layers, tail)):
        raise SnlabError("pp", f"{m.layers} layers on {pp} stages of {interleave} chunks",
                         "a split with at least one layer (or the output layer) per chunk")
    per_stage = stage_layers(m.layers, pp, first_stage_layers, last_stage_layers, tail)
    rows = []
    for i, n in enumerate(per_stage):
        extra = []
        if i == 0:
            extra.append("embedding")
        if i == len(per_stage) - 1:
            extra.append("output layer and loss")
            if m.mtp_modules:
                extra.append(f"{m.mtp_modules} MTP module" + ("s" if m.mtp_modules > 1 else ""))
        rows.append({"stage": i, "layers": n, "chunks": chunk_layers(n, interleave), "also": ", ".join(extra)})
    return pd.DataFrame(rows)
