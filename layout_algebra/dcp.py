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

from layout_algebra import _dcp_pickle as dcp
from layout_algebra._args import as_instances, mapping_items
from layout_algebra._files import as_path
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call
from layout_algebra._ranks import Chain
from layout_algebra._shards import chunk_bounds
from layout_algebra._text import clip, quote, ranks_text, some_of
from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.checkpoint import Chunk, saved_boxes
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import plan_error
from layout_algebra.geometry import local_shape_and_offset
from layout_algebra.layout import ParamLayoutTable, SourceLayout, check_table
from layout_algebra.lint import lint
from layout_algebra.mesh import MAX_WORLD, Mesh
from layout_algebra.placements import Placement, Replicate, Shard, StridedShard
from layout_algebra.shapes import ParamShape, as_dtype

__all__ = ["DcpLayouts", "table_from_dcp"]

_WRITER: Final = re.compile(r"__([0-9]{1,9})_[0-9]+\.distcp")
"""``FileSystemWriter``'s file names: ``__{rank}_{n}.distcp``."""

T = TypeVar("T")

_DEFAULT_ROLE: Final = "dense"
_MAX_LAYOUTS: Final = 1 << 16
"""The most layouts tried for one tensor on one mesh: a bound on the search."""
_MAX_INFERRED_AXES: Final = 4
"""Without ``mesh=``, the most axes an inferred mesh has."""


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


@checked_call
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

    table: ParamLayoutTable = attrs.field(validator=_check_table, **REQUIRED)
    shapes: FrozenMap[str, ParamShape] = attrs.field(converter=_as_shapes, **REQUIRED)
    meshes: FrozenMap[str, Mesh] = attrs.field(converter=_as_meshes, **REQUIRED)
    skipped: tuple[str, ...] = attrs.field(default=(), converter=_as_skipped)

    def __attrs_pre_init__(
        self,
        table: ParamLayoutTable,
        shapes: Mapping[str, ParamShape],
        meshes: Mapping[str, Mesh],
        skipped: Iterable[str],
    ) -> None:
        check_init(self, "table", (table, shapes, meshes, skipped))


@attrs.frozen
class _Saved:
    """One tensor as the metadata records it: its boxes and, where known, their writers."""

    fqn: str
    shape: ParamShape
    chunks: tuple[Chunk, ...]
    writers: tuple[tuple[Chunk, int], ...]
    grid: _Grid | None = attrs.field(
        default=attrs.Factory(lambda self: _grid(self.shape.shape, self.chunks), takes_self=True)
    )
    """Per dim, the distinct ``(offset, size)`` the boxes take along it, when the boxes
    are exactly their product (as every layout's are); else ``None``."""

    pieces: tuple[_Pieces, ...] = attrs.field(
        default=attrs.Factory(lambda self: _pieces(self.grid), takes_self=True)
    )
    key: _Key = attrs.field(
        default=attrs.Factory(
            lambda self: _Key(self.shape.shape, self.chunks, self.writers), takes_self=True
        )
    )
    """What the layout depends on: tensors alike share one search."""


@attrs.frozen(cache_hash=True)
class _Key:
    """A tensor's shape, boxes and their known writers, hashed once (a search looks a
    tensor up once per mesh it tries)."""

    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]
    writers: tuple[tuple[Chunk, int], ...]


_Grid: TypeAlias = tuple[tuple[tuple[int, int], ...], ...]


@attrs.frozen(eq=False)
class _Pieces:
    """One dim's pieces of a grid: in order, and as sets to look a box or offset up."""

    boxes: tuple[tuple[int, int], ...]
    kept: frozenset[tuple[int, int]]
    offsets: frozenset[int]


def _pieces(grid: _Grid | None) -> tuple[_Pieces, ...]:
    if grid is None:
        return ()
    return tuple(_Pieces(b, frozenset(b), frozenset(o for o, _ in b)) for b in grid)


