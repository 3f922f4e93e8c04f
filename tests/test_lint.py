"""Whole-table FSDP composition, FSDP2's real storage and the lint, against torch itself.

The oracles: the placements torch's ``fully_shard`` gives every parameter of a model laid
out by a table (fake 8-rank process group); the rows each rank really keeps after
``distribute_tensor`` and ``fully_shard`` (values = global flat index); the per-rank bytes
of real transformers models after their plan and ``fully_shard``.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import random
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import Shard as TorchShard

from layout_algebra import (
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Placement,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    compose_fsdp,
    compose_table,
    format_placement,
    parse_placement,
)
from layout_algebra._complete import table_from_plan
from layout_algebra.cli import main
from layout_algebra.draw import draw
from layout_algebra.fsdp import FsdpAxes, fsdp_storage_runs, split_fsdp
from layout_algebra.geometry import Runs, local_runs
from layout_algebra.lint import LintNote, lint
from layout_algebra.serialization import plan_from_json, plan_to_json, shapes_to_json, to_json
from layout_algebra.shapes import ParamShape, shapes_from_safetensors
from layout_algebra.torch_bridge import distribute, shapes_from_module, to_torch
from layout_algebra.torch_bridge.transformers import plan_from_hf
from tests.models import OneParam, Sizes, TiedTP, hf_llama, hf_moe
from tests.torch_oracle import (
    MeshFactory,
    coordinates,
    dtensor_indices,
    layout_of,
    on_fake_ranks,
)

S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()


def lay_out(param: nn.Parameter, layout: SourceLayout, mesh: DeviceMesh) -> nn.Parameter:
    """``param`` as torch's ``distribute_tensor`` lays it out (a plain layout stays plain)."""
    if not layout.axes:
        return param
    names = tuple(a.name for a in layout.axes)
    sub = mesh[names[0]] if len(names) == 1 else mesh[names]
    placements = [to_torch(p) for p in layout.placements]
    return nn.Parameter(distribute_tensor(param.detach(), sub, placements))


# ---------------------------------------------------------------------------------------
# compose_table against fully_shard


def moe() -> TiedTP:
    """A tied embedding and head, TP linears, a plain norm and a block of experts."""
    return TiedTP(hidden=10, norm=True, experts=4)


MOE_TABLE = ParamLayoutTable(
    {
        "emb.weight": SourceLayout("dense", ["tp"], [S0]),
        "up.weight": SourceLayout("dense", ["tp"], [S0]),
        "up.bias": SourceLayout("dense", ["tp"], [S0]),
        "down.weight": SourceLayout("dense", ["tp"], [S1]),
        "down.bias": SourceLayout("dense", ["tp"], [R]),
        "norm": SourceLayout("dense", (), ()),
        "experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S1]),
        "experts.w2": SourceLayout("expert", ["ep", "tp"], [S0, S2]),
        "head.weight": SourceLayout("dense", ["tp"], [S0]),
    },
    tied=[frozenset({"emb.weight", "head.weight"})],
)

DENSE_FSDP = {"dp_shard": 4, "tp": 2}
DENSE_HSDP = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
EXPERT = {"edp_shard": 2, "ep": 2, "tp": 2}


@pytest.mark.parametrize(
    ("dense_sizes", "dense_fsdp", "expert_dim"),
    [
        (DENSE_FSDP, "dp_shard", 0),
        (DENSE_HSDP, ("dp_replicate", "dp_shard"), 0),
        (DENSE_FSDP, "dp_shard", 1),
    ],
    ids=["fsdp", "hsdp", "experts-on-dim-1"],
)
def test_compose_table_predicts_fully_shard(
    world_mesh: MeshFactory,
    dense_sizes: dict[str, int],
    dense_fsdp: str | tuple[str, str],
    expert_dim: int,
) -> None:
    meshes = {"dense": world_mesh(dense_sizes), "expert": world_mesh(EXPERT)}
    model = moe()
    for fqn, layout in MOE_TABLE.items():
        module_name, _, name = fqn.rpartition(".")
        module = model.get_submodule(module_name)
        if fqn != "head.weight":  # an alias of emb.weight: laid out once, kept tied below
            setattr(module, name, lay_out(getattr(module, name), layout, meshes[layout.mesh]))
    model.head.weight = model.emb.weight
    fully_shard(
        model.experts,
        mesh=meshes["expert"]["edp_shard"],
        shard_placement_fn=lambda _: TorchShard(expert_dim),
    )
    dense_axes = (dense_fsdp,) if isinstance(dense_fsdp, str) else dense_fsdp
    fully_shard(model, mesh=meshes["dense"][dense_axes])

    composed = compose_table(
        MOE_TABLE,
        fsdp={"dense": dense_fsdp, "expert": "edp_shard"},
        mesh_sizes={"dense": dense_sizes, "expert": EXPERT},
        shard_dim={"experts.w1": expert_dim, "experts.w2": expert_dim},
    )
    assert list(composed) == list(MOE_TABLE)
    assert composed.tied == MOE_TABLE.tied
    assert model.head.weight is model.emb.weight
    for fqn, param in model.named_parameters(remove_duplicate=False):
        role = MOE_TABLE[fqn].mesh
        assert isinstance(param, DTensor)
        assert composed[fqn] == layout_of(param, role), fqn


def test_a_plain_parameter_gets_fsdps_own_placements() -> None:
    table = ParamLayoutTable({"norm.weight": SourceLayout("dense", (), ())})
    composed = compose_table(
        table, fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": {"dp_shard": 8}}
    )
    assert composed["norm.weight"] == SourceLayout("dense", ["dp_shard"], [S0])


