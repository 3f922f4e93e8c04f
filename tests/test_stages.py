"""``Stages`` and ``lint(..., stages=...)`` without torch: the value, its JSON, the split
torchtitan makes, and the laws of a staged lint (each stage's rows are the lint of its
parameters alone, placed on the ranks of its pipeline coordinate).

What torch's pipelining really keeps per stage is checked in ``test_stages_torch.py``.
"""

from __future__ import annotations

import json
import pickle

import pytest

from layout_algebra import (
    FSDP_OWNED_AXES,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    Stages,
    Training,
    lint,
)
from layout_algebra._ranks import index_vector
from layout_algebra.errors import SerializationError
from layout_algebra.serialization import converter
from layout_algebra.stages import assign_stages, stages_from_obj, stages_to_obj

TP = SourceLayout("dense", ["tp"], [Shard(0)])
PLAIN = SourceLayout("dense", ["tp"], [Replicate()])


def model(layers: int) -> tuple[ParamLayoutTable, dict[str, ParamShape]]:
    fqns = ["tok_embeddings.weight"]
    for i in range(layers):
        fqns += [f"layers.{i}.attention.wq.weight", f"layers.{i}.norm.weight"]
    fqns += ["norm.weight", "lm_head.weight"]
    table = ParamLayoutTable({f: PLAIN if "norm" in f else TP for f in fqns})
    shapes = {f: ParamShape((6,) if "norm" in f else (10, 6), "float32") for f in fqns}
    return table, shapes


# ---------------------------------------------------------------------------------------
# the value


