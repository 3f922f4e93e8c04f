"""The command line's ``reshard`` with the loading run's pipeline stages: ``--stages FILE``
and ``--pp-layers N`` (read as ``lint`` reads them) print the library's staged plan, what
each stage's ranks read; a ``pp`` axis without them is said on stderr.

A checkpoint saved by a ``pp=4, tp=2`` run is loaded by a ``pp=2, dp_shard=2, tp=2`` run
(FSDP over ``dp_shard``). The same command on a checkpoint directory real gloo ranks wrote
is in ``test_reshard_stages_gloo.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest

from layout_algebra import (
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    Stages,
    compose_table,
    reshard_plan,
)
from layout_algebra.checkpoint import ReshardPlan
from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.stages import stages_to_obj
from tests.test_cli import assert_one_line_problem, assert_one_line_usage_error, run, write

S0, S1, R = Shard(0), Shard(1), Replicate()
LAYERS: Final = 6
FQNS: Final = [
    "tok_embeddings.weight",
    *(f"layers.{i}.{w}" for i in range(LAYERS) for w in ("attention.wq.weight", "w1.weight")),
    "norm.weight",
    "output.weight",
]
SHAPES: Final = {
    fqn: ParamShape((16,) if fqn == "norm.weight" else (40, 16), "bfloat16") for fqn in FQNS
}
SAVED_ON: Final = {"dense": {"pp": 4, "tp": 2}}
LOADED_ON: Final = {"dense": {"pp": 2, "dp_shard": 2, "tp": 2}}
PLAIN: Final = SourceLayout("dense", (), ())


def table(placement: Shard) -> ParamLayoutTable:
    """Every matrix split over ``tp`` by ``placement``, the norm a plain tensor."""
    tp = SourceLayout("dense", ["tp"], [placement])
    return ParamLayoutTable({fqn: PLAIN if fqn == "norm.weight" else tp for fqn in FQNS})


SAVED: Final = table(S0)
LOADED: Final = table(S1)


def library(stages: Stages | None) -> ReshardPlan:
    loaded = compose_table(LOADED, fsdp={"dense": "dp_shard"}, mesh_sizes=LOADED_ON)
    return reshard_plan(
        SAVED, loaded, SHAPES, src_sizes=SAVED_ON, dst_sizes=LOADED_ON, stages=stages
    )


def command(tmp_path: Path, to_mesh: str = "pp=2,dp_shard=2,tp=2") -> list[str]:
    saved = write(tmp_path / "saved.json", to_json(SAVED))
    loaded = write(tmp_path / "loaded.json", to_json(LOADED))
    shapes = write(tmp_path / "shapes.json", shapes_to_json(SHAPES))
    return [
        *("reshard", saved, loaded, "--shapes", shapes, "--mesh", "pp=4,tp=2"),
        *("--to-mesh", to_mesh, "--to-fsdp", "dp_shard"),
    ]


def stages_file(tmp_path: Path, stages: object) -> str:
    obj = stages_to_obj(stages) if isinstance(stages, Stages) else stages
    return write(tmp_path / "stages.json", json.dumps(obj))


HEADER: Final = "saved on dense (pp=4, tp=2), loaded on dense (pp=2, dp_shard=2, tp=2)\n"


def test_pp_layers_deals_the_stages_and_says_what_each_stages_ranks_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """6 blocks, the embedding and the head one layer each: 4 to a stage over pp=2."""
    code, out, err = run([*command(tmp_path), "--pp-layers", "4"], capsys)
    assert (code, err) == (0, "")
    stages = Stages.balanced("pp", layers=LAYERS, pp=2, last=["norm", "output"])
    dealt = f"stages: --pp-layers 4 deals them so: {stages}\n"
    assert out == HEADER + dealt + library(stages).report() + "\n"
    assert "[tok_embeddings, layers.0, layers.1, layers.2]" in dealt
    assert "  stage 0: 7 parameters, " in out and " read by ranks 0-3 (pp=0)\n" in out
    assert "  stage 1: 8 parameters, " in out and " read by ranks 4-7 (pp=1)\n" in out
    # each rank reads its stage's layers only: half of what every rank would without stages
    whole = library(None)
    assert sum(library(stages).bytes_read) * 2 == sum(whole.bytes_read)


def test_pp_layers_for_more_stages_than_ranks_interleaves_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([*command(tmp_path), "--pp-layers", "2", "--top", "3"], capsys)
    assert (code, err) == (0, "")
    stages = Stages.balanced(
        "pp", layers=LAYERS, pp=2, schedule="interleaved-1f1b", last=["norm", "output"]
    )
    assert f"stages: --pp-layers 2 deals them so: {stages}\n" in out
    assert out.endswith(library(stages).report(top=3) + "\n")
    for s in range(4):
        assert f" read by ranks {'0-3 (pp=0)' if s % 2 == 0 else '4-7 (pp=1)'}\n" in (
            next(line for line in out.splitlines(True) if line.startswith(f"  stage {s}: "))
        )


def test_stages_from_a_file_are_the_librarys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An uneven split, as torchtitan's module_fqns_per_model_part may give: no line says
    how it was dealt, the report says what each stage's ranks read."""
    stages = Stages(
        "pp",
        [
            ["tok_embeddings", "layers.0"],
            [*(f"layers.{i}" for i in range(1, LAYERS)), "norm", "output"],
        ],
    )
    path = stages_file(tmp_path, stages)
    code, out, err = run([*command(tmp_path), "--stages", path], capsys)
    assert (code, err) == (0, "")
    assert out == HEADER + library(stages).report() + "\n"
    assert "  stage 0: 3 parameters, " in out and "  stage 1: 12 parameters, " in out