def test_compose_table_strides_where_the_source_shards_fsdps_dim() -> None:
    table = ParamLayoutTable({"w": SourceLayout("expert", ["ep", "tp"], [S0, S0])})
    composed = compose_table(
        table,
        fsdp={"expert": "dp_shard"},
        mesh_sizes={"expert": {"dp_shard": 2, "ep": 2, "tp": 2}},
    )
    assert composed["w"].placements == (StridedShard(0, split_factor=4), S0, S0)


# ---------------------------------------------------------------------------------------
# compose_table: every problem at once, named


def test_compose_table_reports_every_parameter_it_cannot_compose() -> None:
    table = ParamLayoutTable(
        {
            "a": SourceLayout("expert", ["ep"], [S0]),  # no FSDP axis for 'expert'
            "b": SourceLayout("dense", ["dp_shard"], [S0]),  # composed already
            "c": SourceLayout("dense", ["tp", "ep", "sp"], [S0, R, R]),  # too wide for FSDP2
            "d": SourceLayout("dense", ["tp"], [S0]),
        }
    )
    sizes = {"dense": {"dp_shard": 1, "tp": 2, "ep": 2, "sp": 2}}
    with pytest.raises(PlanError) as caught:
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes)
    problems = caught.value.problems
    assert [p.fqn for p in problems] == ["a", "b", "c"]
    assert "no FSDP axis for mesh role 'expert'" in problems[0].message
    assert "fsdp={'expert'" in problems[0].message
    assert "owned by FSDP" in problems[1].message
    assert problems[1].axis == "dp_shard"
    assert problems[1].placement == "S(0)"
    assert problems[2].message.startswith("c: ")
    assert "at most 2 source axes" in problems[2].message
    assert "3 problems" in str(caught.value)


def test_owned_replaces_the_owned_axes() -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["cp"], [S0])})
    sizes = {"dense": {"dp_shard": 4, "cp": 2}}
    with pytest.raises(PlanError, match=r"'cp'.*owned by FSDP"):
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes)
    composed = compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, owned=["dp"])
    assert composed["w"].placements == (StridedShard(0, split_factor=2), S0)


def test_tied_members_share_one_shard_dim() -> None:
    layout = SourceLayout("dense", ["tp"], [R])
    table = ParamLayoutTable({"emb": layout, "head": layout}, tied=[frozenset({"emb", "head"})])
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    with pytest.raises(PlanError, match=r"tied group \['emb', 'head'\].*same shard_dim"):
        compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, shard_dim={"emb": 1})
    both = compose_table(
        table, fsdp={"dense": "dp_shard"}, mesh_sizes=sizes, shard_dim={"emb": 1, "head": 1}
    )
    assert both["emb"] == both["head"] == SourceLayout("dense", ["dp_shard", "tp"], [S1, R])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fsdp": "dp_shard"}, "fsdp must map each mesh role"),
        ({"fsdp": {"dense": ["dp_shard"]}}, r"fsdp\['dense'\] must be FSDP's shard axis"),
        ({"fsdp": {"dense": ("dp_shard", "dp_shard")}}, "replicates and shards over one axis"),
        ({"mesh_sizes": {"dp_shard": 8}}, r"mesh_sizes\['dp_shard'\] must"),
        (
            {"mesh_sizes": {"dense": {"dp_shard": 8}, "expert": {"ep": 4}}},
            "every role's mesh spans the whole world",
        ),
        ({"shard_dim": {"nope": 1}}, "shard_dim names 'nope', which is not a parameter"),
        ({"shard_dim": -1}, "shard_dim must be an int from 0 to 63"),
        ({"shard_dim": {"w": "1"}}, r"w: shard_dim must be an int from 0 to 63, got '1'"),
    ],
)
def test_compose_table_arguments(kwargs: dict[str, object], match: str) -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", (), ())})
    args: dict[str, object] = {
        "fsdp": {"dense": "dp_shard"},
        "mesh_sizes": {"dense": {"dp_shard": 8}},
        **kwargs,
    }
    with pytest.raises(LayoutError, match=match):
        compose_table(table, **args)  # type: ignore[arg-type]


def test_compose_table_wants_a_table() -> None:
    with pytest.raises(
        LayoutError, match=r"compose_table\(table=\.\.\.\) must be a ParamLayoutTable"
    ):
        compose_table({"w": SourceLayout("dense", (), ())}, fsdp={}, mesh_sizes={})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# lint: every kind of problem at once, the report, composed tables

F32 = "float32"


def test_lint_reports_every_problem_at_once() -> None:
    table = ParamLayoutTable(
        {
            "a": SourceLayout("dense", ["tp"], [S2]),  # a 2-D parameter has no dim 2
            "b": SourceLayout("dense", ["tp"], [S0]),  # no shape
            "d": SourceLayout("expert", ["ep"], [S0]),  # no FSDP axis for the expert role
            "e": SourceLayout("dense", ["tp"], [S0]),
        }
    )
    shapes = {fqn: ParamShape((8, 4), F32) for fqn in ("a", "c", "d", "e")}
    report = lint(
        table,
        shapes,
        mesh_sizes={"dense": {"dp_shard": 4, "tp": 2}, "expert": {"dp_shard": 2, "ep": 4}},
        fsdp={"dense": "dp_shard"},
    )
    assert [(p.fqn, p.kind) for p in report.problems] == [
        ("a", "shard-dim"),
        ("b", "no-shape"),
        ("d", "layout"),
        ("c", "no-layout"),
    ]
    for problem in report.problems:
        assert isinstance(problem, LayoutError)
        assert problem.message.startswith(f"{problem.fqn}: ")
    shard_dim = report.problems[0]
    assert (shard_dim.axis, shard_dim.placement) == ("tp", "S(2)")
    assert "shards dim 2, but the parameter is float32[8, 4] (2 dims)" in shard_dim.message
    assert "no FSDP axis for mesh role 'expert'" in report.problems[2].message
    assert not report.ok
    with pytest.raises(PlanError, match="4 problems") as caught:
        report.raise_for_problems()
    assert caught.value.problems == report.problems
    # only e is counted: 8 x 4 floats over tp=2 and dp_shard=4, 16 bytes a rank
    assert report.memory.bytes_per_rank == (16,) * 8
    assert report.memory.by_role["dense"] == (16,) * 8
    assert report.memory.by_role["expert"] == (0,) * 8


