"""``lint`` of a whole MoE table with its shapes, against ``build_table`` of the same plan.

The workload is ``baseline.moe_plan`` with a realistic shape and dtype for every
parameter (bf16, a 4096-wide model with 64 experts) on a 32-rank world: dense
``dp_shard=8, tp=4``, experts ``dp_shard=2, ep=4, tp=4``, FSDP over ``dp_shard`` on both.
Both sides run in this process, best of several runs with the garbage collector off;
the target is lint at most 3x the time ``build_table`` takes, at 1e5 parameters. The
same ratio at 1e6 is printed beside it as information (not with ``--quick``).
Run alone with ``python -m tests.bench.bench_lint [--quick]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from layout_algebra.algebra import build_table
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.lint import LintReport, lint
from layout_algebra.shapes import ParamShape
from tests.bench import alone
from tests.bench.baseline import DENSE_AXES, EXPERT_AXES, moe_plan, param_count, sharding_plan
from tests.bench.bench_build import built_anew, built_by_fqn, timed, verdict
from tests.bench.targets import record

__all__ = ["RATIO_TARGET", "main", "run", "shapes_of"]

RATIO_TARGET: Final = 3.0
SCALE: Final = 100_000
LARGE_SCALE: Final = 1_000_000
"""Printed as information only (no target)."""

DIM: Final = 4096
HIDDEN: Final = 14336
EXPERT_HIDDEN: Final = 2048
EXPERTS: Final = 64
VOCAB: Final = 128_256

MESH_SIZES: Final[Mapping[str, Mapping[str, int]]] = {
    "dense": {"dp_shard": 8, "tp": 4},
    "expert": {"dp_shard": 2, "ep": 4, "tp": 4},
}
FSDP: Final = {"dense": "dp_shard", "expert": "dp_shard"}

_SHAPES: Final[Mapping[str, tuple[int, ...]]] = {
    "wq.weight": (DIM, DIM),
    "wk.weight": (DIM // 4, DIM),
    "wv.weight": (DIM // 4, DIM),
    "wo.weight": (DIM, DIM),
    "router.gate.weight": (EXPERTS, DIM),
    "experts.w1": (EXPERTS, DIM, EXPERT_HIDDEN),
    "experts.w2": (EXPERTS, EXPERT_HIDDEN, DIM),
    "experts.w3": (EXPERTS, DIM, EXPERT_HIDDEN),
    "shared_expert.w1.weight": (HIDDEN, DIM),
    "shared_expert.w2.weight": (DIM, HIDDEN),
    "shared_expert.w3.weight": (HIDDEN, DIM),
    "weight": (DIM,),
}


def shapes_of(table: ParamLayoutTable) -> dict[str, ParamShape]:
    """A bf16 shape for every parameter of ``table``, by its name's last parts."""
    kinds = {path: ParamShape(shape, "bfloat16") for path, shape in _SHAPES.items()}
    vocab = ParamShape((VOCAB, DIM), "bfloat16")
    out: dict[str, ParamShape] = {}
    for fqn in table:
        if fqn in {"tok_embeddings.weight", "output.weight"}:
            out[fqn] = vocab
            continue
        parts = fqn.split(".")
        shape = kinds.get(".".join(parts[-2:])) or kinds.get(".".join(parts[-3:]))
        out[fqn] = shape if shape is not None else kinds[parts[-1]]
    return out


def measured(n: int, repeats: int) -> tuple[float, float, float, LintReport]:
    """Best seconds of ``ShardingPlan`` + ``build_table``, of ``build_table`` by FQN and
    of ``lint``, on the plan of ``n`` parameters, and the report."""
    plan = sharding_plan(moe_plan(n))
    table = build_table(plan, DENSE_AXES, expert_axes=EXPERT_AXES)
    shapes = shapes_of(table)

    def linted() -> LintReport:
        return lint(table, shapes, mesh_sizes=MESH_SIZES, fsdp=FSDP)

    report = linted()
    assert not report.problems, report.problems[:3]
    build = built_anew(plan, DENSE_AXES, EXPERT_AXES)
    build_best = by_fqn_best = lint_best = float("inf")
    for _ in range(repeats):  # interleaved, so all of them see the same machine
        build_best = min(build_best, timed(build))
        by_fqn_best = min(by_fqn_best, timed(lambda: built_by_fqn(plan, DENSE_AXES, EXPERT_AXES)))
        lint_best = min(lint_best, timed(linted))
    return build_best, by_fqn_best, lint_best, report


def run(*, quick: bool = False) -> tuple[int, int]:
    """Measure and print the report; how many targets were met, of how many (1)."""
    build_best, by_fqn_best, lint_best, report = measured(SCALE, 3)
    ratio = lint_best / by_fqn_best
    rank, most = report.memory.largest
    print(f"lint, MoE plan with shapes, N={param_count(moe_plan(SCALE)):,}, 32 ranks")
    print(f"  ShardingPlan + build_table  {build_best:.3f} s (entries kept by module)")
    print(f"  build_table, by FQN         {by_fqn_best:.3f} s (entries spelled out)")
    print(f"  lint time                   {lint_best:.3f} s")
    target = f"target <= {RATIO_TARGET:.1f}  {verdict(ratio, RATIO_TARGET)}"
    print(f"  lint / ShardingPlan + build {lint_best / build_best:.2f}")
    print(f"  lint / by FQN               {ratio:.2f}  {target}")
    print(f"  largest rank                {rank}: {most / 2**30:.1f} GiB of parameters")
    if not quick:
        _, large_by_fqn, large_lint, _ = measured(LARGE_SCALE, 3)
        print(
            f"  at N={param_count(moe_plan(LARGE_SCALE)):,}: lint {large_lint:.3f} s, "
            f"/ by FQN {large_lint / large_by_fqn:.2f} (information, no target)"
        )
    record(
        "lint / build_table by FQN",
        ratio,
        RATIO_TARGET,
        f"its own target; / ShardingPlan + build_table {lint_best / build_best:.2f}",
    )
    return int(ratio <= RATIO_TARGET), 1


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_lint", __doc__, run, argv, smaller="a smaller scale")


if __name__ == "__main__":
    main()
