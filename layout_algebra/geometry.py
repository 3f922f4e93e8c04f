"""FSDP composition and shard geometry: what ``fully_shard`` makes of a layout, and who holds what.

``compose_fsdp`` predicts the placements torch's FSDP2 gives a parameter whose source layout
is known: FSDP's own mesh dims come first, then the source placements. ``local_runs`` and
``local_shape_and_offset`` say which block of the global tensor one rank holds under a
layout, with torch.chunk semantics, as DTensor computes it.

Everything here is pure: mesh sizes and coordinates are plain mappings by axis name, so no
live ``DeviceMesh`` (and no torch) is needed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeAlias, assert_never

import attrs

from layout_algebra._args import MAX_NDIM, as_shape, mapping_items, plain_str
from layout_algebra._text import clip, quote
from layout_algebra.axes import (
    FSDP_OWNED_AXES,
    AxisLike,
    AxisName,
    as_axes,
    as_axis,
    axis_name_set,
    axis_str,
)
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra._frozen import REQUIRED, check_init
from layout_algebra.layout import ByModule, Listed, ParamLayoutTable, SourceLayout, partial_error
from layout_algebra.layout import _CheckedEntries as CheckedEntries
from layout_algebra.placements import (
    MAX_SPLIT_FACTOR,
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)

__all__ = [
    "MAX_FSDP_SOURCE_AXES",
    "FsdpAxes",
    "FsdpParts",
    "Runs",
    "compose_fsdp",
    "compose_table",
    "fsdp_storage_runs",
    "local_runs",
    "local_shape_and_offset",
    "split_fsdp",
]

MAX_FSDP_SOURCE_AXES: Final = 2
"""FSDP2 composes 1-D TP/EP or 2-D EP+TP source layouts, nothing wider."""

MAX_MESH_SIZE: Final = 2**20
"""The largest size of one mesh axis the geometry takes (a million ranks)."""

MAX_PIECES: Final = 2**20
"""The most pieces a ``StridedShard`` may cut one dim into for the geometry to follow it."""

_REPLICATE: Final = Replicate()

Runs: TypeAlias = tuple[range, ...]
"""Ascending, disjoint, non-adjacent runs of global indices along one tensor dim."""


# ---------------------------------------------------------------------------------------
# arguments


def check_layout(layout: SourceLayout, fqn: str | None = None) -> None:
    """The one check that an argument named ``layout`` is a ``SourceLayout``."""
    raw: object = layout
    if not isinstance(raw, SourceLayout):
        who = f"{clip(fqn)}: " if fqn else ""
        msg = f"{who}layout: expected a SourceLayout such as dense[tp=S(0)], got {quote(raw)}"
        raise LayoutError(msg, fqn=fqn)


def is_mesh_size(value: object, floor: int = 1) -> bool:
    """Whether ``value`` is a mesh size (or coordinate): an int from ``floor`` to
    ``MAX_MESH_SIZE``, never a bool."""
    return type(value) is int and floor <= value <= MAX_MESH_SIZE


def as_sizes(values: Mapping[str, int], what: str, floor: int = 1) -> dict[str, int]:
    """``values`` (an argument named ``what``) keyed by plain axis name, each an int from
    ``floor`` to ``MAX_MESH_SIZE``: the one check of mesh sizes and coordinates."""
    raw: object = values
    if not isinstance(raw, Mapping):
        msg = f"{what} must map axis name to int, such as {{'tp': 2}}, got {quote(raw)}"
        raise LayoutError(msg)
    out: dict[str, int] = {}
    for key, value in mapping_items(values, what, "{'tp': 2}"):
        try:
            name = axis_str(key)
        except LayoutError as e:
            msg = f"{what}: {e.message}"
            raise LayoutError(msg, axis=e.axis) from None
        if not is_mesh_size(value, floor):
            msg = (
                f"{what}[{clip(name)!r}] must be an int from {floor} to {MAX_MESH_SIZE:,}, "
                f"got {quote(value)}"
            )
            raise LayoutError(msg, axis=name)
        out[name] = value
    return out


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


# ---------------------------------------------------------------------------------------
# FSDP composition: one rule per check


def _shard_axis(
    shard_axis: AxisLike | None, shard_axes: Iterable[AxisLike] | None
) -> tuple[AxisName, ...]:
    """FSDP's shard axis from ``shard_axis``, or from the deprecated ``shard_axes``."""
    if shard_axes is not None:
        warnings.warn(
            "compose_fsdp(shard_axes=...) is deprecated: FSDP shards over exactly one axis, "
            "pass it as shard_axis='dp_shard'",
            DeprecationWarning,
            stacklevel=3,
        )
        if shard_axis is not None:
            msg = "compose_fsdp takes shard_axis or the deprecated shard_axes, not both"
            raise LayoutError(msg)
        return as_axes(shard_axes, "shard_axes")
    if shard_axis is None:
        msg = "compose_fsdp needs shard_axis, the mesh axis FSDP shards over (e.g. 'dp_shard')"
        raise LayoutError(msg)
    try:
        return (as_axis(shard_axis),)
    except LayoutError as e:
        msg = f"shard_axis: {e.message}"
        raise LayoutError(msg, axis=e.axis) from None