def test_a_tied_storage_counts_once_and_an_alias_takes_its_shape() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    tied = ParamLayoutTable(
        {"emb.weight": layout, "head.weight": layout},
        tied=[frozenset({"emb.weight", "head.weight"})],
    )
    alone = ParamLayoutTable({"emb.weight": layout})
    shapes = {"emb.weight": ParamShape((37, 16), "bfloat16")}  # a checkpoint keeps one name
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    report = lint(tied, shapes, mesh_sizes=sizes, fsdp={"dense": "dp_shard"})
    assert report.problems == ()
    assert report.memory == lint(alone, shapes, mesh_sizes=sizes, fsdp={"dense": "dp_shard"}).memory
    assert [n.fqn for n in report.notes] == ["emb.weight"]  # 37 rows: uneven, noted once
    assert "uneven shards of bfloat16[37, 16]" in report.notes[0].message


def test_parameters_laid_out_alike_share_one_note() -> None:
    """Thousands of experts alike are one note naming them all, with their padding summed:
    the same padding as a note for each, and one line in the report."""
    layout = SourceLayout("dense", ["tp"], [S0])
    names = [f"layers.{i}.w" for i in range(5)]
    table = ParamLayoutTable({**dict.fromkeys(names, layout), "other.w": layout})
    shapes = {n: ParamShape((37, 16), "bfloat16") for n in names}
    shapes["other.w"] = ParamShape((32, 16), "bfloat16")  # even: no note
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    report = lint(table, shapes, mesh_sizes=sizes, fsdp={"dense": "dp_shard"})
    (note,) = report.notes
    assert (note.fqn, note.fqns) == (names[0], tuple(names))
    alone = lint(
        ParamLayoutTable({names[0]: layout}),
        {names[0]: shapes[names[0]]},
        mesh_sizes=sizes,
        fsdp={"dense": "dp_shard"},
    ).notes[0]
    assert alone.fqns == (names[0],) and alone.padding_bytes > 0
    assert note.padding_bytes == 5 * alone.padding_bytes
    assert note.message.startswith(alone.message)
    assert "the same for all 5 parameters laid out alike" in note.message
    padding = sum(report.memory.padded_bytes_per_rank) - report.memory.total
    assert note.padding_bytes == padding
    with pytest.raises(LayoutError, match="must start with its fqn"):
        LintNote("a.w", "uneven", 0, ("b.w", "a.w"))
    with pytest.raises(LayoutError, match="LintNote\\(fqns\\)"):
        LintNote("a.w", "uneven", 0, "a.w")  # text is no list of FQNs


def test_a_composed_table_lints_as_its_source_with_fsdp() -> None:
    table = ParamLayoutTable(
        {
            "experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S0]),
            "wq": SourceLayout("dense", ["tp"], [S0]),
            "norm": SourceLayout("dense", (), ()),
        }
    )
    shapes = {
        "experts.w1": ParamShape((5, 3), F32),
        "wq": ParamShape((7, 4), F32),
        "norm": ParamShape((7,), F32),
    }
    sizes = {"dense": {"dp_shard": 4, "tp": 2}, "expert": {"dp_shard": 2, "ep": 2, "tp": 2}}
    fsdp: dict[str, FsdpAxes] = {"dense": "dp_shard", "expert": "dp_shard"}
    source = lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp)
    composed = compose_table(table, fsdp=fsdp, mesh_sizes=sizes)
    read = lint(composed, shapes, mesh_sizes=sizes)
    assert read.memory == source.memory
    assert [(p.fqn, p.kind, p.ranks) for p in read.problems] == [
        (p.fqn, p.kind, p.ranks) for p in source.problems
    ]
    assert [p.kind for p in read.problems] == ["storage"]
    with pytest.raises(LayoutError, match="shard_dim applies with fsdp"):
        lint(composed, shapes, mesh_sizes=sizes, shard_dim=1)


def test_a_composed_layout_fully_shard_does_not_make_is_a_problem() -> None:
    # fully_shard makes _S(0, 2) on dp_shard when tp shards the same dim
    wrong = SourceLayout("dense", ["dp_shard", "tp"], [S0, S0])
    report = lint(
        ParamLayoutTable({"w": wrong}),
        {"w": ParamShape((8, 4), F32)},
        mesh_sizes={"dense": {"dp_shard": 4, "tp": 2}},
    )
    (problem,) = report.problems
    assert problem.kind == "layout"
    assert "is not what fully_shard makes of dense[tp=S(0)]" in problem.message
    assert "dense[dp_shard=_S(0, 2), tp=S(0)]" in problem.message


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        (
            SourceLayout("dense", ["dp_replicate", "dp_shard", "cp", "tp"], [R, S0, R, R]),
            "3 leading FSDP axes",
        ),
        (SourceLayout("dense", ["tp", "dp_shard"], [R, S0]), "owned axis 'dp_shard' .* after"),
        (SourceLayout("dense", ["dp_replicate", "dp_shard"], [S0, S0]), "not what fully_shard"),
    ],
)
def test_split_fsdp_refuses_what_fully_shard_does_not_make(
    layout: SourceLayout, match: str
) -> None:
    sizes = {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}
    with pytest.raises(LayoutError, match=match):
        split_fsdp(layout, sizes)


