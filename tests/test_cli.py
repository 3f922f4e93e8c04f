"""The command line: every subcommand, its output and its exit status.

``show``, ``diff``, ``check`` and ``draw`` run in-process through ``main(argv)``; ``demo``
starts its own fake process group, so it runs in a subprocess. The pictures ``draw``
prints are read back cell by cell and compared with what torch's placements cut out of
a tensor on every rank of the mesh.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from layout_algebra import (
    FSDP_OWNED_AXES,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    Partial,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    diff,
)
from layout_algebra._demo import TinyMoE, demo_plan, demo_table
from layout_algebra.cli import main
from layout_algebra.draw import draw
from layout_algebra.serialization import from_json, plan_to_json, shapes_to_json, to_json

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

S0, S1, R = Shard(0), Shard(1), Replicate()
ROOT: Final = Path(__file__).resolve().parent.parent
INPUT_BOUND: Final = "layout_algebra.cli._inputs.MAX_INPUT_BYTES"
"""Where the command line's bound on an input file lives (made small to test it)."""


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def table() -> ParamLayoutTable:
    return ParamLayoutTable(
        {
            "emb.weight": SourceLayout("dense", ["tp"], [S0]),
            "head.weight": SourceLayout("dense", ["tp"], [S0]),
            "layers.0.wo.weight": SourceLayout("dense", ["tp"], [S1]),
            "norm.weight": SourceLayout("dense", ["tp"], [R]),
            "moe.experts.w1": SourceLayout("expert", ["ep", "tp"], [S0, S1]),
        },
        tied=[{"emb.weight", "head.weight"}],
    )


@pytest.fixture
def table_file(tmp_path: Path, table: ParamLayoutTable) -> str:
    return write(tmp_path / "table.json", to_json(table))


def run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_problem(code: int, err: str) -> None:
    assert code == 1
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("layout-algebra: ")


# ---------------------------------------------------------------------------------------
# show


def test_show_prints_every_entry_aligned_and_the_tied_groups(
    table_file: str, table: ParamLayoutTable, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["show", table_file], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    for fqn, layout in table.items():
        assert any(re.fullmatch(rf"{re.escape(fqn)} +{re.escape(str(layout))}", ln) for ln in lines)
    columns = {ln.index(str(table[ln.split()[0]])) for ln in lines if ln.split()[0] in table}
    assert len(columns) == 1  # layouts start in one column
    assert "tied: emb.weight, head.weight" in lines
    assert lines[-1] == "(5 parameters, 1 tied group)"


def test_show_of_a_missing_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.json")
    code, out, err = run(["show", missing], capsys)
    assert_one_line_problem(code, err)
    assert missing in err and "No such file" in err
    assert out == ""


def test_show_of_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["show", str(tmp_path)], capsys)
    assert_one_line_problem(code, err)
    assert str(tmp_path) in err


def test_show_of_invalid_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "bad.json", '{"version": 1,\n "entries": {\n')
    code, out, err = run(["show", path], capsys)
    assert_one_line_problem(code, err)
    assert path in err and "not valid JSON" in err
    assert out == ""


def test_show_of_invalid_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bytes.json"
    path.write_bytes(b'{"version": 1, "entries": {"\xff": 1}}')
    code, _, err = run(["show", str(path)], capsys)
    assert_one_line_problem(code, err)


def test_show_of_a_bad_placement_names_its_json_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        '{"version": 1, "entries": {"layers.7.w": '
        '{"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "X(1)"]}}}'
    )
    path = write(tmp_path / "bad.json", text)
    code, out, err = run(["show", path], capsys)
    assert_one_line_problem(code, err)
    assert 'entries["layers.7.w"].placements[1]' in err
    assert "'X(1)'" in err
    assert out == ""


def test_show_of_a_partial_placement_is_a_layout_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        '{"version": 1, "entries": {"w": '
        '{"mesh": "dense", "axes": ["tp"], "placements": ["P(sum)"]}}}'
    )
    code, _, err = run(["show", write(tmp_path / "p.json", text)], capsys)
    assert_one_line_problem(code, err)
    assert 'entries["w"].placements[0]' in err


# ---------------------------------------------------------------------------------------
# diff


def test_diff_of_equal_tables_exits_0_saying_what_it_compared(
    tmp_path: Path, table: ParamLayoutTable, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path / "a.json", to_json(table))
    b = write(tmp_path / "b.json", to_json(table))
    assert run(["diff", a, b], capsys) == (0, f"no change: {len(table)} tensors compared\n", "")


