"""Pictures of a layout: which rank of a mesh holds which block of one parameter.

``draw(layout, global_shape, mesh_sizes)`` returns the text the command line's ``draw``
prints: an ASCII grid of the parameter's blocks, each cell listing the ranks holding it,
and a table of every rank's coordinate, local shape, offset and the runs it holds. It is
pure (no torch, no I/O), so a notebook can print it as well as the command line.

The work is bounded by what is printed: a mesh of more ranks, a picture of more cells,
or strided shards of more pieces than a page can show are refused up front with a
``LayoutError``. The module also holds the mesh's spelling in a picture (``mesh_str``),
which the command line shares.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from layout_algebra._args import MAX_NDIM, as_shape, plain_str
from layout_algebra._shards import Runs, check_dims, check_layout, shape_and_offset, shard_dim_of
from layout_algebra._text import clip, columns, escape, quote
from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import compose_fsdp, fsdp_storage_runs, split_fsdp
from layout_algebra.geometry import local_runs
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh, as_mesh, coordinates
from layout_algebra.placements import StridedShard, format_placement

__all__ = ["draw"]

MAX_DRAW_RANKS: Final = 4096
"""``draw`` lists every rank of the mesh (64 x 64 ranks at most); beyond it refuses."""

MAX_DRAW_CELLS: Final = 65536
"""The most cells a picture may have (256 x 256 blocks)."""

MAX_DRAW_WORK: Final = 2**18
"""The most pieces strided shards may cut a parameter into, over all ranks: a strided
shard cuts its dim into ``split_factor`` pieces on every rank."""

_PICTURE_DIMS: Final = 2


def mesh_str(sizes: Mapping[str, int]) -> str:
    """A mesh as the command line prints it: ``(dp_shard=2, tp=4)``."""
    return "(" + ", ".join(f"{a}={n}" for a, n in sizes.items()) + ")"


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


def _segments(size: int, held: Iterable[Sequence[range]]) -> list[range]:
    """The dim ``[0, size)`` cut at every boundary of every rank's runs, in order."""
    cuts = {0, size}
    for runs in held:
        for run in runs:
            cuts.update((run.start, run.stop))
    points = sorted(cuts)
    return [range(lo, hi) for lo, hi in itertools.pairwise(points) if lo < hi]


def _covered(runs: Sequence[range], first: Mapping[int, int]) -> list[int]:
    """The indices of the segments ``runs`` cover; ``first`` maps a cut to its segment."""
    out: list[int] = []
    for run in runs:
        out.extend(range(first[run.start], first[run.stop]))
    return out


def _bands(widths: Sequence[int], lead: int, width: int | None) -> list[range]:
    """The columns of each band of a grid whose lines fit in ``width`` characters, each
    column taking its width and one rule, after ``lead``; a band holds at least one."""
    bands: list[range] = []
    start, used = 0, lead
    for j, w in enumerate(widths):
        if width is not None and j > start and used + w + 1 > width:
            bands.append(range(start, j))
            start, used = j, lead
        used += w + 1
    bands.append(range(start, len(widths)))
    return bands


def _grid(
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    cells: Sequence[Sequence[str]],
    width: int | None = None,
) -> list[str]:
    """An ASCII box per cell, column labels above, row labels on the left; the columns a
    line of ``width`` cannot hold continue below, in bands a blank line apart."""
    widths = [
        max([len(col_labels[j]), *(len(row[j]) for row in cells)]) + 2
        for j in range(len(col_labels))
    ]
    margin = max((len(label) for label in row_labels), default=0)
    pad = " " * (margin + 1 if margin else 0)
    lines: list[str] = []
    for band in _bands(widths, len(pad) + 1, width):
        if lines:
            lines.append("")
        shown = [widths[j] for j in band]
        rule = pad + "+" + "+".join("-" * w for w in shown) + "+"
        labels = (col_labels[j].center(widths[j]) for j in band)
        lines.append((pad + " " + " ".join(labels)).rstrip())
        lines.append(rule)
        for label, row in zip(row_labels, cells, strict=True):
            lead = f"{label:>{margin}} " if margin else ""
            lines.append(lead + "|" + "|".join(row[j].center(widths[j]) for j in band) + "|")
            lines.append(rule)
    return lines


# ---------------------------------------------------------------------------------------
# checks: what cannot be drawn is refused before any work


