"""Completing and tying a built table, against building it, in one process.

A planner's table rarely ends at ``build_table``: ``complete_default`` gives the
parameters the plan does not name their default layout, and ``merge_tied`` ties what
shares storage. Each is measured at ``SCALE`` parameters on the table of the MoE plan
(``baseline.moe_plan``) and of the same model by pattern (``baseline.pattern_plan``
with the model's FQNs), and on the plan by pattern without its norm keys, whose norms
are then completed as plain parameters (``plain=True``), beside the time
``build_table`` took; the CPU time of the best of several interleaved runs with the
garbage collector off.
Run alone with ``python -m tests.bench.bench_complete [--quick]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

from layout_algebra.algebra import build_table, complete_default, merge_tied
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.plan import ShardingPlan
from tests.bench import alone
from tests.bench.baseline import (
    DENSE_AXES,
    EXPERT_AXES,
    TIED,
    fqns_of,
    moe_plan,
    pattern_plan,
    sharding_plan,
)
from tests.bench.bench_build import cpu_timed

__all__ = ["SCALE", "main", "measure", "run"]

SCALE: Final = 100_000
QUICK_SCALE: Final = 10_000


def measure(n: int, repeats: int) -> tuple[int, list[tuple[str, float, float]]]:
    """Every measure at about ``n`` parameters, best of ``repeats`` runs each: its label,
    its time and the time of the ``build_table`` that made its table."""
    plain = moe_plan(n)
    fqns = fqns_of(plain)
    plan = pattern_plan()
    no_norms = ShardingPlan(
        {key: spec for key, spec in plan.modules.items() if "norm" not in key},
        mesh_axes=plan.mesh_axes,
        tied_pairs=plan.tied_pairs,
    )
    builds: dict[str, Callable[[], ParamLayoutTable]] = {
        "by module": lambda: build_table(sharding_plan(plain), DENSE_AXES, expert_axes=EXPERT_AXES),
        "by pattern": lambda: build_table(plan, DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns),
        "by pattern, norms left plain": lambda: build_table(
            no_norms, DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns
        ),
    }
    tables = {label: build() for label, build in builds.items()}
    assert len(tables["by pattern, norms left plain"]) < len(fqns)
    cases: list[tuple[str, str, Callable[[], object]]] = [
        (
            f"complete_default, {label}",
            label,
            partial(complete_default, table, fqns, DENSE_AXES, plain="plain" in label),
        )
        for label, table in tables.items()
    ]
    cases += [
        (f"merge_tied, {label}", label, partial(merge_tied, tables[label], TIED))
        for label in ("by module", "by pattern")
    ]
    best = {label: float("inf") for label in [*builds, *(c[0] for c in cases)]}
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        for label, build in builds.items():
            best[label] = min(best[label], cpu_timed(build))
        for label, _, call in cases:
            best[label] = min(best[label], cpu_timed(call))
    return len(fqns), [(label, best[label], best[built]) for label, built, _ in cases]


def report(n: int, rows: list[tuple[str, float, float]]) -> str:
    """The aligned report: each measure's time and its ratio to the build."""
    lines = [(f"completing and tying a built table, N={n:,}", "time", "/ build_table")]
    lines.extend((f"  {label}", f"{t:.3f} s", f"{t / built:.2f}") for label, t, built in rows)
    w0, w1, w2 = (max(len(line[i]) for line in lines) for i in range(3))
    return "\n".join(f"{a:<{w0}}  {s:>{w1}}  {g:>{w2}}" for a, s, g in lines)


def run(*, quick: bool = False) -> None:
    """Measure and print the report."""
    print(report(*measure(QUICK_SCALE if quick else SCALE, repeats=5)))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_complete", __doc__, run, argv, smaller="a smaller scale")


if __name__ == "__main__":
    main()