def test_diff_of_different_tables_exits_1_with_the_report(
    tmp_path: Path, table: ParamLayoutTable, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = table.with_entries({"layers.0.wo.weight": SourceLayout("dense", ["tp"], [S0])})
    a = write(tmp_path / "a.json", to_json(table))
    b = write(tmp_path / "b.json", to_json(changed))
    code, out, err = run(["diff", a, b], capsys)
    assert (code, err) == (1, "")
    assert out == "layers.0.wo.weight: dense[tp=S(1)] -> dense[tp=S(0)]\n"


def test_diff_with_a_bad_file_is_a_layout_problem(
    tmp_path: Path, table_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path / "bad.json", '{"version": 2, "entries": {}}')
    code, _, err = run(["diff", table_file, bad], capsys)
    assert_one_line_problem(code, err)
    assert bad in err and "version" in err


# ---------------------------------------------------------------------------------------
# check


def moe_plan() -> ShardingPlan:
    return ShardingPlan(
        {
            "emb": ModulePlan({"weight": {"tp": S0}}),
            "head": ModulePlan({"weight": {"tp": S0}}),
            "attn": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1}}),
            "moe": ModulePlan(
                {"experts.w1": {"ep": S0, "tp": S1}, "router.weight": {"dp_shard": R}},
                expert_parallel=True,
            ),
        },
        mesh_axes=["dp_shard", "ep", "tp"],
        tied_pairs=[("emb.weight", "head.weight")],
    )


def test_check_of_a_good_plan_prints_a_summary_and_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    argv = ["check", path, "--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"{path}: OK, 6 parameters\n")
    assert "dense mesh (dp_shard=2, tp=4): 5 parameters; source axes tp" in out
    assert "expert mesh (dp_shard=2, ep=4): 1 parameter; source axes ep" in out
    assert "1 tied group" in out
    assert re.search(r"^moe\.experts\.w1 +expert\[ep=S\(0\)\]$", out, re.MULTILINE)
    assert re.search(r"^attn\.wo\.weight +dense\[tp=S\(1\)\]$", out, re.MULTILINE)
    assert "tied: emb.weight, head.weight" in out


def test_check_reports_every_problem_with_its_fqn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = ShardingPlan(
        {
            "attn": ModulePlan(
                {
                    "wq.weight": {"tpp": S0},  # a typo
                    "wk.weight": {"dp_shard": S0},  # FSDP's axis
                    "wv.weight": {"tp": Partial()},  # not a parameter layout
                    "wo.weight": {"tp": S1},  # fine
                }
            ),
            "moe": ModulePlan({"experts.w1": {"ep": S0}}, expert_parallel=True),  # fine
            "emb": ModulePlan({"weight": {"tp": S0}}),
            "head": ModulePlan({"weight": {"tp": S1}}),  # tied to emb, conflicting
        },
        mesh_axes=["dp_shard", "ep", "tp"],
        tied_pairs=[("emb.weight", "head.weight")],
    )
    path = write(tmp_path / "plan.json", plan_to_json(plan))
    argv = ["check", path, "--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert code == 1
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith(f"layout-algebra: {path}: the plan has 4 problems:\n")
    problems = err.splitlines()[1:]
    assert len(problems) == 4
    for fqn in ["attn.wq.weight", "attn.wk.weight", "attn.wv.weight"]:
        assert sum(fqn in p for p in problems) == 1, fqn
    assert any("emb.weight" in p and "head.weight" in p for p in problems)
    assert "attn.wo.weight" not in err and "moe.experts.w1" not in err
    assert "'tpp'" in err and "'dp_shard'" in err and "P(sum)" in err


def test_check_of_a_bad_plan_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        '{"version": 1, "mesh_axes": ["tp"], '
        '"modules": {"attn": {"params": {"w": {"tp": "S(-1)"}}}}}'
    )
    path = write(tmp_path / "plan.json", text)
    code, _, err = run(["check", path, "--mesh", "tp=2"], capsys)
    assert_one_line_problem(code, err)
    assert 'modules["attn"].params["w"]["tp"]' in err


@pytest.mark.parametrize(
    "mesh",
    ["tp4", "tp=0", "tp=-2", "tp=x", "tp=2,tp=2", "1tp=2", "tp=2,", "", "tp=2;ep=2"],
)
def test_check_with_bad_mesh_syntax_is_a_usage_error(
    tmp_path: Path, mesh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    code, out, err = run(["check", path, "--mesh", mesh], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra check")
    assert "--mesh" in err


def assert_one_line_usage_error(code: int, out: str, err: str, prog: str) -> None:
    """Exit 2 and one line on stderr naming the command, its remedy ``--help``."""
    assert (code, out) == (2, "")
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert err.startswith(f"{prog}: ") and err.endswith(f"; see {prog} --help\n"), err


def paths(tmp_path: Path) -> dict[str, str]:
    """Files every command can be pointed at (the usage errors are found before reading)."""
    table = write(
        tmp_path / "t.json", to_json(ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [S0])}))
    )
    shapes = write(tmp_path / "s.json", shapes_to_json({"w": ParamShape((4, 4), "float32")}))
    plan = write(tmp_path / "p.json", plan_to_json(moe_plan()))
    return {"T": table, "S": shapes, "P": plan}