def _check_args(
    layout: object,
    global_shape: object,
    mesh_sizes: object,
    fqn: object,
    fsdp: object,
    *,
    width: object,
) -> tuple[tuple[int, ...], Mesh, str, str | None]:
    """The arguments checked: the shape, the sizes, and ``fqn`` and ``fsdp`` as plain text
    (a ``str`` subclass's own methods never run)."""
    check_layout(layout)  # type: ignore[arg-type]  # checked
    if width is not None and (type(width) is not int or width < 1):
        msg = (
            "draw: width must be an int >= 1 (the characters a line takes) or None, got "
            f"{quote(width)}"
        )
        raise LayoutError(msg)
    if not isinstance(fqn, str):
        msg = f"draw: fqn must be a string, got {quote(fqn)}"
        raise LayoutError(msg)
    if fsdp is not None and not isinstance(fsdp, str):
        msg = f"draw: fsdp must be an axis name or None, got {quote(fsdp)}"
        raise LayoutError(msg)
    name = plain_str(fqn)
    shape = as_shape(global_shape, "global_shape", fqn=name)  # type: ignore[arg-type]  # checked
    if not shape:
        msg = (
            f"{clip(escape(name))}: shape {quote(shape)} has 0 dims; a parameter has 1 to "
            f"{MAX_NDIM}, give its real shape"
        )
        raise LayoutError(msg, fqn=name)
    mesh = as_mesh(mesh_sizes)  # type: ignore[arg-type]  # checked
    if mesh.size > MAX_DRAW_RANKS:
        msg = (
            f"--mesh {clip(mesh_str(mesh))} has {mesh.size} ranks; draw lists every rank and "
            f"prints at most {MAX_DRAW_RANKS}: draw the parameter on a smaller mesh"
        )
        raise LayoutError(msg)
    return shape, mesh, name, None if fsdp is None else plain_str(fsdp)


def _composed(layout: SourceLayout, fqn: str, mesh: Mesh, fsdp: str | None) -> SourceLayout:
    drawn = layout
    if fsdp is not None:
        if fsdp not in mesh:
            msg = (
                f"--fsdp {clip(escape(fsdp))}: no such axis in --mesh {clip(mesh_str(mesh))}; "
                "name one of its axes"
            )
            raise LayoutError(msg, axis=fsdp)
        drawn = compose_fsdp(layout, shard_axis=fsdp, mesh_sizes=mesh)
    missing = [a.name for a in drawn.axes if a.name not in mesh]
    if missing:
        msg = (
            f"{clip(escape(fqn))}: {clip(str(drawn))} uses axis {clip(missing[0])!r}, which "
            f"--mesh {clip(mesh_str(mesh))} lacks; add {clip(missing[0])}=N to --mesh"
        )
        raise LayoutError(msg, fqn=fqn, axis=missing[0])
    return drawn


def _pictured_dims(layout: SourceLayout, shape: tuple[int, ...], fqn: str) -> tuple[int, ...]:
    """The dims the picture shows: every dim of a 1-D or 2-D parameter, else the sharded
    ones (at least one: dim 0 when none is sharded)."""
    try:
        check_dims(layout, len(shape), shape=shape)
    except LayoutError as e:
        msg = f"{clip(escape(fqn))}: {e.message}"
        raise LayoutError(msg, fqn=fqn, axis=e.axis, placement=e.placement) from None
    sharded = sorted({d for p in layout.placements if (d := shard_dim_of(p)) is not None})
    if len(shape) <= _PICTURE_DIMS:
        return tuple(range(len(shape)))
    if len(sharded) > _PICTURE_DIMS:
        msg = (
            f"{clip(escape(fqn))}: {clip(str(layout))} shards {len(sharded)} dims "
            f"{tuple(sharded)}; a picture shows at most {_PICTURE_DIMS}: draw a layout that "
            "shards one or two dims"
        )
        raise LayoutError(msg, fqn=fqn)
    return tuple(sharded) or (0,)


def _check_pieces(layout: SourceLayout, mesh: Mesh, fqn: str) -> None:
    """Each strided shard cuts its dim into ``split_factor`` pieces on every rank: refuse
    a layout whose pieces, over all ranks, are more than ``MAX_DRAW_WORK``."""
    pieces = mesh.size
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if isinstance(p, StridedShard):
            pieces *= p.split_factor
            if pieces > MAX_DRAW_WORK:
                msg = (
                    f"{clip(escape(fqn))}: {format_placement(p)} on axis {clip(axis.name)!r} in "
                    f"{clip(str(layout))} "
                    f"cuts dim {p.dim} into {p.split_factor} pieces on each of "
                    f"{mesh.size} ranks; draw prints at most {MAX_DRAW_WORK} "
                    "pieces: draw it on a smaller mesh or with a smaller split factor"
                )
                raise LayoutError(msg, fqn=fqn, axis=axis.name, placement=format_placement(p))


# ---------------------------------------------------------------------------------------
# the picture