def test_stages_is_a_hashable_value_with_a_constructor_shaped_repr() -> None:
    s = Stages("pp", [["tok_embeddings", "layers.0"], ["layers.1", "norm", "lm_head"]])
    assert s.stages == (("tok_embeddings", "layers.0"), ("layers.1", "norm", "lm_head"))
    assert (s.axis, s.schedule, s.microbatches) == ("pp", "1f1b", None)
    assert repr(s).startswith("Stages(axis='pp', stages=(('tok_embeddings', 'layers.0'),")
    assert str(s) == "pp: 2 stages, 1f1b: [tok_embeddings, layers.0] [layers.1, norm, lm_head]"
    same = Stages("pp", (("tok_embeddings", "layers.0"), ("layers.1", "norm", "lm_head")))
    assert same == s and hash(same) == hash(s)
    assert pickle.loads(pickle.dumps(s)) == s


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("pp", []), {}, r"Stages\(stages\) holds no stage"),
        (("pp", "layers.0"), {}, r"Stages\(stages\) must be a collection"),
        (("pp", ["layers.0"]), {}, r"Stages\(stages\)\[0\] must list module patterns"),
        (("pp", [{"a", "b"}]), {}, r"must be given in order"),
        (("pp", [["a"], []]), {}, r"Stages\(stages\)\[1\] names no module"),
        (("pp", [["a"], ["a"]]), {}, "names 'a' in stage 0 and stage 1"),
        (("pp", [["a.."]]), {}, "no empty segment"),
        (("p-p", [["a"]]), {}, r"Stages\(axis\)"),
        (("pp", [["a"]]), {"schedule": "zb"}, r"Stages\(schedule=...\) must be one of"),
        (("pp", [["a"]]), {"microbatches": 0}, r"Stages\(microbatches=...\)"),
        (("pp", [["a"]]), {"microbatches": True}, r"Stages\(microbatches=...\)"),
    ],
)
def test_bad_stages_are_layout_errors_naming_the_argument(
    args: tuple[object, ...], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(LayoutError, match=match):
        Stages(*args, **kwargs)  # type: ignore[arg-type]


def test_stages_round_trip_through_json_and_the_converter() -> None:
    s = Stages.balanced("pp", layers=4, pp=2, schedule="gpipe", microbatches=8)
    obj = stages_to_obj(s)
    assert obj == {
        "axis": "pp",
        "stages": [
            ["tok_embeddings", "layers.0", "layers.1"],
            ["layers.2", "layers.3", "norm", "lm_head"],
        ],
        "schedule": "gpipe",
        "microbatches": 8,
    }
    assert stages_from_obj(json.loads(json.dumps(obj))) == s
    assert converter.structure(converter.unstructure(s), Stages) == s
    assert stages_from_obj({"axis": "pp", "stages": [["a"]]}) == Stages("pp", [["a"]])


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ([], "expected a JSON object"),
        ({"axis": "pp"}, "missing field 'stages'"),
        ({"axis": "pp", "stages": [["a"]], "extra": 1}, "extra: unknown field"),
        ({"axis": "pp", "stages": [["a"], "b"]}, r"stages\[1\]: expected a JSON array"),
        ({"axis": "pp", "stages": [["a"]], "microbatches": True}, "microbatches"),
        ({"axis": "pp", "stages": [["a"], ["a"]]}, "stage 0 and stage 1"),
    ],
)
def test_bad_stage_json_is_a_serialization_error_at_its_path(obj: object, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        stages_from_obj(obj)


def test_the_number_of_stages_fits_the_axis_and_the_schedule() -> None:
    Stages("pp", [["a"], ["b"]]).check_size(2)
    with pytest.raises(LayoutError, match="3 stages on 'pp' of 2 ranks under '1f1b'"):
        Stages("pp", [["a"], ["b"], ["c"]]).check_size(2)
    interleaved = Stages("pp", [["a"], ["b"], ["c"], ["d"]], schedule="interleaved-1f1b")
    interleaved.check_size(2)
    with pytest.raises(LayoutError, match="two or more stages on every rank"):
        interleaved.check_size(4)


def test_balanced_deals_layers_as_torchtitan_does() -> None:
    """6 layers over 4 stages: 8 units, 2 each; the embeddings and the head count one each."""
    s = Stages.balanced("pp", layers=6, pp=4)
    assert s.stages == (
        ("tok_embeddings", "layers.0"),
        ("layers.1", "layers.2"),
        ("layers.3", "layers.4"),
        ("layers.5", "norm", "lm_head"),
    )
    assert len(Stages.balanced("pp", layers=6, pp=2, schedule="interleaved-1f1b").stages) == 4
    assert Stages.balanced("pp", layers=2, pp=1).stages == (
        ("tok_embeddings", "layers.0", "layers.1", "norm", "lm_head"),
    )
    with pytest.raises(LayoutError, match="cannot be dealt over 8 stages"):
        Stages.balanced("pp", layers=4, pp=8)
    with pytest.raises(LayoutError, match=r"Stages.balanced\(first=...\) must be a collection"):
        Stages.balanced("pp", layers=4, pp=2, first="tok_embeddings")


def test_torchtitans_own_split_is_the_balanced_one() -> None:
    titan = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    split = titan._generate_llm_fqn_per_model_part
    for layers in range(13):  # none: one stage still holds the rest
        for n in range(1, 7):
            for first in range(3):
                for last in range(3):
                    try:
                        theirs = split(n, layers, first, last)
                    except ValueError:
                        with pytest.raises(LayoutError):
                            Stages.balanced(
                                "pp", layers=layers, pp=n, first_weight=first, last_weight=last
                            )
                        continue
                    ours = Stages.balanced(
                        "pp", layers=layers, pp=n, first_weight=first, last_weight=last
                    )
                    assert [list(s) for s in ours.stages] == theirs, (layers, n, first, last)


def test_a_parameter_belongs_to_the_stage_naming_it_or_its_module() -> None:
    s = Stages("pp", [["tok_embeddings", "layers.*"], ["layers.1.mlp", "norm"]])
    found = assign_stages(
        s, ["tok_embeddings.weight", "layers.0.w", "layers.1.mlp.w", "norm.weight", "x"]
    )
    assert found.of == (0, 0, None, 1, None)
    assert found.doubled == (("layers.1.mlp.w", (0, 1)),)
    assert found.unplaced == ("x",)
    assert found.unused == ()
    assert assign_stages(Stages("pp", [["nothing"]]), ["a"]).unused == ((0, "nothing"),)
    with pytest.raises(LayoutError, match="fqns must be a collection"):
        assign_stages(s, "layers.0.w")


# ---------------------------------------------------------------------------------------
# lint with stages


MESH = {"dense": Mesh({"pp": 2, "dp_shard": 2, "tp": 2})}
FSDP = {"dense": "dp_shard"}


def test_a_rank_holds_only_its_stages_parameters() -> None:
    table, shapes = model(4)
    stages = Stages.balanced("pp", layers=4, pp=2)
    report = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages)
    assert report.ok, report.problems
    whole = lint(table, shapes, mesh_sizes={"dense": Mesh({"dp_shard": 2, "tp": 2})}, fsdp=FSDP)
    # every stage's bytes add up to the whole model's on each (dp_shard, tp) coordinate
    assert [
        a + b
        for a, b in zip(report.memory.by_stage[0][:4], report.memory.by_stage[1][4:], strict=True)
    ] == list(whole.memory.bytes_per_rank)
    assert report.memory.by_stage[0][4:] == (0, 0, 0, 0)
    assert report.memory.by_stage[1][:4] == (0, 0, 0, 0)
    assert [sum(col) for col in zip(*report.memory.by_stage.values(), strict=True)] == list(
        report.memory.bytes_per_rank
    )
    memory = report.to_dict()["memory"]
    assert isinstance(memory, dict)
    assert memory["by_stage"] == {
        "0": list(report.memory.by_stage[0]),
        "1": list(report.memory.by_stage[1]),
    }
    assert "parameter bytes by pipeline stage" in str(report)
    assert "  stage 1: " in str(report)


