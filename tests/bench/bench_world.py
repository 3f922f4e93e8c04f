"""World scale: ``lint`` and ``reshard_plan`` of a DeepSeek-V3-shaped table on 16,384 ranks.

The table has DeepSeek-V3's shapes (61 layers, the first 3 dense, 256 experts in
per-expert modules and a shared expert in the others: about 45,000 tensors, bf16) and
about twenty distinct (layout, shape) signatures, FSDP over ``dp_shard``. Each figure is
a ratio in this process: against building the table from its plan (``build_table``), and
against the same call on a 16-rank world; the memory is the peak of building the table
and its shapes and linting it (``--quick``: 8 layers, where the work per world weighs
more against the work per tensor). Lint with training against lint alone; lint with
pipeline stages and training, then with the activations of a 4096-token microbatch too
(an ``Activations`` of the same shapes, every projection and experts module named,
built here without torch), against lint alone and lint with training. Then torch's own
load planning beside ``reshard_plan`` on a smaller case (4 layers, 64 ranks; ``--full``:
8 layers, the largest torch plans in about a minute here). Run alone with ``python -m
tests.bench.bench_world [--quick] [--full]``.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeVar

import attrs

from layout_algebra import (
    Activations,
    ModulePlan,
    ParamLayoutTable,
    Shard,
    ShardingPlan,
    Stages,
    Training,
    build_table,
)
from layout_algebra.checkpoint import ReshardPlan, reshard_plan
from layout_algebra.lint import LintReport, lint
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Placement
from layout_algebra.shapes import ParamShape
from tests.bench.targets import record

__all__ = [
    "WORLDS",
    "build",
    "deepseek_activations",
    "deepseek_plan",
    "deepseek_table",
    "main",
    "run",
    "run_torch",
]

T = TypeVar("T")

HIDDEN: Final = 7168
VOCAB: Final = 129_280
INTER: Final = 18_432
MOE_INTER: Final = 2048
EXPERTS: Final = 256
LAYERS: Final = 61
DENSE_LAYERS: Final = 3
HEADS: Final = 128
Q_LORA: Final = 1536
KV_LORA: Final = 512
ROPE: Final = 64
NOPE: Final = 128
V_HEAD: Final = 128

Sizes = Mapping[str, Mapping[str, int]]

WORLDS: Final[Mapping[str, Sizes]] = {
    "16": {
        "dense": {"dp_shard": 2, "tp": 8},
        "expert": {"dp_shard": 1, "ep": 2, "tp": 8},
    },
    "16 (to)": {
        "dense": {"dp_shard": 1, "tp": 16},
        "expert": {"dp_shard": 1, "ep": 1, "tp": 16},
    },
    "64": {
        "dense": {"dp_shard": 8, "tp": 8},
        "expert": {"dp_shard": 2, "ep": 4, "tp": 8},
    },
    "64 (to)": {
        "dense": {"dp_shard": 4, "tp": 16},
        "expert": {"dp_shard": 1, "ep": 4, "tp": 16},
    },
    "16384": {
        "dense": {"dp_shard": 2048, "tp": 8},
        "expert": {"dp_shard": 64, "ep": 32, "tp": 8},
    },
    "16384 (to)": {
        "dense": {"dp_shard": 1024, "tp": 16},
        "expert": {"dp_shard": 16, "ep": 64, "tp": 16},
    },
}
"""The worlds: a training world and the world a reshard loads into, small and large."""

FSDP: Final = {"dense": "dp_shard", "expert": "dp_shard"}

LINT_TARGET: Final = 10.0
LINT_GROWTH_TARGET: Final = 2.0
RESHARD_TARGET: Final = 30.0
RESHARD_GROWTH_TARGET: Final = 3.0
MEMORY_TARGET: Final = 2.0
TRAINING_TARGET: Final = 3.0
"""Lint with training against lint alone, on the same world."""
STAGES_TARGET: Final = 3.0
"""Lint with pipeline stages and training against the same lint without stages."""
ACTIVATIONS_TARGET: Final = 3.0
"""Lint with pipeline stages and activations against lint of the same world."""
SEQ_LEN: Final = 4096
TOP_K: Final = 8
"""The tokens of the microbatch the activations are of, and the experts each is routed to."""


def deepseek_plan(layers: int = LAYERS) -> tuple[ShardingPlan, dict[str, ParamShape]]:
    """A plan and shapes shaped as DeepSeek-V3's (``layers`` of its 61 layers): TP on the
    attention and MLP projections, experts over ``ep`` and ``tp``, the rest replicated."""
    col, row, ep = {"tp": Shard(0)}, {"tp": Shard(1)}, {"ep": Shard(0)}
    modules: dict[str, dict[str, dict[str, Placement]]] = {}
    experts: set[str] = set()
    shapes: dict[str, ParamShape] = {}

    def add(fqn: str, named: Mapping[str, Placement], shape: tuple[int, ...]) -> None:
        module, name = fqn.rsplit(".", 1)
        modules.setdefault(module, {})[name] = dict(named)
        shapes[fqn] = ParamShape(shape, "bfloat16")  # one object per tensor, as a reader makes

    add("model.embed_tokens.weight", col, (VOCAB, HIDDEN))
    for i in range(layers):
        p = f"model.layers.{i}"
        add(f"{p}.input_layernorm.weight", {}, (HIDDEN,))
        add(f"{p}.post_attention_layernorm.weight", {}, (HIDDEN,))
        a = f"{p}.self_attn"
        add(f"{a}.q_a_proj.weight", {}, (Q_LORA, HIDDEN))
        add(f"{a}.q_a_layernorm.weight", {}, (Q_LORA,))
        add(f"{a}.q_b_proj.weight", col, (HEADS * (NOPE + ROPE), Q_LORA))
        add(f"{a}.kv_a_proj_with_mqa.weight", {}, (KV_LORA + ROPE, HIDDEN))
        add(f"{a}.kv_a_layernorm.weight", {}, (KV_LORA,))
        add(f"{a}.kv_b_proj.weight", col, (HEADS * (NOPE + V_HEAD), KV_LORA))
        add(f"{a}.o_proj.weight", row, (HIDDEN, HEADS * V_HEAD))
        m = f"{p}.mlp"
        if i < DENSE_LAYERS:
            add(f"{m}.gate_proj.weight", col, (INTER, HIDDEN))
            add(f"{m}.up_proj.weight", col, (INTER, HIDDEN))
            add(f"{m}.down_proj.weight", row, (HIDDEN, INTER))
            continue
        add(f"{m}.gate.weight", {}, (EXPERTS, HIDDEN))
        add(f"{m}.gate.e_score_correction_bias", {}, (EXPERTS,))
        for e in range(EXPERTS):
            for name, dim, shape in (
                ("gate_proj", 0, (MOE_INTER, HIDDEN)),
                ("up_proj", 0, (MOE_INTER, HIDDEN)),
                ("down_proj", 1, (HIDDEN, MOE_INTER)),
            ):
                add(f"{m}.experts.{e}.{name}.weight", {**ep, "tp": Shard(dim)}, shape)
                experts.add(f"{m}.experts.{e}.{name}")
        s = f"{m}.shared_experts"
        add(f"{s}.gate_proj.weight", col, (MOE_INTER, HIDDEN))
        add(f"{s}.up_proj.weight", col, (MOE_INTER, HIDDEN))
        add(f"{s}.down_proj.weight", row, (HIDDEN, MOE_INTER))
    add("model.norm.weight", {}, (HIDDEN,))
    add("lm_head.weight", col, (VOCAB, HIDDEN))
    plan = ShardingPlan(
        {m: ModulePlan(params, expert_parallel=m in experts) for m, params in modules.items()},
        mesh_axes=["dp_shard", "ep", "tp"],
    )
    return plan, shapes


def deepseek_activations(layers: int = LAYERS) -> Activations:
    """What ``activations_from_module`` would record for ``deepseek_plan``'s model under full
    checkpointing (one sequence of ``SEQ_LEN`` tokens, bf16), from the shapes alone: each
    block keeps its input and recomputes the rest, every projection's input and output,
    the routed tokens of every experts module (``TOP_K`` copies of each token)."""
    t, b = SEQ_LEN, 2
    hidden = t * HIDDEN * b
    units: dict[str, dict[str, int]] = {"": {"sequence": hidden}}
    recompute: dict[str, int] = {}
    modules: dict[str, tuple[str, int, int]] = {
        "model.embed_tokens": ("embedding", t * 8, hidden),
        "lm_head": ("linear", hidden, t * VOCAB * b),
    }
    routed: dict[str, int] = {}

    def linear(name: str, rows: int, into: int, out: int) -> None:
        modules[name] = ("linear", rows * into * b, rows * out * b)

    for i in range(layers):
        p = f"model.layers.{i}"
        units[p] = {"sequence": hidden}
        a = f"{p}.self_attn"
        linear(f"{a}.q_a_proj", t, HIDDEN, Q_LORA)
        linear(f"{a}.q_b_proj", t, Q_LORA, HEADS * (NOPE + ROPE))
        linear(f"{a}.kv_a_proj_with_mqa", t, HIDDEN, KV_LORA + ROPE)
        linear(f"{a}.kv_b_proj", t, KV_LORA, HEADS * (NOPE + V_HEAD))
        linear(f"{a}.o_proj", t, HEADS * V_HEAD, HIDDEN)
        attention = t * HEADS * (2 * NOPE + ROPE + V_HEAD) * b
        m = f"{p}.mlp"
        mlps = [(m, t, INTER)] if i < DENSE_LAYERS else [(f"{m}.shared_experts", t, MOE_INTER)]
        if i >= DENSE_LAYERS:
            linear(f"{m}.gate", t, HIDDEN, EXPERTS)
            routed[f"{m}.experts"] = t * TOP_K * HIDDEN * b
            per = t * TOP_K // EXPERTS  # balanced routing
            mlps.extend((f"{m}.experts.{e}", per, MOE_INTER) for e in range(EXPERTS))
        for name, rows, inter in mlps:
            linear(f"{name}.gate_proj", rows, HIDDEN, inter)
            linear(f"{name}.up_proj", rows, HIDDEN, inter)
            linear(f"{name}.down_proj", rows, inter, HIDDEN)
        recompute[p] = 4 * hidden + attention + 3 * t * (INTER if i < DENSE_LAYERS else MOE_INTER)
    return Activations(
        units=units,
        batch=1,
        seq_len=t,
        checkpointing="full",
        recompute=recompute,
        boundary=hidden,
        modules=modules,
        routed=routed,
    )


def build(plan: ShardingPlan) -> ParamLayoutTable:
    """The table of ``plan``: dense ``(dp_shard, tp)``, experts ``(dp_shard, ep, tp)``."""
    return build_table(plan, ["dp_shard", "tp"], expert_axes=["dp_shard", "ep", "tp"])


def deepseek_table(layers: int = LAYERS) -> tuple[ParamLayoutTable, dict[str, ParamShape]]:
    """The table of ``deepseek_plan`` and its shapes."""
    plan, shapes = deepseek_plan(layers)
    return build(plan), shapes


def _timed(f: Callable[[], T]) -> tuple[float, T]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        out = f()
        return time.perf_counter() - start, out
    finally:
        gc.enable()


def _best(f: Callable[[], T], repeats: int) -> tuple[float, T]:
    best, out = _timed(f)
    for _ in range(repeats - 1):
        best = min(best, _timed(f)[0])
    return best, out


def _peak(f: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _torch_reads(
    table: ParamLayoutTable,
    shapes: Mapping[str, ParamShape],
    src: Sizes,
    dst: Sizes,
) -> tuple[float, int]:
    """Seconds torch's load planning takes for every destination rank of a checkpoint
    saved under ``src`` (its metadata made by torch's own save planning, not timed), and
    how many read items it makes."""
    import torch  # noqa: PLC0415  # the rest of the bench runs without torch
    from torch.distributed.checkpoint._dedup_save_plans import (  # noqa: PLC0415
        dedup_save_plans,
    )
    from torch.distributed.checkpoint.default_planner import (  # noqa: PLC0415
        create_default_global_save_plan,
    )
    from torch.distributed.checkpoint.metadata import (  # noqa: PLC0415
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import (  # noqa: PLC0415
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.planner_helpers import (  # noqa: PLC0415
        create_read_items_for_chunk_list,
    )

    from layout_algebra import compose_table, local_shape_and_offset  # noqa: PLC0415

    def boxes(sizes: Sizes) -> list[dict[str, ChunkStorageMetadata]]:
        composed = compose_table(table, fsdp=FSDP, mesh_sizes=sizes)
        meshes = {role: Mesh(s) for role, s in sizes.items()}
        out = []
        for rank in range(next(iter(meshes.values())).size):
            by_fqn = {}
            for fqn, layout in composed.items():
                mesh = meshes[layout.mesh]
                where = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
                local, offset = local_shape_and_offset(shapes[fqn].shape, layout, mesh, where)
                by_fqn[fqn] = ChunkStorageMetadata(torch.Size(offset), torch.Size(local))
            out.append(by_fqn)
        return out

    plans = [
        SavePlan(
            [
                WriteItem(
                    index=MetadataIndex(fqn, box.offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=box,
                        properties=TensorProperties(dtype=torch.bfloat16),
                        size=torch.Size(shapes[fqn].shape),
                    ),
                )
                for fqn, box in by_fqn.items()
            ]
        )
        for by_fqn in boxes(src)
    ]
    _, metadata = create_default_global_save_plan(dedup_save_plans(plans))
    saved = {
        fqn: md
        for fqn, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    wanted = boxes(dst)
    start = time.perf_counter()
    count = sum(
        len(create_read_items_for_chunk_list(fqn, saved[fqn], [box]))
        for by_fqn in wanted
        for fqn, box in by_fqn.items()
    )
    return time.perf_counter() - start, count


def run_torch(*, layers: int, worlds: tuple[str, str]) -> None:
    """torch's load planning beside ``reshard_plan`` on one case: same reads, and the ratio."""
    table, shapes = deepseek_table(layers)
    src, dst = (WORLDS[w] for w in worlds)
    seconds, count = _torch_reads(table, shapes, src, dst)
    ours, plan = _timed(
        lambda: reshard_plan(table, table, shapes, src_sizes=src, dst_sizes=dst, fsdp=FSDP)
    )
    reads = sum(len(plan.reads(r)) for r in range(plan.world_size))
    same = "same reads" if reads == count else f"reads differ: {reads:,} against torch's {count:,}"
    print(f"against torch: {len(table):,} tensors, {worlds[0]} -> {worlds[1]} ranks, {same}")
    print(f"  torch's load planning, every rank  {seconds:8.3f} s")
    print(f"  reshard_plan                       {ours:8.3f} s")
    print(f"  torch / reshard_plan               {seconds / ours:8.1f}")


def _staged(
    table: ParamLayoutTable, shapes: Mapping[str, ParamShape], layers: int, repeats: int
) -> tuple[float, float, float]:
    """Seconds of lint with training on 16,384 ranks with pipeline stages over ``pp``
    (16, or 4 for a few layers), with stages and activations, and with neither: the
    same world's other axes, no ``pp``."""
    pp = 16 if layers >= 2 * 16 else 4
    stages = Stages.balanced(
        "pp",
        layers=layers,
        pp=pp,
        prefix="model.layers",
        first=["model.embed_tokens"],
        last=["model.norm", "lm_head"],
    )
    training = Training(units=["model.layers.*"], param_dtype="bfloat16")
    traced = attrs.evolve(training, activations=deepseek_activations(layers))
    world = WORLDS["16384"]
    piped = {role: {"pp": pp, **sizes} for role, sizes in world.items()}
    for sizes in piped.values():
        sizes["dp_shard"] //= pp
    seconds, _ = _best(
        lambda: lint(table, shapes, mesh_sizes=piped, fsdp=FSDP, training=training, stages=stages),
        repeats,
    )
    with_acts, _ = _best(
        lambda: lint(table, shapes, mesh_sizes=piped, fsdp=FSDP, training=traced, stages=stages),
        repeats,
    )
    alone, _ = _best(
        lambda: lint(table, shapes, mesh_sizes=world, fsdp=FSDP, training=training), repeats
    )
    print(f"  lint + {pp} stages + training, 16k   {seconds:8.3f} s")
    print(f"  ... + activations, 16k             {with_acts:8.3f} s")
    print(f"  lint + training, 16,384 ranks      {alone:8.3f} s")
    return seconds, with_acts, alone


def run(*, quick: bool = False, full: bool = False) -> tuple[int, int]:
    """Measure and print the report; how many targets were met, of how many."""
    layers = 8 if quick else LAYERS
    repeats = 1 if quick else 3
    plan, shapes = deepseek_plan(layers)
    built, table = _best(lambda: build(plan), repeats)

    def linted(world: str) -> Callable[[], LintReport]:
        return lambda: lint(table, shapes, mesh_sizes=WORLDS[world], fsdp=FSDP)

    def resharded(src: str, dst: str) -> Callable[[], str]:
        def f() -> str:
            plan = reshard_plan(
                table, table, shapes, src_sizes=WORLDS[src], dst_sizes=WORLDS[dst], fsdp=FSDP
            )
            return str(plan)

        return f

    lint_small, _ = _best(linted("16"), repeats)
    lint_large, report = _best(linted("16384"), repeats)
    reshard_small, _ = _best(resharded("16", "16 (to)"), repeats)
    reshard_large, _ = _best(resharded("16384", "16384 (to)"), repeats)
    large: ReshardPlan = reshard_plan(
        table, table, shapes, src_sizes=WORLDS["16384"], dst_sizes=WORLDS["16384 (to)"], fsdp=FSDP
    )
    one_rank, reads = _best(lambda: large.reads(12_345), repeats)
    memory_small = _peak(lambda: lint(*deepseek_table(layers), mesh_sizes=WORLDS["16"], fsdp=FSDP))
    memory_large = _peak(
        lambda: lint(*deepseek_table(layers), mesh_sizes=WORLDS["16384"], fsdp=FSDP)
    )
    staged, with_acts, plain = _staged(table, shapes, layers, repeats)
    n = len(table)
    kinds = len(report.coverage)
    print(f"world scale: DeepSeek-V3-shaped table, {layers} layers, {n:,} tensors, {kinds} kinds")
    print(f"  building the table (build_table)   {built:8.3f} s")
    print(f"  lint, 16 ranks                     {lint_small:8.3f} s")
    print(f"  lint, 16,384 ranks                 {lint_large:8.3f} s")
    print(f"  reshard_plan + report, 16 -> 16    {reshard_small:8.3f} s")
    print(f"  reshard_plan + report, 16k -> 16k  {reshard_large:8.3f} s")
    print(f"  reads(rank) of one rank            {one_rank * 1000:8.1f} ms ({len(reads):,} reads)")
    print(
        f"  lint peak memory, 16 / 16,384      {memory_small / 2**20:.1f} / "
        f"{memory_large / 2**20:.1f} MiB"
    )
    checks = [
        ("lint 16,384 ranks / building the table", lint_large / built, LINT_TARGET),
        ("lint 16,384 ranks / lint 16 ranks", lint_large / lint_small, LINT_GROWTH_TARGET),
        ("reshard + report 16k / building the table", reshard_large / built, RESHARD_TARGET),
        (
            "reshard + report 16k / at 16 ranks",
            reshard_large / reshard_small,
            RESHARD_GROWTH_TARGET,
        ),
        ("table + lint peak memory, 16,384 / 16 ranks", memory_large / memory_small, MEMORY_TARGET),
        ("lint + training / lint, 16,384 ranks", plain / lint_large, TRAINING_TARGET),
        ("lint with stages / without, 16,384 ranks", staged / plain, STAGES_TARGET),
        ("stages + activations / lint, 16,384 ranks", with_acts / lint_large, ACTIVATIONS_TARGET),
        ("stages + activations / lint + training", with_acts / plain, ACTIVATIONS_TARGET),
    ]
    met = 0
    for measure, value, target in checks:
        print(f"  {measure:<42} {value:7.2f}  target <= {target:.1f}")
        met += record(measure, value, target, f"{n:,} tensors")
    run_torch(layers=8 if full else (2 if quick else 4), worlds=("64", "64 (to)"))
    return met, len(checks)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_world", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer layers, for a smoke run")
    parser.add_argument("--full", action="store_true", help="all 61 layers (about 45,000 tensors)")
    args = parser.parse_args(argv)
    run(quick=args.quick, full=args.full)


if __name__ == "__main__":
    main()
