"""``build_table`` against the original algorithm on one MoE plan, in one process.

At ``SCALE`` parameters: ``ShardingPlan`` of the module plans, then ``build_table``
(a plan checks its modules when it is made, so ``build_table`` alone would leave that
work out), against the original on the same plan's dicts; the CPU time of the best of
several interleaved runs with the garbage collector off.

Then the same model planned with a key per layer (``keyed_plan``: ``layers.{i}.*`` for
the norms, ``shared_expert.*.weight`` in each MoE layer), built with the model's FQNs:
thousands of pattern keys, each naming its own layer. Its time against ``build_table``
of the plan spelled out (every key exact) shows the keys are looked up, not each tried
on each FQN. Run alone with ``python -m tests.bench.bench_build [--quick]``.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import attrs

from layout_algebra.algebra import build_table
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.plan import ModulePlan, ShardingPlan
from tests.bench import alone
from tests.bench.baseline import (
    DENSE_AXES,
    EXPERT_AXES,
    MESH_AXES,
    TIED,
    PlainPlan,
    PlainTable,
    fqns_of,
    moe_plan,
    param_count,
    resolve_plan,
    sharding_plan,
)
from tests.bench.targets import record

__all__ = [
    "KEYED_TIME_TARGET",
    "agree",
    "built_anew",
    "built_by_fqn",
    "cpu_timed",
    "keyed_plan",
    "main",
    "retained",
    "run",
    "timed",
    "verdict",
]

KEYED_TIME_TARGET: Final = 1.5
"""A plan with a pattern key per layer against the same plan with every key spelled out."""
SCALE: Final = 100_000
QUICK_SCALE: Final = 10_000

_T = TypeVar("_T")


def built_by_fqn(
    plan: ShardingPlan, dense: Sequence[str], expert: Sequence[str] | None
) -> ParamLayoutTable:
    """``build_table`` of ``plan``: the denominator the lint and reshard benchmarks use."""
    return build_table(plan, dense, expert_axes=expert)


def built_anew(
    plan: ShardingPlan, dense: Sequence[str], expert: Sequence[str] | None
) -> Callable[[], ParamLayoutTable]:
    """``build_table`` of a ``ShardingPlan`` made anew from ``plan``'s module plans, each
    call: a plan checks its modules when it is made, so timing ``build_table`` of a plan
    made once would leave that work out."""
    modules = dict(plan.modules)

    def build() -> ParamLayoutTable:
        made = ShardingPlan(modules, mesh_axes=plan.mesh_axes, tied_pairs=plan.tied_pairs)
        return build_table(made, dense, expert_axes=expert)

    return build


def timed(fn: Callable[[], _T]) -> float:
    """Seconds one call of ``fn`` takes, collected garbage first and the collector off."""
    return _timed(fn, time.perf_counter)


def cpu_timed(fn: Callable[[], _T]) -> float:
    """CPU seconds of this process one call of ``fn`` takes, as ``timed``: for pure
    Python work on both sides, so other work on the machine does not count."""
    return _timed(fn, time.process_time)


def _timed(fn: Callable[[], _T], clock: Callable[[], float]) -> float:
    gc.collect()
    gc.disable()
    try:
        start = clock()
        result = fn()
        elapsed = clock() - start
    finally:
        gc.enable()
    del result
    return elapsed


def retained(fn: Callable[[], _T]) -> int:
    """Bytes still held by what ``fn`` returns, traced while it is built."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.enable()
    del result
    return after - before


def verdict(value: float, target: float) -> str:
    """``PASS`` when ``value`` is within ``target``, else ``MISS``."""
    return "PASS" if value <= target else "MISS"