def sub(table: ParamLayoutTable, keep: set[str]) -> ParamLayoutTable:
    return ParamLayoutTable({f: table[f] for f in table if f in keep})


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b"])
@pytest.mark.parametrize(
    "mesh",
    [
        MESH["dense"],
        Mesh({"dp_shard": 2, "pp": 2, "tp": 2}),
        Mesh({"tp": 2, "dp_shard": 2, "pp": 2}),
    ],
    ids=str,
)
def test_each_stage_costs_what_its_parameters_alone_cost_on_its_ranks(
    schedule: str, mesh: Mesh
) -> None:
    """The law of a staged lint: the lint of each stage's parameters alone (every rank
    holding them), kept on the ranks running that stage, summed over the stages."""
    table, shapes = model(6)
    stages = Stages.balanced("pp", layers=6, pp=2, schedule=schedule)
    training = Training(units=["layers.*"], param_dtype="bfloat16", frozen=["tok_embeddings"])
    report = lint(
        table, shapes, mesh_sizes={"dense": mesh}, fsdp=FSDP, stages=stages, training=training
    )
    assert report.ok, report.problems
    pp_of = index_vector(mesh, ("pp",))
    found = assign_stages(stages, table)
    memory = [0] * 8
    kinds = {k: [0] * 8 for k in report.memory.by_kind}
    traffic = {t: [0] * 8 for t in report.traffic}
    for s in range(len(stages.stages)):
        keep = {f for f, at in zip(table, found.of, strict=True) if at == s}
        units = ["layers.*"] if any(f.startswith("layers.") for f in keep) else []
        frozen = ["tok_embeddings"] if "tok_embeddings.weight" in keep else []
        alone = lint(
            sub(table, keep),
            {f: shapes[f] for f in keep},
            mesh_sizes={"dense": mesh},
            fsdp=FSDP,
            training=Training(units=units, param_dtype="bfloat16", frozen=frozen),
        )
        assert [p.kind for p in alone.problems] == ["stages"]  # pp without stages
        on = [pp_of[r] == s % 2 for r in range(8)]
        row = [b * o for b, o in zip(alone.memory.bytes_per_rank, on, strict=True)]
        assert report.memory.by_stage[s] == tuple(row)
        memory = [a + b for a, b in zip(memory, row, strict=True)]
        for name, got in alone.memory.by_kind.items():
            kinds[name] = [a + b * o for a, b, o in zip(kinds[name], got, on, strict=True)]
        for name, got in alone.traffic.items():
            traffic[name] = [a + b * o for a, b, o in zip(traffic[name], got, on, strict=True)]
    assert report.memory.bytes_per_rank == tuple(memory)
    assert {k: list(v) for k, v in report.memory.by_kind.items()} == kinds
    assert {k: list(v) for k, v in report.traffic.items()} == traffic
    assert any(line.startswith("stages: ") for line in report.assumptions)


