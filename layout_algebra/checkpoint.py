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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Final, Protocol, TypeAlias, assert_never

import attrs

from layout_algebra._args import (
    MAX_TENSOR_SIZE,
    as_items,
    as_shape,
    mapping_dict,
    mapping_items,
    plain_str,
)
from layout_algebra._text import clip, escape, quote
from layout_algebra.axes import AxisName
from layout_algebra.errors import LayoutError
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, frozen_map_of, getter
from layout_algebra.geometry import (
    MAX_WORLD,
    FsdpAxes,
    as_role_sizes,
    as_sizes,
    check_dims,
    check_layout,
    compose_table,
    local_shape_and_offset,
    plan_error,
    size_of,
    world_size,
)
from layout_algebra.layout import (
    ByModule,
    ParamLayoutTable,
    SourceLayout,
    check_fqn,
    check_fqns,
    partial_error,
)
from layout_algebra.placements import Partial, Replicate, Shard, StridedShard
from layout_algebra.shapes import DTYPE_BYTES, as_dtype, fused_experts, per_expert_message

__all__ = [
    "MAX_RANKS",
    "Chunk",
    "HasShape",
    "Read",
    "ReshardPlan",
    "dcp_chunks",
    "reshard_plan",
]

MAX_RANKS: Final = MAX_WORLD
"""The most ranks a layout's mesh or a destination world may have here: enough for any
real run, and a bound on the work (``dcp_chunks`` and ``reshard_plan`` visit each rank)."""

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