def agree(ours: ParamLayoutTable, theirs: PlainTable) -> None:
    """Both sides give every parameter the same placements on the same source axes."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for fqn, layout in ours.items():
        placements, key = theirs[fqn]
        assert key is not None
        assert layout.placements == placements, (fqn, layout, placements)
        assert (layout.mesh, tuple(a.name for a in layout.axes)) == key, (fqn, layout, key)


def keyed_plan(plain: PlainPlan) -> tuple[ShardingPlan, int]:
    """``plain`` (a ``moe_plan``) written with pattern keys per layer, and how many there
    are: ``layers.{i}.*`` gives each layer's norms their layout, and each MoE layer's
    ``shared_expert.*.weight`` its shared experts' (``w2`` named exactly, as it differs).
    With the model's FQNs it gives the table of the plan spelled out."""
    modules: dict[str, ModulePlan] = {}
    keys = 0
    for module, spec in plain.items():
        params = spec["params"]
        parent, _, name = module.rpartition(".")
        if name in ("attention_norm", "ffn_norm"):
            modules[f"{parent}.*"] = ModulePlan(params)  # one key for both norms
            keys += name == "ffn_norm"
            continue
        if name == "moe":
            shared = "shared_expert.w1.weight"
            params = {
                **{p: named for p, named in params.items() if not p.startswith("shared_expert")},
                "shared_expert.*.weight": params[shared],
                "shared_expert.w2.weight": params["shared_expert.w2.weight"],
            }
            keys += 1
        modules[module] = ModulePlan(params, expert_parallel=spec["ep_size"] > 0)
    return ShardingPlan(modules, mesh_axes=MESH_AXES, tied_pairs=TIED), keys


@attrs.frozen
class Measured:
    """What one scale measured; times in seconds."""

    params: int
    keys: int
    baseline: float
    ours: float
    spelled: float
    keyed: float


def measure(n: int, repeats: int) -> Measured:
    """Every side at about ``n`` parameters, best of ``repeats`` interleaved runs each."""
    plain = moe_plan(n)
    fqns = tuple(fqns_of(plain))
    plan = sharding_plan(plain)
    keyed, keys = keyed_plan(plain)

    def built(modules: dict[str, ModulePlan]) -> Callable[[], ParamLayoutTable]:
        def build() -> ParamLayoutTable:
            made = ShardingPlan(modules, mesh_axes=MESH_AXES, tied_pairs=TIED)
            return build_table(made, DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)

        return build

    def theirs() -> PlainTable:
        return resolve_plan(plain, DENSE_AXES, expert_axes=EXPERT_AXES, plan_tied_pairs=TIED)

    ours, keyed_build = built_anew(plan, DENSE_AXES, EXPERT_AXES), built(dict(keyed.modules))
    agree(ours(), theirs())
    agree(keyed_build(), theirs())
    sides: dict[str, Callable[[], object]] = {
        "baseline": theirs,
        "ours": ours,
        "spelled": built(dict(plan.modules)),
        "keyed": keyed_build,
    }
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        for name, side in sides.items():
            best[name] = min(best[name], cpu_timed(side))
    return Measured(params=param_count(plain), keys=keys, **best)


def report(m: Measured) -> str:
    """The aligned report; records the pattern keys' target."""
    keyed_ratio = m.keyed / m.spelled
    record("build_table, a pattern key per layer / spelled out", keyed_ratio, KEYED_TIME_TARGET)
    rows = [
        (f"build_table, MoE plan, N={m.params:,}", "target", ""),
        ("  baseline", "", f"{m.baseline:.3f} s"),
        ("  ShardingPlan of module plans + build_table", "", f"{m.ours:.3f} s"),
        ("  its ratio to the baseline", "", f"{m.ours / m.baseline:.2f}"),
        (f"  with FQNs, {m.keys:,} pattern keys, one a layer", "", f"{m.keyed:.3f} s"),
        ("  with FQNs, every key spelled out", "", f"{m.spelled:.3f} s"),
        (
            "  pattern keys / spelled out",
            f"<= {KEYED_TIME_TARGET:.2f}",
            f"{keyed_ratio:.2f} {verdict(keyed_ratio, KEYED_TIME_TARGET)}",
        ),
    ]
    w0, w1, w2 = (max(len(r[i]) for r in rows) for i in range(3))
    return "\n".join(f"{a:<{w0}}  {t:<{w1}}  {v:>{w2}}".rstrip() for a, t, v in rows)


def run(*, quick: bool = False) -> None:
    """Measure and print the report."""
    print(report(measure(QUICK_SCALE if quick else SCALE, repeats=5)))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_build", __doc__, run, argv, smaller="a smaller scale")


if __name__ == "__main__":
    main()
