"""The ``layout-algebra`` command line (also ``python -m layout_algebra``).

Subcommands:

- ``demo``: a built-in MoE transformer and its plan on a simulated 8-rank mesh;
- ``show TABLE.json``: a table, aligned, with its tied groups;
- ``diff A.json B.json``: what changed from one table to another (exit 1 when they differ);
- ``check PLAN.json --mesh dp_shard=2,tp=4 [--expert-mesh dp_shard=2,ep=4] [--fqns FILE]``:
  build the table of a plan (of the model's FQNs when its keys hold patterns), report
  every problem of it at once, and every placement dropped;
- ``table PLAN.json --mesh dp_shard=2,tp=4 [--expert-mesh ...] [--fqns FILE]``: the table
  ``check`` builds, as JSON on stdout (for ``show``, ``draw``, ``diff``, ``reshard``);
- ``draw TABLE.json FQN --shape 16,8 --mesh dp_shard=2,tp=4 [--fsdp dp_shard]``: which
  rank holds which block of one parameter.
- ``reshard SRC.json DST.json --shapes FILE --mesh dp_shard=2,tp=2 --to-mesh tp=4
  [--fsdp dp_shard]``: what loading a checkpoint saved under one table costs each rank
  under another (bytes per rank, total, largest, the parameters that move most).
- ``lint TABLE_OR_PLAN.json --shapes FILE --mesh dp_shard=8,tp=4 [--expert-mesh ...]
  [--fsdp dp_shard] [--json]``: every problem torch would raise, the checkpoint hazard of
  uneven strided shards, the padding they cost, and the parameter bytes of every rank
  (for a plan without ``--fsdp``, FSDP over the mesh's one FSDP axis of size > 1); the
  summary line names idle ranks and heavy padding.

Commands that strip FSDP's axes (``check``, ``table``, ``draw``, ``lint``) take
``--owned AXIS,...`` (replace ``FSDP_OWNED_AXES``) and ``--also-owned AXIS,...`` (add to it).

Exit status: 0 on success, 1 on a layout problem (a bad plan, table or file, or output
that cannot be written; one line on stderr), 2 on a usage error. ``main`` is the one place
that turns a problem into its message and exit status: no traceback, names shown escaped,
output written only once the command has succeeded. Only ``demo`` imports torch, and only
when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, NoReturn, TextIO

from layout_algebra._args import MAX_NDIM, MAX_TENSOR_SIZE
from layout_algebra._files import open_regular
from layout_algebra._text import clip, columns, did_you_mean, escape, quote
from layout_algebra.algebra import build_table, complete_default, diff
from layout_algebra.axes import FSDP_OWNED_AXES, AxisName, as_axis, check_distinct_axes
from layout_algebra.checkpoint import reshard_plan
from layout_algebra.draw import draw, mesh_str
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.geometry import MAX_MESH_SIZE, compose_table
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.lint import LintReport, human_bytes, lint
from layout_algebra.placements import Shard, format_placement
from layout_algebra.plan import ShardingPlan
from layout_algebra.serialization import from_json, plan_from_json, shapes_from_json, to_json
from layout_algebra.shapes import ParamShape, shapes_from_safetensors

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["MAX_INPUT_BYTES", "PROG", "main"]

PROG: Final = "layout-algebra"
"""The program's name in messages (the console script's name)."""

MAX_INPUT_BYTES: Final = 256 << 20
"""The largest input file read (256 MiB: a table of two million parameters); beyond it
``main`` refuses the file rather than exhaust memory (``show /dev/zero``)."""

_MESH_ITEM: Final = re.compile(r"\s*([^=\s]*)\s*=\s*(\S*)\s*")
_DIGITS: Final = re.compile(r"[0-9]+", re.ASCII)
_DEMO_WORLD_SIZE: Final = 8
_READ_CHUNK: Final = 1 << 20
_MAX_USAGE_CHARS: Final = 500


class _Problem(Exception):
    """A layout problem found by the command line itself: exit 1 with this message."""


class _Reported(_Problem):
    """A layout problem already said on stderr: exit 1."""


class _Usage(_Problem):
    """A usage error found once the input is read: exit 2 with this message, one line."""


# ---------------------------------------------------------------------------------------
# argument types: each refuses what it cannot hold with a usage error (exit 2)


def _bounded_int(text: str, limit: int, what: str) -> int:
    """``text`` as an int of plain ASCII digits (no sign, no spaces) at most ``limit``."""
    if _DIGITS.fullmatch(text) is None:
        msg = f"{clip(text)!r}: {what} is written in plain digits 0-9, e.g. 4"
        raise argparse.ArgumentTypeError(msg)
    if len(text) > len(str(limit)) or int(text) > limit:
        msg = f"{clip(text)!r}: {what} is at most {limit}"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def _axis_name(text: str, name: str) -> AxisName:
    try:
        return as_axis(name)
    except LayoutError as e:
        raise argparse.ArgumentTypeError(f"{clip(text)!r}: {e.message}") from None


def mesh_spec(text: str) -> dict[str, int]:
    """The axis sizes ``text`` spells, in order: ``"dp_shard=2,tp=4"`` → ``{"dp_shard": 2, ...}``.

    Raises:
        argparse.ArgumentTypeError: not ``name=size`` items separated by commas, a size
            that is not plain digits from 1 to ``MAX_MESH_SIZE``, or an axis named twice.
    """
    sizes: dict[str, int] = {}
    axes: list[AxisName] = []
    for item in text.split(","):
        m = _MESH_ITEM.fullmatch(item)
        if m is None or not m.group(1):
            msg = (
                f"{clip(text)!r}: {clip(item.strip())!r} is not name=size; write the mesh as "
                "axis=size pairs separated by commas, e.g. dp_shard=2,tp=4"
            )
            raise argparse.ArgumentTypeError(msg)
        axis = _axis_name(text, m.group(1))
        size = _bounded_int(m.group(2), MAX_MESH_SIZE, f"the size of axis {axis.name!r}")
        if size < 1:
            msg = f"{clip(text)!r}: axis {axis.name!r} has size {size}; a mesh axis has a size >= 1"
            raise argparse.ArgumentTypeError(msg)
        axes.append(axis)
        sizes[axis.name] = size
    try:
        check_distinct_axes(axes, "--mesh")
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None
    return sizes


def shape_spec(text: str) -> tuple[int, ...]:
    """The tensor shape ``text`` spells: ``"16,8"`` → ``(16, 8)``.

    Raises:
        argparse.ArgumentTypeError: not 1 to ``MAX_NDIM`` sizes of plain digits from
            0 to ``MAX_TENSOR_SIZE``, separated by commas.
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > MAX_NDIM:
        msg = (
            f"{clip(text)!r} has {len(parts)} dims; a tensor has at most {MAX_NDIM}, "
            "give the parameter's shape"
        )
        raise argparse.ArgumentTypeError(msg)
    if not all(_DIGITS.fullmatch(p) for p in parts):
        msg = f"{clip(text)!r} is not a shape; write sizes >= 0 separated by commas, e.g. 16,8"
        raise argparse.ArgumentTypeError(msg)
    return tuple(_bounded_int(p, MAX_TENSOR_SIZE, "a tensor size") for p in parts)


