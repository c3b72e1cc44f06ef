"""``snlab explore``: a design space described in TOML, walked in chunks and reduced."""

from __future__ import annotations

from .common import integer_flag, print_json


def register(sub) -> None:
    p = sub.add_parser("explore", help="a design space of any size: the best plans, the Pareto front, "
                                       "why rows were refused",
                       description="Walk a grid described in TOML in chunks and reduce it as it goes; see "
                                   "snlab.exploration.spec for the format.")
    p.add_argument("--spec", required=True, help="TOML file: model, system, [axes] (lists or ranges with units)")
    p.add_argument("--top", type=integer_flag("top", high=100_000), help="how many of the best rows (default 10)")
    p.add_argument("--objective", help="column to rank by, e.g. tokens_per_s, max:mfu, min:step_time_s")
    p.add_argument("--pareto", help="two or three objectives, comma-separated, e.g. tokens_per_s,min:hbm_capacity")
    p.add_argument("--out", help="a new or empty directory: every valid row as Parquet (needs pyarrow)")
    p.add_argument("--scheduler", help="processes, dask (a local cluster), or a Dask scheduler address "
                                       "such as tcp://10.0.0.1:8786 (default: this process)")
    p.add_argument("--workers", type=integer_flag("workers", high=4096), help="local processes or Dask workers")
    p.add_argument("--chunk-rows", type=integer_flag("chunk-rows", high=4_000_000),
                   help="rows a chunk evaluates at once (default from the memory available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..exploration import explore, spec
    kwargs = spec.read(args.spec)
    for flag, key in (("top", "top"), ("objective", "objective"), ("pareto", "pareto"), ("workers", "workers"),
                      ("chunk_rows", "chunk_rows")):
        if getattr(args, flag) is not None:
            kwargs[key] = getattr(args, flag)
    if args.out is not None:
        kwargs["out"] = args.out
    if args.scheduler is not None:
        kwargs["scheduler"] = args.scheduler
    if args.no_progress:
        kwargs["progress"] = False
    model, system = kwargs.pop("model"), kwargs.pop("system")
    kind = kwargs.pop("kind", "train")
    if kind == "serve":
        kwargs.setdefault("precision", None)
    result = explore(model, system, kind=kind, **kwargs)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result)
    return 130 if result.interrupted else 0
