"""The lint's rules inside a dim: shards that cut a unit, packed dims sharded as one
block, experts the shards cannot split.

Only source axes count: FSDP's own axes never compute on their shards (they all-gather
before use), so a composed layout's owned axes are set aside. The rows each rank holds
along a structured dim are those DTensor gives it (``_ranks.source_runs``, torch.chunk
semantics), over the source axes that shard the dim (its chain), in the layout's order.

A packed dim (several parts) is right when every rank holds, of each part, the rows it
would hold were the part sharded on its own: ``_S(0, 2)`` on ``[gate: 64 | up: 64]`` over
2 ranks gives rank 1 gate 32-63 and up 32-63; ``S(0)`` gives it up 0-63 and no gate.
Then each part's units must stay whole: 6 heads of 128 over 4 ranks are chunks of
``ceil(768 / 4) = 192`` rows, so a boundary falls at 192, inside head 1. Experts (a
part named ``experts``) must also split evenly: 6 over 4 ranks are 2, 2, 2, 0.

Each finding is FQN-free (``StructureProblem``), so one (layout, shape) is examined once
however many parameters share it; ``ranks`` are global ranks, row-major over
``mesh_sizes`` (the role's mesh spans the world).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from layout_algebra._ranks import Chain, chain_of, index_vector, read_dim, source_runs
from layout_algebra._shards import MAX_PIECES, Runs, chunk_bounds
from layout_algebra._text import clip, ranks_str, ranks_text, some_of
from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.layout import SourceLayout
from layout_algebra.mesh import Mesh, as_mesh
from layout_algebra.placements import format_placement
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import EXPERTS, Packed, Part

__all__ = ["StructureProblem", "structure_problems"]


class StructureProblem(NamedTuple):
    """One finding of the rules, FQN-free: the lint prefixes the parameter's FQN."""

    kind: str
    message: str
    ranks: tuple[int, ...]
    axis: str | None
    placement: str | None


class _Dim(NamedTuple):
    """One structured dim of one parameter under one layout, for the messages."""

    layout: SourceLayout
    dim: int
    packed: Packed
    mesh: Mesh


def structure_problems(
    layout: SourceLayout,
    shape: ParamShape,
    mesh_sizes: Mesh | Mapping[str, int],
    *,
    owned: Iterable[str] = FSDP_OWNED_AXES,
) -> tuple[StructureProblem, ...]:
    """What ``layout`` breaks inside the structured dims of ``shape``: at most one
    problem per dim, of kind ``"packed-contiguous"``, ``"cuts-unit"`` or ``"experts"``.

    >>> from layout_algebra.placements import Shard
    >>> from layout_algebra.structure import Packed, Part
    >>> kv = ParamShape((512, 4096), "bfloat16", structure={0: Packed([Part("k", 4, 128)])})
    >>> tp8 = SourceLayout("dense", ["tp"], [Shard(0)])
    >>> [(p.kind, p.axis) for p in structure_problems(tp8, kv, {"tp": 8})]
    [('cuts-unit', 'tp')]

    Args:
        layout: the parameter's layout, source or composed (``owned`` axes are skipped).
        shape: its shape, whose ``structure`` is checked.
        mesh_sizes: the sizes of the layout's mesh by axis, in mesh order (global ranks
            are row-major over them). An axis of the layout it lacks is the lint's own
            problem: nothing is said here then.
        owned: FSDP's and pipelining's axes.

    Raises:
        LayoutError: ``mesh_sizes`` is not a mesh (sizes by axis).
    """
    if not shape.structure:
        return ()
    mesh = as_mesh(mesh_sizes)
    if any(a.name not in mesh for a in layout.axes):
        return ()
    skipped = frozenset(owned) | {name for name, size in mesh.axes if size == 1}
    kept = [
        (a, p) for a, p in zip(layout.axes, layout.placements, strict=True) if a.name not in skipped
    ]
    source = SourceLayout(layout.mesh, [a for a, _ in kept], [p for _, p in kept])
    out: list[StructureProblem] = []
    for dim, packed in shape.structure.items():
        chain = chain_of(source, dim, mesh)
        if chain and dim < shape.ndim:
            found = _check_dim(_Dim(layout, dim, packed, mesh), chain)
            if found is not None:
                out.append(found)
    return tuple(out)