def _axes_spec(text: str) -> tuple[str, ...]:
    """Axis names separated by commas (``""``: none): ``"dp,pp"`` → ``("dp", "pp")``."""
    if not text.strip():
        return ()
    return tuple(_axis_name(text, p.strip()).name for p in text.split(","))


def _axis_arg(text: str) -> str:
    try:
        return as_axis(text).name
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _rank_arg(text: str) -> int:
    if _DIGITS.fullmatch(text) is None or len(text) > 1 or int(text) >= _DEMO_WORLD_SIZE:
        msg = f"{clip(text)!r}: the demo's ranks are 0 to {_DEMO_WORLD_SIZE - 1}"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def add_owned_arguments(parser: argparse.ArgumentParser) -> None:
    """``--owned AXIS,...`` and ``--also-owned AXIS,...`` on a command that strips FSDP's
    axes; ``owned_axes(args)`` reads them back."""
    parser.add_argument(
        "--owned",
        type=_axes_spec,
        default=None,
        metavar="AXIS,...",
        help=(
            "the axes owned by FSDP and pipelining, replacing the default "
            f"({', '.join(sorted(FSDP_OWNED_AXES))}); '' for none"
        ),
    )
    parser.add_argument(
        "--also-owned",
        type=_axes_spec,
        default=(),
        metavar="AXIS,...",
        help="axes owned by FSDP or pipelining in addition to --owned (or the default)",
    )


def owned_axes(args: argparse.Namespace) -> frozenset[str]:
    """The owned axes ``--owned`` and ``--also-owned`` give (default ``FSDP_OWNED_AXES``)."""
    base: frozenset[str] = FSDP_OWNED_AXES if args.owned is None else frozenset(args.owned)
    return base | frozenset(args.also_owned)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line on stderr, as every problem is
    (``--help`` shows the usage), and help that cannot be written to stdout (closed, a
    full disk) raises instead of being dropped with exit 0, as argparse drops it."""

    def error(self, message: str) -> NoReturn:
        # argparse quotes the arguments it did not expect as they are: escaped and bounded
        shown = escape(clip(message, _MAX_USAGE_CHARS))
        self.exit(2, f"{self.prog}: {shown}; see {self.prog} --help\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        out: TextIO | None = sys.stdout
        if message and file is sys.stdout:  # help: stdout's, None when it is closed
            if out is None:
                msg = "stdout is closed"
                raise ValueError(msg)
            out.write(message)
            out.flush()
            return
        super()._print_message(message, file)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
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
        help="build the table of a plan on a mesh; report every problem and every drop",
        description=(
            "Build the layout table of a plan: dense parameters on --mesh, expert "
            "parameters on --expert-mesh (axis names in mesh order, FSDP-owned axes "
            "included). Prints a summary, the placements dropped on axes a mesh lacks, "
            "and the table; or every problem with its FQN."
        ),
    )
    _add_plan_arguments(check)
    table = sub.add_parser(
        "table",
        help="the table of a plan on a mesh, as JSON (for show, draw, diff, reshard, lint)",
        description=(
            "Build the layout table of a plan as check does and print it as JSON on stdout "
            "(`layout-algebra table plan.json --mesh dp_shard=2,tp=4 > table.json`). With "
            "--fqns, the FQNs no key of the plan matches are added with the plain layout: "
            "plain tensors until FSDP, as lint reads a plan. Exit 1 with every problem of "
            "the plan on stderr."
        ),
    )
    _add_plan_arguments(table)

    drw = sub.add_parser(
        "draw",
        help="which rank holds which block of one parameter",
        description=(
            "Draw the blocks of one parameter and the ranks holding each, for every "
            "coordinate of --mesh (rank = row-major index over the --mesh axes, in order). "
            "With --fsdp AXIS, the layout is first composed with FSDP2 sharding over AXIS. "
            "A parameter of more than two dims is pictured by its sharded dims."
        ),
    )
    drw.add_argument("table", metavar="TABLE.json", help="a table file ('-' for stdin)")
    drw.add_argument("fqn", metavar="FQN", help="the parameter to draw")
    drw.add_argument(
        "--shape", type=shape_spec, required=True, metavar="N,M,...", help="its global shape"
    )
    drw.add_argument(
        "--mesh",
        type=mesh_spec,
        required=True,
        metavar="AXIS=N,...",
        help="the world mesh, every axis of the layout included, e.g. dp_shard=2,tp=4",
    )
    drw.add_argument(
        "--fsdp",
        type=_axis_arg,
        default=None,
        metavar="AXIS",
        help="the mesh axis FSDP2 shards over (shows the strided shards it makes)",
    )
    add_owned_arguments(drw)
    _add_reshard(sub)
    _add_lint(sub)
    return parser


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a command that builds the table of a plan (``check``, ``table``)."""
    parser.add_argument("plan", metavar="PLAN.json", help="a plan file ('-' for stdin)")
    parser.add_argument(
        "--mesh",
        type=mesh_spec,
        required=True,
        metavar="AXIS=N,...",
        help="the dense mesh, e.g. dp_shard=2,tp=4",
    )
    parser.add_argument(
        "--expert-mesh",
        type=mesh_spec,
        default=None,
        metavar="AXIS=N,...",
        help="the expert mesh, e.g. dp_shard=2,ep=4",
    )
    parser.add_argument(
        "--fqns",
        default=None,
        metavar="FILE",
        help=(
            "the model's parameter FQNs, for a plan whose keys hold patterns "
            "(layers.*.attention): one FQN a line, a shapes.json or a .safetensors file"
        ),
    )
    add_owned_arguments(parser)


