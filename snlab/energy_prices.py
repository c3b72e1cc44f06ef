"""What a job pays: rent, or a purchase written off over years, and electricity.

:class:`Prices` holds them (one-line errors name the field and its range);
:func:`example_prices` reads the dated examples shipped in ``prices.toml``: examples to
start from, not quotes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SnlabError
from . import kernel as _kernel

_kernel.loaded(__name__)

#: seconds in a year (365.25 days), joules in a kWh, seconds in an hour
YEAR_S, KWH_J, HOUR_S = 365.25 * 86400.0, 3.6e6, 3600.0
#: each price's range and what it accepts, in words
RANGES = {"device_hour": (0.0, 1e4, "a price per device-hour from 0 to 10,000 $"),
          "capex": (0.0, 1e8, "a purchase price per device from 0 to 100,000,000 $"),
          "years": (0.1, 50.0, "a write-off period from 0.1 to 50 years"),
          "kwh": (0.0, 10.0, "an electricity price from 0 to 10 $ per kWh"),
          "utilisation": (0.01, 1.0, "a share of the paid hours from 0.01 to 1")}


@dataclass(frozen=True)
class Prices:
    """What a job pays: ``device_hour`` [$] rent per device-hour (electricity usually
    included), or ``capex`` [$] purchase price per device (its share of the system
    included) written off over ``years``; ``kwh`` [$] per kWh the facility draws; and
    ``utilisation``, the share of the paid hours the devices do this work (1: every hour
    is used)."""

    device_hour: float = 0.0
    capex: float = 0.0
    years: float = 4.0
    kwh: float = 0.0
    utilisation: float = 1.0

    def __post_init__(self):
        for name, (low, high, allowed) in RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                raise SnlabError(f"prices.{name}", f"got {value!r}", allowed)
        if not (self.device_hour or self.capex or self.kwh):
            raise SnlabError("prices", "device_hour, capex and kwh are all 0, a cost of nothing",
                             "device_hour, capex (with years) or kwh, one of them above 0")

    def inputs(self) -> dict:
        """The inputs of :data:`snlab.walls.power.cost_rate` in SI units ($/s, $, s, $/J)."""
        return dict(device_price=self.device_hour / HOUR_S, capex=float(self.capex),
                    lifetime=self.years * YEAR_S, fleet_utilisation=float(self.utilisation),
                    energy_price=self.kwh / KWH_J)


def prices(spec=None, **given) -> Prices | None:
    """A :class:`Prices` from a Prices, a mapping of its fields, ``"example"`` (the dated
    example prices shipped in ``prices.toml``, see :func:`example_prices`; needs
    ``system=``), or keywords; None for None."""
    if spec is None and not given:
        return None
    if isinstance(spec, Prices):
        return spec
    if isinstance(spec, str):
        if spec not in ("example", "example-rent", "example-purchase"):
            raise SnlabError("prices", f"got {spec!r}", "'example', 'example-rent', 'example-purchase', a mapping of "
                             "device_hour, capex, years, kwh, utilisation, or a snlab.energy.Prices")
        system = given.pop("system")
        return example_prices(system, rent={"example-rent": True, "example-purchase": False}.get(spec), **given)
    if spec is not None and not isinstance(spec, Mapping):
        raise SnlabError("prices", f"got {type(spec).__name__} {spec!r}", "'example', 'example-rent', "
                         "'example-purchase', a mapping of device_hour, capex, years, kwh, utilisation, or a "
                         "snlab.energy.Prices")
    fields = dict(spec or {}, **given)
    bad = [k for k in fields if k not in Prices.__dataclass_fields__]
    if bad:
        raise SnlabError(f"prices.{bad[0]}", "no such price", ", ".join(Prices.__dataclass_fields__))
    if not {"device_hour", "capex", "kwh"} & set(fields):
        raise SnlabError("prices", "no price given", "device_hour, capex (with years) or kwh")
    return Prices(**fields)


def example_prices(system, rent: bool | None = None, **override) -> Prices:
    """Dated example prices for ``system`` from ``prices.toml`` (sources and dates there):
    its devices' rent per hour (``rent=True``) or their purchase price over four years
    with the example electricity price of the region it typically runs in (``False``);
    by default rent where an example rent exists, else purchase. They are examples to
    start from, not quotes."""
    from .presets import read_toml
    from .presets import system as load_system
    from .presets.loader import DATA
    s = load_system(system)
    table = read_toml(DATA / "prices.toml", "prices.toml")
    devices, systems = table.get("device_hour", {}), table.get("capex", {})
    if rent is None:
        rent = s.device.name in devices
    if rent:
        if s.device.name not in devices:
            raise SnlabError("prices", f"no example rent for {s.device.name}", ", ".join(devices))
        base = dict(device_hour=float(devices[s.device.name]["value"]))
    else:
        if s.name not in systems:
            raise SnlabError("prices", f"no example purchase price for {s.name}", ", ".join(systems))
        region = systems[s.name].get("electricity", "us")
        base = dict(capex=float(systems[s.name]["value"]), years=4.0,
                    kwh=float(table["kwh"][region]["value"]))
    return Prices(**{**base, **override})