def draw(
    layout: SourceLayout,
    global_shape: Iterable[int],
    mesh_sizes: Mesh | Mapping[str, int],
    *,
    fqn: str = "<param>",
    fsdp: str | None = None,
    width: int | None = None,
) -> str:
    """A picture of which rank holds which block of one parameter.

    Every coordinate of ``mesh_sizes`` is a rank, numbered row-major over its axes in
    order. The parameter is cut at every boundary of every rank's shard; each cell of the
    grid lists the ranks holding it. A 1-D or 2-D parameter is pictured whole; one of
    more dims (a 3-D expert weight) by its sharded dims, at most two, the others held
    whole by every rank. Ranks whose shard is empty are not drawn but named below the
    picture (2 rows ``S(0)`` over 4 ranks: ranks 2 and 3 hold nothing), followed by every
    rank's local shape, offset and the runs it holds of every dim, as DTensor reads the
    layout. Where FSDP2 really keeps other indices (source axes sharding FSDP's dim
    unevenly, ``fsdp.fsdp_storage_runs``), those ranks follow, marked, with what it keeps.

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
        layout: the parameter's layout (a source layout, one FSDP already composed, or
            a plain parameter's ``SourceLayout(mesh, (), ())``).
        global_shape: the parameter's shape.
        mesh_sizes: the world mesh, every axis of the layout included, by axis in order;
            an axis the layout lacks replicates the parameter over it.
        fqn: the parameter's name, for the title and the messages (shown escaped).
        fsdp: an axis of ``mesh_sizes`` FSDP2 shards over: the layout is first composed
            with it (``compose_fsdp``), showing the strided shards FSDP makes.
        width: the most characters a line of the grid may take (a terminal's columns):
            the columns beyond it continue below, in bands a blank line apart (128
            experts over ``ep=128`` are 128 columns). ``None``: one band, however wide.

    Returns:
        The picture, lines joined by newlines, no trailing newline.

    Raises:
        LayoutError: an argument of the wrong type (a ``width`` below 1 included), a
            layout axis missing from ``mesh_sizes``, a layout that does not fit the
            shape, more than two sharded dims, or a picture too large to print: more
            than ``MAX_DRAW_RANKS`` ranks, ``MAX_DRAW_CELLS`` cells or ``MAX_DRAW_WORK``
            pieces.
    """
    shape, mesh, fqn, fsdp = _check_args(layout, global_shape, mesh_sizes, fqn, fsdp, width=width)
    drawn = _composed(layout, fqn, mesh, fsdp)
    dims = _pictured_dims(drawn, shape, fqn)
    _check_pieces(drawn, mesh, fqn)

    coords = list(coordinates(mesh))
    held = [local_runs(shape, drawn, mesh, c) for c in coords]
    placed = [shape_and_offset(rank_runs, shape) for rank_runs in held]
    present = [r for r, (local, _) in enumerate(placed) if all(local)]
    empty = [r for r, (local, _) in enumerate(placed) if not all(local)]

    segments = [_segments(shape[d], (held[r][d] for r in present)) for d in dims]
    cells = math.prod(map(len, segments))
    if cells > MAX_DRAW_CELLS:
        shown = " x ".join(str(len(s)) for s in segments)
        msg = (
            f"{clip(escape(fqn))}: the picture of {clip(str(drawn))} on --mesh "
            f"{clip(mesh_str(mesh))} would have "
            f"{shown} cells; draw prints at most {MAX_DRAW_CELLS}: draw it on a smaller mesh"
        )
        raise LayoutError(msg, fqn=fqn)
    firsts = [
        {seg.start: i for i, seg in enumerate(segs)} | {shape[d]: len(segs)}
        for d, segs in zip(dims, segments, strict=True)
    ]
    holders: dict[tuple[int, ...], list[int]] = {}
    for r in present:
        covered = [_covered(held[r][d], first) for d, first in zip(dims, firsts, strict=True)]
        for cell in itertools.product(*covered):
            holders.setdefault(cell, []).append(r)

    lines = [f"{escape(fqn)}: shape {shape} on mesh {mesh_str(mesh)}"]
    if fsdp is not None:
        lines.append(f"  source layout {layout}, with FSDP over {fsdp!r}: {drawn}")
    else:
        lines.append(f"  layout {drawn}")
    lines.append(
        f"  rank = row-major index over ({', '.join(mesh)}); cells list the ranks holding them"
    )
    if len(shape) > _PICTURE_DIMS:
        whole = [d for d in range(len(shape)) if d not in dims]
        shown_dims = " and ".join(str(d) for d in dims)
        lines.append(
            f"  the picture shows dim{'s' if len(dims) > 1 else ''} {shown_dims} of {len(shape)}; "
            f"every rank holds dim{'s' if len(whole) > 1 else ''} "
            f"{', '.join(map(str, whole))} whole (the table below lists every dim)"
        )
    if len(dims) == 2:
        lines.append(f"  rows down{_of(dims[0], shape)}, columns across{_of(dims[1], shape)}")
    lines = _wrapped(lines, width)
    lines.append("")
    if not present:
        lines.append(f"(shape {shape} has no elements: nothing to draw)")
    else:
        lines.extend(_picture(segments, holders, width))
        if empty:
            local = ", ".join(sorted({str(placed[r][0]) for r in empty}))
            not_drawn = (
                f"not drawn: rank{'s' if len(empty) != 1 else ''} {_ranks_str(empty)} "
                f"hold{'s' if len(empty) == 1 else ''} an empty shard (local shape {local})"
            )
            lines.extend(_wrapped([not_drawn], width))
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
    lines.extend(columns([header, *table_rows]))
    lines.extend(_storage_lines(_fsdp_kept(drawn, shape, mesh, coords, fsdp), held))
    return "\n".join(lines)


