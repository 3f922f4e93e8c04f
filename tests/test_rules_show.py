"""A table's columns line up on the output it is written to: FQNs are escaped for the
output's encoding before the column is measured (``format(table, encoding)``), the one
rule ``show`` and ``check`` print through."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from layout_algebra import (
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Shard,
    ShardingPlan,
    SourceLayout,
)
from layout_algebra.cli import main
from layout_algebra.serialization import plan_to_json, to_json

TP = SourceLayout("dense", ["tp"], [Shard(0)])
TABLE = ParamLayoutTable(
    {"caf\u00e9.w": TP, "x": TP, "\u00fcber.\u00e9t\u00e9.w": TP}, tied=[{"x", "caf\u00e9.w"}]
)


def column(lines: list[str]) -> set[int]:
    """Where each line's layout starts."""
    return {line.index("  dense[") for line in lines}


@pytest.mark.parametrize("encoding", ["", "utf-8", "ascii", "latin-1"])
def test_a_table_formatted_for_an_encoding_is_aligned_as_written(encoding: str) -> None:
    text = format(TABLE, encoding)
    if encoding:
        text = text.encode(encoding, "backslashreplace").decode(encoding)  # as a stream writes
    lines = text.splitlines()
    assert len(column(lines[:3])) == 1, lines
    assert lines[3] == ("tied: caf\\xe9.w, x" if encoding == "ascii" else "tied: caf\u00e9.w, x")
    assert format(TABLE, "") == str(TABLE) == f"{TABLE}"


@pytest.mark.parametrize("encoding", ["ascii", "utf-8"])
@pytest.mark.parametrize("command", ["show", "check"])
def test_show_and_check_align_the_table_on_the_terminal_s_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str, command: str
) -> None:
    if command == "show":
        path = tmp_path / "t.json"
        path.write_text(to_json(TABLE), encoding="utf-8")
        argv = ["show", str(path)]
    else:
        modules = {m: ModulePlan({"w": {"tp": Shard(0)}}) for m in ("caf\u00e9", "plain")}
        path = tmp_path / "plan.json"
        path.write_text(plan_to_json(ShardingPlan(modules, mesh_axes=["tp"])), encoding="utf-8")
        argv = ["check", str(path), "--mesh", "tp=2"]
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding=encoding)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(argv) == 0
    stdout.flush()
    lines = [line for line in raw.getvalue().decode(encoding).splitlines() if "  dense[" in line]
    assert len(lines) >= 2 and len(column(lines)) == 1, lines
    assert any(("caf\\xe9.w" if encoding == "ascii" else "caf\u00e9.w") in x for x in lines)


def test_a_format_spec_that_is_no_encoding_is_refused() -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    with pytest.raises(LayoutError, match="encoding"):
        format(table, ">10")
