"""From the planner's dicts to a checked table, against the original algorithm on the same dicts.

Three workloads of the MoE model (``baseline.moe_plan``):

- *fresh dicts*: the planner writes a new dict with new placements for every parameter
  (``baseline.fresh_moe_plan``, 64 experts); ours is ``ShardingPlan`` from the dicts,
  then ``build_table``; the original does the whole job on the same dicts;
- *reused dicts*: the same with one dict per layout reused for every parameter laid out
  alike (``baseline.moe_plan``);
- *pattern plan*: the model written once by pattern (``baseline.pattern_plan``, 7 module
  keys) and its parameter FQNs, to a table with ``build_table(..., fqns=)``; the original
  runs on the plan spelled out one entry per parameter, as it needs it.

The targets: at ``TARGET_SCALE`` parameters, each of the first two no slower than the
original; from the smallest scale to the largest, the cost per parameter grows no faster
than the original's own. Times are the CPU time of this process (both sides are pure
Python, so other work on the machine does not count), the best of several interleaved
runs with the garbage collector off. Run alone with ``python -m tests.bench.bench_e2e [--quick]``.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import attrs

from layout_algebra.algebra import build_table
from layout_algebra.layout import ParamLayoutTable
from tests.bench import alone
from tests.bench.baseline import (
    DENSE_AXES,
    EXPERT_AXES,
    TIED,
    PlainPlan,
    PlainTable,
    fqns_of,
    fresh_moe_plan,
    moe_plan,
    param_count,
    pattern_plan,
    resolve_plan,
    sharding_plan,
)
from tests.bench.bench_build import agree, cpu_timed
from tests.bench.targets import record

__all__ = ["E2E_TARGET", "SCALES", "Scale", "main", "measure", "peak", "report", "run"]

E2E_TARGET: Final = 1.0
"""Planner dicts -> ``ShardingPlan`` -> ``build_table`` over the original, at TARGET_SCALE."""
SCALES: Final = (10_000, 100_000, 1_000_000)
"""The growth is measured from the first to the last; the targets at the middle one."""
QUICK_SCALES: Final = (1_000, 10_000, 100_000)

_T = TypeVar("_T")


def peak(fn: Callable[[], _T]) -> int:
    """The most bytes traced at once above the start while ``fn`` runs."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        top = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        gc.enable()
    del result
    return top - before


@attrs.frozen
class Scale:
    """The best time of each side of each workload at one scale, in seconds."""

    params: int
    fresh_theirs: float
    fresh_ours: float
    reused_theirs: float
    reused_ours: float
    pattern_ours: float


def measure(n: int, repeats: int) -> Scale:
    """Every workload at about ``n`` parameters, best of ``repeats`` runs each."""
    fresh: PlainPlan = fresh_moe_plan(n)
    reused: PlainPlan = moe_plan(n)
    fqns = fqns_of(reused)

    def theirs(plain: PlainPlan) -> Callable[[], PlainTable]:
        return lambda: resolve_plan(
            plain, DENSE_AXES, expert_axes=EXPERT_AXES, plan_tied_pairs=TIED
        )

    def ours(plain: PlainPlan) -> Callable[[], ParamLayoutTable]:
        return lambda: build_table(sharding_plan(plain), DENSE_AXES, expert_axes=EXPERT_AXES)

    def by_pattern() -> ParamLayoutTable:
        return build_table(pattern_plan(), DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)

    agree(ours(fresh)(), theirs(fresh)())
    agree(ours(reused)(), theirs(reused)())
    table = by_pattern()
    agree(table, theirs(reused)())
    assert list(table) == fqns
    sides = {
        "fresh_theirs": theirs(fresh),
        "fresh_ours": ours(fresh),
        "reused_theirs": theirs(reused),
        "reused_ours": ours(reused),
        "pattern_ours": by_pattern,
    }
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        for name, side in sides.items():
            best[name] = min(best[name], cpu_timed(side))
    return Scale(params=param_count(fresh), **best)


def report(scales: Sequence[Scale], at: int) -> str:
    """The aligned report; records the targets: the ratios at ``scales[at]`` and the
    growth from the first scale to the last against the original's own."""
    rows: list[tuple[str, ...]] = [
        ("planner dicts -> table, MoE plan", "target", *(f"N={s.params:,}" for s in scales))
    ]
    workloads = (
        ("fresh dicts", "fresh_ours", "fresh_theirs", True),
        ("reused dicts", "reused_ours", "reused_theirs", True),
        ("pattern plan + FQNs", "pattern_ours", "reused_theirs", False),
    )
    first, last = scales[0], scales[-1]
    for label, ours, theirs, targeted in workloads:
        rows.append((f"  baseline, {label}", "", *(f"{getattr(s, theirs):.3f} s" for s in scales)))
        rows.append((f"  ours, {label}", "", *(f"{getattr(s, ours):.3f} s" for s in scales)))
        ratios = [getattr(s, ours) / getattr(s, theirs) for s in scales]
        target = f"<= {E2E_TARGET:.2f}" if targeted else ""
        rows.append((f"  ours / baseline, {label}", target, *(f"{r:.2f}" for r in ratios)))
        if targeted:
            record(f"{label} -> table / baseline, N={scales[at].params:,}", ratios[at], E2E_TARGET)
        mine = (getattr(last, ours) / last.params) / (getattr(first, ours) / first.params)
        base = (getattr(last, theirs) / last.params) / (getattr(first, theirs) / first.params)
        if targeted:
            record(f"per-entry growth, {label} -> table", mine, base, "target: the baseline's own")
        rows.append((f"  per-entry growth, {label}", f"<= {base:.2f}", "", "", f"{mine:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )


def run(*, quick: bool = False) -> None:
    """Measure every scale and print the report (its targets go to ``targets.RESULTS``)."""
    scales = QUICK_SCALES if quick else SCALES
    measured = [measure(n, repeats=r) for n, r in zip(scales, (9, 7, 3), strict=True)]
    print(report(measured, at=1))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_e2e", __doc__, run, argv, smaller="smaller scales")


if __name__ == "__main__":
    main()
