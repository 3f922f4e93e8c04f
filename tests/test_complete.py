"""A plan's complete table for a model's FQNs (``table_from_plan``) and FSDP's shard dim
by mesh role (``shard_dims_by_role``): what the command line's ``table --fqns`` and
``lint`` of a plan ask of the library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layout_algebra import (
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    build_table,
    complete_default,
    lint,
)
from layout_algebra._complete import shard_dims_by_role, table_from_plan
from layout_algebra.cli import main
from layout_algebra.serialization import plan_to_json, shapes_to_json
from tests.test_cli import PATTERN_FQNS, pattern_plan, write

S0, S1, R = Shard(0), Shard(1), Replicate()
PLAIN = SourceLayout("dense", (), ())


def test_table_from_plan_is_the_plan_built_and_completed_plain() -> None:
    made = table_from_plan(
        pattern_plan(), PATTERN_FQNS, mesh_axes=["dp_shard", "tp"], expert_axes=["ep", "tp"]
    )
    built = build_table(
        pattern_plan(), ["dp_shard", "tp"], expert_axes=["ep", "tp"], fqns=PATTERN_FQNS
    )
    assert made == complete_default(built, PATTERN_FQNS, ["dp_shard", "tp"], plain=True)
    assert list(made) == [*built, *(fqn for fqn in PATTERN_FQNS if fqn not in built)]
    assert made["output.weight"] == PLAIN


def test_table_from_plan_takes_meshes() -> None:
    given = table_from_plan(
        pattern_plan(),
        PATTERN_FQNS,
        mesh_axes=Mesh({"dp_shard": 2, "tp": 2}),
        expert_axes=Mesh({"ep": 2, "tp": 2}),
    )
    named = table_from_plan(
        pattern_plan(), PATTERN_FQNS, mesh_axes=["dp_shard", "tp"], expert_axes=["ep", "tp"]
    )
    assert given == named


def tied_plan() -> ShardingPlan:
    return ShardingPlan(
        {"attn": ModulePlan({"wq.weight": {"tp": S0}})},
        mesh_axes=["tp"],
        tied_pairs=[("emb.weight", "head.weight")],
    )


def test_table_from_plan_ties_the_parameters_it_completes() -> None:
    made = table_from_plan(
        tied_plan(), ["emb.weight", "attn.wq.weight", "head.weight"], mesh_axes=["tp"]
    )
    assert made.tied == (frozenset({"emb.weight", "head.weight"}),)
    assert made["emb.weight"] == made["head.weight"] == PLAIN


def test_a_tied_alias_the_checkpoint_lacks_is_no_unmatched_key() -> None:
    # a checkpoint stores one of two tied parameters; the plan may name the other
    plan = ShardingPlan(
        {"head": ModulePlan({"weight": {"tp": S0}})},
        mesh_axes=["tp"],
        tied_pairs=[("emb.weight", "head.weight")],
    )
    made = table_from_plan(plan, ["emb.weight", "norm.weight"], mesh_axes=["tp"])
    assert made["emb.weight"] == made["head.weight"] == SourceLayout("dense", ["tp"], [S0])
    assert made["norm.weight"] == PLAIN


def test_a_key_no_fqn_matches_is_a_problem_of_the_plan() -> None:
    plan = ShardingPlan({"atn": ModulePlan({"wq.weight": {"tp": S0}})}, mesh_axes=["tp"])
    with pytest.raises(PlanError) as caught:
        table_from_plan(plan, ["attn.wq.weight"], mesh_axes=["tp"])
    assert [p.fqn for p in caught.value.problems] == ["atn.wq.weight"]


@pytest.mark.parametrize(
    ("fqns", "axes", "words"),
    [
        ("attn.wq.weight", ["tp"], "fqns must be a collection"),
        (None, ["tp"], "fqns must be a collection"),
        (["attn.wq.weight"], "tp", "mesh_axes must be a collection"),
        (["attn.wq.weight"], 4, "mesh_axes must be a collection"),
    ],
)
def test_table_from_plan_names_a_bad_argument(fqns: object, axes: object, words: str) -> None:
    with pytest.raises(LayoutError, match=words):
        table_from_plan(tied_plan(), fqns, mesh_axes=axes)  # type: ignore[arg-type]  # wrong on purpose


def test_table_from_plan_refuses_what_is_not_a_plan() -> None:
    with pytest.raises(LayoutError, match="plan must be a ShardingPlan"):
        table_from_plan({"attn": {}}, ["w"], mesh_axes=["tp"])  # type: ignore[arg-type]  # wrong on purpose


def test_shard_dims_by_role() -> None:
    table = ParamLayoutTable(
        {
            "w": SourceLayout("dense", ["tp"], [S0]),
            "experts.w1": SourceLayout("expert", ["ep"], [S0]),
        }
    )
    assert shard_dims_by_role(table, {"expert": 1}) == {"w": 0, "experts.w1": 1}
    assert shard_dims_by_role(table, {}, default=1) == {"w": 1, "experts.w1": 1}
    assert shard_dims_by_role(table, {"dense": 2, "expert": 0}) == {"w": 2, "experts.w1": 0}


@pytest.mark.parametrize(
    ("table", "dims", "default", "words"),
    [
        ({"w": PLAIN}, {"expert": 1}, 0, r"shard_dims_by_role\(table=\.\.\.\) must be a"),
        (ParamLayoutTable({}), [("expert", 1)], 0, "dims must map a mesh role"),
        (ParamLayoutTable({}), {"expert": -1}, 0, "shard dim of 'expert'"),
        (ParamLayoutTable({}), {"expert": True}, 0, "shard dim of 'expert'"),
        (ParamLayoutTable({}), {"expert": 1}, "0", "shard dim of 'default'"),
    ],
)
def test_shard_dims_by_role_names_a_bad_argument(
    table: object, dims: object, default: object, words: str
) -> None:
    with pytest.raises(LayoutError, match=words):
        shard_dims_by_role(table, dims, default=default)  # type: ignore[arg-type]  # wrong on purpose


def test_lint_of_a_plan_is_lint_of_its_complete_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the plan leaves its tied pair plain: the command line ties them as the library does
    shapes = {
        "emb.weight": ParamShape((16, 8), "float32"),
        "attn.wq.weight": ParamShape((8, 8), "float32"),
        "head.weight": ParamShape((16, 8), "float32"),
    }
    plan = write(tmp_path / "plan.json", plan_to_json(tied_plan()))
    shapes_file = write(tmp_path / "shapes.json", shapes_to_json(shapes))
    argv = ["lint", plan, "--shapes", shapes_file, "--mesh", "dp_shard=2,tp=2", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    table = table_from_plan(tied_plan(), shapes, mesh_axes=["dp_shard", "tp"])
    meshes = {"dense": Mesh({"dp_shard": 2, "tp": 2})}
    expected = lint(table, shapes, mesh_sizes=meshes, fsdp={"dense": "dp_shard"})
    assert got == expected.to_dict()
    assert got["memory"]["bytes_per_rank"] == [320] * 4  # the tied pair counted once
