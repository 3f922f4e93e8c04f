"""Per-rank answers for a whole world, one tensor dim at a time.

Each mesh axis of a layout shards at most one tensor dim, so what a rank holds of a tensor
is the product, over the dims, of what the axes sharding each dim give it. A dim's
*chain* is those axes in layout order; a rank's index on the chain is the row-major index
of its coordinate on them. ``read_dim`` gives, for every index on a chain, the box DTensor
(and so a distributed checkpoint) reads on that dim, by arithmetic for the layouts torch
makes and by following the rows for any other. ``RankSum`` adds values that each depend
on a few axes and spreads them over the world's ranks once, so a world of a million ranks
costs a few passes over its ranks, not one per tensor.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TypeAlias

import attrs

from layout_algebra._shards import chunk_bounds, shard_dim_of, split_factor_of
from layout_algebra.fsdp import fsdp_storage_runs
from layout_algebra.geometry import local_runs
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Placement, Shard, StridedShard

__all__ = [
    "Chain",
    "DimRead",
    "Indices",
    "RankSum",
    "chain_of",
    "chunk_lengths",
    "cover_problem",
    "fsdp_runs_differ",
    "index_vector",
    "read_dim",
    "row_sum",
    "source_runs",
]

Chain: TypeAlias = tuple[tuple[str, int, int], ...]
"""The axes sharding one dim, in layout order: ``(axis, size, split)``, ``split`` the
``StridedShard`` split factor (1 for a ``Shard``)."""


def _split(p: Placement) -> tuple[int, int] | None:
    """The dim ``p`` shards and its split factor (1 for ``Shard``), or ``None``."""
    dim = shard_dim_of(p)
    if dim is None:
        return None
    return dim, split_factor_of(p)


def chain_of(layout: SourceLayout, dim: int, sizes: Mapping[str, int]) -> Chain:
    """The axes of ``layout`` sharding ``dim``, with their sizes, in layout order."""
    out: list[tuple[str, int, int]] = []
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        got = _split(p)
        if got is not None and got[0] == dim:
            out.append((axis.name, sizes[axis.name], got[1]))
    return tuple(out)


def _one_dim(chain: Chain) -> tuple[SourceLayout, dict[str, int]]:
    """``chain`` as a layout of a 1-D tensor, and its sizes."""
    placements: list[Placement] = [
        Shard(0) if k == 1 else StridedShard(0, split_factor=k) for _, _, k in chain
    ]
    layout = SourceLayout("dense", [a for a, _, _ in chain], placements)
    return layout, {a: n for a, n, _ in chain}


def _coordinates(chain: Chain) -> list[dict[str, int]]:
    """Every index on ``chain`` as a coordinate, row-major."""
    out: list[dict[str, int]] = [{}]
    for axis, size, _ in chain:
        out = [{**c, axis: i} for c in out for i in range(size)]
    return out


def source_runs(n: int, chain: Chain) -> list[tuple[range, ...]]:
    """The rows DTensor gives each index on ``chain`` of a dim of ``n`` rows (slow: by rank)."""
    layout, sizes = _one_dim(chain)
    return [local_runs((n,), layout, sizes, c)[0] for c in _coordinates(chain)]


@attrs.frozen
class DimRead:
    """One dim's boxes over its chain: DTensor's offset and length for each index.

    ``offsets[i]`` is the dim's size for an empty box, as DTensor reports it. ``cover`` is
    ``None`` when the boxes cover every row exactly once, else what goes wrong.
    """

    chain: Chain
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    cover: str | None

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _, _ in self.chain)


def chunk_lengths(n: int, chunks: int) -> list[int]:
    """The lengths of the ``chunks`` pieces ``torch.chunk`` cuts ``n`` rows into, as
    ``chunk_bounds`` gives them one by one: pieces as long as the first, then the rest.

    >>> chunk_lengths(10, 4), chunk_lengths(5, 4), chunk_lengths(0, 2)
    ([3, 3, 3, 1], [2, 2, 1, 0], [0, 0])
    """
    size = chunk_bounds(n, chunks, 0)[1]
    full, rest = divmod(n, size) if size else (0, 0)
    tail = [rest] if rest else []
    return [size] * full + tail + [0] * (chunks - full - len(tail))


def _chunks(n: int, chunks: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each of ``chunk_lengths(n, chunks)``."""
    lengths = chunk_lengths(n, chunks)
    return list(zip(itertools.accumulate(lengths[:-1], initial=0), lengths, strict=True))


