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

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from layout_algebra._ranks import Chain, chain_of, index_vector, source_runs
from layout_algebra._shards import Runs
from layout_algebra._text import ranks_str, ranks_text, some_of
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


def _within(runs: Runs, start: int, stop: int) -> list[range]:
    """The runs cut to ``[start, stop)``, counted from ``start``."""
    out = []
    for run in runs:
        lo, hi = max(run.start, start), min(run.stop, stop)
        if lo < hi:
            out.append(range(lo - start, hi - start))
    return out


def _contiguous(chain: Chain) -> Chain:
    """``chain`` with every axis a contiguous ``Shard``: a part sharded on its own."""
    return tuple((axis, size, 1) for axis, size, _ in chain)


def _check_dim(at: _Dim, chain: Chain) -> StructureProblem | None:
    """The problem of ``dim``, if any: packed-contiguous before cuts-unit before
    experts, each blamed on the first axis (in layout order) whose sharding, with the
    axes before it, already shows it. Indices are row-major over the chain's axes."""
    packed = at.packed
    prefixes = [
        (chain[:n], source_runs(packed.length, chain[:n])) for n in range(1, len(chain) + 1)
    ]
    if len(packed.parts) > 1:
        for prefix, rows in prefixes:
            alone = {
                part.name: source_runs(part.length, _contiguous(prefix)) for part in packed.parts
            }
            mixed = {
                i: runs
                for i, runs in enumerate(rows)
                if any(
                    _within(runs, start, stop) != list(alone[part.name][i])
                    for part, start, stop in packed.spans()
                )
            }
            if mixed:
                return _packed_problem(at, prefix, mixed)
    for prefix, rows in prefixes:
        for part, start, stop in packed.spans():
            cuts: dict[int, list[int]] = {}
            for i, runs in enumerate(rows):
                ends = {e for r in _within(runs, start, stop) for e in (r.start, r.stop)}
                inside = sorted(e for e in ends if e % part.size)
                if inside:
                    cuts[i] = [start + e for e in inside]
            if cuts:
                return _cut_problem(at, part, prefix, cuts)
    for prefix, rows in prefixes:
        for part, start, stop in packed.spans():
            if part.name != EXPERTS:
                continue
            held = [sum(map(len, _within(runs, start, stop))) // part.size for runs in rows]
            if len(set(held)) > 1:
                return _experts_problem(at, part, prefix, held)
    return None


def _holding(packed: Packed, runs: Runs) -> str:
    """What of each part ``runs`` hold: ``gate 0-31, up 0-31``; ``no gate``."""
    out = []
    for part, start, stop in packed.spans():
        mine = _within(runs, start, stop)
        shown = ", ".join(ranks_str(r) for r in mine)
        out.append(f"{part.name} {shown}" if mine else f"no {part.name}")
    return ", ".join(out)


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


def _packed_problem(at: _Dim, prefix: Chain, mixed: dict[int, Runs]) -> StructureProblem:
    layout, dim, packed, _ = at
    axis, _, shown, where = _blame(at, prefix)
    ranks = _global_ranks(at, prefix, mixed)
    examples = [
        f"rank {_global_ranks(at, prefix, [i])[0]} holds {_holding(packed, runs)}"
        for i, runs in list(mixed.items())[:2]
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
        f"{where} of {layout} shards dim {dim} {packed} as one block, not part by part "
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
    at: _Dim, part: Part, prefix: Chain, cuts: dict[int, list[int]]
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
        f"{part.size}) in dim {dim} {packed}: {how}shard boundaries fall inside a unit at "
        f"row{'s' if len(bounds) != 1 else ''} {some_of(list(map(str, bounds)))}, "
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