def _add_reshard(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rsh = sub.add_parser(
        "reshard",
        help="what loading a checkpoint saved under one table costs each rank under another",
        description=(
            "Plan the load of a torch distributed checkpoint saved under SRC.json (on --mesh, "
            "--expert-mesh) by a run laid out by DST.json (on --to-mesh, --to-expert-mesh): "
            "the bytes and reads of every destination rank (rank = row-major index over the "
            "mesh's axes, in order), the total, the largest, the parameters that move most. "
            "Both tables are source tables; --fsdp / --to-fsdp compose a side with FSDP2 "
            "sharding over that axis (its expert mesh too, unless --expert-fsdp / "
            "--to-expert-fsdp name another)."
        ),
    )
    rsh.add_argument("src", metavar="SRC.json", help="the table the checkpoint was saved under")
    rsh.add_argument("dst", metavar="DST.json", help="the table it is loaded under")
    rsh.add_argument(
        "--shapes",
        required=True,
        metavar="FILE",
        help=(
            "shapes.json, a .safetensors file, a model.safetensors.index.json or the "
            "checkpoint directory holding one"
        ),
    )
    for side, run in (("", "saving"), ("to-", "loading")):
        rsh.add_argument(
            f"--{side}mesh",
            type=mesh_spec,
            required=True,
            metavar="AXIS=N,...",
            help=f"the {run} run's dense mesh, e.g. dp_shard=2,tp=4",
        )
        rsh.add_argument(
            f"--{side}expert-mesh",
            type=mesh_spec,
            default=None,
            metavar="AXIS=N,...",
            help=f"the {run} run's expert mesh, over the same ranks",
        )
        rsh.add_argument(
            f"--{side}fsdp",
            type=_axis_arg,
            default=None,
            metavar="AXIS",
            help=f"the axis FSDP2 shards over in the {run} run",
        )
        rsh.add_argument(
            f"--{side}expert-fsdp",
            type=_axis_arg,
            default=None,
            metavar="AXIS",
            help=f"the axis FSDP2 shards the experts over in the {run} run (default: --{side}fsdp)",
        )
    rsh.add_argument(
        "--top",
        type=lambda text: _bounded_int(text, 1_000_000, "--top"),
        default=10,
        metavar="N",
        help="how many parameters to name (default 10)",
    )


# ---------------------------------------------------------------------------------------
# files


def _read(path: str) -> bytes:
    """The file's bytes, at most ``MAX_INPUT_BYTES`` of them (``-``: stdin)."""
    try:
        if path == "-":
            if sys.stdin is None:
                msg = "-: cannot read stdin: it is closed; give the file's path instead"
                raise _Problem(msg)
            return _read_bounded(path, sys.stdin.buffer.read)
        with open_regular(path) as f:  # never waits on a FIFO
            if os.fstat(f.fileno()).st_size > MAX_INPUT_BYTES:
                raise _Problem(_too_large(path))
            return _read_bounded(path, f.read)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        msg = f"{path}: cannot read the file: {reason}"
        raise _Problem(msg) from None
    except UnicodeEncodeError as e:  # a lone surrogate, which only a caller in Python passes
        msg = f"{path}: cannot be a file name on this system ({e.reason}); check the path"
        raise _Problem(msg) from None


def _read_bounded(path: str, read: Callable[[int], bytes]) -> bytes:
    data = bytearray()
    while True:
        chunk = read(_READ_CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > MAX_INPUT_BYTES:
            raise _Problem(_too_large(path))


def _too_large(path: str) -> str:
    return (
        f"{path}: larger than {MAX_INPUT_BYTES} bytes, more than a table or plan file "
        "holds; give the right file"
    )


def _is_plan(text: bytes) -> bool:
    """Whether ``text`` is a plan document (its ``modules``) rather than a table."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "modules" in doc and "entries" not in doc


def _load_table(path: str) -> ParamLayoutTable:
    text = _read(path)
    try:
        return from_json(text)
    except LayoutError as e:
        if _is_plan(text):
            msg = (
                f"{path} is a plan, not a table; make its table with "
                f"`{PROG} table {path} --mesh AXIS=N,...`"
            )
            raise _Problem(msg) from None
        raise _Problem(f"{path}: {e.message}") from None


def _load_plan(path: str) -> ShardingPlan:
    text = _read(path)
    try:
        return plan_from_json(text)
    except LayoutError as e:
        raise _Problem(f"{path}: {e.message}") from None


_INDEX: Final = "model.safetensors.index.json"
_SINGLE: Final = "model.safetensors"


def _checkpoint_file(path: str, option: str) -> str:
    """The file a checkpoint directory's shapes are read from: its index, else its
    single ``model.safetensors`` (as ``save_pretrained`` writes them); other paths as
    they are.

    Raises:
        _Usage: a directory holding neither.
    """
    try:
        is_dir = os.path.isdir(path)
    except (OSError, ValueError):  # a name this system cannot hold: reading it says so
        return path
    if not is_dir:
        return path
    for name in (_INDEX, _SINGLE):
        candidate = os.path.join(path, name)
        if os.path.exists(candidate):
            return candidate
    msg = (
        f"{option} {clip(path)}: the directory has no {_INDEX} nor {_SINGLE}; give a "
        "checkpoint directory, its index, a .safetensors file or a shapes.json"
    )
    raise _Usage(msg)


def _load_shapes(path: str, option: str = "--shapes") -> Mapping[str, ParamShape]:
    """Parameter shapes from a ``shapes.json``, a ``.safetensors`` file, a sharded
    checkpoint's ``model.safetensors.index.json`` (headers only) or the directory
    holding one of the latter two."""
    path = _checkpoint_file(path, option)
    try:
        if path.endswith((".safetensors", ".safetensors.index.json")):
            return shapes_from_safetensors(path)
        return shapes_from_json(_read(path))
    except LayoutError as e:
        raise _Problem(f"{path}: {e.message}") from None


def _load_fqns(path: str) -> list[str]:
    """The parameter FQNs a file names: one a line, or the parameters of a shapes file
    or of a checkpoint (its directory too)."""
    path = _checkpoint_file(path, "--fqns")
    if path.endswith((".safetensors", ".json")):
        return list(_load_shapes(path, "--fqns"))
    data = _read(path)
    if data.lstrip()[:1] == b"{":
        try:
            return list(shapes_from_json(data))
        except LayoutError as e:
            raise _Problem(f"{path}: {e.message}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        msg = f"{path}: byte {e.start} is not UTF-8; give one FQN a line, as UTF-8 text"
        raise _Problem(msg) from None
    fqns: list[str] = []
    where: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        fqn = line.strip()
        if not fqn:
            continue
        if fqn in where:
            msg = (
                f"{path}: line {number}: {clip(fqn)!r} is also on line {where[fqn]}; "
                "name each parameter once"
            )
            raise _Problem(msg)
        where[fqn] = number
        fqns.append(fqn)
    return fqns


# ---------------------------------------------------------------------------------------
# show, diff, check


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _group_str(group: Iterable[str]) -> str:
    return ", ".join(escape(fqn) for fqn in sorted(group))


def _stdout_encoding() -> str | None:
    """The encoding stdout writes in, if it says."""
    encoding: object = getattr(sys.stdout, "encoding", None)
    return encoding if isinstance(encoding, str) else None


def _table_lines(table: ParamLayoutTable) -> list[str]:
    """The table as ``str(table)`` prints it, FQNs escaped (for stdout's encoding too, so
    the layouts stay in one column on an ASCII terminal)."""
    if not table:
        return ["(empty table)"]
    encoding = _stdout_encoding()
    lines = columns([[escape(fqn, encoding), str(layout)] for fqn, layout in table.items()])
    lines.extend(f"tied: {_group_str(g)}" for g in table.tied)
    return lines


def _show(args: argparse.Namespace, out: TextIO) -> int:
    table = _load_table(args.table)
    for line in _table_lines(table):
        out.write(line + "\n")
    out.write(f"({_plural(len(table), 'parameter')}, {_plural(len(table.tied), 'tied group')})\n")
    return 0


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    a = _load_table(args.a)
    b = _load_table(args.b)
    d = diff(a, b)
    if not d:
        return 0
    # as str(d) spells it, FQNs escaped
    for fqn, (old, new) in d.changed.items():
        out.write(f"{escape(fqn)}: {old} -> {new}\n")
    for fqn, new in d.added.items():
        out.write(f"{escape(fqn)}: (absent) -> {new}\n")
    for fqn, old in d.removed.items():
        out.write(f"{escape(fqn)}: {old} -> (absent)\n")
    for group in d.tied_added:
        out.write(f"tied +: {_group_str(group)}\n")
    for group in d.tied_removed:
        out.write(f"tied -: {_group_str(group)}\n")
    return 1


def _mesh_summary(role: str, sizes: Mapping[str, int], count: int, owned: frozenset[str]) -> str:
    source = [a for a in sizes if a not in owned]
    fsdp = [a for a in sizes if a in owned]
    return (
        f"  {role} mesh {mesh_str(sizes)}: {_plural(count, 'parameter')}; "
        f"source axes {', '.join(source) or '(none)'}; "
        f"FSDP/pipeline axes {', '.join(fsdp) or '(none)'}"
    )


def _drops_lines(table: ParamLayoutTable) -> list[str]:
    """The placements ``build_table`` dropped, counted per axis and mesh role."""
    drops = table.dropped
    if not drops:
        return ["  no placement dropped"]
    by: dict[tuple[str, str], list[str]] = {}
    for d in drops:
        by.setdefault((d.axis.name, d.mesh), []).append(
            f"{escape(d.fqn)}: {format_placement(d.placement)}"
        )
    lines = [
        f"  {_plural(len(drops), 'placement')} dropped on axes their mesh lacks "
        "(the axis has size 1 there; check the mesh if that is not meant):"
    ]
    for (axis, mesh), items in by.items():
        example = items[0] if len(items) == 1 else f"{items[0]}, ..."
        lines.append(f"    {axis} on the {escape(mesh)} mesh: {len(items)} ({example})")
    return lines


def _need_expert_mesh(plan: ShardingPlan, path: str) -> None:
    """Refuse a plan that puts parameters on the expert mesh when no ``--expert-mesh``
    is given: one message for every command that builds a plan's table.

    Raises:
        _Problem: a parameter of an expert-parallel module is sharded on ``ep``.
    """
    routed = [
        (module, f"{module}.{param}" if module else param, named["ep"])
        for module, spec in plan.modules.items()
        if spec.expert_parallel
        for param, named in spec.params.items()
        if isinstance(named.get("ep"), Shard)
    ]
    if not routed:
        return
    module, key, placement = routed[0]
    what = f"{key} is" if len(routed) == 1 else f"{len(routed)} parameters (first {key}) are"
    msg = (
        f"{path}: {clip(what)} sharded on 'ep' ({format_placement(placement)}) in "
        f"expert-parallel module {clip(module)!r}, which puts it on the expert mesh; give "
        "that mesh with --expert-mesh AXIS=N,..., over the same ranks as --mesh (e.g. "
        "--expert-mesh dp_shard=2,ep=4), or mark the module expert_parallel false in the plan"
    )
    raise _Problem(msg)


def _plan_table(
    plan: ShardingPlan,
    path: str,
    args: argparse.Namespace,
    fqns: list[str] | None,
    err: TextIO | None,
) -> ParamLayoutTable | None:
    """The table of ``plan`` (read from ``path``) on ``--mesh`` / ``--expert-mesh``, or
    ``None`` with every problem of the plan said on ``err``."""
    expert: dict[str, int] | None = args.expert_mesh
    if expert is None:
        _need_expert_mesh(plan, path)
    try:
        return build_table(
            plan,
            list(args.mesh),
            expert_axes=None if expert is None else list(expert),
            owned=owned_axes(args),
            fqns=fqns,
        )
    except PlanError as e:
        count = len(e.problems)
        _say(err, f"{PROG}: {escape(path)}: the plan has {_plural(count, 'problem')}:")
        for problem in e.problems:
            _say(err, f"  - {escape(problem.message)}")
        return None


def _check(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    fqns = None if args.fqns is None else _load_fqns(args.fqns)
    dense: dict[str, int] = args.mesh
    expert: dict[str, int] | None = args.expert_mesh
    owned = owned_axes(args)
    table = _plan_table(_load_plan(args.plan), args.plan, args, fqns, err)
    if table is None:
        return 1
    roles = [layout.mesh for layout in table.values()]
    out.write(f"{escape(args.plan)}: OK, {_plural(len(table), 'parameter')}\n")
    out.write(_mesh_summary("dense", dense, roles.count("dense"), owned) + "\n")
    if expert is not None:
        out.write(_mesh_summary("expert", expert, roles.count("expert"), owned) + "\n")
    out.write(f"  {_plural(len(table.tied), 'tied group')}\n")
    if fqns is not None:
        unmatched = [fqn for fqn in fqns if fqn not in table]
        out.write(
            f"  {len(fqns) - len(unmatched)} of {_plural(len(fqns), 'FQN')} of "
            f"{escape(args.fqns)} matched by the plan"
            + (
                f"; {len(unmatched)} no key matches (first {escape(clip(unmatched[0]))}) "
                "are not in the table: complete_default completes them"
                if unmatched
                else ""
            )
            + "\n"
        )
    for line in _drops_lines(table):
        out.write(line + "\n")
    out.write("\n")
    for line in _table_lines(table):
        out.write(line + "\n")
    return 0


def _table(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    fqns = None if args.fqns is None else _load_fqns(args.fqns)
    plan = _load_plan(args.plan)
    table = _plan_table(plan, args.plan, args, fqns, err)
    if table is None:
        return 1
    if fqns is not None:  # what no key names stays a plain tensor until FSDP, as lint reads it
        unmatched = [fqn for fqn in fqns if fqn not in table]
        table = complete_default(
            table, unmatched, list(args.mesh), plain=True, tied_pairs=plan.tied_pairs
        )
    out.write(to_json(table) + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# reshard


def _side(
    table: ParamLayoutTable,
    dense: dict[str, int],
    expert: dict[str, int] | None,
    fsdp: str | None,
    expert_fsdp: str | None,
    *,
    prefix: str,
) -> tuple[ParamLayoutTable, dict[str, dict[str, int]]]:
    """One run's layouts as saved or loaded, and its sizes by mesh role."""
    sizes = {"dense": dense} if expert is None else {"dense": dense, "expert": expert}
    for role in dict.fromkeys(layout.mesh for layout in table.values()):
        if role not in sizes:
            fqn = next(f for f, layout in table.items() if layout.mesh == role)
            option = f"--{prefix}expert-mesh" if role == "expert" else f"--{prefix}mesh"
            msg = (
                f"{escape(clip(fqn))} is on the 'expert' mesh; give its sizes with "
                f"{option} AXIS=N,..."
                if role == "expert"
                else f"{escape(clip(fqn))} is on the {escape(clip(role))!r} mesh; the command "
                "line knows the 'dense' and 'expert' meshes only"
            )
            raise _Problem(msg)
    if expert is not None and math.prod(expert.values()) != math.prod(dense.values()):
        msg = (
            f"--{prefix}mesh {mesh_str(dense)} has {math.prod(dense.values())} ranks but "
            f"--{prefix}expert-mesh {mesh_str(expert)} has {math.prod(expert.values())}; an "
            "expert mesh lays out the same ranks"
        )
        raise _Problem(msg)
    axes: dict[str, str] = {}
    if fsdp is not None:
        axes["dense"] = fsdp
    if expert is not None and (expert_fsdp or fsdp) is not None:
        axes["expert"] = expert_fsdp or fsdp or ""
    if axes:
        table = compose_table(table, fsdp=axes, mesh_sizes=sizes)
    return table, sizes


def _reshard(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    saved, loaded = _load_table(args.src), _load_table(args.dst)
    shapes = _load_shapes(args.shapes)
    try:
        src, src_sizes = _side(
            saved, args.mesh, args.expert_mesh, args.fsdp, args.expert_fsdp, prefix=""
        )
        dst, dst_sizes = _side(
            loaded,
            args.to_mesh,
            args.to_expert_mesh,
            args.to_fsdp,
            args.to_expert_fsdp,
            prefix="to-",
        )
        plan = reshard_plan(src, dst, shapes, src_sizes=src_sizes, dst_sizes=dst_sizes)
    except PlanError as e:
        count = len(e.problems)
        _say(err, f"{PROG}: the reshard has {_plural(count, 'problem')}:")
        for problem in e.problems:
            _say(err, f"  - {escape(problem.message)}")
        return 1
    out.write(f"saved on {_meshes_str(src_sizes)}, loaded on {_meshes_str(dst_sizes)}\n")
    out.write(plan.report(top=args.top) + "\n")
    return 0


def _meshes_str(sizes: Mapping[str, Mapping[str, int]]) -> str:
    return "; ".join(f"{role} {mesh_str(s)}" for role, s in sizes.items())


# ---------------------------------------------------------------------------------------
# lint


def _fsdp_arg(text: str) -> str | tuple[str, str]:
    """``AXIS`` (FSDP) or ``REPLICATE,SHARD`` (HSDP)."""
    names = [part.strip() for part in text.split(",")]
    if len(names) > 2:
        msg = f"{clip(text)!r}: give FSDP's shard axis, or REPLICATE,SHARD for HSDP"
        raise argparse.ArgumentTypeError(msg)
    axes = [_axis_arg(name) for name in names]
    return axes[0] if len(axes) == 1 else (axes[0], axes[1])


def _add_lint(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lnt = sub.add_parser(
        "lint",
        help="check a table or plan against the model's shapes; each rank's bytes",
        description=(
            "Lint TABLE_OR_PLAN.json against the parameters' shapes on the world of --mesh "
            "(and --expert-mesh, over the same ranks; rank = row-major index over a mesh's "
            "axes, in order): shard dims a parameter lacks, FQNs in one but not the other, "
            "FSDP2's uneven shards on a dim > 0 (which torch refuses), layouts whose DTensor "
            "metadata differs from the rows FSDP2 keeps (checkpoints break), the padding "
            "uneven shards cost, and the parameter bytes of every rank. With --fsdp the "
            "layouts are composed with FSDP2 first; without it a table is read as composed. "
            "A plan's parameters that no module names stay plain tensors until FSDP; its "
            "patterns (layers.*.attn) are matched against the FQNs of --shapes. "
            "Exit 1 when there are problems."
        ),
    )
    lnt.add_argument(
        "table", metavar="TABLE_OR_PLAN.json", help="a table or a plan file ('-' for stdin)"
    )
    lnt.add_argument(
        "--shapes",
        required=True,
        metavar="FILE",
        help=(
            "shapes.json, a .safetensors file, a model.safetensors.index.json or the "
            "checkpoint directory holding one"
        ),
    )
    lnt.add_argument(
        "--mesh",
        type=mesh_spec,
        required=True,
        metavar="AXIS=N,...",
        help="the dense mesh, FSDP's axes included, e.g. dp_shard=8,tp=4",
    )
    lnt.add_argument(
        "--expert-mesh",
        type=mesh_spec,
        default=None,
        metavar="AXIS=N,...",
        help="the expert mesh, over the same ranks, e.g. dp_shard=4,ep=8",
    )
    lnt.add_argument(
        "--fsdp",
        type=_fsdp_arg,
        default=None,
        metavar="AXIS",
        help=(
            "the axis FSDP2 shards over (REPLICATE,SHARD for HSDP); for a plan, default: "
            "the one FSDP-owned axis of --mesh of size > 1"
        ),
    )
    lnt.add_argument(
        "--expert-fsdp",
        type=_fsdp_arg,
        default=None,
        metavar="AXIS",
        help=(
            "the axis FSDP2 shards the experts over (default: --fsdp; for a plan without "
            "--fsdp, the one FSDP-owned axis of --expert-mesh of size > 1)"
        ),
    )
    lnt.add_argument(
        "--shard-dim",
        type=lambda text: _bounded_int(text, MAX_NDIM - 1, "--shard-dim"),
        default=0,
        metavar="N",
        help="the dim FSDP2 shards (shard_placement_fn), default 0",
    )
    lnt.add_argument(
        "--expert-shard-dim",
        type=lambda text: _bounded_int(text, MAX_NDIM - 1, "--expert-shard-dim"),
        default=None,
        metavar="N",
        help="the dim FSDP2 shards of expert parameters (default: --shard-dim)",
    )
    lnt.add_argument("--json", action="store_true", help="print the report as JSON")
    add_owned_arguments(lnt)


def _lint_table(
    path: str, shapes: Mapping[str, ParamShape], args: argparse.Namespace, err: TextIO | None
) -> tuple[ParamLayoutTable, bool]:
    """The table in ``path``, or the table of the plan in it (unplanned shapes plain), and
    whether it was a plan."""
    text = _read(path)
    if not _is_plan(text):
        try:
            return from_json(text), False
        except LayoutError as e:
            raise _Problem(f"{path}: {e.message}") from None
    try:
        plan = plan_from_json(text)
    except LayoutError as e:
        raise _Problem(f"{path}: {e.message}") from None
    fqns = None
    if plan.has_patterns:  # matched against the shapes' FQNs and the tied aliases they lack
        absent = [fqn for pair in plan.tied_pairs for fqn in pair if fqn not in shapes]
        fqns = [*shapes, *dict.fromkeys(absent)]
    table = _plan_table(plan, path, args, fqns, err)
    if table is None:
        raise _Reported
    plain = SourceLayout("dense", (), ())
    aliases = {fqn for group in table.tied for fqn in group}
    missing = {fqn: plain for fqn in shapes if fqn not in table and fqn not in aliases}
    return (table.with_entries(missing) if missing else table), True


_NOT_FSDP: Final = frozenset({"pp"})
"""Owned axes FSDP never shards over: pipelining's."""


def _fsdp_axes(
    given: str | tuple[str, str] | None,
    option: str,
    mesh: Mapping[str, int],
    mesh_option: str,
    *,
    guess: bool,
    owned: frozenset[str],
    remedy: str = "",
) -> tuple[str | tuple[str, str] | None, bool]:
    """FSDP's axes on one mesh, and whether they were found rather than given.

    ``given`` must name axes of ``mesh``; without it (and with ``guess``, for a plan,
    whose layouts are source layouts) the one FSDP-owned axis of ``mesh`` of size > 1 is
    FSDP's axis, and several are ambiguous.

    Raises:
        _Usage: ``given`` names an axis ``mesh`` lacks, or ``mesh`` has several FSDP axes.
    """
    if given is not None:
        for axis in (given,) if isinstance(given, str) else given:
            if axis not in mesh:
                msg = (
                    f"{option} {axis}: {mesh_option} {mesh_str(mesh)} has no axis {axis!r}"
                    f"{did_you_mean(axis, mesh)}; name one of its axes ({', '.join(mesh)})"
                    f"{remedy}"
                )
                raise _Usage(msg)
        return given, False
    if not guess:
        return None, False
    found = [axis for axis, size in mesh.items() if axis in owned - _NOT_FSDP and size > 1]
    if len(found) > 1:
        msg = (
            f"{mesh_option} {mesh_str(mesh)} has {len(found)} FSDP axes "
            f"({', '.join(found)}); give the one FSDP shards over with {option} AXIS, or "
            f"{option} REPLICATE,SHARD for HSDP (e.g. {option} {found[0]},{found[-1]})"
        )
        raise _Usage(msg)
    return (found[0], True) if found else (None, False)


def _lint_fsdp(
    args: argparse.Namespace, owned: frozenset[str], *, guess: bool
) -> tuple[dict[str, str | tuple[str, str]] | None, list[str]]:
    """FSDP's axes by mesh role (``None``: no FSDP), and the options found rather than
    given (for a plan, ``guess``: its layouts are source layouts)."""
    dense: dict[str, int] = args.mesh
    expert: dict[str, int] | None = args.expert_mesh
    found: list[str] = []
    dense_fsdp, guessed = _fsdp_axes(args.fsdp, "--fsdp", dense, "--mesh", guess=guess, owned=owned)
    if guessed:
        found.append(f"--fsdp {dense_fsdp}")
    expert_fsdp: str | tuple[str, str] | None = None
    if expert is not None:
        option = "--expert-fsdp" if args.expert_fsdp is not None or args.fsdp is None else "--fsdp"
        expert_fsdp, guessed = _fsdp_axes(
            args.expert_fsdp or args.fsdp,
            option,
            expert,
            "--expert-mesh",
            guess=guess,
            owned=owned,
            remedy=" with --expert-fsdp AXIS" if option == "--fsdp" else "",
        )
        if guessed:
            found.append(f"--expert-fsdp {expert_fsdp}")
    if guess and (dense_fsdp is None) != (expert is None or expert_fsdp is None):
        # FSDP shards one mesh's parameters: it shards the other's over its FSDP axis of size 1
        role_mesh, role_option = (
            (dense, "--fsdp") if dense_fsdp is None else (expert, "--expert-fsdp")
        )
        single = [axis for axis in role_mesh or {} if axis in owned - _NOT_FSDP]
        if len(single) == 1:
            found.append(f"{role_option} {single[0]}")
            if dense_fsdp is None:
                dense_fsdp = single[0]
            else:
                expert_fsdp = single[0]
    fsdp: dict[str, str | tuple[str, str]] = {}
    if dense_fsdp is not None:
        fsdp["dense"] = dense_fsdp
    if expert_fsdp is not None:
        fsdp["expert"] = expert_fsdp
    return fsdp or None, found


def _lint(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    dense: dict[str, int] = args.mesh
    expert: dict[str, int] | None = args.expert_mesh
    owned = owned_axes(args)
    if args.expert_fsdp is not None and expert is None:
        raise _Usage("--expert-fsdp names an axis of --expert-mesh; give --expert-mesh too")
    shapes = _load_shapes(args.shapes)
    table, is_plan = _lint_table(args.table, shapes, args, err)
    sizes = {"dense": dense} if expert is None else {"dense": dense, "expert": expert}
    fsdp, found = _lint_fsdp(args, owned, guess=is_plan)

    def run(expert_dim: int | None) -> LintReport:
        shard_dim: int | dict[str, int] = args.shard_dim
        if fsdp is None:
            shard_dim = 0
        elif expert_dim is not None:
            shard_dim = {
                fqn: expert_dim if layout.mesh == "expert" else args.shard_dim
                for fqn, layout in table.items()
            }
        return lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp, shard_dim=shard_dim, owned=owned)

    report = run(args.expert_shard_dim)
    expert_dim = args.shard_dim if args.expert_shard_dim is None else args.expert_shard_dim
    remedy = None
    if fsdp is not None and "expert" in fsdp and expert_dim == 0:
        remedy = functools.partial(run, 1)
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        if fsdp:
            where = f"FSDP over {_fsdp_str(fsdp)}"
            if found:
                where += f" (the FSDP axis of its mesh: {', '.join(found)}; give it to change)"
        elif is_plan:
            where = "no FSDP (no FSDP axis of size > 1 in the mesh; --fsdp AXIS adds it)"
        else:
            where = "read as composed (no --fsdp)"
        out.write(
            f"{escape(clip(args.table))}: {_plural(len(table), 'parameter')} on "
            f"{_meshes_str(sizes)}; {where}\n"
        )
        for number, line in enumerate(str(report).splitlines()):
            if number == 0:
                line = "; ".join([line, *_summary_notes(report, remedy)])  # noqa: PLW2901
            if fsdp is None and is_plan and line == "parameter bytes per rank after FSDP:":
                line = "parameter bytes per rank (no FSDP):"  # noqa: PLW2901
            out.write(escape(line) + "\n")
    if report.problems:
        count = len(report.problems)
        shown = escape(clip(args.table))
        _say(err, f"{PROG}: {shown}: {_plural(count, 'problem')} (see the report)")
        return 1
    return 0


def _idle(report: LintReport, role: str) -> int:
    """How many ranks hold none of ``role``'s parameters while others hold some."""
    row = report.memory.by_role.get(role, ())
    idle = sum(1 for held in row if held == 0)
    return idle if idle < len(row) else 0


def _padding(report: LintReport) -> int:
    memory = report.memory
    return sum(memory.padded_bytes_per_rank) - memory.total


def _summary_notes(report: LintReport, remedy: Callable[[], LintReport] | None) -> list[str]:
    """What the summary line must say beside the counts: ranks idle for a role, FSDP
    padding above a tenth of the data, and, for the experts, what their dim 1 would give
    (``remedy``: the lint with FSDP sharding the experts' dim 1)."""
    notes: list[str] = []
    for role in report.memory.by_role:
        idle = _idle(report, role)
        if idle:
            notes.append(
                f"{_plural(idle, 'rank')} hold{'s' if idle == 1 else ''} no {role} weights"
            )
    padded, total = _padding(report), report.memory.total
    if total and padded * 10 > total:
        notes.append(f"FSDP pads {human_bytes(padded)} ({padded / total:.0%} of the data)")
    if notes and remedy is not None and (_idle(report, "expert") or padded * 10 > total):
        other = remedy()  # only a better layout is worth naming
        better = _idle(other, "expert") < _idle(report, "expert") or _padding(other) < padded
        if better and len(other.problems) <= len(report.problems):
            (_, least), (_, most) = other.memory.smallest, other.memory.largest
            spread = (
                f"{human_bytes(most)} on every rank"
                if least == most
                else (f"{human_bytes(least)} to {human_bytes(most)} a rank")
            )
            notes.append(f"--expert-shard-dim 1 (FSDP on the experts' dim 1) gives {spread}")
    return notes


def _fsdp_str(fsdp: Mapping[str, str | tuple[str, str]]) -> str:
    return "; ".join(
        f"{role} {axes if isinstance(axes, str) else ','.join(axes)}" for role, axes in fsdp.items()
    )


# ---------------------------------------------------------------------------------------
# draw


def _table_layout(table: ParamLayoutTable, fqn: str) -> SourceLayout:
    layout = table.get(fqn)
    if layout is None:
        hint = did_you_mean(fqn, table) or "; `show` lists the table's FQNs"
        msg = f"{escape(clip(fqn))}: no such parameter in the table{hint}"
        raise LayoutError(msg, fqn=fqn)
    return layout


def _draw(args: argparse.Namespace, out: TextIO) -> int:
    table = _load_table(args.table)
    layout = _table_layout(table, args.fqn)
    sizes: dict[str, int] = args.mesh
    out.write(draw(layout, args.shape, sizes, fqn=args.fqn, fsdp=args.fsdp) + "\n")
    owned = owned_axes(args)
    unused = [a for a in sizes if a in owned and a not in {x.name for x in layout.axes}]
    if args.fsdp is None and unused:
        out.write(
            f"\nnot composed with FSDP: {', '.join(unused)} "
            f"{'is an FSDP axis' if len(unused) == 1 else 'are FSDP axes'} of --mesh; give "
            f"--fsdp {unused[0]} to see the shards fully_shard makes\n"
        )
    return 0


# ---------------------------------------------------------------------------------------
# demo


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    # demo imports torch: only this subcommand pays for it
    try:
        from layout_algebra import _demo  # noqa: PLC0415 (torch stays unloaded for the others)
    except ImportError as e:
        if not (e.name or "").startswith("torch") and "needs torch" not in str(e):
            raise  # not torch missing: a real fault, not the user's
        msg = (
            "demo runs a model on a simulated mesh and needs torch, which is not installed; "
            "pip install 'layout_algebra[torch]'"
        )
        raise _Problem(msg) from None
    return _demo.run(rank=args.rank, verify=args.verify, as_json=args.json, out=out)


# ---------------------------------------------------------------------------------------
# entry point: the one place problems become messages and exit codes


_REMEDY: Final = "give the command somewhere to write"
"""What to do about output that cannot be written."""


def _say(stream: TextIO | None, line: str) -> None:
    """One line on ``stream`` (stderr); a stream that cannot take it is left alone."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(line + "\n")
        stream.flush()


def _tolerant(stream: TextIO | None) -> None:
    """Characters the terminal cannot encode are written as ``\\uXXXX``, not refused."""
    if isinstance(stream, io.TextIOWrapper):
        with contextlib.suppress(OSError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def _silence_stdout() -> None:
    """Point stdout's descriptor at devnull, so the interpreter's last flush of what could
    not be written does not fail again (after a broken pipe or a full disk)."""
    with contextlib.suppress(OSError, ValueError):
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else 1
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def _unwritten(error: OSError | ValueError) -> str:
    """Stdout silenced after ``error`` failed a write to it, and the message saying so."""
    reason = (error.strerror if isinstance(error, OSError) else None) or str(error)
    _silence_stdout()
    return f"cannot write the output: {reason}; {_REMEDY}"


def _deliver(text: str) -> None:
    """Write the command's output to stdout, all at once.

    Raises:
        _Problem: stdout is closed or cannot take the output (a full disk).
        BrokenPipeError: the reader went away (``show t.json | head``).
    """
    if not text:
        return
    out = sys.stdout
    if out is None:
        msg = f"cannot write the output: stdout is closed; {_REMEDY}"
        raise _Problem(msg)
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        raise _Problem(_unwritten(e)) from None


def _refuse(err: TextIO | None, problem: _Problem, command: str) -> int:
    """Say ``problem`` on ``err`` in one line; its exit status (2 for a usage error)."""
    if isinstance(problem, _Usage):  # as argparse's own usage errors read
        prog = f"{PROG} {command}"
        _say(err, f"{prog}: {escape(clip(str(problem), _MAX_USAGE_CHARS))}; see {prog} --help")
        return 2
    if not isinstance(problem, _Reported):
        _say(err, f"{PROG}: {escape(str(problem))}")
    return 1


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    commands: dict[str, Callable[[], int]] = {
        "show": lambda: _show(args, out),
        "diff": lambda: _diff(args, out),
        "check": lambda: _check(args, out, err),
        "table": lambda: _table(args, out, err),
        "draw": lambda: _draw(args, out),
        "lint": lambda: _lint(args, out, err),
        "reshard": lambda: _reshard(args, out, err),
        "demo": lambda: _demo(args, out),
    }
    return commands[args.command]()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of a usage error (2) or of ``--help``."""
    raw: object = argv
    if raw is not None and (
        not isinstance(raw, Sequence)
        or isinstance(raw, str | bytes)
        or not all(type(a) is str and "\0" not in a for a in raw)
    ):  # only a caller in Python can pass these
        what = f"the arguments must be a sequence of strings without NUL, got {quote(raw)}"
        _say(sys.stderr, f"{PROG}: {escape(what)}")
        return 2
    try:
        return _parser().parse_args(argv)
    except SystemExit as e:  # argparse exits on usage errors (2) and after --help (0)
        code = e.code if isinstance(e.code, int) else 2
    except BrokenPipeError:  # `layout-algebra --help | head`: no problem
        _silence_stdout()
        return 0
    except (OSError, ValueError) as e:  # --help to a closed or full stdout
        _say(sys.stderr, f"{PROG}: {_unwritten(e)}")
        return 1
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()
        _say(sys.stderr, f"{PROG}: cannot write the output")
        return 1
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); the exit status.

    0 on success (``diff``: the tables are equal), 1 on a layout problem (``diff``: they
    differ; also input too large to read and output that cannot be written), 2 on a
    usage error. Problems are one line on stderr, never a traceback.
    """
    _tolerant(sys.stdout)
    _tolerant(sys.stderr)
    args = _parse(argv)
    if isinstance(args, int):
        return args
    err = sys.stderr
    buffer = io.StringIO()
    try:
        code = _dispatch(args, buffer, err)
        _deliver(buffer.getvalue())
    except _Problem as e:
        return _refuse(err, e, args.command)
    except LayoutError as e:
        _say(err, f"{PROG}: {escape(e.message)}")
        return 1
    except BrokenPipeError:
        # `layout-algebra show t.json | head`: the reader stopped, which is no problem
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        _say(err, f"{PROG}: interrupted")
        return 130
    return code