def _shard_chain(n: int, chain: Chain) -> tuple[list[int], list[int]]:
    """Offsets and lengths of a chain of ``Shard``s: each cuts the block it is given."""
    states = [(0, n)]
    for _, size, _ in chain:
        cuts: dict[int, list[tuple[int, int]]] = {}
        for _, h in states:
            if h not in cuts:
                cuts[h] = _chunks(h, size)
        states = [(s + lo, m) for s, h in states for lo, m in cuts[h]]
    return [s if m else n for s, m in states], [m for _, m in states]


def _canonical(n: int, chain: Chain) -> bool:
    """Whether ``chain`` is FSDP's ``_S(d, k)`` over source shards cutting ``k`` equal pieces."""
    if len(chain) < 2 or chain[0][2] == 1 or any(k != 1 for _, _, k in chain[1:]):
        return False
    split = chain[0][2]
    return math.prod(size for _, size, _ in chain[1:]) == split and n % split == 0


def _canonical_chain(n: int, chain: Chain) -> tuple[list[int], list[int]]:
    """Offsets and lengths of a ``_canonical`` chain: 8 rows ``_S(0, 2)`` over 2 then
    ``S(0)`` over 2: pieces 0:4 and 4:8, FSDP index f takes its chunk of the source's piece."""
    split, fsdp = chain[0][2], chain[0][1]
    piece = n // split
    chunks = _chunks(piece, fsdp)
    # each chunk's offset in every piece, a range apiece (an empty chunk reads as n)
    offsets = itertools.chain.from_iterable(
        range(lo, lo + split * piece, piece) if m else [n] * split for lo, m in chunks
    )
    lengths = itertools.chain.from_iterable([m] * split for _, m in chunks)
    return list(offsets), list(lengths)


def cover_problem(n: int, boxes: Iterable[tuple[int, int]]) -> str | None:
    """``None`` when the boxes ``(offset, length)`` cover rows ``0:n`` exactly once, else
    which rows are covered twice or by none.

    >>> cover_problem(4, [(0, 2), (2, 2)]), cover_problem(4, [(0, 3), (2, 2)])
    (None, 'rows 2:3 are saved twice')
    >>> cover_problem(4, [(0, 2), (4, 0)])
    'rows 2:4 are in no chunk'
    """
    at = 0
    for offset, length in sorted(b for b in boxes if b[1]):
        if offset > at:
            return f"rows {at}:{offset} are in no chunk"
        if offset < at:
            return f"rows {offset}:{min(at, offset + length)} are saved twice"
        at = offset + length
    return f"rows {at}:{n} are in no chunk" if at < n else None


def read_dim(n: int, chain: Chain) -> DimRead:
    """The boxes DTensor reads for every index on ``chain`` of a dim of ``n`` rows.

    A chain of ``Shard``s and FSDP's ``_S(d, k)`` over ``k`` equal source pieces are worked
    out per index by arithmetic and cover the dim exactly once; any other chain is followed
    rank by rank (``local_runs``) and checked.
    """
    if all(k == 1 for _, _, k in chain):
        offsets, lengths = _shard_chain(n, chain)
        return DimRead(chain, tuple(offsets), tuple(lengths), None)
    if _canonical(n, chain):
        offsets, lengths = _canonical_chain(n, chain)
        return DimRead(chain, tuple(offsets), tuple(lengths), None)
    runs = source_runs(n, chain)
    offsets = [r[0].start if r else n for r in runs]
    lengths = [sum(map(len, r)) for r in runs]
    cover = cover_problem(n, zip(offsets, lengths, strict=True))
    return DimRead(chain, tuple(offsets), tuple(lengths), cover)


def fsdp_runs_differ(
    n: int, chain: Chain, owned: frozenset[str]
) -> list[tuple[tuple[range, ...], tuple[range, ...]] | None]:
    """For each index on FSDP's ``chain`` (its axis first), the rows FSDP2 keeps and the
    rows DTensor reads where they differ, else ``None``.

    They can differ only where source axes cut the dim into unequal pieces: FSDP2 chunks
    each rank's source piece, DTensor chunks every piece and then applies the source.
    """
    if chain[0][2] == 1 or _canonical(n, chain):
        return [None] * math.prod(size for _, size, _ in chain)
    layout, sizes = _one_dim(chain)
    out: list[tuple[tuple[range, ...], tuple[range, ...]] | None] = []
    fsdp_owned = owned | {chain[0][0]}
    for c in _coordinates(chain):
        read = local_runs((n,), layout, sizes, c)[0]
        kept = fsdp_storage_runs((n,), layout, sizes, c, owned=fsdp_owned)[0]
        out.append(None if read == kept else (kept, read))
    return out


