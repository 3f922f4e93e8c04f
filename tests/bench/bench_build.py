"""``build_table`` against the original algorithm on one MoE plan, in one process.

For each scale: the time to build the table (best of several runs, the garbage
collector off for both sides), the memory the result keeps (traced while it is built,
with the module plans already made), and how the cost per parameter grows from the
small scale to the large one. Ours is ``ShardingPlan`` of the module plans, then
``build_table``: a plan checks its modules and finds their kinds when it is made, so
``build_table`` alone would leave that work out.

Then the same model planned with a key per layer (``keyed_plan``: ``layers.{i}.*`` for
the norms, ``shared_expert.*.weight`` in each MoE layer), built with the model's FQNs:
thousands of pattern keys, each naming its own layer. Its time against the original on
the plan spelled out per parameter, and its per-entry growth, show the keys are looked
up, not each tried on each FQN. Run alone with
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
    "KeyedScale",
    "Scale",
    "agree",
    "built_by_fqn",
    "keyed_plan",
    "main",
    "measure",
    "measure_keyed",
    "report",
    "report_keyed",
    "run",
    "verdict",
]

TIME_TARGET: Final = 0.8
KEYED_TIME_TARGET: Final = 1.5
"""A plan with a pattern key per layer against the same plan with every key spelled out."""
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
class KeyedScale:
    """What one scale of the plan with a key per layer measured; times in seconds."""

    params: int
    keys: int
    baseline: float
    spelled: float
    ours: float

    @property
    def time_ratio(self) -> float:
        return self.ours / self.baseline

    @property
    def spelled_ratio(self) -> float:
        return self.ours / self.spelled


def measure_keyed(n: int, repeats: int) -> KeyedScale:
    """``build_table`` of ``keyed_plan`` with the model's FQNs against the original on
    the plan spelled out, and against ``build_table`` of the plan spelled out (every
    key exact) with the same FQNs, about ``n`` parameters; both plans made anew each run."""
    plain = moe_plan(n)
    fqns = tuple(fqns_of(plain))
    plan, keys = keyed_plan(plain)
    keyed_modules = dict(plan.modules)
    spelled_modules = dict(sharding_plan(plain).modules)

    def built(modules: dict[str, ModulePlan]) -> Callable[[], ParamLayoutTable]:
        def build() -> ParamLayoutTable:
            made = ShardingPlan(modules, mesh_axes=MESH_AXES, tied_pairs=TIED)
            return build_table(made, DENSE_AXES, expert_axes=EXPERT_AXES, fqns=fqns)

        return build

    ours, spelled = built(keyed_modules), built(spelled_modules)

    def theirs() -> PlainTable:
        return resolve_plan(plain, DENSE_AXES, expert_axes=EXPERT_AXES, plan_tied_pairs=TIED)

    agree(ours(), theirs())
    best = {"theirs": float("inf"), "spelled": float("inf"), "ours": float("inf")}
    for _ in range(repeats):  # interleaved, so all three see the same machine
        best["theirs"] = min(best["theirs"], timed(theirs))
        best["spelled"] = min(best["spelled"], timed(spelled))
        best["ours"] = min(best["ours"], timed(ours))
    return KeyedScale(param_count(plain), keys, best["theirs"], best["spelled"], best["ours"])


def report_keyed(small: KeyedScale, large: KeyedScale) -> tuple[str, int, int]:
    """The report of the plan with a key per layer, targets met and how many there are."""
    rows: list[tuple[str, str, str, str]] = [
        (
            "build_table(fqns=), a pattern key per layer",
            "target",
            f"N={small.params:,}",
            f"N={large.params:,}",
        ),
        ("  pattern keys", "", f"{small.keys:,}", f"{large.keys:,}"),
        ("  baseline time", "", f"{small.baseline:.3f} s", f"{large.baseline:.3f} s"),
        ("  every key spelled out", "", f"{small.spelled:.3f} s", f"{large.spelled:.3f} s"),
        ("  a pattern key per layer", "", f"{small.ours:.3f} s", f"{large.ours:.3f} s"),
        ("  time ratio", "", f"{small.time_ratio:.2f}", f"{large.time_ratio:.2f}"),
    ]
    a, b = small.spelled_ratio, large.spelled_ratio
    record(
        "build_table, pattern key per layer / spelled out, large",
        b,
        KEYED_TIME_TARGET,
        f"baseline ratio {large.time_ratio:.2f}",
    )
    rows.append(
        (
            "  pattern keys / spelled out",
            f"<= {KEYED_TIME_TARGET:.2f}",
            f"{a:.2f} {verdict(a, KEYED_TIME_TARGET)}",
            f"{b:.2f} {verdict(b, KEYED_TIME_TARGET)}",
        )
    )
    growth = (large.ours / large.params) / (small.ours / small.params)
    base_growth = (large.baseline / large.params) / (small.baseline / small.params)
    record(
        "per-entry growth, pattern key per layer",
        growth,
        GROWTH_TARGET,
        f"baseline's own {base_growth:.2f}",
    )
    rows.append(
        (
            "  per-entry growth, large/small",
            f"<= {GROWTH_TARGET:.2f}",
            "",
            f"{growth:.2f} {verdict(growth, GROWTH_TARGET)}",
        )
    )
    rows.append(("  the baseline's own growth", "", "", f"{base_growth:.2f}"))
    met = (a <= KEYED_TIME_TARGET) + (b <= KEYED_TIME_TARGET) + (growth <= GROWTH_TARGET)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    w0, w1, w2, w3 = widths
    lines = [f"{a:<{w0}}  {t:<{w1}}  {s:>{w2}}  {g:>{w3}}".rstrip() for a, t, s, g in rows]
    return "\n".join(lines), met, 3


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
    keyed_small = measure_keyed(small_n, repeats=7)
    keyed_large = measure_keyed(large_n, repeats=3 if quick else 5)
    keyed_text, keyed_met, keyed_total = report_keyed(keyed_small, keyed_large)
    print()
    print(keyed_text)
    return met + keyed_met, total + keyed_total


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_build", __doc__, run, argv, smaller="smaller scales")


if __name__ == "__main__":
    main()
