"""``reshard_plan`` on a 1e5-parameter MoE model, as a ratio to ``build_table`` of its plan.

The checkpoint is saved by a training run (dense ``dp_shard=8, tp=4``, experts
``dp_shard=1, ep=8, tp=4``, FSDP over ``dp_shard``: 32 ranks) and loaded by an inference
run (dense ``tp=8``, experts ``ep=2, tp=4``, no FSDP: 8 ranks); both tables come from the
same plan. Reported: the time to build the table, to compose it with FSDP, and to plan the
reshard (best of several runs, the garbage collector off), and reshard / build_table.
Run alone with ``python -m tests.bench.bench_reshard [--quick]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from layout_algebra.algebra import build_table
from layout_algebra.checkpoint import ReshardPlan, reshard_plan
from layout_algebra.fsdp import compose_table
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.shapes import ParamShape
from tests.bench import alone
from tests.bench.baseline import moe_plan, sharding_plan
from tests.bench.bench_build import built_anew, built_by_fqn, timed
from tests.bench.targets import record

__all__ = ["main", "run"]

PARAMS: Final = 100_000
QUICK_PARAMS: Final = 10_000
TARGET: Final = 3.0
"""reshard_plan within this many build_tables of the same plan."""

SRC_SIZES: Final = {
    "dense": {"dp_shard": 8, "tp": 4},
    "expert": {"dp_shard": 1, "ep": 8, "tp": 4},
}
DST_SIZES: Final = {"dense": {"tp": 8}, "expert": {"ep": 2, "tp": 4}}
DIM: Final = 1024
HIDDEN: Final = 512
EXPERTS: Final = 16
VOCAB: Final = 32_000


_SHAPES: Final[Mapping[str, ParamShape]] = {
    "wq.weight": ParamShape((DIM, DIM), "bfloat16"),
    "wk.weight": ParamShape((DIM // 4, DIM), "bfloat16"),
    "wv.weight": ParamShape((DIM // 4, DIM), "bfloat16"),
    "wo.weight": ParamShape((DIM, DIM), "bfloat16"),
    "norm.weight": ParamShape((DIM,), "float32"),
    "gate.weight": ParamShape((EXPERTS, DIM), "float32"),
    "experts.w1": ParamShape((EXPERTS, DIM, HIDDEN), "bfloat16"),
    "experts.w2": ParamShape((EXPERTS, HIDDEN, DIM), "bfloat16"),
    "experts.w3": ParamShape((EXPERTS, DIM, HIDDEN), "bfloat16"),
    "w1.weight": ParamShape((HIDDEN, DIM), "bfloat16"),
    "w2.weight": ParamShape((DIM, HIDDEN), "bfloat16"),
    "w3.weight": ParamShape((HIDDEN, DIM), "bfloat16"),
    "tok_embeddings.weight": ParamShape((VOCAB, DIM), "bfloat16"),
    "output.weight": ParamShape((VOCAB, DIM), "bfloat16"),
}


def shapes_of(table: ParamLayoutTable) -> dict[str, ParamShape]:
    """A shape for every parameter, by the last segments of its FQN."""
    out: dict[str, ParamShape] = {}
    for fqn in table:
        parts = fqn.split(".")
        key = fqn if fqn in _SHAPES else ".".join(parts[-2:])
        out[fqn] = _SHAPES.get(key, _SHAPES["norm.weight"])
    return out


def run(*, quick: bool = False) -> tuple[int, int]:
    """Measure and print; how many targets were met, of how many."""
    plan = sharding_plan(moe_plan(QUICK_PARAMS if quick else PARAMS))
    repeats = 3 if quick else 5

    def train() -> ParamLayoutTable:
        return build_table(plan, ("dp_shard", "tp"), expert_axes=("dp_shard", "ep", "tp"))

    def serve() -> ParamLayoutTable:
        return build_table(plan, ("tp",), expert_axes=("ep", "tp"))

    src_source = train()
    fsdp = {"dense": "dp_shard", "expert": "dp_shard"}
    src = compose_table(src_source, fsdp=fsdp, mesh_sizes=SRC_SIZES)
    dst = serve()
    shapes = shapes_of(src)

    def compose() -> ParamLayoutTable:
        return compose_table(src_source, fsdp=fsdp, mesh_sizes=SRC_SIZES)

    def reshard() -> ReshardPlan:
        return reshard_plan(src, dst, shapes, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)

    def train_by_fqn() -> ParamLayoutTable:
        return built_by_fqn(plan, ("dp_shard", "tp"), ("dp_shard", "ep", "tp"))

    build = built_anew(plan, ("dp_shard", "tp"), ("dp_shard", "ep", "tp"))
    build_best = by_fqn_best = compose_best = reshard_best = float("inf")
    for _ in range(repeats):  # interleaved, so all of them see the same machine
        build_best = min(build_best, timed(build))
        by_fqn_best = min(by_fqn_best, timed(train_by_fqn))
        compose_best = min(compose_best, timed(compose))
        reshard_best = min(reshard_best, timed(reshard))
    result = reshard()
    ratio = reshard_best / by_fqn_best
    verdict = "PASS" if ratio <= TARGET else "MISS"
    rank, most = result.largest
    print(f"reshard_plan, MoE plan, N={len(src):,} parameters")
    print("  train 32 ranks (FSDP dp_shard=8, tp=4, ep=8) -> serve 8 ranks (tp=8; ep=2, tp=4)")
    print(f"  ShardingPlan + build_table  {build_best:.3f} s (from the planner's dicts)")
    print(f"  build_table, by FQN         {by_fqn_best:.3f} s (a layout given per FQN)")
    print(f"  compose_table               {compose_best:.3f} s")
    print(f"  reshard_plan                {reshard_best:.3f} s")
    print(f"  reshard / ShardingPlan + build {reshard_best / build_best:.2f}")
    print(f"  reshard / by FQN            {ratio:.2f}  (target <= {TARGET:.2f}) {verdict}")
    print(
        f"  read in all {result.total / 2**30:.1f} GiB, largest rank {rank}: {most / 2**30:.2f} GiB"
    )
    record(
        "reshard_plan / build_table by FQN",
        ratio,
        TARGET,
        f"its own target; / ShardingPlan + build_table {reshard_best / build_best:.2f}",
    )
    return int(ratio <= TARGET), 1


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_reshard", __doc__, run, argv, smaller="a smaller model")


if __name__ == "__main__":
    main()