LINT: Final = ["lint", "T", "--shapes", "S", "--mesh", "tp=2"]
RESHARD: Final = ["reshard", "T", "T", "--shapes", "S", "--mesh", "tp=2", "--to-mesh", "tp=2"]
DRAW: Final = ["draw", "T", "w", "--shape", "4,4", "--mesh", "tp=2"]


@pytest.mark.parametrize(
    ("argv", "prog", "words"),
    [
        ([], "layout-algebra", "required: COMMAND"),
        (["explode"], "layout-algebra", "invalid choice: 'explode'"),
        (["show"], "layout-algebra show", "required: TABLE.json"),
        (["diff", "T"], "layout-algebra diff", "required: B.json"),
        (["check", "P"], "layout-algebra check", "required: --mesh"),
        (["demo", "--rank", "8"], "layout-algebra demo", "ranks are 0 to 7"),
        (["draw", "T", "w", "--shape", "4,x", "--mesh", "tp=2"], "layout-algebra draw", "4,x"),
        ([*DRAW, "--fsdp", "9"], "layout-algebra draw", "--fsdp"),
        (["draw", "T", "w", "--mesh", "tp=2"], "layout-algebra draw", "required: --shape"),
        ([*DRAW, "--shape"], "layout-algebra draw", "expected one argument"),
        ([*DRAW, "--owned", "1dp"], "layout-algebra draw", "--owned"),
        (["lint", "T", "--mesh", "tp=2"], "layout-algebra lint", "required: --shapes"),
        ([*LINT, "--fsdp", "a,b,c"], "layout-algebra lint", "REPLICATE,SHARD"),
        ([*LINT, "--shard-dim", "64"], "layout-algebra lint", "--shard-dim is at most 63"),
        ([*LINT, "--shard-dim", "-1"], "layout-algebra lint", "plain digits"),
        ([*LINT, "--expert-shard-dim", "99"], "layout-algebra lint", "at most 63"),
        ([*LINT, "--ex", "ep=2"], "layout-algebra lint", "ambiguous option: --ex"),
        ([*LINT, "--mesh", "tp=0"], "layout-algebra lint", "from 1 to 1,048,576, got 0"),
        (RESHARD[:-2], "layout-algebra reshard", "required: --to-mesh"),
        ([*RESHARD, "--top", "x" * 5000], "layout-algebra reshard", "--top"),
        ([*RESHARD, "--to-fsdp", "1x"], "layout-algebra reshard", "--to-fsdp"),
        ([*RESHARD, "--to-mesh", "tp"], "layout-algebra reshard", "--to-mesh"),
        ([*DRAW, "extra\x1b[2J\nline"], "layout-algebra", "unrecognized arguments: extra"),
        ([*LINT, "x" * 5000], "layout-algebra", "unrecognized arguments: xxx"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    tmp_path: Path,
    argv: list[str],
    prog: str,
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = paths(tmp_path)
    code, out, err = run([files.get(a, a) for a in argv], capsys)
    assert_one_line_usage_error(code, out, err, prog)
    assert words in err
    assert "\x1b" not in err and len(err) < 1000  # escaped, bounded


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for command in ["demo", "show", "diff", "check", "draw"]:
        assert command in out


# ---------------------------------------------------------------------------------------
# draw (the pictures themselves: tests/test_draw.py)


def test_draw_prints_the_picture_of_the_tables_layout(
    table_file: str, table: ParamLayoutTable, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["draw", table_file, "emb.weight", "--shape", "10,8", "--mesh", "dp_shard=2,tp=4"]
    code, out, err = run([*argv, "--fsdp", "dp_shard", "--width", "80"], capsys)
    assert (code, err) == (0, "")
    sizes = {"dp_shard": 2, "tp": 4}
    layout = table["emb.weight"]
    assert out == draw(layout, (10, 8), sizes, fqn="emb.weight", fsdp="dp_shard", width=80) + "\n"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--shape", "4,4", "--mesh", "dp_shard=2"], "uses axis 'tp', which --mesh"),
        (["--shape", "4,4", "--mesh", "tp=2", "--fsdp", "dp"], "--fsdp dp: no such axis"),
        (["--shape", "4", "--mesh", "tp=2,dp=2"], "shards dim 1, but shape (4,) has 1 dim;"),
    ],
)
def test_draw_refuses_what_it_cannot_draw(
    table_file: str, extra: list[str], needle: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["draw", table_file, "layers.0.wo.weight", *extra], capsys)
    assert_one_line_problem(code, err)
    assert out == ""
    if needle is not None:
        assert needle in err


def test_draw_of_an_unknown_fqn_suggests_close_ones(
    table_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["draw", table_file, "emb.weigth", "--shape", "4", "--mesh", "tp=2"]
    code, _, err = run(argv, capsys)
    assert_one_line_problem(code, err)
    assert "emb.weigth: no such parameter" in err and "emb.weight" in err


# ---------------------------------------------------------------------------------------
# --owned / --also-owned, and the drops check prints


def test_check_prints_the_drops_even_when_it_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a dense parameter sharded over ep, on a dense mesh without ep: dropped, not a typo
    plan = ShardingPlan(
        {
            "attn": ModulePlan({"wq.weight": {"tp": S0}, "wk.weight": {"tp": S0}}),
            "norm": ModulePlan({"weight": {"ep": S0}, "bias": {"ep": S0}}),
        },
        mesh_axes=["dp_shard", "ep", "tp"],
    )
    path = write(tmp_path / "plan.json", plan_to_json(plan))
    code, out, err = run(["check", path, "--mesh", "dp_shard=2,tp=2"], capsys)
    assert (code, err) == (0, "")
    table = build_table(plan, ["dp_shard", "tp"])
    assert {(d.fqn, d.axis.name, d.mesh) for d in table.dropped} == {
        ("norm.weight", "ep", "dense"),
        ("norm.bias", "ep", "dense"),
    }
    assert "  2 placements dropped on axes their mesh lacks" in out
    assert re.search(r"^    ep on the dense mesh: 2 \(norm\.\w+: S\(0\), \.\.\.\)$", out, re.M)


def test_check_without_drops_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(owned_plan()))
    code, out, _ = run(["check", path, "--mesh", "stage=2,dp_shard=2,tp=2"], capsys)
    assert code == 0
    assert build_table(owned_plan(), ["stage", "dp_shard", "tp"]).dropped == ()
    assert "  no placement dropped\n" in out


def test_check_of_a_mesh_typo_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    argv = ["check", path, "--mesh", "dp_shard=4,tpp=2", "--expert-mesh", "dp_shard=2,ep=4"]
    code, out, err = run(argv, capsys)
    assert (code, out) == (1, "")
    assert "'tpp'" in err and "'tp'" in err


def owned_plan() -> ShardingPlan:
    return ShardingPlan(
        {"attn": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1, "stage": R}})},
        mesh_axes=["stage", "dp_shard", "tp"],
    )