def test_a_pp_axis_without_stages_is_said_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(command(tmp_path), capsys)
    assert code == 0
    assert out == HEADER + library(None).report() + "\n"
    assert err == (
        "layout-algebra: note: --to-mesh has a 'pp' axis of 2 ranks but no stages, so every "
        "rank is counted loading the whole model; give --pp-layers N or --stages FILE\n"
    )
    # no pipeline axis: nothing to say
    flat = ["--mesh", "pp=4,tp=2", "--to-mesh", "dp_shard=4,tp=2"]
    argv = [*command(tmp_path)[:5], *flat, "--to-fsdp", "dp_shard"]
    code, _, err = run(argv, capsys)
    assert (code, err) == (0, "")


def test_a_parameter_no_stage_loads_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = stages_to_obj(Stages.balanced("pp", layers=LAYERS, pp=2, last=["output"]))
    code, out, err = run([*command(tmp_path), "--stages", stages_file(tmp_path, obj)], capsys)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "layout-algebra: the reshard has 1 problem:",
        "  - norm.weight: no stage holds it (no pattern of stages names it or a module holding "
        "it), so no rank would load it; add its module to a stage",
    ]


def test_a_layout_over_the_pipeline_axis_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table read as the loading run holds it (no --to-fsdp: composed already, as
    --to-fsdp would refuse the owned axis of a source layout)."""
    over = LOADED.with_entries({"layers.2.w1.weight": SourceLayout("dense", ["pp"], [S0])})
    argv = command(tmp_path)[:-2]
    argv[2] = write(tmp_path / "over.json", to_json(over))
    code, out, err = run([*argv, "--pp-layers", "4"], capsys)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "layout-algebra: the reshard has 1 problem:",
        "  - layers.2.w1.weight: loaded as dense[pp=S(0)], sharded over the pipeline axis "
        "'pp'; its stage runs on one pipeline rank, which holds all of it: lay it out without "
        "'pp'",
    ]


@pytest.mark.parametrize(
    ("to_mesh", "extra", "words"),
    [
        ("dp_shard=4,tp=2", ["--pp-layers", "4"], "give --to-mesh pp=N,..."),
        ("pp=2,dp_shard=2,tp=2", ["--pp-layers", "3"], "3 stages, not a multiple of pp=2"),
        ("pp=2,dp_shard=2,tp=2", ["--pp-layers", "0"], "--pp-layers"),
    ],
)
def test_pp_layers_that_deal_no_stages_are_usage_errors(
    tmp_path: Path, to_mesh: str, extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([*command(tmp_path, to_mesh), *extra], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra reshard")
    assert words in err


def test_stages_and_pp_layers_together_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = stages_file(tmp_path, Stages.balanced("pp", layers=LAYERS, pp=2))
    code, out, err = run([*command(tmp_path), "--stages", path, "--pp-layers", "4"], capsys)
    assert (code, out) == (2, "")
    assert "not allowed with argument" in err


def test_stages_on_an_axis_the_loading_mesh_lacks_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = stages_file(tmp_path, Stages.balanced("pipe", layers=LAYERS, pp=2))
    code, out, err = run([*command(tmp_path), "--stages", path], capsys)
    assert out == ""
    assert_one_line_problem(code, err)
    assert "has no axis 'pipe'" in err
    bad = write(tmp_path / "bad.json", json.dumps({"axis": "pp", "stages": "layers.0"}))
    code, out, err = run([*command(tmp_path), "--stages", bad], capsys)
    assert out == ""
    assert_one_line_problem(code, err)
    assert err.startswith(f"layout-algebra: {bad}: ")


def test_help_says_the_stages_are_the_loading_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["reshard", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "--stages FILE | --pp-layers N" in flat or "[--stages FILE | --pp-layers N]" in flat
    assert "each rank loads only its stages' parameters" in flat
    assert "over --to-mesh's 'pp' axis" in flat
    code, out, _ = run(["lint", "--help"], capsys)
    flat = " ".join(out.split())
    assert "each rank holds only its stages' parameters" in flat
    assert "over the mesh's 'pp' axis" in flat


def test_pp_layers_0_is_a_usage_error_for_lint_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = command(tmp_path)
    lint = ["lint", argv[2], "--shapes", argv[4], "--mesh", "pp=2,dp_shard=2,tp=2"]
    code, out, err = run([*lint, "--pp-layers", "0"], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    assert "--pp-layers is each stage's layers, at least 1" in err