def _check_fsdp_mesh(shard: tuple[AxisName, ...], replicate: tuple[AxisName, ...]) -> None:
    """``fully_shard`` takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard)."""
    if len(shard) != 1:
        given = [a.name for a in shard]
        msg = (
            f"shard_axes={clip(str(given))}: fully_shard shards over exactly one mesh axis (its "
            "mesh is 1-D, or 2-D for HSDP); pass that one axis as shard_axis='dp_shard', "
            "flattening several data-parallel axes into one mesh axis (e.g. 'dp_shard_cp') first"
        )
        raise LayoutError(msg, axis=given[1] if len(given) > 1 else None)
    if len(replicate) > 1:
        given = [a.name for a in replicate]
        msg = (
            f"replicate_axes={clip(str(given))}: fully_shard replicates over at most one mesh axis "
            "(HSDP's 2-D mesh); flatten them into one mesh axis and pass that"
        )
        raise LayoutError(msg, axis=given[1])


def _check_source_rank(layout: SourceLayout) -> None:
    """FSDP2 takes 1-D TP/EP or 2-D EP+TP source layouts (or a plain tensor)."""
    if len(layout.axes) > MAX_FSDP_SOURCE_AXES:
        extra = layout.axes[MAX_FSDP_SOURCE_AXES]
        msg = (
            f"{layout}: FSDP2 composes 1-D TP/EP or 2-D EP+TP source layouts only (at most "
            f"{MAX_FSDP_SOURCE_AXES} source axes), this one has {len(layout.axes)}; shard the "
            "parameter over at most two non-FSDP axes"
        )
        raise LayoutError(
            msg,
            axis=extra.name,
            placement=format_placement(layout.placement_on(extra)),
        )


def _check_distinct(layout: SourceLayout, fsdp_axes: tuple[AxisName, ...]) -> None:
    """FSDP's axes and the source axes are different axes of the world mesh."""
    seen: set[AxisName] = set()
    for axis in fsdp_axes:
        if axis in seen:
            msg = (
                f"axis {clip(axis.name)!r} is both a replicate and a shard axis of FSDP; "
                "give each data-parallel axis once"
            )
            raise LayoutError(msg, axis=axis.name)
        seen.add(axis)
        if axis in layout.axes:
            shown = format_placement(layout.placement_on(axis))
            msg = (
                f"{clip(str(layout))}: axis {clip(axis.name)!r} is a source axis ({shown}) and "
                "an FSDP axis; FSDP shards over the data-parallel axes the source layout does "
                f"not use: if {clip(axis.name)!r} is FSDP's, build the table with it owned "
                f"(owned=FSDP_OWNED_AXES | {{{clip(axis.name)!r}}})"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)


def _check_parameter(layout: SourceLayout) -> None:
    """A parameter is a whole value: no pending reduction for FSDP to shard."""
    error = partial_error(layout)
    if error is not None:
        raise error


def _check_shard_dim(shard_dim: int) -> None:
    if type(shard_dim) is not int or not 0 <= shard_dim < MAX_NDIM:
        msg = (
            f"shard_dim must be an int from 0 to {MAX_NDIM - 1}, got {quote(shard_dim)}; give "
            "the tensor dim FSDP shards, counted from 0"
        )
        raise LayoutError(msg)


def _shards_dim(p: Placement, dim: int) -> bool:
    match p:
        case Shard(d) | StridedShard(d):
            return d == dim
        case Replicate() | Partial():
            return False
        case _:
            assert_never(p)


