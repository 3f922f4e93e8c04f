"""The command line on the way users go from a plan: its table, FSDP's axis found or
asked for, one message for a missing expert mesh, a checkpoint directory as ``--shapes``,
and idle ranks and padding in the lint summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from layout_algebra import ParamLayoutTable, ParamShape, build_table, complete_default
from layout_algebra._text import human_bytes
from layout_algebra.serialization import (
    from_json,
    plan_to_json,
    shapes_from_json,
    shapes_to_json,
    to_json,
)
from layout_algebra.shapes import shapes_from_safetensors
from tests.test_cli import (
    PATTERN_FQNS,
    assert_one_line_problem,
    assert_one_line_usage_error,
    moe_plan,
    pattern_plan,
    run,
    write,
)

# ---------------------------------------------------------------------------------------
# table: the table of a plan, as JSON


def test_table_prints_the_table_check_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    argv = ["table", path, "--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    expected = build_table(moe_plan(), ["dp_shard", "tp"], expert_axes=["dp_shard", "ep"])
    assert out == to_json(expected) + "\n"
    assert from_json(out) == expected
    table_path = write(tmp_path / "table.json", out)
    code, shown, err = run(["show", table_path], capsys)
    assert (code, err) == (0, "")
    assert "moe.experts.w1" in shown


def test_table_with_fqns_adds_the_unplanned_as_plain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = write(tmp_path / "plan.json", plan_to_json(pattern_plan()))
    fqns_path = write(tmp_path / "fqns.txt", "\n".join(PATTERN_FQNS) + "\n")
    argv = ["table", plan_path, "--mesh", "dp_shard=2,tp=2", "--expert-mesh", "ep=2,tp=2"]
    code, out, err = run([*argv, "--fqns", fqns_path], capsys)
    assert (code, err) == (0, "")
    built = build_table(
        pattern_plan(), ["dp_shard", "tp"], expert_axes=["ep", "tp"], fqns=PATTERN_FQNS
    )
    unplanned = [fqn for fqn in PATTERN_FQNS if fqn not in built]
    expected = complete_default(built, unplanned, ["dp_shard", "tp"], plain=True)
    assert from_json(out) == expected
    assert list(from_json(out)) == list(expected)
    assert str(from_json(out)["output.weight"]) == "dense[]"


def test_table_of_a_bad_plan_reports_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    argv = ["table", path, "--mesh", "dp_shard=2,tpp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"layout-algebra: {path}: the plan has ")


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "P"],
        ["draw", "P", "attn.wq.weight", "--shape", "8,8", "--mesh", "tp=2"],
        ["diff", "P", "P"],
    ],
)
def test_a_plan_given_for_a_table_says_how_to_make_its_table(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    code, out, err = run([plan if a == "P" else a for a in argv], capsys)
    assert out == ""
    assert_one_line_problem(code, err)
    assert err == (
        f"layout-algebra: {plan} is a plan, not a table; make its table with "
        f"`layout-algebra table {plan} --mesh AXIS=N,...`\n"
    )
    assert "entries" not in err


# ---------------------------------------------------------------------------------------
# lint of a plan: FSDP's axis found, asked for, or checked


def moe_files(tmp_path: Path) -> tuple[str, str]:
    """``moe_plan()`` and the shapes of its parameters (and one it does not name)."""
    shapes = {
        "emb.weight": ParamShape((16, 8), "float32"),
        "head.weight": ParamShape((16, 8), "float32"),
        "attn.wq.weight": ParamShape((8, 8), "float32"),
        "attn.wo.weight": ParamShape((8, 8), "float32"),
        "moe.experts.w1": ParamShape((4, 8, 8), "float32"),
        "moe.router.weight": ParamShape((4, 8), "float32"),
        "norm.weight": ParamShape((8,), "float32"),
    }
    plan = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    return plan, write(tmp_path / "shapes.json", shapes_to_json(shapes))


def test_lint_of_a_plan_uses_the_one_fsdp_axis_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    argv = ["lint", plan, "--shapes", shapes, "--mesh", "dp_shard=2,tp=4"]
    argv += ["--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    header = out.splitlines()[0]
    assert "FSDP over dense dp_shard; expert dp_shard" in header
    assert "--fsdp dp_shard" in header and "--expert-fsdp dp_shard" in header
    _, given, _ = run([*argv, "--fsdp", "dp_shard"], capsys)
    assert given.splitlines()[1:] == out.splitlines()[1:]  # the same report as --fsdp gives


def test_lint_of_a_plan_without_an_fsdp_axis_says_no_fsdp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    argv = ["lint", plan, "--shapes", shapes, "--mesh", "tp=8", "--expert-mesh", "ep=8"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert "no FSDP" in out.splitlines()[0]
    assert "after FSDP" not in out
    assert "parameter bytes per rank (no FSDP):" in out


@pytest.mark.parametrize(
    ("mesh", "extra", "words"),
    [
        (["--mesh", "dp_replicate=2,dp_shard=2,tp=2"], [], "give the one FSDP shards over"),
        (["--mesh", "dp_shard=2,tp=4"], ["--fsdp", "dp"], "--fsdp dp: --mesh (dp_shard=2, tp=4)"),
        (["--mesh", "dp_shard=8"], ["--fsdp", "dp_replicate,dp_shard"], "no axis 'dp_replicate'"),
        (
            ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "edp=2,ep=4"],
            ["--fsdp", "dp_shard"],
            "--expert-fsdp AXIS",
        ),
        (
            ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "edp=2,ep=4"],
            ["--expert-fsdp", "dp_shard"],
            "--expert-fsdp dp_shard: --expert-mesh (edp=2, ep=4) has no axis",
        ),
        (["--mesh", "dp_shard=2,tp=4"], ["--expert-fsdp", "dp_shard"], "give --expert-mesh"),
    ],
)
def test_lint_fsdp_axes_not_in_the_mesh_are_usage_errors(
    tmp_path: Path,
    mesh: list[str],
    extra: list[str],
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan, shapes = moe_files(tmp_path)
    if "--expert-mesh" not in mesh and "--expert-fsdp" not in extra:
        mesh = [*mesh, "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(["lint", plan, "--shapes", shapes, *mesh, *extra], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    assert words in err


# ---------------------------------------------------------------------------------------
# a plan with experts and no --expert-mesh: one message, one line, for every command


def test_a_missing_expert_mesh_is_one_message_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    said = set()
    for argv in (
        ["check", plan, "--mesh", "dp_shard=2,tp=4"],
        ["table", plan, "--mesh", "dp_shard=2,tp=4"],
        ["lint", plan, "--shapes", shapes, "--mesh", "dp_shard=2,tp=4"],
    ):
        code, out, err = run(argv, capsys)
        assert out == ""
        assert_one_line_problem(code, err)
        said.add(err)
    (err,) = said
    assert err.startswith(f"layout-algebra: {plan}: moe.experts.w1 is sharded on 'ep' (S(0))")
    assert "--expert-mesh AXIS=N,..." in err
    assert "expert_axes" not in err and "\\n" not in err


def test_lint_of_a_bad_plan_lists_its_problems_as_check_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    mesh = ["--mesh", "dp_shard=2,tpp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(["lint", plan, "--shapes", shapes, *mesh], capsys)
    assert (code, out) == (1, "")
    _, _, checked = run(["check", plan, *mesh], capsys)
    assert err == checked
    assert err.startswith(f"layout-algebra: {plan}: the plan has 1 problem:\n  - ")
    assert "\\n" not in err


# ---------------------------------------------------------------------------------------
# --shapes DIRECTORY: the checkpoint's index or its single file


def save_checkpoint(where: Path, *, sharded: bool) -> None:
    """The parameters of ``moe_files`` as safetensors writes them: one
    ``model.safetensors``, or two shards and their ``model.safetensors.index.json``."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file  # noqa: PLC0415

    tensors = {
        "emb.weight": torch.zeros(16, 8),
        "head.weight": torch.zeros(16, 8),
        "attn.wq.weight": torch.zeros(8, 8),
        "attn.wo.weight": torch.zeros(8, 8),
        "moe.experts.w1": torch.zeros(4, 8, 8),
        "moe.router.weight": torch.zeros(4, 8),
        "norm.weight": torch.zeros(8),
    }
    where.mkdir()
    if not sharded:
        save_file(tensors, str(where / "model.safetensors"))
        return
    names = list(tensors)
    shards = {"model-1.safetensors": names[:3], "model-2.safetensors": names[3:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(where / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    index = {"metadata": {}, "weight_map": weight_map}
    (where / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("sharded", [False, True])
def test_lint_reads_a_checkpoint_directory(
    tmp_path: Path, sharded: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    save_checkpoint(tmp_path / "ckpt", sharded=sharded)
    mesh = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4", "--json"]
    code, out, err = run(["lint", plan, "--shapes", str(tmp_path / "ckpt"), *mesh], capsys)
    assert code == 0
    # no config.json beside the weights: the one line on stderr says no heads are checked
    assert err.count("\n") == 1 and "note: head checks skipped:" in err and "config.json" in err
    name = "model.safetensors.index.json" if sharded else "model.safetensors"
    stored = shapes_from_safetensors(str(tmp_path / "ckpt" / name))
    assert dict(stored) == dict(shapes_from_json(Path(shapes).read_text()))
    # the report lists parameters in the order the shapes name them
    in_order = write(tmp_path / "stored.json", shapes_to_json(stored))
    _, expected, _ = run(["lint", plan, "--shapes", in_order, *mesh], capsys)
    assert out == expected
    code, out, err = run(["check", plan, *mesh[:-1], "--fqns", str(tmp_path / "ckpt")], capsys)
    assert (code, err) == (0, "")


@pytest.mark.parametrize("command", ["lint", "reshard", "check"])
def test_a_directory_without_a_checkpoint_is_a_usage_error(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, _ = moe_files(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    table = write(tmp_path / "table.json", to_json(moe_table()))
    mesh = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    argv = {
        "lint": ["lint", plan, "--shapes", str(empty), *mesh],
        "reshard": ["reshard", table, table, "--shapes", str(empty), *mesh, "--to-mesh", "tp=8"],
        "check": ["check", plan, *mesh, "--fqns", str(empty)],
    }[command]
    code, out, err = run(argv, capsys)
    assert_one_line_usage_error(code, out, err, f"layout-algebra {command}")
    option = "--fqns" if command == "check" else "--shapes"
    assert f"{option} {empty}: the directory has no model.safetensors.index.json nor" in err


def moe_table() -> ParamLayoutTable:
    return build_table(moe_plan(), ["dp_shard", "tp"], expert_axes=["dp_shard", "ep"])


# ---------------------------------------------------------------------------------------
# the lint summary line: idle ranks, heavy padding, and the remedy


def summary(out: str) -> str:
    return out.splitlines()[1]


def test_the_summary_line_names_idle_ranks_padding_and_the_remedy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    mesh = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    argv = ["lint", plan, "--shapes", shapes, *mesh, "--fsdp", "dp_shard"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    # 4 experts over ep=4, then FSDP's dim 0 (one expert) over dp_shard=2: half the ranks idle
    report = json.loads(run([*argv, "--json"], capsys)[1])["memory"]
    idle = sum(1 for held in report["by_role"]["expert"] if held == 0)
    padded = sum(report["padded_bytes_per_rank"]) - sum(report["bytes_per_rank"])
    assert idle == 4
    _, fixed, _ = run([*argv, "--expert-shard-dim", "1"], capsys)
    every = re.search(r"^largest: rank \d+, (\d+ B); smallest: rank \d+, \1$", fixed, re.M)
    assert every is not None
    assert summary(out) == (
        "0 problems, 1 note, 8 ranks; 4 ranks hold no expert weights; "
        f"FSDP pads {human_bytes(padded)} ({padded / sum(report['bytes_per_rank']):.0%} "
        "of the data); --expert-shard-dim 1 "
        f"(FSDP on the experts' dim 1) gives {every.group(1)} on every rank"
    )
    # the remedy taken: nothing left to say
    assert summary(fixed) == "0 problems, 0 notes, 8 ranks"


def test_a_balanced_lint_keeps_the_plain_summary_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    mesh = ["--mesh", "dp_shard=2,tp=2", "--expert-mesh", "dp_shard=1,ep=4"]
    code, out, err = run(["lint", plan, "--shapes", shapes, *mesh, "--fsdp", "dp_shard"], capsys)
    assert (code, err) == (0, "")
    assert summary(out) == "0 problems, 0 notes, 4 ranks"


def test_lint_of_the_table_made_with_fqns_is_lint_of_its_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, shapes = moe_files(tmp_path)
    mesh = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, made, err = run(["table", plan, *mesh, "--fqns", shapes], capsys)
    assert (code, err) == (0, "")
    table = write(tmp_path / "table.json", made)
    lint = ["--shapes", shapes, *mesh, "--fsdp", "dp_shard", "--json"]
    _, of_table, _ = run(["lint", table, *lint], capsys)
    _, of_plan, _ = run(["lint", plan, *lint], capsys)
    assert of_table == of_plan
    assert json.loads(of_table)["problems"] == []
