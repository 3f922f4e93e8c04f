"""The command line with a DCP checkpoint directory: ``reshard CKPT_DIR DST.json``,
``diff CKPT_DIR plan.json``, and a table's fingerprint (``check --fingerprint``).

The checkpoint is written by ``dcp.save`` on four real gloo ranks: a model laid out by
tensor parallelism over ``tp=2``, then wrapped by ``fully_shard`` over ``dp_shard=2``
(``_StridedShard`` on the column-wise weight, 10 rows uneven over 4). What the command
line prints is what the library gives for that directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from layout_algebra import (
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    build_table,
    compose_table,
    reshard_plan,
)
from layout_algebra._compare import checkpoint_diff
from layout_algebra._complete import table_from_plan
from layout_algebra.draw import mesh_str
from layout_algebra.serialization import plan_to_json, shapes_to_json, to_json
from tests.test_cli import ROOT, assert_one_line_problem, assert_one_line_usage_error, run, write

S0, S1, R = Shard(0), Shard(1), Replicate()
SHAPES: Final = {"wq": (10, 4), "wo": (4, 8), "norm": (4,)}
SAVED_ON: Final = Mesh({"dp_shard": 2, "tp": 2})
PLAN: Final = ShardingPlan(
    {"": ModulePlan({"wq": {"tp": S0}, "wo": {"tp": S1}})}, mesh_axes=["dp_shard", "tp"]
)
"""The plan the checkpoint was saved under; ``norm`` stays a plain tensor until FSDP."""


def saved_table() -> ParamLayoutTable:
    return table_from_plan(PLAN, list(SHAPES), mesh_axes=SAVED_ON)


def save(rank: int, root: str) -> None:
    """One rank: the model laid out as ``saved_table()`` on ``SAVED_ON``, FSDP over
    ``dp_shard``, saved by ``dcp.save`` into ``root``."""
    del rank  # every rank runs the same program
    import torch  # noqa: PLC0415 (the ranks' own imports)
    from torch import nn  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    from layout_algebra.torch_bridge import distribute  # noqa: PLC0415
    from tests.torch_oracle import MeshFactory  # noqa: PLC0415

    torch.manual_seed(0)
    model = nn.Module()
    for fqn, shape in SHAPES.items():
        model.register_parameter(fqn, nn.Parameter(torch.randn(shape)))
    mesh = MeshFactory(SAVED_ON.size)(dict(SAVED_ON))
    distribute(model, saved_table(), {"dense": mesh})
    fully_shard(model, mesh=mesh["dp_shard"])
    dcp_save(model.state_dict(), checkpoint_id=root)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The directory ``dcp.save`` wrote on four gloo ranks."""
    pytest.importorskip("torch")
    from tests.torch_oracle import on_gloo  # noqa: PLC0415

    root = tmp_path_factory.mktemp("ckpt") / "step-1"
    on_gloo(save, str(root), world_size=SAVED_ON.size)
    return str(root)


def read(path: str, mesh: Mesh | None = None) -> tuple[ParamLayoutTable, dict[str, Mesh]]:
    from layout_algebra.torch_bridge import table_from_dcp  # noqa: PLC0415

    got = table_from_dcp(path, mesh=None if mesh is None else {"dense": mesh})
    return got.table, dict(got.meshes)


def to_tp2() -> ParamLayoutTable:
    """The 2-rank tensor-parallel layout the checkpoint is loaded under."""
    return ParamLayoutTable(
        {
            "wq": SourceLayout("dense", ["tp"], [S0]),
            "wo": SourceLayout("dense", ["tp"], [S0]),
            "norm": SourceLayout("dense", ["tp"], [R]),
        }
    )


# ---------------------------------------------------------------------------------------
# reshard CKPT_DIR DST.json


