"""Distributed checkpoints: the chunks torch's DCP writes, and what loading them elsewhere reads.

``torch.distributed.checkpoint`` saves a DTensor as one box per rank (its local shard's
offsets and sizes, as DTensor computes them), keeping one copy of the boxes replicated
ranks share. Loading under another layout, each rank's default load planner reads, from
every saved box that overlaps its new local shard, the overlapping region. Both follow
from the layouts and the shapes alone: ``dcp_chunks`` gives the saved boxes,
``reshard_plan`` every destination rank's reads and their bytes, with no process group.

Meshes are described as elsewhere in the package: by mesh role, the sizes of the mesh's
axes, in the mesh's axis order; every role's mesh spans the whole world, laid out
row-major in that order, so a global rank has one coordinate on each.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

import attrs

from layout_algebra._args import (
    MAX_TENSOR_SIZE,
    as_shape,
    mapping_items,
    plain_str,
)
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call, frozen_map_of
from layout_algebra._grouping import group_index, values_by_fqn
from layout_algebra._parts import (
    PartGeometry,
    PartPattern,
    PartPlanner,
    PartSource,
    RankPieces,
    part_spans,
)
from layout_algebra._pipeline import Placed, place
from layout_algebra._ranks import Chain, DimRead, Factor, RankSum, chain_of, read_dim
from layout_algebra._shards import check_dims, check_layout, role_mesh, size_of
from layout_algebra._text import (
    clip,
    escape,
    human_bytes,
    quote,
    rank_groups,
    ranks_str,
    ranks_text,
)
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import (
    FsdpAxes,
    compose_table,
    plan_error,
)
from layout_algebra.layout import (
    ParamLayoutTable,
    SourceLayout,
    check_fqn,
    check_table,
    partial_error,
)
from layout_algebra.mesh import MAX_WORLD, Mesh, as_mesh, as_role_sizes, world_size
from layout_algebra.placements import Replicate
from layout_algebra.shapes import (
    DTYPE_BYTES,
    ParamShape,
    as_dtype,
    fused_experts,
    per_expert_message,
)
from layout_algebra.stages import Stages
from layout_algebra.structure import Packed

if TYPE_CHECKING:
    from layout_algebra.dcp import DcpLayouts

__all__ = [
    "Chunk",
    "HasShape",
    "Read",
    "ReshardPlan",
    "dcp_chunks",
    "reshard_plan",
]

MAX_RANKS: Final = MAX_WORLD
"""``mesh.MAX_WORLD`` under the name the torch bridge imports it by (until it imports
``MAX_WORLD`` itself)."""

# ---------------------------------------------------------------------------------------
# values


# Each field's converter names it: ``as_shape`` checks offsets and sizes alike.
def _as_chunk_offsets(value: Iterable[int]) -> tuple[int, ...]:
    return as_shape(value, "Chunk.offsets")


def _as_chunk_sizes(value: Iterable[int]) -> tuple[int, ...]:
    return as_shape(value, "Chunk.sizes")


def _as_dest_offsets(value: Iterable[int]) -> tuple[int, ...]:
    return as_shape(value, "Read.dest_offsets")


def _as_storage_offsets(value: Iterable[int]) -> tuple[int, ...]:
    return as_shape(value, "Read.storage_offsets")


def _as_lengths(value: Iterable[int]) -> tuple[int, ...]:
    return as_shape(value, "Read.lengths")


def _box(offsets: Sequence[int], sizes: Sequence[int]) -> str:
    return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(offsets, sizes, strict=True)) + "]"


@checked_call
@attrs.frozen(cache_hash=True, order=True)
class Chunk:
    """One box of a tensor as a checkpoint records it: where it starts and how big it is.

    ``str`` is the box as slices, ``Chunk((4, 0), (4, 8))`` is ``[4:8, 0:8]``. Chunks
    order by offsets (then sizes). Offsets and sizes are shapes (``as_shape``): as many
    of each, and every box ends within int64.
    """

    offsets: tuple[int, ...] = attrs.field(converter=_as_chunk_offsets, **REQUIRED)
    sizes: tuple[int, ...] = attrs.field(converter=_as_chunk_sizes, **REQUIRED)

    def __attrs_pre_init__(self, offsets: Iterable[int], sizes: Iterable[int]) -> None:
        check_init(self, "offsets", (offsets, sizes))

    @sizes.validator
    def _check_rank(self, _: attrs.Attribute[tuple[int, ...]], value: object) -> None:
        if len(self.offsets) != len(self.sizes):
            msg = (
                f"a chunk has one offset and one size per dim, got offsets {self.offsets} and "
                f"sizes {self.sizes}"
            )
            raise LayoutError(msg)
        if any(o + n > MAX_TENSOR_SIZE for o, n in zip(self.offsets, self.sizes, strict=True)):
            msg = (
                f"Chunk {self.offsets} + {self.sizes} ends beyond 2**63 - 1, the largest size of "
                "a dim (int64); give a box of the tensor"
            )
            raise LayoutError(msg)

    def __str__(self) -> str:
        return _box(self.offsets, self.sizes)

    @property
    def numel(self) -> int:
        """The number of elements in the box."""
        return math.prod(self.sizes)


def _check_read_fqn(_: object, __: attrs.Attribute[str], value: object) -> None:
    check_fqn(value, "Read.fqn")


def _check_read_chunk(_: object, __: attrs.Attribute[Chunk], value: object) -> None:
    if not isinstance(value, Chunk):
        msg = f"Read.chunk: expected a Chunk such as Chunk((0, 0), (4, 8)), got {quote(value)}"
        raise LayoutError(msg)


def _as_dest_fqn(value: str | None) -> str | None:
    return None if value is None else plain_str(value)


def _check_dest_fqn(_: object, __: attrs.Attribute[str | None], value: object) -> None:
    if value is not None:
        check_fqn(value, "Read.dest_fqn")


@checked_call
@attrs.frozen(cache_hash=True)
class Read:
    """One read a destination rank makes: a box of one saved chunk into its local shard.

    ``storage_offsets`` are relative to the saved ``chunk``, ``dest_offsets`` to the
    rank's local shard, and ``lengths`` is the box's size: torch's ``ReadItem`` for that
    parameter, with the saved chunk in place of its storage index. Each field is checked
    (a wrong type is a ``LayoutError`` naming it); the box has the chunk's dims and lies
    within it.

    A read between a fused tensor and its parts (``reshard_plan(parts=...)``) names the
    loaded tensor as ``dest_fqn``: ``fqn`` and ``chunk`` stay the saved tensor's (the
    fused one's offsets, or a part's), ``dest_offsets`` are in ``dest_fqn``'s local shard.
    ``dest_fqn`` is ``None`` when the read loads ``fqn`` itself.
    """

    fqn: str = attrs.field(converter=plain_str, validator=_check_read_fqn, **REQUIRED)
    chunk: Chunk = attrs.field(validator=_check_read_chunk, **REQUIRED)
    dest_offsets: tuple[int, ...] = attrs.field(converter=_as_dest_offsets, **REQUIRED)
    storage_offsets: tuple[int, ...] = attrs.field(converter=_as_storage_offsets, **REQUIRED)
    lengths: tuple[int, ...] = attrs.field(converter=_as_lengths, **REQUIRED)
    dest_fqn: str | None = attrs.field(
        default=None, converter=_as_dest_fqn, validator=_check_dest_fqn
    )

    def __attrs_pre_init__(  # noqa: PLR0917 - attrs passes every field, in field order
        self,
        fqn: str,
        chunk: Chunk,
        dest_offsets: Iterable[int],
        storage_offsets: Iterable[int],
        lengths: Iterable[int],
        dest_fqn: str | None = None,
    ) -> None:
        check_init(self, "fqn", (fqn, chunk, dest_offsets, storage_offsets, lengths))

    @lengths.validator
    def _check_box(self, _: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
        ndim = len(self.chunk.sizes)
        given = (self.dest_offsets, self.storage_offsets, value)
        if any(len(v) != ndim for v in given):
            msg = (
                f"Read {clip(self.fqn)!r}: dest_offsets {self.dest_offsets}, storage_offsets "
                f"{self.storage_offsets} and lengths {value} each need one int per dim of "
                f"chunk {self.chunk}"
            )
            raise LayoutError(msg, fqn=self.fqn)
        if any(
            o + n > size
            for o, n, size in zip(self.storage_offsets, value, self.chunk.sizes, strict=True)
        ):
            msg = (
                f"Read {clip(self.fqn)!r}: storage_offsets {self.storage_offsets} and lengths "
                f"{value} reach beyond chunk {self.chunk}; a read is a box of its chunk"
            )
            raise LayoutError(msg, fqn=self.fqn)

    def __str__(self) -> str:
        start = [c + o for c, o in zip(self.chunk.offsets, self.storage_offsets, strict=True)]
        into = f" into {self.dest_fqn}" if self.dest_fqn is not None else ""
        return f"{self.fqn}{_box(start, self.lengths)} from chunk {self.chunk}{into}"

    @property
    def numel(self) -> int:
        """The number of elements read."""
        return math.prod(self.lengths)


class HasShape(Protocol):
    """What ``reshard_plan`` needs of a parameter's shape: ``ParamShape`` or the like."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> str: ...


