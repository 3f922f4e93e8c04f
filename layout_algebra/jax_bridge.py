"""Layouts as JAX spells them: ``PartitionSpec`` entries, both ways, without importing JAX.

A JAX ``PartitionSpec`` has one entry per tensor dim: ``None`` (not split), an axis name,
or a tuple of axis names, major first, whose product of sizes splits the dim. DTensor says
the same with one placement per mesh axis, applied in the mesh's axis order; where a later
axis must be the major one, the earlier axis holds a ``StridedShard`` whose split factor
is the product of the sizes of the later, more major axes. So FSDP's
``dense[dp=_S(0, 2), tp=S(0)]`` (``tp=2``) is JAX's ``(("tp", "dp"),)``: the rows are
split over ``tp`` first, and each ``tp`` block over ``dp``.

What JAX cannot spell raises ``LayoutError``: a ``Partial`` (a spec says how dims are
split, not which sums are pending), a split factor that is no product of more major axes,
and (given the shape) a dim the axes do not split evenly, since JAX shards evenly only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias

from layout_algebra._args import MAX_NDIM, as_items, as_shape
from layout_algebra._shards import check_dims, check_layout, shard_dim_of, size_of
from layout_algebra._text import clip, quote
from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh, as_mesh
from layout_algebra.placements import (
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)

__all__ = ["SpecEntry", "from_partition_spec", "to_partition_spec"]

SpecEntry: TypeAlias = str | tuple[str, ...] | None
"""One dim of a ``PartitionSpec``: not split, split over one axis, or over several (major first)."""

_REPLICATE: Final = Replicate()
_MAX_SHOWN: Final = 200


def _check_ndim(ndim: int) -> None:
    if type(ndim) is not int or not 0 <= ndim <= MAX_NDIM:
        msg = f"ndim must be an int from 0 to {MAX_NDIM} (the tensor's rank), got {quote(ndim)}"
        raise LayoutError(msg)


# ---------------------------------------------------------------------------------------
# layout -> spec


def _prefix_with_product(
    entry: list[AxisName], k: int, sizes: Mapping[str, int], layout: SourceLayout
) -> int | None:
    """The shortest prefix of ``entry`` whose sizes multiply to ``k``, by length; or None."""
    product = 1
    for length, axis in enumerate(entry, start=1):
        product *= size_of(sizes, axis, layout)
        if product == k:
            return length
        if product > k:
            return None
    return None


def _order(
    layout: SourceLayout,
    dim: int,
    splits: list[tuple[AxisName, int]],
    sizes: Mapping[str, int] | None,
) -> tuple[str, ...]:
    """The axes splitting ``dim``, major first, from their placements in mesh order.

    Walking from the last axis back, each axis goes where the axes before it in the
    entry (the more major ones among those placed after it) multiply to its split
    factor: a plain ``Shard`` (factor 1) is major to every later axis, ``_S(0, 2)`` comes
    after later axes whose sizes make 2.
    """
    entry: list[AxisName] = []
    for axis, k in reversed(splits):
        if k == 1:
            entry.insert(0, axis)
            continue
        shown = format_placement(StridedShard(dim, split_factor=k))
        if sizes is None:
            # Even one later axis sharding the dim is no proof: the split factor must be
            # its size, and only the sizes say whether it is.
            msg = (
                f"{layout}: {shown} on axis {quote(axis.name)} needs the mesh's sizes to check "
                f"its split factor {k} against the axes sharding dim {dim} after it; give "
                "mesh_sizes={axis: n, ...}"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
        position = _prefix_with_product(entry, k, sizes, layout)
        if position is None:
            later_axes = ", ".join(f"{a.name}={size_of(sizes, a, layout)}" for a in entry)
            msg = (
                f"{layout}: {shown} on axis {quote(axis.name)} is not the product of the sizes of "
                f"more major axes sharding dim {dim} after it ({later_axes or 'none'}), so "
                "its blocks are not one JAX entry; JAX has no spelling for it"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
        entry.insert(position, axis)
    return tuple(a.name for a in entry)


def to_partition_spec(
    layout: SourceLayout,
    ndim: int,
    *,
    mesh_sizes: Mesh | Mapping[str, int] | None = None,
    shape: Iterable[int] | None = None,
) -> tuple[SpecEntry, ...]:
    """The ``PartitionSpec`` entries of ``layout`` for a tensor of ``ndim`` dims.

    One entry per dim: ``None``, an axis name, or a tuple of axis names (major first).
    ``jax.sharding.PartitionSpec(*to_partition_spec(...))`` on a JAX mesh with the same
    axes gives every device the block ``local_shape_and_offset`` gives the rank there.

    >>> from layout_algebra import StridedShard
    >>> fsdp_tp = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), Shard(0)])
    >>> to_partition_spec(fsdp_tp, 2, mesh_sizes={"dp": 4, "tp": 2})
    (('tp', 'dp'), None)
    >>> to_partition_spec(SourceLayout("dense", ["tp"], [Shard(1)]), 2)
    (None, 'tp')

    Args:
        layout: the layout; its axes are the JAX mesh's axes (or some of them).
        ndim: the tensor's number of dims.
        mesh_sizes: the mesh (a ``Mesh`` or sizes by axis); needed to check ``shape``, and for
            every ``StridedShard`` (its split factor is checked against them).
        shape: the tensor's shape, to check that every split is even as JAX needs.

    Raises:
        LayoutError: a ``Partial``; a shard of a dim beyond ``ndim``; a ``StridedShard``
            without ``mesh_sizes``, or whose split factor is no product of more major
            axes; with ``shape``, a dim the axes do not split evenly.
    """
    check_layout(layout)
    _check_ndim(ndim)
    sizes = None if mesh_sizes is None else as_mesh(mesh_sizes)
    checked = None if shape is None else _shape_of_ndim(shape, ndim)
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if isinstance(p, Partial):
            shown = format_placement(p)
            msg = (
                f"{layout}: {shown} on axis {quote(axis.name)} is a pending reduction, and a "
                "PartitionSpec says how dims are split, not which sums are pending; reduce "
                "it first (R) or shard a dim (S(dim))"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
    check_dims(layout, ndim)
    by_dim: dict[int, list[tuple[AxisName, int]]] = {}
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        dim = shard_dim_of(p)
        if dim is not None:
            k = p.split_factor if isinstance(p, StridedShard) else 1
            by_dim.setdefault(dim, []).append((axis, k))
    entries: list[SpecEntry] = []
    for dim in range(ndim):
        splits = by_dim.get(dim)
        if not splits:
            entries.append(None)
            continue
        order = _order(layout, dim, splits, sizes)
        entries.append(order[0] if len(order) == 1 else order)
    if checked is not None:
        _check_even(layout, checked, entries, sizes)
    return tuple(entries)


def _shape_of_ndim(shape: Iterable[int], ndim: int) -> tuple[int, ...]:
    """``shape``, checked by ``as_shape``, of ``ndim`` dims."""
    checked = as_shape(shape, "shape")
    if len(checked) != ndim:
        msg = (
            f"shape {quote(checked)} has {len(checked)} dims but ndim is {ndim}; give a "
            f"sequence of {ndim} ints, the tensor's shape"
        )
        raise LayoutError(msg)
    return checked


def _check_even(
    layout: SourceLayout,
    shape: tuple[int, ...],
    entries: list[SpecEntry],
    sizes: Mapping[str, int] | None,
) -> None:
    for dim, (n, entry) in enumerate(zip(shape, entries, strict=True)):
        if entry is None:
            continue
        names = (entry,) if isinstance(entry, str) else entry
        if sizes is None:
            msg = f"{layout}: checking shape {shape} needs mesh_sizes; give mesh_sizes="
            raise LayoutError(msg)
        parts = math.prod(size_of(sizes, as_axis(a), layout) for a in names)
        if n % parts:
            msg = (
                f"{layout}: dim {dim} of shape {shape} is {quote(n)} long, which "
                f"{clip(' x '.join(names))} = {parts} ranks do not split evenly, and JAX "
                "shards evenly only; pad the dim or shard another"
            )
            raise LayoutError(msg, axis=names[0])


# ---------------------------------------------------------------------------------------
# spec -> layout


def _entry_axes(entry: object, dim: int) -> tuple[AxisName, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (as_axis(entry),)
    if isinstance(entry, tuple | list) and all(isinstance(a, str) for a in entry):
        return as_axes(entry)
    msg = (
        f"PartitionSpec entry {dim} is {quote(entry)}, which names no axes (JAX's "
        "UNCONSTRAINED leaves the split to the compiler); give None, an axis name or a "
        "tuple of axis names"
    )
    raise LayoutError(msg)


def _check_reductions(spec: object) -> None:
    for field in ("unreduced", "reduced"):
        try:
            pending: object = getattr(spec, field, None)
        except Exception as e:  # a spec-like object whose attribute raises
            msg = (
                f"spec: PartitionSpec.{field} could not be read ({quote(e)}); give a PartitionSpec"
            )
            raise LayoutError(msg) from e
        if isinstance(pending, Iterable) and not isinstance(pending, str):
            names = sorted(map(str, as_items(pending, f"PartitionSpec.{field}", "()")))
        else:
            names = []
        if names:
            msg = (
                f"PartitionSpec has {field} axes {quote(names)}: pending reductions, which a "
                "parameter's layout cannot hold (Partial); reduce them in JAX first"
            )
            raise LayoutError(msg, axis=names[0], placement="P(sum)")


def from_partition_spec(
    spec: Iterable[SpecEntry],
    *,
    mesh: str,
    axes: Iterable[AxisLike],
    mesh_sizes: Mesh | Mapping[str, int],
) -> SourceLayout:
    """The layout JAX's ``PartitionSpec`` entries describe, on mesh role ``mesh``.

    ``axes`` are the layout's axes in the mesh's order (axes the spec does not name are
    ``R``); ``mesh_sizes`` give the split factors. A jax ``PartitionSpec`` itself is
    taken as it is (its entries are iterated).

    >>> str(from_partition_spec((("tp", "dp"), None), mesh="dense", axes=["dp", "tp"],
    ...     mesh_sizes={"dp": 4, "tp": 2}))
    'dense[dp=_S(0, 2), tp=S(0)]'

    Args:
        spec: one entry per dim: ``None``, an axis name, or axis names major first.
        mesh: the mesh role of the result, such as ``"dense"``.
        axes: the layout's axes, in mesh order.
        mesh_sizes: the mesh (a ``Mesh`` or sizes by axis name): every axis the spec names.

    Raises:
        LayoutError: an entry that names no axes (``UNCONSTRAINED``), an axis named twice
            or not in ``axes``, an axis with no size, pending reductions (``unreduced``),
            more entries than a tensor has dims (``MAX_NDIM``).
    """
    raw: object = spec
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        msg = (
            "spec must be a PartitionSpec or a sequence of entries such as ('tp', None), "
            f"got {quote(spec)}"
        )
        raise LayoutError(msg)
    _check_reductions(spec)
    layout_axes = as_axes(axes)
    sizes = as_mesh(mesh_sizes)
    entries = as_items(spec, "spec", "('tp', None)", limit=MAX_NDIM)  # read once
    if len(entries) > MAX_NDIM:
        msg = f"spec has more than {MAX_NDIM} entries, one per dim; a tensor has at most {MAX_NDIM}"
        raise LayoutError(msg)
    placements: dict[AxisName, Placement] = {}
    for dim, entry in enumerate(entries):
        names = _entry_axes(entry, dim)
        for i, axis in enumerate(names):
            if axis in placements or axis in names[:i]:
                msg = (
                    f"PartitionSpec {quote(entries)} names axis {quote(axis.name)} "
                    "twice; an axis splits at most one dim once"
                )
                raise LayoutError(msg, axis=axis.name)
            if axis not in layout_axes:
                msg = (
                    f"PartitionSpec entry {dim} names axis {quote(axis.name)}, which is not one of "
                    f"the layout's axes {[a.name for a in layout_axes]}; add it to axes="
                )
                raise LayoutError(msg, axis=axis.name)
        position = {a: layout_axes.index(a) for a in names}
        for i, axis in enumerate(names):
            # the more major axes placed after this one in the mesh make its split factor
            k = 1
            for major in names[:i]:
                if position[major] > position[axis]:
                    k *= size_of(sizes, major)
            placements[axis] = StridedShard(dim, split_factor=k) if k > 1 else Shard(dim)
    return SourceLayout(mesh, layout_axes, [placements.get(a, _REPLICATE) for a in layout_axes])
