"""Argument types: each refuses what it cannot hold with a usage error (exit 2, one line).

A type reads the text of one option into the package's own value (a ``Mesh``, a shape,
axis names) or says, in the words of the value's own check, why it cannot.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Final, NoReturn

from layout_algebra._args import MAX_NDIM, MAX_TENSOR_SIZE
from layout_algebra._text import clip, escape
from layout_algebra.activations import CHECKPOINTING, MAX_TOKENS
from layout_algebra.axes import FSDP_OWNED_AXES, as_axis
from layout_algebra.cli._output import MAX_USAGE_CHARS
from layout_algebra.errors import LayoutError
from layout_algebra.mesh import Mesh
from layout_algebra.shapes import as_dtype
from layout_algebra.training import Training, parse_bytes

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = [
    "DEMO_WORLD_SIZE",
    "Parser",
    "add_owned_arguments",
    "axes_arg",
    "axis_arg",
    "bounded_int",
    "fsdp_arg",
    "mesh_arg",
    "owned_axes",
    "rank_arg",
    "shape_arg",
]

DEMO_WORLD_SIZE: Final = 8
"""The ranks of the demo's simulated world."""

_DIGITS: Final = re.compile(r"[0-9]+", re.ASCII)


def bounded_int(text: str, limit: int, what: str, *, low: int = 0) -> int:
    """``text`` as an int of plain ASCII digits (no sign, no spaces) from ``low`` to
    ``limit``."""
    if _DIGITS.fullmatch(text) is None:
        msg = f"{clip(text)!r}: {what} is written in plain digits 0-9, e.g. 4"
        raise argparse.ArgumentTypeError(msg)
    if len(text) > len(str(limit)) or int(text) > limit:
        msg = f"{clip(text)!r}: {what} is at most {limit}"
        raise argparse.ArgumentTypeError(msg)
    if int(text) < low:
        msg = f"{clip(text)!r}: {what} is at least {low}"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def mesh_arg(text: str) -> Mesh:
    """The mesh ``text`` spells as ``Mesh.parse`` reads it: ``"dp_shard=2,tp=4"``.

    Raises:
        argparse.ArgumentTypeError: what ``Mesh.parse`` refuses, in its words.
    """
    if not text.strip():  # Mesh.parse reads it as the mesh of no axes; here it is a slip
        msg = "the mesh is empty; give its axes as axis=size pairs, e.g. dp_shard=8,tp=4"
        raise argparse.ArgumentTypeError(msg)
    try:
        return Mesh.parse(text)
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def shape_arg(text: str) -> tuple[int, ...]:
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
    return tuple(bounded_int(p, MAX_TENSOR_SIZE, "a tensor size") for p in parts)


def axis_arg(text: str) -> str:
    """One axis name."""
    try:
        return as_axis(text).name
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def axes_arg(text: str) -> tuple[str, ...]:
    """Axis names separated by commas (``""``: none): ``"dp,pp"`` → ``("dp", "pp")``."""
    if not text.strip():
        return ()
    names: list[str] = []
    for part in text.split(","):
        try:
            names.append(as_axis(part.strip()).name)
        except LayoutError as e:
            raise argparse.ArgumentTypeError(f"{clip(text)!r}: {e.message}") from None
    return tuple(names)


def fsdp_arg(text: str) -> str | tuple[str, str]:
    """``AXIS`` (FSDP) or ``REPLICATE,SHARD`` (HSDP)."""
    names = [part.strip() for part in text.split(",")]
    if len(names) > 2:
        msg = f"{clip(text)!r}: give FSDP's shard axis, or REPLICATE,SHARD for HSDP"
        raise argparse.ArgumentTypeError(msg)
    axes = [axis_arg(name) for name in names]
    return axes[0] if len(axes) == 1 else (axes[0], axes[1])


