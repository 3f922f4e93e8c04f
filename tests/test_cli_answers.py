"""Every answer true or refused: what the command line said nothing about, or refused
although a sibling command takes it.

``diff`` of equal tables says what it compared; ``reshard`` takes the plan ``diff`` takes
beside a checkpoint, and names the saved tensors its destination leaves out; ``check
--fingerprint`` fingerprints a checkpoint's stored layouts; a mesh string given where
axis names belong is split in the suggestion; ``draw`` fits its picture to a width; and
``demo`` says on a terminal that torch is loading.
"""

from __future__ import annotations

import argparse
import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import pytest

from layout_algebra import (
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    build_table,
    compose_table,
    strip,
)
from layout_algebra._complete import table_from_plan
from layout_algebra.cli._commands import demo_command
from layout_algebra.draw import draw
from layout_algebra.serialization import plan_to_json, shapes_to_json, to_json
from layout_algebra.shapes import ParamShape
from tests.test_cli import assert_one_line_usage_error, run, write

S0, S1, R = Shard(0), Shard(1), Replicate()
SAVED_ON: Final = Mesh({"dp_shard": 2, "tp": 2})
SHAPES: Final = {"wq": (8, 4), "wo": (4, 8), "norm": (4,)}
PLAN: Final = ShardingPlan(
    {"": ModulePlan({"wq": {"tp": S0}, "wo": {"tp": S1}})}, mesh_axes=["dp_shard", "tp"]
)
"""The plan the checkpoints are saved under; ``norm`` no key names."""


def plan_table(*, plain: bool = True) -> ParamLayoutTable:
    """``PLAN``'s complete table on ``SAVED_ON``: ``norm`` a plain tensor (``dense[]``, as
    ``table --fqns`` makes it) or, with ``plain=False``, spelled over every source axis
    (``dense[tp=R]``)."""
    table = table_from_plan(PLAN, list(SHAPES), mesh_axes=SAVED_ON)
    if plain:
        return table
    return table.with_entries({"norm": SourceLayout("dense", ["tp"], [R])})


