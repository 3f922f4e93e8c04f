"""Hostile input, round three: messages quoting self-sharing values, byte sizes given to
``--budget``, empty or malformed training flags, a directory holding both a
transformers checkpoint and a DCP one, and problem lists printed as lines.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pytest
import safetensors.torch
import torch

from layout_algebra import (
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    Shard,
    ShardingPlan,
    SourceLayout,
    Training,
    lint,
)
from layout_algebra._text import quote
from layout_algebra.cli import main
from layout_algebra.cli._commands import COMMANDS
from layout_algebra.fsdp import plan_error
from layout_algebra.serialization import from_json, plan_to_json, shapes_to_json, to_json
from layout_algebra.training import parse_bytes

# ---------------------------------------------------------------------------------------
# a value that holds one list many times over is quoted at once

_SHARED_CALLS: Final = textwrap.dedent(
    """
    import json
    from layout_algebra import (
        AxisName, Mesh, ParamLayoutTable, ParamShape, Part, Shard, ShardingPlan,
        SourceLayout, Training, build_table, lint, parse_placement, resolve,
    )
    from layout_algebra._text import quote
    from layout_algebra.errors import LayoutError
    from layout_algebra.serialization import converter

    deep = []
    for _ in range(60):  # its repr is 2**60 lists long
        deep = [deep, deep]
    wide = []
    for _ in range(8):  # sixteen of one list, eight levels down
        wide = [wide] * 16
    calls = {
        "Mesh": lambda: Mesh(deep),
        "Mesh sizes": lambda: Mesh({"tp": deep}),
        "resolve": lambda: resolve(deep, ["tp"]),
        "ParamShape": lambda: ParamShape(deep, "bfloat16"),
        "ParamShape dtype": lambda: ParamShape((2,), deep),
        "build_table": lambda: build_table(deep, deep),
        "lint": lambda: lint(deep, deep, mesh_sizes=deep),
        "parse_placement": lambda: parse_placement(deep),
        "Shard": lambda: Shard(deep),
        "SourceLayout": lambda: SourceLayout("dense", deep, deep),
        "Training": lambda: Training(units=deep),
        "AxisName": lambda: AxisName(deep),
        "Part": lambda: Part(deep, 1),
        "table from Python": lambda: converter.structure(
            {"version": 1, "entries": wide}, ParamLayoutTable
        ),
        "plan from Python": lambda: converter.structure(
            {"version": 1, "mesh_axes": [wide], "modules": {}}, ShardingPlan
        ),
    }
    shown = {}
    for name, call in calls.items():
        try:
            call()
        except LayoutError as e:
            shown[name] = len(str(e))
        else:
            shown[name] = None
    shown["quote"] = len(quote({"a": deep, "b": wide}))
    print(json.dumps(shown))
    """
)


def test_a_self_sharing_value_is_quoted_at_once() -> None:
    # Its full repr would never finish: the time limit fails the test instead of hanging.
    done = subprocess.run(
        [sys.executable, "-c", _SHARED_CALLS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    refused = {name: size for name, size in shown.items() if name != "quote"}
    assert all(size is not None and size < 1000 for size in refused.values()), refused
    assert shown["quote"] < 300


@pytest.mark.parametrize(
    "value",
    [
        [],
        (),
        {},
        set(),
        frozenset(),
        (1,),
        [1, "a", None, 2.5, b"x", True],
        {"tp": [1, 2], "ep": (3,), "x": {4}},
        frozenset({"a"}),
        [[[]]],
    ],
)
def test_quote_spells_small_containers_as_repr_does(value: object) -> None:
    assert quote(value) == repr(value)


def test_quote_shows_a_container_within_itself_as_repr_does() -> None:
    looped: list[object] = [1]
    looped.append(looped)
    assert quote(looped) == repr(looped) == "[1, [...]]"


def test_quote_cuts_a_long_container_and_counts_its_items() -> None:
    shown = quote(list(range(10**6)))
    assert shown.startswith("[0, 1, 2, ")
    assert shown.endswith("... (a list of 1000000 items)")
    assert len(shown) < 300
    nested: list[object] = []
    for _ in range(100_000):  # deeper than repr can recurse
        nested = [nested]
    assert quote(nested).endswith("... (a list of 1 item)")


# ---------------------------------------------------------------------------------------
# the command line: files every test points it at


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    return {
        "table": _write(tmp_path / "t.json", to_json(table)),
        "shapes": _write(tmp_path / "s.json", shapes_to_json({"w": ParamShape((4, 4), "float32")})),
    }


def _run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _lint(files: dict[str, str], *flags: str) -> list[str]:
    return ["lint", files["table"], "--shapes", files["shapes"], "--mesh", "tp=2", *flags]


# ---------------------------------------------------------------------------------------
# --budget: bytes worked out exactly, never rounded up


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("1023.99999999999999999999999999KiB", 1024 * 1024 - 1),
        ("1.99999999999999999999999999999", 1),
        ("0.0000001EiB", 115_292_150_460),
        ("80GiB", 80 * 2**30),
    ],
)
def test_a_byte_count_is_exact_and_rounded_down(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0.99999999999999999999999999999", "less than one byte"),
        ("9" * 1_000_000, "more than 64 digits"),
        ("1" + "0" * 1_000_000 + "EiB", "more than 64 digits"),
    ],
)
def test_a_budget_below_a_byte_or_absurdly_long_is_a_usage_error(
    text: str, words: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(LayoutError, match=words):
        parse_bytes(text, "--budget")
    code, out, err = _run(_lint(files, "--budget", text), capsys)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith("layout-algebra lint: argument --budget: ")
    assert words in err
    assert len(err) < 1000


def test_a_budget_just_below_a_rank_s_need_fails_the_lint(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # w is 4x4 float32 over tp=2; the need is what the library's report gives a rank
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    report = lint(
        table, {"w": ParamShape((4, 4), "float32")}, mesh_sizes=Mesh({"tp": 2}), training=Training()
    )
    need = max(map(sum, zip(*report.memory.by_kind.values(), strict=True)))
    code, out, _ = _run(_lint(files, "--budget", str(need)), capsys)
    assert code == 0
    code, out, _ = _run(
        _lint(files, "--budget", f"{need - 1}.99999999999999999999999999999"), capsys
    )
    assert code == 1
    assert f"above the budget of {need - 1} B" in out


# ---------------------------------------------------------------------------------------
# the training flags: an empty or malformed value is a usage error naming its flag


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--units", ""),
        ("--units", ","),
        ("--units", "layers..w"),
        ("--units", "layers.*,"),
        ("--units", "a,,b"),
        ("--units", "a,a"),
        ("--units", "."),
        ("--optimizer", ""),
        ("--param-dtype", ""),
        ("--reduce-dtype", ""),
        ("--budget", ""),
        ("--budget", "0"),
        ("--budget", " "),
    ],
)
def test_an_empty_or_malformed_training_flag_is_a_usage_error(
    flag: str, value: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(_lint(files, flag, value), capsys)
    assert (code, out) == (2, ""), err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"layout-algebra lint: argument {flag}: "), err
    assert "Training(" not in err
    if flag == "--units":
        assert "e.g. 'layers.*'" in err


def test_units_alone_count_the_training_state(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    table = ParamLayoutTable({"layers.0.w": SourceLayout("dense", ["tp"], [Shard(0)])})
    Path(files["table"]).write_text(to_json(table))
    Path(files["shapes"]).write_text(shapes_to_json({"layers.0.w": ParamShape((4, 4), "float32")}))
    code, out, err = _run(_lint(files, "--units", "layers.0"), capsys)
    assert code == 0, err
    assert "training memory per rank" in out


# ---------------------------------------------------------------------------------------
# a transformers directory with a DCP .metadata beside it: the headers win


def _save_pretrained_dir(root: Path, *, sharded: bool) -> Path:
    """A directory as ``save_pretrained`` writes it, with a ``.metadata`` that is no DCP
    checkpoint's (reading it would fail)."""
    root.mkdir()
    tensors = {"w": torch.zeros(4, 4), "b": torch.zeros(4)}
    if sharded:
        safetensors.torch.save_file(tensors, str(root / "model-00001-of-00001.safetensors"))
        index = {"weight_map": dict.fromkeys(tensors, "model-00001-of-00001.safetensors")}
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, **index}))
    else:
        safetensors.torch.save_file(tensors, str(root / "model.safetensors"))
    (root / ".metadata").write_bytes(b"not a pickle of DCP's metadata")
    return root


