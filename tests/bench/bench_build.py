"""``build_table`` against the original algorithm on one MoE plan, in one process.

For each scale: the time to build the table (best of several runs, the garbage
collector off for both sides), the memory the result keeps (traced while it is built,
with the module plans already made), and how the cost per parameter grows from the
small scale to the large one. Ours is ``ShardingPlan`` of the module plans, then
``build_table``: a plan checks its modules and finds their kinds when it is made, so
``build_table`` alone would leave that work out. Run alone with
``python -m tests.bench.bench_build [--quick]``.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import attrs

from layout_algebra import algebra
from layout_algebra.algebra import build_table
from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.plan import ShardingPlan
from tests.bench import alone
from tests.bench.baseline import (
    DENSE_AXES,
    EXPERT_AXES,
    TIED,
    PlainPlan,
    PlainTable,
    moe_plan,
    param_count,
    resolve_plan,
    sharding_plan,
)
from tests.bench.targets import record

__all__ = ["Scale", "agree", "built_by_fqn", "main", "measure", "report", "run", "verdict"]

TIME_TARGET: Final = 0.8
MEMORY_TARGET: Final = 0.45
GROWTH_TARGET: Final = 1.1
SCALES: Final = (100_000, 1_000_000)
QUICK_SCALES: Final = (10_000, 100_000)

_T = TypeVar("_T")


def built_by_fqn(
    plan: ShardingPlan, dense: Sequence[str], expert: Sequence[str] | None
) -> ParamLayoutTable:
    """``build_table`` with every entry spelled out by FQN, as it was before it kept a
    plan's entries by module: the denominator the lint and reshard targets were set
    against (both still walk every parameter, while ``build_table`` now walks modules)."""
    dense_mesh, expert_mesh = algebra._meshes(plan, dense, expert, FSDP_OWNED_AXES)
    builder = algebra._Builder(dense_mesh, expert_mesh)
    builder.add_plan(plan)
    return builder.table(plan.tied_pairs)


def built_anew(
    plan: ShardingPlan, dense: Sequence[str], expert: Sequence[str] | None
) -> Callable[[], ParamLayoutTable]:
    """``build_table`` of a ``ShardingPlan`` made anew from ``plan``'s module plans, each
    call: a plan checks its modules and finds their kinds when it is made, so timing
    ``build_table`` of a plan made once would leave that work out."""
    modules = dict(plan.modules)

    def build() -> ParamLayoutTable:
        made = ShardingPlan(modules, mesh_axes=plan.mesh_axes, tied_pairs=plan.tied_pairs)
        return build_table(made, dense, expert_axes=expert)

    return build


def timed(fn: Callable[[], _T]) -> float:
    """Seconds one call of ``fn`` takes, collected garbage first and the collector off."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = fn()
        elapsed = time.perf_counter() - start
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


@attrs.frozen
class Scale:
    """What one scale measured; times in seconds, memory in bytes."""

    params: int
    plan_build: float
    baseline: float
    ours: float
    baseline_bytes: int
    ours_bytes: int
    floor: float
    floor_bytes: int

    @property
    def time_ratio(self) -> float:
        return self.ours / self.baseline

    @property
    def memory_ratio(self) -> float:
        return self.ours_bytes / self.baseline_bytes


