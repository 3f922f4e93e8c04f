"""Who holds which indices of a tensor: a layout read against a shape and a mesh.

The arithmetic of ``torch.chunk`` over runs of global indices (``chunk_bounds``,
``strided_chunks``, ``take``), ``held_runs`` that applies a layout's placements with it,
and the checks every reader of a layout against a tensor and a mesh shares: the layout
argument (``check_layout``), the dims it shards (``shard_dim_of``, ``split_factor_of``,
``check_dims``), an axis's size (``size_of``) and a rank's index on it (``index_on``).
The public functions built on them live in ``geometry`` and ``fsdp``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias, assert_never

from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisName
from layout_algebra.errors import LayoutError
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)

__all__ = [
    "Runs",
    "check_dims",
    "check_layout",
    "chunk_bounds",
    "held_runs",
    "index_on",
    "role_mesh",
    "shape_and_offset",
    "shard_dim_of",
    "size_of",
    "split_factor_of",
    "strided_chunks",
    "take",
]

MAX_PIECES: Final = 2**20
"""The most pieces a ``StridedShard`` may cut one dim into for the geometry to follow it."""

Runs: TypeAlias = tuple[range, ...]
"""Ascending, disjoint, non-adjacent runs of global indices along one tensor dim."""


def check_layout(layout: SourceLayout, fqn: str | None = None, *, arg: str = "layout") -> None:
    """The one check that an argument (or a field) named ``arg`` is a ``SourceLayout``."""
    raw: object = layout
    if not isinstance(raw, SourceLayout):
        who = f"{clip(fqn)}: " if fqn else ""
        msg = f"{who}{arg}: expected a SourceLayout such as dense[tp=S(0)], got {quote(raw)}"
        raise LayoutError(msg, fqn=fqn)


def shard_dim_of(placement: Placement) -> int | None:
    """The tensor dim ``placement`` shards (``S(d)`` and ``_S(d, k)`` shard ``d``), or
    ``None`` for ``R`` and ``P``."""
    match placement:
        case Shard(dim) | StridedShard(dim):
            return dim
        case Replicate() | Partial():
            return None
        case _:
            assert_never(placement)


def split_factor_of(placement: Placement) -> int:
    """The pieces ``placement`` cuts its dim into before chunking: ``k`` for ``_S(d, k)``,
    1 for any other placement."""
    return placement.split_factor if isinstance(placement, StridedShard) else 1


def check_dims(
    layout: SourceLayout,
    ndim: int,
    fqn: str | None = None,
    *,
    shape: tuple[int, ...] | None = None,
) -> None:
    """The one check that every placement of ``layout`` shards a dim a tensor of ``ndim``
    dims has: ``S(1)`` on a 1-D tensor, or any shard of a 0-d one, is refused. ``shape``,
    when known, is shown in the message.

    Raises:
        LayoutError: naming the axis, the placement (and ``fqn``).
    """
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        dim = shard_dim_of(p)
        if dim is not None and dim >= ndim:
            shown = format_placement(p)
            who = f"{clip(fqn)}: " if fqn else ""
            tensor = "the tensor" if shape is None else f"shape {clip(str(shape))}"
            fix = f"shard a dim below {ndim}" if ndim else "replicate it (R) on that axis"
            msg = (
                f"{who}{clip(str(layout))}: {shown} on axis {clip(axis.name)!r} shards dim "
                f"{dim}, but {tensor} has {ndim} dim{'s' if ndim != 1 else ''}; {fix}"
            )
            raise LayoutError(msg, fqn=fqn, axis=axis.name, placement=shown)


def size_of(
    sizes: Mapping[str, int],
    axis: AxisName,
    layout: SourceLayout | None = None,
    fqn: str | None = None,
) -> int:
    """The size of ``axis`` (of ``layout``) in checked ``sizes``; the one "no size" message."""
    size = sizes.get(axis.name)
    if size is None:
        who = f"{clip(fqn)}: " if fqn else ""
        of = f" of {clip(str(layout))}" if layout is not None else ""
        msg = (
            f"{who}mesh_sizes has no size for axis {clip(axis.name)!r}{of} "
            f"(it has {clip(str(sorted(sizes)))}); give mesh_sizes={{{clip(axis.name)!r}: n, "
            "...} or fix the axis name"
        )
        raise LayoutError(msg, fqn=fqn, axis=axis.name)
    return size


def role_mesh(
    meshes: Mapping[str, Mesh],
    layout: SourceLayout,
    arg: str = "mesh_sizes",
    fqn: str | None = None,
) -> Mesh:
    """The mesh of ``layout``'s role in ``meshes`` (given as ``arg``), with a size for every
    axis of the layout: the one check that sizes by role cover a layout.

    Raises:
        LayoutError: ``arg`` has no sizes for the role, or none for an axis of the layout.
    """
    mesh = meshes.get(layout.mesh)
    if mesh is None:
        who = f"{clip(fqn)}: " if fqn else ""
        role = quote(layout.mesh)
        msg = (
            f"{who}{layout} is on mesh role {role}, which {arg} has no sizes for (it has "
            f"{quote(sorted(meshes))}); give {arg}={{{role}: {{axis: n, ...}}, ...}}"
        )
        raise LayoutError(msg, fqn=fqn)
    for axis in layout.axes:
        size_of(mesh, axis, layout, fqn)
    return mesh


def index_on(coordinate: Mapping[str, int], axis: AxisName, size: int) -> int:
    """The index of checked ``coordinate`` on ``axis`` of ``size`` ranks.

    Raises:
        LayoutError: the coordinate has no index on ``axis``, or one outside it.
    """
    index = coordinate.get(axis.name)
    if index is None:
        msg = (
            f"coordinate has no index for axis {clip(axis.name)!r} (it has "
            f"{clip(str(sorted(coordinate)))}); give coordinate={{{clip(axis.name)!r}: i, ...}} "
            f"with 0 <= i < {size}"
        )
        raise LayoutError(msg, axis=axis.name)
    if index >= size:
        msg = (
            f"coordinate[{clip(axis.name)!r}] = {index} is outside the axis of size {size}; "
            f"give 0 <= i < {size}"
        )
        raise LayoutError(msg, axis=axis.name)
    return index


def chunk_bounds(n: int, chunks: int, index: int) -> tuple[int, int]:
    """Bounds of chunk ``index`` when ``torch.chunk`` splits ``n`` items into ``chunks``.

    Chunks are ``ceil(n / chunks)`` long and the tail takes what is left, possibly
    nothing: 10 rows over 4 ranks → 3, 3, 3, 1; 5 over 4 → 2, 2, 1, 0; 2 over 4 → 1, 1, 0, 0.
    """
    size = -(-n // chunks)
    return min(size * index, n), min(size * (index + 1), n)


def strided_chunks(n: int, chunks: int, index: int, split_factor: int) -> list[tuple[int, int]]:
    """Positions chunk ``index`` of ``_S(dim, split_factor)`` over ``chunks`` ranks takes.

    The dim is first cut into ``split_factor`` pieces, each piece is chunked over the
    ranks, and a rank takes its chunk of every piece. 8 rows, ``_S(0, 2)`` over 2 ranks:
    pieces [0, 4) and [4, 8); rank 0 takes [0, 2) and [4, 6), rank 1 [2, 4) and [6, 8).

    The pieces are ``ceil(n / split_factor)`` long but for one shorter tail (and empty
    ones after it), so a rank's chunk is the same in every full piece: found once, and a
    rank that holds nothing of them costs nothing per piece.
    """
    if not n:
        return []
    piece = chunk_bounds(n, split_factor, 0)[1]
    full, tail = divmod(n, piece)
    start, stop = chunk_bounds(piece, chunks, index)
    out = [(p * piece + start, p * piece + stop) for p in range(full)] if start < stop else []
    if tail:
        start, stop = chunk_bounds(tail, chunks, index)
        if start < stop:
            out.append((full * piece + start, full * piece + stop))
    return out


def take(runs: Runs, spans: Iterable[tuple[int, int]]) -> Runs:
    """The global indices at positions ``spans`` of the indices ``runs`` hold, as runs.

    Positions count along the concatenation of ``runs``; ``spans`` ascend, so one pass
    over both suffices.
    """
    out: list[range] = []
    i, pos = 0, 0  # runs[i] starts at position pos
    for start, stop in spans:
        while i < len(runs) and pos + len(runs[i]) <= start:
            pos += len(runs[i])
            i += 1
        j, at = i, pos
        while j < len(runs) and at < stop:
            run = runs[j]
            lo, hi = max(start - at, 0), min(stop - at, len(run))
            if lo < hi:
                first, last = run.start + lo, run.start + hi
                if out and out[-1].stop == first:
                    out[-1] = range(out[-1].start, last)
                else:
                    out.append(range(first, last))
            at += len(run)
            j += 1
    return tuple(out)


def held_runs(
    shape: tuple[int, ...],
    layout: SourceLayout,
    sizes: Mapping[str, int],
    where: Mapping[str, int],
) -> tuple[Runs, ...]:
    """``geometry.local_runs`` of checked arguments (a shape, a mesh, a coordinate)."""
    check_dims(layout, len(shape), shape=shape)
    runs: list[Runs] = [(range(n),) if n else () for n in shape]
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        size = size_of(sizes, axis, layout)
        index = index_on(where, axis, size)
        match p:
            case Shard(dim):
                held = sum(map(len, runs[dim]))
                runs[dim] = take(runs[dim], [chunk_bounds(held, size, index)])
            case StridedShard(dim, split_factor=k):
                held = sum(map(len, runs[dim]))
                if min(k, held) > MAX_PIECES:
                    shown = format_placement(p)
                    msg = (
                        f"{clip(str(layout))}: {shown} on axis {clip(axis.name)!r} cuts dim "
                        f"{dim} ({held:,} items) into {min(k, held):,} pieces, more than the "
                        f"geometry follows ({MAX_PIECES:,}); check the split factor"
                    )
                    raise LayoutError(msg, axis=axis.name, placement=shown)
                runs[dim] = take(runs[dim], strided_chunks(held, size, index, k))
            case Replicate() | Partial():
                pass
            case _:
                assert_never(p)
    return tuple(runs)


def shape_and_offset(
    runs: tuple[Runs, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A rank's local shape and global offset, read off the runs it holds of ``shape``.

    The offset of a dim the rank holds nothing of is the dim's size, as DTensor reports it.
    """
    local = tuple(sum(map(len, dim_runs)) for dim_runs in runs)
    offset = tuple(
        dim_runs[0].start if dim_runs else size for dim_runs, size in zip(runs, shape, strict=True)
    )
    return local, offset