def _grid(shape: tuple[int, ...], chunks: Sequence[Chunk]) -> _Grid | None:
    """Per dim, the ``(offset, size)`` pairs ``chunks`` take, sorted, when ``chunks`` are
    their product with one size per offset; else ``None``.

    Each mesh axis shards one dim, so every layout's boxes are such a product: a set of
    boxes that is not is refused in one pass, with no layout tried.
    """
    per_dim: list[dict[int, int]] = [{} for _ in shape]
    for c in chunks:
        for sizes, o, n in zip(per_dim, c.offsets, c.sizes, strict=True):
            if sizes.setdefault(o, n) != n:
                return None
    if math.prod(map(len, per_dim)) != len(chunks):  # chunks are distinct: a product
        return None
    return tuple(tuple(sorted(d.items())) for d in per_dim)


def _longer_than_first(grid: _Grid) -> tuple[int, tuple[int, int], tuple[int, int]] | None:
    """A dim whose piece at offset 0 is not its longest, with the two pieces, if any.

    torch.chunk's first piece is its longest, FSDP2's ``_S(d, k)`` gives its first index
    the first chunk of every piece, and a later axis chunks what that holds: on every
    dim, the first index of every layout the search tries holds the most rows, so boxes
    that break this are refused with no mesh tried.
    """
    for d, boxes in enumerate(grid):
        first = boxes[0]
        longer = max(boxes, key=lambda box: box[1])
        if first[0] == 0 and longer[1] > first[1]:
            return d, first, longer
    return None


# ---------------------------------------------------------------------------------------
# reading the metadata


def _metadata_file(path: str | os.PathLike[str]) -> Path:
    """The ``.metadata`` of checkpoint directory ``path``, checked to be there."""
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
    return where / ".metadata"


@attrs.frozen
class _Metadata:
    """What the package reads of a ``.metadata``: its entries and storage records."""

    entries: dict[str, object]
    storage: dict[object, object]


def _read_metadata(path: str | os.PathLike[str]) -> _Metadata:
    """The entries of a checkpoint's ``.metadata``, read with DCP's classes alone
    (``_dcp_pickle``): nothing in the file is run."""
    file = _metadata_file(path)
    got = dcp.load_metadata(str(file))
    shown = clip(str(file))
    if not isinstance(got, dcp.Metadata):
        msg = f"{shown!r} holds no DCP Metadata ({quote(got)}); give the metadata dcp.save wrote"
        raise LayoutError(msg)
    entries, storage = got.field("state_dict_metadata", 0), got.field("storage_data", 2)
    if type(entries) is not dict:
        msg = f"{shown!r} holds entries of no dict ({quote(entries)}); it is damaged"
        raise LayoutError(msg)
    for fqn in entries:
        if type(fqn) is not str:
            msg = (
                f"{shown!r} names a tensor {quote(fqn)}, which is no FQN (DCP's names are "
                "str); the file is damaged or not torch's"
            )
            raise LayoutError(msg)
    return _Metadata(entries, storage if type(storage) is dict else {})


def _whole_numbers(value: object) -> tuple[int, ...] | None:
    """``value`` as torch writes a size or offsets (a ``torch.Size`` of ints >= 0), or
    ``None`` when it is not one."""
    if not isinstance(value, tuple) or type(value) not in _SIZES or len(value) > MAX_DIMS:
        return None
    items = tuple(value)
    if all(type(n) is int and 0 <= n <= _INT64_MAX for n in items):
        return items
    return None


_SIZES: Final = (dcp.Size, tuple)
MAX_DIMS: Final = 64
"""A tensor has fewer dims than this (torch's own limit)."""
_INT64_MAX: Final = 2**63 - 1


def _writers(metadata: _Metadata) -> dict[tuple[str, tuple[int, ...]], int]:
    """The rank that wrote each box, by (FQN, offsets), where the file names say.

    Storage records of another form say nothing (what the names say is evidence, never
    required); a rank beyond any world followed here is an error, not evidence.
    """
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    for index, info in metadata.storage.items():
        if not isinstance(index, dcp.MetadataIndex) or not isinstance(info, dcp.StorageInfo):
            continue
        fqn, name = index.field("fqn", 0), info.field("relative_path", 0)
        offset = _whole_numbers(index.field("offset", 1))
        if type(fqn) is not str or offset is None or type(name) is not str:
            continue
        m = _WRITER.fullmatch(name)
        if m is None:
            continue
        rank = int(m.group(1))
        if rank >= MAX_WORLD:
            msg = (
                f"{clip(fqn)}: the checkpoint names its file {quote(name)}, written by rank "
                f"{rank:,}, beyond the {MAX_WORLD:,} ranks followed here; the file is "
                "damaged or not torch's"
            )
            raise LayoutError(msg, fqn=fqn)
        out[fqn, offset] = rank
    return out