@attrs.frozen(cache_hash=True)
class Read:
    """One read a destination rank makes: a box of one saved chunk into its local shard.

    ``storage_offsets`` are relative to the saved ``chunk``, ``dest_offsets`` to the
    rank's local shard, and ``lengths`` is the box's size: torch's ``ReadItem`` for that
    parameter, with the saved chunk in place of its storage index. Each field is checked
    (a wrong type is a ``LayoutError`` naming it); the box has the chunk's dims and lies
    within it.
    """

    fqn: str = attrs.field(converter=plain_str, validator=_check_read_fqn, **REQUIRED)
    chunk: Chunk = attrs.field(validator=_check_read_chunk, **REQUIRED)
    dest_offsets: tuple[int, ...] = attrs.field(converter=_as_dest_offsets, **REQUIRED)
    storage_offsets: tuple[int, ...] = attrs.field(converter=_as_storage_offsets, **REQUIRED)
    lengths: tuple[int, ...] = attrs.field(converter=_as_lengths, **REQUIRED)

    def __attrs_pre_init__(
        self,
        fqn: str,
        chunk: Chunk,
        dest_offsets: Iterable[int],
        storage_offsets: Iterable[int],
        lengths: Iterable[int],
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
        return f"{self.fqn}{_box(start, self.lengths)} from chunk {self.chunk}"

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


def _check_table(table: ParamLayoutTable, name: str) -> None:
    raw: object = table
    if not isinstance(raw, ParamLayoutTable):
        msg = f"{name} must be a ParamLayoutTable, got {type(raw).__name__} {quote(table)}"
        raise LayoutError(msg)


def _sharded_dim(p: Shard | Replicate | Partial | StridedShard) -> int | None:
    match p:
        case Shard(dim) | StridedShard(dim):
            return dim
        case Replicate() | Partial():
            return None
        case _:
            assert_never(p)


# ---------------------------------------------------------------------------------------
# the chunks DCP writes


def _dim_extents(
    shape: tuple[int, ...],
    layout: SourceLayout,
    sizes: Mapping[str, int],
) -> list[list[tuple[int, int]]]:
    """Per tensor dim, the distinct ``(offset, size)`` DTensor gives the ranks along it.

    Each mesh axis shards at most one dim, so a rank's box is the product of what the axes
    sharding each dim give it: 2 dims sharded over 2 and 4 ranks are 2 x 4 boxes, found
    from 2 + 4 coordinates.
    """
    ranks = math.prod(sizes[a.name] for a in layout.axes)
    if ranks > MAX_RANKS:
        msg = (
            f"{layout}: its mesh has {ranks:,} ranks, more than the {MAX_RANKS:,} a world has "
            "here; check the mesh sizes"
        )
        raise LayoutError(msg)
    by_dim: dict[int, list[AxisName]] = {}
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        dim = _sharded_dim(p)
        if dim is not None:
            by_dim.setdefault(dim, []).append(axis)
    out: list[list[tuple[int, int]]] = []
    for dim, n in enumerate(shape):
        axes = by_dim.get(dim)
        if not axes:
            out.append([(0, n)])
            continue
        keep = {a.name for a in axes}
        sub = SourceLayout(
            layout.mesh,
            axes,
            [p for a, p in zip(layout.axes, layout.placements, strict=True) if a.name in keep],
        )
        seen: dict[tuple[int, int], None] = {}
        for index in itertools.product(*(range(sizes[a.name]) for a in axes)):
            coordinate = {a.name: i for a, i in zip(axes, index, strict=True)}
            local, offset = local_shape_and_offset(shape, sub, sizes, coordinate)
            seen[offset[dim], local[dim]] = None
        out.append(list(seen))
    return out


def _check_sizes(layout: SourceLayout, sizes: Mapping[str, int], fqn: str | None) -> dict[str, int]:
    checked = as_sizes(sizes, "mesh_sizes")
    for axis in layout.axes:
        size_of(checked, axis, layout, fqn)
    return checked


def _chunks(
    layout: SourceLayout, shape: tuple[int, ...], sizes: Mapping[str, int]
) -> tuple[Chunk, ...]:
    check_dims(layout, len(shape), shape=shape)  # a dim the tensor lacks is no box of it
    extents = _dim_extents(shape, layout, sizes)
    boxes: dict[tuple[int, ...], tuple[int, ...]] = {}
    for combo in itertools.product(*extents):
        offsets = tuple(o for o, _ in combo)
        # DCP keys a saved box by its offsets: ranks with equal boxes write one copy.
        boxes.setdefault(offsets, tuple(n for _, n in combo))
    return tuple(Chunk(o, boxes[o]) for o in sorted(boxes))


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


def _overlap(saved: Chunk, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> _Piece | None:
    """The box of ``saved`` that the local shard at ``offsets``/``sizes`` reads, if any.

    Boxes overlap when on every dim each starts before the other ends (so a 0-d tensor's
    boxes always overlap and empty boxes never do), as DCP's resharding decides.
    """
    storage: list[int] = []
    dest: list[int] = []
    lengths: list[int] = []
    for s_off, s_len, d_off, d_len in zip(saved.offsets, saved.sizes, offsets, sizes, strict=True):
        if s_off >= d_off + d_len or d_off >= s_off + s_len:
            return None
        start = max(s_off, d_off)
        storage.append(start - s_off)
        dest.append(start - d_off)
        lengths.append(min(s_off + s_len, d_off + d_len) - start)
    return _Piece(saved, tuple(dest), tuple(storage), tuple(lengths))


@attrs.frozen(eq=False)
class _Pattern:
    """One parameter's reads on every destination rank; shared by parameters alike."""

    pieces: tuple[tuple[_Piece, ...], ...]
    """By destination rank."""
    bytes: tuple[int, ...]
    """By destination rank."""
    total: int


class _World:
    """A role's mesh: each global rank's coordinate, row-major in the mesh's axis order."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.sizes = sizes
        self.names = list(sizes)
        self.size = math.prod(sizes.values())

    def keys(self, layout: SourceLayout) -> list[tuple[int, ...]]:
        """Each rank's indices on ``layout``'s axes, by global rank."""
        strides: dict[str, int] = {}
        stride = 1
        for name in reversed(self.names):
            strides[name] = stride
            stride *= self.sizes[name]
        picked = [(strides[a.name], self.sizes[a.name]) for a in layout.axes]
        return [tuple((rank // s) % n for s, n in picked) for rank in range(self.size)]


def _role_sizes(
    sizes: Mapping[str, Mapping[str, int]], layout: SourceLayout, fqn: str, which: str
) -> Mapping[str, int]:
    role = sizes.get(layout.mesh)
    if role is None:
        msg = (
            f"{clip(fqn)}: {layout} is on mesh role {quote(layout.mesh)}, which {which} has no "
            f"sizes for (it has {quote(sorted(sizes))}); give "
            f"{which}={{{quote(layout.mesh)}: {{axis: n, ...}}, ...}}"
        )
        raise LayoutError(msg, fqn=fqn)
    _check_sizes(layout, role, fqn)
    return role


class _Planner:
    """Builds each distinct (source layout, destination layout, shape, itemsize) once."""

    def __init__(
        self,
        src_sizes: Mapping[str, Mapping[str, int]],
        dst_sizes: Mapping[str, Mapping[str, int]],
        world_size: int,
    ) -> None:
        self.src_sizes = src_sizes
        self.dst_sizes = dst_sizes
        self.world_size = world_size
        self.worlds = {role: _World(sizes) for role, sizes in dst_sizes.items()}
        self.chunks: dict[tuple[SourceLayout, tuple[int, ...]], tuple[Chunk, ...]] = {}
        self.keys: dict[tuple[str, tuple[AxisName, ...]], list[tuple[int, ...]]] = {}
        self.patterns: dict[tuple[SourceLayout, SourceLayout, tuple[int, ...], int], _Pattern] = {}

    def pattern(
        self, fqn: str, src: SourceLayout, dst: SourceLayout, shape: tuple[int, ...], itemsize: int
    ) -> _Pattern:
        key = (src, dst, shape, itemsize)
        found = self.patterns.get(key)
        if found is None:
            found = self._build(fqn, src, dst, shape, itemsize)
            self.patterns[key] = found
        return found

    def _build(
        self, fqn: str, src: SourceLayout, dst: SourceLayout, shape: tuple[int, ...], itemsize: int
    ) -> _Pattern:
        src_role = _role_sizes(self.src_sizes, src, fqn, "src_sizes")
        dst_role = _role_sizes(self.dst_sizes, dst, fqn, "dst_sizes")
        saved = self.chunks.get((src, shape))
        if saved is None:
            saved = _chunks(src, shape, src_role)
            self.chunks[src, shape] = saved
        world = self.worlds[dst.mesh]
        keys = self.keys.get((dst.mesh, dst.axes))
        if keys is None:
            keys = world.keys(dst)
            self.keys[dst.mesh, dst.axes] = keys
        by_key: dict[tuple[int, ...], tuple[tuple[_Piece, ...], int]] = {}
        pieces: list[tuple[_Piece, ...]] = []
        nbytes: list[int] = []
        for key in keys:
            got = by_key.get(key)
            if got is None:
                coordinate = {a.name: i for a, i in zip(dst.axes, key, strict=True)}
                sizes, offsets = local_shape_and_offset(shape, dst, dst_role, coordinate)
                found = tuple(
                    piece
                    for chunk in saved
                    if (piece := _overlap(chunk, offsets, sizes)) is not None
                )
                got = found, itemsize * sum(math.prod(p.lengths) for p in found)
                by_key[key] = got
            pieces.append(got[0])
            nbytes.append(got[1])
        return _Pattern(tuple(pieces), tuple(nbytes), sum(nbytes))


def _format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.5 KiB``, ``2.0 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError(n)  # pragma: no cover - the loop returns


def _layout_str(layout: SourceLayout) -> str:
    return str(layout) if layout.axes else f"{layout.mesh} (plain tensor)"


def _as_bytes_read(value: Iterable[int]) -> tuple[int, ...]:
    out = as_items(value, "ReshardPlan.bytes_read", "(64, 64)", limit=MAX_RANKS)
    if not 1 <= len(out) <= MAX_RANKS or any(type(n) is not int or n < 0 for n in out):
        msg = (
            f"ReshardPlan.bytes_read: expected 1 to {MAX_RANKS:,} ints >= 0 (the bytes of "
            f"each destination rank), got {quote(value)}; make it with reshard_plan"
        )
        raise LayoutError(msg)
    return out


def _as_by_param(value: Mapping[str, int]) -> FrozenMap[str, int]:
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"ReshardPlan.by_param: expected a mapping of FQN to bytes, got {quote(raw)}"
        raise LayoutError(msg)
    frozen = (
        value  # frozen already: not copied
        if isinstance(value, FrozenMap) and type(value) is FrozenMap
        else frozen_map_of(mapping_dict(value, "ReshardPlan.by_param", "{'w': 64}"))
    )
    if not set(map(type, frozen)) <= {str} or any(
        type(n) is not int or n < 0 for n in frozen.values()
    ):
        msg = (
            f"ReshardPlan.by_param: expected plain FQNs mapped to ints >= 0 (bytes), got "
            f"{quote(raw)}; make it with reshard_plan"
        )
        raise LayoutError(msg)
    return frozen


def _check_plan_table(
    _: object, attribute: attrs.Attribute[ParamLayoutTable], value: object
) -> None:
    if not isinstance(value, ParamLayoutTable):
        name = attribute.alias or attribute.name
        msg = f"ReshardPlan.{name}: expected a ParamLayoutTable, got {quote(value)}"
        raise LayoutError(msg)


_REPORT_RANKS: Final = 16
_REPORT_PARAMS: Final = 10


@attrs.frozen(repr=False)
class ReshardPlan:
    """Every read a checkpoint's load makes, by destination rank, and what it costs.

    ``bytes_read[rank]`` is what destination rank ``rank`` reads from the checkpoint;
    ``by_param[fqn]`` what all ranks together read of one parameter. ``reads(rank)``
    lists the rank's reads, parameters in the destination table's order, each one's by
    the saved chunk's offsets (torch issues the same reads, in an order of its own).
    ``str()`` is a report: bytes per rank, total, largest, the parameters that move most.
    """

    bytes_read: tuple[int, ...] = attrs.field(converter=_as_bytes_read, **REQUIRED)
    by_param: FrozenMap[str, int] = attrs.field(converter=_as_by_param, **REQUIRED)
    _src: ParamLayoutTable = attrs.field(alias="src", validator=_check_plan_table, **REQUIRED)
    _dst: ParamLayoutTable = attrs.field(alias="dst", validator=_check_plan_table, **REQUIRED)
    _fqns: tuple[str, ...] = attrs.field(alias="fqns", eq=False, **REQUIRED)
    _kinds: tuple[_Pattern, ...] = attrs.field(alias="kinds", eq=False, **REQUIRED)
    """Each parameter's reads (``_fqns[i]``'s are ``_kinds[i]``): a few shared patterns."""

    def __attrs_pre_init__(self, *args: object) -> None:  # __init__'s six, in field order
        check_init(self, "bytes_read", args)

    @_kinds.validator
    def _check_kinds(self, _: attrs.Attribute[tuple[_Pattern, ...]], value: object) -> None:
        fqns: object = self._fqns
        if not isinstance(fqns, tuple) or not isinstance(value, tuple) or len(fqns) != len(value):
            msg = (
                "ReshardPlan(fqns=..., kinds=...): one kind of reads per FQN, both tuples; "
                f"got {quote(fqns)} and {quote(value)}; make it with reshard_plan"
            )
            raise LayoutError(msg)
        check_fqns(fqns, "ReshardPlan.fqns")
        ranks = len(self.bytes_read)
        # What reads(), chunks_read() and the report look up must be there; plain types
        # first, so no caller's __hash__ or __eq__ runs.
        if (
            not set(map(type, fqns)) <= {str}
            or not set(map(type, value)) <= {_Pattern}
            or len(set(fqns)) != len(fqns)
            or self.by_param.keys() != set(fqns)
            or not all(map(self._dst.__contains__, fqns))
            or not all(map(self._src.__contains__, fqns))
            or any(len(k.pieces) != ranks for k in set(value))
        ):
            msg = (
                "ReshardPlan(fqns=..., kinds=...): each FQN once, each in src, dst and by_param "
                f"(and no other), each kind of reads for the {ranks} destination ranks; got "
                f"fqns {quote(fqns)}; make it with reshard_plan"
            )
            raise LayoutError(msg)

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

    def reads(self, rank: int) -> tuple[Read, ...]:
        """Destination rank ``rank``'s reads, in the destination table's order.

        Raises:
            LayoutError: ``rank`` is not a destination rank.
        """
        if type(rank) is not int or not 0 <= rank < len(self.bytes_read):
            msg = (
                f"rank must be an int in [0, {len(self.bytes_read)}) (the destination ranks), "
                f"got {quote(rank)}"
            )
            raise LayoutError(msg)
        return tuple(
            Read(fqn, p.chunk, p.dest_offsets, p.storage_offsets, p.lengths)
            for fqn, pattern in zip(self._fqns, self._kinds, strict=True)
            for p in pattern.pieces[rank]
        )

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
                return sum(map(len, pattern.pieces))
        msg = f"{quote(fqn)} is not a parameter of the destination table; check the spelling"
        raise LayoutError(msg, fqn=str(fqn))

    def __str__(self) -> str:
        return self.report()

    def report(self, *, top: int = _REPORT_PARAMS) -> str:
        """The report ``str()`` gives, naming the ``top`` parameters read most.

        Bytes and reads per destination rank (the first and last few of a large world),
        the total, the rank that reads most, and the parameters all ranks read most of,
        each with its number of reads and its layouts before and after. FQNs that are not
        printable are shown escaped.

        Raises:
            LayoutError: ``top`` is not an int >= 0.
        """
        if type(top) is not int or top < 0:
            msg = f"top must be an int >= 0 (how many parameters to name), got {quote(top)}"
            raise LayoutError(msg)
        n = len(self.bytes_read)
        lines = [
            f"reshard: {len(self.by_param)} parameter{'s' if len(self.by_param) != 1 else ''}, "
            f"{n} destination rank{'s' if n != 1 else ''} read {_format_bytes(self.total)} in all"
        ]
        rank, most = self.largest
        lines.append(f"largest: rank {rank} reads {_format_bytes(most)}")
        lines.append("bytes per destination rank:")
        shown = range(n) if n <= _REPORT_RANKS else [*range(_REPORT_RANKS // 2), *range(n - 2, n)]
        last = -1
        width = len(str(n - 1))
        for rank in shown:
            if rank != last + 1:
                lines.append(f"  ... {rank - last - 1} ranks more")
            count = sum(len(pattern.pieces[rank]) for pattern in self._kinds)
            lines.append(
                f"  rank {rank:>{width}}  {_format_bytes(self.bytes_read[rank]):>10}  "
                f"{count:>5} reads"
            )
            last = rank
        named = sorted(self.by_param, key=lambda f: (-self.by_param[f], f))[:top]
        if named:
            reads = {
                name: sum(map(len, pattern.pieces))
                for name, pattern in zip(self._fqns, self._kinds, strict=True)
            }
            lines.append("parameters that move most (bytes read by all ranks):")
            shown_fqns = {fqn: escape(fqn) for fqn in named}
            fqn_width = max(map(len, shown_fqns.values()))
            for fqn in named:
                lines.append(
                    f"  {shown_fqns[fqn]:<{fqn_width}}  {_format_bytes(self.by_param[fqn]):>10}  "
                    f"{reads[fqn]:>5} reads  {_layout_str(self._src[fqn])} -> "
                    f"{_layout_str(self._dst[fqn])}"
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


_Paths: TypeAlias = list[
    tuple[str, SourceLayout, SourceLayout | None, dict[int, tuple[object, "_Pattern"]]]
]
"""A module kind's paths: each with its layout, its source layout, and its reads by shape."""


class _Reads:
    """The reads of each parameter, planned once per distinct (source layout, layout,
    shape) and shared: models repeat a few of them many times."""

    def __init__(self, planner: _Planner, dst: ParamLayoutTable, shapes: ShapesLike) -> None:
        self.planner, self.dst, self.shapes = planner, dst, shapes
        self.problems: list[LayoutError] = []
        # Keyed by id() of objects they keep alive (the tables hold the layouts, ``read``
        # the shapes).
        self.read: dict[int, tuple[HasShape, tuple[tuple[int, ...], int]]] = {}
        self.known: dict[
            tuple[int, int, int],
            tuple[SourceLayout, SourceLayout, tuple[tuple[int, ...], int], _Pattern],
        ] = {}

    def pattern(self, fqn: str, layout: SourceLayout, old: SourceLayout | None) -> _Pattern | None:
        """The reads of ``fqn``, or ``None`` with its problem recorded."""
        try:
            if old is None:
                msg = (
                    f"{clip(fqn)}: loaded under {layout} but not in the checkpoint's table; torch "
                    "refuses a missing key: add it to src, or leave it out of dst"
                )
                raise LayoutError(msg, fqn=fqn)
            found = _find_shape(fqn, self.shapes, self.dst)
            done = self.read.get(id(found))
            if done is None or done[0] is not found:
                done = found, _read_shape(fqn, found)
                self.read[id(found)] = done
            read = done[1]
            key = (id(old), id(layout), id(read))
            hit = self.known.get(key)  # the entry holds old, layout and read
            if hit is not None and hit[0] is old and hit[1] is layout and hit[2] is read:
                return hit[3]
            (shape, itemsize) = read
            pattern = self.planner.pattern(fqn, old, layout, shape, itemsize)
            self.known[key] = (old, layout, read, pattern)
            return pattern
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
            self.problems.append(error)
            return None


def _plan_all(
    planner: _Planner, src: ParamLayoutTable, dst: ParamLayoutTable, shapes: ShapesLike
) -> tuple[list[str], list[_Pattern], list[LayoutError]]:
    """Every parameter of ``dst`` and its reads, in order, and every problem found on the
    way.

    Tables kept by module are walked module by module: a parameter's source layout is
    found in its module's inner map by its path (its FQN is looked up in ``src`` as a
    whole only when that module has no such path there), and modules with the same
    inner maps in both tables share what is known of each path's reads, so a parameter
    costs its FQN, a lookup of its shape and a lookup of its reads by that shape.
    """
    reads = _Reads(planner, dst, shapes)
    fqns: list[str] = []
    kinds: list[_Pattern] = []
    add_fqn, add_kind, shapes_get = fqns.append, kinds.append, getter(shapes)
    src_entries, dst_entries = src._items, dst._items
    src_get = getter(src)
    if type(src_entries) is not ByModule or type(dst_entries) is not ByModule:
        for fqn, layout in dst.items():
            pattern = reads.pattern(fqn, layout, src_get(fqn))
            if pattern is not None:
                add_fqn(fqn)
                add_kind(pattern)
        return fqns, kinds, reads.problems
    # (id of dst's inner map, id of src's) -> them, and per path its layouts and the reads
    # of each shape object (by id; the entry holds the shape). The tables hold the maps.
    modules: dict[tuple[int, int], tuple[object, object, _Paths]] = {}
    for module, inner, there in dst_entries.by_module_with(src_entries):
        kind = modules.get((id(inner), id(there)))
        if kind is None or kind[0] is not inner or kind[1] is not there:
            olds = there.get if there is not None else _nothing
            paths: _Paths = [(path, layout, olds(path), {}) for path, layout in inner.items()]
            kind = modules[id(inner), id(there)] = (inner, there, paths)
        prefix = f"{module}." if module else ""
        for path, layout, old, by_shape in kind[2]:
            fqn = prefix + path
            found = shapes_get(fqn)
            hit = by_shape.get(id(found))
            if hit is not None and hit[0] is found:
                add_fqn(fqn)
                add_kind(hit[1])
                continue
            pattern = reads.pattern(fqn, layout, src_get(fqn) if old is None else old)
            if pattern is not None:
                add_fqn(fqn)
                add_kind(pattern)
                if found is not None and old is not None:  # else its source is by FQN
                    by_shape[id(found)] = (found, pattern)
    return fqns, kinds, reads.problems


def _nothing(_: str) -> None:
    """No source layout for any path: the module is not in the source table."""


def reshard_plan(
    src: ParamLayoutTable,
    dst: ParamLayoutTable,
    shapes: ShapesLike,
    *,
    src_sizes: Mapping[str, Mapping[str, int]],
    dst_sizes: Mapping[str, Mapping[str, int]],
    fsdp: Mapping[str, FsdpAxes] | None = None,
    shard_dim: int | Mapping[str, int] = 0,
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
        src: the layouts the checkpoint was saved under.
        dst: the layouts it is loaded under.
        shapes: each parameter's shape and dtype by FQN (a tied group needs one member's).
        src_sizes: by mesh role, the sizes of the saving run's mesh axes, in mesh order.
        dst_sizes: the same for the loading run; its world is the destination ranks.
        fsdp: FSDP's axis by mesh role (or a ``(replicate, shard)`` pair) when the
            tables are source tables, as for ``compose_table``.
        shard_dim: the dim FSDP shards, for every parameter or by FQN (with ``fsdp=``).

    Returns:
        The reads and bytes of every destination rank.

    Raises:
        PlanError: every parameter that cannot be planned (``.problems``, each naming its
            FQN): one ``dst`` has and ``src`` lacks (DCP's missing key), no shape, a layout
            that does not fit its shape or sizes.
        LayoutError: arguments of the wrong form, roles with different world sizes.
    """
    _check_table(src, "src")
    _check_table(dst, "dst")
    shapes = _shapes_by_fqn(shapes)  # looked up per FQN
    src_roles = as_role_sizes(src_sizes)
    dst_roles = as_role_sizes(dst_sizes)
    if not dst_roles:
        msg = "dst_sizes names no mesh role; give {'dense': {axis: n, ...}, ...}"
        raise LayoutError(msg)
    if fsdp is not None:
        src = compose_table(src, fsdp=fsdp, mesh_sizes=src_roles, shard_dim=shard_dim)
        dst = compose_table(dst, fsdp=fsdp, mesh_sizes=dst_roles, shard_dim=shard_dim)
    ranks = world_size(dst_roles, "dst_sizes")
    planner = _Planner(src_roles, dst_roles, ranks)
    fqns, kinds, problems = _plan_all(planner, src, dst, shapes)
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
    # Per parameter at C speed: a few patterns stand for a million parameters.
    counts = Counter(map(id, kinds))
    unique = dict(zip(map(id, kinds), kinds, strict=True))  # holds every pattern it names
    bytes_read = [0] * ranks
    for key, count in counts.items():
        for rank, n in enumerate(unique[key].bytes):
            bytes_read[rank] += count * n
    return ReshardPlan(
        tuple(bytes_read),
        frozen_map_of(dict(zip(fqns, map(attrgetter("total"), kinds), strict=True))),
        src=src,
        dst=dst,
        fqns=tuple(fqns),
        kinds=tuple(kinds),
    )