def _merged(found: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Runs ``(first, end, index)`` by row, one index's touching runs as one (as
    ``local_runs`` keeps them: the rows of a piece's last chunk and the next piece's first
    are one run when one index holds both)."""
    out: list[tuple[int, int, int]] = []
    for a, b, index in found:
        if out and out[-1][2] == index and out[-1][1] == a:
            out[-1] = (out[-1][0], b, index)
        else:
            out.append((a, b, index))
    return out


class _Segments:
    """A dim cut as a chain shards it, listed: every run of rows some index holds, by
    first row, and the index holding it. DTensor gives each row to one index, so the runs
    tile the dim, and those a range of rows meets are found by two bisections."""

    def __init__(self, found: list[tuple[int, int, int]]) -> None:
        runs = _merged(sorted(found))
        self.starts = [a for a, _, _ in runs]
        self.stops = [b for _, b, _ in runs]
        self.owners = [i for _, _, i in runs]

    def within(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The runs meeting rows ``[start, stop)``, cut to them and counted from
        ``start``: ``(first, end, index)`` each, by row."""
        first, last = bisect_right(self.stops, start), bisect_left(self.starts, stop)
        return [
            (max(a, start) - start, min(b, stop) - start, i)
            for a, b, i in zip(
                self.starts[first:last],
                self.stops[first:last],
                self.owners[first:last],
                strict=True,
            )
        ]

    def runs(self, index: int) -> Runs:
        """The rows ``index`` holds."""
        return tuple(
            range(a, b)
            for a, b, i in zip(self.starts, self.stops, self.owners, strict=True)
            if i == index
        )

    def step(self, start: int, stop: int) -> int | None:
        """``_Strided.step``: not known here."""
        return None


