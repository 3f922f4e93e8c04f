"""The ``layout-algebra`` command line (also ``python -m layout_algebra``).

Subcommands:

- ``demo``: a built-in MoE transformer and its plan on a simulated 8-rank mesh;
- ``show TABLE.json``: a table, aligned, with its tied groups;
- ``diff A.json B.json``: what changed from one table to another (exit 1 when they differ);
- ``check PLAN.json --mesh dp_shard=2,tp=4 [--expert-mesh dp_shard=2,ep=4]``: build the
  table of a plan and report every problem of it at once;
- ``draw TABLE.json FQN --shape 16,8 --mesh dp_shard=2,tp=4 [--fsdp dp_shard]``: which
  rank holds which block of one parameter.

Exit status: 0 on success, 1 on a layout problem (a bad plan, table or file; the message
goes to stderr), 2 on a usage error. Only ``demo`` imports torch, and only when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, TextIO

from layout_algebra.algebra import build_table, diff
from layout_algebra.axes import FSDP_OWNED_AXES, as_axis
from layout_algebra.draw import draw, mesh_str
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.plan import ShardingPlan
from layout_algebra.serialization import from_json, plan_from_json

__all__ = ["PROG", "main"]

PROG: Final = "layout-algebra"
"""The program's name in messages (the console script's name)."""

_MESH_ITEM: Final = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([+-]?[0-9]+)\s*")
_DEMO_WORLD_SIZE: Final = 8


class _Problem(Exception):
    """A layout problem found by the command line itself: exit 1 with this message."""


# ---------------------------------------------------------------------------------------
# argument types


def mesh_spec(text: str) -> dict[str, int]:
    """The axis sizes ``text`` spells, in order: ``"dp_shard=2,tp=4"`` → ``{"dp_shard": 2, ...}``.

    Raises:
        argparse.ArgumentTypeError: not ``name=size`` items separated by commas, a size
            that is not a positive int, or an axis named twice.
    """
    sizes: dict[str, int] = {}
    for item in text.split(","):
        m = _MESH_ITEM.fullmatch(item)
        if m is None:
            msg = (
                f"{text!r}: {item.strip()!r} is not name=size; write the mesh as "
                "axis=size pairs separated by commas, e.g. dp_shard=2,tp=4"
            )
            raise argparse.ArgumentTypeError(msg)
        name, size = m.group(1), int(m.group(2))
        if size < 1:
            msg = f"{text!r}: axis {name!r} has size {size}; a mesh axis has a size >= 1"
            raise argparse.ArgumentTypeError(msg)
        if name in sizes:
            msg = f"{text!r}: axis {name!r} is named twice; give each axis once"
            raise argparse.ArgumentTypeError(msg)
        sizes[name] = size
    return sizes


def shape_spec(text: str) -> tuple[int, ...]:
    """The tensor shape ``text`` spells: ``"16,8"`` → ``(16, 8)``.

    Raises:
        argparse.ArgumentTypeError: not sizes >= 0 separated by commas.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        msg = f"{text!r} is not a shape; write sizes >= 0 separated by commas, e.g. 16,8"
        raise argparse.ArgumentTypeError(msg)
    return tuple(int(p) for p in parts)


def _axis_arg(text: str) -> str:
    try:
        return as_axis(text).name
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _rank_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= _DEMO_WORLD_SIZE:
        msg = f"{text!r}: the demo's ranks are 0 to {_DEMO_WORLD_SIZE - 1}"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Source layouts for DTensor / FSDP2 planners: show, compare, check and draw "
            "layout tables and plans. Exit 0 on success, 1 on a layout problem, 2 on a "
            "usage error."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="a built-in MoE transformer and its plan on a simulated 8-rank mesh",
        description=(
            "Build a small MoE transformer, its sharding plan and layout table, bind the "
            "table onto the model on a simulated 8-rank mesh (dp_shard=2, ep=2, tp=2; "
            "torch's fake process group) and print, per parameter, its source layout, "
            "the layout FSDP2 composes and the local shape on one rank."
        ),
    )
    demo.add_argument(
        "--rank", type=_rank_arg, default=0, help="the rank whose local shapes to show (0-7)"
    )
    demo.add_argument(
        "--verify",
        action="store_true",
        help="apply distribute and fully_shard and compare every prediction with torch",
    )
    demo.add_argument("--json", action="store_true", help="print the table as JSON instead")

    show = sub.add_parser("show", help="print a table, aligned, with its tied groups")
    show.add_argument("table", metavar="TABLE.json", help="a table file ('-' for stdin)")

    dif = sub.add_parser(
        "diff", help="what changed from table A to table B (exit 1 when they differ)"
    )
    dif.add_argument("a", metavar="A.json", help="the old table")
    dif.add_argument("b", metavar="B.json", help="the new table")

    check = sub.add_parser(
        "check",
        help="build the table of a plan on a mesh; report every problem",
        description=(
            "Build the layout table of a plan: dense parameters on --mesh, expert "
            "parameters on --expert-mesh (axis names in mesh order, FSDP-owned axes "
            "included). Prints a summary and the table, or every problem with its FQN."
        ),
    )
    check.add_argument("plan", metavar="PLAN.json", help="a plan file ('-' for stdin)")
    check.add_argument(
        "--mesh",
        type=mesh_spec,
        required=True,
        metavar="AXIS=N,...",
        help="the dense mesh, e.g. dp_shard=2,tp=4",
    )
    check.add_argument(
        "--expert-mesh",
        type=mesh_spec,
        default=None,
        metavar="AXIS=N,...",
        help="the expert mesh, e.g. dp_shard=2,ep=4",
    )

    draw = sub.add_parser(
        "draw",
        help="which rank holds which block of one 1-D or 2-D parameter",
        description=(
            "Draw the blocks of one parameter and the ranks holding each, for every "
            "coordinate of --mesh (rank = row-major index over the --mesh axes, in order). "
            "With --fsdp AXIS, the layout is first composed with FSDP2 sharding over AXIS."
        ),
    )
    draw.add_argument("table", metavar="TABLE.json", help="a table file ('-' for stdin)")
    draw.add_argument("fqn", metavar="FQN", help="the parameter to draw")
    draw.add_argument(
        "--shape", type=shape_spec, required=True, metavar="N,M", help="its global shape"
    )
    draw.add_argument(
        "--mesh",
        type=mesh_spec,
        required=True,
        metavar="AXIS=N,...",
        help="the world mesh, every axis of the layout included, e.g. dp_shard=2,tp=4",
    )
    draw.add_argument(
        "--fsdp",
        type=_axis_arg,
        default=None,
        metavar="AXIS",
        help="the mesh axis FSDP2 shards over (shows the strided shards it makes)",
    )
    return parser


