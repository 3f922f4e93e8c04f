"""A distributed checkpoint's layouts, read from its metadata alone: ``table_from_dcp``.

torch's DCP records, per tensor, its global shape, its dtype and the boxes ("chunks") the
saving ranks wrote, one copy of the boxes replicas share; ``FileSystemWriter`` also names
each box's file after the rank that wrote it (``__3_0.distcp``). That is enough to say
which layout wrote the tensor, with no model, no process group and no tensor data:
the layout whose ``dcp_chunks`` are exactly those boxes, and which puts every box on the
rank that wrote it.

What a checkpoint cannot tell is left to a stated rule, never to a guess about data:

- replication is invisible (replicas write one box), so every layout is spelled over all
  axes of its mesh, ``R`` on the axes that do not shard it; a plain tensor and an
  all-``R`` DTensor are one checkpoint;
- where several layouts write the same boxes on the same ranks (even shapes), the one
  found first is taken: axes shard in mesh order, earlier axes take lower dims, and a
  dim sharded on several axes is read as FSDP2 makes it (``StridedShard`` on the first)
  before plain ``Shard``s; all of them load the same reads (``reshard_plan``);
- with ``mesh={role: Mesh, ...}`` a tensor goes to the first role whose mesh writes it,
  so roles whose meshes have equal sizes cannot be told apart.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, TypeAlias, TypeVar

import attrs
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)

from layout_algebra import (
    FSDP_OWNED_AXES,
    Chunk,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Placement,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    dcp_chunks,
    lint,
    local_shape_and_offset,
)
from layout_algebra._args import as_instances, mapping_items
from layout_algebra._files import as_path
from layout_algebra._frozen import FrozenMap
from layout_algebra._text import clip, quote, ranks_text, some_of
from layout_algebra.fsdp import plan_error
from layout_algebra.layout import check_table
from layout_algebra.mesh import MAX_WORLD
from layout_algebra.shapes import as_dtype

__all__ = ["DcpLayouts", "table_from_dcp"]

_WRITER: Final = re.compile(r"__([0-9]{1,9})_[0-9]+\.distcp")
"""``FileSystemWriter``'s file names: ``__{rank}_{n}.distcp``."""

T = TypeVar("T")

_DEFAULT_ROLE: Final = "dense"
_MAX_LAYOUTS: Final = 1 << 16
"""The most layouts tried for one tensor on one mesh: a bound on the search."""
_MAX_INFERRED_AXES: Final = 4
"""Without ``mesh=``, the most axes an inferred mesh has."""
_PAIRS_CHECKED: Final = 2048
"""An error message looks for overlaps among this many boxes' pairs with the rest."""


def _by_name(
    value: Mapping[str, T], value_type: type[T], arg: str, example: str
) -> FrozenMap[str, T]:
    """``value`` checked to map plain names to ``value_type`` values, frozen."""
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"DcpLayouts.{arg}: expected a mapping such as {example}, got {quote(raw)}"
        raise LayoutError(msg)
    out = FrozenMap(value)
    for key, item in out.items():
        k: object = key
        v: object = item
        if type(k) is not str or not isinstance(v, value_type):
            msg = (
                f"DcpLayouts.{arg}: expected str keys and {value_type.__name__} values such as "
                f"{example}, got {quote(k)}: {quote(v)}; make it with table_from_dcp"
            )
            raise LayoutError(msg)
    return out


def _as_shapes(value: Mapping[str, ParamShape]) -> FrozenMap[str, ParamShape]:
    return _by_name(value, ParamShape, "shapes", "{'w': ParamShape((8, 4), 'float32')}")


def _as_meshes(value: Mapping[str, Mesh]) -> FrozenMap[str, Mesh]:
    return _by_name(value, Mesh, "meshes", "{'dense': Mesh({'tp': 4})}")


def _as_skipped(value: Iterable[str]) -> tuple[str, ...]:
    return as_instances(value, str, "DcpLayouts.skipped", "('step',)")


def _check_table(_: object, __: attrs.Attribute[ParamLayoutTable], value: object) -> None:
    check_table(value, "DcpLayouts(table=...)")


