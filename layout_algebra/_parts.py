"""Reads between a packed dim and its parts: a fused tensor saved, its parts loaded, or back.

A fused ``gate_up_proj.weight`` is ``[gate | up]`` on dim 0; loading it as ``gate_proj``
and ``up_proj`` means each destination rank reads, from the fused tensor's saved chunks,
the rows of its own part: rows ``r`` of ``up`` are rows ``len(gate) + r`` of the fused
tensor. The other way, a rank of the fused tensor reads each part's rows from that
part's saved chunks. Rows are followed as they are held, not as DTensor's first offset
says, so a ``StridedShard`` that leaves a rank's rows apart (``_S(0, 2)`` on
``[gate | up]``: 12 rows over 2 ranks, rank 0 holds rows 0:3 and 6:9) is read right:
the saved chunk's storage holds the rank's rows in order, whatever box DCP records.

The work is shaped as ``checkpoint``'s own planning: one dim at a time, each index on the
destination's chain finding its saved rows by bisection (the saved rows of one dim never
overlap), so a dim costs its runs, not its runs times the saved boxes; sources whose
other dims are read alike are added up on the packed dim and counted as one product; and
equal (layouts, shapes, spans) are planned once (``PartPlanner``). A rank's reads are
listed only for the rank asked.
"""

from __future__ import annotations

import itertools
import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeAlias

import attrs

from layout_algebra._ranks import Chain, DimRead, Factor, chain_of, read_dim, source_runs
from layout_algebra._text import MAX_INLINE
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.structure import Packed

__all__ = [
    "DestRows",
    "PartGeometry",
    "PartPattern",
    "PartPlanner",
    "PartSource",
    "Piece",
    "RankPieces",
    "SavedRows",
    "held_rows",
    "part_spans",
]

Run: TypeAlias = tuple[int, int, int]
"""Rows of one dim ``(start, length, position)``: ``position`` where they sit in a local
shard (or a saved chunk's storage)."""

Piece: TypeAlias = tuple[
    str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]
]
"""One read: source FQN, the saved chunk's offsets and sizes, then dest offsets, storage
offsets and lengths."""

Overlap: TypeAlias = tuple[int, int, int, int, int]
"""One dim of a read: ``(saved offset, saved size, storage offset, dest offset, length)``."""

RankPieces: TypeAlias = list[tuple[int, list[tuple[Overlap, ...]]]]
"""A destination rank's reads of one geometry: per source that gives any, its number and
its reads, each a box of one ``Overlap`` per dim."""

_Counts: TypeAlias = tuple[list[int], list[int]]
"""Reads and rows: by index on one dim's destination chain, or by range of rows."""

Term: TypeAlias = tuple[tuple[Factor, ...], tuple[Factor, ...]]
"""Rows and reads by index on each dim's destination chain, a rank's figure the product
over the dims: ``(rows factors, reads factors)``."""


def held_rows(n: int, chain: Chain) -> list[list[Run]]:
    """For every index on ``chain``, the rows of a dim of ``n`` it holds, in local order.

    >>> held_rows(12, (("tp", 2, 2),))
    [[(0, 3, 0), (6, 3, 3)], [(3, 3, 0), (9, 3, 3)]]
    """
    return _held(n, chain, read_dim(n, chain))


def _held(n: int, chain: Chain, got: DimRead) -> list[list[Run]]:
    """``held_rows``, given ``read_dim`` of the chain (which ranks are followed one by one
    for, where its boxes are not the rows: once more here, not twice)."""
    if got.cover is None:
        # Boxes that tile the dim are the rows: each index's rows are a disjoint share of the
        # dim starting at its box, so from the last box down each fills its box exactly.
        return [[(o, m, 0)] if m else [] for o, m in zip(got.offsets, got.lengths, strict=True)]
    out = []
    for runs in source_runs(n, chain):
        at, rows = 0, []
        for r in runs:
            if len(r):
                rows.append((r.start, len(r), at))
                at += len(r)
        out.append(rows)
    return out


