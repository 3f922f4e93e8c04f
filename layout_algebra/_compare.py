"""Two tables compared as a checkpoint sees them: by the box each rank holds.

A checkpoint read back (``table_from_dcp``) spells every layout over all axes of its mesh
and takes one of the layouts that write its chunks; a plan composed with FSDP spells
its own. Two spellings of one sharding (``R`` on an axis one names and the other omits,
``_S(0, 2)`` or ``S(0)`` where the shapes are even) write the same chunks and load
without a reshard: they are no change.
"""

from __future__ import annotations

from collections.abc import Mapping

from layout_algebra._text import clip
from layout_algebra.algebra import TableDiff
from layout_algebra.errors import LayoutError
from layout_algebra.geometry import local_shape_and_offset
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.mesh import MAX_WORLD, Mesh
from layout_algebra.shapes import ParamShape

__all__ = ["checkpoint_diff"]


def checkpoint_diff(
    old: ParamLayoutTable,
    new: ParamLayoutTable,
    shapes: Mapping[str, ParamShape],
    meshes: Mapping[str, Mesh],
) -> TableDiff:
    """What changed from ``old`` to ``new`` (both composed) where a checkpoint sees it.

    An entry in both tables is changed when some global rank holds a different box of
    the tensor (DTensor's local shape and offset, which ``dcp.save`` writes as its
    chunk) under the two layouts; equal boxes on every rank are no change, however the
    layouts are spelled. Entries in one table only are added or removed; tied groups
    are not compared (a checkpoint does not record them).

    >>> from layout_algebra import ParamShape, Replicate, Shard, SourceLayout
    >>> meshes = {"dense": Mesh({"dp": 2, "tp": 2})}
    >>> shapes = {"w": ParamShape((4, 4), "float32")}
    >>> def one(axes, *placements):
    ...     return ParamLayoutTable({"w": SourceLayout("dense", axes, placements)})
    >>> saved = one(["dp", "tp"], Shard(0), Replicate())
    >>> print(checkpoint_diff(saved, one(["dp"], Shard(0)), shapes, meshes))
    (no differences)
    >>> print(checkpoint_diff(saved, one(["dp"], Shard(1)), shapes, meshes))
    w: dense[dp=S(0), tp=R] -> dense[dp=S(1)]

    Args:
        old: the layouts a checkpoint was saved under (``table_from_dcp(...).table``).
        new: the layouts it would be loaded under.
        shapes: the global shape of every entry in both tables.
        meshes: the ``Mesh`` of every mesh role the layouts name, over the same ranks
            (at most ``MAX_WORLD`` of them).

    Raises:
        LayoutError: an entry without a shape, a role without a mesh, meshes of
            different sizes or too large, or a layout on an axis its mesh lacks.
    """
    worlds = {mesh.size for mesh in meshes.values()}
    if len(worlds) > 1:
        shown = ", ".join(f"{role} {mesh} ({mesh.size} ranks)" for role, mesh in meshes.items())
        msg = f"meshes {shown} lay out different worlds; give meshes over the same ranks"
        raise LayoutError(msg)
    if worlds and max(worlds) > MAX_WORLD:  # the comparison visits every rank
        msg = (
            f"the meshes have {max(worlds):,} ranks, more than the {MAX_WORLD:,} a world "
            "has; give the meshes the checkpoint was saved on"
        )
        raise LayoutError(msg)
    decided: dict[tuple[tuple[int, ...], SourceLayout, SourceLayout], bool] = {}
    changed: dict[str, tuple[SourceLayout, SourceLayout]] = {}
    for fqn, was in old.items():
        now = new.get(fqn)
        if now is None or now == was:
            continue
        found = shapes.get(fqn)
        if found is None:
            msg = f"{clip(fqn)}: no shape given; the shapes must name every entry compared"
            raise LayoutError(msg, fqn=fqn)
        key = (found.shape, was, now)
        if key not in decided:
            decided[key] = _same_boxes(found.shape, was, now, meshes, fqn)
        if not decided[key]:
            changed[fqn] = (was, now)
    return TableDiff(
        added={fqn: layout for fqn, layout in new.items() if fqn not in old},
        removed={fqn: layout for fqn, layout in old.items() if fqn not in new},
        changed=changed,
    )


def _mesh_of(layout: SourceLayout, meshes: Mapping[str, Mesh], fqn: str) -> Mesh:
    mesh = meshes.get(layout.mesh)
    if mesh is None:
        msg = (
            f"{clip(fqn)}: {layout} is on the {clip(layout.mesh)!r} mesh, which is not given; "
            f"give the meshes of every role ({', '.join(map(repr, meshes))} given)"
        )
        raise LayoutError(msg, fqn=fqn)
    return mesh


def _same_boxes(
    shape: tuple[int, ...],
    a: SourceLayout,
    b: SourceLayout,
    meshes: Mapping[str, Mesh],
    fqn: str,
) -> bool:
    """Whether every rank holds the same box of a tensor of ``shape`` under ``a`` and ``b``."""
    mesh_a, mesh_b = _mesh_of(a, meshes, fqn), _mesh_of(b, meshes, fqn)
    for rank in range(mesh_a.size):
        at_a = dict(zip(mesh_a.names, mesh_a.coordinate(rank), strict=True))
        at_b = dict(zip(mesh_b.names, mesh_b.coordinate(rank), strict=True))
        if local_shape_and_offset(shape, a, mesh_a, at_a) != local_shape_and_offset(
            shape, b, mesh_b, at_b
        ):
            return False
    return True
