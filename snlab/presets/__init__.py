"""Presets: devices, systems and models as TOML data, loaded into frozen objects.

Shipped presets live in ``snlab/presets/data/{devices,systems,models}/NAME.toml``;
``sources.toml`` beside them is the bibliography their ``source`` keys refer to.
Anywhere a preset is taken, a preset object, a shipped name or a path to a TOML file
of the same format works (``snlab presets show NAME --toml`` prints one to start from).
:mod:`snlab.presets.loader` reads them, :mod:`snlab.presets.toml` writes them back, and
:mod:`snlab.schema` holds the fields and their ranges.
"""

from __future__ import annotations

from ..schema import PRECISIONS, si_unit
from ..specs import validate
from .loader import (DATA, KINDS, MAX_BYTES, PresetLike, bibliography, catalog, device, load,
                     looks_like_path, model, names, read_toml, shipped, system)
from .toml import to_toml

__all__ = ["device", "system", "model", "load", "names", "catalog", "bibliography", "to_toml", "validate",
           "read_toml", "shipped", "looks_like_path", "si_unit", "DATA", "KINDS", "MAX_BYTES", "PRECISIONS",
           "PresetLike"]
