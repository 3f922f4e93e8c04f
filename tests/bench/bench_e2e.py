"""From the planner's dicts to a checked table, against the original algorithm on the same dicts.

Three workloads of the MoE model (``baseline.moe_plan``), each at two scales:

- *fresh dicts*: the planner writes a new dict with new placements for every parameter
  (``baseline.fresh_moe_plan``, 64 experts); ours is ``ShardingPlan`` from the dicts,
  then ``build_table``; the original does the whole job on the same dicts;
- *reused dicts*: the same with one dict per layout kind reused for every parameter laid
  out alike (``baseline.moe_plan``);
- *pattern plan*: the model written once by pattern (``baseline.pattern_plan``, 7 module
  keys) and its parameter FQNs, to a table with ``build_table(..., fqns=)``; the original
  runs on the plan spelled out one entry per parameter, as it needs it.

Times are the best of several interleaved runs with the garbage collector off; memory
is traced with ``tracemalloc`` (what the result keeps, and the peak while it is built).
Per-entry growth is the cost per parameter at the large scale over the small one, with
the original's own growth beside it. Run alone with
``python -m tests.bench.bench_e2e [--quick]``.
"""

from __future__ import annotations

import copy
import gc
import inspect
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter, methodcaller
from typing import ClassVar, Final, TypeVar

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
from tests.bench.bench_build import agree, retained, timed
from tests.bench.targets import record

__all__ = ["E2E_TARGET", "GROWTH_TARGET", "PATTERN_TARGET", "Scale", "main", "measure", "run"]

E2E_TARGET: Final = 0.3
PATTERN_TARGET: Final = 0.3
GROWTH_TARGET: Final = 1.1
SCALES: Final = (100_000, 1_000_000)
QUICK_SCALES: Final = (10_000, 100_000)

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


def has_patterns() -> bool:
    """Whether ``build_table`` takes the model's FQNs (plans by pattern)."""
    return "fqns" in inspect.signature(build_table).parameters


class _Reader:
    """A constructor that reads its params and keeps nothing: the floor for a plan made
    of one value per module from a planner's new dicts."""

    __slots__ = ()
    kinds: ClassVar[dict[int, object]] = {}  # one module's params per size, copied before

    def __new__(cls, params: Mapping[str, object], *, expert_parallel: bool = False) -> _Reader:
        params == cls.kinds.get(len(params))  # noqa: B015  # read by value, at C speed
        return _READER


_READER: Final = object.__new__(_Reader)


def floor(plain: PlainPlan) -> dict[str, object]:
    """What the planner's loop of ``sharding_plan`` costs with a constructor per module
    that only compares the module's new params dict by value, at C speed, with a copy of
    one of its kind (made beforehand) and keeps nothing: a frozen plan must read every
    new dict, and this is the cheapest read (no copy, no allocation), before anything is
    checked or kept and before any table exists."""
    modules: dict[str, object] = {}
    for module, spec in plain.items():
        modules[module] = _Reader(spec["params"], expert_parallel=spec["ep_size"] > 0)
    return modules


def checked_floor(plain: PlainPlan) -> tuple[dict[str, object], bool, set[int]]:
    """``floor``, then what a frozen plan of those module plans must do with them, each a
    C-speed pass over the module keys or values and nothing more: keep its own copy of
    the dict (the planner's may change), check that every key is a plain ``str`` and
    that, joined, they hold no empty segment (and say whether any holds ``*``), and find
    the distinct module plans (each resolved once, the table kept by module)."""
    modules = floor(plain)
    kept = dict(modules)
    joined = ".".join(modules)
    ok = (
        set(map(type, modules)) == {str}
        and ".." not in joined
        and not joined.startswith(".")
        and not joined.endswith(".")
        and "*" not in joined
    )
    return kept, ok, set(map(id, modules.values()))


def prepare_floor(plain: PlainPlan) -> None:
    """The copies ``floor`` compares with: one module's params per size, deep-copied."""
    _Reader.kinds.clear()
    for spec in plain.values():
        params = spec["params"]
        _Reader.kinds.setdefault(len(params), copy.deepcopy(dict(params)))


_SPLIT: Final = methodcaller("split", ".", 2)
_ENDS: Final = itemgetter(0, -1)