def _damaged(fqn: str, field: str, value: object, what: str) -> LayoutError:
    msg = (
        f"{clip(fqn)}: the checkpoint's metadata gives its {field} as {quote(value)}, but "
        f"torch writes {what}; the file is damaged or not torch's"
    )
    return LayoutError(msg, fqn=fqn)


_NUMBERS: Final = "a torch.Size of whole numbers >= 0"


def _saved(
    fqn: str,
    md: dcp.TensorStorageMetadata,
    writers: Mapping[tuple[str, tuple[int, ...]], int],
) -> _Saved:
    """One tensor's entry, checked field by field: a dtype, a shape, and boxes of the
    tensor's rank, each of them of the types torch writes."""
    properties = md.field("properties", 0)
    dtype = properties.field("dtype", 0) if isinstance(properties, dcp.TensorProperties) else None
    if not isinstance(dtype, dcp.Dtype):
        raise _damaged(fqn, "properties.dtype", dtype, "a torch dtype")
    size = _whole_numbers(md.field("size", 1))
    if size is None:
        raise _damaged(fqn, "size", md.field("size", 1), _NUMBERS)
    try:
        shape = ParamShape(size, as_dtype(str(dtype)))
    except LayoutError as e:  # a dtype the package does not know, a size beyond int64
        msg = f"{clip(fqn)}: the checkpoint's metadata of it is no tensor's: {e.message}"
        raise LayoutError(msg, fqn=fqn) from None
    raw = md.field("chunks", 2)
    if type(raw) is not list:
        raise _damaged(fqn, "chunks", raw, "a list of ChunkStorageMetadata")
    if len(raw) > MAX_WORLD:
        msg = (
            f"{clip(fqn)}: {len(raw):,} chunks, more than the {MAX_WORLD:,} ranks followed "
            "here; the checkpoint's metadata is no tensor's"
        )
        raise LayoutError(msg, fqn=fqn)
    chunks: list[Chunk] = []
    for i, c in enumerate(raw):
        if not isinstance(c, dcp.ChunkStorageMetadata):
            raise _damaged(fqn, f"chunks[{i}]", c, "a ChunkStorageMetadata")
        offsets, sizes = _whole_numbers(c.field("offsets", 0)), _whole_numbers(c.field("sizes", 1))
        if offsets is None:
            raise _damaged(fqn, f"chunks[{i}].offsets", c.field("offsets", 0), _NUMBERS)
        if sizes is None:
            raise _damaged(fqn, f"chunks[{i}].sizes", c.field("sizes", 1), _NUMBERS)
        if len(offsets) != len(size) or len(sizes) != len(size):
            msg = (
                f"{clip(fqn)}: chunk {i} has {len(offsets)} offsets and {len(sizes)} sizes, "
                f"the tensor {shape} has {len(size)} dims; the checkpoint's metadata is damaged"
            )
            raise LayoutError(msg, fqn=fqn)
        try:
            chunks.append(Chunk(offsets, sizes))
        except LayoutError as e:  # a box ending beyond int64
            msg = f"{clip(fqn)}: chunk {i} of the checkpoint's metadata is no box: {e.message}"
            raise LayoutError(msg, fqn=fqn) from None
    chunks.sort()
    found = tuple((c, writers[fqn, c.offsets]) for c in chunks if (fqn, c.offsets) in writers)
    return _Saved(fqn, shape, tuple(chunks), found)


# ---------------------------------------------------------------------------------------
# the layouts that write a tensor's boxes