def test_the_report_reads_and_serialises() -> None:
    case_table = ParamLayoutTable({"experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S0])})
    report = lint(
        case_table,
        {"experts.w1": ParamShape((5, 3), "bfloat16")},
        mesh_sizes={"expert": {"dp_shard": 2, "ep": 2, "tp": 2}},
        fsdp={"expert": "dp_shard"},
    )
    text = str(report)
    assert text.splitlines()[0] == "1 problem, 1 note, 8 ranks"
    assert "  - experts.w1: FSDP2 keeps other indices of dim 0" in text
    assert "parameter bytes per rank after FSDP:" in text
    assert "largest: rank 0, 6 B; smallest: rank 5, 0 B" in text
    doc = report.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    (problem,) = pickle.loads(pickle.dumps(report.problems))
    assert (problem.message, problem.kind, problem.fqn, problem.ranks, problem.axis) == (
        report.problems[0].message,
        "storage",
        "experts.w1",
        (2, 3, 6),
        "dp_shard",
    )
    problems = doc["problems"]
    assert isinstance(problems, list)
    assert problems[0]["ranks"] == [2, 3, 6]
    memory = doc["memory"]
    assert isinstance(memory, dict)
    assert memory["bytes_per_rank"] == list(report.memory.bytes_per_rank)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            {"table": {"w": SourceLayout("dense", (), ())}},
            r"lint\(table=\.\.\.\) must be a ParamLayoutTable",
        ),
        ({"shapes": [("w", ParamShape((2,), F32))]}, "shapes must map parameter FQN"),
        ({"shapes": {"w": (2,)}}, r"shapes\['w'\] must be a ParamShape"),
        ({"shapes": {"v": (2,)}}, r"shapes\['v'\] must be a ParamShape"),
        ({"mesh_sizes": {}}, "mesh_sizes names no mesh role"),
        ({"fsdp": "dp_shard"}, "fsdp must map each mesh role"),
    ],
)
def test_lint_arguments(args: dict[str, object], match: str) -> None:
    kwargs: dict[str, object] = {
        "table": ParamLayoutTable({"w": SourceLayout("dense", (), ())}),
        "shapes": {"w": ParamShape((2,), F32)},
        "mesh_sizes": {"dense": {"dp_shard": 8}},
        "fsdp": {"dense": "dp_shard"},
        **args,
    }
    with pytest.raises(LayoutError, match=match):
        lint(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# the command line: layout-algebra lint


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' tiny Llama saved by ``save_pretrained`` in shards, its plan beside."""
    where = tmp_path_factory.mktemp("llama")
    model = hf_llama(Sizes(layers=2))
    module: nn.Module = model
    module.to_empty(device="cpu").to(torch.bfloat16)  # both in place
    model.save_pretrained(where, max_shard_size="8KB", safe_serialization=True)
    plan = plan_from_hf(model, mesh_axes=["dp_shard", "tp"])
    (where / "plan.json").write_text(plan_to_json(plan))
    return where


def test_lint_reads_a_plan_and_a_sharded_checkpoint(
    hf_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = str(hf_checkpoint / "model.safetensors.index.json")
    plan = str(hf_checkpoint / "plan.json")
    argv = ["lint", plan, "--shapes", index, "--mesh", "dp_shard=4,tp=2", "--fsdp", "dp_shard"]
    code, out, err = run_cli(argv, capsys)
    assert (code, err) == (0, "")
    shapes = shapes_from_safetensors(index)
    assert out.splitlines()[0].endswith(
        f"plan.json: {len(shapes)} parameters on dense (dp_shard=4, tp=2); FSDP over dense dp_shard"
    )
    assert "parameter bytes per rank after FSDP:" in out
    # the same as the API on the same plan, with the unplanned parameters plain
    table = table_from_plan(
        plan_from_json(Path(plan).read_text()), shapes, mesh_axes=["dp_shard", "tp"]
    )
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    expected = lint(table, shapes, mesh_sizes=sizes, fsdp={"dense": "dp_shard"})
    code, out, _ = run_cli([*argv, "--json"], capsys)
    assert code == 0
    assert json.loads(out) == expected.to_dict()


def test_lint_matches_a_plans_patterns_against_the_shapes(
    hf_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = ShardingPlan(
        {"model.layers.*.self_attn": ModulePlan({"*.weight": {"tp": S0}})},
        mesh_axes=["dp_shard", "tp"],
    )
    (tmp_path / "plan.json").write_text(plan_to_json(plan))
    index = str(hf_checkpoint / "model.safetensors.index.json")
    argv = ["lint", str(tmp_path / "plan.json"), "--shapes", index, "--mesh", "dp_shard=4,tp=2"]
    code, out, _ = run_cli([*argv, "--fsdp", "dp_shard", "--json"], capsys)
    assert code == 0
    shapes = shapes_from_safetensors(index)
    table = build_table(plan, ["dp_shard", "tp"], fqns=list(shapes))
    assert len(table) == 8  # q, k, v, o of both layers
    table = table.with_entries(
        {fqn: SourceLayout("dense", (), ()) for fqn in shapes if fqn not in table}
    )
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    assert (
        json.loads(out)
        == lint(table, shapes, mesh_sizes=sizes, fsdp={"dense": "dp_shard"}).to_dict()
    )


def test_lint_exits_1_on_the_checkpoint_hazard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = ParamLayoutTable(
        {
            "experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S0]),
            "wq.weight": SourceLayout("dense", ["tp"], [S0]),
        }
    )
    (tmp_path / "table.json").write_text(to_json(table))
    shapes = {"experts.w1": ParamShape((5, 3), "bfloat16"), "wq.weight": ParamShape((8, 8), F32)}
    (tmp_path / "shapes.json").write_text(shapes_to_json(shapes))
    argv = [
        "lint",
        str(tmp_path / "table.json"),
        "--shapes",
        str(tmp_path / "shapes.json"),
        "--mesh",
        "dp_shard=4,tp=2",
        "--expert-mesh",
        "dp_shard=2,ep=2,tp=2",
        "--fsdp",
        "dp_shard",
    ]
    code, out, err = run_cli(argv, capsys)
    assert code == 1
    assert err == f"layout-algebra: {tmp_path / 'table.json'}: 1 problem (see the report)\n"
    assert "experts.w1: FSDP2 keeps other indices of dim 0" in out
    assert "on ranks 2-3, 6" in out
    code, out, _ = run_cli([*argv, "--json"], capsys)
    assert code == 1
    (problem,) = json.loads(out)["problems"]
    assert (problem["fqn"], problem["kind"], problem["ranks"]) == (
        "experts.w1",
        "storage",
        [2, 3, 6],
    )
    # without --fsdp a table naming no FSDP axis is a source table: FSDP over the mesh's
    # one FSDP axis, as for a plan, so the hazard is found all the same
    code, again, _ = run_cli(argv[:-2], capsys)
    assert code == 1
    assert "the table's layouts name no FSDP axis: read as source layouts" in again
    assert "experts.w1: FSDP2 keeps other indices of dim 0" in again


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        (["--fsdp", "a,b,c"], 2),
        (["--shard-dim", "-1"], 2),
        (["--fsdp", "dp_replicate,dp_shard"], 2),  # the dense mesh has no dp_replicate
    ],
)
def test_lint_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], code: int
) -> None:
    (tmp_path / "t.json").write_text(
        to_json(ParamLayoutTable({"w": SourceLayout("dense", (), ())}))
    )
    (tmp_path / "s.json").write_text(shapes_to_json({"w": ParamShape((4,), F32)}))
    argv = ["lint", str(tmp_path / "t.json"), "--shapes", str(tmp_path / "s.json")]
    got, _, err = run_cli([*argv, "--mesh", "dp_shard=8", *extra], capsys)
    assert got == code
    assert err.count("\n") == 1 or code == 2


