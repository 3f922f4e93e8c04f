"""The command line's ``lint`` with pipeline stages: ``--stages FILE`` and ``--pp-layers N``
print the library's staged report, and a ``pp`` axis without them fails the run instead of
counting every pipeline rank holding the whole model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layout_algebra import (
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    SourceLayout,
    Stages,
    Training,
    lint,
)
from layout_algebra._text import human_bytes
from layout_algebra.serialization import converter, shapes_to_json, to_json
from tests.test_cli import assert_one_line_usage_error, run

FQNS = [
    "tok_embeddings.weight",
    *(f"layers.{i}.w" for i in range(4)),
    "norm.weight",
    "lm_head.weight",
]
SHAPES = {f: ParamShape((16,) if f == "norm.weight" else (64, 16), "float32") for f in FQNS}
TABLE = ParamLayoutTable({f: SourceLayout("dense", ["tp"], [Replicate()]) for f in FQNS})
MESH = ["--mesh", "pp=2,dp_shard=2,tp=1", "--fsdp", "dp_shard"]


def files(tmp_path: Path) -> tuple[str, str]:
    table, shapes = tmp_path / "table.json", tmp_path / "shapes.json"
    table.write_text(to_json(TABLE), encoding="utf-8")
    shapes.write_text(shapes_to_json(SHAPES), encoding="utf-8")
    return str(table), str(shapes)


def library(stages: Stages, training: Training | None = None) -> object:
    return lint(
        TABLE,
        SHAPES,
        mesh_sizes=Mesh({"pp": 2, "dp_shard": 2, "tp": 1}),
        fsdp={"dense": "dp_shard"},
        stages=stages,
        training=training,
    )


def test_a_pp_axis_without_stages_fails_the_lint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = files(tmp_path)
    code, out, err = run(["lint", table, "--shapes", shapes, *MESH], capsys)
    assert code == 1
    assert "every rank is counted holding the whole model" in out
    assert "1 problem" in err


def test_stages_from_a_file_are_the_librarys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = files(tmp_path)
    stages = Stages.balanced("pp", layers=4, pp=2)
    path = tmp_path / "stages.json"
    path.write_text(json.dumps(converter.unstructure(stages)), encoding="utf-8")
    code, out, err = run(["lint", table, "--shapes", shapes, *MESH, "--stages", str(path)], capsys)
    assert (code, err) == (0, "")
    report = library(stages)
    by_stage = report.memory.by_stage  # type: ignore[attr-defined]
    assert f"  stage 0: {human_bytes(max(by_stage[0]))}" in out
    assert f"  stage 1: {human_bytes(max(by_stage[1]))}" in out
    code, out, err = run(["lint", table, "--shapes", shapes, *MESH, "--stages", table], capsys)
    assert code == 1 and "Traceback" not in err and "table.json" in err


def test_pp_layers_deals_the_blocks_as_torchtitan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 blocks with the embedding and the head as one layer each: 6 layers, 3 per stage
    over pp=2 (1F1B), 1 per stage: 6 stages, 3 on each rank (interleaved 1F1B)."""
    table, shapes = files(tmp_path)
    argv = ["lint", table, "--shapes", shapes, *MESH, "--optimizer", "adamw", "--units", "layers.*"]
    code, out, err = run([*argv, "--pp-layers", "3"], capsys)
    assert (code, err) == (0, "")
    assert "stages: --pp-layers 3 deals them so: pp: 2 stages, 1f1b:" in out
    report = library(Stages.balanced("pp", layers=4, pp=2), Training(units=["layers.*"]))
    rows = out[out.index("training memory per rank") :].splitlines()[2:6]
    by_kind = report.memory.by_kind  # type: ignore[attr-defined]
    for rank, row in enumerate(rows):
        assert human_bytes(by_kind["optimizer"][rank]) in row
    code, out, err = run([*argv, "--pp-layers", "1"], capsys)
    assert (code, err) == (0, "")
    assert "pp: 6 stages, interleaved-1f1b" in out
    code, out, err = run([*argv, "--pp-layers", "2"], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    assert "3 stages, not a multiple of pp=2" in err
    no_pp = ["lint", table, "--shapes", shapes, "--mesh", "dp_shard=2,tp=1", "--pp-layers", "3"]
    code, out, err = run(no_pp, capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    code, out, err = run([*argv, "--pp-layers", "3", "--stages", table], capsys)
    assert code == 2
