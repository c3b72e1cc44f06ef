"""Mutation check: every arithmetic term of the step models is pinned by a fast test.

For each module below, every binary operation (+ - * /) is swapped for its opposite
(+ with -, * with /) and every numeric constant c is changed (0 -> 1, 1 -> 2, c -> 2c),
one at a time. Each mutant is executed into the module in place, the module's unit tests
run against it, and a mutant that no test notices "survives". The check passes when none
does, except the few listed in ``EQUIVALENT`` whose change cannot alter any result (with
the reason).

    .venv/bin/python tests/mutate.py                     # every module
    .venv/bin/python tests/mutate.py snlab/network.py    # one

``make mutate`` runs the first form; a full run takes a few minutes.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: module file -> the fast tests that must notice any change to it
TARGETS = {
    "snlab/training/step.py": ["tests/test_training_parts.py"],
    "snlab/training/stages.py": ["tests/test_training_parts.py", "tests/test_modern_shapes.py"],
    "snlab/serving/step.py": ["tests/test_serving_parts.py", "tests/test_serving_engine.py"],
    "snlab/serving/engine.py": ["tests/test_serving_engine.py", "tests/test_serving_parts.py"],
    "snlab/serving/offline.py": ["tests/test_serving_engine.py"],
    "snlab/serving/service.py": ["tests/test_queue_parts.py"],
    "snlab/serving/queueing.py": ["tests/test_queue_parts.py"],
    "snlab/serving/disaggregation.py": ["tests/test_queue_parts.py"],
    "snlab/network.py": ["tests/test_training_parts.py", "tests/test_serving_parts.py", "tests/test_collectives.py",
                         "tests/test_serving_microbench.py", "tests/test_topology.py"],
    "snlab/topology.py": ["tests/test_topology.py", "tests/test_collectives.py"],
    "snlab/energy.py": ["tests/test_power_parts.py"],
    "snlab/power_cooling.py": ["tests/test_power_parts.py"],
}
#: mutants that cannot change a result: (module, a fragment of the source line, the
#: mutation, for a constant optionally with " in <its expression>") and why. An entry
#: that matches no mutant any more is stale and fails the check.
_ROOF = "a zero FLOP or byte term inside the roofline's max next to the other term"
_FLAG = "compares a field that is 0 or far above 1 (cast bytes 0 or 4, a bandwidth 0 or >= 1 MB/s)"
_GUARD = "the fallback of a where() whose branch no row takes (it only avoids a division by zero)"
_BYTE = "compares a byte count with 0 or 1: no tier holds a fraction of a byte"
_FAST = ("picks the one-plan path or the grid path, which give the same numbers (tests/test_single_call_paths.py): "
         "either serves the row")
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("snlab/training/stages.py", "if type(pp) is type(interleave) is type(first) is type(last) is np.int64 and "
     "np.ndim(layers) == 0", "constant 0 -> 1"): _FAST,
    ("snlab/training/stages.py", "and np.ndim(tail) == 0:", "constant 0 -> 1"): _FAST,
    ("snlab/energy.py", "if type(x) is np.float64 and 0.0 < x < 1.0:", "constant 0.0 -> 1"): _FAST,
    ("snlab/energy.py", "if type(x) is np.float64 and 0.0 < x < 1.0:", "constant 1.0 -> 2"): _FAST,
    ("snlab/training/step.py", "attention = cw.roofline_time(flops=score_flops, bytes_moved=0.0",
     "constant 0.0 -> 1"): _ROOF,
    ("snlab/training/step.py", "elementwise = cw.roofline_time(flops=0.0", "constant 0.0 -> 1"): _ROOF,
    ("snlab/training/step.py", "+ cw.roofline_time(flops=0.0, bytes_moved=2 * logits_bytes", "constant 0.0 -> 1"): _ROOF,
    ("snlab/training/step.py", "step = where(off_opt & ~in_pool, host_step, cw.roofline_time(flops=0.0",
     "constant 0.0 -> 1"): _ROOF,
    ("snlab/training/step.py", "dispatch_bytes = where(hw.cast_bytes > 0", "constant 0 -> 1"): _FLAG,
    ("snlab/training/step.py", "in_pool = (hw.pool_bandwidth > 0)", "constant 0 -> 1"): _FLAG,
    ("snlab/training/step.py", "return calls(op, bytes_per_param, n_calls) if", "constant 0.0 -> 1"):
        "stands in only for rows whose ZeRO stage does not use this collective; where() drops it",
    ("snlab/training/step.py", "a_far = where(off_act, share * maximum(mem.layered - 2 * mem.per_layer, 0.0)",
     "constant 0.0 -> 1"): "floors a stage's activations beyond two layers, never negative but for a one-layer stage",
    ("snlab/training/step.py", "out_mb = share * maximum(mem.per_layer * lay.stage_layers - 2 * mem.per_layer, 0.0)",
     "constant 0.0 -> 1"): "floors a stage's activations beyond two layers, never negative but for a one-layer stage",
    ("snlab/training/step.py", "level = where(shorter > 0, hidden / where(shorter > 0, shorter, 1.0), 0.0)",
     "constant 1.0 -> 2"): _GUARD,
    ("snlab/training/step.py", "level = where(shorter > 0, hidden / where(shorter > 0, shorter, 1.0), 0.0)",
     "constant 0.0 -> 1"): "with nothing to overlap (shorter = 0) the level multiplies a zero",
    ("snlab/training/step.py", "share = {x: where(total_can > 0, can[x] / where(total_can > 0, total_can, 1.0)",
     "constant 1.0 -> 2"): _GUARD,
    ("snlab/training/step.py", "share = {x: where(total_can > 0, can[x] / where(total_can > 0, total_can, 1.0)",
     "constant 0.0 -> 1"): "when no class can hide anything, nothing is hidden: the share multiplies a zero",
    ("snlab/training/step.py", "bubble_compute = sched.bubble * minimum(comp.per_microbatch / where(mb > 0, mb, 1.0)",
     "constant 1.0 -> 2"): "a micro-batch never takes less than its compute: the ratio is at most 1 (and the "
                           "guard's fallback is never taken)",
    ("snlab/training/step.py", "per = where(comp.per_microbatch > 0, comp.per_microbatch, 1.0)",
     "constant 1.0 -> 2"): _GUARD,
    ("snlab/training/stages.py", "return np.int64(x) if np.ndim(x) == 0 else np.asarray(x, dtype=np.int64)",
     "constant 0 -> 1"): "np.int64 of a one-dimensional array is the same array",
    ("snlab/training/stages.py", "auto = np.maximum(pp - f_set - l_set, 1)", "constant 1 -> 2"):
        "no automatic stage only when both ends of a two-stage pipeline are fixed, where q is not used",
    ("snlab/training/stages.py", "tail = min(int(tail), layers // max(pp - 1, 1))",
     "constant 1 -> 2 in max(pp - 1, 1)"):
        "only the middle stages use it, and they exist only with pp >= 3, where pp - 1 >= 2",
    ("snlab/training/stages.py", "q, r = divmod(units, max(auto, 1))", "constant 1 -> 2"):
        "middle stages exist only with pp >= 3, where at least one stage is automatic",
    ("snlab/serving/step.py", "return np.ceil(np.round(pool_bytes_per_device * dep.devices / lendable, 9))",
     "constant 9 -> 18"): "the rounding only absorbs floating-point noise before the ceiling",
    ("snlab/serving/step.py", '"pool": where(offload & (hw.pool_bandwidth > 0)', "constant 0 -> 1"): _FLAG,
    ("snlab/serving/step.py", '"host": where(offload & (hw.host_bandwidth > 0)', "constant 0 -> 1"): _FLAG,
    ("snlab/serving/step.py", '"ssd": where(offload & (hw.storage_bandwidth > 0)', "constant 0 -> 1"): _FLAG,
    ("snlab/serving/step.py", "location = where(placed[tier] > 0, i, location)", "constant 0 -> 1"): _BYTE,
    ("snlab/serving/step.py", "location = where(left > 0, len(KV_TIERS), location)", "constant 0 -> 1"): _BYTE,
    ("snlab/serving/step.py", 'last = where(caps["ssd"] > 0, 3, where(caps["host"] > 0, 2, where(caps["pool"] > 0',
     "constant 0 -> 1"): "compares a capacity that is 0 (no such tier) or at least 1 MB",
    ("snlab/serving/step.py", "total = where(kv_dev > 0, kv_dev, 1.0)", "constant 0 -> 1"): _GUARD,
    ("snlab/serving/step.py", "total = where(kv_dev > 0, kv_dev, 1.0)", "constant 1.0 -> 2"): _GUARD,
    ("snlab/serving/step.py", "share = {tier: where(kv_dev > 0, placed[tier] / total", "constant 0 -> 1"): _GUARD,
    ("snlab/serving/step.py", "share = {tier: where(kv_dev > 0, placed[tier] / total", "constant 1.0 -> 2"): _GUARD,
    ("snlab/serving/step.py", "share = {tier: where(kv_dev > 0, placed[tier] / total", "constant 0.0 -> 1"): _GUARD,
    ("snlab/serving/step.py", "far_bandwidth=where(used, bw, 1.0)", "constant 1.0 -> 2"): _GUARD,
    ("snlab/serving/step.py", "t_attn_c = cw.roofline_time(flops=attn_flops, bytes_moved=0.0", "constant 0.0 -> 1"):
        _ROOF,
    ("snlab/serving/step.py", "ep_comm = 0.0 * tok", "Mult -> Div: 0.0 * tok"): "zero either way",
    ("snlab/serving/step.py", "zero = 0.0 * tok", "Mult -> Div: 0.0 * tok"): "zero either way",
    ("snlab/serving/step.py", "draft = 1 + kd * MTP_LAYERS / ss.base.layers", "Mult -> Div: kd * MTP_LAYERS"):
        "MTP_LAYERS is 1: multiplying or dividing by it is the same",
    ("snlab/serving/step.py", "dep.devices <= hw.scale_up_domain_size, hw), 0.0)", "constant 0.0 -> 1"):
        "the hop of a one-stage prefill is multiplied by pp - 1 = 0",
    ("snlab/serving/step.py", "capacity = maximum(cap * per_replica, 1e-30)", "constant 1e-30 -> 2e-30"): _GUARD,
    ("snlab/serving/step.py", '"kv_spill_slowdown": parts.kv / maximum(parts.kv_hbm_only, 1e-30)',
     "constant 1e-30 -> 2e-30"): _GUARD,
    ("snlab/serving/step.py", '"tokens_per_step": dec.tokens_per_step * np.ones_like(step)',
     "Mult -> Div: dec.tokens_per_step * np.ones_like(step)"): "broadcasts against ones: * or / is the same",
    ("snlab/serving/step.py", '"kv_bytes_per_token": place.kv_per_token * np.ones_like(step)',
     "Mult -> Div: place.kv_per_token * np.ones_like(step)"): "broadcasts against ones: * or / is the same",
    ("snlab/serving/step.py", '"fits": place.weights_fit & (place.unplaced <= 0)', "constant 0 -> 1"): _BYTE,
    ("snlab/training/step.py", "free = maximum(1 - busy / where(comp.per_microbatch > 0, comp.per_microbatch, 1.0)",
     "constant 1.0 -> 2 in where(comp.per_microbatch > 0, comp.per_microbatch, 1.0)"): _GUARD,
    ("snlab/serving/engine.py", "np.searchsorted(CAPTURED_BATCHES, sequences - 1e-9)",
     "constant 1e-09 -> 2e-09"): "a tolerance that lets a batch of exactly a captured size run that size: any small one does",
    ("snlab/serving/engine.py", "return kernel_time(hw, graphs) + cw.roofline_time(flops=0.0", "constant 0.0 -> 1"): _ROOF,
    ("snlab/serving/step.py", "elementwise = cw.roofline_time(flops=0.0", "constant 0.0 -> 1"): _ROOF,
    ("snlab/serving/step.py", "expert_ffn=float(model.moe.expert_ffn_hidden_size if model.moe else 0)",
     "constant 0 -> 1"): "the expert width of a dense model, which has no routed expert to size",
    ("snlab/serving/offline.py", "return dep.kv_fraction * np.maximum(free, 0.0)", "constant 0.0 -> 1"): _BYTE,
    ("snlab/network.py", "switch_power=hw.switch_power * size / np.maximum(hw.scale_up_domain_size, 1.0)",
     "constant 1.0 -> 2"): "guards a division by an empty domain; a torus's domain holds thousands of devices",
    ("snlab/serving/step.py", "utilization = used / maximum(hw.hbm_capacity, 1.0)",
     "constant 1.0 -> 2"): "guards a division by a device with no HBM; every device has gigabytes",
    ("snlab/network.py", "g = topo.group_axes(pair, where(n1 > 1, stride, 1.0), hw)", "constant 1.0 -> 2 in "
     "where(n1 > 1, stride, 1.0)"): "the stride of a group of one, whose inner bandwidth no term uses: neighbours "
                                    "one or two ranks apart both find links",
    ("snlab/serving/step.py", "used = where(w.per_device <= room, kv_memory + w.per_device, maximum(room, 1.0))",
     "constant 1.0 -> 2"): "the floor of a device left no memory: one byte or two of some gigabytes, a fraction "
                           "that fits nothing either way",
    ("snlab/serving/queueing.py", "self.counter = 0", "constant 0 -> 1"):
        "the counter's origin: a request's finish and its context are offsets from the counter when it joined",
    ("snlab/serving/queueing.py", "math.ceil(left / self.svc.tokens_per_step - 1e-9)", "constant 1e-09 -> 2e-09"):
        "a tolerance that lets an exact division count its steps exactly: any small one does",
    ("snlab/network.py", "link_bandwidth\": where(g.injection > 0, g.injection,", "constant 0 -> 1"): _FLAG,
    ("snlab/topology.py", "paths.append(np.maximum(k - 1, 1.0) * axis.links)", "constant 1.0 -> 2"):
        "floors the paths of an axis the group does not use (k = 1), whose terms carry k - 1 = 0",
    ("snlab/topology.py", "cut.append(np.maximum(np.floor(k / 2) * np.ceil(k / 2), 1.0) * axis.links)",
     "constant 1.0 -> 2"): "floors the cut of an axis the group does not use (k = 1), whose term carries min(k - 1, 1) = 0",
}
SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
SECONDS_PER_MUTANT = 20


class Mutant:
    def __init__(self, index: int, line: int, description: str):
        self.index, self.line, self.description = index, line, description


def sites(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """The nodes to mutate inside functions, in source order, with a description."""
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        defaults = {id(n) for d in func.args.defaults + func.args.kw_defaults + func.decorator_list
                    if d is not None for n in ast.walk(d)}
        parents = {id(child): parent for parent in ast.walk(func) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(func):
            if id(node) in defaults:          # a default argument or a decorator's is the caller's choice
                continue
            if isinstance(node, ast.BinOp) and type(node.op) in SWAPS:
                found.append((node, f"{type(node.op).__name__} -> {SWAPS[type(node.op)].__name__}: "
                                    f"{ast.unparse(node)[:70]}"))
            elif isinstance(node, ast.Constant) and type(node.value) in (int, float) \
                    and not isinstance(node.value, bool):
                found.append((node, f"constant {node.value!r} -> {_changed(node.value)!r} in "
                                    f"{ast.unparse(parents.get(id(node), node))[:60]}"))
    unique = {id(n): (n, d) for n, d in found}
    return sorted(unique.values(), key=lambda nd: (nd[0].lineno, nd[0].col_offset, nd[1]))


def _changed(value):
    return 1 if value == 0 else 2 if value == 1 else value * 2


def mutated(tree: ast.Module, k: int) -> ast.Module:
    """A copy of ``tree`` with its k-th site changed."""
    new = copy.deepcopy(tree)
    node, _ = sites(new)[k]
    if isinstance(node, ast.BinOp):
        node.op = SWAPS[type(node.op)]()
    else:
        node.value = type(node.value)(_changed(node.value))
    return ast.fix_missing_locations(new)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _tests(paths: list[str]):
    """The test modules (reloaded, so that their module-level values see the mutant) and
    their test functions."""
    out = []
    for path in paths:
        name = Path(path).stem
        if name in sys.modules:
            module = importlib.reload(sys.modules[name])
        else:
            module = importlib.import_module(name)
        out += [getattr(module, f) for f in dir(module) if f.startswith("test_") and callable(getattr(module, f))]
    return out


def _calls(test):
    """The argument sets of a test: one empty set, or the product of its parametrize
    marks (fixtures other than parameters are not supported here)."""
    import inspect
    import itertools
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
    if not marks:
        return [{}] if not inspect.signature(test).parameters else []
    axes = []
    for mark in marks:
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
        rows = [v.values if hasattr(v, "values") else v for v in mark.args[1]]
        axes.append([dict(zip(names, row if len(names) > 1 else (row,))) for row in rows])
    calls = [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*axes)]
    wanted = set(inspect.signature(test).parameters)
    return [c for c in calls if set(c) == wanted]


def killed(tests_paths: list[str]) -> str | None:
    """The name of the first test that fails, or None."""
    try:
        tests = _tests(tests_paths)
    except Exception as exc:                 # the test module itself cannot be built
        return f"import: {type(exc).__name__}"
    for test in tests:
        for kwargs in _calls(test):
            try:
                test(**kwargs)
            except (_Timeout, KeyboardInterrupt):
                raise
            except BaseException:            # pytest's Failed is not an Exception
                return test.__name__
    return None


def check(path: str, verbose: bool = False) -> list[str]:
    """Run every mutant of the module at ``path``; return the survivors and the stale
    entries of :data:`EQUIVALENT`, described."""
    import numpy as np
    np.seterr(all="ignore")
    source = (ROOT / path).read_text()
    tree = ast.parse(source)
    name = path[:-3].replace("/", ".")
    module = importlib.import_module(name)
    code_original = compile(tree, str(ROOT / path), "exec")
    tests = TARGETS[path]
    assert killed(tests) is None, f"the tests of {path} fail without a mutation"
    survivors = []
    all_sites = sites(tree)
    start = time.perf_counter()
    lines = source.splitlines()
    equivalent = [(fragment, desc) for (module_path, fragment, desc) in EQUIVALENT if module_path == path]
    skipped, matched = 0, set()
    for k, (node, description) in enumerate(all_sites):
        mutant = Mutant(k, node.lineno, description)
        line = lines[node.lineno - 1].strip()
        hits = {(fragment, desc) for fragment, desc in equivalent
                if fragment in line and (desc == description or description.startswith(desc + " in "))}
        if hits:
            matched |= hits
            skipped += 1
            continue
        signal.alarm(SECONDS_PER_MUTANT)
        try:
            exec(compile(mutated(tree, k), str(ROOT / path), "exec"), module.__dict__)
            by = killed(tests)
        except _Timeout:
            by = "timeout"
        except Exception as exc:              # the mutant does not even load
            by = f"load: {type(exc).__name__}"
        finally:
            signal.alarm(0)
            exec(code_original, module.__dict__)
        if by is None:
            survivors.append(mutant)
        if verbose:
            print(f"  {path}:{node.lineno} {description}: {'SURVIVED' if by is None else 'killed by ' + by}")
    took = time.perf_counter() - start
    print(f"{path}: {len(all_sites)} mutants, {skipped} equivalent, {len(all_sites) - skipped - len(survivors)} "
          f"killed, {len(survivors)} survived ({took:.0f} s)")
    problems = [f"SURVIVED {path}:{m.line} {m.description}" for m in survivors]
    problems += [f"STALE equivalent entry {path}: {fragment!r} {desc!r}" for fragment, desc in equivalent
                 if (fragment, desc) not in matched]
    for problem in problems:
        print("  " + problem)
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module files (default: every target)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every mutant")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    signal.signal(signal.SIGALRM, _alarm)
    problems = []
    for path in args.modules or list(TARGETS):
        try:
            problems += check(path, args.verbose)
        except Exception:
            traceback.print_exc()
            return 2
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