# ---------------------------------------------------------------------------------------
# FSDP2's real storage and the lint, against the values torch really keeps
#
# The fake process group moves no data, but neither ``distribute_tensor(...,
# src_data_rank=None)`` (each rank cuts its own full tensor) nor ``fully_shard``'s
# initialisation (each rank chunks its local tensor) needs to: the values a rank keeps are
# real. One process plays every rank in turn (the fake group re-created as rank 0..7), in
# a child process so the session's own fake world is left alone.


class StorageCase(NamedTuple):
    """One parameter of ``shape`` laid out as ``source``, then ``fully_shard`` over ``shard``."""

    sizes: dict[str, int]
    source: SourceLayout
    shard: str
    shard_dim: int
    shape: tuple[int, ...]
    replicate: tuple[str, ...] = ()

    @property
    def fsdp(self) -> str | tuple[str, str]:
        return (self.replicate[0], self.shard) if self.replicate else self.shard

    def composed(self) -> SourceLayout:
        return compose_fsdp(
            self.source,
            shard_axis=self.shard,
            replicate_axes=self.replicate,
            mesh_sizes=self.sizes,
            shard_dim=self.shard_dim,
        )


EP_TP = {"dp_shard": 2, "ep": 2, "tp": 2}
FSDP_TP = {"dp_shard": 4, "tp": 2}
HSDP_TP = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
EP_ONLY = {"dp_shard": 4, "ep": 2}
EXPERT_ROWS = SourceLayout("expert", ["ep", "tp"], [S0, S0])
EXPERT_COLS = SourceLayout("expert", ["ep", "tp"], [S0, S1])
TP_ROWS = SourceLayout("dense", ["tp"], [S0])
TP_COLS = SourceLayout("dense", ["tp"], [S1])

STORAGE_CASES: dict[str, StorageCase] = {
    **{
        f"ep-tp-rows-{rows}x{cols}": StorageCase(EP_TP, EXPERT_ROWS, "dp_shard", 0, (rows, cols))
        for rows, cols in [(5, 3), (6, 3), (9, 2), (3, 2), (7, 1), (8, 3), (16, 2), (12, 3)]
    },
    **{
        f"tp-rows-{rows}x{cols}": StorageCase(FSDP_TP, TP_ROWS, "dp_shard", 0, (rows, cols))
        for rows, cols in [(5, 3), (7, 5), (3, 2), (10, 2), (8, 4)]
    },
    "hsdp-tp-rows-7x3": StorageCase(HSDP_TP, TP_ROWS, "dp_shard", 0, (7, 3), ("dp_replicate",)),
    "hsdp-tp-rows-5x2": StorageCase(HSDP_TP, TP_ROWS, "dp_shard", 0, (5, 2), ("dp_replicate",)),
    "tp-cols-5x3": StorageCase(FSDP_TP, TP_COLS, "dp_shard", 0, (5, 3)),
    "plain-5x3": StorageCase({"dp_shard": 8}, SourceLayout("dense", (), ()), "dp_shard", 0, (5, 3)),
    "experts-3d-dim1-even": StorageCase(
        EP_ONLY, SourceLayout("expert", ["ep"], [S0]), "dp_shard", 1, (3, 8, 2)
    ),
    "experts-3d-dim1-uneven": StorageCase(
        EP_ONLY, SourceLayout("expert", ["ep"], [S0]), "dp_shard", 1, (4, 6, 2)
    ),
    "experts-3d-dim1-tp-even": StorageCase(EP_TP, EXPERT_COLS, "dp_shard", 1, (4, 12, 2)),
    "experts-3d-dim1-tp-some-ranks": StorageCase(EP_TP, EXPERT_COLS, "dp_shard", 1, (4, 7, 2)),
    "experts-3d-dim1-tp-rows": StorageCase(EP_TP, EXPERT_ROWS, "dp_shard", 1, (5, 4, 2)),
}