@attrs.frozen
class DcpLayouts:
    """What a DCP checkpoint's metadata says of its tensors: layouts, shapes and meshes.

    ``table`` holds the layout each tensor was saved under, as it was saved (composed:
    FSDP's axes included), every layout over all axes of its role's mesh;
    ``shapes`` each tensor's global shape and dtype; ``meshes`` each role's ``Mesh``
    (axes ``d0, d1, ...`` when inferred). ``skipped`` names the entries that are not
    tensors (bytes DCP pickles: counters, extra state), in the checkpoint's order; they
    have no layout. ``reshard_plan(result.table, dst, result.shapes,
    src_sizes=result.meshes, dst_sizes=...)`` plans a load of the checkpoint. Each field
    is checked (a wrong type is a ``LayoutError`` naming it).
    """

    table: ParamLayoutTable = attrs.field(validator=_check_table)
    shapes: FrozenMap[str, ParamShape] = attrs.field(converter=_as_shapes)
    meshes: FrozenMap[str, Mesh] = attrs.field(converter=_as_meshes)
    skipped: tuple[str, ...] = attrs.field(default=(), converter=_as_skipped)


@attrs.frozen
class _Saved:
    """One tensor as the metadata records it: its boxes and, where known, their writers."""

    fqn: str
    shape: ParamShape
    chunks: tuple[Chunk, ...]
    writers: tuple[tuple[Chunk, int], ...]

    @property
    def key(self) -> _Key:
        """What the layout depends on: tensors alike share one search."""
        return self.shape.shape, self.chunks, self.writers


_Key: TypeAlias = tuple[tuple[int, ...], tuple[Chunk, ...], tuple[tuple[Chunk, int], ...]]
"""A tensor's shape, boxes and their known writers."""

# ---------------------------------------------------------------------------------------
# reading the metadata


def _read_metadata(path: str | os.PathLike[str]) -> Metadata:
    where = Path(as_path(path, "table_from_dcp(path=...)"))
    try:
        found = where.is_dir(), (where / ".metadata").is_file()
    except OSError as e:  # a name too long for the file system, a directory not readable
        msg = f"{clip(str(where))!r} cannot be read as a directory ({quote(e)}); check the path"
        raise LayoutError(msg) from None
    if not found[0]:
        msg = f"{clip(str(where))!r} is not a directory; give the directory dcp.save wrote"
        raise LayoutError(msg)
    if not found[1]:
        msg = (
            f"{clip(str(where))!r} has no .metadata file, so it is not a finished DCP "
            "checkpoint; give the directory dcp.save wrote (its checkpoint_id)"
        )
        raise LayoutError(msg)
    try:
        metadata: object = FileSystemReader(where).read_metadata()
    except Exception as e:  # whatever a damaged file makes the reader raise
        msg = f"{clip(str(where))!r}: its .metadata could not be read ({quote(e)})"
        raise LayoutError(msg) from e
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        msg = f"{clip(str(where))!r}: its .metadata holds no DCP Metadata ({quote(metadata)})"
        raise LayoutError(msg)
    return metadata


def _writers(metadata: Metadata) -> dict[tuple[str, tuple[int, ...]], int]:
    """The rank that wrote each box, by (FQN, offsets), where the file names say."""
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    storage: object = metadata.storage_data
    if not isinstance(storage, dict):
        return out
    for index, info in storage.items():
        fqn, offset = getattr(index, "fqn", None), getattr(index, "offset", None)
        name = getattr(info, "relative_path", None)
        if (
            not isinstance(fqn, str)
            or not isinstance(offset, tuple)  # torch.Size is one
            or not all(type(o) is int for o in offset)
            or not isinstance(name, str)
        ):
            continue  # what the names say is evidence, never required
        m = _WRITER.fullmatch(name)
        if m is not None:
            out[fqn, tuple(offset)] = int(m.group(1))
    return out


