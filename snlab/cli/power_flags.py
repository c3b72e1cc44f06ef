"""The power and price flags that ``train``, ``serve``, ``compare`` and ``search`` share."""

from __future__ import annotations

from ..errors import SnlabError
from .common import number

PRICE_FLAGS = {
    "device_hour": ("--device-hour-price", "rent per device-hour [$], e.g. 2.5 (electricity included)", 0.0, 1e4),
    "capex": ("--capex", "purchase price per device [$], its share of the system included, e.g. 50000", 0.0, 1e8),
    "years": ("--years", "years the purchase is written off over (default 4)", 0.1, 50.0),
    "kwh": ("--kwh-price", "price of electricity per kWh [$], e.g. 0.08", 0.0, 10.0),
    "utilisation": ("--utilisation", "share of the paid hours the devices do this work (default 1)", 0.01, 1.0),
}


def add(p) -> None:
    """Add the cooling, PUE and price flags to a subcommand's parser."""
    p.add_argument("--cooling", choices=["air", "liquid"], default=None,
                   help="cooling the system runs under (default: the one it is built for); sets the PUE, the "
                        "devices per rack and the clock the devices sustain")
    p.add_argument("--pue", default=None, metavar="X", help="facility PUE instead of the cooling's, from 1 to 3")
    p.add_argument("--prices", default=None, choices=["example", "example-rent", "example-purchase"],
                   help="the dated example prices of snlab/presets/data/prices.toml (not quotes)")
    for name, (flag, help_, _, _) in PRICE_FLAGS.items():
        p.add_argument(flag, dest=f"price_{name}", default=None, metavar="X", help=help_)


def options(args) -> dict:
    """The ``cooling``, ``pue`` and ``prices`` keywords of the planners from parsed flags."""
    out = {}
    if args.cooling is not None:
        out["cooling"] = args.cooling
    if args.pue is not None:
        out["pue"] = number("pue", args.pue, 1.0, 3.0, "a PUE from 1 to 3")
    given = {}
    for name, (flag, _, low, high) in PRICE_FLAGS.items():
        text = getattr(args, f"price_{name}")
        if text is not None:
            given[name] = number(flag[2:].replace("-", "_"), text, low, high,
                                 f"a number from {low:g} to {high:,.0f}")
    if args.prices is not None and given:
        raise SnlabError("prices", f"--prices {args.prices} with {', '.join(given)}",
                         "either --prices or the price flags")
    if args.prices is not None:
        out["prices"] = args.prices
    elif given:
        if not {"device_hour", "capex", "kwh"} & set(given):
            raise SnlabError("prices", "no price given", "--device-hour-price, --capex (with --years) or --kwh-price")
        out["prices"] = given
    return out