def random_storage_cases(count: int, seed: int = 0) -> dict[str, StorageCase]:
    """A fixed sweep of random 8-rank worlds: FSDP or HSDP, 0-2 source axes of any sizes
    (mostly two), S(0) (mostly), S(1) or R on each, FSDP on dim 0 or 1, uneven 2-D and
    3-D shapes."""
    rng = random.Random(seed)
    factorings = [
        f
        for n in range(1, 5)
        for f in itertools.product([1, 2, 4, 8], repeat=n)
        if math.prod(f) == 8
    ]
    out: dict[str, StorageCase] = {}
    while len(out) < count:
        hsdp = rng.random() < 0.3
        n_source = rng.choice([0, 1, 2, 2, 2])
        factoring = rng.choice([f for f in factorings if len(f) == n_source + 1 + hsdp])
        names = (["dp_replicate"] if hsdp else []) + ["dp_shard"] + ["ep", "tp"][2 - n_source :]
        sizes = dict(zip(names, factoring, strict=True))
        choices: list[Placement] = [S0, S0, S0, S1, R]
        placements = [rng.choice(choices) for _ in range(n_source)]
        source = SourceLayout("expert", names[1 + hsdp :], placements)
        shape = tuple(rng.randint(1, 13) for _ in range(rng.choice([2, 2, 3])))
        dim = rng.choice([0, 0, 1])
        case = StorageCase(sizes, source, "dp_shard", dim, shape, ("dp_replicate",) if hsdp else ())
        out[f"random-{len(out)}-{source}-{shape}-dim{dim}"] = case
    return out


def random_strided_cases(count: int, seed: int = 1) -> dict[str, StorageCase]:
    """The hazard's family: ``ep`` and ``tp`` both on FSDP's dim, random 2-D and 3-D shapes."""
    rng = random.Random(seed)
    out: dict[str, StorageCase] = {}
    while len(out) < count:
        shape = (rng.randint(1, 24), *(rng.randint(1, 4) for _ in range(rng.choice([1, 2]))))
        out[f"strided-{len(out)}-{shape}"] = StorageCase(EP_TP, EXPERT_ROWS, "dp_shard", 0, shape)
    return out


STORAGE_CASES.update(random_storage_cases(32))
STORAGE_CASES.update(random_strided_cases(12))


def _case_doc(case: StorageCase) -> dict[str, object]:
    return {
        "sizes": list(case.sizes.items()),
        "mesh": case.source.mesh,
        "axes": [a.name for a in case.source.axes],
        "placements": [format_placement(p) for p in case.source.placements],
        "shard": case.shard,
        "replicate": list(case.replicate),
        "shard_dim": case.shard_dim,
        "shape": list(case.shape),
    }