@pytest.mark.distributed
@pytest.mark.parametrize("given", [False, True], ids=["inferred-mesh", "given-mesh"])
def test_reshard_from_a_checkpoint_directory_is_the_librarys_plan(
    checkpoint: str, tmp_path: Path, given: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.torch_bridge import table_from_dcp  # noqa: PLC0415

    dst = write(tmp_path / "tp2.json", to_json(to_tp2()))
    mesh = ["--mesh", str(SAVED_ON)] if given else []
    code, out, err = run(["reshard", checkpoint, dst, *mesh, "--to-mesh", "tp=2"], capsys)
    assert (code, err) == (0, "")
    saved = table_from_dcp(checkpoint, mesh={"dense": SAVED_ON} if given else None)
    to = {"dense": Mesh({"tp": 2})}
    plan = reshard_plan(saved.table, to_tp2(), saved.shapes, src_sizes=saved.meshes, dst_sizes=to)
    shown = mesh_str(saved.meshes["dense"])
    assert out == f"saved on dense {shown}, loaded on dense (tp=2)\n{plan.report()}\n"
    assert shown == "(dp_shard=2, tp=2)" if given else saved.meshes["dense"].size == 4


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--fsdp", "dp_shard"], "--fsdp: a DCP checkpoint gives its layouts as saved"),
        (["--shapes", "shapes.json"], "--shapes: a DCP checkpoint gives"),
        (["--expert-mesh", "ep=4"], "--expert-mesh goes with --mesh"),
    ],
)
def test_reshard_from_a_checkpoint_refuses_what_it_gives_itself(
    checkpoint: str,
    tmp_path: Path,
    extra: list[str],
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dst = write(tmp_path / "tp2.json", to_json(to_tp2()))
    code, out, err = run(["reshard", checkpoint, dst, "--to-mesh", "tp=2", *extra], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra reshard")
    assert words in err


def test_reshard_of_a_table_still_needs_its_mesh_and_shapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = write(tmp_path / "t.json", to_json(to_tp2()))
    for argv, option in (
        (["reshard", table, table, "--shapes", "s.json", "--to-mesh", "tp=2"], "--mesh"),
        (["reshard", table, table, "--mesh", "tp=2", "--to-mesh", "tp=2"], "--shapes"),
    ):
        code, out, err = run(argv, capsys)
        assert_one_line_usage_error(code, out, err, "layout-algebra reshard")
        assert f"the following arguments are required: {option}" in err


def test_a_directory_that_is_no_checkpoint_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    empty = tmp_path / "empty"
    empty.mkdir()
    table = write(tmp_path / "t.json", to_json(to_tp2()))
    code, out, err = run(["reshard", str(empty), table, "--to-mesh", "tp=2"], capsys)
    assert out == ""
    assert_one_line_problem(code, err)
    assert "has no .metadata file" in err


# ---------------------------------------------------------------------------------------
# diff CKPT_DIR plan.json


@pytest.mark.distributed
def test_diff_of_a_checkpoint_and_the_plan_it_was_saved_under_is_empty(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    code, out, err = run(["diff", checkpoint, plan, "--mesh", str(SAVED_ON)], capsys)
    assert (code, out, err) == (0, "no change: 3 tensors compared\n", "")
    # the checkpoint spells its layouts over every axis of the mesh, the plan does not
    saved, _ = read(checkpoint, SAVED_ON)
    composed = compose_table(
        saved_table(), fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": SAVED_ON}
    )
    assert saved != composed
    # its source table with FSDP's axis given, too
    table = write(tmp_path / "table.json", to_json(saved_table()))
    argv = ["diff", checkpoint, table, "--mesh", str(SAVED_ON), "--fsdp", "dp_shard"]
    assert run(argv, capsys) == (0, out, "")


@pytest.mark.distributed
def test_diff_of_a_checkpoint_and_another_plan_names_what_moves(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = ShardingPlan(
        {"": ModulePlan({"wq": {"tp": S0}, "wo": {"tp": S0}})}, mesh_axes=["dp_shard", "tp"]
    )
    plan = write(tmp_path / "plan.json", plan_to_json(other))
    code, out, err = run(["diff", checkpoint, plan, "--mesh", str(SAVED_ON)], capsys)
    assert (code, err) == (1, "")
    saved, meshes = read(checkpoint, SAVED_ON)
    new = compose_table(
        table_from_plan(other, list(SHAPES), mesh_axes=SAVED_ON),
        fsdp={"dense": "dp_shard"},
        mesh_sizes=meshes,
    )
    from layout_algebra.torch_bridge import table_from_dcp  # noqa: PLC0415

    shapes = table_from_dcp(checkpoint, mesh={"dense": SAVED_ON}).shapes
    expected = checkpoint_diff(saved, new, shapes, meshes)
    assert out == f"{expected}\n"
    assert list(expected.changed) == ["wo"]
    assert out.startswith("wo: dense[dp_shard=S(0), tp=S(1)] -> dense[dp_shard=")
    # the other way round: the plan is the old side
    code, back, _ = run(["diff", plan, checkpoint, "--mesh", str(SAVED_ON)], capsys)
    assert code == 1 and back.startswith("wo: dense[dp_shard=_S(0, 2), tp=S(0)] -> ")


@pytest.mark.distributed
def test_diff_of_a_checkpoint_on_the_wrong_mesh_says_so(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    code, out, err = run(["diff", checkpoint, plan, "--mesh", "tp=4"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"layout-algebra: {checkpoint}: the checkpoint has ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["diff", "CKPT", "T"], "needs the mesh it was saved on"),
        (["diff", "T", "T", "--mesh", "tp=2"], "--mesh is for comparing a DCP checkpoint"),
        (["diff", "T", "T", "--fsdp", "dp"], "--fsdp is for comparing a DCP checkpoint"),
    ],
)
def test_diff_options_for_a_checkpoint_are_usage_errors_elsewhere(
    tmp_path: Path, argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = write(tmp_path / "t.json", to_json(to_tp2()))
    (tmp_path / "ckpt").mkdir()
    files = {"T": table, "CKPT": str(tmp_path / "ckpt")}
    code, out, err = run([files.get(a, a) for a in argv], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra diff")
    assert words in err


@pytest.mark.distributed
def test_lint_of_a_plan_takes_a_checkpoints_shapes(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.torch_bridge import table_from_dcp  # noqa: PLC0415

    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    mesh = ["--mesh", str(SAVED_ON), "--json"]
    code, out, err = run(["lint", plan, "--shapes", checkpoint, *mesh], capsys)
    assert (code, err) == (0, "")
    shapes = write(tmp_path / "shapes.json", shapes_to_json(table_from_dcp(checkpoint).shapes))
    assert run(["lint", plan, "--shapes", shapes, *mesh], capsys) == (0, out, "")
    code, out, err = run(["check", plan, *mesh[:-1], "--fqns", checkpoint], capsys)
    assert (code, err) == (0, "")
    assert f"2 of 3 FQNs of {checkpoint} matched by the plan" in out  # norm: no key


# ---------------------------------------------------------------------------------------
# check --fingerprint


def test_check_fingerprint_of_a_table_is_its_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = saved_table()
    path = write(tmp_path / "table.json", to_json(table))
    code, out, err = run(["check", "--fingerprint", path], capsys)
    assert (code, out, err) == (0, f"{table.fingerprint()}\n", "")
    # the same entries in another order: the same fingerprint
    reordered = ParamLayoutTable(dict(reversed(list(table.items()))))
    other = write(tmp_path / "reordered.json", to_json(reordered))
    assert run(["check", "--fingerprint", other], capsys) == (0, out, "")
    # one placement changed: another
    changed = table.with_entries({"wo": SourceLayout("dense", ["tp"], [S0])})
    moved = write(tmp_path / "moved.json", to_json(changed))
    _, differs, _ = run(["check", "--fingerprint", moved], capsys)
    assert differs != out and differs == f"{changed.fingerprint()}\n"


def test_check_fingerprint_of_a_plan_is_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    code, out, err = run(["check", plan, "--mesh", "dp_shard=2,tp=2", "--fingerprint"], capsys)
    expected = build_table(PLAN, ["dp_shard", "tp"]).fingerprint()
    assert (code, out, err) == (0, f"{expected}\n", "")
    code, out, err = run(["check", "--fingerprint", plan], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra check")
    assert "is a plan: its fingerprint is its table's; give --mesh" in err


def test_fingerprint_and_diff_of_tables_never_import_torch(tmp_path: Path) -> None:
    table = write(tmp_path / "table.json", to_json(saved_table()))
    script = f"""
import sys
from layout_algebra.cli import main
codes = [main(["check", "--fingerprint", {table!r}]), main(["diff", {table!r}, {table!r}])]
assert codes == [0, 0], codes
assert "torch" not in sys.modules, "torch was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.distributed
def test_a_checkpoint_is_read_without_torch(
    checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The metadata reader is the core's: with torch absent, ``reshard`` and ``diff`` of a
    checkpoint print what they print with it, and never import torch."""
    table = write(tmp_path / "t.json", to_json(to_tp2()))
    commands = [["reshard", checkpoint, table, "--to-mesh", "tp=2"], ["diff", checkpoint, table]]
    script = f"""
import contextlib, io, json, sys
sys.modules["torch"] = None  # as if torch were not installed
from layout_algebra.cli import main
outs = []
for args in {commands!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        outs.append([main(args), out.getvalue()])
print(json.dumps(outs))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    with_torch = [list(run(args, capsys)[:2]) for args in commands]
    assert json.loads(done.stdout) == with_torch
