"""``reshard_plan(parts=...)`` on 16,384 ranks, against the same plan without parts.

The table is ``bench_world``'s DeepSeek-V3 shape, saved with every MLP's ``gate_proj``
and ``up_proj`` fused into one ``gate_up_proj`` (``[gate | up]`` on dim 0, the layout
``gate_proj`` had: the dense layers', the shared experts' and every routed expert's) and
loaded unfused with ``parts=``; the baseline loads the unfused checkpoint into the same
table. Both at 16,384 -> 16,384 ranks (``bench_world``'s worlds, FSDP over
``dp_shard``), plan and report, best of several interleaved runs with the garbage
collector off. Each (layouts, shapes, spans) signature of the fused tensors is planned
once, so the world costs per signature, as without parts; each fused tensor's parts are
still named and checked one by one, a cost per tensor the same ratio at 16 -> 16 ranks
(printed beside it) shows alone. Then ``lint`` of one weight whose dim 0 is packed of
2,000 parts of 8 rows on ``tp=512``, ``S(0)`` (one block: every part's rows checked) and
``_S(0, 2000)`` (each part one piece), beside the same lint without the structure, printed
with no target. Run alone with ``python -m tests.bench.bench_parts [--quick]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from layout_algebra import (
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Shard,
    SourceLayout,
    StridedShard,
)
from layout_algebra.checkpoint import reshard_plan
from layout_algebra.lint import lint
from tests.bench import alone
from tests.bench.bench_build import timed
from tests.bench.bench_world import FSDP, LAYERS, WORLDS, deepseek_table
from tests.bench.targets import record

__all__ = ["TARGET", "fused_case", "main", "run"]

TARGET: Final = 3.0
"""reshard_plan with parts within this many times the same plan without them."""

LINT_PARTS: Final = 2000
LINT_TP: Final = 512

Parts = Mapping[str, Mapping[str, str]]


def fused_case(
    layers: int,
) -> tuple[ParamLayoutTable, ParamLayoutTable, dict[str, ParamShape], Parts]:
    """The fused table (saved), the unfused one (loaded), the shapes of both, and the
    parts that map one to the other."""
    table, shapes = deepseek_table(layers)
    fused: dict[str, object] = {}
    parts: dict[str, dict[str, str]] = {}
    for fqn, layout in table.items():
        if fqn.endswith(".up_proj.weight"):
            continue  # read from its gate_up_proj
        if not fqn.endswith(".gate_proj.weight"):
            fused[fqn] = layout
            continue
        up = fqn.removesuffix("gate_proj.weight") + "up_proj.weight"
        name = fqn.removesuffix("gate_proj.weight") + "gate_up_proj.weight"
        fused[name] = layout
        rows, cols = shapes[fqn].shape
        whole = Packed([Part("gate", rows), Part("up", rows)])
        shapes[name] = ParamShape((2 * rows, cols), shapes[fqn].dtype, structure={0: whole})
        parts[name] = {"gate": fqn, "up": up}
    saved = ParamLayoutTable(fused, tied=table.tied)  # type: ignore[arg-type]  # layouts
    return saved, table, shapes, parts


def run(*, quick: bool = False) -> tuple[int, int]:
    """Measure and print; how many targets were met, of how many."""
    layers = 8 if quick else LAYERS
    repeats = 1 if quick else 3
    saved, table, shapes, parts = fused_case(layers)

    def planned(src: str, dst: str, *, with_parts: bool) -> Callable[[], str]:
        def f() -> str:
            plan = reshard_plan(
                saved if with_parts else table,
                table,
                shapes,
                src_sizes=WORLDS[src],
                dst_sizes=WORLDS[dst],
                fsdp=FSDP,
                parts=parts if with_parts else None,
            )
            return str(plan)

        return f

    cases = {
        "16k": ("16384", "16384 (to)"),
        "16": ("16", "16 (to)"),
    }
    best: dict[tuple[str, bool], float] = {}
    for _ in range(repeats):  # interleaved, so both sides see the same machine
        for name, (src, dst) in cases.items():
            for with_parts in (False, True):
                took = timed(planned(src, dst, with_parts=with_parts))
                key = (name, with_parts)
                best[key] = min(best.get(key, took), took)
    ratio = best["16k", True] / best["16k", False]
    small = best["16", True] / best["16", False]
    print(
        f"reshard_plan(parts=...), DeepSeek-V3-shaped table, {layers} layers: "
        f"{len(parts):,} fused gate_up_proj read as {2 * len(parts):,} tensors"
    )
    print(f"  16,384 -> 16,384 ranks, without parts  {best['16k', False]:8.3f} s")
    print(f"  16,384 -> 16,384 ranks, with parts     {best['16k', True]:8.3f} s")
    print(f"  16 -> 16 ranks, without parts          {best['16', False]:8.3f} s")
    print(f"  16 -> 16 ranks, with parts             {best['16', True]:8.3f} s")
    print(f"  with / without parts, 16k ranks        {ratio:8.2f}  target <= {TARGET:.1f}")
    print(f"  with / without parts, 16 ranks         {small:8.2f}")
    met = record(
        "reshard parts 16k / without parts",
        ratio,
        TARGET,
        f"{len(parts):,} fused; at 16 ranks {small:.2f}",
    )
    run_lint(repeats)
    return int(met), 1


def run_lint(repeats: int) -> None:
    """``lint`` of one weight of ``LINT_PARTS`` parts on ``tp=LINT_TP``, with and without
    its structure (printed only)."""
    whole = Packed([Part(f"p{i}", 1, 8) for i in range(LINT_PARTS)])
    plain = ParamShape((whole.length, 64), "bfloat16")
    packed = plain.with_structure({0: whole})
    sizes = {"dense": {"tp": LINT_TP}}
    print(f"lint, dim 0 packed of {LINT_PARTS:,} parts of 8 rows, tp={LINT_TP}")
    for placement in (Shard(0), StridedShard(0, split_factor=LINT_PARTS)):
        table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [placement])})

        def linted(shape: ParamShape, table: ParamLayoutTable = table) -> Callable[[], object]:
            return lambda: lint(table, {"w": shape}, mesh_sizes=sizes)

        with_parts = without = float("inf")
        for _ in range(repeats):  # interleaved
            with_parts = min(with_parts, timed(linted(packed)))
            without = min(without, timed(linted(plain)))
        print(
            f"  {table['w']!s:<24} with parts {with_parts:8.3f} s, without "
            f"{without:8.3f} s, ratio {with_parts / without:6.2f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_parts", __doc__, run, argv, smaller="8 layers")


if __name__ == "__main__":
    main()