@pytest.mark.parametrize("sharded", [False, True])
def test_shapes_of_a_directory_with_both_checkpoints_are_its_headers(
    sharded: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _save_pretrained_dir(tmp_path / "ckpt", sharded=sharded)
    table = ParamLayoutTable(
        {
            "w": SourceLayout("dense", ["tp"], [Shard(0)]),
            "b": SourceLayout("dense", ["tp"], [Shard(0)]),
        }
    )
    table_file = _write(tmp_path / "t.json", to_json(table))
    code, out, err = _run(["lint", table_file, "--shapes", str(root), "--mesh", "tp=2"], capsys)
    assert code == 0, err
    assert "2 parameters" in out
    name = "model.safetensors.index.json" if sharded else "model.safetensors"
    assert err.count("\n") == 1, err
    assert "note:" in err and name in err and ".metadata" in err, err


def test_fqns_of_a_directory_with_both_checkpoints_are_its_headers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _save_pretrained_dir(tmp_path / "ckpt", sharded=False)
    plan = ShardingPlan({"": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    plan_file = _write(tmp_path / "p.json", plan_to_json(plan))
    code, out, err = _run(["table", plan_file, "--mesh", "tp=2", "--fqns", str(root)], capsys)
    assert code == 0, err
    assert set(from_json(out)) == {"w", "b"}
    assert "note:" in err and "model.safetensors" in err, err


# ---------------------------------------------------------------------------------------
# a list of problems prints as lines, an FQN's own line breaks escaped


_HOSTILE_FQN: Final = "a\x1b[2J\nb"


@pytest.fixture
def owned_files(tmp_path: Path) -> dict[str, str]:
    """A table placing shards on FSDP's own axis (composing it fails for both entries),
    one entry's FQN holding a line break and an escape sequence."""
    table = ParamLayoutTable(
        {
            _HOSTILE_FQN: SourceLayout("dense", ["dp_shard", "tp"], [Shard(0), Shard(0)]),
            "c": SourceLayout("dense", ["dp_shard"], [Shard(1)]),
        }
    )
    shapes = {fqn: ParamShape((4, 4), "float32") for fqn in table}
    return {
        "table": _write(tmp_path / "owned.json", to_json(table)),
        "shapes": _write(tmp_path / "owned-shapes.json", shapes_to_json(shapes)),
    }


def _assert_problem_lines(code: int, err: str) -> None:
    assert code == 1
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert lines[0].startswith("layout-algebra: ") and lines[0].endswith("2 problems:"), err
    assert lines[1].startswith("  - a\\x1b[2J\\nb: "), err
    assert lines[2].startswith("  - c: "), err
    assert "\x1b" not in err


def _dcp_directory(root: Path) -> str:
    """A directory holding the metadata ``dcp.save`` writes for a 4x4 tensor ``w`` saved
    as two blocks of rows."""
    from torch.distributed.checkpoint.metadata import (  # noqa: PLC0415
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunks = [
        ChunkStorageMetadata(offsets=torch.Size([row, 0]), sizes=torch.Size([2, 4]))
        for row in (0, 2)
    ]
    saved = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32), size=torch.Size([4, 4]), chunks=chunks
    )
    root.mkdir()
    (root / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={"w": saved})))
    return str(root)