def test_a_tied_pair_in_two_stages_is_two_storages() -> None:
    table, shapes = model(2)
    tied = ParamLayoutTable(dict(table.items()), tied=[("tok_embeddings.weight", "lm_head.weight")])
    stages = Stages.balanced("pp", layers=2, pp=2)
    untied = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages)
    report = lint(tied, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages, training=Training())
    assert report.memory.bytes_per_rank == untied.memory.bytes_per_rank
    one = Stages("pp", [["tok_embeddings", "layers.0", "lm_head"], ["layers.1", "norm"]])
    both = lint(tied, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=one)
    apart = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=one)
    assert sum(both.memory.by_stage[0]) < sum(apart.memory.by_stage[0])


def test_a_parameter_in_no_stage_or_two_is_a_problem_naming_it() -> None:
    table, shapes = model(2)
    stages = Stages("pp", [["tok_embeddings", "layers.*"], ["layers.1", "norm", "typo"]])
    report = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages)
    problems = {(p.kind, p.fqn) for p in report.problems}
    assert problems == {
        ("stages", "layers.1.attention.wq.weight"),
        ("stages", "layers.1.norm.weight"),
        ("stages", "lm_head.weight"),
        ("stages", "typo"),
    }
    messages = " ".join(p.message for p in report.problems)
    assert "stages 0 and 1 both hold it" in messages
    assert "lm_head.weight: no stage holds it" in messages
    assert "'typo' names no parameter or module" in messages


def test_pp_without_stages_is_a_problem_naming_the_fix() -> None:
    table, shapes = model(2)
    report = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP)
    (problem,) = report.problems
    assert problem.kind == "stages" and problem.axis == "pp"
    assert "every rank is counted holding the whole model" in problem.message
    assert "stages=Stages('pp'" in problem.message
    one = {"dense": Mesh({"pp": 1, "dp_shard": 2, "tp": 2})}
    assert lint(table, shapes, mesh_sizes=one, fsdp=FSDP).ok


def test_stages_that_do_not_fit_the_mesh_are_layout_errors() -> None:
    table, shapes = model(2)
    with pytest.raises(LayoutError, match="3 stages on 'pp' of 2 ranks"):
        lint(
            table,
            shapes,
            mesh_sizes=MESH,
            fsdp=FSDP,
            stages=Stages("pp", [["tok_embeddings"], ["layers"], ["norm", "lm_head"]]),
        )
    with pytest.raises(LayoutError, match="has no axis 'pipe'"):
        lint(
            table,
            shapes,
            mesh_sizes=MESH,
            fsdp=FSDP,
            owned=[*FSDP_OWNED_AXES, "pipe"],
            stages=Stages("pipe", [["a"], ["b"]]),
        )
    with pytest.raises(LayoutError, match="not an owned axis"):
        lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=Stages("tp", [["a"], ["b"]]))
    with pytest.raises(LayoutError, match="stages must be a Stages"):
        lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages="pp")  # type: ignore[arg-type]


def test_the_budget_with_stages_names_the_rank_and_its_stage() -> None:
    table, shapes = model(4)
    stages = Stages.balanced("pp", layers=4, pp=2)
    report = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages, budget=1700)
    (problem,) = [p for p in report.problems if p.kind == "budget"]
    assert "runs stage 1" in problem.message
    assert problem.ranks == (4, 5)


def test_units_and_frozen_patterns_apply_where_they_name_something() -> None:
    table, shapes = model(4)
    stages = Stages("pp", [["tok_embeddings"], ["layers", "norm", "lm_head"]])
    training = Training(units=["layers.*"], frozen=["tok_embeddings"])
    report = lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages, training=training)
    assert report.ok, report.problems
    said = report.assumptions
    assert "stage 0: units: none of the run's units names a module of this stage" in " ".join(said)
    assert "stage 1: frozen: no frozen pattern names a parameter of this stage" in said
    for typo in (Training(units=["layer.*"]), Training(frozen=["tok_embedding"])):
        with pytest.raises(LayoutError, match="names no"):
            lint(table, shapes, mesh_sizes=MESH, fsdp=FSDP, stages=stages, training=typo)