def _saved(
    fqn: str, md: TensorStorageMetadata, writers: Mapping[tuple[str, tuple[int, ...]], int]
) -> _Saved:
    """One tensor's entry, checked: a shape, a dtype, and boxes of the tensor's rank."""
    try:
        dtype = as_dtype(str(md.properties.dtype))
        shape = ParamShape(tuple(int(n) for n in md.size), dtype)
        if len(md.chunks) > MAX_WORLD:
            msg = f"{len(md.chunks):,} chunks, more than the {MAX_WORLD:,} ranks followed here"
            raise LayoutError(msg)
        chunks = tuple(
            sorted(
                Chunk(tuple(int(o) for o in c.offsets), tuple(int(n) for n in c.sizes))
                for c in md.chunks
            )
        )
    except LayoutError as e:
        msg = f"{clip(fqn)}: the checkpoint's metadata of it is no tensor's: {e.message}"
        raise LayoutError(msg, fqn=fqn) from None
    except Exception as e:  # whatever a damaged entry raises as it is read
        msg = f"{clip(fqn)}: the checkpoint's metadata of it is damaged ({quote(e)})"
        raise LayoutError(msg, fqn=fqn) from e
    for c in chunks:
        if len(c.offsets) != len(shape.shape):
            msg = (
                f"{clip(fqn)}: chunk {c} has {len(c.offsets)} dims, the tensor "
                f"{shape} has {len(shape.shape)}; the checkpoint's metadata is damaged"
            )
            raise LayoutError(msg, fqn=fqn)
    found = tuple((c, writers[fqn, c.offsets]) for c in chunks if (fqn, c.offsets) in writers)
    return _Saved(fqn, shape, chunks, found)


# ---------------------------------------------------------------------------------------
# the layouts that write a tensor's boxes


def _extents(saved: _Saved) -> list[set[tuple[int, int]]]:
    """Per dim, the distinct (offset, size) the boxes take along it."""
    out: list[set[tuple[int, int]]] = [set() for _ in saved.shape.shape]
    for c in saved.chunks:
        for d, (o, n) in enumerate(zip(c.offsets, c.sizes, strict=True)):
            out[d].add((o, n))
    return out


def _sharded_dims(saved: _Saved) -> list[tuple[int, int]]:
    """The dims the boxes cut, each with how many extents it takes: ``(dim, count)``."""
    return [
        (d, len(e))
        for d, (e, n) in enumerate(zip(_extents(saved), saved.shape.shape, strict=True))
        if e != {(0, n)}
    ]


def _candidates(saved: _Saved, mesh: Mesh) -> Iterator[SourceLayout]:
    """Every layout on ``mesh`` that may write ``saved``'s boxes, in the order of
    preference the module's docstring states."""
    dims = _sharded_dims(saved)
    wanted = [d for d, _ in dims]
    options: list[list[int | None]] = [[*wanted, None] if n > 1 else [None] for n in mesh.sizes]
    if math.prod(map(len, options)) > _MAX_LAYOUTS:
        msg = (
            f"{clip(saved.fqn)}: mesh {mesh} gives more than {_MAX_LAYOUTS:,} layouts to try "
            "for it; give mesh= a mesh with fewer axes (axes of size 1 cost nothing)"
        )
        raise LayoutError(msg, fqn=saved.fqn)
    for assign in itertools.product(*options):
        axes_of = {d: [i for i, a in enumerate(assign) if a == d] for d in wanted}
        if any(math.prod(mesh.sizes[i] for i in axes_of[d]) < count for d, count in dims):
            continue  # too few pieces for the extents seen (covers a dim no axis cuts)
        shared = [d for d in wanted if len(axes_of[d]) > 1]
        for strided in itertools.product((True, False), repeat=len(shared)):
            first = {axes_of[d][0]: d for d, s in zip(shared, strided, strict=True) if s}
            placements: list[Placement] = []
            for i, d in enumerate(assign):
                if d is None:
                    placements.append(Replicate())
                elif i in first:
                    later = math.prod(mesh.sizes[j] for j in axes_of[d] if j > i)
                    placements.append(StridedShard(d, split_factor=later))
                else:
                    placements.append(Shard(d))
            yield SourceLayout(_DEFAULT_ROLE, mesh.names, placements)


def _writes(saved: _Saved, layout: SourceLayout, mesh: Mesh) -> bool:
    """Whether ``layout`` on ``mesh`` writes exactly ``saved``'s boxes, each on its writer."""
    if dcp_chunks(layout, saved.shape.shape, mesh) != saved.chunks:
        return False
    for chunk, rank in saved.writers:
        if rank >= mesh.size:
            return False
        coordinate = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
        sizes, offsets = local_shape_and_offset(saved.shape.shape, layout, mesh, coordinate)
        if Chunk(offsets, sizes) != chunk:
            return False
    return True