def pattern_floor(fqns: list[str]) -> tuple[list[object], int]:
    """What classifying the FQNs costs, from a plan by pattern, before any table: each
    FQN split at its first two dots (where ``layers.*.attention`` tells one layer from
    another: the fewest splits any matcher of these keys needs) and looked up once by
    its first and last parts, at C speed with no Python loop; then the one set of the
    FQNs that tells whether any is given twice (as a table must know)."""
    known = dict.fromkeys(map(_ENDS, map(_SPLIT, fqns[:64])))
    return list(map(known.get, map(_ENDS, map(_SPLIT, fqns)))), len(set(fqns))


@attrs.frozen
class Scale:
    """What one scale measured; times in seconds, memory in bytes (None: not measured)."""

    params: int
    fresh_theirs: float
    fresh_ours: float
    reused_theirs: float
    reused_ours: float
    fresh_floor: float
    checked_floor: float
    pattern_floor: float
    pattern_ours: float | None
    theirs_bytes: int
    ours_bytes: int
    theirs_peak: int
    ours_peak: int


def measure(n: int, repeats: int) -> Scale:
    """Every workload at about ``n`` parameters, best of ``repeats`` runs each."""
    fresh: PlainPlan = fresh_moe_plan(n)
    reused: PlainPlan = moe_plan(n)
    fqns = fqns_of(reused)
    patterns = has_patterns()

    def theirs(plain: PlainPlan) -> Callable[[], PlainTable]:
        return lambda: resolve_plan(
            plain, DENSE_AXES, expert_axes=EXPERT_AXES, plan_tied_pairs=TIED
        )

    def ours(plain: PlainPlan) -> Callable[[], ParamLayoutTable]:
        return lambda: build_table(sharding_plan(plain), DENSE_AXES, expert_axes=EXPERT_AXES)

    def by_pattern() -> ParamLayoutTable:
        build: Callable[..., ParamLayoutTable] = build_table
        return build(pattern_plan(), DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)

    agree(ours(fresh)(), theirs(fresh)())
    agree(ours(reused)(), theirs(reused)())
    if patterns:
        table = by_pattern()
        agree(table, theirs(reused)())
        assert list(table) == fqns
    prepare_floor(fresh)
    best = dict.fromkeys(("ft", "fo", "rt", "ro", "po", "ff", "cf", "pf"), float("inf"))
    for _ in range(repeats):  # interleaved, so every side sees the same machine
        best["ft"] = min(best["ft"], timed(theirs(fresh)))
        best["fo"] = min(best["fo"], timed(ours(fresh)))
        best["rt"] = min(best["rt"], timed(theirs(reused)))
        best["ro"] = min(best["ro"], timed(ours(reused)))
        best["ff"] = min(best["ff"], timed(lambda: floor(fresh)))
        best["cf"] = min(best["cf"], timed(lambda: checked_floor(fresh)))
        best["pf"] = min(best["pf"], timed(lambda: pattern_floor(fqns)))
        if patterns:
            best["po"] = min(best["po"], timed(by_pattern))
    return Scale(
        params=param_count(fresh),
        fresh_theirs=best["ft"],
        fresh_ours=best["fo"],
        reused_theirs=best["rt"],
        reused_ours=best["ro"],
        fresh_floor=best["ff"],
        checked_floor=best["cf"],
        pattern_floor=best["pf"],
        pattern_ours=best["po"] if patterns else None,
        theirs_bytes=retained(theirs(fresh)),
        ours_bytes=retained(ours(fresh)),
        theirs_peak=peak(theirs(fresh)),
        ours_peak=peak(ours(fresh)),
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _ratio(
    label: str, target: float, ours: float, theirs: float, *, keep: bool, note: str = ""
) -> str:
    ratio = ours / theirs
    if keep:
        record(label, ratio, target, note)
    return f"{ratio:.2f} {'PASS' if ratio <= target else 'MISS'}"


def report(small: Scale, large: Scale) -> str:
    """The aligned report; records the targets (the large scale's ratios, every growth)."""
    rows: list[tuple[str, str, str, str]] = [
        ("planner dicts -> table, MoE plan", "target", f"N={small.params:,}", f"N={large.params:,}")
    ]

    def times(label: str, a: float, b: float) -> None:
        rows.append((label, "", f"{a:.3f} s", f"{b:.3f} s"))

    def ratios(
        label: str,
        target: float,
        ours: tuple[float, float],
        theirs: tuple[float, float],
        *,
        keep: bool = True,
        note: str = "",
    ) -> None:
        large_label = f"{label.strip()}, large"
        rows.append(
            (
                label,
                f"<= {target:.2f}",
                _ratio(label, target, ours[0], theirs[0], keep=False),
                _ratio(large_label, target, ours[1], theirs[1], keep=keep, note=note),
            )
        )

    def floor_rows(label: str, floors: tuple[float, float], theirs: tuple[float, float]) -> None:
        times(label, *floors)
        small_ratio, large_ratio = (f"{f / t:.2f}" for f, t in zip(floors, theirs, strict=True))
        rows.append(("  floor / baseline", "", small_ratio, large_ratio))

    def growth(label: str, ours: tuple[float, float], theirs: tuple[float, float]) -> None:
        mine = (ours[1] / large.params) / (ours[0] / small.params)
        base = (theirs[1] / large.params) / (theirs[0] / small.params)
        verdict = "PASS" if mine <= GROWTH_TARGET else "MISS"
        record(f"per-entry growth, {label}", mine, GROWTH_TARGET, f"baseline's own {base:.2f}")
        rows.append(
            (f"  per-entry growth, {label}", f"<= {GROWTH_TARGET:.2f}", "", f"{mine:.2f} {verdict}")
        )
        rows.append(("    the baseline's own growth", "", "", f"{base:.2f}"))

    fresh_t = (small.fresh_theirs, large.fresh_theirs)
    fresh_o = (small.fresh_ours, large.fresh_ours)
    reused_t = (small.reused_theirs, large.reused_theirs)
    reused_o = (small.reused_ours, large.reused_ours)
    times("  baseline, fresh dicts", *fresh_t)
    times("  ShardingPlan + build_table, fresh dicts", *fresh_o)
    ratios(
        "  fresh dicts -> table / baseline",
        E2E_TARGET,
        fresh_o,
        fresh_t,
        note=(
            f"reading-constructor floor {large.fresh_floor / large.fresh_theirs:.2f}, with "
            f"a frozen plan's checks {large.checked_floor / large.fresh_theirs:.2f}"
        ),
    )
    floor_rows(
        "  floor: a constructor reading its dicts", (small.fresh_floor, large.fresh_floor), fresh_t
    )
    floor_rows(
        "  floor: and a frozen plan's checks", (small.checked_floor, large.checked_floor), fresh_t
    )
    times("  baseline, reused dicts", *reused_t)
    times("  ShardingPlan + build_table, reused dicts", *reused_o)
    ratios("  reused dicts -> table / baseline", E2E_TARGET, reused_o, reused_t, keep=False)
    if small.pattern_ours is not None and large.pattern_ours is not None:
        pattern_o = (small.pattern_ours, large.pattern_ours)
        times("  pattern plan + FQNs -> table", *pattern_o)
        ratios(
            "  pattern plan -> table / baseline",
            PATTERN_TARGET,
            pattern_o,
            reused_t,
            note=f"classify-and-count floor {large.pattern_floor / large.reused_theirs:.2f}",
        )
        floor_rows(
            "  floor: each FQN split at 2 dots, looked up; a set",
            (small.pattern_floor, large.pattern_floor),
            reused_t,
        )
    else:
        rows.append(("  pattern plan -> table", "", "", "(build_table takes no fqns=)"))
    rows.append(("  retained, baseline", "", _mb(small.theirs_bytes), _mb(large.theirs_bytes)))
    rows.append(("  retained, table", "", _mb(small.ours_bytes), _mb(large.ours_bytes)))
    rows.append(
        (
            "  retained, table / baseline",
            "",
            f"{small.ours_bytes / small.theirs_bytes:.2f}",
            f"{large.ours_bytes / large.theirs_bytes:.2f}",
        )
    )
    rows.append(("  peak, baseline", "", _mb(small.theirs_peak), _mb(large.theirs_peak)))
    rows.append(("  peak, dicts -> table", "", _mb(small.ours_peak), _mb(large.ours_peak)))
    growth("fresh dicts -> table", fresh_o, fresh_t)
    growth("reused dicts -> table", reused_o, reused_t)
    if small.pattern_ours is not None and large.pattern_ours is not None:
        growth("pattern plan -> table", (small.pattern_ours, large.pattern_ours), reused_t)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    w0, w1, w2, w3 = widths
    return "\n".join(f"{a:<{w0}}  {t:<{w1}}  {s:>{w2}}  {g:>{w3}}".rstrip() for a, t, s, g in rows)


def run(*, quick: bool = False) -> None:
    """Measure both scales and print the report (its targets go to ``targets.RESULTS``)."""
    small_n, large_n = QUICK_SCALES if quick else SCALES
    small = measure(small_n, repeats=5)
    large = measure(large_n, repeats=3)
    print(report(small, large))


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_e2e", __doc__, run, argv, smaller="smaller scales")


if __name__ == "__main__":
    main()
