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
import itertools
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, TextIO

from layout_algebra.algebra import build_table, diff
from layout_algebra.axes import FSDP_OWNED_AXES, as_axis
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.geometry import compose_fsdp, local_runs, local_shape_and_offset
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.plan import ShardingPlan
from layout_algebra.serialization import from_json, plan_from_json

__all__ = ["PROG", "draw_text", "main", "mesh_spec", "shape_spec"]

PROG: Final = "layout-algebra"
"""The program's name in messages (the console script's name)."""

MAX_DRAW_RANKS: Final = 65536
"""``draw`` enumerates every rank of the mesh; beyond this many it refuses."""

MAX_DRAW_DIMS: Final = 2

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


def _mesh_str(sizes: Mapping[str, int]) -> str:
    return "(" + ", ".join(f"{a}={n}" for a, n in sizes.items()) + ")"


def _mesh_summary(role: str, sizes: Mapping[str, int], count: int) -> str:
    source = [a for a in sizes if a not in FSDP_OWNED_AXES]
    owned = [a for a in sizes if a in FSDP_OWNED_AXES]
    return (
        f"  {role} mesh {_mesh_str(sizes)}: {count} parameter{'s' if count != 1 else ''}; "
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


def _ranks_str(ranks: Sequence[int]) -> str:
    """Ranks in ascending order, runs shortened: ``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(ranks), lambda item: item[1] - item[0]):
        values = [r for _, r in run]
        if len(values) > 2:
            parts.append(f"{values[0]}-{values[-1]}")
        else:
            parts.extend(str(v) for v in values)
    return ",".join(parts)


def _span_str(span: range) -> str:
    return f"{span.start}:{span.stop}"


def _runs_str(runs: Sequence[range]) -> str:
    return "+".join(f"[{_span_str(r)}]" for r in runs)


def _segments(size: int, held: Sequence[Sequence[range]]) -> list[range]:
    """The dim ``[0, size)`` cut at every boundary of every rank's runs, in order."""
    cuts = {0, size}
    for runs in held:
        for run in runs:
            cuts.update((run.start, run.stop))
    points = sorted(cuts)
    return [range(lo, hi) for lo, hi in itertools.pairwise(points) if lo < hi]


def _holds(runs: Sequence[range], segment: range) -> bool:
    return any(segment.start in run for run in runs)


def _coordinates(sizes: Mapping[str, int]) -> Iterator[dict[str, int]]:
    """Every coordinate of the mesh, in rank order (row-major over the axes as given)."""
    names = list(sizes)
    for index in itertools.product(*(range(n) for n in sizes.values())):
        yield dict(zip(names, index, strict=True))


def _grid(
    row_labels: Sequence[str], col_labels: Sequence[str], cells: Sequence[Sequence[str]]
) -> list[str]:
    """An ASCII box per cell, column labels above, row labels on the left."""
    widths = [
        max([len(col_labels[j]), *(len(row[j]) for row in cells)]) + 2
        for j in range(len(col_labels))
    ]
    margin = max((len(label) for label in row_labels), default=0)
    pad = " " * (margin + 1 if margin else 0)
    rule = pad + "+" + "+".join("-" * w for w in widths) + "+"
    lines = [
        (
            pad
            + " "
            + " ".join(label.center(w) for label, w in zip(col_labels, widths, strict=True))
        ).rstrip()
    ]
    lines.append(rule)
    for label, row in zip(row_labels, cells, strict=True):
        lead = f"{label:>{margin}} " if margin else ""
        lines.append(
            lead + "|" + "|".join(c.center(w) for c, w in zip(row, widths, strict=True)) + "|"
        )
        lines.append(rule)
    return lines


def _draw_layout(
    table: ParamLayoutTable, fqn: str, mesh: Mapping[str, int], fsdp: str | None
) -> tuple[SourceLayout, SourceLayout]:
    layout = table.get(fqn)
    if layout is None:
        close = difflib.get_close_matches(fqn, list(table), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `show` lists the table's FQNs"
        msg = f"{fqn}: no such parameter in the table{hint}"
        raise LayoutError(msg, fqn=fqn)
    drawn = layout
    if fsdp is not None:
        if fsdp not in mesh:
            msg = f"--fsdp {fsdp}: no such axis in --mesh {_mesh_str(mesh)}; name one of its axes"
            raise LayoutError(msg, axis=fsdp)
        drawn = compose_fsdp(layout, shard_axes=(fsdp,), mesh_sizes=mesh)
    missing = [a.name for a in drawn.axes if a.name not in mesh]
    if missing:
        msg = (
            f"{fqn}: {drawn} uses axis {missing[0]!r}, which --mesh {_mesh_str(mesh)} lacks; "
            f"add {missing[0]}=N to --mesh"
        )
        raise LayoutError(msg, fqn=fqn, axis=missing[0])
    return layout, drawn


def draw_text(
    table: ParamLayoutTable,
    fqn: str,
    shape: Sequence[int],
    mesh: Mapping[str, int],
    fsdp: str | None = None,
) -> str:
    """A picture of which rank holds which block of parameter ``fqn``.

    Every coordinate of ``mesh`` is a rank, numbered row-major over the axes of ``mesh``
    in order. The parameter's 1-D or 2-D extent is cut at every boundary of every rank's
    shard; each cell lists the ranks holding it. Ranks whose shard is empty are not
    drawn but named below the picture (2 rows ``S(0)`` over 4 ranks: ranks 2 and 3 hold
    nothing), followed by every rank's local shape, offset and the runs it holds.

    Raises:
        LayoutError: an unknown FQN, a layout axis missing from ``mesh``, a layout that
            does not fit the shape, more than two dims or more than ``MAX_DRAW_RANKS``.
    """
    if len(shape) > MAX_DRAW_DIMS or not shape:
        msg = (
            f"{fqn}: shape {tuple(shape)} has {len(shape)} dims; draw pictures 1-D and "
            "2-D parameters only, give --shape with one or two sizes"
        )
        raise LayoutError(msg, fqn=fqn)
    total = 1
    for n in mesh.values():
        total *= n
    if total > MAX_DRAW_RANKS:
        msg = (
            f"--mesh {_mesh_str(mesh)} has {total} ranks; draw enumerates at most {MAX_DRAW_RANKS}"
        )
        raise LayoutError(msg)
    source, layout = _draw_layout(table, fqn, mesh, fsdp)

    coords = list(_coordinates(mesh))
    held = [local_runs(shape, layout, mesh, c) for c in coords]
    placed = [local_shape_and_offset(shape, layout, mesh, c) for c in coords]
    present = [r for r, (local, _) in enumerate(placed) if all(local)]
    empty = [r for r, (local, _) in enumerate(placed) if not all(local)]

    segments = [_segments(n, [held[r][d] for r in present]) for d, n in enumerate(shape)]
    if len(shape) == 1:
        rows: list[range | None] = [None]
        cols = segments[0]
    else:
        rows = list(segments[0])
        cols = segments[1]
    cells: list[list[str]] = []
    for row in rows:
        line: list[str] = []
        for col in cols:
            ranks = [
                r
                for r in present
                if (row is None or _holds(held[r][0], row)) and _holds(held[r][-1], col)
            ]
            line.append(_ranks_str(ranks) if ranks else "-")
        cells.append(line)

    lines = [f"{fqn}: shape {tuple(shape)} on mesh {_mesh_str(mesh)}"]
    if fsdp is not None:
        lines.append(f"  source layout {source}, with FSDP over {fsdp!r}: {layout}")
    else:
        lines.append(f"  layout {layout}")
    lines.append(
        f"  rank = row-major index over ({', '.join(mesh)}); cells list the ranks holding them"
    )
    if len(shape) == 2:
        lines.append("  rows down, columns across")
    lines.append("")
    if not present:
        lines.append(f"(shape {tuple(shape)} has no elements: nothing to draw)")
    else:
        row_labels = ["" if r is None else _span_str(r) for r in rows]
        lines.extend(_grid(row_labels, [_span_str(c) for c in cols], cells))
        if empty:
            local = ", ".join(sorted({str(placed[r][0]) for r in empty}))
            lines.append(
                f"not drawn: rank{'s' if len(empty) != 1 else ''} {_ranks_str(empty)} "
                f"hold{'s' if len(empty) == 1 else ''} an empty shard (local shape {local})"
            )
    lines.append("")
    header = ["rank", *mesh, "local shape", "offset", "holds"]
    table_rows = [
        [
            str(r),
            *(str(c[a]) for a in mesh),
            str(placed[r][0]),
            str(placed[r][1]),
            " x ".join(_runs_str(runs) or "[]" for runs in held[r]),
        ]
        for r, c in enumerate(coords)
    ]
    widths = [max(len(line[i]) for line in [header, *table_rows]) for i in range(len(header))]
    for line in [header, *table_rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _draw(args: argparse.Namespace, out: TextIO) -> int:
    table = _load_table(args.table)
    out.write(draw_text(table, args.fqn, args.shape, args.mesh, args.fsdp) + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# demo


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    # demo imports torch: only this subcommand pays for it
    from layout_algebra import demo  # noqa: PLC0415 (torch stays unloaded for the others)

    return demo.run(rank=args.rank, verify=args.verify, as_json=args.json, out=out)


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
