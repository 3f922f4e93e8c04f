"""``reshard_plan(stages=...)`` without torch: a staged load is the whole load's reads on the
ranks that run each parameter's stage, and a stage split that leaves a parameter to no rank
or to two (or a layout over the pipeline axis) is refused by name.

Torch's own reads for a PP=4 -> PP=2 load are in ``test_reshard_stages_gloo.py``.
"""

from __future__ import annotations

import math
from typing import Final

import pytest

from layout_algebra import (
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    Stages,
    reshard_plan,
)
from layout_algebra._text import human_bytes
from layout_algebra.checkpoint import ReshardPlan
from layout_algebra.stages import assign_stages

S0, S1, R = Shard(0), Shard(1), Replicate()
LAYERS: Final = 4
FQNS: Final = [
    "tok_embeddings.weight",
    *(f"layers.{i}.{w}" for i in range(LAYERS) for w in ("wq", "wo", "experts.w1")),
    "norm.weight",
    "output.weight",
]
SHAPES: Final = {
    fqn: ParamShape(
        (8, 6, 4) if "experts" in fqn else (6,) if fqn == "norm.weight" else (10, 6), "float32"
    )
    for fqn in FQNS
}
SAVED_ON: Final = {"dense": {"pp": 4, "tp": 2}, "expert": {"pp": 4, "ep": 2}}


def tp(*placements: Shard | Replicate) -> SourceLayout:
    return SourceLayout("dense", ["tp"] if placements else [], placements)


def layouts(dense: SourceLayout, wo: SourceLayout, experts: SourceLayout) -> ParamLayoutTable:
    return ParamLayoutTable(
        {
            fqn: experts
            if "experts" in fqn
            else wo
            if fqn.endswith("wo")
            else tp()
            if fqn == "norm.weight"
            else dense
            for fqn in FQNS
        }
    )


SAVED: Final = layouts(tp(S0), tp(S1), SourceLayout("expert", ["ep"], [S0]))
LOADED: Final = layouts(
    SourceLayout("dense", ["dp_shard", "tp"], [S0, S1]),
    SourceLayout("dense", ["dp_shard", "tp"], [S1, R]),
    SourceLayout("expert", ["ep", "dp_shard"], [S0, S1]),
)


def plans(sizes: dict[str, dict[str, int]], stages: Stages) -> tuple[ReshardPlan, ReshardPlan]:
    """The load with ``stages``, and the same load as if every rank loaded everything."""
    args = (SAVED, LOADED, SHAPES)
    return (
        reshard_plan(*args, src_sizes=SAVED_ON, dst_sizes=sizes, stages=stages),
        reshard_plan(*args, src_sizes=SAVED_ON, dst_sizes=sizes),
    )


@pytest.mark.parametrize(
    "sizes",
    [
        {"dense": {"pp": 2, "dp_shard": 2, "tp": 2}, "expert": {"pp": 2, "ep": 2, "dp_shard": 2}},
        # the pipeline axis last: its ranks are strided
        {"dense": {"dp_shard": 2, "tp": 2, "pp": 2}, "expert": {"ep": 2, "dp_shard": 2, "pp": 2}},
    ],
    ids=["pp-first", "pp-last"],
)
@pytest.mark.parametrize("per_rank", [1, 2], ids=["1f1b", "interleaved"])
def test_a_staged_load_is_the_whole_loads_reads_on_the_ranks_of_each_stage(
    sizes: dict[str, dict[str, int]], per_rank: int
) -> None:
    schedule = "1f1b" if per_rank == 1 else "interleaved-1f1b"
    stages = Stages.balanced(
        "pp",
        layers=LAYERS,
        pp=2,
        schedule=schedule,
        stages_per_rank=per_rank,
        last=["norm", "output"],
    )
    staged, whole = plans(sizes, stages)
    of = dict(zip(LOADED, assign_stages(stages, LOADED).of, strict=True))
    mesh = Mesh(sizes["dense"])
    at = mesh.names.index("pp")
    chunks = dict.fromkeys(LOADED, 0)
    nbytes = dict.fromkeys(LOADED, 0)
    for rank in range(mesh.size):
        pp = mesh.coordinate(rank)[at]
        runs = {fqn for fqn, s in of.items() if s is not None and s % 2 == pp}
        expected = [r for r in whole.reads(rank) if r.fqn in runs]
        assert list(staged.reads(rank)) == expected, rank
        assert staged.bytes_read[rank] == sum(
            math.prod(r.lengths) * SHAPES[r.fqn].itemsize for r in expected
        )
        for r in expected:
            chunks[r.fqn] += 1
            nbytes[r.fqn] += math.prod(r.lengths) * SHAPES[r.fqn].itemsize
    assert dict(staged.by_param) == nbytes
    assert {fqn: staged.chunks_read(fqn) for fqn in LOADED} == chunks
    assert sum(staged.bytes_read) * 2 == sum(whole.bytes_read)  # each stage on half the ranks