def compose_fsdp(
    layout: SourceLayout,
    *,
    shard_axis: AxisLike | None = None,
    replicate_axes: Iterable[AxisLike] = (),
    mesh_sizes: Mapping[str, int],
    shard_dim: int = 0,
    shard_axes: Iterable[AxisLike] | None = None,
) -> SourceLayout:
    """The layout torch's ``fully_shard`` gives a parameter with source layout ``layout``.

    Its axes are ``(*replicate_axes, shard_axis, *layout.axes)`` on the same mesh role;
    its placements are FSDP's own first — ``R`` on the HSDP replicate axis, then
    ``S(shard_dim)`` on the shard axis — followed by the source placements. When source
    axes already shard ``shard_dim``, FSDP shards each source shard further (right to
    left), which DTensor spells ``_S(shard_dim, k)`` with ``k`` the number of source
    shards of that dim: ``tp=2`` on ``S(0)`` and FSDP over ``dp_shard=4`` give
    ``dense[dp_shard=_S(0, 2), tp=S(0)]``.

    These are torch's placements exactly. Where source axes shard ``shard_dim``
    unevenly, DTensor's reading of them (and so ``local_shape_and_offset``'s) can differ
    from the rows FSDP keeps, which are ``torch.chunk`` of each rank's source shard: 5 rows
    on ``ep=2, tp=2`` both ``S(0)``, FSDP over 2 ranks, leave rank (1, 1, 0) no row,
    while ``_S(0, 4)`` gives it one.

    A plain parameter (``SourceLayout(mesh, (), ())``, no source axes) gets FSDP's own
    placements only.

    >>> str(compose_fsdp(SourceLayout("dense", ["tp"], [Shard(0)]),
    ...     shard_axis="dp_shard", mesh_sizes={"dp_shard": 4, "tp": 2}))
    'dense[dp_shard=_S(0, 2), tp=S(0)]'

    Args:
        layout: the parameter's source layout (at most two axes, no ``Partial``).
        shard_axis: the mesh axis FSDP shards over.
        replicate_axes: the HSDP replicate axis, if any.
        mesh_sizes: the size of every axis of the result, by name.
        shard_dim: the tensor dim FSDP shards (``shard_placement_fn``'s ``Shard(dim)``).
        shard_axes: deprecated spelling of ``shard_axis``, a sequence of that one axis.

    Returns:
        The composed layout; ``local_shape_and_offset`` reads it with the same sizes.

    Raises:
        LayoutError: what FSDP2 cannot compose, up front: more than two source axes, not
            exactly one shard axis, more than one replicate axis, an axis both FSDP's and
            the source's, a ``Partial``, an axis with no size in ``mesh_sizes``.
    """
    check_layout(layout)
    shard = _shard_axis(shard_axis, shard_axes)
    replicate = as_axes(replicate_axes, "replicate_axes")
    _check_fsdp_mesh(shard, replicate)
    _check_distinct(layout, replicate + shard)
    _check_source_rank(layout)
    _check_parameter(layout)
    _check_shard_dim(shard_dim)
    sizes = as_sizes(mesh_sizes, "mesh_sizes", floor=1)
    axes = (*replicate, *shard, *layout.axes)
    for axis in axes:
        size_of(sizes, axis, layout)
    # FSDP shards each source shard of shard_dim further: with tp=2 and ep=2 both on
    # S(0), every dp rank takes its slice of each of the 2 * 2 = 4 source shards.
    split_factor = math.prod(
        sizes[axis.name]
        for axis, p in zip(layout.axes, layout.placements, strict=True)
        if _shards_dim(p, shard_dim)
    )
    if split_factor > MAX_SPLIT_FACTOR:
        msg = (
            f"{clip(str(layout))}: its source axes cut dim {shard_dim} into {split_factor:,} "
            f"shards, more than a StridedShard holds ({MAX_SPLIT_FACTOR:,}); check mesh_sizes"
        )
        raise LayoutError(msg)
    fsdp: Placement = (
        StridedShard(shard_dim, split_factor=split_factor) if split_factor > 1 else Shard(shard_dim)
    )
    placements = (_REPLICATE,) * len(replicate) + (fsdp,) + layout.placements
    return SourceLayout(layout.mesh, axes, placements)


# ---------------------------------------------------------------------------------------
# geometry