# ---------------------------------------------------------------------------------------
# files


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        msg = f"{path}: cannot read the file: {reason}"
        raise _Problem(msg) from None


def _load_table(path: str) -> ParamLayoutTable:
    text = _read(path)
    try:
        return from_json(text)
    except LayoutError as e:
        raise _Problem(f"{path}: {e.message}") from None


def _load_plan(path: str) -> ShardingPlan:
    text = _read(path)
    try:
        return plan_from_json(text)
    except LayoutError as e:
        raise _Problem(f"{path}: {e.message}") from None


# ---------------------------------------------------------------------------------------
# show, diff, check


def _show(args: argparse.Namespace, out: TextIO) -> int:
    table = _load_table(args.table)
    out.write(f"{table}\n")
    groups = len(table.tied)
    out.write(
        f"({len(table)} parameter{'s' if len(table) != 1 else ''}, "
        f"{groups} tied group{'s' if groups != 1 else ''})\n"
    )
    return 0


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    a = _load_table(args.a)
    b = _load_table(args.b)
    d = diff(a, b)
    if not d:
        return 0
    out.write(f"{d}\n")
    return 1


def _mesh_summary(role: str, sizes: Mapping[str, int], count: int) -> str:
    source = [a for a in sizes if a not in FSDP_OWNED_AXES]
    owned = [a for a in sizes if a in FSDP_OWNED_AXES]
    return (
        f"  {role} mesh {mesh_str(sizes)}: {count} parameter{'s' if count != 1 else ''}; "
        f"source axes {', '.join(source) or '(none)'}; "
        f"FSDP/pipeline axes {', '.join(owned) or '(none)'}"
    )


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    plan = _load_plan(args.plan)
    dense: dict[str, int] = args.mesh
    expert: dict[str, int] | None = args.expert_mesh
    try:
        table = build_table(plan, list(dense), expert_axes=None if expert is None else list(expert))
    except PlanError as e:
        count = len(e.problems)
        err.write(
            f"{PROG}: {args.plan}: the plan has {count} problem{'s' if count != 1 else ''}:\n"
        )
        for problem in e.problems:
            err.write(f"  - {problem.message}\n")
        return 1
    roles = [layout.mesh for layout in table.values()]
    out.write(f"{args.plan}: OK, {len(table)} parameters\n")
    out.write(_mesh_summary("dense", dense, roles.count("dense")) + "\n")
    if expert is not None:
        out.write(_mesh_summary("expert", expert, roles.count("expert")) + "\n")
    groups = len(table.tied)
    out.write(f"  {groups} tied group{'s' if groups != 1 else ''}\n\n")
    out.write(f"{table}\n")
    return 0


# ---------------------------------------------------------------------------------------
# draw


def _table_layout(table: ParamLayoutTable, fqn: str) -> SourceLayout:
    layout = table.get(fqn)
    if layout is None:
        close = difflib.get_close_matches(fqn, list(table), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `show` lists the table's FQNs"
        msg = f"{fqn}: no such parameter in the table{hint}"
        raise LayoutError(msg, fqn=fqn)
    return layout


def _draw(args: argparse.Namespace, out: TextIO) -> int:
    table = _load_table(args.table)
    layout = _table_layout(table, args.fqn)
    out.write(draw(layout, args.shape, args.mesh, fqn=args.fqn, fsdp=args.fsdp) + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# demo


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    # demo imports torch: only this subcommand pays for it
    from layout_algebra import _demo  # noqa: PLC0415 (torch stays unloaded for the others)

    return _demo.run(rank=args.rank, verify=args.verify, as_json=args.json, out=out)


# ---------------------------------------------------------------------------------------
# entry point


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 (one return per command)
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); the exit status.

    0 on success (``diff``: the tables are equal), 1 on a layout problem (``diff``: they
    differ), 2 on a usage error. Problems are one message on stderr, never a traceback.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on usage errors (2) and after --help (0)
        return e.code if isinstance(e.code, int) else 2
    out, err = sys.stdout, sys.stderr
    try:
        match args.command:
            case "show":
                return _show(args, out)
            case "diff":
                return _diff(args, out)
            case "check":
                return _check(args, out, err)
            case "draw":
                return _draw(args, out)
            case _:
                return _demo(args, out)
    except _Problem as e:
        err.write(f"{PROG}: {e}\n")
        return 1
    except LayoutError as e:
        err.write(f"{PROG}: {e.message}\n")
        return 1
    except BrokenPipeError:
        # `layout-algebra show t.json | head`: the reader stopped; point stdout at
        # devnull so the interpreter's final flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