def test_the_report_says_what_each_stages_ranks_read() -> None:
    sizes = {
        "dense": {"pp": 2, "dp_shard": 2, "tp": 2},
        "expert": {"pp": 2, "ep": 2, "dp_shard": 2},
    }
    stages = Stages.balanced(
        "pp", layers=LAYERS, pp=2, schedule="interleaved-1f1b", last=["norm", "output"]
    )
    staged, _ = plans(sizes, stages)
    lines = str(staged).splitlines()
    at = lines.index("by stage (stage i runs on pp=i % 2; bytes read by all its ranks):")
    of = assign_stages(stages, LOADED).of
    for s in range(4):
        mine = [fqn for fqn, held in zip(LOADED, of, strict=True) if held == s]
        nbytes = sum(staged.by_param[fqn] for fqn in mine)
        ranks = "ranks 0-3 (pp=0)" if s % 2 == 0 else "ranks 4-7 (pp=1)"
        assert (
            lines[at + 1 + s]
            == f"  stage {s}: {len(mine)} parameters, {human_bytes(nbytes)} read by {ranks}"
        )
    assert lines[at + 5].startswith("parameters that move most")
    # each parameter counted by the ranks of its stage only
    row = next(ln for ln in lines if ln.lstrip().startswith("layers.0.wq "))
    assert f" {staged.chunks_read('layers.0.wq')} reads " in row
    unstaged = str(plans(sizes, stages)[1])
    assert "by stage" not in unstaged
    # the pipeline axis last: each stage's ranks are every other rank
    last = {
        role: {**{a: n for a, n in axes.items() if a != "pp"}, "pp": 2}
        for role, axes in sizes.items()
    }
    shown = str(plans(last, stages)[0])
    assert " read by ranks 0, 2, 4, 6 (pp=0)\n  stage 1: " in shown
    assert " read by ranks 1, 3, 5, 7 (pp=1)\n  stage 2: " in shown


def test_a_parameter_in_no_stage_or_in_two_is_a_problem_naming_it() -> None:
    sizes = {
        "dense": {"pp": 2, "dp_shard": 2, "tp": 2},
        "expert": {"pp": 2, "ep": 2, "dp_shard": 2},
    }
    early = [f"layers.{i}" for i in range(2)]
    late = [f"layers.{i}" for i in range(2, LAYERS)]
    for stages, words, remedy in (
        (
            Stages("pp", [["tok_embeddings", *early], [*late, "output"]]),
            "no stage holds it (no pattern of stages names it or a module holding it), so no "
            "rank would load it",
            "add its module to a stage",
        ),
        (
            Stages("pp", [["tok_embeddings", *early, "norm"], [*late, "norm.weight", "output"]]),
            "stages 0 and 1 both hold it",
            "a module belongs to one stage: name it in one",
        ),
    ):
        fqn = "norm.weight"
        with pytest.raises(PlanError) as caught:
            plans(sizes, stages)
        problems = caught.value.problems
        assert [e.fqn for e in problems] == [fqn]
        assert problems[0].message.startswith(f"{fqn}: {words}")
        assert problems[0].axis == "pp"
        assert problems[0].message.endswith(remedy)


def test_a_layout_over_the_pipeline_axis_is_a_problem_naming_it() -> None:
    sizes = {
        "dense": {"pp": 2, "dp_shard": 2, "tp": 2},
        "expert": {"pp": 2, "ep": 2, "dp_shard": 2},
    }
    stages = Stages.balanced("pp", layers=LAYERS, pp=2, last=["norm", "output"])
    over = SourceLayout("dense", ["pp", "tp"], [S0, S1])
    loaded = LOADED.with_entries({"layers.1.wq": over})
    with pytest.raises(PlanError) as caught:
        reshard_plan(SAVED, loaded, SHAPES, src_sizes=SAVED_ON, dst_sizes=sizes, stages=stages)
    (problem,) = caught.value.problems
    assert problem.fqn == "layers.1.wq"
    assert "sharded over the pipeline axis 'pp'" in problem.message
    assert problem.message.endswith("lay it out without 'pp'")
    # replicated over it, as a checkpoint spells a layout over every axis: no problem
    spelled = LOADED.with_entries({"layers.1.wq": SourceLayout("dense", ["pp", "tp"], [R, S1])})
    reshard_plan(SAVED, spelled, SHAPES, src_sizes=SAVED_ON, dst_sizes=sizes, stages=stages)


@pytest.mark.parametrize(
    ("sizes", "role"),
    [
        ({"dense": {"dp_shard": 4, "tp": 2}, "expert": {"ep": 2, "dp_shard": 4}}, "dense"),
        (
            {"dense": {"pp": 2, "dp_shard": 2, "tp": 2}, "expert": {"ep": 2, "dp_shard": 4}},
            "expert",
        ),
    ],
)
def test_stages_on_an_axis_the_loading_meshes_lack_is_a_layout_error(
    sizes: dict[str, dict[str, int]], role: str
) -> None:
    stages = Stages.balanced("pp", layers=LAYERS, pp=2, last=["norm", "output"])
    with pytest.raises(LayoutError) as caught:
        plans(sizes, stages)
    assert not isinstance(caught.value, PlanError)
    assert caught.value.axis == "pp"
    assert f"mesh {role!r}" in caught.value.message
    assert "has no axis 'pp'" in caught.value.message


@pytest.mark.parametrize(
    ("stages", "words"),
    [
        ("pp", "stages must be a Stages"),
        ([["layers.0"], ["layers.1"]], "stages must be a Stages"),
        (0, "stages must be a Stages"),
        (Stages("pp", [[f"layers.{i}"] for i in range(4096)]), "4096 stages on 'pp' of 2 ranks"),
        (Stages("pp", [["layers.0", "layers.1", "layers.2", "layers.3"]]), "1 stage on 'pp'"),
    ],
)
def test_bad_stages_are_layout_errors_before_any_planning(stages: object, words: str) -> None:
    sizes = {
        "dense": {"pp": 2, "dp_shard": 2, "tp": 2},
        "expert": {"pp": 2, "ep": 2, "dp_shard": 2},
    }
    with pytest.raises(LayoutError) as caught:
        reshard_plan(
            SAVED,
            LOADED,
            SHAPES,
            src_sizes=SAVED_ON,
            dst_sizes=sizes,
            stages=stages,  # type: ignore[arg-type]  # what is tested
        )
    assert not isinstance(caught.value, PlanError)
    assert words in caught.value.message