def _saved_rows(n: int, chain: Chain, got: DimRead) -> list[tuple[int, int, list[Run]]]:
    """One dim's saved boxes as DCP records them (first row held, or ``n`` when empty, and
    the rows' count), the first of each offset in rank order, with the rows each one's
    storage holds (``got``: ``read_dim`` of the chain)."""
    first: dict[int, tuple[int, list[Run]]] = {}
    for rows in _held(n, chain, got):
        offset = rows[0][0] if rows else n
        first.setdefault(offset, (sum(r[1] for r in rows), rows))
    return [(o, size, rows) for o, (size, rows) in sorted(first.items())]


@attrs.frozen(eq=False)
class SavedRows:
    """One dim's saved rows, every run any saved chunk's storage holds, by first row.

    DTensor gives each row of a dim to one index on its chain, so the runs of distinct
    boxes never overlap and end in order: the runs a range of rows meets are found by two
    bisections, and their rows counted from the running sums. Should runs overlap, every
    run is looked at, which gives the same answer.
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    """The saved box of each run: ``(offset, size)`` on this dim."""
    positions: tuple[int, ...]
    """Where each run's first row sits in its box's storage."""
    before: tuple[int, ...]
    """``before[i]``: the rows of the runs before run ``i``."""
    disjoint: bool

    @classmethod
    def of(cls, n: int, chain: Chain) -> SavedRows:
        """The saved rows of a dim of ``n`` over ``chain``."""
        got = read_dim(n, chain)
        if got.cover is None:  # the boxes are the rows (``held_rows``): one run each
            # of the boxes at one offset the first in rank order, which a reversed dict keeps
            first = dict(zip(reversed(got.offsets), reversed(got.lengths), strict=True))
            starts = tuple(sorted(o for o, m in first.items() if m))
            sizes = tuple(map(first.__getitem__, starts))
            chunks = tuple(zip(starts, sizes, strict=True))
            positions = (0,) * len(starts)
        else:
            runs = sorted(
                (start, length, (offset, size), at)
                for offset, size, rows in _saved_rows(n, chain, got)
                for start, length, at in rows
            )
            starts = tuple(r[0] for r in runs)
            sizes = tuple(r[1] for r in runs)
            chunks = tuple(r[2] for r in runs)
            positions = tuple(r[3] for r in runs)
        ends = tuple(map(operator.add, starts, sizes))
        return cls(
            starts,
            ends,
            chunks,
            positions,
            tuple(itertools.accumulate(sizes, initial=0)),
            all(map(operator.le, ends, starts[1:])),
        )

    def _meeting(self, begin: int, end: int) -> range:
        """The runs that may meet rows ``begin:end``: exactly those, when disjoint."""
        if not self.disjoint:
            return range(len(self.starts))
        return range(bisect_right(self.ends, begin), bisect_left(self.starts, end))

    def overlaps(self, begin: int, end: int, dest: int) -> list[Overlap]:
        """Every read of rows ``begin:end`` (``dest`` the place of ``begin`` in the
        destination's local shard), by run."""
        out = []
        for i in self._meeting(begin, end):
            start, stop = self.starts[i], self.ends[i]
            a, b = max(begin, start), min(end, stop)
            if a < b:
                offset, size = self.chunks[i]
                out.append((offset, size, self.positions[i] + a - start, dest + a - begin, b - a))
        return out

    def count_all(self, begins: Sequence[int], ends: Sequence[int]) -> _Counts:
        """For each range of rows ``begins[i]:ends[i]``, how many reads ``overlaps`` gives
        and their rows in all: two bisections each, only the first and last run met cut."""
        if not self.disjoint:
            found = [self.overlaps(b, e, 0) for b, e in zip(begins, ends, strict=True)]
            return [len(f) for f in found], [sum(o[4] for o in f) for f in found]
        firsts = map(bisect_right, itertools.repeat(self.ends), begins)
        stops = map(bisect_left, itertools.repeat(self.starts), ends)
        at, until, before = self.starts, self.ends, self.before
        counts, rows = [], []
        for lo, hi, first, stop in zip(begins, ends, firsts, stops, strict=True):
            if lo >= hi or first >= stop:
                counts.append(0)
                rows.append(0)
                continue
            cut = max(0, lo - at[first]) + max(0, until[stop - 1] - hi)
            counts.append(stop - first)
            rows.append(before[stop] - before[first] - cut)
        return counts, rows


@attrs.frozen(eq=False)
class DestRows:
    """One dim's rows by index on the destination's chain (``held_rows``), and the same
    runs by first row with their index, to find the indices a range of rows meets.

    Where the boxes are the rows (``held_rows``), each index's one run is its box
    (``boxes``), and ``held`` is ``None``.
    """

    boxes: tuple[tuple[int, ...], tuple[int, ...]]
    """DTensor's offset and length of the box of each index."""
    held: list[list[Run]] | None
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    owners: tuple[int, ...]
    disjoint: bool

    @classmethod
    def of(cls, n: int, chain: Chain) -> DestRows:
        got = read_dim(n, chain)
        boxes = (got.offsets, got.lengths)
        if got.cover is None:
            held = None
            owners = tuple(
                sorted((i for i, m in enumerate(got.lengths) if m), key=got.offsets.__getitem__)
            )
            starts = tuple(map(got.offsets.__getitem__, owners))
            ends = tuple(s + got.lengths[i] for s, i in zip(starts, owners, strict=True))
        else:
            held = _held(n, chain, got)
            runs = sorted(
                (start, start + length, i)
                for i, rows in enumerate(held)
                for start, length, _ in rows
            )
            starts = tuple(r[0] for r in runs)
            ends = tuple(r[1] for r in runs)
            owners = tuple(r[2] for r in runs)
        return cls(boxes, held, starts, ends, owners, all(map(operator.le, ends, starts[1:])))

    def __len__(self) -> int:
        return len(self.boxes[0])

    def runs(self, i: int) -> list[Run]:
        """The rows index ``i`` holds, in local order."""
        if self.held is not None:
            return self.held[i]
        offset, length = self.boxes[0][i], self.boxes[1][i]
        return [(offset, length, 0)] if length else []

    def meeting(self, lo: int, hi: int) -> range:
        """Which of ``starts``/``ends``/``owners`` meet rows ``lo:hi`` (all of them, should
        runs overlap: those that do not meet nothing when cut to ``lo:hi``)."""
        if self.disjoint:
            return range(bisect_right(self.ends, lo), bisect_left(self.starts, hi))
        return range(len(self.starts))


@attrs.frozen
class PartSource:
    """A saved tensor some rows of the destination come from, on the packed dim ``dim``:
    destination rows ``lo:hi`` are its rows ``lo + shift : hi + shift``."""

    fqn: str
    layout: SourceLayout
    mesh: Mesh
    shape: tuple[int, ...]
    dim: int
    lo: int
    hi: int
    shift: int

    def window(self, dim: int) -> tuple[int, int, int]:
        """``(lo, hi, shift)`` on ``dim``: the whole dim, unmoved, off the packed one."""
        return (self.lo, self.hi, self.shift) if dim == self.dim else (0, self.shape[dim], 0)


@attrs.frozen(eq=False)
class PartGeometry:
    """One destination tensor read from the parts of another (or their whole), without
    its FQNs: what every parameter of one (layouts, shapes, spans) signature shares.

    Per dim the destination's rows by index on its chain (``dest``) and each source's
    saved rows (``saved``); per rank the rows and reads are a sum of products over the
    dims (``terms``, one per group of sources read alike off the packed dim).
    """

    role: str
    mesh: Mesh
    itemsize: int
    layouts: tuple[SourceLayout, ...]
    """Each source's saved layout, for a report."""
    chains: tuple[Chain, ...]
    dest: tuple[DestRows, ...]
    windows: tuple[tuple[tuple[int, int, int], ...], ...]
    """Per source, ``PartSource.window`` of each dim."""
    saved: tuple[tuple[SavedRows, ...], ...]
    """Per source, its saved rows on each dim."""
    terms: tuple[Term, ...]
    total: int
    count: int

    def pieces_at(self, indices: Sequence[int]) -> RankPieces:
        """The reads of the rank at ``indices`` (one per dim's chain): per source that
        gives any, its number and its reads' boxes, by the saved chunks' offsets."""
        out = []
        for number, (windows, saved) in enumerate(zip(self.windows, self.saved, strict=True)):
            per_dim = []
            for dest, rows, (lo, hi, shift), i in zip(
                self.dest, saved, windows, indices, strict=True
            ):
                found: list[Overlap] = []
                for start, length, at in dest.runs(i):
                    begin, end = max(start, lo), min(start + length, hi)
                    if begin < end:
                        found.extend(rows.overlaps(begin + shift, end + shift, at + begin - start))
                if not found:
                    break  # no rows of this source on this dim: no reads from it
                per_dim.append(sorted(found))
            else:
                out.append((number, list(itertools.product(*per_dim))))
        return out

    def pieces(self, rank: int) -> RankPieces:
        """``pieces_at`` destination rank ``rank``'s index on each dim's chain."""
        where = dict(zip(self.mesh.names, self.mesh.coordinate(rank), strict=True))
        indices = []
        for chain in self.chains:
            i = 0
            for axis, size, _ in chain:
                i = i * size + where[axis]
            indices.append(i)
        return self.pieces_at(indices)


@attrs.frozen(eq=False)
class PartPattern:
    """One destination parameter read from the parts of another (or their whole): its
    signature's ``PartGeometry`` and the FQNs of its sources."""

    geometry: PartGeometry
    fqns: tuple[str, ...]

    @property
    def source(self) -> str:
        """The sources in one line, for a report: the first few, and how many more."""
        named = zip(self.fqns[:MAX_INLINE], self.geometry.layouts, strict=False)
        shown = " + ".join(f"{fqn} {layout}" for fqn, layout in named)
        rest = len(self.fqns) - MAX_INLINE
        return f"{shown} + {rest} more" if rest > 0 else shown

    @property
    def total(self) -> int:
        """Bytes all destination ranks read."""
        return self.geometry.total

    @property
    def count(self) -> int:
        """Reads all destination ranks make."""
        return self.geometry.count

    def pieces(self, rank: int, found: RankPieces | None = None) -> list[Piece]:
        """Destination rank ``rank``'s reads, source by source (``found``: its geometry's
        ``pieces`` of the rank, when the caller has them)."""
        out: list[Piece] = []
        for number, boxes in self.geometry.pieces(rank) if found is None else found:
            fqn = self.fqns[number]
            out.extend(
                (
                    fqn,
                    tuple(b[0] for b in box),
                    tuple(b[1] for b in box),
                    tuple(b[3] for b in box),
                    tuple(b[2] for b in box),
                    tuple(b[4] for b in box),
                )
                for box in boxes
            )
        return out


_Signature: TypeAlias = tuple[
    SourceLayout,
    tuple[int, ...],
    int,
    tuple[tuple[SourceLayout, tuple[int, ...], int, int, int, int], ...],
]
"""What a part pattern depends on: the destination's layout and shape, the item size, and
each source's layout, shape, packed dim and window (FQNs aside)."""


class PartPlanner:
    """One ``reshard_plan`` call's part planning, by value: each dim's rows per (rows,
    chain), each dim's reads per (rows, saved chain, loaded chain), each signature once."""

    def __init__(self) -> None:
        self.saved: dict[tuple[int, Chain], SavedRows] = {}
        self.dest: dict[tuple[int, Chain], DestRows] = {}
        self.dims: dict[tuple[int, Chain, Chain], _Counts] = {}
        self.geometries: dict[_Signature, PartGeometry] = {}
        self.known: dict[Hashable, PartGeometry] = {}
        """Geometries by the values their parameters were read from (layouts, shapes as
        given, spans), for the caller to skip the reading and checking of equal ones."""

    def geometry(
        self,
        dst: tuple[SourceLayout, Mesh, tuple[int, ...]],
        sources: Sequence[PartSource],
        *,
        itemsize: int,
    ) -> PartGeometry:
        """The reads of a destination tensor under ``dst`` (layout, mesh, shape) from
        ``sources``, each giving some rows of its packed dim."""
        layout, _, shape = dst
        key: _Signature = (
            layout,
            shape,
            itemsize,
            tuple((s.layout, s.shape, s.dim, s.lo, s.hi, s.shift) for s in sources),
        )
        found = self.geometries.get(key)
        if found is None:
            found = self.geometries[key] = self._geometry(dst, sources, itemsize)
        return found

    def _saved(self, n: int, chain: Chain) -> SavedRows:
        found = self.saved.get((n, chain))
        if found is None:
            found = self.saved[n, chain] = SavedRows.of(n, chain)
        return found

    def _dest(self, n: int, chain: Chain) -> DestRows:
        found = self.dest.get((n, chain))
        if found is None:
            found = self.dest[n, chain] = DestRows.of(n, chain)
        return found

    def _whole_dim(self, n: int, src: Chain, dst: Chain) -> _Counts:
        """Reads and rows by destination index of a dim read whole and unmoved."""
        key = (n, src, dst)
        found = self.dims.get(key)
        if found is None:
            saved, dest = self._saved(n, src), self._dest(n, dst)
            if dest.held is None:  # one run per index: its box
                offsets, lengths = dest.boxes
                found = saved.count_all(offsets, list(map(operator.add, offsets, lengths)))
            else:
                reads, rows = [], []
                for held in dest.held:
                    got = saved.count_all([r[0] for r in held], [r[0] + r[1] for r in held])
                    reads.append(sum(got[0]))
                    rows.append(sum(got[1]))
                found = (reads, rows)
            self.dims[key] = found
        return found

    def _geometry(
        self,
        dst: tuple[SourceLayout, Mesh, tuple[int, ...]],
        sources: Sequence[PartSource],
        itemsize: int,
    ) -> PartGeometry:
        layout, mesh, shape = dst
        chains = tuple(chain_of(layout, dim, mesh) for dim in range(len(shape)))
        dest = tuple(self._dest(n, chain) for n, chain in zip(shape, chains, strict=True))
        src_chains = [
            tuple(chain_of(s.layout, dim, s.mesh) for dim in range(len(s.shape))) for s in sources
        ]
        saved = tuple(
            tuple(self._saved(n, chain) for n, chain in zip(s.shape, own, strict=True))
            for s, own in zip(sources, src_chains, strict=True)
        )
        # Sources read alike off the packed dim are one product: their packed dim summed.
        groups: dict[tuple[Chain, ...], list[int]] = {}
        for number, (s, own) in enumerate(zip(sources, src_chains, strict=True)):
            others = tuple(c for dim, c in enumerate(own) if dim != s.dim)
            groups.setdefault(others, []).append(number)
        terms: list[Term] = []
        for numbers in groups.values():
            reads: list[Factor] = []
            rows: list[Factor] = []
            first = sources[numbers[0]]
            for dim, (n, chain) in enumerate(zip(shape, chains, strict=True)):
                axes = tuple(a for a, _, _ in chain)
                if dim == first.dim:
                    got = self._packed_dim(
                        dest[dim], [(sources[k], saved[k][dim]) for k in numbers]
                    )
                else:
                    got = self._whole_dim(n, src_chains[numbers[0]][dim], chain)
                reads.append((axes, got[0]))
                rows.append((axes, got[1]))
            terms.append((tuple(rows), tuple(reads)))
        copies = mesh.size // math.prod(map(len, dest))
        return PartGeometry(
            layout.mesh,
            mesh,
            itemsize,
            tuple(s.layout for s in sources),
            chains,
            dest,
            tuple(tuple(s.window(dim) for dim in range(len(s.shape))) for s in sources),
            saved,
            tuple(terms),
            itemsize * copies * sum(math.prod(sum(v) for _, v in rows) for rows, _ in terms),
            copies * sum(math.prod(sum(v) for _, v in reads) for _, reads in terms),
        )

    @staticmethod
    def _packed_dim(dest: DestRows, sources: Sequence[tuple[PartSource, SavedRows]]) -> _Counts:
        """Reads and rows by destination index on the packed dim, summed over ``sources``:
        each source's window meets the few destination runs found by bisection."""
        reads, rows = [0] * len(dest), [0] * len(dest)
        for src, saved in sources:
            found = dest.meeting(src.lo, src.hi)
            begins = [max(dest.starts[k], src.lo) + src.shift for k in found]
            ends = [min(dest.ends[k], src.hi) + src.shift for k in found]
            counts, got = saved.count_all(begins, ends)
            for k, c, r in zip(found, counts, got, strict=True):
                reads[dest.owners[k]] += c
                rows[dest.owners[k]] += r
        return reads, rows


def part_spans(packed: Packed) -> Mapping[str, tuple[int, int]]:
    """Each part's ``[start, stop)`` on its dim, by name."""
    return {part.name: (start, stop) for part, start, stop in packed.spans()}
