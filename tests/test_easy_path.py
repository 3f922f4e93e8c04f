"""What a new user runs first, answered truly: a problem repeated in every layer is one
line of the report."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from layout_algebra import (
    LintNote,
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Shard,
    SourceLayout,
    lint,
)
from layout_algebra._text import alike_lines
from layout_algebra.cli import main
from layout_algebra.serialization import shapes_to_json, to_json


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------
# one problem repeated in every layer: one line


def cut_heads(layers: int) -> tuple[ParamLayoutTable, dict[str, ParamShape]]:
    """``layers`` layers whose k and v (2 KV heads of 8) are sharded over ``tp``."""
    kv = ParamShape((16, 32), "bfloat16", structure={0: Packed([Part("k", 2, 8)])})
    entries: dict[str, SourceLayout] = {}
    shapes: dict[str, ParamShape] = {}
    for i in range(layers):
        for p in "kv":
            entries[f"layers.{i}.{p}.weight"] = SourceLayout("dense", ["tp"], [Shard(0)])
            shapes[f"layers.{i}.{p}.weight"] = kv
    return ParamLayoutTable(entries), shapes


def test_a_problem_in_every_layer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = cut_heads(48)
    report = lint(table, shapes, mesh_sizes={"dense": {"tp": 4}})
    assert len(report.problems) == 96  # the value keeps every one
    tails = [report.problems[i].message.partition(": ")[2] for i in range(2)]
    lines = str(report).splitlines()
    assert lines[:4] == [
        "96 problems, 0 notes, 4 ranks",
        "problems:",
        f"  - layers.*.k.weight in 48 layers (0-47): {tails[0]}",
        f"  - layers.*.v.weight in 48 layers (0-47): {tails[1]}",
    ]
    assert "more" not in lines[4]
    # the command line prints the report's lines
    argv = ["lint", write(tmp_path / "t.json", to_json(table))]
    argv += ["--shapes", write(tmp_path / "s.json", shapes_to_json(shapes)), "--mesh", "tp=4"]
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert [x for x in out.splitlines() if x.startswith("  - layers.")] == lines[2:4]


def test_alike_lines_name_the_layers_and_keep_the_rest() -> None:
    table, shapes = cut_heads(12)
    # layers 4-7 replicated: their problems are gone, the others' run in two ranges
    entries = dict(table.items())
    for i in range(4, 8):
        for p in "kv":
            entries[f"layers.{i}.{p}.weight"] = SourceLayout("dense", ["tp"], [Shard(1)])
    report = lint(ParamLayoutTable(entries), shapes, mesh_sizes={"dense": {"tp": 4}})
    assert len(report.problems) == 16
    text = str(report)
    assert "  - layers.*.k.weight in 8 layers (0-3, 8-11): " in text
    # a problem of one layer stays as it is
    assert alike_lines([("layers.3.k.weight", "layers.3.k.weight: x"), ("w", "w: y")]) == [
        "layers.3.k.weight: x",
        "w: y",
    ]
    # other messages of the same FQNs are other lines; experts are named as experts
    items = [(f"experts.{e}.w", f"experts.{e}.w: uneven") for e in range(8)]
    items.append(("experts.0.w", "experts.0.w: other"))
    assert alike_lines(items) == ["experts.*.w in 8 experts (0-7): uneven", "experts.0.w: other"]


def test_notes_repeated_over_layers_are_one_line_too() -> None:
    table, shapes = cut_heads(2)
    report = lint(table, shapes, mesh_sizes={"dense": {"tp": 4}})
    notes = [LintNote(f"layers.{i}.w", "uneven shards of float32[5]") for i in range(32)]
    text = str(attrs.evolve(report, notes=notes))
    assert "notes:\n  - layers.*.w in 32 layers (0-31): uneven shards of float32[5]\n" in text