@pytest.mark.parametrize(
    ("flags", "owned"),
    [
        ([], FSDP_OWNED_AXES),
        (["--also-owned", "stage"], FSDP_OWNED_AXES | {"stage"}),
        (["--owned", "stage,dp_shard"], frozenset({"stage", "dp_shard"})),
        (["--owned", "", "--also-owned", "stage"], frozenset({"stage"})),
    ],
)
def test_check_strips_the_owned_axes_it_is_given(
    tmp_path: Path, flags: list[str], owned: frozenset[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(owned_plan()))
    mesh = ["stage", "dp_shard", "tp"]
    code, out, err = run(["check", path, "--mesh", "stage=2,dp_shard=2,tp=2", *flags], capsys)
    assert (code, err) == (0, "")
    table = build_table(owned_plan(), mesh, owned=owned)
    for fqn, layout in table.items():
        assert re.search(rf"^{re.escape(fqn)} +{re.escape(str(layout))}$", out, re.M)
    source = ", ".join(a for a in mesh if a not in owned)
    assert f"source axes {source or '(none)'};" in out


def test_check_with_an_owned_axis_sharded_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(owned_plan()))
    code, _, err = run(["check", path, "--mesh", "tp=2", "--also-owned", "tp"], capsys)
    assert code == 1
    assert "attn.wq.weight" in err and "'tp'" in err


