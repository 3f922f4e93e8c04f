"""The public API's types as a caller sees them: mypy checks this file, nothing runs it.

Each ``assert_type`` pins what a call returns; a change in an annotation that callers
would notice fails ``mypy``. The checks live in functions that are never called, and
pytest does not collect this directory (``collect_ignore`` in ``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView, Mapping
from typing import assert_type

from hypothesis.strategies import SearchStrategy

import layout_algebra
from layout_algebra import (
    FSDP_OWNED_AXES,
    AxisName,
    Drop,
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Partial,
    Placement,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    TableDiff,
    TiedLayoutConflict,
    build_table,
    complete_default,
    compose_fsdp,
    diff,
    format_placement,
    merge_tied,
    parse_placement,
    resolve,
    strip,
)
from layout_algebra.errors import PlacementSyntaxError, SerializationError
from layout_algebra.placements import ReduceOp
from layout_algebra.testing import (
    axis_names,
    placements,
    sharding_plans,
    source_layouts,
    source_placements,
    tables,
)


def placements_and_axes() -> None:
    assert_type(parse_placement("S(0)"), Placement)
    assert_type(format_placement(Shard(0)), str)
    assert_type(Shard(0).dim, int)
    assert_type(StridedShard(0, split_factor=2).split_factor, int)
    assert_type(Partial().reduce_op, ReduceOp)
    assert_type(AxisName("tp").name, str)
    assert_type(FSDP_OWNED_AXES, frozenset[str])
    p: Placement = Replicate()
    assert_type(p, Placement)


def layouts_and_tables(table: ParamLayoutTable) -> None:
    layout = SourceLayout("dense", ["tp", AxisName("ep")], [Shard(0), Replicate()])
    assert_type(layout.mesh, str)
    assert_type(layout.axes, tuple[AxisName, ...])
    assert_type(layout.placements, tuple[Placement, ...])
    assert_type(layout.placement_on("tp"), Placement)
    assert_type(layout.with_placements([Replicate(), Replicate()]), SourceLayout)
    assert_type(table["w"], SourceLayout)
    assert_type(table.get("x"), SourceLayout | None)
    assert_type(table.get("x", layout), SourceLayout)
    assert_type(table.get("x", 0), SourceLayout | int)
    assert_type(len(table), int)
    assert_type(iter(table), Iterator[str])
    assert_type(table.keys(), KeysView[str])
    assert_type(table.tied, tuple[frozenset[str], ...])
    assert_type("w" in table, bool)
    mapping: Mapping[str, SourceLayout] = table
    assert_type(mapping, Mapping[str, SourceLayout])


def combinators(plan: ShardingPlan, table: ParamLayoutTable) -> None:
    assert_type(strip(["dp_shard", "tp"]), tuple[AxisName, ...])
    assert_type(strip([AxisName("tp")], owned={"tp"}), tuple[AxisName, ...])
    assert_type(
        resolve({"tp": Shard(0), "dp_shard": Replicate()}, ["dp_shard", "tp"]), SourceLayout
    )
    assert_type(resolve({AxisName("tp"): Shard(0)}, ("tp",), mesh="expert"), SourceLayout)
    assert_type(merge_tied(table, [("emb.weight", "head.weight")]), ParamLayoutTable)
    assert_type(complete_default(table, ["w"], ["tp"]), ParamLayoutTable)
    assert_type(build_table(plan, ["dp_shard", "tp"]), ParamLayoutTable)
    assert_type(
        build_table(plan, ("tp",), expert_axes=("ep",), tied_pairs=(), owned=()), ParamLayoutTable
    )
    assert_type(build_table(plan, ["tp"], fqns=(n for n in ["w"])), ParamLayoutTable)
    assert_type(complete_default(table, ["w"], ["tp"], plain=True), ParamLayoutTable)
    assert_type(table.dropped, tuple[Drop, ...])
    assert_type(table.dropped[0].axis, AxisName)
    assert_type(plan.has_patterns, bool)
    assert_type(
        compose_fsdp(table["w"], shard_axis="dp_shard", mesh_sizes={"dp_shard": 2}),
        SourceLayout,
    )
    changes = diff(table, table)
    assert_type(changes, TableDiff)
    assert_type(changes.added["w"], SourceLayout)
    assert_type(changes.removed.get("w"), SourceLayout | None)
    assert_type(changes.changed["w"], tuple[SourceLayout, SourceLayout])
    assert_type(str(changes), str)
    assert_type(bool(changes), bool)


def plans() -> None:
    # A planner's natural spelling type-checks: placements of several kinds in one dict.
    attn = ModulePlan({"wq.weight": {"tp": Shard(0), "dp_shard": Replicate()}, "bias": {}})
    moe = ModulePlan({"experts.w1": {AxisName("ep"): Shard(0)}}, expert_parallel=True)
    plan = ShardingPlan(
        {"layers.0.attn": attn, "layers.0.moe": moe},
        mesh_axes=["dp_shard", "tp", "ep"],
        tied_pairs=[("emb.weight", "head.weight")],
    )
    assert_type(plan.mesh_axes, tuple[AxisName, ...])
    assert_type(plan.tied_pairs, tuple[tuple[str, str], ...])
    assert_type(plan.modules["layers.0.attn"], ModulePlan)
    assert_type(plan.modules["layers.0.attn"].params["wq.weight"]["tp"], Placement)
    assert_type(attn.expert_parallel, bool)


def errors(e: PlanError, t: TiedLayoutConflict, s: PlacementSyntaxError) -> None:
    assert_type(e.problems, tuple[LayoutError, ...])
    assert_type(e.fqn, str | None)
    assert_type(e.axis, str | None)
    assert_type(e.placement, str | None)
    assert_type(e.message, str)
    assert_type(t.group, tuple[str, ...])
    assert_type(t.placements, tuple[str, str])
    assert_type(t.sources, tuple[str, str])
    assert_type(s.text, str)
    err: ValueError = SerializationError("bad", path="$")
    assert_type(err, ValueError)


def strategies() -> None:
    assert_type(axis_names(), SearchStrategy[AxisName])
    assert_type(placements(), SearchStrategy[Placement])
    assert_type(placements(kinds=(Shard, Replicate)), SearchStrategy[Placement])
    assert_type(source_placements(), SearchStrategy[Placement])
    assert_type(source_layouts(mesh="dense", axes=["tp"]), SearchStrategy[SourceLayout])
    assert_type(tables(), SearchStrategy[ParamLayoutTable])
    assert_type(sharding_plans(expert_parallel=True), SearchStrategy[ShardingPlan])


def the_step(report: layout_algebra.LintReport) -> None:
    unit = layout_algebra.FSDPUnit(["norm", "lm_head"], reshard_after_forward=2)
    assert_type(unit.modules, tuple[str, ...])
    assert_type(unit.reshard_after_forward, bool | int)
    kept = layout_algebra.Optimizer(states=2, scalars=1)
    assert_type(kept.states, int)
    training = layout_algebra.Training(optimizer=kept, units=["layers.*", unit], frozen=["emb"])
    assert_type(training.units, tuple[str | layout_algebra.FSDPUnit, ...])
    assert_type(training.optimizer, str | layout_algebra.Optimizer)
    assert_type(training.root_reshard_after_forward, bool | int | None)
    assert_type(training.frozen, tuple[str, ...])
    assert_type(training.kept, layout_algebra.Optimizer)
    assert_type(report.assumptions, tuple[str, ...])


def pipeline_stages(report: layout_algebra.LintReport) -> None:
    stages = layout_algebra.Stages("pp", [["tok_embeddings", "layers.0"], ["layers.1"]])
    assert_type(stages.axis, str)
    assert_type(stages.stages, tuple[tuple[str, ...], ...])
    assert_type(stages.schedule, str)
    assert_type(stages.microbatches, int | None)
    assert_type(layout_algebra.Stages.balanced("pp", layers=4, pp=2), layout_algebra.Stages)
    assert_type(report.memory.by_stage[0], tuple[int, ...])


def activations() -> None:
    acts = layout_algebra.Activations(units={"layers.0": {"heads": 64}}, batch=1, seq_len=8)
    assert_type(acts.units["layers.0"]["heads"], int)
    assert_type(acts.recompute.get("layers.0", 0), int)
    assert_type(acts.checkpointing, str)
    assert_type(acts.held(tp=2, cp=2, sequence_parallel=True), int)
    assert_type(acts.total, int)


def fitting(table: ParamLayoutTable, shapes: dict[str, layout_algebra.ParamShape]) -> None:
    report = layout_algebra.fit(
        shapes,
        ranks=8,
        budget=2**30,
        training=layout_algebra.Training(),
        plan_for=lambda meshes: table,
        axes=["dp_shard", "tp"],
    )
    assert_type(report, layout_algebra.FitReport)
    row = report.rows[0]
    assert_type(row, layout_algebra.FitRow)
    assert_type(row.mesh["dense"], layout_algebra.Mesh)
    assert_type(row.peak, int)
    assert_type(row.traffic["all_gather"], int)
    assert_type(row.slowest, tuple[str, int])
    assert_type(row.notes, tuple[str, ...])
    assert_type(report.pruned["cut heads"], int)
    assert_type(report.nearest, layout_algebra.FitRow | None)
    assert_type(report.least, int | None)


def exports() -> None:
    assert_type(layout_algebra.__all__, list[str])
