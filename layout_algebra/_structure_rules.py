"""The lint's rules inside a dim: shards that cut a unit, packed dims sharded as one
block, experts the shards cannot split.

Only source axes count: FSDP's own axes never compute on their shards (they all-gather
before use), so a composed layout's owned axes are set aside. The rows each rank holds
along a structured dim are those DTensor gives it (``geometry.local_runs``, torch.chunk
semantics), over the source axes that shard the dim, in the layout's order.

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

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple, TypeAlias

from layout_algebra.axes import FSDP_OWNED_AXES
from layout_algebra.geometry import Runs, local_runs
from layout_algebra.layout import SourceLayout
from layout_algebra.placements import Placement, Shard, StridedShard, format_placement
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import EXPERTS, Packed, Part

__all__ = ["StructureProblem", "structure_problems"]

_SHOWN: Final = 4
"""How many ranks, boundaries or holdings a message spells out."""


class StructureProblem(NamedTuple):
    """One finding of the rules, FQN-free: the lint prefixes the parameter's FQN."""

    kind: str
    message: str
    ranks: tuple[int, ...]
    axis: str | None
    placement: str | None


class _Axis(NamedTuple):
    name: str
    placement: Placement
    size: int


class _Dim(NamedTuple):
    """One structured dim of one parameter under one layout, for the messages."""

    layout: SourceLayout
    dim: int
    packed: Packed
    sizes: Mapping[str, int]


def structure_problems(
    layout: SourceLayout,
    shape: ParamShape,
    mesh_sizes: Mapping[str, int],
    *,
    owned: Iterable[str] = FSDP_OWNED_AXES,
) -> tuple[StructureProblem, ...]:
    """What ``layout`` breaks inside the structured dims of ``shape``: at most one
    problem per dim, of kind ``"packed-contiguous"``, ``"cuts-unit"`` or ``"experts"``.

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
    """
    if not shape.structure or any(a.name not in mesh_sizes for a in layout.axes):
        return ()
    owned_names = frozenset(owned)
    out: list[StructureProblem] = []
    for dim, packed in shape.structure.items():
        axes = [
            _Axis(a.name, p, mesh_sizes[a.name])
            for a, p in zip(layout.axes, layout.placements, strict=True)
            if a.name not in owned_names
            and isinstance(p, Shard | StridedShard)
            and p.dim == dim
            and mesh_sizes[a.name] > 1
        ]
        if axes and dim < shape.ndim:
            found = _check_dim(_Dim(layout, dim, packed, mesh_sizes), axes)
            if found is not None:
                out.append(found)
    return tuple(out)


def _runs(packed: Packed, axes: Sequence[_Axis], where: Sequence[int]) -> Runs:
    """The rows of the dim the rank at ``where`` (an index per axis of ``axes``) holds."""
    sub = SourceLayout(
        "dim",
        [a.name for a in axes],
        [_on_dim0(a.placement) for a in axes],
    )
    sizes = {a.name: a.size for a in axes}
    coordinate = {a.name: i for a, i in zip(axes, where, strict=True)}
    return local_runs((packed.length,), sub, sizes, coordinate)[0]


def _on_dim0(p: Placement) -> Placement:
    if isinstance(p, StridedShard):
        return StridedShard(0, split_factor=p.split_factor)
    return Shard(0)


def _coordinates(axes: Sequence[_Axis]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(a.size) for a in axes)))


def _within(runs: Runs, start: int, stop: int) -> list[range]:
    """The runs cut to ``[start, stop)``, counted from ``start``."""
    out = []
    for run in runs:
        lo, hi = max(run.start, start), min(run.stop, stop)
        if lo < hi:
            out.append(range(lo - start, hi - start))
    return out


def _alone(part: Part, axes: Sequence[_Axis], where: Sequence[int]) -> list[range]:
    """The rows of ``part`` a rank would hold were the part sharded on its own: each axis
    a contiguous ``Shard`` of what the axes before it left."""
    plain = [_Axis(a.name, Shard(0), a.size) for a in axes]
    return list(_runs(Packed([part]), plain, where))


_Rows: TypeAlias = dict[tuple[int, ...], Runs]
"""The rows of a dim each coordinate (an index per sharding axis) holds."""


def _rows(packed: Packed, axes: Sequence[_Axis]) -> _Rows:
    return {where: _runs(packed, axes, where) for where in _coordinates(axes)}


def _check_dim(at: _Dim, axes: list[_Axis]) -> StructureProblem | None:
    """The problem of ``dim``, if any: packed-contiguous before cuts-unit before
    experts, each blamed on the first axis (in layout order) whose sharding, with the
    axes before it, already shows it."""
    packed = at.packed
    prefixes = [(axes[:n], _rows(packed, axes[:n])) for n in range(1, len(axes) + 1)]
    if len(packed.parts) > 1:
        for prefix, rows in prefixes:
            mixed = {
                where: runs
                for where, runs in rows.items()
                if any(
                    _within(runs, start, stop) != _alone(part, prefix, where)
                    for part, start, stop in packed.spans()
                )
            }
            if mixed:
                return _packed_problem(at, prefix, mixed)
    for prefix, rows in prefixes:
        for part, start, stop in packed.spans():
            cuts: dict[tuple[int, ...], list[int]] = {}
            for where, runs in rows.items():
                inside = sorted(
                    {e for r in _within(runs, start, stop) for e in (r.start, r.stop)}
                    - set(range(0, part.length + 1, part.size))
                )
                if inside:
                    cuts[where] = [start + e for e in inside]
            if cuts:
                return _cut_problem(at, part, prefix, cuts)
    for prefix, rows in prefixes:
        for part, start, stop in packed.spans():
            if part.name != EXPERTS:
                continue
            held = {
                where: sum(map(len, _within(runs, start, stop))) // part.size
                for where, runs in rows.items()
            }
            if len(set(held.values())) > 1:
                return _experts_problem(at, part, prefix, held)
    return None