@pytest.mark.parametrize("flag", ["--owned", "--also-owned"])
@pytest.mark.parametrize("value", ["1dp", "dp,,pp", "dp pp", "d\u00e9p"])
def test_owned_flags_take_axis_names(
    tmp_path: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "plan.json", plan_to_json(owned_plan()))
    code, out, err = run(["check", path, "--mesh", "tp=2", flag, value], capsys)
    assert (code, out) == (2, "")
    assert flag in err and "Traceback" not in err


def test_draw_says_when_the_mesh_has_fsdp_axes_it_did_not_compose(
    table_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["draw", table_file, "emb.weight", "--shape", "8,4", "--mesh", "dp_shard=2,tp=2"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert out.endswith(
        "\nnot composed with FSDP: dp_shard is an FSDP axis of --mesh; give --fsdp dp_shard "
        "to see the shards fully_shard makes\n"
    )
    code, out, _ = run([*argv, "--owned", "pp"], capsys)
    assert code == 0 and "not composed" not in out
    code, out, _ = run([*argv, "--fsdp", "dp_shard"], capsys)
    assert code == 0 and "not composed" not in out


# ---------------------------------------------------------------------------------------
# plans with patterns: check --fqns


def pattern_plan() -> ShardingPlan:
    return ShardingPlan(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": S0}, "wo.weight": {"tp": S1}}),
            "layers.*.moe": ModulePlan({"experts.w1": {"ep": S0, "tp": S1}}, expert_parallel=True),
            "layers.1.attention": ModulePlan({"wq.weight": {"tp": S1}}),  # exact beats pattern
        },
        mesh_axes=["dp_shard", "ep", "tp"],
    )


PATTERN_FQNS: Final = [
    *(
        f"layers.{i}.{name}"
        for i in range(3)
        for name in ["attention.wq.weight", "attention.wo.weight", "moe.experts.w1", "norm.weight"]
    ),
    "output.weight",
]


@pytest.mark.parametrize("kind", ["lines", "shapes"])
def test_check_of_a_plan_with_patterns_takes_the_models_fqns(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = write(tmp_path / "plan.json", plan_to_json(pattern_plan()))
    if kind == "lines":
        fqns_path = write(tmp_path / "fqns.txt", "\n".join(PATTERN_FQNS) + "\n\n")
    else:
        shapes = {fqn: ParamShape((8, 8), "bfloat16") for fqn in PATTERN_FQNS}
        fqns_path = write(tmp_path / "shapes.json", shapes_to_json(shapes))
    argv = ["check", plan_path, "--mesh", "dp_shard=2,tp=2", "--expert-mesh", "ep=2,tp=2"]
    code, out, err = run([*argv, "--fqns", fqns_path], capsys)
    assert (code, err) == (0, "")
    table = build_table(
        pattern_plan(), ["dp_shard", "tp"], expert_axes=["ep", "tp"], fqns=PATTERN_FQNS
    )
    assert table["layers.1.attention.wq.weight"] == SourceLayout("dense", ["tp"], [S1])
    assert table["layers.2.moe.experts.w1"].mesh == "expert"
    assert out.endswith("\n".join(str(table).splitlines()) + "\n")
    assert (
        f"  9 of 13 FQNs of {fqns_path} matched by the plan; 4 no key matches "
        "(first layers.0.norm.weight) are not in the table" in out
    )


def test_check_of_a_plan_with_patterns_needs_the_fqns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = write(tmp_path / "plan.json", plan_to_json(pattern_plan()))
    argv = ["check", plan_path, "--mesh", "dp_shard=2,tp=2", "--expert-mesh", "ep=2,tp=2"]
    code, out, err = run(argv, capsys)
    assert (code, out) == (1, "")
    assert "layers.*.attention" in err and "fqns" in err


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"a.w\nb.w\na.w\n", "line 3: 'a.w' is also on line 1"),
        (b"a.w\n\xff\n", "is not UTF-8"),
        (b'{"version": 1, "params": {"a.w": {"shape": [1]}}}', 'params["a.w"].dtype'),
    ],
)
def test_check_of_a_bad_fqns_file_is_one_line(
    tmp_path: Path, content: bytes, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = write(tmp_path / "plan.json", plan_to_json(pattern_plan()))
    fqns = tmp_path / "fqns.txt"
    fqns.write_bytes(content)
    argv = ["check", plan_path, "--mesh", "tp=2", "--fqns", str(fqns)]
    code, _, err = run(argv, capsys)
    assert_one_line_problem(code, err)
    assert words in err


# ---------------------------------------------------------------------------------------
# hostile input: one line on stderr and the documented exit code, never a traceback


HOSTILE_FQNS: Final = ["a\x1b[2J\nb", "lone\udc80surrogate", "zero\u200bwidth", "caf\u00e9.w"]


@pytest.fixture
def hostile_file(tmp_path: Path) -> str:
    layout = SourceLayout("dense", ["tp"], [S0])
    table = ParamLayoutTable(dict.fromkeys(HOSTILE_FQNS, layout), tied=[set(HOSTILE_FQNS[:2])])
    return write(tmp_path / "hostile.json", to_json(table))


def test_show_escapes_what_a_terminal_would_obey(
    hostile_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["show", hostile_file], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == len(HOSTILE_FQNS) + 2  # entries, the tied group, the summary
    assert lines[0].startswith("a\\x1b[2J\\nb  ")
    assert lines[1].startswith("lone\\udc80surrogate  ")
    assert lines[2].startswith("zero\\u200bwidth  ")
    assert lines[3].startswith("caf\u00e9.w  ")  # printable: shown as it is
    assert lines[4] == "tied: a\\x1b[2J\\nb, lone\\udc80surrogate"
    assert {ln.index("dense[") for ln in lines[:4]} == {len("lone\\udc80surrogate  ")}
    assert "\x1b" not in out


def test_diff_and_check_escape_fqns(
    tmp_path: Path, hostile_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = write(tmp_path / "empty.json", to_json(ParamLayoutTable({})))
    code, out, _ = run(["diff", empty, hostile_file], capsys)
    assert code == 1
    assert "a\\x1b[2J\\nb: (absent) -> dense[tp=S(0)]\n" in out
    assert "\x1b" not in out and len(out.splitlines()) == len(HOSTILE_FQNS) + 1
    plan = ShardingPlan({"": ModulePlan({"a\x1b\nb": {"tpp": S0}})}, mesh_axes=["tp"])
    path = write(tmp_path / "plan.json", plan_to_json(plan))
    code, _, err = run(["check", path, "--mesh", "tp=2"], capsys)
    assert code == 1
    assert len(err.splitlines()) == 2 and "a\\x1b\\nb" in err and "\x1b" not in err


def test_show_and_diff_print_what_the_values_str_gives(
    tmp_path: Path, hostile_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = from_json(Path(hostile_file).read_text())
    code, out, _ = run(["show", hostile_file], capsys)
    assert (code, out) == (0, f"{table}\n(4 parameters, 1 tied group)\n")
    empty = ParamLayoutTable({})
    code, out, _ = run(
        ["diff", write(tmp_path / "empty.json", to_json(empty)), hostile_file], capsys
    )
    assert (code, out) == (1, f"{diff(empty, table)}\n")
    assert "\x1b" not in str(table) + str(diff(empty, table))  # the values escape names


def test_draw_of_a_missing_hostile_fqn_is_one_escaped_line(
    hostile_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["draw", hostile_file, "a\x1b[2J\nc", "--shape", "4", "--mesh", "tp=2"]
    code, _, err = run(argv, capsys)
    assert_one_line_problem(code, err)
    assert "a\\x1b[2J\\nc: no such parameter" in err and "did you mean" in err


def test_show_of_a_closed_stdin_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when fd 0 is closed (<&-)
    code, out, err = run(["show", "-"], capsys)
    assert_one_line_problem(code, err)
    assert out == "" and "stdin" in err


class _Endless(io.RawIOBase):
    """A stdin that never ends (``show - < /dev/zero``)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer)
        view[:] = b"\0" * len(view)
        return len(view)


def test_show_of_an_endless_stdin_stops_at_the_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(INPUT_BOUND, 1 << 20)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(_Endless())))
    code, out, err = run(["show", "-"], capsys)
    assert_one_line_problem(code, err)
    assert out == "" and f"larger than {1 << 20} bytes" in err


def test_show_of_a_device_is_refused_before_it_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["show", "/dev/zero"], capsys)
    assert_one_line_problem(code, err)
    assert (
        out == ""
        and "/dev/zero: cannot read the file: a character device, not a regular file" in err
    )


def test_show_of_a_large_file_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(1 << 40)  # a sparse terabyte
    monkeypatch.setattr(INPUT_BOUND, 1 << 20)
    code, _, err = run(["show", str(big)], capsys)
    assert_one_line_problem(code, err)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--shape", "9223372036854775808,1", "at most 9223372036854775807"),
        ("--shape", "9" * 5000, "at most"),
        ("--shape", ",".join(["1"] * 65), "has 65 dims; a tensor has at most 64"),
        ("--shape", "\u0663,2", "not a shape"),
        ("--shape", "-1,2", "not a shape"),
        ("--mesh", "tp=+2", "is not name=size"),
        ("--mesh", "tp=\u0662", "is not name=size"),
        ("--mesh", "tp=1048577", "from 1 to 1,048,576, got 1048577"),
        ("--mesh", "t\u00e9=2", "is not an identifier"),
    ],
)
def test_odd_numbers_are_usage_errors(
    table_file: str, option: str, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shape, mesh = {"--shape": (value, "tp=2"), "--mesh": ("4", value)}[option]
    argv = ["draw", table_file, "emb.weight", f"--shape={shape}", f"--mesh={mesh}"]
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert "Traceback" not in err and option in err and words in err
    assert len(err) < 2000


def test_draw_takes_a_shape_of_64_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one bound for dims everywhere: 64 taken, 65 refused (above)
    layout = SourceLayout("dense", ["tp"], [Shard(63)])
    path = write(tmp_path / "t.json", to_json(ParamLayoutTable({"w": layout})))
    shape = ",".join(["1"] * 63 + ["4"])
    argv = ["draw", path, "w", "--shape", shape, "--mesh", "tp=2", "--width", "0"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out == draw(layout, (1,) * 63 + (4,), {"tp": 2}, fqn="w") + "\n"


def test_draw_of_what_cannot_be_printed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strided = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2**31 - 1), S0])
    path = write(tmp_path / "t.json", to_json(ParamLayoutTable({"w": strided})))
    code, _, err = run(["draw", path, "w", "--shape", "10,4", "--mesh", "dp=2,tp=2"], capsys)
    assert_one_line_problem(code, err)
    assert "2147483647 pieces" in err
    code, _, err = run(["draw", path, "w", "--shape", "10,4", "--mesh", "dp=65,tp=64"], capsys)
    assert_one_line_problem(code, err)
    assert "4160 ranks" in err


SCRIPT: Final = [sys.executable, "-m", "layout_algebra"]
REMEDY: Final = "give the command somewhere to write"


def run_cli(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The installed command line in its own process, stdout as ``sh`` redirects it."""
    command = [*SCRIPT, *argv]
    if stdout is not None:
        command = ["sh", "-c", f'exec "$@" {stdout}', "sh", *command]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONIO", "LC_"))}
    environment.update(env or {})
    return subprocess.run(command, capture_output=True, cwd=ROOT, env=environment, check=False)


@pytest.mark.parametrize(
    "env",
    [{}, {"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C"}],
    ids=["utf8", "ascii", "c-locale"],
)
def test_show_of_hostile_names_on_any_terminal(hostile_file: str, env: dict[str, str]) -> None:
    done = run_cli(["show", hostile_file], env=env)
    assert (done.returncode, done.stderr) == (0, b"")
    # Python coerces the C locale to UTF-8 (PEP 538); PYTHONIOENCODING=ascii stays ASCII
    text = done.stdout.decode("ascii" if "PYTHONIOENCODING" in env else "utf-8")
    assert "a\\x1b[2J\\nb" in text and "lone\\udc80surrogate" in text
    assert ("caf\\xe9.w" if "PYTHONIOENCODING" in env else "caf\u00e9.w") in text
    entries = text.splitlines()[: len(HOSTILE_FQNS)]
    assert all(line.endswith("  dense[tp=S(0)]") for line in entries), entries
    # every layout in one column, FQNs escaped for the terminal before the column is measured
    assert len({line.index("  dense[") for line in entries}) == 1, entries


def test_a_problem_on_an_ascii_terminal_is_one_line(hostile_file: str) -> None:
    argv = ["draw", hostile_file, "caf\u00e9.x\x07", "--shape", "4", "--mesh", "tp=2"]
    done = run_cli(argv, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 1 and done.stdout == b""
    err = done.stderr.decode("ascii")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "caf\\xe9.x\\x07: no such parameter" in err


@pytest.mark.parametrize(
    "argv", [["show", "TABLE"], ["--help"], ["show", "--help"]], ids=["show", "help", "show-help"]
)
@pytest.mark.parametrize(
    ("redirect", "reason"),
    [(">&-", "stdout is closed"), (">/dev/full", "No space left on device")],
    ids=["closed", "full"],
)
def test_output_that_cannot_be_written_is_one_line(
    table_file: str, argv: list[str], redirect: str, reason: str
) -> None:
    done = run_cli([table_file if a == "TABLE" else a for a in argv], stdout=redirect)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert err == f"layout-algebra: cannot write the output: {reason}; {REMEDY}\n"


def test_help_to_a_reader_that_stopped_is_no_problem() -> None:
    script = """
import io, sys
from layout_algebra.cli import main

class Gone(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

sys.stdout = Gone()
sys.exit(main(["--help"]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, cwd=ROOT, check=False
    )
    assert (done.returncode, done.stderr) == (0, b"")


# ---------------------------------------------------------------------------------------
# no torch outside demo


def test_show_diff_check_and_draw_never_import_torch(table_file: str, tmp_path: Path) -> None:
    plan = write(tmp_path / "plan.json", plan_to_json(moe_plan()))
    script = f"""
import sys
from layout_algebra.cli import main
codes = [
    main(["show", {table_file!r}]),
    main(["diff", {table_file!r}, {table_file!r}]),
    main(["check", {plan!r}, "--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]),
    main(["draw", {table_file!r}, "emb.weight", "--shape", "8,4", "--mesh", "tp=4"]),
]
assert codes == [0, 0, 0, 0], codes
assert "torch" not in sys.modules, "torch was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------
# demo, in its own process (it starts its own fake process group)


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "layout_algebra", "demo", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def demo_model_and_table() -> tuple[list[str], ParamLayoutTable]:
    model = TinyMoE()
    fqns = [fqn for fqn, _ in model.named_parameters(remove_duplicate=False)]
    return fqns, demo_table(model, demo_plan())


def test_demo_verify_on_another_rank_agrees_with_torch() -> None:
    done = run_demo("--verify", "--rank", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    fqns, table = demo_model_and_table()
    assert "MISMATCH" not in done.stdout
    assert f"{len(fqns)}/{len(fqns)} OK" in done.stdout
    assert "local shapes on rank 5: dp_shard=1, ep=0, tp=1 (dense: dp=2, tp=1)" in done.stdout
    rows = [ln for ln in done.stdout.splitlines() if ln.split(" ")[0] in fqns]
    assert len(rows) == len(fqns) and all(ln.endswith(" OK") for ln in rows)
    # every parameter's row shows its source layout; the tied pair and the binding are told
    assert "output.weight" in fqns and "layers.1.moe.experts.w2" in fqns
    for fqn in fqns:
        row = next(ln for ln in rows if ln.startswith(f"{fqn} "))
        assert str(table[fqn]) in row
    assert "tied (one storage): output.weight, tok_embeddings.weight" in done.stdout
    assert "every FQN matched" in done.stdout


def test_demo_json_is_the_demo_table() -> None:
    done = run_demo("--json")
    assert done.returncode == 0, done.stderr
    _, table = demo_model_and_table()
    assert from_json(done.stdout) == table
    assert table.tied == (frozenset({"tok_embeddings.weight", "output.weight"}),)


@pytest.mark.parametrize(
    "argv", [["show", None], ["show", "t\0.json"], ["check", "p.json", "--mesh", None], 0, "show"]
)
def test_arguments_a_shell_cannot_pass_are_a_usage_error(
    argv: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2  # type: ignore[arg-type]  # wrong on purpose
    err = capsys.readouterr().err
    assert err.startswith("layout-algebra: the arguments must be a sequence of strings")
    assert err.count("\n") == 1
