"""Completing and tying a table kept apart, against the same table spelled out by FQN.

A planner's table rarely ends at ``build_table``: ``complete_default`` gives the
parameters the plan does not name their default layout, and ``merge_tied`` ties what
shares storage. ``build_table`` keeps a plan's entries by module (``ByModule``) or, for a
plan by pattern, listed (``Listed``); each is measured here against the same call on the
very same entries spelled out by FQN first (what it did before), and, for scale, on a
table that holds them in a dict by FQN already (as one given its entries by FQN does),
in one process, best of several interleaved runs with the garbage collector off:

- ``complete_default`` with the model's FQNs, of the MoE plan's table by module
  (``baseline.moe_plan``) and listed (``baseline.pattern_plan`` with the model's FQNs);
- the same for the plan by pattern without its norm keys, whose 2 norms a layer (and the
  final one) are then completed as plain parameters (``plain=True``), as
  transformers' and torch's plans leave them;
- ``merge_tied`` of the embedding and the output head (``baseline.TIED``) into each.

Run alone with ``python -m tests.bench.bench_complete [--quick]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Final

import attrs

from layout_algebra.algebra import build_table, complete_default, merge_tied
from layout_algebra.layout import ParamLayoutTable, _CheckedEntries
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
from tests.bench.bench_build import timed

__all__ = ["Row", "main", "measure", "run"]

SCALES: Final = (100_000, 1_000_000)
QUICK_SCALES: Final = (10_000, 100_000)


@attrs.frozen
class Row:
    """One measure at one scale, in seconds: of the table kept apart, of it spelled out by
    FQN and then the call, and of the call on a table by FQN already."""

    label: str
    kept: float
    spelled: float
    by_fqn: float


def _spelled(table: ParamLayoutTable) -> ParamLayoutTable:
    """The same entries and groups in a dict by FQN, taken as checked (they are), as the
    calls spelled a table out before they kept it apart."""
    entries = _CheckedEntries(table.items())
    return ParamLayoutTable(entries, tied=table.tied, dropped=table.dropped)


_Call = Callable[[ParamLayoutTable], Callable[[], object]]


def _spelled_then(call: _Call, table: ParamLayoutTable) -> object:
    """``call`` on ``table`` spelled out by FQN first."""
    return call(_spelled(table))()


def measure(n: int, repeats: int) -> tuple[int, list[Row]]:
    """Every measure at about ``n`` parameters, best of ``repeats`` runs each."""
    plain = moe_plan(n)
    fqns = fqns_of(plain)
    by_module = build_table(sharding_plan(plain), DENSE_AXES, expert_axes=EXPERT_AXES)
    listed = build_table(pattern_plan(), DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)
    plan = pattern_plan()
    no_norms = ShardingPlan(
        {key: spec for key, spec in plan.modules.items() if "norm" not in key},
        mesh_axes=plan.mesh_axes,
        tied_pairs=plan.tied_pairs,
    )
    unnamed = build_table(no_norms, DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)
    assert len(unnamed) < len(fqns)

    def complete(table: ParamLayoutTable, *, plain: bool = False) -> Callable[[], object]:
        return lambda: complete_default(table, fqns, DENSE_AXES, plain=plain)

    def tie(table: ParamLayoutTable) -> Callable[[], object]:
        return lambda: merge_tied(table, TIED)

    cases: list[tuple[str, ParamLayoutTable, _Call]]
    cases = [
        ("complete_default, by module", by_module, complete),
        ("complete_default, listed", listed, complete),
        ("complete_default, listed, norms left plain", unnamed, lambda t: complete(t, plain=True)),
        ("merge_tied, by module", by_module, tie),
        ("merge_tied, listed", listed, tie),
    ]
    rows = []
    for label, table, call in cases:
        kept, by_fqn = call(table), call(_spelled(table))
        spelled = partial(_spelled_then, call, table)
        assert kept() == by_fqn()
        best = [float("inf")] * 3
        for _ in range(repeats):  # interleaved, so every side sees the same machine
            best[0] = min(best[0], timed(kept))
            best[1] = min(best[1], timed(spelled))
            best[2] = min(best[2], timed(by_fqn))
        rows.append(Row(label, *best))
    return len(fqns), rows


def report(small: tuple[int, list[Row]], large: tuple[int, list[Row]]) -> str:
    """The aligned report: each measure's times and ratio at both scales."""
    lines = [("completing and tying a kept table", f"N={small[0]:,}", f"N={large[0]:,}")]
    for a, b in zip(small[1], large[1], strict=True):
        lines.append((f"  {a.label}", f"{a.kept:.3f} s", f"{b.kept:.3f} s"))
        lines.append(
            ("    spelled out by FQN, then it", f"{a.spelled:.3f} s", f"{b.spelled:.3f} s")
        )
        lines.append(
            ("    kept / spelled out", f"{a.kept / a.spelled:.2f}", f"{b.kept / b.spelled:.2f}")
        )
        lines.append(
            ("    for scale: a table by FQN already", f"{a.by_fqn:.3f} s", f"{b.by_fqn:.3f} s")
        )
    w0, w1, w2 = (max(len(line[i]) for line in lines) for i in range(3))
    return "\n".join(f"{a:<{w0}}  {s:>{w1}}  {g:>{w2}}" for a, s, g in lines)


def run(*, quick: bool = False) -> None:
    """Measure both scales and print the report."""
    small_n, large_n = QUICK_SCALES if quick else SCALES
    print(report(measure(small_n, repeats=5), measure(large_n, repeats=3)))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_complete", __doc__, run, argv, smaller="smaller scales")


if __name__ == "__main__":
    main()