def _chunk(n: int, chunks: int, index: int) -> tuple[int, int]:
    """Bounds of chunk ``index`` when ``torch.chunk`` splits ``n`` items into ``chunks``.

    Chunks are ``ceil(n / chunks)`` long and the tail takes what is left, possibly
    nothing: 10 rows over 4 ranks → 3, 3, 3, 1; 5 over 4 → 2, 2, 1, 0; 2 over 4 → 1, 1, 0, 0.
    """
    size = -(-n // chunks)
    return min(size * index, n), min(size * (index + 1), n)


def _strided_chunks(n: int, chunks: int, index: int, split_factor: int) -> list[tuple[int, int]]:
    """Positions chunk ``index`` of ``_S(dim, split_factor)`` over ``chunks`` ranks takes.

    The dim is first cut into ``split_factor`` pieces, each piece is chunked over the
    ranks, and a rank takes its chunk of every piece. 8 rows, ``_S(0, 2)`` over 2 ranks:
    pieces [0, 4) and [4, 8); rank 0 takes [0, 2) and [4, 6), rank 1 [2, 4) and [6, 8).
    """
    out: list[tuple[int, int]] = []
    for piece in range(split_factor):
        lo, hi = _chunk(n, split_factor, piece)
        if lo >= n:
            break  # every later piece is empty too: at most n pieces hold anything
        start, stop = _chunk(hi - lo, chunks, index)
        if start < stop:
            out.append((lo + start, lo + stop))
    return out


def _take(runs: Runs, spans: Iterable[tuple[int, int]]) -> Runs:
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
        if isinstance(p, Shard | StridedShard) and p.dim >= ndim:
            shown = format_placement(p)
            who = f"{clip(fqn)}: " if fqn else ""
            tensor = "the tensor" if shape is None else f"shape {clip(str(shape))}"
            fix = f"shard a dim below {ndim}" if ndim else "replicate it (R) on that axis"
            msg = (
                f"{who}{clip(str(layout))}: {shown} on axis {clip(axis.name)!r} shards dim "
                f"{p.dim}, but {tensor} has {ndim} dim{'s' if ndim != 1 else ''}; {fix}"
            )
            raise LayoutError(msg, fqn=fqn, axis=axis.name, placement=shown)


def _index_on(coordinate: Mapping[str, int], axis: AxisName, size: int) -> int:
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


def local_runs(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mapping[str, int],
    coordinate: Mapping[str, int],
) -> tuple[Runs, ...]:
    """Which global indices of each tensor dim the rank at ``coordinate`` holds.

    One tuple of ascending ``range`` runs per tensor dim (empty when the rank holds
    nothing of it). Placements apply left to right in the layout's axis order, each
    chunking what the previous ones left, as DTensor does; a ``Shard`` keeps one run per
    run it cuts, a ``StridedShard`` takes a slice of each of its pieces.

    >>> layout = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), Shard(0)])
    >>> local_runs((8, 3), layout, {"dp": 2, "tp": 2}, {"dp": 1, "tp": 0})
    ((range(2, 4),), (range(0, 3),))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the tensor's placements, one per axis.
        mesh_sizes: the size of every axis of ``layout``, by name (others are ignored).
        coordinate: the rank's index on every axis of ``layout`` (others are ignored).

    Raises:
        LayoutError: a placement shards a dim the tensor lacks, an axis has no size or no
            index, or an index is outside its axis.
    """
    check_layout(layout)
    shape = as_shape(global_shape, "global_shape")
    sizes = as_sizes(mesh_sizes, "mesh_sizes", floor=1)
    where = as_sizes(coordinate, "coordinate", floor=0)
    return _local_runs(shape, layout, sizes, where)


def _local_runs(
    shape: tuple[int, ...],
    layout: SourceLayout,
    sizes: Mapping[str, int],
    where: Mapping[str, int],
) -> tuple[Runs, ...]:
    """``local_runs`` of checked arguments (``as_shape``, ``as_sizes``)."""
    check_dims(layout, len(shape), shape=shape)
    runs: list[Runs] = [(range(n),) if n else () for n in shape]
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        size = size_of(sizes, axis, layout)
        index = _index_on(where, axis, size)
        match p:
            case Shard(dim):
                held = sum(map(len, runs[dim]))
                runs[dim] = _take(runs[dim], [_chunk(held, size, index)])
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
                runs[dim] = _take(runs[dim], _strided_chunks(held, size, index, k))
            case Replicate() | Partial():
                pass
            case _:
                assert_never(p)
    return tuple(runs)


def local_shape_and_offset(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mapping[str, int],
    coordinate: Mapping[str, int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local shard's shape and where it starts in the global tensor, on one rank.

    torch.chunk semantics, equal to DTensor's ``compute_local_shape_and_global_offset``:
    uneven shards are short at the tail, tail shards may be empty (their offset is then
    the dim's size, as DTensor reports it), and a ``StridedShard``'s offset is the first
    global index the rank holds (its block is not contiguous; ``local_runs`` gives it
    whole). 10 rows ``S(0)`` over 4 ranks: shapes 3, 3, 3, 1 at offsets 0, 3, 6, 9.

    >>> layout = SourceLayout("dense", ["tp"], [Shard(0)])
    >>> local_shape_and_offset((10, 4), layout, {"tp": 4}, {"tp": 3})
    ((1, 4), (9, 0))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the tensor's placements, one per axis.
        mesh_sizes: the size of every axis of ``layout``, by name (others are ignored).
        coordinate: the rank's index on every axis of ``layout`` (others are ignored).

    Returns:
        ``(local_shape, global_offset)``, one int per tensor dim each.

    Raises:
        LayoutError: as ``local_runs``.
    """
    check_layout(layout)
    shape = as_shape(global_shape, "global_shape")  # read once: it may be an iterator
    sizes = as_sizes(mesh_sizes, "mesh_sizes", floor=1)
    where = as_sizes(coordinate, "coordinate", floor=0)
    runs = _local_runs(shape, layout, sizes, where)
    local = tuple(sum(map(len, dim_runs)) for dim_runs in runs)
    offset = tuple(
        dim_runs[0].start if dim_runs else size for dim_runs, size in zip(runs, shape, strict=True)
    )
    return local, offset


# ---------------------------------------------------------------------------------------
# a whole table through FSDP

FsdpAxes: TypeAlias = AxisLike | tuple[AxisLike, AxisLike]
"""FSDP's mesh axes for one role: the shard axis, or ``(replicate, shard)`` for HSDP."""

_MAX_LISTED: Final = 50
"""How many problems a ``PlanError`` message spells out (``.problems`` holds them all)."""


def _world_size(sizes: Mapping[str, int]) -> int:
    return math.prod(sizes.values())


MAX_WORLD: Final = 2**20
"""The most ranks a world may have where the work is per rank (``lint``, ``dcp_chunks``,
``reshard_plan``): enough for any real run, and a bound on that work."""


def world_size(roles: Mapping[str, Mapping[str, int]], arg: str) -> int:
    """The number of ranks of the world ``roles`` lay out (checked by ``as_role_sizes``,
    at least one role), at most ``MAX_WORLD``.

    Raises:
        LayoutError: naming ``arg``, a world of more ranks.
    """
    n = _world_size(next(iter(roles.values())))
    if n > MAX_WORLD:
        msg = (
            f"{arg} lay out {n:,} ranks, more than the {MAX_WORLD:,} this plans for; check "
            "the mesh sizes"
        )
        raise LayoutError(msg)
    return n


def as_role_sizes(mesh_sizes: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``mesh_sizes`` checked: role -> sizes by axis, every role's mesh spanning one world.

    Raises:
        LayoutError: not a mapping of mappings of ints >= 1, or two roles' meshes with a
            different number of ranks.
    """
    raw: object = mesh_sizes
    if not isinstance(raw, Mapping):
        msg = (
            "mesh_sizes must map each mesh role to its sizes by axis, such as "
            f"{{'dense': {{'dp_shard': 4, 'tp': 2}}}}, got {quote(mesh_sizes)}"
        )
        raise LayoutError(msg)
    out: dict[str, dict[str, int]] = {}
    for role, sizes in mapping_items(mesh_sizes, "mesh_sizes", "{'dense': {'tp': 2}}"):
        key: object = role
        if not isinstance(key, str) or not key:
            msg = f"mesh_sizes keys are mesh roles such as 'dense', got {quote(role)}"
            raise LayoutError(msg)
        out[role] = as_sizes(sizes, f"mesh_sizes[{quote(role)}]", floor=1)
    worlds = {role: _world_size(sizes) for role, sizes in out.items()}
    if len(set(worlds.values())) > 1:
        shown = ", ".join(f"{role}: {n} ranks" for role, n in worlds.items())
        msg = (
            f"mesh_sizes: every role's mesh spans the whole world, but they differ ({shown}); "
            "give each role's mesh all the world's ranks"
        )
        raise LayoutError(msg)
    return out


def as_fsdp_axes(
    fsdp: Mapping[str, FsdpAxes],
) -> dict[str, tuple[tuple[AxisName, ...], AxisName]]:
    """``fsdp`` checked: role -> (HSDP replicate axes, FSDP's shard axis).

    Raises:
        LayoutError: not a mapping of a role to an axis or a (replicate, shard) pair.
    """
    raw: object = fsdp
    if not isinstance(raw, Mapping):
        msg = (
            "fsdp must map each mesh role to FSDP's axis (or a (replicate, shard) pair for "
            f"HSDP), such as {{'dense': 'dp_shard'}}, got {quote(fsdp)}"
        )
        raise LayoutError(msg)
    out: dict[str, tuple[tuple[AxisName, ...], AxisName]] = {}
    for role, value in mapping_items(fsdp, "fsdp", "{'dense': 'dp_shard'}"):
        item: object = value
        if isinstance(item, str | AxisName):
            out[role] = ((), as_axis(item))
        elif isinstance(item, tuple | list) and len(item) == 2:
            replicate, shard = as_axes(item)
            if replicate == shard:
                msg = (
                    f"fsdp[{quote(role)}] = {quote(value)} replicates and shards over one axis; "
                    "give (replicate, shard) as two different axes"
                )
                raise LayoutError(msg, axis=shard.name)
            out[role] = ((replicate,), shard)
        else:
            msg = (
                f"fsdp[{quote(role)}] must be FSDP's shard axis such as 'dp_shard', or a "
                f"(replicate, shard) pair such as ('dp_replicate', 'dp_shard'), got {quote(value)}"
            )
            raise LayoutError(msg)
    return out


def as_shard_dims(
    shard_dim: int | Mapping[str, int], fqns: Mapping[str, object]
) -> tuple[int, dict[str, int]]:
    """``shard_dim`` checked: the dim for FQNs not named, and the dims by FQN.

    Raises:
        LayoutError: a negative or non-int dim, or an FQN not in ``fqns``.
    """
    if not isinstance(shard_dim, Mapping):
        _check_shard_dim(shard_dim)
        return shard_dim, {}
    by_fqn: dict[str, int] = {}
    for key, dim in mapping_items(shard_dim, "shard_dim", "{'experts.w1': 1}"):
        raw: object = key
        if not isinstance(raw, str):
            msg = f"shard_dim keys are parameter FQNs such as 'experts.w1', got {quote(raw)}"
            raise LayoutError(msg)
        fqn = plain_str(key)  # its own __eq__ and __hash__ never reach the table
        if fqn not in fqns:
            msg = (
                f"shard_dim names {quote(fqn)}, which is not a parameter of the table; give dims "
                "only for the table's FQNs (check the spelling)"
            )
            raise LayoutError(msg, fqn=str(fqn))
        if type(dim) is not int or not 0 <= dim < MAX_NDIM:
            top = MAX_NDIM - 1
            msg = f"{clip(fqn)}: shard_dim must be an int from 0 to {top}, got {quote(dim)}"
            raise LayoutError(msg, fqn=fqn)
        by_fqn[fqn] = dim
    return 0, by_fqn


def _owned_names(owned: Iterable[AxisLike]) -> frozenset[str]:
    return axis_name_set(owned, "owned")


def _with_fqn(fqn: str, error: LayoutError) -> LayoutError:
    return LayoutError(
        f"{fqn}: {error.message}", fqn=fqn, axis=error.axis, placement=error.placement
    )


def plan_error(what: str, problems: Sequence[LayoutError]) -> PlanError:
    """One ``PlanError`` for ``problems``, the first few spelled out."""
    n = len(problems)
    lines = [f"{what} has {n} problem{'s' if n != 1 else ''}:"]
    lines.extend(f"  - {p.message}" for p in problems[:_MAX_LISTED])
    if n > _MAX_LISTED:
        lines.append(f"  ... and {n - _MAX_LISTED} more (see .problems)")
    return PlanError("\n".join(lines), problems=problems)


def _compose_entry(
    layout: SourceLayout,
    shard_dim: int,
    fsdp: Mapping[str, tuple[tuple[AxisName, ...], AxisName]],
    sizes: Mapping[str, Mapping[str, int]],
    owned: frozenset[str],
) -> SourceLayout:
    role = layout.mesh
    axes = fsdp.get(role)
    if axes is None:
        msg = (
            f"{layout}: no FSDP axis for mesh role {role!r} (fsdp has {sorted(fsdp)}); give "
            f"fsdp={{{role!r}: 'dp_shard', ...}}"
        )
        raise LayoutError(msg)
    role_sizes = sizes.get(role)
    if role_sizes is None:
        msg = (
            f"{layout}: no sizes for mesh role {role!r} (mesh_sizes has {sorted(sizes)}); give "
            f"mesh_sizes={{{role!r}: {{axis: n, ...}}, ...}}"
        )
        raise LayoutError(msg)
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if axis.name in owned:
            shown = format_placement(p)
            msg = (
                f"{layout}: axis {axis.name!r} ({shown}) is owned by FSDP, so this is not a "
                "source layout (is the table composed already?); compose a source table, or "
                "pass owned= without that axis"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
    replicate, shard = axes
    return compose_fsdp(
        layout,
        shard_axis=shard,
        replicate_axes=replicate,
        mesh_sizes=role_sizes,
        shard_dim=shard_dim,
    )


def compose_table(
    table: ParamLayoutTable,
    *,
    fsdp: Mapping[str, FsdpAxes],
    mesh_sizes: Mapping[str, Mapping[str, int]],
    shard_dim: int | Mapping[str, int] = 0,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> ParamLayoutTable:
    """The table ``fully_shard`` makes of ``table``: every entry through ``compose_fsdp``.

    Each layout is composed on its own mesh role: ``fsdp[role]`` is FSDP's shard axis
    there (``(replicate, shard)`` for HSDP) and ``mesh_sizes[role]`` that mesh's sizes by
    axis. Every role's mesh spans the whole world. A plain parameter
    (``SourceLayout(role, (), ())``) gets FSDP's own placements only. Tied groups are kept
    (their members share a storage, so they share a shard dim too).

    >>> table = ParamLayoutTable({
    ...     "w": SourceLayout("dense", ["tp"], [Shard(0)]),
    ...     "experts.w1": SourceLayout("expert", ["ep"], [Shard(0)]),
    ...     "norm": SourceLayout("dense", (), ()),
    ... })
    >>> print(compose_table(table, fsdp={"dense": "fsdp", "expert": "efsdp"},
    ...     mesh_sizes={"dense": {"fsdp": 4, "tp": 2}, "expert": {"efsdp": 2, "ep": 4}},
    ...     shard_dim={"experts.w1": 1}))
    w           dense[fsdp=_S(0, 2), tp=S(0)]
    experts.w1  expert[efsdp=S(1), ep=S(0)]
    norm        dense[fsdp=S(0)]

    Args:
        table: source layouts (no FSDP-owned axis in them).
        fsdp: FSDP's axis by mesh role, or a ``(replicate, shard)`` pair for HSDP.
        mesh_sizes: by mesh role, the sizes of that mesh's axes.
        shard_dim: the dim FSDP shards (``shard_placement_fn``), for every parameter or by
            FQN (FQNs not named take 0).
        owned: the axes FSDP and pipelining own; a layout using one is already composed.

    Returns:
        The composed table, same FQNs in the same order, same tied groups.

    Raises:
        PlanError: every parameter that cannot be composed (``.problems``, each naming
            the FQN): a role without an FSDP axis or sizes, an owned axis in a layout,
            what ``compose_fsdp`` refuses, tied members given different shard dims.
        LayoutError: ``fsdp``, ``mesh_sizes`` or ``shard_dim`` of the wrong form.
    """
    raw: object = table
    if not isinstance(raw, ParamLayoutTable):
        msg = f"table must be a ParamLayoutTable, got {type(raw).__name__} {quote(raw)}"
        raise LayoutError(msg)
    roles = as_fsdp_axes(fsdp)
    sizes = as_role_sizes(mesh_sizes)
    default_dim, dims = as_shard_dims(shard_dim, table)
    owned_names = _owned_names(owned)
    problems: list[LayoutError] = []
    for group in table.tied:
        given = {fqn: dims.get(fqn, default_dim) for fqn in sorted(group)}
        if len(set(given.values())) > 1:
            first = min(group)
            msg = (
                f"tied group {sorted(group)} shares one storage but has shard dims {given}; "
                "give every member the same shard_dim"
            )
            problems.append(LayoutError(msg, fqn=first))
    # Tables repeat a few layouts many times: compose each (layout, dim) once.
    done: dict[tuple[SourceLayout, int], SourceLayout | LayoutError] = {}

    def composed(layout: SourceLayout, dim: int) -> SourceLayout | LayoutError:
        got = done.get((layout, dim))
        if got is None:
            try:
                got = _compose_entry(layout, dim, roles, sizes, owned_names)
            except LayoutError as error:
                got = error
            done[layout, dim] = got
        return got

    def composed_or_raise(layout: SourceLayout) -> SourceLayout:
        got = composed(layout, default_dim)
        if isinstance(got, LayoutError):
            raise got
        return got

    entries = table._items
    if (type(entries) is ByModule or type(entries) is Listed) and not dims and not problems:
        # Kept by module or listed: each distinct inner map or layout composed once (a
        # problem sends the table to the loop below, which names every parameter it
        # concerns).
        try:
            return attrs.evolve(table, entries=entries.with_layouts(composed_or_raise))
        except LayoutError:
            pass
    out = CheckedEntries()
    for fqn, layout in table.items():
        got = composed(layout, dims.get(fqn, default_dim))
        if isinstance(got, LayoutError):
            problems.append(_with_fqn(fqn, got))
        else:
            out[fqn] = got
    if problems:
        raise plan_error("composing the table with FSDP", problems)
    return attrs.evolve(table, entries=out)


# ---------------------------------------------------------------------------------------
# what FSDP2 really keeps


def _check_parts_source(_: object, __: attrs.Attribute[SourceLayout], value: object) -> None:
    if not isinstance(value, SourceLayout):
        msg = (
            f"FsdpParts.source: expected a SourceLayout such as dense[tp=S(0)], got {quote(value)}"
        )
        raise LayoutError(msg)


def _as_parts_replicate(value: Iterable[AxisLike]) -> tuple[AxisName, ...]:
    return as_axes(value, "FsdpParts.replicate")


def _as_parts_shard(value: AxisLike | None) -> AxisName | None:
    if value is None:
        return None
    try:
        return as_axis(value)
    except LayoutError as e:
        msg = f"FsdpParts.shard: {e.message} (or None when FSDP does not shard)"
        raise LayoutError(msg, axis=e.axis) from None


def _check_parts_dim(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or not 0 <= value < MAX_NDIM:
        msg = f"FsdpParts.shard_dim: expected an int from 0 to {MAX_NDIM - 1}, got {quote(value)}"
        raise LayoutError(msg)


@attrs.frozen
class FsdpParts:
    """A composed layout read as ``fully_shard`` made it: FSDP's axes, then the source.

    ``shard`` is FSDP's shard axis (``None`` when nothing shards: no FSDP axis, or only
    ``R`` on it), ``replicate`` the HSDP replicate axis if any, ``shard_dim`` the tensor
    dim FSDP shards and ``source`` the layout the parameter had before ``fully_shard``.
    A field of the wrong type is a ``LayoutError`` naming it.
    """

    source: SourceLayout = attrs.field(validator=_check_parts_source, **REQUIRED)
    replicate: tuple[AxisName, ...] = attrs.field(converter=_as_parts_replicate, **REQUIRED)
    shard: AxisName | None = attrs.field(converter=_as_parts_shard, **REQUIRED)
    shard_dim: int = attrs.field(validator=_check_parts_dim, **REQUIRED)

    def __attrs_pre_init__(
        self,
        source: SourceLayout,
        replicate: Iterable[AxisLike],
        shard: AxisLike | None,
        shard_dim: int,
    ) -> None:
        check_init(self, "source", (source, replicate, shard, shard_dim))


def split_fsdp(
    layout: SourceLayout,
    mesh_sizes: Mapping[str, int],
    *,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> FsdpParts:
    """``layout`` (as ``compose_fsdp`` gives it) split into FSDP's axes and the source layout.

    FSDP's axes are the leading axes of ``layout`` that are ``owned``: one (FSDP) or two
    (HSDP, ``R`` first); the rest is the source layout. A layout with no leading owned
    axis is read as not sharded by FSDP at all.

    >>> composed = SourceLayout("dense", ["dp_shard", "tp"],
    ...     [StridedShard(0, split_factor=2), Shard(0)])
    >>> parts = split_fsdp(composed, {"dp_shard": 4, "tp": 2})
    >>> str(parts.source), parts.shard, parts.shard_dim
    ('dense[tp=S(0)]', AxisName(name='dp_shard'), 0)

    Raises:
        LayoutError: a layout ``fully_shard`` does not make: more than two FSDP axes, an
            owned axis after a source axis, HSDP's first axis not ``R``, or placements on
            FSDP's axis other than those ``compose_fsdp`` gives the source layout.
    """
    check_layout(layout)
    names = _owned_names(owned)
    k = 0
    while k < len(layout.axes) and layout.axes[k].name in names:
        k += 1
    for axis, p in zip(layout.axes[k:], layout.placements[k:], strict=True):
        if axis.name in names:
            shown = format_placement(p)
            msg = (
                f"{layout}: owned axis {axis.name!r} ({shown}) comes after a source axis; "
                "fully_shard puts its own axes first, so this is not a layout it makes "
                "(compose the source layout with compose_fsdp)"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
    source = SourceLayout(layout.mesh, layout.axes[k:], layout.placements[k:])
    fsdp_axes = layout.axes[:k]
    if k > 2:
        msg = (
            f"{layout}: {k} leading FSDP axes {[a.name for a in fsdp_axes]}; fully_shard "
            "takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard), so flatten them"
        )
        raise LayoutError(msg, axis=fsdp_axes[2].name)
    if k == 0:
        return FsdpParts(source, (), None, 0)
    _check_parameter(layout)
    p = layout.placements[k - 1]
    match p:
        case Shard(d) | StridedShard(d):
            dim = d
        case Replicate() | Partial():
            return FsdpParts(source, fsdp_axes, None, 0)
        case _:
            assert_never(p)
    expected = compose_fsdp(
        source,
        shard_axis=fsdp_axes[-1],
        replicate_axes=fsdp_axes[:-1],
        mesh_sizes=mesh_sizes,
        shard_dim=dim,
    )
    if expected != layout:
        msg = (
            f"{layout} is not what fully_shard makes of {source} (it makes {expected}); "
            "compose the source layout with compose_fsdp"
        )
        raise LayoutError(msg, axis=fsdp_axes[-1].name, placement=format_placement(p))
    return FsdpParts(source, fsdp_axes[:-1], fsdp_axes[-1], dim)


def _fsdp_chunk(
    source_runs: tuple[Runs, ...],
    parts: FsdpParts,
    sizes: Mapping[str, int],
    where: Mapping[str, int],
) -> tuple[Runs, ...]:
    """FSDP2's chunk of one rank's source-local runs (``torch.chunk`` on ``shard_dim``).

    A chunk without elements is empty on ``shard_dim``, as FSDP2 sizes it (a local
    (1, 0) block becomes (0, 0)).
    """
    if parts.shard is None:
        return source_runs
    dim = parts.shard_dim
    size = size_of(sizes, parts.shard, parts.source)
    index = _index_on(where, parts.shard, size)
    held = sum(map(len, source_runs[dim]))
    out = list(source_runs)
    out[dim] = _take(source_runs[dim], [_chunk(held, size, index)])
    if any(not runs for runs in out):
        out[dim] = ()
    return tuple(out)


def fsdp_storage_runs(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mapping[str, int],
    coordinate: Mapping[str, int],
    *,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> tuple[Runs, ...]:
    """The global indices the rank at ``coordinate`` really keeps under ``fully_shard``.

    ``layout`` is composed (as ``compose_fsdp`` gives it). FSDP2 does not cut the global
    tensor by the composed placements: it takes the rank's source-local tensor (the
    source placements, ``torch.chunk`` semantics) and chunks *that* on ``shard_dim`` over
    its shard axis, padding only the tail. Where the source shards the same dim evenly
    this equals ``local_runs(..., layout, ...)``; where it shards it unevenly, it may not:
    5 rows on ``ep=2, tp=2`` both ``S(0)`` and FSDP over ``dp_shard=2`` — the source gives
    rows 0-1, 2, 3, 4 to the four (ep, tp) ranks, and FSDP splits each of those.

    >>> composed = SourceLayout("expert", ["dp_shard", "ep", "tp"],
    ...     [StridedShard(0, split_factor=4), Shard(0), Shard(0)])
    >>> sizes = {"dp_shard": 2, "ep": 2, "tp": 2}
    >>> fsdp_storage_runs((5, 3), composed, sizes, {"dp_shard": 0, "ep": 1, "tp": 1})
    ((range(4, 5),), (range(0, 3),))
    >>> local_runs((5, 3), composed, sizes, {"dp_shard": 0, "ep": 1, "tp": 1})
    ((), (range(0, 3),))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the composed layout (FSDP's axes first, as ``split_fsdp`` reads them).
        mesh_sizes: the size of every axis of ``layout``, by name.
        coordinate: the rank's index on every axis of ``layout``.
        owned: the axes FSDP owns (which leading axes are FSDP's).

    Returns:
        One tuple of ascending runs per tensor dim, as ``local_runs``.

    Raises:
        LayoutError: as ``split_fsdp`` and ``local_runs``, or FSDP's dim not in the tensor.
    """
    check_layout(layout)
    sizes = as_sizes(mesh_sizes, "mesh_sizes", floor=1)  # each argument read once
    where = as_sizes(coordinate, "coordinate", floor=0)
    parts = split_fsdp(layout, sizes, owned=owned)
    shape = as_shape(global_shape, "global_shape")
    check_dims(layout, len(shape), shape=shape)  # FSDP's dim too, which the source may not shard
    runs = _local_runs(shape, parts.source, sizes, where)
    return _fsdp_chunk(runs, parts, sizes, where)
