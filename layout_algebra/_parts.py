"""Reads between a packed dim and its parts: a fused tensor saved, its parts loaded, or back.

A fused ``gate_up_proj.weight`` is ``[gate | up]`` on dim 0; loading it as ``gate_proj``
and ``up_proj`` means each destination rank reads, from the fused tensor's saved chunks,
the rows of its own part: rows ``r`` of ``up`` are rows ``len(gate) + r`` of the fused
tensor. The other way, a rank of the fused tensor reads each part's rows from that
part's saved chunks. Rows are followed as they are held, not as DTensor's first offset
says, so a ``StridedShard`` that leaves a rank's rows apart (``_S(0, 2)`` on
``[gate | up]``: 12 rows over 2 ranks, rank 0 holds rows 0:3 and 6:9) is read right:
the saved chunk's storage holds the rank's rows in order, whatever box DCP records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import attrs

from layout_algebra._ranks import Chain, Factor, chain_of, read_dim, source_runs
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh
from layout_algebra.structure import Packed

__all__ = ["PartPattern", "PartSource", "Piece", "held_rows", "part_pattern", "part_spans"]

Run: TypeAlias = tuple[int, int, int]
"""Rows of one dim ``(start, length, position)``: ``position`` where they sit in a local
shard (or a saved chunk's storage)."""

Piece: TypeAlias = tuple[
    str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]
]
"""One read: source FQN, the saved chunk's offsets and sizes, then dest offsets, storage
offsets and lengths."""


def held_rows(n: int, chain: Chain) -> list[list[Run]]:
    """For every index on ``chain``, the rows of a dim of ``n`` it holds, in local order.

    >>> held_rows(12, (("tp", 2, 2),))
    [[(0, 3, 0), (6, 3, 3)], [(3, 3, 0), (9, 3, 3)]]
    """
    if all(k == 1 for _, _, k in chain):
        got = read_dim(n, chain)
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


def _saved_rows(n: int, chain: Chain) -> list[tuple[int, int, list[Run]]]:
    """One dim's saved boxes as DCP records them (first row held, or ``n`` when empty, and
    the rows' count), the first of each offset in rank order, with the rows each one's
    storage holds."""
    first: dict[int, tuple[int, list[Run]]] = {}
    for rows in held_rows(n, chain):
        offset = rows[0][0] if rows else n
        first.setdefault(offset, (sum(r[1] for r in rows), rows))
    return [(o, size, rows) for o, (size, rows) in sorted(first.items())]


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


def _overlap(
    dest: list[Run], saved: list[tuple[int, int, list[Run]]], lo: int, hi: int, shift: int
) -> list[tuple[int, int, int, int, int]]:
    """``(saved offset, saved size, storage offset, dest offset, length)`` of every row
    the runs ``dest`` (within ``lo:hi``, moved by ``shift``) find in the saved boxes."""
    out = []
    for start, length, at in dest:
        begin, end = max(start, lo), min(start + length, hi)
        if begin >= end:
            continue
        pos = at + begin - start
        begin, end = begin + shift, end + shift
        for s_off, s_len, rows in saved:
            for s, sl, spos in rows:
                a, b = max(begin, s), min(end, s + sl)
                if a < b:
                    out.append((s_off, s_len, spos + a - s, pos + a - begin, b - a))
    return sorted(out)


@attrs.frozen(eq=False)
class PartPattern:
    """One destination parameter read from the parts of another (or their whole): per
    index on its axes (row-major over ``axes``), the elements and reads, and its pieces
    for any rank on demand."""

    role: str
    mesh: Mesh
    itemsize: int
    axes: tuple[str, ...]
    chains: tuple[Chain, ...]
    dest: tuple[list[list[Run]], ...]
    sources: tuple[tuple[PartSource, tuple[list[tuple[int, int, list[Run]]], ...]], ...]
    rows: tuple[Factor, ...]
    reads: tuple[Factor, ...]
    total: int
    count: int
    source: str
    """The sources in one line, for a report."""

    def pieces_at(self, indices: Sequence[int]) -> list[Piece]:
        out: list[Piece] = []
        for src, saved in self.sources:
            per_dim = []
            for dim, (dest, boxes) in enumerate(zip(self.dest, saved, strict=True)):
                runs = dest[indices[dim]]
                if dim == src.dim:
                    per_dim.append(_overlap(runs, boxes, src.lo, src.hi, src.shift))
                else:
                    per_dim.append(_overlap(runs, boxes, 0, src.shape[dim], 0))
            for box in _product(per_dim):
                out.append(
                    (
                        src.fqn,
                        tuple(b[0] for b in box),
                        tuple(b[1] for b in box),
                        tuple(b[3] for b in box),
                        tuple(b[2] for b in box),
                        tuple(b[4] for b in box),
                    )
                )
        return out

    def pieces(self, rank: int) -> list[Piece]:
        """Destination rank ``rank``'s reads, source by source."""
        where = dict(zip(self.mesh.names, self.mesh.coordinate(rank), strict=True))
        indices = []
        for chain in self.chains:
            i = 0
            for axis, size, _ in chain:
                i = i * size + where[axis]
            indices.append(i)
        return self.pieces_at(indices)


def _product(
    per_dim: list[list[tuple[int, int, int, int, int]]],
) -> list[tuple[tuple[int, int, int, int, int], ...]]:
    out: list[tuple[tuple[int, int, int, int, int], ...]] = [()]
    for options in per_dim:
        out = [(*box, o) for box in out for o in options]
    return out


def _indices(chains: Sequence[Chain]) -> list[list[int]]:
    """Every combination of indices on ``chains``, row-major over their axes."""
    out: list[list[int]] = [[]]
    for chain in chains:
        count = 1
        for _, size, _ in chain:
            count *= size
        out = [[*c, i] for c in out for i in range(count)]
    return out


def part_pattern(
    dst: tuple[SourceLayout, Mesh, tuple[int, ...]],
    sources: Sequence[PartSource],
    *,
    itemsize: int,
) -> PartPattern:
    """The reads of a destination tensor under ``dst`` (layout, mesh, shape) from
    ``sources``, each giving some rows of its packed dim."""
    layout, mesh, shape = dst
    chains = tuple(chain_of(layout, dim, mesh) for dim in range(len(shape)))
    dest = tuple(held_rows(n, chain) for n, chain in zip(shape, chains, strict=True))
    saved = tuple(
        (
            src,
            tuple(
                _saved_rows(n, chain_of(src.layout, dim, src.mesh))
                for dim, n in enumerate(src.shape)
            ),
        )
        for src in sources
    )
    axes = tuple(a for chain in chains for a, _, _ in chain)
    pattern = PartPattern(layout.mesh, mesh, itemsize, axes, chains, dest, saved, (), (), 0, 0, "")
    elements, counts = [], []
    for indices in _indices(chains):
        got = pattern.pieces_at(indices)
        counts.append(len(got))
        total = 0
        for piece in got:
            numel = 1
            for n in piece[5]:
                numel *= n
            total += numel
        elements.append(total)
    copies = mesh.size // len(elements)
    return attrs.evolve(
        pattern,
        rows=((axes, elements),),
        reads=((axes, counts),),
        total=itemsize * copies * sum(elements),
        count=copies * sum(counts),
        source=" + ".join(f"{s.fqn} {s.layout}" for s in sources),
    )


def part_spans(packed: Packed) -> Mapping[str, tuple[int, int]]:
    """Each part's ``[start, stop)`` on its dim, by name."""
    return {part.name: (start, stop) for part, start, stop in packed.spans()}
