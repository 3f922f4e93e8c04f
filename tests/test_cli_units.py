"""``lint`` with training flags and no ``--units``: the units the folder's model is
wrapped in, else the repeated numbered blocks of the shapes' FQNs, never the root alone
in silence, and the report says so; a table out of module order is taken in the model's
order where the folder gives it, and refused where nothing does."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from layout_algebra import Mesh, ParamLayoutTable, ParamShape, Shard, SourceLayout, Training, lint
from layout_algebra.cli import main
from layout_algebra.cli._parser import LINT_EXAMPLE
from layout_algebra.serialization import shapes_to_json, to_json

LAYERS = 4


def model(tmp_path: Path, prefix: str) -> list[str]:
    shapes = {f"{prefix}{i}.w": ParamShape((64, 64), "float32") for i in range(LAYERS)}
    shapes["embed.weight"] = ParamShape((100, 64), "float32")
    table = ParamLayoutTable({fqn: SourceLayout("dense", ["tp"], [Shard(0)]) for fqn in shapes})
    (tmp_path / "s.json").write_text(shapes_to_json(shapes))
    (tmp_path / "t.json").write_text(to_json(table))
    return ["lint", str(tmp_path / "t.json"), "--shapes", str(tmp_path / "s.json")]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    out, _ = capsys.readouterr()
    return code, out


def test_the_repeated_blocks_are_the_units_and_the_report_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = model(tmp_path, "model.layers.")
    code, out = run([*argv, "--mesh", "dp_shard=4,tp=2", "--optimizer", "adamw"], capsys)
    assert code == 0
    assert out.count("assumptions:") == 1
    assert "units: no --units, so one fully_shard per repeated numbered block" in out
    assert "(model.layers.*)" in out
    _, given = run(
        [*argv, "--mesh", "dp_shard=4,tp=2", "--optimizer", "adamw", "--units", "model.layers.*"],
        capsys,
    )
    assert "no --units" not in given

    # the same figures as with those units given
    def figures(text: str) -> str:
        return text.split("training memory")[1].split("assumptions:", maxsplit=1)[0]

    assert figures(given) == figures(out)


def test_the_inferred_units_are_the_librarys_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = model(tmp_path, "model.layers.")
    _, out = run([*argv, "--mesh", "dp_shard=4,tp=2", "--optimizer", "adamw", "--json"], capsys)
    shapes = {f"model.layers.{i}.w": ParamShape((64, 64), "float32") for i in range(LAYERS)}
    shapes["embed.weight"] = ParamShape((100, 64), "float32")
    table = ParamLayoutTable({fqn: SourceLayout("dense", ["tp"], [Shard(0)]) for fqn in shapes})
    report = lint(
        table,
        shapes,
        mesh_sizes=Mesh({"dp_shard": 4, "tp": 2}),
        fsdp={"dense": "dp_shard"},
        training=Training(units=["model.layers.*"]),
    )
    assert json.loads(out) == report.to_dict()


def test_without_repeated_blocks_the_root_alone_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = model(tmp_path, "block_")
    code, out = run([*argv, "--mesh", "dp_shard=4,tp=2", "--optimizer", "sgd"], capsys)
    assert code == 0
    assert "no repeated numbered blocks in the shapes' FQNs, so the root alone" in out


def test_the_help_example_works_on_a_transformers_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lint --help``'s example, as written, on a ``save_pretrained`` folder and the
    model's own table: the right figures on the first try, every default said."""
    from layout_algebra.torch_bridge import table_from_hf  # noqa: PLC0415
    from tests.test_easy_path import save_folder  # noqa: PLC0415

    model = save_folder(tmp_path / "model", sharded=False, num_hidden_layers=4)
    table = table_from_hf(model, mesh_axes=["dp_shard", "tp"])
    (tmp_path / "table.json").write_text(to_json(table))
    argv = shlex.split(LINT_EXAMPLE)[1:]
    argv = [
        {"table.json": str(tmp_path / "table.json"), "MODEL_DIR": str(tmp_path / "model")}.get(a, a)
        for a in argv
    ]
    code, out = run(argv, capsys)
    assert code == 0, out
    assert "FSDP over dense dp_shard" in out
    # the units the model is wrapped in, as transformers' own FSDP2 wraps it, and said
    from layout_algebra.torch_bridge import training_from_module  # noqa: PLC0415

    units = training_from_module(model).units
    assert units[1] == "model.layers.*"
    shown = ", ".join(map(str, units))
    assert f"units: as transformers wraps the model: {shown} (give --units to choose)" in out
    assert "the root: FSDP2's own rule" in out
    # the figures are the library's for that table, FSDP and units
    from layout_algebra.torch_bridge import shapes_from_module  # noqa: PLC0415

    report = lint(
        table,
        shapes_from_module(model),
        mesh_sizes=Mesh({"dp_shard": 4, "tp": 2}),
        fsdp={"dense": "dp_shard"},
        training=Training(units=units),
        budget=80 * 2**30,
    )
    rows = str(report).split("training memory")[1].split("assumptions:")[0]
    assert rows in out


def test_a_table_out_of_module_order_is_taken_in_the_models_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A planner's table grouped by kind: with the model folder its entries are taken in
    module order (said), giving the model-ordered table's figures; with shapes alone the
    step's order is unknown, and crossing units are refused in one line."""
    from layout_algebra.torch_bridge import shapes_from_module, table_from_hf  # noqa: PLC0415
    from tests.test_easy_path import save_folder  # noqa: PLC0415

    model = save_folder(tmp_path / "model", sharded=False, num_hidden_layers=2)
    table = table_from_hf(model, mesh_axes=["dp_shard", "tp"])
    grouped = ParamLayoutTable(
        dict(sorted(table.items(), key=lambda item: item[0].rpartition(".")[0].split(".")[-1])),
        tied=table.tied,
    )
    assert list(grouped) != list(table)
    (tmp_path / "grouped.json").write_text(to_json(grouped))
    (tmp_path / "table.json").write_text(to_json(table))
    flags = ["--mesh", "dp_shard=2,tp=2", "--optimizer", "adamw", "--units", "model.layers.*"]
    folder = ["--shapes", str(tmp_path / "model")]
    code, out = run(["lint", str(tmp_path / "grouped.json"), *folder, *flags], capsys)
    assert code == 0, out
    assert "order: the table's entries taken in the module order of" in out
    _, in_order = run(["lint", str(tmp_path / "table.json"), *folder, *flags], capsys)
    assert "the table's entries taken in the module order" not in in_order
    figures = in_order.split("training memory")[1].split("assumptions:")[0]
    assert figures in out

    (tmp_path / "shapes.json").write_text(shapes_to_json(shapes_from_module(model)))
    code = main(
        ["lint", str(tmp_path / "grouped.json"), "--shapes", str(tmp_path / "shapes.json"), *flags]
    )
    _, err = capsys.readouterr()
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "not in module order" in err and "model.named_parameters()" in err