def agree(ours: ParamLayoutTable, theirs: PlainTable) -> None:
    """Both sides give every parameter the same placements on the same source axes."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for fqn, layout in ours.items():
        placements, key = theirs[fqn]
        assert key is not None
        assert layout.placements == placements, (fqn, layout, placements)
        assert (layout.mesh, tuple(a.name for a in layout.axes)) == key, (fqn, layout, key)


def measure(n: int, repeats: int) -> Scale:
    """Both sides on a plan of about ``n`` parameters, best of ``repeats`` runs each."""
    plain: PlainPlan = moe_plan(n)
    plan_build = min(timed(lambda: sharding_plan(plain)) for _ in range(max(1, repeats // 2)))
    plan: ShardingPlan = sharding_plan(plain)
    ours = built_anew(plan, DENSE_AXES, EXPERT_AXES)

    def theirs() -> PlainTable:
        return resolve_plan(plain, DENSE_AXES, expert_axes=EXPERT_AXES, plan_tied_pairs=TIED)

    def floor() -> dict[str, None]:
        # What any table keyed by FQN costs: spell each FQN and insert it into a dict.
        out: dict[str, None] = {}
        for module, spec in plain.items():
            prefix = f"{module}."
            for path in spec["params"]:
                out[prefix + path] = None
        return out

    agree(ours(), theirs())
    baseline_best = ours_best = floor_best = float("inf")
    for _ in range(repeats):  # interleaved, so all three see the same machine
        baseline_best = min(baseline_best, timed(theirs))
        ours_best = min(ours_best, timed(ours))
        floor_best = min(floor_best, timed(floor))
    return Scale(
        params=param_count(plain),
        plan_build=plan_build,
        baseline=baseline_best,
        ours=ours_best,
        baseline_bytes=retained(theirs),
        ours_bytes=retained(ours),
        floor=floor_best,
        floor_bytes=retained(floor),
    )


def report(small: Scale, large: Scale) -> tuple[str, int, int]:
    """The aligned report, how many targets were met and how many there are."""
    rows: list[tuple[str, str, str, str]] = []
    met = 0

    def row(label: str, target: str, a: str, b: str) -> None:
        rows.append((label, target, a, b))

    def check(label: str, target: float, a: float, b: float) -> None:
        nonlocal met
        met += (a <= target) + (b <= target)
        record(f"build_table, {label.strip()}, large", b, target)
        row(
            label,
            f"<= {target:.2f}",
            f"{a:.2f} {verdict(a, target)}",
            f"{b:.2f} {verdict(b, target)}",
        )

    row("build_table, MoE plan", "target", f"N={small.params:,}", f"N={large.params:,}")
    row("  ShardingPlan construction", "", f"{small.plan_build:.3f} s", f"{large.plan_build:.3f} s")
    row("  baseline time", "", f"{small.baseline:.3f} s", f"{large.baseline:.3f} s")
    row(
        "  ShardingPlan of module plans + build_table",
        "",
        f"{small.ours:.3f} s",
        f"{large.ours:.3f} s",
    )
    check("  time ratio", TIME_TARGET, small.time_ratio, large.time_ratio)
    row("  baseline retained", "", _mb(small.baseline_bytes), _mb(large.baseline_bytes))
    row("  table retained", "", _mb(small.ours_bytes), _mb(large.ours_bytes))
    check("  memory ratio", MEMORY_TARGET, small.memory_ratio, large.memory_ratio)
    row("  for scale: FQN dict alone", "", _mb(small.floor_bytes), _mb(large.floor_bytes))
    row(
        "  its retained / baseline's",
        "",
        f"{small.floor_bytes / small.baseline_bytes:.2f}",
        f"{large.floor_bytes / large.baseline_bytes:.2f}",
    )
    per_small = small.ours / small.params
    per_large = large.ours / large.params
    growth = per_large / per_small
    met += growth <= GROWTH_TARGET
    base_growth = (large.baseline / large.params) / (small.baseline / small.params)
    floor_growth = (large.floor / large.params) / (small.floor / small.params)
    record(
        "per-entry growth, build_table",
        growth,
        GROWTH_TARGET,
        f"baseline's own {base_growth:.2f}, an FQN dict's {floor_growth:.2f}",
    )
    row("  per-entry cost", "", f"{per_small * 1e9:.0f} ns", f"{per_large * 1e9:.0f} ns")
    row(
        "  per-entry growth, large/small",
        f"<= {GROWTH_TARGET:.2f}",
        "",
        f"{growth:.2f} {verdict(growth, GROWTH_TARGET)}",
    )
    floor_small, floor_large = small.floor / small.params, large.floor / large.params
    row(
        "  for scale: FQN dict alone",
        "",
        f"{floor_small * 1e9:.0f} ns",
        f"{floor_large * 1e9:.0f} ns",
    )
    row("  its growth, large/small", "", "", f"{floor_large / floor_small:.2f}")
    row("  the baseline's own growth", "", "", f"{base_growth:.2f}")
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    w0, w1, w2, w3 = widths
    lines = [f"{a:<{w0}}  {t:<{w1}}  {s:>{w2}}  {g:>{w3}}".rstrip() for a, t, s, g in rows]
    return "\n".join(lines), met, 5


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def run(*, quick: bool = False) -> tuple[int, int]:
    """Measure both scales and print the report; how many targets were met, of how many."""
    small_n, large_n = QUICK_SCALES if quick else SCALES
    small = measure(small_n, repeats=7)
    large = measure(large_n, repeats=3 if quick else 5)
    text, met, total = report(small, large)
    print(text)
    return met, total


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_build", __doc__, run, argv, smaller="smaller scales")


if __name__ == "__main__":
    main()