def _storage_lines(
    kept: Sequence[tuple[Runs, ...]] | None, held: Sequence[tuple[Runs, ...]]
) -> list[str]:
    """FSDP2's real storage beside DTensor's reading, on the ranks where they differ
    (nothing when they agree everywhere, as they do unless source axes shard FSDP's dim
    unevenly)."""
    if kept is None:
        return []
    differ = [r for r, (k, h) in enumerate(zip(kept, held, strict=True)) if k != h]
    if not differ:
        return []
    rows = [[f"{r} *", " x ".join(_runs_str(runs) or "[]" for runs in kept[r])] for r in differ]
    return [
        "",
        f"* FSDP2 keeps other indices than DTensor's reading above on rank"
        f"{'s' if len(differ) != 1 else ''} {_ranks_str(differ)}: training is right, a "
        "distributed checkpoint of it is not (`lint` explains)",
        *columns([["rank", "FSDP2 keeps"], *rows]),
    ]


def _fsdp_kept(
    drawn: SourceLayout,
    shape: tuple[int, ...],
    mesh: Mesh,
    coords: Sequence[Mapping[str, int]],
    fsdp: str | None,
) -> list[tuple[Runs, ...]] | None:
    """What FSDP2 really keeps on each rank (``fsdp_storage_runs``), or ``None`` when
    FSDP does not shard the drawn layout (or it is not one ``fully_shard`` makes)."""
    owned = FSDP_OWNED_AXES if fsdp is None else FSDP_OWNED_AXES | {fsdp}
    try:
        if split_fsdp(drawn, mesh, owned=owned).shard is None:
            return None
        return [fsdp_storage_runs(shape, drawn, mesh, c, owned=owned) for c in coords]
    except LayoutError:
        return None


def _wrapped(lines: Sequence[str], width: int | None) -> list[str]:
    """Prose ``lines`` broken at spaces to fit ``width``, never inside brackets (a layout,
    a shape or a mesh stays whole, even when wider), the rest of a broken line indented
    two spaces more than its start."""
    if width is None:
        return list(lines)
    out: list[str] = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
        broken = textwrap.wrap(
            _unbreakable(line),
            width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.extend(part.replace(_KEPT_SPACE, " ") for part in broken or [line])
    return out


_KEPT_SPACE: Final = "\0"
"""A space no line may break at (never in a line: ``escape`` spells a NUL ``\\x00``)."""


def _unbreakable(line: str) -> str:
    """``line`` with the spaces inside brackets and parentheses as ``_KEPT_SPACE``."""
    depth = 0
    kept: list[str] = []
    for c in line:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth = max(depth - 1, 0)
        kept.append(_KEPT_SPACE if c == " " and depth else c)
    return "".join(kept)


def _picture(
    segments: Sequence[Sequence[range]],
    holders: Mapping[tuple[int, ...], list[int]],
    width: int | None,
) -> list[str]:
    """The grid: one row per segment of the first dim pictured (one row for a single
    dim), one column per segment of the last, each cell naming its holders; wrapped to
    ``width``."""
    if len(segments) == 1:
        rows: list[range | None] = [None]
        cols = segments[0]
    else:
        rows = list(segments[0])
        cols = segments[1]
    grid = [
        [
            _ranks_str(holders.get((j,) if row is None else (i, j), ())) or "-"
            for j in range(len(cols))
        ]
        for i, row in enumerate(rows)
    ]
    row_labels = ["" if r is None else _span_str(r) for r in rows]
    return _grid(row_labels, [_span_str(c) for c in cols], grid, width)


def _of(dim: int, shape: tuple[int, ...]) -> str:
    return f" (dim {dim})" if len(shape) > _PICTURE_DIMS else ""