def _sharded_dims(grid: _Grid, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The dims the boxes cut, each with how many extents it takes: ``(dim, count)``."""
    return [(d, len(e)) for d, (e, n) in enumerate(zip(grid, shape, strict=True)) if e != ((0, n),)]


class _Search:
    """Finds each tensor's layout on a mesh, once per distinct (shape, boxes, writers).

    A layout writes a tensor's boxes exactly when, on every dim, the boxes its chain of
    axes gives are the ones seen there (the boxes are the product of each dim's), so each
    candidate is checked dim by dim against one computation per (rows, chain); only a
    layout that gives every dim's boxes has its writers checked rank by rank.
    """

    def __init__(self) -> None:
        self.found: dict[tuple[_Key, Mesh], SourceLayout | None] = {}
        self.ends: dict[tuple[int, tuple[tuple[int, int], ...]], _Ends] = {}
        self.boxes: dict[tuple[int, tuple[tuple[int, int], ...]], tuple[tuple[int, int], ...]] = {}

    def fit(self, saved: _Saved, mesh: Mesh, role: str) -> SourceLayout | None:
        """The first layout on ``mesh`` that writes ``saved``, on mesh role ``role``."""
        key = (saved.key, mesh)
        if key not in self.found:  # searched under the default role, whatever the role
            self.found[key] = next(
                (c for c in self._candidates(saved, mesh) if _writers_agree(saved, c, mesh)),
                None,
            )
        found = self.found[key]
        if found is None or role == _DEFAULT_ROLE:
            return found
        return SourceLayout(role, found.axes, found.placements)

    def _dim_fits(self, n: int, chain: Chain, want: _Pieces) -> bool:
        """Whether ``chain`` cuts ``n`` rows into the pieces ``want``: first by three of
        its indices' boxes (arithmetic), then, for the few chains those leave, whole."""
        if want.boxes[0][1] != _first_length(n, chain):
            return False  # most chains, by arithmetic alone
        key = (n, tuple((size, k) for _, size, k in chain))
        ends = self.ends.get(key)
        if ends is None:
            ends = self.ends[key] = _end_boxes(n, chain)
        first, second, last = ends
        # the first index's box is kept at offset 0, the second's at its own offset (the
        # first holds the most rows); the last's offset may be an earlier index's
        if want.boxes[0] != first or second not in want.kept or last[0] not in want.offsets:
            return False
        boxes = self.boxes.get(key)
        if boxes is None:
            got = saved_boxes(n, chain)
            boxes = self.boxes[key] = tuple(zip(got.offsets, got.sizes, strict=True))
        return boxes == want.boxes

    def _candidates(self, saved: _Saved, mesh: Mesh) -> Iterator[SourceLayout]:
        """Every layout on ``mesh`` that writes ``saved``'s boxes, in the order of
        preference the module's docstring states."""
        grid, shape = saved.grid, saved.shape.shape
        if grid is None or _longer_than_first(grid) is not None:
            return
        dims = _sharded_dims(grid, shape)
        cut = sum(1 for n in mesh.sizes if n > 1)
        if len(dims) > cut:
            return  # each cut dim needs an axis of its own
        wanted = [d for d, _ in dims]
        options: list[list[int | None]] = [[*wanted, None] if n > 1 else [None] for n in mesh.sizes]
        if math.prod(map(len, options)) > _MAX_LAYOUTS:
            msg = (
                f"{clip(saved.fqn)}: mesh {mesh} gives more than {_MAX_LAYOUTS:,} layouts to "
                "try for it; give mesh= a mesh with fewer axes (axes of size 1 cost nothing)"
            )
            raise LayoutError(msg, fqn=saved.fqn)
        names, sizes = mesh.names, mesh.sizes
        for assign in itertools.product(*options):
            axes_of = {d: [i for i, a in enumerate(assign) if a == d] for d in wanted}
            if any(math.prod(sizes[i] for i in axes_of[d]) < count for d, count in dims):
                continue  # too few pieces for the extents seen (covers a dim no axis cuts)
            shared = [d for d in wanted if len(axes_of[d]) > 1]
            for strided in itertools.product((True, False), repeat=len(shared)):
                first = {axes_of[d][0]: d for d, s in zip(shared, strided, strict=True) if s}
                splits = [1] * len(assign)
                for i, d in first.items():
                    splits[i] = math.prod(sizes[j] for j in axes_of[d] if j > i)
                if all(
                    self._dim_fits(
                        shape[d],
                        tuple((names[i], sizes[i], splits[i]) for i in axes_of[d]),
                        saved.pieces[d],
                    )
                    for d in wanted
                ):
                    yield SourceLayout(_DEFAULT_ROLE, names, _placements(assign, splits))


_Ends: TypeAlias = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


def _first_length(n: int, chain: Chain) -> int:
    """How many rows the first index on ``chain`` holds of ``n``: for a chain the search
    makes (``Shard``s, FSDP2's ``_S(d, k)`` first), in closed form.

    ``_S(d, k)`` over ``a`` ranks cuts the rows into torch.chunk's ``k`` pieces (all of
    one length but the tail) and gives each rank its chunk of every piece; later axes
    chunk what the rank holds, the first index taking the first chunk each time.
    """
    (_, a, k), *rest = chain
    length = n
    if k > 1:
        piece = -(-n // k)
        full, tail = divmod(n, piece) if piece else (0, 0)
        length = full * min(-(-piece // a), piece) + min(-(-tail // a), tail)
    else:
        rest = list(chain)
    for _, b, _ in rest:
        length = min(-(-length // b), length)
    return length


def _end_boxes(n: int, chain: Chain) -> _Ends:
    """The ``(offset, size)`` of the first, the second and the last index on ``chain`` over
    ``n`` rows: by arithmetic for a chain of ``Shard``s, by the geometry for any other."""
    indices = (
        [0] * len(chain),
        [*[0] * (len(chain) - 1), 1],
        [size - 1 for _, size, _ in chain],
    )
    out = []
    if all(k == 1 for _, _, k in chain):
        for index in indices:
            offset, length = 0, n
            for (_, size, _), i in zip(chain, index, strict=True):
                lo, hi = chunk_bounds(length, size, i)
                offset, length = offset + lo, hi - lo
            out.append((offset if length else n, length))  # DTensor's offset of nothing
        return out[0], out[1], out[2]
    placements: list[Placement] = [
        Shard(0) if k == 1 else StridedShard(0, split_factor=k) for _, _, k in chain
    ]
    layout = SourceLayout(_DEFAULT_ROLE, [a for a, _, _ in chain], placements)
    sizes = {a: size for a, size, _ in chain}
    for index in indices:
        at = dict(zip(sizes, index, strict=True))
        (length,), (offset,) = local_shape_and_offset((n,), layout, sizes, at)
        out.append((offset, length))
    return out[0], out[1], out[2]


def _placements(assign: Sequence[int | None], splits: Sequence[int]) -> list[Placement]:
    """Each axis's placement: the dim it shards (``StridedShard`` with a split), or ``R``."""
    return [
        Replicate() if d is None else Shard(d) if k == 1 else StridedShard(d, split_factor=k)
        for d, k in zip(assign, splits, strict=True)
    ]


def _writers_agree(saved: _Saved, layout: SourceLayout, mesh: Mesh) -> bool:
    """Whether ``layout`` on ``mesh`` puts each of ``saved``'s boxes on its writer."""
    for chunk, rank in saved.writers:
        if rank >= mesh.size:
            return False
        coordinate = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
        sizes, offsets = local_shape_and_offset(saved.shape.shape, layout, mesh, coordinate)
        if Chunk(offsets, sizes) != chunk:
            return False
    return True


# ---------------------------------------------------------------------------------------
# why no layout writes them

_PAIRS_CHECKED: Final = 1 << 16
"""An error message looks for two overlapping boxes among at most this many pairs."""


def _overlap(a: Chunk, b: Chunk) -> bool:
    return all(
        oa < ob + nb and ob < oa + na
        for oa, na, ob, nb in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def _dim_problem(saved: _Saved, grid: _Grid, d: int) -> str | None:
    """What is wrong with dim ``d``'s pieces of a grid, if anything: an overlap or a gap."""
    n, at, last = saved.shape.shape[d], 0, (0, 0)
    for o, size in grid[d]:
        if size and o < at:
            # the grid holds both pieces beside the first box's other extents
            base = saved.chunks[0]
            a, b = (
                Chunk(
                    (*base.offsets[:d], off, *base.offsets[d + 1 :]),
                    (*base.sizes[:d], length, *base.sizes[d + 1 :]),
                )
                for off, length in (last, (o, size))
            )
            return f"chunks {a} and {b} overlap"
        if size and o > at:
            return f"rows {at}:{o} of dim {d} are in no chunk: a gap"
        if size:
            at, last = max(at, o + size), (o, size)
    return f"rows {at}:{n} of dim {d} are in no chunk: a gap" if at < n else None


def _some_overlap(chunks: Sequence[Chunk]) -> tuple[Chunk, Chunk] | None:
    """Two boxes that overlap, looked for by a sweep along dim 0 within a bounded
    number of pairs (a message's search, never the reading's)."""
    full = sorted((c for c in chunks if c.numel), key=lambda c: c.offsets[:1])
    pairs = 0
    for i, a in enumerate(full):
        end = a.offsets[0] + a.sizes[0] if a.offsets else None
        for b in full[i + 1 :]:
            if end is not None and b.offsets[0] >= end:
                break  # sorted by dim 0: no later box meets ``a`` there
            pairs += 1
            if _overlap(a, b):
                return a, b
            if pairs >= _PAIRS_CHECKED:
                return None
    return None


def _why(saved: _Saved) -> str:
    shape = saved.shape.shape
    for c in saved.chunks:
        if any(o + n > size for o, n, size in zip(c.offsets, c.sizes, shape, strict=True)):
            return f"chunk {c} reaches beyond the tensor"
    if saved.grid is not None:
        return _why_grid(saved, saved.grid)
    found = _some_overlap(saved.chunks)
    if found is not None:
        return f"chunks {found[0]} and {found[1]} overlap"
    covered = sum(c.numel for c in saved.chunks)
    if covered < math.prod(shape):
        return f"they cover {covered:,} of its {math.prod(shape):,} elements: a gap"
    return (
        "they are not the product of each dim's pieces (one piece per offset on every "
        "dim), as the boxes of every layout are"
    )


def _why_grid(saved: _Saved, grid: _Grid) -> str:
    """``_why`` of boxes that are the product of each dim's pieces."""
    for d in range(len(grid)):
        problem = _dim_problem(saved, grid, d)
        if problem is not None:
            return problem
    longer = _longer_than_first(grid)
    if longer is not None:
        d, (_, first), (o, n) = longer
        return (
            f"on dim {d} rows {o}:{o + n} are a longer piece than the first (0:{first}), "
            "which no torch.chunk split makes (its first piece is its longest)"
        )
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
        mesh = {_DEFAULT_ROLE: mesh}
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
    remedy = "give mesh= the mesh it was saved on"
    ragged = [s for s in tensors if s.grid is None or _longer_than_first(s.grid) is not None]
    if ragged:  # no layout on any mesh writes these: nothing to search
        return {}, {}, [_no_layout(s, "any mesh", remedy) for s in ragged]
    first: list[_Saved] = []
    for world in range(low, high + 1):
        meshes = _meshes(world)
        if first and any(
            all(search.fit(s, m, _DEFAULT_ROLE) is None for m in meshes) for s in first
        ):
            continue  # a tensor no mesh of this world writes: no cover of every tensor
        roles, layouts, left = _cover(tensors, meshes, search)
        if not left:
            return roles, layouts, []
        first = first or left
    where = f"any mesh of {low} to {high} ranks"
    return {}, {}, [_no_layout(s, where, remedy) for s in first or tensors]


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
    for fqn, entry in metadata.entries.items():
        if isinstance(entry, dcp.TensorStorageMetadata):
            tensors.append(_saved(fqn, entry, writers))
        elif isinstance(entry, dcp.BytesStorageMetadata):
            skipped.append(fqn)
        else:
            msg = (
                f"{clip(fqn)}: the checkpoint's metadata holds {quote(entry)}, neither a "
                "tensor's nor bytes'"
            )
            raise LayoutError(msg, fqn=fqn)
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