def rank_arg(text: str) -> int:
    """A rank of the demo's world."""
    if _DIGITS.fullmatch(text) is None or len(text) > 1 or int(text) >= DEMO_WORLD_SIZE:
        msg = f"{clip(text)!r}: the demo's ranks are 0 to {DEMO_WORLD_SIZE - 1}"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def add_owned_arguments(parser: argparse.ArgumentParser) -> None:
    """``--owned AXIS,...`` and ``--also-owned AXIS,...`` on a command that strips FSDP's
    axes; ``owned_axes(args)`` reads them back."""
    parser.add_argument(
        "--owned",
        type=axes_arg,
        default=None,
        metavar="AXIS,...",
        help=(
            "the axes owned by FSDP and pipelining, replacing the default "
            f"({', '.join(sorted(FSDP_OWNED_AXES))}); '' for none"
        ),
    )
    parser.add_argument(
        "--also-owned",
        type=axes_arg,
        default=(),
        metavar="AXIS,...",
        help="axes owned by FSDP or pipelining in addition to --owned (or the default)",
    )


def owned_axes(args: argparse.Namespace) -> frozenset[str]:
    """The owned axes ``--owned`` and ``--also-owned`` give (default ``FSDP_OWNED_AXES``)."""
    base: frozenset[str] = FSDP_OWNED_AXES if args.owned is None else frozenset(args.owned)
    return base | frozenset(args.also_owned)


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line on stderr, as every problem is
    (``--help`` shows the usage), and help that cannot be written to stdout (closed, a
    full disk) raises instead of being dropped with exit 0, as argparse drops it."""

    def error(self, message: str) -> NoReturn:
        # argparse quotes the arguments it did not expect as they are: escaped and bounded
        shown = escape(clip(message, MAX_USAGE_CHARS))
        self.exit(2, f"{self.prog}: {shown}; see {self.prog} --help\n")

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        text = self.format_help()
        if file is not None:
            file.write(text)
            return
        out = sys.stdout  # None when its descriptor is closed
        if out is None:
            msg = "stdout is closed"
            raise ValueError(msg)
        out.write(text)
        out.flush()  # a full disk says so here, not at exit


def dtype_arg(text: str) -> str:
    """A dtype by torch's name (``bfloat16``) or safetensors' code (``BF16``)."""
    try:
        return as_dtype(text)
    except LayoutError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def bytes_arg(text: str) -> int:
    """A byte count such as ``80GiB`` (``parse_bytes``: worked out exactly, a fraction of
    a byte dropped, at most 64 digits)."""
    try:
        return parse_bytes(text, _SIZE)
    except LayoutError as e:  # argparse names the option: the message's own name goes
        raise argparse.ArgumentTypeError(e.message.removeprefix(f"{_SIZE}: ")) from None


_SIZE: Final = "size"


def patterns_arg(text: str) -> tuple[str, ...]:
    """Module FQN patterns separated by commas: ``"layers.*,layers.*.moe.experts"``; at
    least one, each dotted with no empty segment, none twice (``Training(units=...)``).

    Raises:
        argparse.ArgumentTypeError: an empty or malformed list.
    """
    patterns = tuple(part.strip() for part in text.split(","))
    try:
        Training(units=patterns)  # the one check of unit patterns
    except LayoutError:
        msg = (
            f"{clip(text)!r} is not a list of module patterns; give the modules fully_shard "
            "wraps besides the root, separated by commas, e.g. 'layers.*' or "
            "'layers.*,layers.*.moe.experts' (dotted, no empty segment, each once)"
        )
        raise argparse.ArgumentTypeError(msg) from None
    return patterns


def add_trace_arguments(
    parser: argparse.ArgumentParser, *, required: bool, seq_len_help: str
) -> None:
    """The microbatch and checkpointing a trace of the activations runs with (``lint``,
    ``fit`` and ``activations`` read them alike)."""
    parser.add_argument(
        "--seq-len",
        type=lambda text: bounded_int(text, MAX_TOKENS, "--seq-len", low=1),
        required=required,
        default=None,
        metavar="N",
        help=seq_len_help,
    )
    parser.add_argument(
        "--batch",
        type=lambda text: bounded_int(text, MAX_TOKENS, "--batch", low=1),
        default=None,
        metavar="N",
        help="the sequences of one microbatch (default 1)",
    )
    parser.add_argument(
        "--checkpointing",
        choices=list(CHECKPOINTING),
        default=None,
        help=(
            "activation checkpointing of the repeated blocks, as torchtitan applies it: "
            "none (default), full (a block keeps its inputs, recomputed in backward) or "
            "selective (torchtitan's per-op policy)"
        ),
    )