def _kept_on_this_rank(doc: dict[str, Any], meshes: MeshFactory) -> dict[str, object]:
    """What torch keeps of one case's parameter on this process's rank (see below)."""
    sizes = dict(doc["sizes"])
    mesh = meshes(sizes)
    shape = tuple(doc["shape"])
    source = SourceLayout(doc["mesh"], doc["axes"], [parse_placement(p) for p in doc["placements"]])
    module = OneParam(shape)
    with torch.no_grad():
        module.w.copy_(torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape))
    distribute(module, ParamLayoutTable({"w": source}), {source.mesh: mesh}, src_data_rank=None)
    dp_names = (*doc["replicate"], doc["shard"])
    dp = mesh[dp_names] if len(dp_names) > 1 else mesh[dp_names[0]]
    dim = doc["shard_dim"]
    try:
        fully_shard(module, mesh=dp, shard_placement_fn=lambda _: TorchShard(dim))
    except NotImplementedError as e:
        return {"refused": str(e)}
    w = module.w
    assert isinstance(w, DTensor)
    local = w.to_local()
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    flat = local.reshape(-1).to(torch.int64)
    kept = [sorted({int(i) for i in (flat // s) % n}) for s, n in zip(strides, shape, strict=True)]
    coordinate = mesh.get_coordinate()
    assert coordinate is not None
    at = dict(zip(sizes, coordinate, strict=True))
    composed = layout_of(w, source.mesh)
    state = fully_shard.state(module)  # type: ignore[attr-defined]  # set by torch's contract
    (fsdp_param,) = state._fsdp_param_group.fsdp_params
    return {
        "kept": kept if local.numel() else None,
        "local_shape": list(local.shape),
        "element_size": local.element_size(),
        "padded_numel": fsdp_param._sharded_param_data.numel(),
        "composed": [format_placement(p) for p in composed.placements],
        "read": [list(ix) for ix in dtensor_indices(shape, composed, sizes, at)],
    }


def kept_on_rank(rank: int, docs: list[dict[str, Any]]) -> list[dict[str, object]]:
    """What this rank of the fake world keeps of each case (``on_fake_ranks`` plays it)."""
    meshes = MeshFactory(8)
    return [_kept_on_this_rank(doc, meshes) for doc in docs]


@pytest.fixture(scope="module")
def kept_by_torch() -> dict[str, list[dict[str, Any]]]:
    """For each storage case, by global rank, what torch really keeps (from the child)."""
    names = list(STORAGE_CASES)
    docs = [_case_doc(STORAGE_CASES[name]) for name in names]
    by_rank = on_fake_ranks(kept_on_rank, docs)
    return {name: [by_rank[r][i] for r in range(8)] for i, name in enumerate(names)}


def _indices(runs: tuple[Runs, ...]) -> list[list[int]]:
    return [[i for run in dim_runs for i in run] for dim_runs in runs]


def _coordinate(sizes: Mapping[str, int], rank: int) -> dict[str, int]:
    return next(c for r, c in enumerate(coordinates(list(sizes), sizes)) if r == rank)


@pytest.mark.parametrize("name", list(STORAGE_CASES))
def test_fsdp_storage_is_what_torch_keeps(
    name: str, kept_by_torch: dict[str, list[dict[str, Any]]]
) -> None:
    case = STORAGE_CASES[name]
    composed = case.composed()
    for rank, seen in enumerate(kept_by_torch[name]):
        if "refused" in seen:
            continue
        at = _coordinate(case.sizes, rank)
        assert seen["composed"] == [format_placement(p) for p in composed.placements]
        kept = fsdp_storage_runs(case.shape, composed, case.sizes, at)
        assert [sum(map(len, r)) for r in kept] == seen["local_shape"], (name, rank)
        if seen["kept"] is not None:
            assert _indices(kept) == seen["kept"], (name, rank)
        # and DTensor's reading is local_runs of the composed layout
        assert _indices(local_runs(case.shape, composed, case.sizes, at)) == seen["read"]


class _CountedReads(Mapping[str, int]):
    """A mapping that counts how often its values are read."""

    def __init__(self, values: Mapping[str, int]) -> None:
        self._data = dict(values)
        self.reads = 0

    def __getitem__(self, key: str) -> int:
        self.reads += 1
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_fsdp_storage_runs_reads_its_mappings_once() -> None:
    case = next(c for c in STORAGE_CASES.values() if c.replicate)  # HSDP: every kind of axis
    composed = case.composed()
    at = _coordinate(case.sizes, 1)
    sizes, where = _CountedReads(case.sizes), _CountedReads(at)
    kept = fsdp_storage_runs(case.shape, composed, sizes, where)
    assert kept == fsdp_storage_runs(case.shape, composed, case.sizes, at)
    assert (sizes.reads, where.reads) == (len(case.sizes), len(at))


@pytest.mark.parametrize("name", list(STORAGE_CASES))
def test_lint_flags_exactly_where_torch_misreads_or_refuses(
    name: str, kept_by_torch: dict[str, list[dict[str, Any]]]
) -> None:
    case = STORAGE_CASES[name]
    report = lint(
        ParamLayoutTable({"w": case.source}),
        {"w": ParamShape(case.shape, "float32")},
        mesh_sizes={case.source.mesh: case.sizes},
        fsdp={case.source.mesh: case.fsdp},
        shard_dim=case.shard_dim,
    )
    seen = kept_by_torch[name]
    refused = tuple(r for r, s in enumerate(seen) if "refused" in s)
    misread = tuple(
        r
        for r, s in enumerate(seen)
        if "refused" not in s
        and (s["kept"] if s["kept"] is not None else [[]] * len(case.shape)) != s["read"]
        and not (s["kept"] is None and any(not ix for ix in s["read"]))
    )
    by_kind = {p.kind: p for p in report.problems}
    assert set(by_kind) <= {"fsdp-uneven", "storage"}
    assert (by_kind["fsdp-uneven"].ranks if "fsdp-uneven" in by_kind else ()) == refused
    assert (by_kind["storage"].ranks if "storage" in by_kind else ()) == misread
    for problem in report.problems:
        assert problem.fqn == "w"
        assert problem.message.startswith("w: ")
    if refused:
        message = next(s["refused"] for s in seen if "refused" in s)
        assert f"uneven sharding on dim {case.shard_dim}" in message
        assert f"uneven sharding on dim {case.shard_dim}" in by_kind["fsdp-uneven"].message
    for rank, s in enumerate(seen):
        if "refused" not in s:
            held = math.prod(s["local_shape"]) * s["element_size"]
            assert report.memory.bytes_per_rank[rank] == held, (name, rank)
            padded = s["padded_numel"] * s["element_size"]  # what FSDP2 allocates
            assert report.memory.padded_bytes_per_rank[rank] == padded, (name, rank)
    if not refused:
        padding = sum(report.memory.padded_bytes_per_rank) - report.memory.total
        assert sum(n.padding_bytes for n in report.notes) == padding


def test_the_uneven_multi_axis_case_names_ranks_and_rows(
    kept_by_torch: dict[str, list[dict[str, Any]]],
) -> None:
    case = STORAGE_CASES["ep-tp-rows-5x3"]
    report = lint(
        ParamLayoutTable({"experts.w1": case.source}),
        {"experts.w1": ParamShape(case.shape, "bfloat16")},
        mesh_sizes={"expert": case.sizes},
        fsdp={"expert": "dp_shard"},
    )
    (problem,) = report.problems
    assert problem.kind == "storage"
    assert problem.ranks == (2, 3, 6)
    seen = kept_by_torch["ep-tp-rows-5x3"]
    for rank in problem.ranks:
        kept = seen[rank]["kept"]
        rows = "none" if kept is None else ", ".join(map(str, kept[0]))
        read = ", ".join(map(str, seen[rank]["read"][0])) or "none"
        assert f"rank {rank} keeps {rows}, DTensor reads {read}" in problem.message
    assert "expert[dp_shard=_S(0, 4), ep=S(0), tp=S(0)]" in problem.message
    assert "a multiple of 8" in problem.message
    assert problem.axis == "dp_shard"
    assert problem.placement == "_S(0, 4)"
    with pytest.raises(PlanError) as caught:
        report.raise_for_problems()
    assert caught.value.problems == (problem,)


def test_draw_marks_the_ranks_where_fsdp2_keeps_other_rows(
    kept_by_torch: dict[str, list[dict[str, Any]]],
) -> None:
    case = STORAGE_CASES["ep-tp-rows-9x2"]
    out = draw(case.source, case.shape, case.sizes, fqn="w", fsdp=case.shard)
    report = lint(
        ParamLayoutTable({"w": case.source}),
        {"w": ParamShape(case.shape, F32)},
        mesh_sizes={case.source.mesh: case.sizes},
        fsdp={case.source.mesh: case.fsdp},
    )
    (problem,) = report.problems
    marked = re.findall(r"^(\d+) \*\s+(.*)$", out, re.MULTILINE)
    assert [int(rank) for rank, _ in marked] == list(problem.ranks)
    for rank, kept in marked:
        rows = kept_by_torch["ep-tp-rows-9x2"][int(rank)]["kept"]
        expected = "[]" if rows is None else f"[{rows[0][0]}:{rows[0][-1] + 1}]"
        assert kept == f"{expected} x [0:2]"


# ---------------------------------------------------------------------------------------
# per-rank memory of real transformers models, against the bytes torch really holds

HfWorld = tuple[Callable[[], nn.Module], dict[str, dict[str, int]], dict[str, str]]
HF_WORLDS: dict[str, HfWorld] = {
    "llama": (hf_llama, {"dense": {"dp_shard": 4, "tp": 2}}, {"dense": "dp_shard"}),
    "moe": (
        hf_moe,
        {"dense": {"dp_shard": 4, "tp": 2}, "expert": {"edp_shard": 2, "ep": 4}},
        {"dense": "dp_shard", "expert": "edp_shard"},
    ),
}


def hf_model_and_table(kind: str) -> tuple[nn.Module, ParamLayoutTable]:
    """The meta-device transformers model, in bf16, and the table of its own tp/ep plan.

    Parameters the plan leaves alone stay plain tensors until FSDP, as transformers does.
    """
    build, sizes, _ = HF_WORLDS[kind]
    model = build().to(torch.bfloat16)
    dense = list(sizes["dense"])
    expert = list(sizes["expert"]) if "expert" in sizes else None
    plan = plan_from_hf(model, mesh_axes=[*dense, *(expert or [])])
    table = build_table(plan, dense, expert_axes=expert)
    plain = {
        fqn: SourceLayout("dense", (), ())
        for fqn, _ in model.named_parameters(remove_duplicate=False)
        if fqn not in table
    }
    return model, table.with_entries(plain)


def _bytes_on_this_rank(kind: str, factory: MeshFactory) -> dict[str, int]:
    """Parameter bytes by mesh role on this rank after the plan and ``fully_shard``."""
    model, table = hf_model_and_table(kind)
    _, sizes, fsdp = HF_WORLDS[kind]
    meshes = {role: factory(s) for role, s in sizes.items()}
    distribute(model, table, meshes, src_data_rank=None)
    for name, module in model.named_modules():
        if name.endswith("mlp.experts"):
            fully_shard(module, mesh=meshes["expert"][fsdp["expert"]])
    fully_shard(model, mesh=meshes["dense"][fsdp["dense"]])
    held: dict[str, int] = {}
    for fqn, param in model.named_parameters():  # each storage once
        assert isinstance(param, DTensor), fqn
        role = table[fqn].mesh
        held[role] = held.get(role, 0) + param.to_local().numel() * param.element_size()
    return held


def held_on_rank(rank: int) -> dict[str, dict[str, int]]:
    """Per model, the bytes by role this rank of the fake world holds (``on_fake_ranks``)."""
    factory = MeshFactory(8)
    return {kind: _bytes_on_this_rank(kind, factory) for kind in HF_WORLDS}


@pytest.fixture(scope="module")
def held_by_torch() -> dict[str, list[dict[str, int]]]:
    """For each transformers model, by global rank, the bytes torch holds by role."""
    by_rank = on_fake_ranks(held_on_rank)
    return {kind: [held[kind] for held in by_rank] for kind in HF_WORLDS}


@pytest.mark.parametrize("kind", list(HF_WORLDS))
def test_memory_per_rank_is_what_torch_holds(
    kind: str, held_by_torch: dict[str, list[dict[str, int]]]
) -> None:
    model, table = hf_model_and_table(kind)
    _, sizes, fsdp = HF_WORLDS[kind]
    fsdp_axes: dict[str, FsdpAxes] = dict(fsdp)
    report = lint(table, shapes_from_module(model), mesh_sizes=sizes, fsdp=fsdp_axes)
    held = held_by_torch[kind]
    assert report.memory.bytes_per_rank == tuple(sum(h.values()) for h in held)
    for role in sizes:
        assert report.memory.by_role[role] == tuple(h.get(role, 0) for h in held), role
    most = max(sum(h.values()) for h in held)
    assert report.memory.largest == (report.memory.bytes_per_rank.index(most), most)
    assert len(set(report.memory.bytes_per_rank)) > 1  # uneven vocabulary: ranks differ
