"""``snlab collective``: the time, NCCL bus bandwidth and algorithm of one collective on a system."""

from __future__ import annotations

from ..network import ALGORITHMS, COLLECTIVES, MAX_GROUP, MAX_MESSAGE_BYTES
from ..units import fmt_bytes, fmt_seconds
from .common import count, number, print_json


def register(sub) -> None:
    p = sub.add_parser("collective", help="time, bus bandwidth and algorithm of one collective over a group of devices")
    p.add_argument("--system", required=True, help="system preset name or .toml path")
    p.add_argument("--op", required=True, choices=list(COLLECTIVES))
    p.add_argument("--bytes", dest="message_bytes", required=True, metavar="N",
                   help="the buffer each device holds, in bytes (e.g. 8e9)")
    p.add_argument("--devices", required=True, metavar="N", help="devices in the group")
    p.add_argument("--stride", default="1", metavar="N", help="ranks between members of the group (default 1)")
    p.add_argument("--slice", default=None, metavar="AxBxC",
                   help="on a pod cut by optical switches (TPU), the job's slice, e.g. 4x4x8 (default: the "
                        "scheduler's shape for devices x stride chips)")
    p.add_argument("--algorithm", default="auto", choices=list(ALGORITHMS),
                   help="auto: the collective library's; one-shot: the one-shot all-reduce inside one domain")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..network import collective
    size = number("bytes", args.message_bytes, 1.0, MAX_MESSAGE_BYTES,
                  f"a number of bytes from 1 to {MAX_MESSAGE_BYTES:.0e}, e.g. 8e9")
    devices = count("devices", args.devices, low=2, high=MAX_GROUP)
    stride = count("stride", args.stride, low=1, high=MAX_GROUP)
    c = collective(args.system, args.op, size, devices, stride=stride, slice=args.slice, algorithm=args.algorithm)
    if args.json:
        print_json({**c.to_dict(), "system": args.system})
        return 0
    print(f"{args.op} of {fmt_bytes(size)} over {devices} devices of {args.system}: {fmt_seconds(c.time_s)}, "
          f"bus bandwidth {c.bus_bandwidth / 1e9:.4g} GB/s (algorithm bandwidth {size / c.time_s / 1e9:.4g} GB/s)")
    print(f"  {c.algorithm}; {c.placement}; {c.topology}")
    return 0