# ---------------------------------------------------------------------------------------
# arguments


def _check_layout(layout: SourceLayout, fqn: str | None = None) -> None:
    check_layout(layout, fqn)
    error = partial_error(layout, fqn)
    if error is not None:
        # DCP refuses a DTensor with a pending reduction, and so does a checkpoint here.
        msg = f"{error.message} (a checkpoint saves whole values)"
        raise LayoutError(msg, fqn=fqn, axis=error.axis, placement=error.placement)


def _check_sizes(layout: SourceLayout, sizes: Mapping[str, int], fqn: str | None) -> Mesh:
    checked = as_mesh(sizes, "mesh_sizes")
    for axis in layout.axes:
        size_of(checked, axis, layout, fqn)
    return checked


# ---------------------------------------------------------------------------------------
# the chunks DCP writes


@attrs.frozen(eq=False)
class _Boxes:
    """One dim's distinct saved boxes, by offset, and their ends (for a search)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    ends: tuple[int, ...]
    sorted_ends: bool
    disjoint: bool
    before: tuple[int, ...]
    """``before[i]``: the rows of the boxes before box ``i``."""

    def overlaps(self, offset: int, length: int) -> list[tuple[int, int, int, int, int]]:
        """The boxes the local box ``offset``/``length`` reads: ``(saved offset, saved
        size, storage offset, dest offset, length)`` each, by offset.

        Boxes overlap when each starts before the other ends (so empty boxes never do), as
        DCP's resharding decides; boxes that do not overlap one another end in order, so
        the candidates are found by bisection.
        """
        stop = bisect_left(self.offsets, offset + length)
        first = bisect_right(self.ends, offset) if self.sorted_ends else 0
        out = []
        for i in range(first, stop):
            s_off, s_len = self.offsets[i], self.sizes[i]
            if offset >= s_off + s_len:
                continue
            start = max(s_off, offset)
            end = min(s_off + s_len, offset + length)
            out.append((s_off, s_len, start - s_off, start - offset, end - start))
        return out

    def count_rows(self, offset: int, length: int) -> tuple[int, int]:
        """How many boxes ``overlaps`` gives and their rows in all: for boxes that do not
        overlap one another, by two bisections (only the first and last are clipped)."""
        if not self.disjoint:
            found = self.overlaps(offset, length)
            return len(found), sum(f[4] for f in found)
        stop = bisect_left(self.offsets, offset + length)
        first = bisect_right(self.ends, offset)
        if first >= stop:
            return 0, 0
        rows = self.before[stop] - self.before[first]
        rows -= max(0, offset - self.offsets[first]) + max(0, self.ends[stop - 1] - offset - length)
        return stop - first, rows

    def count_all(
        self, offsets: Sequence[int], lengths: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """``count_rows`` of every local box ``offsets[i]``/``lengths[i]``, as two lists:
        for saved boxes that do not overlap one another, all the bisections in one pass
        each, and only the first and last box of each read clipped."""
        if not self.disjoint:  # each distinct box once: replicas read alike
            by_box: dict[tuple[int, int], tuple[int, int]] = {}
            for box in zip(offsets, lengths, strict=True):
                if box not in by_box:
                    by_box[box] = self.count_rows(*box)
            got = [by_box[box] for box in zip(offsets, lengths, strict=True)]
            return [c for c, _ in got], [r for _, r in got]
        his = list(map(operator.add, offsets, lengths))
        stops = map(bisect_left, itertools.repeat(self.offsets), his)
        firsts = map(bisect_right, itertools.repeat(self.ends), offsets)
        at, ends, before = self.offsets, self.ends, self.before
        count, rows = [], []
        for lo, hi, first, stop in zip(offsets, his, firsts, stops, strict=True):
            if first >= stop:
                count.append(0)
                rows.append(0)
                continue
            clipped = (lo - at[first] if lo > at[first] else 0) + (
                ends[stop - 1] - hi if ends[stop - 1] > hi else 0
            )
            count.append(stop - first)
            rows.append(before[stop] - before[first] - clipped)
        return count, rows


_Saved: TypeAlias = tuple[_Boxes, ...]
"""Per tensor dim, the distinct saved boxes along it."""


def _saved(
    layout: SourceLayout, shape: tuple[int, ...], sizes: Mapping[str, int], dims: _Dims
) -> _Saved:
    """Per tensor dim, the boxes DTensor gives the ranks along it (``read_dim``).

    Each mesh axis shards at most one dim, so the saved boxes are the product of these:
    2 dims sharded over 2 and 4 ranks are 2 x 4 boxes. DCP keys a box by its offsets, so
    of two boxes with one offset on a dim the first in rank order is kept.
    """
    check_dims(layout, len(shape), shape=shape)  # a dim the tensor lacks is no box of it
    ranks = math.prod(sizes[a.name] for a in layout.axes)
    if ranks > MAX_WORLD:
        msg = (
            f"{layout}: its mesh has {ranks:,} ranks, more than the {MAX_WORLD:,} a world has "
            "here; check the mesh sizes"
        )
        raise LayoutError(msg)
    return tuple(dims.boxes(n, chain_of(layout, dim, sizes)) for dim, n in enumerate(shape))


def saved_boxes(n: int, chain: Chain) -> _Boxes:
    """One dim's distinct saved boxes over ``chain``: the first of each offset, sorted."""
    got = read_dim(n, chain)
    # of the boxes at one offset the first in rank order, which a reversed dict keeps last
    first = dict(zip(reversed(got.offsets), reversed(got.lengths), strict=True))
    offsets = tuple(sorted(first))
    sizes = tuple(map(first.__getitem__, offsets))
    ends = tuple(map(operator.add, offsets, sizes))
    return _Boxes(
        offsets,
        sizes,
        ends,
        list(ends) == sorted(ends),
        all(map(operator.le, ends, offsets[1:])),
        tuple(itertools.accumulate(sizes, initial=0)),
    )