class _Search:
    """Finds each tensor's layout on a mesh, once per distinct (shape, boxes, writers)."""

    def __init__(self) -> None:
        self.found: dict[tuple[_Key, Mesh], SourceLayout | None] = {}

    def fit(self, saved: _Saved, mesh: Mesh, role: str) -> SourceLayout | None:
        """The first layout on ``mesh`` that writes ``saved``, on mesh role ``role``."""
        key = (saved.key, mesh)
        if key not in self.found:  # searched under the default role, whatever the role
            self.found[key] = next(
                (c for c in _candidates(saved, mesh) if _writes(saved, c, mesh)),
                None,
            )
        found = self.found[key]
        if found is None or role == _DEFAULT_ROLE:
            return found
        return SourceLayout(role, found.axes, found.placements)


# ---------------------------------------------------------------------------------------
# why no layout writes them


def _overlap(a: Chunk, b: Chunk) -> bool:
    return all(
        oa < ob + nb and ob < oa + na
        for oa, na, ob, nb in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def _why(saved: _Saved) -> str:
    shape = saved.shape.shape
    for c in saved.chunks:
        if any(o + n > size for o, n, size in zip(c.offsets, c.sizes, shape, strict=True)):
            return f"chunk {c} reaches beyond the tensor"
    full = [c for c in saved.chunks if c.numel]
    for i, a in enumerate(full[:_PAIRS_CHECKED]):
        for b in full[i + 1 :]:
            if _overlap(a, b):
                return f"chunks {a} and {b} overlap"
    covered = sum(c.numel for c in full)
    if covered < math.prod(shape):
        return f"they cover {covered:,} of its {math.prod(shape):,} elements: a gap"
    return "a split into pieces torch.chunk does not make, or boxes on other ranks"


def _no_layout(saved: _Saved, where: str, remedy: str) -> LayoutError:
    shown = some_of(list(map(str, saved.chunks)))
    msg = (
        f"{clip(saved.fqn)}: no layout of {where} writes the checkpoint's {len(saved.chunks)} "
        f"chunk{'s' if len(saved.chunks) != 1 else ''} of {saved.shape} ({shown}): "
        f"{_why(saved)}; {remedy}"
    )
    return LayoutError(msg, fqn=saved.fqn)


# ---------------------------------------------------------------------------------------
# meshes


def _as_role_meshes(mesh: object) -> dict[str, Mesh]:
    example = "Mesh({'dp_shard': 2, 'tp': 2}) or {'dense': Mesh(...), 'expert': Mesh(...)}"
    if isinstance(mesh, Mesh):
        return {_DEFAULT_ROLE: mesh}
    if not isinstance(mesh, Mapping) or not mesh:
        msg = (
            f"mesh must be a Mesh or a non-empty {{role: Mesh}} such as {example}, got "
            f"{quote(mesh)}"
        )
        raise LayoutError(msg)
    out: dict[str, Mesh] = {}
    for role, value in mapping_items(mesh, "mesh", example):
        if not isinstance(role, str):
            msg = f"mesh's keys are mesh roles (str) such as 'dense', got {quote(role)}"
            raise LayoutError(msg)
        if isinstance(value, int):
            msg = f"mesh maps roles to meshes, such as {example}, got {quote(mesh)}"
            raise LayoutError(msg)
        out[role] = value if isinstance(value, Mesh) else Mesh(value)  # Mesh checks the rest
    sizes = {role: m.size for role, m in out.items()}
    if any(n > MAX_WORLD for n in sizes.values()):
        msg = f"mesh: {sizes} ranks, more than the {MAX_WORLD:,} followed here; check the sizes"
        raise LayoutError(msg)
    if len(set(sizes.values())) > 1:
        msg = (
            f"mesh: every role's mesh spans the world of ranks that saved the checkpoint, "
            f"but they have {sizes} ranks; give meshes of one size"
        )
        raise LayoutError(msg)
    return out


def _factorings(n: int, most: int) -> list[tuple[int, ...]]:
    """``n`` as ordered products of factors >= 2, at most ``most`` of them, fewest first."""
    out: list[tuple[int, ...]] = []

    def grow(left: int, prefix: tuple[int, ...]) -> None:
        if left == 1:
            out.append(prefix)
            return
        if len(prefix) == most:
            return
        for f in range(2, left + 1):
            if left % f == 0:
                grow(left // f, (*prefix, f))

    grow(n, ())
    return sorted(out, key=len)


_WORLDS_TRIED: Final = 16
"""Without ``mesh=``, how many worlds are tried, from the fewest ranks that can have
written the checkpoint up (every rank that writes a box is seen: only ranks that write
none, when replicas are many, make the world larger than that)."""


def _fewest_ranks(tensors: Sequence[_Saved]) -> int:
    """The fewest ranks that can have written the checkpoint: one per box of a tensor,
    and every rank the file names give."""
    boxes = max((len(s.chunks) for s in tensors), default=1)
    top = max((rank for s in tensors for _, rank in s.writers), default=0)
    return max(boxes, top + 1)


def _meshes(world: int) -> list[Mesh]:
    """Every mesh of ``world`` ranks an inferred role may have, fewest axes first."""
    return [
        Mesh([(f"d{i}", n) for i, n in enumerate(sizes)])
        for sizes in _factorings(world, _MAX_INFERRED_AXES)
    ]


def _cover(
    tensors: Sequence[_Saved], meshes: Sequence[Mesh], search: _Search
) -> tuple[dict[str, Mesh], dict[str, SourceLayout], list[_Saved]]:
    """Roles on ``meshes``: the mesh that writes most tensors (the first of those that
    write as many) is ``dense``, the next one for the rest ``mesh1``, and so on; the
    tensors no mesh writes are left."""
    left = list(tensors)
    roles: dict[str, Mesh] = {}
    layouts: dict[str, SourceLayout] = {}
    while left:
        role = _DEFAULT_ROLE if not roles else f"mesh{len(roles)}"
        best: tuple[Mesh, dict[str, SourceLayout]] | None = None
        for mesh in meshes:
            fits = {
                s.fqn: layout for s in left if (layout := search.fit(s, mesh, role)) is not None
            }
            if fits and (best is None or len(fits) > len(best[1])):
                best = mesh, fits
                if len(fits) == len(left):
                    break  # none writes more
        if best is None:
            break
        roles[role] = best[0]
        layouts.update(best[1])
        left = [s for s in left if s.fqn not in best[1]]
    return roles, layouts, left


def _infer(
    tensors: Sequence[_Saved], search: _Search
) -> tuple[dict[str, Mesh], dict[str, SourceLayout], list[LayoutError]]:
    """Roles, meshes and layouts without a given mesh, on the smallest world that writes
    every tensor (``_cover``)."""
    low = _fewest_ranks(tensors)
    high = min(low + _WORLDS_TRIED - 1, MAX_WORLD)
    first: list[_Saved] | None = None
    for world in range(low, high + 1):
        meshes = _meshes(world)
        if first is not None and any(
            all(search.fit(s, m, _DEFAULT_ROLE) is None for m in meshes) for s in first
        ):
            continue  # a tensor no mesh of this world writes: no cover of every tensor
        roles, layouts, left = _cover(tensors, meshes, search)
        if not left:
            return roles, layouts, []
        first = left if first is None else first
    assert first is not None
    where = f"any mesh of {low} to {high} ranks"
    return {}, {}, [_no_layout(s, where, "give mesh= the mesh it was saved on") for s in first]


# ---------------------------------------------------------------------------------------
# the hazard


def _hazards(
    table: ParamLayoutTable, shapes: Mapping[str, ParamShape], meshes: Mapping[str, Mesh]
) -> list[LayoutError]:
    """Tensors whose layout FSDP2 stores otherwise than DTensor reads it (``lint``'s
    ``"storage"`` problem): torch wrote their boxes as DTensor reads the layout, so the
    checkpoint's values of those ranks are not where its metadata puts them."""
    owned = set(FSDP_OWNED_AXES)
    for layout in table.values():
        for i, placement in enumerate(layout.placements):
            if isinstance(placement, StridedShard):  # FSDP2's axes come first, up to its _S
                owned.update(a.name for a in layout.axes[: i + 1])
                break
    strided = {
        fqn
        for fqn, layout in table.items()
        if any(isinstance(p, StridedShard) for p in layout.placements)
    }
    if not strided:
        return []
    part = ParamLayoutTable({fqn: table[fqn] for fqn in strided})
    report = lint(part, {fqn: shapes[fqn] for fqn in strided}, mesh_sizes=meshes, owned=owned)
    out: list[LayoutError] = []
    for p in report.problems:
        if p.kind != "storage":
            continue
        msg = (
            f"{clip(p.fqn)}: the checkpoint's chunks spell {table[p.fqn]}, DTensor's reading of "
            f"the layout FSDP2 gave it, but FSDP2 keeps other rows than that reading on "
            f"{ranks_text(p.ranks)}: torch's hazard of uneven strided shards. Those ranks' "
            "values are not the "
            "rows the metadata names, so a load of this checkpoint gives wrong values; save it "
            "again from a layout lint passes"
        )
        out.append(LayoutError(msg, fqn=p.fqn, axis=p.axis, placement=p.placement))
    return out


# ---------------------------------------------------------------------------------------
# the reader


def table_from_dcp(
    path: str | os.PathLike[str],
    *,
    mesh: Mesh | Mapping[str, Mesh | Mapping[str, int]] | None = None,
) -> DcpLayouts:
    """The layouts, shapes and meshes a DCP checkpoint directory was saved under.

    Reads the checkpoint's ``.metadata`` only (torch's ``FileSystemReader``; no tensor
    data, and, as torch's reader does, it unpickles that file: read checkpoints you
    trust). Each tensor's layout is the one whose ``dcp_chunks`` are exactly its saved
    boxes and which puts each box on the rank whose file holds it; the module's
    docstring says how ties are broken. Without ``mesh``, the meshes are inferred
    (axes ``d0, d1, ...``, the world from the ranks the files name); with ``mesh`` (a
    ``Mesh``, role ``"dense"``, or ``{role: Mesh}``) every tensor is read on those.

    Args:
        path: the checkpoint directory (``dcp.save``'s ``checkpoint_id``).
        mesh: the mesh the checkpoint was saved on, or one per mesh role (each a
            ``Mesh`` or its sizes by axis, ``{"dense": {"tp": 4}}``).

    Returns:
        ``DcpLayouts``: ``.table`` (composed layouts), ``.shapes``, ``.meshes`` and
        ``.skipped`` (entries that are not tensors).

    Raises:
        PlanError: every tensor no layout writes (a ragged split, a gap, an overlap; each
            problem names the tensor and its chunks), and every tensor torch saved under
            chunks its values do not fill (FSDP2's uneven strided shards).
        LayoutError: ``path`` is no DCP checkpoint, ``mesh`` is malformed.
    """
    given = None if mesh is None else _as_role_meshes(mesh)
    metadata = _read_metadata(path)
    writers = _writers(metadata)
    tensors: list[_Saved] = []
    skipped: list[str] = []
    for fqn, md in metadata.state_dict_metadata.items():
        entry: object = md  # whatever the file holds
        if isinstance(entry, TensorStorageMetadata):
            tensors.append(_saved(str(fqn), entry, writers))
        elif isinstance(entry, BytesStorageMetadata):
            skipped.append(str(fqn))
        else:
            msg = (
                f"{clip(str(fqn))}: the checkpoint's metadata holds {quote(entry)}, neither a "
                "tensor's nor bytes'"
            )
            raise LayoutError(msg, fqn=str(fqn))
    search = _Search()
    problems: list[LayoutError] = []
    layouts: dict[str, SourceLayout] = {}
    if given is not None:
        top = max((rank for s in tensors for _, rank in s.writers), default=0)
        size = next(iter(given.values())).size
        if top >= size:
            msg = (
                f"the checkpoint's files name rank {top}, but mesh has {size} ranks; give "
                "the mesh it was saved on"
            )
            raise LayoutError(msg)
        meshes = given
        where = " or ".join(f"{role} ({m})" for role, m in given.items())
        for saved in tensors:
            layout = next(
                (
                    got
                    for role, m in given.items()
                    if (got := search.fit(saved, m, role)) is not None
                ),
                None,
            )
            if layout is None:
                problems.append(_no_layout(saved, where, "give the mesh it was saved on"))
            else:
                layouts[saved.fqn] = layout
    else:
        meshes, layouts, problems = _infer(tensors, search)
    if problems:
        raise plan_error("reading the checkpoint", problems)
    table = ParamLayoutTable({s.fqn: layouts[s.fqn] for s in tensors})
    shapes = {s.fqn: s.shape for s in tensors}
    hazards = _hazards(table, shapes, meshes)
    if hazards:
        raise plan_error("reading the checkpoint", hazards)
    return DcpLayouts(table, shapes, meshes, tuple(skipped))