def _span_text(runs: Sequence[range]) -> str:
    return ", ".join(str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}" for r in runs)


def _holding(packed: Packed, runs: Runs) -> str:
    """What of each part ``runs`` hold: ``gate 0-31, up 0-31``; ``no gate``."""
    out = []
    for part, start, stop in packed.spans():
        mine = _within(runs, start, stop)
        out.append(f"{part.name} {_span_text(mine)}" if mine else f"no {part.name}")
    return ", ".join(out)


def _blame(prefix: Sequence[_Axis]) -> tuple[_Axis, str, str]:
    """The axis blamed (the prefix's last), its placement in DSL, and ``on axis 'tp'
    (8 ranks)``."""
    axis = prefix[-1]
    shown = format_placement(axis.placement)
    return axis, shown, f"{shown} on axis {axis.name!r} ({axis.size} ranks)"


def _packed_problem(at: _Dim, prefix: Sequence[_Axis], mixed: _Rows) -> StructureProblem:
    layout, dim, packed, sizes = at
    axis, shown, where = _blame(prefix)
    ranks = _global_ranks(sizes, prefix, mixed)
    examples = []
    for coordinate, runs in list(mixed.items())[:2]:
        rank = _global_ranks(sizes, prefix, [coordinate])[0]
        examples.append(f"rank {rank} holds {_holding(packed, runs)}")
    k = len(packed.parts)
    if packed.equal_parts:
        fix = (
            f"place _S({dim}, {k}) on {axis.name!r}, which splits each of the {k} equal "
            "parts on its own (what transformers' packed_colwise does)"
        )
    else:
        fix = (
            f"no placement does that for parts of unequal length: split the module into "
            f"one weight per part, or replicate dim {dim} on {axis.name!r}"
        )
    msg = (
        f"{where} of {layout} shards dim {dim} {packed} as one block, not part by part "
        f"({'; '.join(examples)}), on {_ranks_text(ranks)}: each part must be sharded on "
        f"its own; {fix}"
    )
    return StructureProblem("packed-contiguous", msg, ranks, axis.name, shown)


def _divisors(n: int) -> str:
    """The divisors of ``n`` for a message: ``1, 2 or 4`` (a few, when many)."""
    found = [d for d in range(1, min(n, 64) + 1) if n % d == 0]
    if n > 64:
        found.append(n)
    shown = [str(d) for d in found[:6]] + (["..."] if len(found) > 6 else [])
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]


def _cut_problem(
    at: _Dim, part: Part, prefix: Sequence[_Axis], cuts: dict[tuple[int, ...], list[int]]
) -> StructureProblem:
    layout, dim, packed, sizes = at
    axis, shown, where = _blame(prefix)
    ranks = _global_ranks(sizes, prefix, cuts)
    bounds = sorted({b for found in cuts.values() for b in found})
    more = f" and {len(bounds) - _SHOWN} more" if len(bounds) > _SHOWN else ""
    how = ""
    if len(prefix) == 1 and isinstance(axis.placement, Shard):
        chunk = -(-packed.length // axis.size)
        how = (
            f"torch chunks its {packed.length} rows {chunk} to a shard "
            f"(ceil({packed.length} / {axis.size})), so "
        )
    msg = (
        f"{where} of {layout} cuts the units of {part.name} ({part.count} units of "
        f"{part.size}) in dim {dim} {packed}: {how}shard boundaries fall inside a unit at "
        f"row{'s' if len(bounds) != 1 else ''} {', '.join(map(str, bounds[:_SHOWN]))}{more}, "
        f"on {_ranks_text(ranks)}; make the size of {axis.name!r} divide {part.count} "
        f"({_divisors(part.count)}), or replicate dim {dim} on {axis.name!r}"
    )
    return StructureProblem("cuts-unit", msg, ranks, axis.name, shown)


def _experts_problem(
    at: _Dim, part: Part, prefix: Sequence[_Axis], held: dict[tuple[int, ...], int]
) -> StructureProblem:
    layout, dim, _, sizes = at
    axis, shown, where = _blame(prefix)
    most = max(held.values())
    ranks = _global_ranks(sizes, prefix, [w for w, n in held.items() if n < most])
    per = ", ".join(str(n) for n in list(held.values())[:8]) + (", ..." if len(held) > 8 else "")
    shards = len(held)
    why = (
        f"more shards ({shards}) than experts ({part.count})"
        if shards > part.count
        else f"{part.count} experts do not divide by {shards} shards"
    )
    msg = (
        f"{where} of {layout} splits the {part.count} experts of dim {dim} unevenly "
        f"({why}): {per} experts per shard, so {_ranks_text(ranks)} hold fewer; make the "
        f"size of {axis.name!r} divide {part.count} ({_divisors(part.count)})"
    )
    return StructureProblem("experts", msg, ranks, axis.name, shown)


def _global_ranks(
    sizes: Mapping[str, int], axes: Sequence[_Axis], coordinates: Iterable[tuple[int, ...]]
) -> tuple[int, ...]:
    """Every global rank (row-major over ``sizes``) whose index on ``axes`` is one of
    ``coordinates``."""
    wanted = set(coordinates)
    names = list(sizes)
    at = [names.index(a.name) for a in axes]
    out = []
    for rank, index in enumerate(itertools.product(*(range(n) for n in sizes.values()))):
        if tuple(index[i] for i in at) in wanted:
            out.append(rank)
    return tuple(out)


def _ranks_text(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:_SHOWN]))
    more = f" and {len(ranks) - _SHOWN} more" if len(ranks) > _SHOWN else ""
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{more}"