class _Dims:
    """One call's work on single dims, by value: tensors share most of their dims (a
    model's hidden size, its unsharded dims), so each (rows, chain) is worked out once."""

    def __init__(self) -> None:
        self.saved: dict[tuple[int, Chain], _Boxes] = {}
        self.read: dict[tuple[int, Chain, Chain], tuple[DimRead, Factor, Factor]] = {}

    def boxes(self, n: int, chain: Chain) -> _Boxes:
        found = self.saved.get((n, chain))
        if found is None:
            found = self.saved[n, chain] = saved_boxes(n, chain)
        return found

    def reads(self, n: int, src: Chain, dst: Chain) -> tuple[DimRead, Factor, Factor]:
        """The boxes ``dst`` reads, and by index on it how many saved boxes and rows."""
        key = (n, src, dst)
        found = self.read.get(key)
        if found is None:
            read = read_dim(n, dst)
            count, rows = self.boxes(n, src).count_all(read.offsets, read.lengths)
            found = self.read[key] = (read, (read.axes, count), (read.axes, rows))
        return found


def _chunks(
    layout: SourceLayout, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> tuple[Chunk, ...]:
    saved = _saved(layout, shape, sizes, _Dims())
    per_dim = [zip(b.offsets, b.sizes, strict=True) for b in saved]
    return tuple(
        Chunk(tuple(o for o, _ in box), tuple(n for _, n in box))
        for box in itertools.product(*per_dim)
    )


def dcp_chunks(
    layout: SourceLayout, global_shape: Iterable[int], mesh_sizes: Mapping[str, int]
) -> tuple[Chunk, ...]:
    """The distinct boxes torch's distributed checkpoint records for one parameter.

    Every rank saves its local shard as the box DTensor computes for it
    (``local_shape_and_offset``); ranks holding the same box (replicas) write one copy,
    since DCP keys boxes by their offsets. Empty tail shards are boxes too, with the
    dim's size as offset and 0 as size: 5 rows ``S(0)`` over 4 ranks are saved as
    ``[0:2]``, ``[2:4]``, ``[4:5]`` and ``[5:5]``. A plain tensor (no axes) is one box,
    the whole tensor.

    Give the layout the parameter has when saved, after ``fully_shard``
    (``compose_fsdp``, ``compose_table``). DCP records a ``StridedShard``'s box as DTensor
    reads it, from the first row the rank holds, which is the rank's data only where its
    rows are contiguous (always with even shards; ``lint`` reports where not).

    >>> from layout_algebra import Shard
    >>> layout = SourceLayout("dense", ["dp_shard", "tp"], [Shard(0), Shard(1)])
    >>> [str(c) for c in dcp_chunks(layout, (4, 6), {"dp_shard": 2, "tp": 2})]
    ['[0:2, 0:3]', '[0:2, 3:6]', '[2:4, 0:3]', '[2:4, 3:6]']

    Args:
        layout: the parameter's layout (composed, when FSDP shards it).
        global_shape: the parameter's shape.
        mesh_sizes: the size of every axis of ``layout``, by name (others are ignored).

    Returns:
        The boxes, sorted by offsets.

    Raises:
        LayoutError: a ``Partial`` (DCP saves whole values), a shard of a dim the tensor
            lacks, an axis with no size, a ``global_shape`` that is no shape (``as_shape``).
    """
    _check_layout(layout)
    shape = as_shape(global_shape, "global_shape")
    sizes = _check_sizes(layout, mesh_sizes, None)
    return _chunks(layout, shape, sizes)


# ---------------------------------------------------------------------------------------
# the reads of a load


@attrs.frozen
class _Piece:
    """A read without its FQN: which saved chunk, which box of it, where it lands."""

    chunk: Chunk
    dest_offsets: tuple[int, ...]
    storage_offsets: tuple[int, ...]
    lengths: tuple[int, ...]


@attrs.frozen(eq=False)
class _Pattern:
    """One (source layout, layout, shape, dtype)'s reads on every destination rank.

    Per tensor dim, the saved boxes along it and, by index on the axes that shard it in the
    destination layout, how many of them a rank reads and how many rows; a rank's reads
    are the product over the dims, listed only for the rank asked (``pieces``).
    """

    role: str
    mesh: Mesh
    itemsize: int
    saved: _Saved
    dst: tuple[DimRead, ...]
    reads: tuple[Factor, ...]
    rows: tuple[Factor, ...]
    total: int
    count: int

    def pieces(self, rank: int) -> tuple[_Piece, ...]:
        """Destination rank ``rank``'s reads, by the saved chunks' offsets."""
        where = dict(zip(self.mesh.names, self.mesh.coordinate(rank), strict=True))
        per_dim = []
        for saved, read in zip(self.saved, self.dst, strict=True):
            i = 0
            for axis, size, _ in read.chain:
                i = i * size + where[axis]
            per_dim.append(saved.overlaps(read.offsets[i], read.lengths[i]))
        return tuple(
            _Piece(
                Chunk(tuple(b[0] for b in box), tuple(b[1] for b in box)),
                tuple(b[3] for b in box),
                tuple(b[2] for b in box),
                tuple(b[4] for b in box),
            )
            for box in itertools.product(*per_dim)
        )


def _pattern(
    saved: _Saved,
    src: tuple[SourceLayout, Mesh],
    dst: tuple[SourceLayout, Mesh],
    *,
    shape: tuple[int, ...],
    itemsize: int,
    dims: _Dims,
) -> _Pattern:
    """The reads of a parameter saved under ``src`` and loaded under ``dst``."""
    (old, src_mesh), (layout, mesh) = src, dst
    found = [
        dims.reads(n, chain_of(old, dim, src_mesh), chain_of(layout, dim, mesh))
        for dim, n in enumerate(shape)
    ]
    reads = tuple(f[1] for f in found)
    rows = tuple(f[2] for f in found)
    copies = mesh.size // math.prod(len(v) for _, v in reads)
    total = itemsize * copies * math.prod(sum(v) for _, v in rows)
    count_all = copies * math.prod(sum(v) for _, v in reads)
    return _Pattern(
        layout.mesh,
        mesh,
        itemsize,
        saved,
        tuple(f[0] for f in found),
        reads,
        rows,
        total,
        count_all,
    )


class _Planner:
    """Plans each distinct (source layout, destination layout, shape, itemsize) once, by
    value, and counts the parameters sharing it."""

    def __init__(self, src: Mapping[str, Mesh], dst: Mapping[str, Mesh]) -> None:
        self.src, self.dst = src, dst
        self.saved: dict[tuple[SourceLayout, tuple[int, ...]], _Saved] = {}
        self.patterns: dict[tuple[SourceLayout, SourceLayout, tuple[int, ...], int], _Pattern] = {}
        self.dims = _Dims()
        self.parts = PartPlanner()

    def pattern(
        self, fqn: str, src: SourceLayout, dst: SourceLayout, shape: tuple[int, ...], itemsize: int
    ) -> _Pattern:
        key = (src, dst, shape, itemsize)
        found = self.patterns.get(key)
        if found is None:
            src_mesh = role_mesh(self.src, src, "src_sizes", fqn)
            dst_mesh = role_mesh(self.dst, dst, "dst_sizes", fqn)
            saved = self.saved.get((src, shape))
            if saved is None:
                saved = self.saved[src, shape] = _saved(src, shape, src_mesh, self.dims)
            check_dims(dst, len(shape), shape=shape)
            found = self.patterns[key] = _pattern(
                saved,
                (src, src_mesh),
                (dst, dst_mesh),
                shape=shape,
                itemsize=itemsize,
                dims=self.dims,
            )
        return found


def _layout_str(layout: SourceLayout) -> str:
    return str(layout) if layout.axes else f"{layout.mesh} (plain tensor)"


def _source_str(src: ParamLayoutTable, fqn: str, pattern: _Pattern | PartPattern) -> str:
    """Where ``fqn`` is read from, for a report: its saved layout, or the parts' sources."""
    return pattern.source if isinstance(pattern, PartPattern) else _layout_str(src[fqn])


_REPORT_GROUPS: Final = 16
_REPORT_PARAMS: Final = 10


@attrs.frozen(repr=False, init=False)
class ReshardPlan:
    """Every read a checkpoint's load makes, by destination rank, and what it costs.

    Made by ``reshard_plan`` only. ``bytes_read[rank]`` is what destination rank ``rank``
    reads from the checkpoint; ``by_param[fqn]`` what all ranks together read of one
    parameter. ``reads(rank)`` lists the rank's reads, parameters in the destination
    table's order, each one's by the saved chunk's offsets (torch issues the same reads,
    in an order of its own). ``str()`` is a report: bytes per rank, total, largest, the
    parameters that move most.
    """

    bytes_read: tuple[int, ...]
    by_param: FrozenMap[str, int]
    _src: ParamLayoutTable
    _dst: ParamLayoutTable
    _fqns: tuple[str, ...] = attrs.field(eq=False)
    _kinds: tuple[_Pattern | PartPattern, ...] = attrs.field(eq=False)
    """Each parameter's reads (``_fqns[i]``'s are ``_kinds[i]``): a few shared patterns."""
    _counts: tuple[int, ...] = attrs.field(eq=False)
    """Reads by destination rank."""
    _staged: Placed | None = attrs.field(default=None, eq=False)
    """With stages: each parameter's stage and every rank's pipeline coordinate."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        msg = (
            "ReshardPlan values are made by reshard_plan(src, dst, shapes, src_sizes=..., "
            "dst_sizes=...), which plans every read; call it instead"
        )
        raise LayoutError(msg)

    @classmethod
    def _planned(
        cls,
        *,
        bytes_read: tuple[int, ...],
        by_param: FrozenMap[str, int],
        tables: tuple[ParamLayoutTable, ParamLayoutTable],
        fqns: tuple[str, ...],
        kinds: tuple[_Pattern | PartPattern, ...],
        counts: tuple[int, ...],
        staged: Placed | None = None,
    ) -> ReshardPlan:
        plan = cls.__new__(cls)
        plan.__attrs_init__(bytes_read, by_param, *tables, fqns, kinds, counts, staged)
        return plan

    def __repr__(self) -> str:
        return (
            f"ReshardPlan(ranks={len(self.bytes_read)}, params={len(self.by_param)}, "
            f"total={self.total})"
        )

    @property
    def world_size(self) -> int:
        """The number of destination ranks."""
        return len(self.bytes_read)

    @property
    def total(self) -> int:
        """Bytes all destination ranks read together."""
        return sum(self.bytes_read)

    @property
    def largest(self) -> tuple[int, int]:
        """``(rank, bytes)`` of the destination rank that reads most (the lowest such rank)."""
        rank = max(range(len(self.bytes_read)), key=self.bytes_read.__getitem__)
        return rank, self.bytes_read[rank]

    @property
    def smallest(self) -> tuple[int, int]:
        """``(rank, bytes)`` of the destination rank that reads least (the lowest such rank)."""
        rank = min(range(len(self.bytes_read)), key=self.bytes_read.__getitem__)
        return rank, self.bytes_read[rank]

    def reads(self, rank: int) -> tuple[Read, ...]:
        """Destination rank ``rank``'s reads, in the destination table's order; worked out
        for that rank alone, each distinct kind of parameter once.

        Raises:
            LayoutError: ``rank`` is not a destination rank.
        """
        if type(rank) is not int or not 0 <= rank < len(self.bytes_read):
            msg = (
                f"rank must be an int in [0, {len(self.bytes_read)}) (the destination ranks), "
                f"got {quote(rank)}"
            )
            raise LayoutError(msg)
        pieces: dict[_Pattern, tuple[_Piece, ...]] = {}
        parted: dict[PartGeometry, RankPieces] = {}
        out: list[Read] = []
        staged = self._staged
        for i, (fqn, pattern) in enumerate(zip(self._fqns, self._kinds, strict=True)):
            if (
                staged is not None
                and staged.rank_of(staged.assignment.of[i] or 0) != (staged.pp_index[rank])
            ):
                continue  # another pipeline rank's stage loads it
            if isinstance(pattern, PartPattern):
                found = parted.get(pattern.geometry)
                if found is None:  # parameters of one signature read alike but for FQNs
                    found = parted[pattern.geometry] = pattern.geometry.pieces(rank)
                out.extend(
                    Read(name, Chunk(offsets, sizes), dest, storage, lengths, dest_fqn=fqn)
                    for name, offsets, sizes, dest, storage, lengths in pattern.pieces(rank, found)
                )
                continue
            got = pieces.get(pattern)
            if got is None:
                got = pieces[pattern] = pattern.pieces(rank)
            out.extend(
                Read(fqn, p.chunk, p.dest_offsets, p.storage_offsets, p.lengths) for p in got
            )
        return tuple(out)

    def chunks_read(self, fqn: str) -> int:
        """How many reads all destination ranks make of parameter ``fqn``.

        Raises:
            LayoutError: ``fqn`` is not loaded.
        """
        raw: object = fqn
        if isinstance(raw, str):
            fqn = plain_str(fqn)  # its own __eq__ never runs
        for name, pattern in zip(self._fqns, self._kinds, strict=True):
            if name == fqn:
                return pattern.count // (1 if self._staged is None else self._staged.pp)
        msg = f"{quote(fqn)} is not a parameter of the destination table; check the spelling"
        raise LayoutError(msg, fqn=str(fqn))

    def __str__(self) -> str:
        return self.report()

    def report(self, *, top: int = _REPORT_PARAMS) -> str:
        """The report ``str()`` gives, naming the ``top`` parameters read most.

        Bytes and reads per destination rank (consecutive ranks with equal figures as
        one range, the first few ranges of a large world), the total, the ranks that read
        most and least, and the parameters all ranks read most of, each with its number of
        reads and its layouts before and after. FQNs that are not printable are shown
        escaped.

        Raises:
            LayoutError: ``top`` is not an int >= 0.
        """
        if type(top) is not int or top < 0:
            msg = f"top must be an int >= 0 (how many parameters to name), got {quote(top)}"
            raise LayoutError(msg)
        n = len(self.bytes_read)
        lines = [
            f"reshard: {len(self.by_param)} parameter{'s' if len(self.by_param) != 1 else ''}, "
            f"{n} destination rank{'s' if n != 1 else ''} read {human_bytes(self.total)} in all"
        ]
        (rank, most), (low, least) = self.largest, self.smallest
        lines.append(
            f"largest: rank {rank} reads {human_bytes(most)}; smallest: rank {low} reads "
            f"{human_bytes(least)}"
        )
        lines.append("bytes per destination rank:")
        groups = rank_groups(list(zip(self.bytes_read, self._counts, strict=True)))
        shown = groups[:_REPORT_GROUPS]
        width = max(len(ranks_str(ranks)) for ranks, _ in shown)
        for ranks, (nbytes, count) in shown:
            label = "ranks" if len(ranks) > 1 else "rank"
            lines.append(
                f"  {label:<5} {ranks_str(ranks):>{width}}  {human_bytes(nbytes):>10}  "
                f"{count:>5} reads"
            )
        if len(shown) < len(groups):
            lines.append(f"  ... {n - shown[-1][0].stop} more ranks")
        if self._staged is not None:
            lines.extend(_stage_lines(self._staged, self._fqns, self.by_param))
        named = sorted(self.by_param, key=lambda f: (-self.by_param[f], f))[:top]
        if named:
            kinds = dict(zip(self._fqns, self._kinds, strict=True))
            lines.append("parameters that move most (bytes read by all ranks):")
            shown_fqns = {fqn: escape(fqn) for fqn in named}
            fqn_width = max(map(len, shown_fqns.values()))
            for fqn in named:
                source = _source_str(self._src, fqn, kinds[fqn])
                lines.append(
                    f"  {shown_fqns[fqn]:<{fqn_width}}  {human_bytes(self.by_param[fqn]):>10}  "
                    f"{self.chunks_read(fqn):>5} reads  {source} -> {_layout_str(self._dst[fqn])}"
                )
            if len(self.by_param) > top:
                lines.append(f"  ... and {len(self.by_param) - top} more")
        return "\n".join(lines)


ShapesLike: TypeAlias = Mapping[str, HasShape]
"""Parameter shapes by FQN: ``ParamShape`` values, or anything with ``shape`` and ``dtype``."""


def _shapes_by_fqn(shapes: ShapesLike) -> Mapping[str, HasShape]:
    """``shapes`` read once, its str keys as plain strings: what ``reshard_plan`` looks
    up per parameter, so a key's own ``__eq__`` or ``__hash__`` never runs there.

    Raises:
        LayoutError: naming ``shapes``: not a mapping, a mapping that raises while it is
            read, or a key no dict can hold (the exception is the ``__cause__``).
    """
    raw: object = shapes
    if not isinstance(raw, Mapping):
        msg = f"shapes must map parameter FQN to its shape and dtype, got {quote(shapes)}"
        raise LayoutError(msg)
    if (type(raw) is dict or type(raw) is FrozenMap) and set(map(type, shapes)) <= {str}:
        return shapes  # plain keys already: nothing to copy
    example = "shapes_from_module(model)"
    out: dict[str, HasShape] = {}
    try:
        for key, value in mapping_items(shapes, "shapes", example):
            out[plain_str(key)] = value  # a key of another type is never looked up
    except LayoutError:
        raise
    except Exception as e:  # a key whose hash fails
        msg = f"shapes has a key that cannot be a dict key ({quote(e)}), such as {example}"
        raise LayoutError(msg) from e
    return out


def _find_shape(fqn: str, shapes: ShapesLike, table: ParamLayoutTable) -> HasShape:
    found = shapes.get(fqn)
    if found is None:
        # tied parameters share one storage: any member's shape is theirs
        group = table.group_of(fqn)
        found = next((shapes[m] for m in sorted(group) if m in shapes), None)
    if found is None:
        msg = (
            f"{clip(fqn)}: no shape given for it (shapes has {len(shapes)} entries); give its "
            "shape and dtype (shapes_from_module, shapes_from_safetensors)"
        )
        raise LayoutError(msg, fqn=fqn)
    return found


def _read_shape(fqn: str, found: HasShape) -> tuple[tuple[int, ...], int]:
    """``found``'s shape, checked, and its dtype's bytes per element."""
    try:
        shape: object = getattr(found, "shape", None)
        dtype: object = getattr(found, "dtype", None)
    except Exception as e:  # a property of the caller's that raises
        msg = f"{clip(fqn)}: its .shape or .dtype could not be read ({quote(e)}); give a ParamShape"
        raise LayoutError(msg, fqn=fqn) from e
    if shape is None or dtype is None:
        msg = f"{clip(fqn)}: its shape {quote(found)} has no .shape and .dtype; give a ParamShape"
        raise LayoutError(msg, fqn=fqn)
    checked = as_shape(shape, "shape", fqn=fqn)  # type: ignore[arg-type]  # checked at run time
    try:
        name = as_dtype(dtype)
    except LayoutError as error:
        raise LayoutError(f"{clip(fqn)}: {error.message}", fqn=fqn) from None
    return checked, DTYPE_BYTES[name]


PartsLike: TypeAlias = Mapping[str, Mapping[str, str]]
"""Fused FQN to its parts' FQNs by part name: ``{"mlp.gate_up_proj.weight": {"gate":
"mlp.gate_proj.weight", "up": "mlp.up_proj.weight"}}``."""

_PARTS_EXAMPLE: Final = "{'mlp.gate_up_proj.weight': {'gate': 'mlp.gate_proj.weight', ...}}"


def _as_parts(parts: object) -> dict[str, dict[str, str]]:
    """``parts`` read once as plain strings.

    Raises:
        LayoutError: naming ``parts``: not a mapping of FQN to a mapping of part name to FQN.
    """
    if not isinstance(parts, Mapping):
        msg = (
            f"parts must map a fused FQN to its parts' FQNs, such as {_PARTS_EXAMPLE}, "
            f"got {quote(parts)}"
        )
        raise LayoutError(msg)
    out: dict[str, dict[str, str]] = {}
    for fused, names in mapping_items(parts, "parts", _PARTS_EXAMPLE):
        raw: object = names
        if not isinstance(fused, str) or not isinstance(raw, Mapping):
            msg = (
                f"parts[{quote(fused)}] must map part names to FQNs, such as {_PARTS_EXAMPLE}, "
                f"got {quote(raw)}"
            )
            raise LayoutError(msg)
        inner: dict[str, str] = {}
        # a dict's items cannot fail, so its name for a message is made only for others
        items = (
            names.items()
            if type(names) is dict
            else mapping_items(names, f"parts[{quote(fused)}]", _PARTS_EXAMPLE)
        )
        for part, fqn in items:
            if not isinstance(part, str) or not isinstance(fqn, str):
                msg = (
                    f"parts[{quote(fused)}] must map part names to FQNs (str to str), got "
                    f"{quote(part)}: {quote(fqn)}"
                )
                raise LayoutError(msg, fqn=plain_str(fused))
            inner[plain_str(part)] = plain_str(fqn)
        out[plain_str(fused)] = inner
    return out


@attrs.frozen
class _PartSpec:
    """One destination parameter read from the parts of another, or from their whole."""

    fused: str
    split: bool
    """The fused tensor is saved and its parts loaded (else the reverse)."""
    dim: int
    pairs: tuple[tuple[str, str, int, int], ...]
    """``(part name, its FQN, start, stop)`` on ``dim``, the ones this parameter reads."""


def _shape_and_dtype(fqn: str, found: HasShape) -> tuple[tuple[int, ...], str]:
    """``found``'s checked shape and dtype name: a ``ParamShape``'s own, checked when it
    was made, so each of many fused tensors costs a look, not a check."""
    if type(found) is ParamShape:
        return found.shape, found.dtype
    shape, _ = _read_shape(fqn, found)
    return shape, as_dtype(found.dtype)


def _part_specs(
    parts: dict[str, dict[str, str]],
    src: ParamLayoutTable,
    dst: ParamLayoutTable,
    shapes: ShapesLike,
) -> dict[str, _PartSpec]:
    """By destination FQN, what ``parts`` makes it read: each checked against the tables
    and the fused shape's structure.

    Raises:
        LayoutError: naming the fused FQN (and the part): a fused FQN in neither or both
            tables, a part's FQN on the wrong side, no structure, a part the structure
            lacks, a part whose shape is not the fused shape's slice, a part left out when
            the fused tensor is loaded.
    """
    out: dict[str, _PartSpec] = {}
    spans_of: dict[Packed, Mapping[str, tuple[int, int]]] = {}  # fused tensors share a few
    for fused, names in parts.items():
        split = fused in src and fused not in dst
        if not split and not (fused in dst and fused not in src):
            where = "both tables" if fused in src else "neither table"
            msg = (
                f"parts: {clip(fused)} is in {where}; a fused FQN is saved (in src) with its "
                "parts loaded (in dst), or the reverse: put it in exactly one"
            )
            raise LayoutError(msg, fqn=fused)
        found = _find_shape(fused, shapes, src if split else dst)
        structure: object = getattr(found, "structure", None)
        packed = (
            [(d, p) for d, p in structure.items() if len(p.parts) > 1]
            if isinstance(structure, Mapping)
            else []
        )
        if len(packed) != 1:
            what = "no dim packed of several parts" if not packed else "several packed dims"
            msg = (
                f"parts: {clip(fused)}'s shape has {what}, so its parts {quote(sorted(names))} "
                "have no rows; give its ParamShape a structure with one packed dim, such as "
                "structure={0: Packed([Part('gate', n), Part('up', n)])}"
            )
            raise LayoutError(msg, fqn=fused)
        dim, whole = packed[0]
        spans = spans_of.get(whole)
        if spans is None:
            spans = spans_of[whole] = part_spans(whole)
        shape, dtype = _shape_and_dtype(fused, found)
        pairs = []
        for part, fqn in names.items():
            span = spans.get(part)
            if span is None:
                msg = (
                    f"parts: {clip(fused)} has no part {part!r} on dim {dim} ({whole}); name "
                    f"one of {quote(list(spans))}"
                )
                raise LayoutError(msg, fqn=fused)
            side, table = ("dst", dst) if split else ("src", src)
            if fqn not in table:
                msg = (
                    f"parts: {clip(fused)}'s part {part!r} is {clip(fqn)}, which {side} lacks; "
                    f"add it to {side} or leave the part out"
                )
                raise LayoutError(msg, fqn=fused)
            got = _find_shape(fqn, shapes, table)
            want = (*shape[:dim], span[1] - span[0], *shape[dim + 1 :])
            part_shape, part_dtype = _shape_and_dtype(fqn, got)
            if part_shape != want or part_dtype != dtype:
                msg = (
                    f"parts: {clip(fused)}'s part {part!r} ({whole} on dim {dim}) is "
                    f"{dtype}{list(want)}, but {clip(fqn)} is {part_dtype}"
                    f"{list(part_shape)}; map the part to a tensor of its shape and dtype"
                )
                raise LayoutError(msg, fqn=fused)
            pairs.append((part, fqn, *span))
        if split:
            for part, fqn, lo, hi in pairs:
                if fqn in out:
                    msg = f"parts: {clip(fqn)} is named as a part twice; name it once"
                    raise LayoutError(msg, fqn=fqn)
                out[fqn] = _PartSpec(fused, True, dim, ((part, fqn, lo, hi),))
        else:
            missing = [p for p in spans if p not in names]
            if missing:
                msg = (
                    f"parts: {clip(fused)} is loaded from its parts, but {quote(missing)} "
                    "name no tensor, so its rows would be left unread; map every part"
                )
                raise LayoutError(msg, fqn=fused)
            out[fused] = _PartSpec(fused, False, dim, tuple(pairs))
    return out


def _part_pattern(
    planner: _Planner,
    fqn: str,
    spec: _PartSpec,
    tables: tuple[ParamLayoutTable, ParamLayoutTable],
    shapes: ShapesLike,
) -> PartPattern:
    """The reads of ``fqn``, a fused tensor's part or the fused tensor, by ``spec``: each
    distinct (layouts, shapes, spans) planned once, and looked up by the values given."""
    src, dst = tables
    names = tuple(spec.fused if spec.split else name for _, name, _, _ in spec.pairs)
    found = tuple(_find_shape(name, shapes, src) for name in names)
    own = _find_shape(fqn, shapes, dst)
    key: Hashable = None
    if type(own) is ParamShape and all(type(f) is ParamShape for f in found):
        # values checked when made: equal ones read alike, so they are looked up, not read
        pairs = zip(names, found, spec.pairs, strict=True)
        key = (
            (dst[fqn], own.shape, own.dtype, spec.split, spec.dim),
            tuple((src[n], f.shape, f.dtype, p[2], p[3]) for n, f, p in pairs),
        )
        known = planner.parts.known.get(key)
        if known is not None:
            return PartPattern(known, names)
    sources = []
    for (_, name, lo, hi), given in zip(spec.pairs, found, strict=True):
        saved = spec.fused if spec.split else name
        shape, itemsize = _read_shape(saved, given)
        layout = src[saved]
        _check_layout(layout, saved)
        mesh = role_mesh(planner.src, layout, "src_sizes", saved)
        check_dims(layout, len(shape), shape=shape)
        if spec.split:
            sources.append(PartSource(saved, layout, mesh, shape, spec.dim, 0, hi - lo, lo))
        else:
            sources.append(PartSource(saved, layout, mesh, shape, spec.dim, lo, hi, -lo))
    shape, _ = _read_shape(fqn, own)
    layout = dst[fqn]
    mesh = role_mesh(planner.dst, layout, "dst_sizes", fqn)
    check_dims(layout, len(shape), shape=shape)
    geometry = planner.parts.geometry((layout, mesh, shape), sources, itemsize=itemsize)
    if key is not None:
        planner.parts.known[key] = geometry
    return PartPattern(geometry, names)


def _terms(pattern: _Pattern | PartGeometry) -> tuple[tuple[tuple[Factor, ...], ...], ...]:
    """A pattern's rows and reads by index, as products over the dims: one for a plain
    pattern, one per group of sources for a part pattern."""
    if isinstance(pattern, PartGeometry):
        return pattern.terms
    return ((pattern.rows, pattern.reads),)


_SHAPE_AND_DTYPE: Final = operator.attrgetter("shape", "dtype")
_TOTAL: Final = operator.attrgetter("total")


def _plan_grouped(
    planner: _Planner, src: ParamLayoutTable, dst: ParamLayoutTable, shapes: ShapesLike
) -> tuple[list[str], list[_Pattern | PartPattern]] | None:
    """Every parameter of ``dst`` and its reads, in order, grouped by what they depend on
    (saved layout, layout, shape, dtype): per parameter its values and one dict lookup,
    per group the planning. ``None`` when a parameter needs ``_plan_each``: an entry
    ``src`` lacks, a shape that is missing (a tied member's) or no ``ParamShape``, a group
    that cannot be planned; that path names every parameter such a problem concerns.
    """
    fqns = list(dst)
    saved = values_by_fqn(src, fqns)
    found = values_by_fqn(shapes, fqns)
    if set(map(type, found)) != {ParamShape}:
        return None
    keys = zip(saved, dst.values(), map(_SHAPE_AND_DTYPE, found), strict=True)
    groups, index = group_index(keys)
    # One parameter of each group (its last) stands for it: a group that fails is planned
    # again one parameter at a time, which names them all.
    member = dict(zip(index, range(len(index)), strict=True))
    patterns: list[_Pattern | PartPattern] = []
    for (old, layout, _), i in groups.items():
        fqn, given = fqns[member[i]], found[member[i]]
        if old is None or given is None:  # an entry src lacks (a missing shape: see above)
            return None
        try:
            shape, itemsize = _read_shape(fqn, given)
            patterns.append(planner.pattern(fqn, old, layout, shape, itemsize))
        except LayoutError:
            return None
    return fqns, list(map(patterns.__getitem__, index))


def _plan_all(
    planner: _Planner,
    src: ParamLayoutTable,
    dst: ParamLayoutTable,
    shapes: ShapesLike,
    specs: Mapping[str, _PartSpec],
) -> tuple[list[str], list[_Pattern | PartPattern], list[LayoutError]]:
    """Every parameter of ``dst`` and its reads, in order, and every problem found on the
    way; grouped when nothing needs a parameter on its own (``_plan_grouped``)."""
    grouped = None if specs else _plan_grouped(planner, src, dst, shapes)
    if grouped is not None:
        return *grouped, []
    return _plan_each(planner, src, dst, shapes, specs)


def _plan_each(
    planner: _Planner,
    src: ParamLayoutTable,
    dst: ParamLayoutTable,
    shapes: ShapesLike,
    specs: Mapping[str, _PartSpec],
) -> tuple[list[str], list[_Pattern | PartPattern], list[LayoutError]]:
    """``_plan_all`` one parameter at a time, each problem named by its parameter; each
    distinct (source layout, layout, shape, dtype) still planned once."""
    fqns: list[str] = []
    kinds: list[_Pattern | PartPattern] = []
    problems: list[LayoutError] = []
    known: dict[tuple[SourceLayout, SourceLayout, HasShape], _Pattern] = {}
    for fqn, layout in dst.items():
        try:
            spec = specs.get(fqn)
            if spec is not None:
                part = _part_pattern(planner, fqn, spec, (src, dst), shapes)
                fqns.append(fqn)
                kinds.append(part)
                continue
            old = src.get(fqn)
            if old is None:
                msg = (
                    f"{clip(fqn)}: loaded under {layout} but not in the checkpoint's table; "
                    "torch refuses a missing key: add it to src, or leave it out of dst"
                )
                raise LayoutError(msg, fqn=fqn)
            found = _find_shape(fqn, shapes, dst)
            value = type(found) is ParamShape  # a value: equal shapes read alike
            pattern = known.get((old, layout, found)) if value else None
            if pattern is None:
                shape, itemsize = _read_shape(fqn, found)
                pattern = planner.pattern(fqn, old, layout, shape, itemsize)
                if value:
                    known[old, layout, found] = pattern
        except LayoutError as error:
            if error.fqn != fqn:
                named = LayoutError(
                    f"{clip(fqn)}: {error.message}",
                    fqn=fqn,
                    axis=error.axis,
                    placement=error.placement,
                )
                named.__cause__ = error.__cause__  # the caller's own exception, if any
                error = named
            problems.append(error)
            continue
        fqns.append(fqn)
        kinds.append(pattern)
    return fqns, kinds, problems


def _read_checkpoint(
    path: str | os.PathLike[str], sizes: Mapping[str, Mesh | Mapping[str, int]] | Mesh | None
) -> DcpLayouts:
    """A DCP checkpoint directory's layouts, shapes and meshes, from its metadata; on
    ``sizes`` (its saving run's meshes) when given, so its layouts name their axes."""
    from layout_algebra.dcp import table_from_dcp  # noqa: PLC0415 (dcp builds on this module)

    return table_from_dcp(path, mesh=sizes)


def _with_saved_shapes(
    saved: Mapping[str, ParamShape], given: ShapesLike | None
) -> Mapping[str, HasShape]:
    """The checkpoint's shapes, and ``given`` for the tensors it lacks (a fused tensor's
    parts); a given shape the checkpoint contradicts is a problem, never planned from."""
    if given is None:
        return saved
    out: dict[str, HasShape] = dict(saved)
    problems = []
    for fqn, found in _shapes_by_fqn(given).items():
        mine = saved.get(fqn)
        if mine is None:
            out[fqn] = found
            continue
        shape, _ = _read_shape(fqn, found)
        if (shape, as_dtype(found.dtype)) != (mine.shape, mine.dtype):
            msg = (
                f"{clip(fqn)}: shapes gives {as_dtype(found.dtype)}{list(shape)}, but the "
                f"checkpoint holds {mine}; leave it out of shapes (the checkpoint's metadata "
                "gives it) or check that shapes is this model's"
            )
            problems.append(LayoutError(msg, fqn=fqn))
    if problems:
        raise plan_error("the reshard", problems)
    return out


def reshard_plan(
    src: ParamLayoutTable | str | os.PathLike[str],
    dst: ParamLayoutTable,
    shapes: ShapesLike | None = None,
    *,
    src_sizes: Mapping[str, Mapping[str, int]] | Mesh | None = None,
    dst_sizes: Mapping[str, Mapping[str, int]] | Mesh,
    fsdp: Mapping[str, FsdpAxes] | None = None,
    shard_dim: int | Mapping[str, int] = 0,
    parts: PartsLike | None = None,
    stages: Stages | None = None,
) -> ReshardPlan:
    """What loading a checkpoint saved under ``src`` costs each rank under ``dst``.

    For every parameter of ``dst`` and every destination rank, the saved chunks
    (``dcp_chunks`` of its ``src`` layout) that overlap the rank's new local shard, and
    the overlapping box of each: the read items torch's ``DefaultLoadPlanner`` makes.
    Parameters only ``src`` has are not read (torch loads what the model asks for);
    tied parameters are read once per FQN, as the state dict names them.

    With ``fsdp=`` both tables are source tables and go through ``compose_table`` with
    their own sizes (the same FSDP axes and ``shard_dim``); without it they are read as
    the layouts the parameters have when saved and loaded (composed already, or without
    FSDP).

    >>> from layout_algebra import ParamLayoutTable, SourceLayout, Shard
    >>> from collections import namedtuple
    >>> P = namedtuple("P", "shape dtype")
    >>> tp = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    >>> plan = reshard_plan(tp, tp, {"w": P((8, 4), "float32")},
    ...     src_sizes={"dense": {"tp": 4}}, dst_sizes={"dense": {"tp": 2}})
    >>> plan.bytes_read, [str(r) for r in plan.reads(1)]
    ((64, 64), ['w[4:6, 0:4] from chunk [4:6, 0:4]', 'w[6:8, 0:4] from chunk [6:8, 0:4]'])

    Args:
        src: the layouts the checkpoint was saved under, or the checkpoint's directory:
            its metadata then gives the layouts (composed), the shapes and the saving
            run's sizes (``table_from_dcp``, which runs nothing from the file).
        dst: the layouts it is loaded under.
        shapes: each parameter's shape and dtype by FQN (a tied group needs one member's);
            with a checkpoint directory, the shapes of what it lacks (a fused tensor's
            parts): its own shapes come from its metadata, and a given one that
            contradicts them is a problem.
        src_sizes: by mesh role, the sizes of the saving run's mesh axes, in mesh order;
            with a checkpoint directory, the mesh it was saved on, whose axis names its
            layouts then take (inferred, ``d0, d1, ...``, when not given).
        dst_sizes: the same for the loading run; its world is the destination ranks.
            A bare ``Mesh`` (for either) is the ``"dense"`` role's.
        fsdp: FSDP's axis by mesh role (or a ``(replicate, shard)`` pair) when the
            tables are source tables, as for ``compose_table``.
        shard_dim: the dim FSDP shards, for every parameter or by FQN (only with
            ``fsdp=``; a checkpoint directory's layouts are composed already, so it
            applies to ``dst``).
        parts: fused FQN to its parts' FQNs by part name (the names of the packed dim of
            the fused shape's ``structure``). With the fused tensor in ``src`` and its parts
            in ``dst``, each part is read from the fused tensor's saved chunks, its own
            rows only; with the parts in ``src`` and the fused tensor in ``dst``, the fused
            tensor is read from every part's chunks. Rows are followed as ranks hold
            them, so a ``StridedShard`` over ``[gate | up]`` reads right. Such reads name
            the loaded tensor as ``Read.dest_fqn``.
        stages: the loading run's pipeline stages (``Stages``): a rank loads only the
            parameters of the stages its coordinate on ``stages.axis`` runs, so a PP=4 ->
            PP=2 load reads whole layers on the ranks that now run them. (How the saving
            run was staged changes no saved box: DCP writes each box once.) A parameter
            in no stage or in several is a problem.

    Returns:
        The reads and bytes of every destination rank.

    Raises:
        PlanError: every parameter that cannot be planned (``.problems``, each naming its
            FQN): one ``dst`` has and ``src`` lacks (DCP's missing key), no shape, a layout
            that does not fit its shape or sizes.
        LayoutError: arguments of the wrong form, roles with different world sizes,
            ``shard_dim`` without ``fsdp``.
    """
    if fsdp is None and not (shard_dim == 0 or (isinstance(shard_dim, Mapping) and not shard_dim)):
        msg = (
            f"reshard_plan: shard_dim={quote(shard_dim)} is the dim FSDP shards, which only "
            "fsdp= composes; give fsdp= (the tables are then source tables) or leave it out"
        )
        raise LayoutError(msg)
    saved = isinstance(src, str | os.PathLike)
    if isinstance(src, str | os.PathLike):
        checkpoint = _read_checkpoint(src, src_sizes)
        src = checkpoint.table
        shapes = _with_saved_shapes(checkpoint.shapes, shapes)
        src_sizes = checkpoint.meshes
    check_table(src, "reshard_plan(src=...)")
    check_table(dst, "reshard_plan(dst=...)")
    if shapes is None or src_sizes is None:
        msg = (
            f"reshard_plan: no {'shapes' if shapes is None else 'src_sizes'} given; give it, "
            "or give src as a checkpoint directory, whose metadata holds both"
        )
        raise LayoutError(msg)
    shapes = _shapes_by_fqn(shapes)  # looked up per FQN
    src_roles = as_role_sizes(src_sizes)
    dst_roles = as_role_sizes(dst_sizes)
    if not dst_roles:
        msg = "dst_sizes names no mesh role; give {'dense': {axis: n, ...}, ...}"
        raise LayoutError(msg)
    if fsdp is not None:
        if not saved:  # a checkpoint's layouts are composed already
            src = compose_table(src, fsdp=fsdp, mesh_sizes=src_roles, shard_dim=shard_dim)
        dst = compose_table(dst, fsdp=fsdp, mesh_sizes=dst_roles, shard_dim=shard_dim)
    world_size(dst_roles, "dst_sizes")  # the bound on the world
    if src_roles:
        world_size(src_roles, "src_sizes")
    src_meshes, dst_meshes = src_roles, dst_roles
    planner = _Planner(src_meshes, dst_meshes)
    specs = {} if parts is None else _part_specs(_as_parts(parts), src, dst, shapes)
    fqns, kinds, problems = _plan_all(planner, src, dst, shapes, specs)
    staged = None if stages is None else _stage(stages, dst, dst_meshes, problems)
    if problems:
        # Headers that keep experts one by one explain every fused parameter they lack.
        missing = [e.fqn for e in problems if e.fqn is not None and e.fqn not in shapes]
        fused = fused_experts(missing, shapes) if missing else {}
        problems = [
            LayoutError(per_expert_message(e.fqn, fused), fqn=e.fqn)
            if e.fqn is not None and e.fqn in fused
            else e
            for e in problems
        ]
        raise plan_error("the reshard", problems)
    bytes_read, counts = _per_rank(kinds, staged, dst_meshes)
    totals = list(map(_TOTAL, kinds))
    if staged is not None:  # only the ranks of one pipeline coordinate read each
        totals = [t // staged.pp for t in totals]
    return ReshardPlan._planned(
        bytes_read=tuple(bytes_read),
        by_param=frozen_map_of(dict(zip(fqns, totals, strict=True))),
        tables=(src, dst),
        fqns=tuple(fqns),
        kinds=tuple(kinds),
        counts=tuple(counts),
        staged=staged,
    )


def _per_rank(
    kinds: Sequence[_Pattern | PartPattern], staged: Placed | None, meshes: Mapping[str, Mesh]
) -> tuple[list[int], list[int]]:
    """Bytes and reads per destination rank: each pattern counted once for all the
    parameters sharing it (and their stage: only its ranks read)."""
    of: Sequence[int | None] = [None] * len(kinds) if staged is None else staged.assignment.of
    uses = Counter(
        (k.geometry if isinstance(k, PartPattern) else k, s) for k, s in zip(kinds, of, strict=True)
    )
    nbytes, reads = RankSum(meshes), RankSum(meshes)
    for (pattern, stage), count in uses.items():
        only = () if staged is None or stage is None else (staged.mask(stage),)
        for rows, found in _terms(pattern):
            nbytes.add(pattern.role, (*rows, *only), count * pattern.itemsize)
            reads.add(pattern.role, (*found, *only), count)
    return nbytes.total(), reads.total()


def _stage(
    stages: Stages, dst: ParamLayoutTable, meshes: Mapping[str, Mesh], problems: list[LayoutError]
) -> Placed:
    """``stages`` placed on the loading meshes (as ``lint`` places them); a parameter in
    no stage or in several, or laid out over the pipeline axis, joins ``problems``.

    Raises:
        LayoutError: ``stages`` is no ``Stages``, its axis is missing from a mesh, or its
            count does not fit the axis and schedule.
    """
    raw: object = stages
    axis = stages.axis if isinstance(raw, Stages) else ""
    placed = place(stages, dst, meshes, frozenset({axis}))
    found = placed.assignment
    problems.extend(
        LayoutError(
            f"{fqn}: no stage holds it (no pattern of stages names it or a module holding "
            "it), so no rank would load it; add its module to a stage",
            fqn=fqn,
            axis=axis,
        )
        for fqn in found.unplaced
    )
    problems.extend(
        LayoutError(
            f"{fqn}: stages {' and '.join(map(str, held))} both hold it; a module belongs "
            "to one stage: name it in one",
            fqn=fqn,
            axis=axis,
        )
        for fqn, held in found.doubled
    )
    # A stage's module lives on one pipeline rank only: a shard of it on another pipeline
    # rank would never be loaded (the mask drops that rank's reads).
    over = {
        layout
        for layout in set(dst.values())
        for a, p in zip(layout.axes, layout.placements, strict=True)
        if a.name == axis and not isinstance(p, Replicate)
    }
    problems.extend(
        LayoutError(
            f"{clip(fqn)}: loaded as {layout}, sharded over the pipeline axis {axis!r}; its "
            "stage runs on one pipeline rank, which holds all of it: lay it out without "
            f"{axis!r}",
            fqn=fqn,
            axis=axis,
        )
        for fqn, layout in dst.items()
        if layout in over
    )
    return placed


def _stage_lines(placed: Placed, fqns: Sequence[str], by_param: Mapping[str, int]) -> list[str]:
    """A staged load's report lines: what each stage's parameters are read as, and by
    which ranks (those of its pipeline coordinate)."""
    read, held = [0] * placed.count, [0] * placed.count
    for fqn, stage in zip(fqns, placed.assignment.of, strict=True):
        read[stage or 0] += by_param[fqn]
        held[stage or 0] += 1
    ranks: list[list[int]] = [[] for _ in range(placed.pp)]
    for rank, at in enumerate(placed.pp_index):
        ranks[at].append(rank)
    axis = placed.stages.axis
    out = [f"by stage (stage i runs on {axis}=i % {placed.pp}; bytes read by all its ranks):"]
    for s, (n, nbytes) in enumerate(zip(held, read, strict=True)):
        at = placed.rank_of(s)
        out.append(
            f"  stage {s}: {n} parameter{'s' if n != 1 else ''}, {human_bytes(nbytes)} "
            f"read by {ranks_text(ranks[at])} ({axis}={at})"
        )
    return out
