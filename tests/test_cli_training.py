"""The command line's ``lint`` with what is new to it: a training setup (the flags become a
``Training``, the figures printed are the library's report, a budget a rank exceeds fails
the run) and the structure of a dim (its problems printed as the library finds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from layout_algebra import Packed, ParamShape, Part, Training, lint
from layout_algebra._complete import table_from_plan
from layout_algebra._text import human_bytes
from layout_algebra.serialization import plan_from_json, shapes_from_json, shapes_to_json
from tests.test_cli import assert_one_line_usage_error, run
from tests.test_cli_plans import moe_files

MESHES = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]


def _report(plan: str, shapes: str, training: Training, budget: int | None = None) -> object:
    shaped = shapes_from_json(Path(shapes).read_text(encoding="utf-8"))
    table = table_from_plan(
        plan_from_json(Path(plan).read_text(encoding="utf-8")),
        shaped,
        mesh_axes=["dp_shard", "tp"],
        expert_axes=["dp_shard", "ep"],
    )
    return lint(
        table,
        shaped,
        mesh_sizes={"dense": {"dp_shard": 2, "tp": 4}, "expert": {"dp_shard": 2, "ep": 4}},
        fsdp={"dense": "dp_shard", "expert": "dp_shard"},
        training=training,
        budget=budget,
    )


def test_lint_prints_the_training_breakdown_of_the_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    flags = ["--optimizer", "sgd", "--param-dtype", "bfloat16", "--units", "attn,moe"]
    code, out, err = run(["lint", plan, "--shapes", shapes, *MESHES, *flags], capsys)
    assert (code, err) == (0, "")
    report = _report(
        plan, shapes, Training(optimizer="sgd", param_dtype="bfloat16", units=("attn", "moe"))
    )
    by_kind = report.memory.by_kind  # type: ignore[attr-defined]
    rows = out[out.index("training memory per rank") :].splitlines()[2:10]
    assert len(rows) == 8
    for rank, row in enumerate(rows):
        cells = row.split()
        assert int(cells[0]) == rank
        assert human_bytes(by_kind["optimizer"][rank]) in row
        assert human_bytes(by_kind["grads"][rank]) in row


def test_lint_without_training_flags_prints_no_training_breakdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    code, out, _ = run(["lint", plan, "--shapes", shapes, *MESHES], capsys)
    assert code == 0
    assert "training memory" not in out


def test_a_budget_a_rank_exceeds_fails_the_lint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    code, out, err = run(["lint", plan, "--shapes", shapes, *MESHES, "--budget", "1KiB"], capsys)
    assert code == 1
    assert "budget" in out
    assert err.endswith("1 problem (see the report)\n")
    report = _report(plan, shapes, Training(), budget=1024)
    assert [p.kind for p in report.problems] == ["budget"]  # type: ignore[attr-defined]
    code, _, _ = run(["lint", plan, "--shapes", shapes, *MESHES, "--budget", "1GiB"], capsys)
    assert code == 0


@pytest.mark.parametrize(
    ("flag", "value"), [("--budget", "80XB"), ("--optimizer", "lion"), ("--param-dtype", "fp7")]
)
def test_a_bad_training_flag_is_a_one_line_usage_error(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    code, out, err = run(["lint", plan, "--shapes", shapes, *MESHES, flag, value], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    assert flag in err


def test_lint_prints_the_problems_inside_a_dim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shapes file whose ``attn.wq.weight`` holds 2 heads of 4 rows: tp=4 cuts each head."""
    plan, shapes = moe_files(tmp_path)
    shaped = dict(shapes_from_json(Path(shapes).read_text(encoding="utf-8")))
    wq = shaped["attn.wq.weight"]
    shaped["attn.wq.weight"] = ParamShape(
        wq.shape, wq.dtype, structure={0: Packed([Part("q", 2, 4)])}
    )
    shapes = str(tmp_path / "structured.json")
    Path(shapes).write_text(shapes_to_json(shaped), encoding="utf-8")
    code, out, err = run(["lint", plan, "--shapes", shapes, *MESHES], capsys)
    assert code == 1
    assert err.endswith("1 problem (see the report)\n")
    report = _report(plan, shapes, Training())
    (problem,) = report.problems  # type: ignore[attr-defined]
    assert (problem.kind, problem.fqn, problem.axis) == ("cuts-unit", "attn.wq.weight", "tp")
    assert problem.message in out