def test_diff_prints_a_plan_error_as_lines(
    owned_files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _dcp_directory(tmp_path / "ckpt")
    argv = ["diff", checkpoint, owned_files["table"], "--mesh", "dp_shard=2,tp=2"]
    code, _, err = _run([*argv, "--fsdp", "dp_shard"], capsys)
    _assert_problem_lines(code, err)
    assert "composing the table with FSDP" in err


def test_reshard_prints_a_plan_error_as_lines(
    owned_files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = owned_files["table"], owned_files["shapes"]
    meshes = ["--mesh", "dp_shard=2,tp=2", "--to-mesh", "dp_shard=2,tp=2"]
    fsdp = ["--fsdp", "dp_shard", "--to-fsdp", "dp_shard"]
    code, _, err = _run(["reshard", table, table, "--shapes", shapes, *meshes, *fsdp], capsys)
    _assert_problem_lines(code, err)


def test_every_plan_error_reaching_the_command_line_prints_as_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # whichever command lets a PlanError through, main prints it the one way
    problems = [LayoutError(f"{_HOSTILE_FQN}: first", fqn=_HOSTILE_FQN), LayoutError("c: second")]
    error = plan_error("the check", problems)

    def fails(*_: object) -> int:
        raise error

    for command in ("check", "lint", "reshard", "diff"):
        monkeypatch.setitem(COMMANDS, command, fails)
    for argv in (
        ["check", "p.json", "--mesh", "tp=2"],
        ["lint", "t.json", "--shapes", "s.json", "--mesh", "tp=2"],
        ["reshard", "a.json", "b.json", "--to-mesh", "tp=2"],
        ["diff", "a.json", "b.json"],
    ):
        code, _, err = _run(argv, capsys)
        _assert_problem_lines(code, err)
        assert err.splitlines()[0] == "layout-algebra: the check has 2 problems:"