def index_vector(mesh: Mesh, axes: Sequence[str]) -> list[int]:
    """For each global rank of ``mesh``, the row-major index of its coordinate on ``axes``
    (in the order given): ``Mesh({"a": 2, "b": 2})`` on ``("b",)`` is ``[0, 1, 0, 1]``."""
    stride: dict[str, int] = {}
    step = 1
    for axis in reversed(axes):
        stride[axis] = step
        step *= mesh[axis]
    out = [0]
    for name, size in mesh.axes:
        w = stride.get(name, 0)
        if w:
            out = [x + w * i for x in out for i in range(size)]
        else:
            out = [x for x in out for _ in range(size)]
    return out


def row_sum(rows: Iterable[Iterable[int]], world: int) -> list[int]:
    """``rows`` of ``world`` ranks added rank by rank (``world`` zeros for none)."""
    out = [0] * world
    for row in rows:
        out = list(map(operator.add, out, row))
    return out


Factor: TypeAlias = tuple[tuple[str, ...], Sequence[int]]
"""A value by index on some axes (row-major over them): one dim's lengths on its chain."""

Indices: TypeAlias = dict[tuple[str, tuple[str, ...]], list[int]]
"""Each global rank's index on some axes of a role's mesh, by ``(role, axes)``."""


class RankSum:
    """Per-rank sums of values that each depend on a few axes, spread over the world once.

    ``add(role, factors, scale)`` adds ``scale`` times the product of the factors to every
    rank of ``role``'s mesh; values that depend on the same axes are summed where they
    live (an even shard is one number for all ranks), and ``per_rank`` spreads each sum
    over the ranks once. ``indices`` holds each rank's index on some axes of a role
    (``index_vector``), shared by the sums of one world.
    """

    def __init__(self, meshes: Mapping[str, Mesh], indices: Indices | None = None) -> None:
        self.meshes = meshes
        self.indices: Indices = {} if indices is None else indices
        self.sums: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def add(self, role: str, factors: Iterable[Factor], scale: int) -> None:
        axes: tuple[str, ...] = ()
        values: list[int] = [scale]
        for on, got in factors:
            first = got[0]
            if got.count(first) == len(got):
                values = [v * first for v in values]
            else:
                axes += on
                values = [v * g for v in values for g in got]
        self._add((role, axes), values)

    def merge(self, other: RankSum, times: int = 1) -> None:
        """``times`` each of ``other``'s sums, added where it lives."""
        for key, values in other.sums.items():
            self._add(key, [v * times for v in values])

    def _add(self, key: tuple[str, tuple[str, ...]], values: list[int]) -> None:
        if not any(values):
            return
        held = self.sums.get(key)
        if held is None:
            self.sums[key] = values
        else:
            self.sums[key] = [a + b for a, b in zip(held, values, strict=True)]

    def per_rank(self, role: str) -> list[int]:
        """The sums on every global rank of ``role``'s mesh."""
        return self._spread((role,), self.meshes[role].size)

    def total(self) -> list[int]:
        """The sums of every role, on every global rank (the roles' meshes span one world)."""
        return self._spread(self.meshes, next(iter(self.meshes.values())).size)

    def _spread(self, roles: Collection[str], world: int) -> list[int]:
        """The sums of ``roles`` on each of the ``world`` ranks: what is alike on every
        rank is added once, each other sum is spread over the ranks once."""
        alike = 0
        varying: list[tuple[list[int], list[int]]] = []
        for (role, axes), values in self.sums.items():
            if role not in roles:
                continue
            if axes:
                varying.append((values, self.index(role, axes)))
            else:
                alike += values[0]
        if not varying:
            return [alike] * world
        (values, index), *rest = varying
        out = list(map([v + alike for v in values].__getitem__, index))
        for values, index in rest:
            out = list(map(operator.add, out, map(values.__getitem__, index)))
        return out

    def index(self, role: str, axes: tuple[str, ...]) -> list[int]:
        """Each global rank's index on ``axes`` of ``role``'s mesh, worked out once."""
        found = self.indices.get((role, axes))
        if found is None:
            found = self.indices[role, axes] = index_vector(self.meshes[role], axes)
        return found
