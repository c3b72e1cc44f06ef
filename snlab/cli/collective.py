"""``snlab collective``: the time and NCCL bus bandwidth of one collective on a system."""

from __future__ import annotations

from ..network import COLLECTIVES, MAX_GROUP, MAX_MESSAGE_BYTES
from ..units import fmt_bytes, fmt_seconds
from .common import count, number, print_json


def register(sub) -> None:
    p = sub.add_parser("collective", help="time and bus bandwidth of one collective over a group of devices")
    p.add_argument("--system", required=True, help="system preset name or .toml path")
    p.add_argument("--op", required=True, choices=list(COLLECTIVES))
    p.add_argument("--bytes", dest="message_bytes", required=True, metavar="N",
                   help="the buffer each device holds, in bytes (e.g. 8e9)")
    p.add_argument("--devices", required=True, metavar="N", help="devices in the group (consecutive ranks)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..network import bus_bandwidth, collective_time
    size = number("bytes", args.message_bytes, 1.0, MAX_MESSAGE_BYTES,
                  f"a number of bytes from 1 to {MAX_MESSAGE_BYTES:.0e}, e.g. 8e9")
    devices = count("devices", args.devices, low=2, high=MAX_GROUP)
    t = collective_time(args.system, args.op, size, devices)
    busbw = bus_bandwidth(args.op, size, devices, t)
    if args.json:
        print_json({"system": args.system, "op": args.op, "message_bytes": size, "devices": devices,
                    "time_s": t, "algorithm_bandwidth_bytes_per_s": size / t, "bus_bandwidth_bytes_per_s": busbw})
        return 0
    print(f"{args.op} of {fmt_bytes(size)} over {devices} devices of {args.system}: {fmt_seconds(t)}, "
          f"bus bandwidth {busbw / 1e9:.4g} GB/s (algorithm bandwidth {size / t / 1e9:.4g} GB/s)")
    return 0