class _Strided:
    """A dim cut by one ``_S(d, k)`` over ``size`` indices, by arithmetic, nothing listed
    but the runs asked for: ``k`` pieces of ``ceil(n / k)`` rows (the last shorter, or
    empty), each chunked over the indices as ``torch.chunk`` does. 12 rows, ``_S(0, 2)``
    over 2: pieces 0:6 and 6:12, index 0 holds 0:3 and 6:9."""

    def __init__(self, n: int, size: int, split: int) -> None:
        self.n, self.size = n, size
        self.piece = -(-n // split)  # chunk_bounds(n, split, p) are its multiples

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """The pieces meeting rows ``[start, stop)``, as ``(first, end)``."""
        lo = start - start % self.piece
        while lo < min(stop, self.n):
            yield lo, min(lo + self.piece, self.n)
            lo += self.piece

    def within(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``_Segments.within``."""
        found = []
        for lo, hi in self._pieces(start, stop):
            chunk = -(-(hi - lo) // self.size)  # the rows of each index, the last fewer
            first, end = max(start, lo) - lo, min(stop, hi) - lo
            for index in range(first // chunk, (end - 1) // chunk + 1):
                a, b = max(index * chunk, first), min((index + 1) * chunk, end)
                found.append((lo + a - start, lo + b - start, index))
        return _merged(found)

    def runs(self, index: int) -> Runs:
        """``_Segments.runs``."""
        found = []
        for lo, hi in self._pieces(0, self.n):
            a, b = chunk_bounds(hi - lo, self.size, index)
            if a < b:
                found.append((lo + a, lo + b, index))
        return tuple(range(a, b) for a, b, _ in _merged(found))

    def step(self, start: int, stop: int) -> int | None:
        """When rows ``[start, stop)`` are one whole piece, the rows each index holds of
        it (every index's but the last nonempty one's): the piece is then chunked as it
        would be alone; else ``None``."""
        if start % self.piece or start >= self.n or stop != min(start + self.piece, self.n):
            return None
        return -(-(stop - start) // self.size)


def _segments(n: int, chain: Chain) -> _Segments | _Strided:
    """How ``chain`` cuts a dim of ``n`` rows (the runs ``source_runs`` gives each index):
    a chain of ``Shard``s by its boxes, one ``StridedShard`` by arithmetic, any other
    chain rank by rank."""
    if all(k == 1 for _, _, k in chain):
        got = read_dim(n, chain)  # one box per index, and the boxes are its rows
        boxes = enumerate(zip(got.offsets, got.lengths, strict=True))
        return _Segments([(o, o + m, i) for i, (o, m) in boxes if m])
    if len(chain) == 1 and min(chain[0][2], n) <= MAX_PIECES:
        return _Strided(n, chain[0][1], chain[0][2])
    found = [
        (r.start, r.stop, index)
        for index, runs in enumerate(source_runs(n, chain))
        for r in runs
        if len(r)
    ]
    return _Segments(found)


def _contiguous(chain: Chain) -> Chain:
    """``chain`` with every axis a contiguous ``Shard``: a part sharded on its own."""
    return tuple((axis, size, 1) for axis, size, _ in chain)


def _alone(length: int, chain: Chain, index: int) -> tuple[int, int]:
    """The rows ``[first, end)`` index ``index`` holds of a part of ``length`` sharded on
    its own (``_contiguous(chain)``): each axis chunks what the axes before it left."""
    digits = []
    for _, size, _ in reversed(chain):
        index, digit = divmod(index, size)
        digits.append(digit)
    lo, hi = 0, length
    for (_, size, _), digit in zip(chain, reversed(digits), strict=True):
        a, b = chunk_bounds(hi - lo, size, digit)
        lo, hi = lo + a, lo + b
    return lo, hi


def _mixed_in(
    part: tuple[int, int], chain: Chain, cut: _Segments | _Strided, holders: dict[int, list[int]]
) -> set[int]:
    """The indices whose rows of the part at ``[start, stop)`` are not those the part
    sharded on its own gives them (``holders``: the indices holding any of it alone, by
    the part's length)."""
    start, stop = part
    seen: dict[int, list[tuple[int, int]]] = {}
    for a, b, index in cut.within(start, stop):
        seen.setdefault(index, []).append((a, b))
    out = {i for i, got in seen.items() if got != [_alone(stop - start, chain, i)]}
    length = stop - start
    if length not in holders:
        got = read_dim(length, _contiguous(chain))
        holders[length] = [i for i, m in enumerate(got.lengths) if m]
    out.update(i for i in holders[length] if i not in seen)
    return out


def _check_dim(at: _Dim, chain: Chain) -> StructureProblem | None:
    """The problem of ``dim``, if any: packed-contiguous before cuts-unit before
    experts, each blamed on the first axis (in layout order) whose sharding, with the
    axes before it, already shows it. Indices are row-major over the chain's axes.

    Each prefix of the chain cuts the dim once (``_segments``); a part looks only at the
    runs meeting it, found by bisection or arithmetic, so a dim of many parts costs its
    parts and their runs, not parts times ranks. A part that is one whole piece of a
    ``StridedShard`` (``_S(0, k)`` on ``k`` equal parts) costs no runs at all: the piece is
    chunked as the part alone would be, its boundaries every ``step`` rows.
    """
    packed = at.packed
    spans = list(packed.spans())
    prefixes = [(chain[:n], _segments(packed.length, chain[:n])) for n in range(1, len(chain) + 1)]
    if len(packed.parts) > 1:
        for prefix, cut in prefixes:
            indices = math.prod(size for _, size, _ in prefix)
            holders: dict[int, list[int]] = {}
            mixed: set[int] = set()
            for _, start, stop in spans:
                if cut.step(start, stop) is not None or all(
                    (a, b) == _alone(stop - start, prefix, i) for a, b, i in cut.within(start, stop)
                ):
                    continue  # each run is its index's share of the part alone: they tile it
                mixed |= _mixed_in((start, stop), prefix, cut, holders)
                if len(mixed) == indices:
                    break  # every index already
            if mixed:
                return _packed_problem(at, prefix, mixed, cut)
    for prefix, cut in prefixes:
        for part, start, stop in spans:
            step = cut.step(start, stop)
            if step is not None and (step >= stop - start or step % part.size == 0):
                continue  # its boundaries are the multiples of step inside it
            cuts: dict[int, set[int]] = {}
            for a, b, index in cut.within(start, stop):
                for end in (a, b):
                    if end % part.size:
                        cuts.setdefault(index, set()).add(start + end)
            if cuts:
                return _cut_problem(at, part, prefix, cuts)
    for prefix, cut in prefixes:
        for part, start, stop in spans:
            if part.name != EXPERTS:
                continue
            rows = [0] * math.prod(size for _, size, _ in prefix)
            for a, b, index in cut.within(start, stop):
                rows[index] += b - a
            held = [n // part.size for n in rows]
            if len(set(held)) > 1:
                return _experts_problem(at, part, prefix, held)
    return None


def _holding(packed: Packed, runs: Runs) -> str:
    """What of each part ``runs`` hold: ``gate 0-31, up 0-31``; ``no gate`` (the first
    few parts, the runs and the parts walked together)."""
    out = []
    k = 0
    for part, start, stop in packed.spans():
        while k < len(runs) and runs[k].stop <= start:
            k += 1  # runs before this part hold none of the later ones either
        mine = []
        j = k
        while j < len(runs) and runs[j].start < stop:
            mine.append(range(max(runs[j].start, start) - start, min(runs[j].stop, stop) - start))
            j += 1
        shown = clip(", ".join(ranks_str(r) for r in mine))
        out.append(f"{part.name} {shown}" if mine else f"no {part.name}")
    return some_of(out)


def _blame(at: _Dim, prefix: Chain) -> tuple[str, int, str, str]:
    """The axis blamed (the prefix's last), its size, its placement in DSL, and
    ``S(0) on axis 'tp' (8 ranks)``."""
    axis, size, _ = prefix[-1]
    shown = format_placement(at.layout.placement_on(axis))
    return axis, size, shown, f"{shown} on axis {axis!r} ({size} ranks)"


def _global_ranks(at: _Dim, prefix: Chain, indices: Iterable[int]) -> tuple[int, ...]:
    """Every global rank whose row-major index on the axes of ``prefix`` is one of
    ``indices``."""
    wanted = set(indices)
    return tuple(
        r for r, i in enumerate(index_vector(at.mesh, [a for a, _, _ in prefix])) if i in wanted
    )


def _packed_problem(
    at: _Dim, prefix: Chain, mixed: set[int], cut: _Segments | _Strided
) -> StructureProblem:
    layout, dim, packed, _ = at
    axis, _, shown, where = _blame(at, prefix)
    ranks = _global_ranks(at, prefix, mixed)
    examples = [
        f"rank {_global_ranks(at, prefix, [i])[0]} holds {_holding(packed, cut.runs(i))}"
        for i in sorted(mixed)[:2]
    ]
    k = len(packed.parts)
    if packed.equal_parts:
        fix = (
            f"place _S({dim}, {k}) on {axis!r}, which splits each of the {k} equal "
            "parts on its own (what transformers' packed_colwise does)"
        )
    else:
        fix = (
            f"no placement does that for parts of unequal length: split the module into "
            f"one weight per part, or replicate dim {dim} on {axis!r}"
        )
    msg = (
        f"{where} of {layout} shards dim {dim} {clip(str(packed))} as one block, not part by part "
        f"({'; '.join(examples)}), on {ranks_text(ranks)}: each part must be sharded on "
        f"its own; {fix}"
    )
    return StructureProblem("packed-contiguous", msg, ranks, axis, shown)


def _divisors(n: int) -> str:
    """The divisors of ``n`` for a message: ``1, 2 or 4`` (a few, when many)."""
    found = [d for d in range(1, min(n, 64) + 1) if n % d == 0]
    if n > 64:
        found.append(n)
    shown = [str(d) for d in found[:6]] + (["..."] if len(found) > 6 else [])
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]


def _cut_problem(
    at: _Dim, part: Part, prefix: Chain, cuts: dict[int, set[int]]
) -> StructureProblem:
    layout, dim, packed, _ = at
    axis, size, shown, where = _blame(at, prefix)
    ranks = _global_ranks(at, prefix, cuts)
    bounds = sorted({b for found in cuts.values() for b in found})
    how = ""
    if len(prefix) == 1 and prefix[0][2] == 1:  # one contiguous Shard: say how torch chunks
        chunk = -(-packed.length // size)
        how = (
            f"torch chunks its {packed.length} rows {chunk} to a shard "
            f"(ceil({packed.length} / {size})), so "
        )
    msg = (
        f"{where} of {layout} cuts the units of {part.name} ({part.count} units of "
        f"{part.size}) in dim {dim} {clip(str(packed))}: {how}shard boundaries fall inside "
        f"a unit at row{'s' if len(bounds) != 1 else ''} {some_of(list(map(str, bounds)))}, "
        f"on {ranks_text(ranks)}; make the size of {axis!r} divide {part.count} "
        f"({_divisors(part.count)}), or replicate dim {dim} on {axis!r}"
    )
    return StructureProblem("cuts-unit", msg, ranks, axis, shown)


def _experts_problem(at: _Dim, part: Part, prefix: Chain, held: list[int]) -> StructureProblem:
    layout, dim, _, _ = at
    axis, _, shown, where = _blame(at, prefix)
    most = max(held)
    ranks = _global_ranks(at, prefix, [i for i, n in enumerate(held) if n < most])
    per = ", ".join(str(n) for n in held[:8]) + (", ..." if len(held) > 8 else "")
    shards = len(held)
    why = (
        f"more shards ({shards}) than experts ({part.count})"
        if shards > part.count
        else f"{part.count} experts do not divide by {shards} shards"
    )
    msg = (
        f"{where} of {layout} splits the {part.count} experts of dim {dim} unevenly "
        f"({why}): {per} experts per shard, so {ranks_text(ranks)} hold fewer; make the "
        f"size of {axis!r} divide {part.count} ({_divisors(part.count)})"
    )
    return StructureProblem("experts", msg, ranks, axis, shown)
