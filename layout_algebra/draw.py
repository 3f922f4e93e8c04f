"""Pictures of a layout: which rank of a mesh holds which block of one parameter.

``draw(layout, global_shape, mesh_sizes)`` returns the text the command line's ``draw``
prints: an ASCII grid of the parameter's blocks, each cell listing the ranks holding it,
and a table of every rank's coordinate, local shape, offset and the runs it holds. It is
pure (no torch, no I/O), so a notebook can print it as well as the command line.

The module also holds the text helpers the command line shares: the mesh's coordinates
in rank order (``mesh_coordinates``), a mesh's spelling (``mesh_str``) and left-aligned
columns (``columns``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from layout_algebra.errors import LayoutError
from layout_algebra.geometry import compose_fsdp, local_runs, local_shape_and_offset
from layout_algebra.layout import SourceLayout

__all__ = ["MAX_DRAW_RANKS", "columns", "draw", "mesh_coordinates", "mesh_str"]

MAX_DRAW_RANKS: Final = 65536
"""``draw`` enumerates every rank of the mesh; beyond this many it refuses."""

_MAX_DRAW_DIMS: Final = 2


def mesh_str(sizes: Mapping[str, int]) -> str:
    """A mesh as the command line prints it: ``(dp_shard=2, tp=4)``."""
    return "(" + ", ".join(f"{a}={n}" for a, n in sizes.items()) + ")"


def mesh_coordinates(sizes: Mapping[str, int]) -> Iterator[dict[str, int]]:
    """Every coordinate of a mesh in rank order: row-major over its axes as given.

    ``{"dp": 2, "tp": 2}`` gives ranks 0-3 at ``dp=0, tp=0``, ``dp=0, tp=1``,
    ``dp=1, tp=0``, ``dp=1, tp=1``.
    """
    names = list(sizes)
    for index in itertools.product(*(range(n) for n in sizes.values())):
        yield dict(zip(names, index, strict=True))


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as lines of left-aligned columns two spaces apart, right-stripped."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


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


def _composed(
    layout: SourceLayout, fqn: str, mesh_sizes: Mapping[str, int], fsdp: str | None
) -> SourceLayout:
    drawn = layout
    if fsdp is not None:
        if fsdp not in mesh_sizes:
            msg = (
                f"--fsdp {fsdp}: no such axis in --mesh {mesh_str(mesh_sizes)}; "
                "name one of its axes"
            )
            raise LayoutError(msg, axis=fsdp)
        drawn = compose_fsdp(layout, shard_axes=(fsdp,), mesh_sizes=mesh_sizes)
    missing = [a.name for a in drawn.axes if a.name not in mesh_sizes]
    if missing:
        msg = (
            f"{fqn}: {drawn} uses axis {missing[0]!r}, which --mesh {mesh_str(mesh_sizes)} "
            f"lacks; add {missing[0]}=N to --mesh"
        )
        raise LayoutError(msg, fqn=fqn, axis=missing[0])
    return drawn


def draw(
    layout: SourceLayout,
    global_shape: Sequence[int],
    mesh_sizes: Mapping[str, int],
    *,
    fqn: str = "<param>",
    fsdp: str | None = None,
) -> str:
    """A picture of which rank holds which block of one parameter.

    Every coordinate of ``mesh_sizes`` is a rank, numbered row-major over its axes in
    order. The parameter's 1-D or 2-D extent is cut at every boundary of every rank's
    shard; each cell lists the ranks holding it. Ranks whose shard is empty are not
    drawn but named below the picture (2 rows ``S(0)`` over 4 ranks: ranks 2 and 3 hold
    nothing), followed by every rank's local shape, offset and the runs it holds.

    >>> from layout_algebra import Shard
    >>> print(draw(SourceLayout("dense", ["tp"], [Shard(0)]), (4,), {"tp": 2}, fqn="w"))
    w: shape (4,) on mesh (tp=2)
      layout dense[tp=S(0)]
      rank = row-major index over (tp); cells list the ranks holding them
    <BLANKLINE>
      0:2   2:4
    +-----+-----+
    |  0  |  1  |
    +-----+-----+
    <BLANKLINE>
    rank  tp  local shape  offset  holds
    0     0   (2,)         (0,)    [0:2]
    1     1   (2,)         (2,)    [2:4]

    Args:
        layout: the parameter's layout (a source layout, or one FSDP already composed).
        global_shape: the parameter's shape.
        mesh_sizes: the world mesh, every axis of the layout included, by axis in order;
            an axis the layout lacks replicates the parameter over it.
        fqn: the parameter's name, for the title and the messages.
        fsdp: an axis of ``mesh_sizes`` FSDP2 shards over: the layout is first composed
            with it (``compose_fsdp``), showing the strided shards FSDP makes.

    Returns:
        The picture, lines joined by newlines, no trailing newline.

    Raises:
        LayoutError: a layout axis missing from ``mesh_sizes``, a layout that does not fit
            the shape, more than two dims or more than ``MAX_DRAW_RANKS`` ranks.
    """
    shape = tuple(global_shape)
    if len(shape) > _MAX_DRAW_DIMS or not shape:
        msg = (
            f"{fqn}: shape {shape} has {len(shape)} dims; draw pictures 1-D and "
            "2-D parameters only, give --shape with one or two sizes"
        )
        raise LayoutError(msg, fqn=fqn)
    total = math.prod(mesh_sizes.values())
    if total > MAX_DRAW_RANKS:
        msg = (
            f"--mesh {mesh_str(mesh_sizes)} has {total} ranks; draw enumerates at most "
            f"{MAX_DRAW_RANKS}"
        )
        raise LayoutError(msg)
    drawn = _composed(layout, fqn, mesh_sizes, fsdp)

    coords = list(mesh_coordinates(mesh_sizes))
    held = [local_runs(shape, drawn, mesh_sizes, c) for c in coords]
    placed = [local_shape_and_offset(shape, drawn, mesh_sizes, c) for c in coords]
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

    lines = [f"{fqn}: shape {shape} on mesh {mesh_str(mesh_sizes)}"]
    if fsdp is not None:
        lines.append(f"  source layout {layout}, with FSDP over {fsdp!r}: {drawn}")
    else:
        lines.append(f"  layout {drawn}")
    lines.append(
        f"  rank = row-major index over ({', '.join(mesh_sizes)}); "
        "cells list the ranks holding them"
    )
    if len(shape) == 2:
        lines.append("  rows down, columns across")
    lines.append("")
    if not present:
        lines.append(f"(shape {shape} has no elements: nothing to draw)")
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
    header = ["rank", *mesh_sizes, "local shape", "offset", "holds"]
    table_rows = [
        [
            str(r),
            *(str(c[a]) for a in mesh_sizes),
            str(placed[r][0]),
            str(placed[r][1]),
            " x ".join(_runs_str(runs) or "[]" for runs in held[r]),
        ]
        for r, c in enumerate(coords)
    ]
    lines.extend(columns([header, *table_rows]))
    return "\n".join(lines)