def saved_layouts() -> ParamLayoutTable:
    """What FSDP over ``dp_shard`` makes of ``plan_table()``: the layouts saved."""
    return compose_table(plan_table(), fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": SAVED_ON})


def written_checkpoint(where: Path, tensors: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """A checkpoint directory holding the ``.metadata`` DCP writes for ``saved_layouts()``
    (``tensors``: more tensors, saved plain and sharded by FSDP)."""
    from tests.test_table_from_dcp import saved_by, write_metadata  # noqa: PLC0415 (torch)

    layouts = dict(saved_layouts())
    shapes = dict(SHAPES)
    for fqn, shape in (tensors or {}).items():
        layouts[fqn], shapes[fqn] = layouts["norm"], shape
    return write_metadata(
        where, {fqn: saved_by(layouts[fqn], shapes[fqn], SAVED_ON) for fqn in shapes}
    )


def serve_table(*fqns: str) -> ParamLayoutTable:
    """A 2-rank tensor-parallel table of ``fqns`` (default: every tensor)."""
    layouts = {"wq": SourceLayout("dense", ["tp"], [S0]), "wo": SourceLayout("dense", ["tp"], [S0])}
    return ParamLayoutTable(
        {f: layouts.get(f, SourceLayout("dense", ["tp"], [R])) for f in fqns or SHAPES}
    )


# ---------------------------------------------------------------------------------------
# diff says what it compared


def test_diff_of_equal_tables_says_how_many_tensors_it_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path / "a.json", to_json(plan_table()))
    assert run(["diff", a, a], capsys) == (0, "no change: 3 tensors compared\n", "")
    one = write(tmp_path / "one.json", to_json(serve_table("wq")))
    assert run(["diff", one, one], capsys) == (0, "no change: 1 tensor compared\n", "")
    # tables that differ still exit 1 with the changes only
    code, out, err = run(["diff", a, one], capsys)
    assert (code, err) == (1, "") and "no change" not in out


def test_diff_of_a_checkpoint_and_its_plan_or_table_says_no_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    checkpoint = written_checkpoint(tmp_path / "ckpt")
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    table = write(tmp_path / "table.json", to_json(plan_table()))
    mesh = ["--mesh", str(SAVED_ON)]
    said = (0, "no change: 3 tensors compared\n", "")
    assert run(["diff", checkpoint, plan, *mesh], capsys) == said
    assert run(["diff", plan, checkpoint, *mesh], capsys) == said
    assert run(["diff", checkpoint, table, *mesh, "--fsdp", "dp_shard"], capsys) == said


# ---------------------------------------------------------------------------------------
# reshard reads the plan diff reads and names what it leaves out; a checkpoint's fingerprint


def test_reshard_takes_as_destination_the_plan_diff_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    checkpoint = written_checkpoint(tmp_path / "ckpt")
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    mesh = ["--mesh", str(SAVED_ON)]
    assert run(["diff", checkpoint, plan, *mesh], capsys)[0] == 0
    # the plan is read as diff reads it: its complete table, FSDP over the one FSDP axis
    table = write(tmp_path / "table.json", to_json(plan_table()))
    to = ["--to-mesh", str(SAVED_ON)]
    code, out, err = run(["reshard", checkpoint, plan, *mesh, *to], capsys)
    assert (code, err) == (0, "")
    expected = run(["reshard", checkpoint, table, *mesh, *to, "--to-fsdp", "dp_shard"], capsys)
    assert expected == (0, out, "")
    assert "reshard: 3 parameters" in out
    # on a mesh without an FSDP axis, the plan's table as it is
    code, out, err = run(["reshard", checkpoint, plan, "--to-mesh", "tp=2"], capsys)
    assert (code, err) == (0, "")
    assert out == run(["reshard", checkpoint, table, "--to-mesh", "tp=2"], capsys)[1]


def test_reshard_of_a_plan_names_its_own_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    checkpoint = written_checkpoint(tmp_path / "ckpt")
    plan = write(tmp_path / "plan.json", plan_to_json(PLAN))
    argv = ["reshard", checkpoint, plan, "--to-mesh", "dp_replicate=2,dp_shard=2"]
    code, out, err = run(argv, capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra reshard")
    assert "--to-mesh (dp_replicate=2, dp_shard=2) has 2 FSDP axes" in err
    assert "--to-fsdp dp_replicate,dp_shard" in err
    experts = ShardingPlan(
        {"moe": ModulePlan({"w": {"ep": S0}}, expert_parallel=True)}, mesh_axes=["ep"]
    )
    moe = write(tmp_path / "moe.json", plan_to_json(experts))
    code, out, err = run(["reshard", checkpoint, moe, "--to-mesh", "ep=2"], capsys)
    assert (code, out) == (1, "")
    assert (
        "give that mesh with --to-expert-mesh AXIS=N,..., over the same ranks as --to-mesh" in err
    )


def test_reshard_names_the_saved_tensors_its_destination_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    checkpoint = written_checkpoint(tmp_path / "ckpt")
    dst = write(tmp_path / "serve.json", to_json(serve_table("wq", "wo")))
    code, out, err = run(["reshard", checkpoint, dst, "--to-mesh", "tp=2"], capsys)
    assert code == 0 and "reshard: 2 parameters" in out
    assert err == (
        f"layout-algebra: note: {dst} lacks 1 saved tensor, not loaded and not counted: "
        "norm; to load it, give the plan as DST (its table covers every saved tensor) or "
        f"make the table with `layout-algebra table PLAN.json --mesh AXIS=N,... --fqns "
        f"{checkpoint}`\n"
    )
    # many: the first few named, the rest counted, on one line
    more = {f"layers.{i}.norm": (4,) for i in range(8)}
    many = written_checkpoint(tmp_path / "many", more)
    code, _, err = run(["reshard", many, dst, "--to-mesh", "tp=2"], capsys)
    assert code == 0 and len(err.splitlines()) == 1
    assert "lacks 9 saved tensors, not loaded and not counted: norm, layers.0.norm, " in err
    assert "layers.3.norm and 4 more; to load them" in err
    # from a table and its shapes, the shapes list the saved tensors
    src = write(tmp_path / "train.json", to_json(plan_table()))
    shapes = {fqn: ParamShape(shape, "float32") for fqn, shape in SHAPES.items()}
    shapes_file = write(tmp_path / "shapes.json", shapes_to_json(shapes))
    argv = ["reshard", src, dst, "--shapes", shapes_file, "--mesh", "tp=2", "--to-mesh", "tp=2"]
    code, _, err = run(argv, capsys)
    assert code == 0 and err.endswith(f"--fqns {shapes_file}`\n") and ": norm;" in err


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A checkpoint ``dcp.save`` wrote on four gloo ranks under ``plan_table(plain=False)``
    with FSDP over ``dp_shard``."""
    pytest.importorskip("torch")
    from tests.torch_oracle import on_gloo  # noqa: PLC0415

    root = tmp_path_factory.mktemp("answers") / "step-1"
    on_gloo(save, str(root), world_size=SAVED_ON.size)
    return str(root)


def save(rank: int, root: str) -> None:
    """One rank: the model laid out as ``plan_table(plain=False)`` on ``SAVED_ON``, FSDP
    over ``dp_shard``, saved by ``dcp.save`` into ``root``."""
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
    distribute(model, plan_table(plain=False), {"dense": mesh})
    fully_shard(model, mesh=mesh["dp_shard"])
    dcp_save(model.state_dict(), checkpoint_id=root)


@pytest.mark.distributed
def test_check_fingerprint_of_a_checkpoint_is_its_stored_layouts(
    saved_checkpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.dcp import table_from_dcp  # noqa: PLC0415

    mesh = ["--mesh", str(SAVED_ON)]
    code, given, err = run(["check", "--fingerprint", saved_checkpoint, *mesh], capsys)
    stored = table_from_dcp(saved_checkpoint, mesh={"dense": SAVED_ON}).table
    assert (code, given, err) == (0, f"{stored.fingerprint()}\n", "")
    # the stored layouts are composed: the composed table of the run that saved them
    fsdp, sizes = {"dense": "dp_shard"}, {"dense": SAVED_ON}
    composed = compose_table(plan_table(plain=False), fsdp=fsdp, mesh_sizes=sizes)
    assert given == f"{composed.fingerprint()}\n"
    written = write(tmp_path / "composed.json", to_json(composed))
    assert run(["check", "--fingerprint", written], capsys) == (0, given, "")
    # inferred axis names (d0, d1): another fingerprint
    code, inferred, _ = run(["check", "--fingerprint", saved_checkpoint], capsys)
    assert code == 0 and inferred != given
    assert inferred == f"{table_from_dcp(saved_checkpoint).table.fingerprint()}\n"
    # a plain parameter composes to dense[dp_shard=S(0)], stored as dense[dp_shard=S(0),
    # tp=R]: one sharding, two spellings, two fingerprints; diff compares them by boxes
    spelled = compose_table(plan_table(), fsdp=fsdp, mesh_sizes=sizes)
    assert f"{spelled.fingerprint()}\n" != given
    table = write(tmp_path / "plain.json", to_json(plan_table()))
    argv = ["diff", saved_checkpoint, table, *mesh, "--fsdp", "dp_shard"]
    assert run(argv, capsys) == (0, "no change: 3 tensors compared\n", "")


def test_check_fingerprint_of_a_checkpoint_refuses_fqns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    checkpoint = written_checkpoint(tmp_path / "ckpt")
    for extra, words in (
        (["--fqns", "f.txt"], "--fqns: a DCP checkpoint names its own tensors"),
        (["--expert-mesh", "ep=4"], "--expert-mesh goes with --mesh"),
    ):
        code, out, err = run(["check", "--fingerprint", checkpoint, *extra], capsys)
        assert_one_line_usage_error(code, out, err, "layout-algebra check")
        assert words in err


# ---------------------------------------------------------------------------------------
# a mesh string split, draw to a width, a line while torch loads


@pytest.mark.parametrize("given", ["dp_shard,tp", "dp_shard=2,tp=4", "dp_shard, tp", "dp_shard tp"])
def test_a_mesh_string_where_names_belong_is_split_in_the_suggestion(given: str) -> None:
    with pytest.raises(LayoutError) as e:
        strip(given)  # a str is Iterable[str]: the mistake types cannot catch
    assert e.value.message.endswith("write ('dp_shard', 'tp'), one name a string")
    with pytest.raises(LayoutError) as e:
        build_table(PLAN, given)
    assert "dense_axes must be a collection" in e.value.message
    assert "write ('dp_shard', 'tp')" in e.value.message


def test_one_name_where_names_belong_is_one_item_in_the_suggestion() -> None:
    with pytest.raises(LayoutError) as e:
        strip("tp")
    assert e.value.message.endswith("write ('tp',)")


EXPERTS: Final = SourceLayout("expert", ["ep"], [S0])
"""128 experts, one a rank."""


@pytest.mark.parametrize("width", [80, 40, 120])
def test_draw_of_128_experts_fits_the_width(width: int) -> None:
    picture = draw(EXPERTS, (128, 64, 32), {"ep": 128}, fqn="moe.experts.w1", width=width)
    # the picture fits; so does the rank table below it, as narrow as its columns
    grid = picture.partition("\nrank  ")[0]
    assert max(map(len, grid.splitlines())) <= width
    assert max(map(len, picture.splitlines())) <= max(width, 64)
    # every block still named once, in order, with its rank below it
    assert re.findall(r"(?<= )\d+:\d+(?= |$)", grid, re.MULTILINE) == [
        f"{i}:{i + 1}" for i in range(128)
    ]
    assert re.findall(r"(?<=\|) *(\d+) *(?=\|)", grid) == [str(i) for i in range(128)]
    # no width: one band, as before
    wide = draw(EXPERTS, (128, 64, 32), {"ep": 128}, fqn="moe.experts.w1")
    assert max(map(len, wide.splitlines())) > 900


def test_draw_of_a_grid_wraps_its_columns_and_keeps_its_rows() -> None:
    layout = SourceLayout("dense", ["dp", "tp"], [S0, S1])
    picture = draw(layout, (4, 64), {"dp": 2, "tp": 16}, fqn="w", width=60)
    lines = picture.splitlines()
    assert max(map(len, lines)) <= 60
    assert sum(line.startswith("0:2 |") for line in lines) >= 2  # each band, its rows
    assert picture == draw(layout, (4, 64), {"dp": 2, "tp": 16}, fqn="w", width=60)


@pytest.mark.parametrize("width", [0, -1, True, 1.5, "80"])
def test_draw_refuses_a_width_that_is_no_count(width: object) -> None:
    with pytest.raises(LayoutError) as e:
        draw(EXPERTS, (128, 4), {"ep": 128}, width=width)  # type: ignore[arg-type]
    assert "width must be an int >= 1" in e.value.message


def test_the_draw_command_fits_the_terminal_width(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table = write(tmp_path / "t.json", to_json(ParamLayoutTable({"w": EXPERTS})))
    argv = ["draw", table, "w", "--shape", "128,64,32", "--mesh", "ep=128"]
    monkeypatch.setenv("COLUMNS", "80")  # what a pipe gets; a terminal under -s would not
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out == draw(EXPERTS, (128, 64, 32), {"ep": 128}, fqn="w", width=80) + "\n"
    monkeypatch.setenv("COLUMNS", "100")
    assert (
        run(argv, capsys)[1] == draw(EXPERTS, (128, 64, 32), {"ep": 128}, fqn="w", width=100) + "\n"
    )
    assert run([*argv, "--width", "60"], capsys)[1].count("\n") > run(argv, capsys)[1].count("\n")
    _, unlimited, _ = run([*argv, "--width", "0"], capsys)
    assert unlimited == draw(EXPERTS, (128, 64, 32), {"ep": 128}, fqn="w") + "\n"


class Terminal(io.StringIO):
    """A stderr a person watches."""

    def isatty(self) -> bool:
        return True


def _demo_args() -> argparse.Namespace:
    return argparse.Namespace(rank=0, verify=False, json=False)


def test_demo_says_on_a_terminal_that_torch_is_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch")
    import layout_algebra._demo  # noqa: PLC0415 (the module the command imports)

    seen: list[str] = []
    err = Terminal()

    def run_demo(**_: object) -> int:
        seen.append(err.getvalue())  # what the terminal shows while the demo runs
        return 0

    monkeypatch.setattr(layout_algebra._demo, "run", run_demo)
    assert demo_command(_demo_args(), io.StringIO(), err) == 0
    # said while torch loads, rubbed out (back to the line's start, blanked) before the
    # demo prints
    line = "layout-algebra: loading torch..."
    assert seen == [f"{line}\r{' ' * len(line)}\r"]
    assert err.getvalue() == seen[0]
    # a pipe, a file, a test: nothing
    quiet = io.StringIO()
    assert demo_command(_demo_args(), io.StringIO(), quiet) == 0
    assert quiet.getvalue() == ""
