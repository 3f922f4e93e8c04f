"""Shard geometry: which block of the global tensor one rank holds under a layout.

``local_runs`` and ``local_shape_and_offset`` read a layout against a tensor's shape and
a mesh, with torch.chunk semantics, as DTensor computes it. They are pure: the mesh is a
``Mesh`` or sizes by axis name, the coordinate an index by axis name, so no live
``DeviceMesh`` (and no torch) is needed. FSDP composition lives in ``fsdp``, the mesh
value in ``mesh``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from layout_algebra._args import as_shape
from layout_algebra._shards import Runs, check_layout, held_runs, shape_and_offset
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh, as_coordinate, as_mesh

__all__ = ["Runs", "local_runs", "local_shape_and_offset"]


def as_sizes(values: Mapping[str, int], what: str, floor: int = 1) -> dict[str, int]:
    """Sizes (``floor=1``) or a coordinate (``floor=0``) by axis, checked, as a dict:
    ``mesh.as_mesh`` or ``mesh.as_coordinate``, kept until its callers use those."""
    if floor:
        return dict(as_mesh(values, what))
    return as_coordinate(values, what)


def local_runs(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mesh | Mapping[str, int],
    coordinate: Mapping[str, int],
) -> tuple[Runs, ...]:
    """Which global indices of each tensor dim the rank at ``coordinate`` holds.

    One tuple of ascending ``range`` runs per tensor dim (empty when the rank holds
    nothing of it). Placements apply left to right in the layout's axis order, each
    chunking what the previous ones left, as DTensor does; a ``Shard`` keeps one run per
    run it cuts, a ``StridedShard`` takes a slice of each of its pieces.

    >>> from layout_algebra import Shard, StridedShard
    >>> layout = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), Shard(0)])
    >>> local_runs((8, 3), layout, Mesh({"dp": 2, "tp": 2}), {"dp": 1, "tp": 0})
    ((range(2, 4),), (range(0, 3),))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the tensor's placements, one per axis.
        mesh_sizes: the size of every axis of ``layout``: a ``Mesh`` or sizes by name
            (other axes are ignored).
        coordinate: the rank's index on every axis of ``layout`` (others are ignored).

    Raises:
        LayoutError: a placement shards a dim the tensor lacks, an axis has no size or no
            index, or an index is outside its axis.
    """
    check_layout(layout)
    shape = as_shape(global_shape, "global_shape")  # read once: it may be an iterator
    return held_runs(shape, layout, as_mesh(mesh_sizes), as_coordinate(coordinate))


def local_shape_and_offset(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mesh | Mapping[str, int],
    coordinate: Mapping[str, int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The local shard's shape and where it starts in the global tensor, on one rank.

    torch.chunk semantics, equal to DTensor's ``compute_local_shape_and_global_offset``:
    uneven shards are short at the tail, tail shards may be empty (their offset is then
    the dim's size, as DTensor reports it), and a ``StridedShard``'s offset is the first
    global index the rank holds (its block is not contiguous; ``local_runs`` gives it
    whole). 10 rows ``S(0)`` over 4 ranks: shapes 3, 3, 3, 1 at offsets 0, 3, 6, 9.

    >>> from layout_algebra import Shard
    >>> layout = SourceLayout("dense", ["tp"], [Shard(0)])
    >>> local_shape_and_offset((10, 4), layout, Mesh({"tp": 4}), {"tp": 3})
    ((1, 4), (9, 0))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the tensor's placements, one per axis.
        mesh_sizes: the size of every axis of ``layout``: a ``Mesh`` or sizes by name
            (other axes are ignored).
        coordinate: the rank's index on every axis of ``layout`` (others are ignored).

    Returns:
        ``(local_shape, global_offset)``, one int per tensor dim each.

    Raises:
        LayoutError: as ``local_runs``.
    """
    check_layout(layout)
    shape = as_shape(global_shape, "global_shape")  # read once: it may be an iterator
    runs = held_runs(shape, layout, as_mesh(mesh_sizes), as_coordinate(coordinate))
    return shape_and_offset(runs, shape)
