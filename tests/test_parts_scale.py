"""Parts at scale: ``reshard_plan(parts=...)`` per signature, and the lint of many parts.

The reads of a part pattern are worked out one dim at a time per index on the loaded
layout's chains, each finding its saved rows by bisection; here they are checked against a
brute force that follows every destination rank and every saved chunk as DCP writes them
(``local_runs`` rank by rank, chunks keyed by their first rows), and the work is counted
at two world sizes, so that it is seen to grow with the world, not with its square.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Final

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from layout_algebra import (
    Mesh,
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_table,
    local_runs,
)
from layout_algebra._parts import DestRows, PartGeometry, PartPlanner, SavedRows
from layout_algebra.checkpoint import ReshardPlan, reshard_plan
from layout_algebra.mesh import coordinates

S0, S1, R = Shard(0), Shard(1), Replicate()

Overlap = tuple[int, int, int, int, int]
BruteRead = tuple[
    str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]
]


def on(sizes: Mapping[str, int], *placements: Shard | Replicate | StridedShard) -> SourceLayout:
    return SourceLayout("dense", list(sizes), placements)


# ---------------------------------------------------------------------------------------
# the brute force: every rank, every saved chunk


def _rows(runs: tuple[range, ...]) -> list[tuple[int, int, int]]:
    """``(start, length, position)`` of each run, in local order."""
    out, at = [], 0
    for r in runs:
        if len(r):
            out.append((r.start, len(r), at))
            at += len(r)
    return out


def _chunks(
    layout: SourceLayout, shape: tuple[int, ...], mesh: Mesh
) -> list[tuple[tuple[int, ...], tuple[int, ...], list[list[tuple[int, int, int]]]]]:
    """Every chunk DCP writes: its offsets (each dim's first row held, or the dim's size),
    sizes, and the rows its storage holds per dim; the first rank of each offset kept."""
    kept: dict[tuple[int, ...], tuple[tuple[int, ...], list[list[tuple[int, int, int]]]]] = {}
    for where in coordinates(mesh):
        runs = local_runs(shape, layout, mesh, where)
        rows = [_rows(r) for r in runs]
        offsets = tuple(r[0][0] if r else n for r, n in zip(rows, shape, strict=True))
        sizes = tuple(sum(x[1] for x in r) for r in rows)
        kept.setdefault(offsets, (sizes, rows))
    return [(o, s, rows) for o, (s, rows) in kept.items()]


def _dim_reads(
    dest: list[tuple[int, int, int]],
    saved: list[tuple[int, int, int]],
    window: tuple[int, int, int],
    box: tuple[int, int],
) -> list[Overlap]:
    lo, hi, shift = window
    out = []
    for start, length, at in dest:
        begin, end = max(start, lo), min(start + length, hi)
        for s, sl, spos in saved:
            a, b = max(begin + shift, s), min(end + shift, s + sl)
            if begin < end and a < b:
                out.append((box[0], box[1], spos + a - s, at + a - shift - start, b - a))
    return out


def brute_reads(
    dst: tuple[SourceLayout, Mesh, tuple[int, ...]],
    sources: Sequence[tuple[str, SourceLayout, Mesh, tuple[int, ...], tuple[int, int, int]]],
    dim: int,
    rank: int,
) -> list[BruteRead]:
    """Destination rank ``rank``'s reads from ``sources`` (FQN, layout, mesh, shape and
    ``(lo, hi, shift)`` on the packed ``dim``), each source's by its chunks' boxes."""
    layout, mesh, shape = dst
    where = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
    dest = [_rows(r) for r in local_runs(shape, layout, mesh, where)]
    out: list[BruteRead] = []
    for fqn, saved_layout, saved_mesh, saved_shape, window in sources:
        found: list[tuple[Overlap, ...]] = []
        for offsets, sizes, rows in _chunks(saved_layout, saved_shape, saved_mesh):
            per_dim = [
                _dim_reads(
                    dest[d],
                    rows[d],
                    window if d == dim else (0, shape[d], 0),
                    (offsets[d], sizes[d]),
                )
                for d in range(len(shape))
            ]
            found.extend(itertools.product(*per_dim))
        for box in sorted(found):
            out.append(
                (
                    fqn,
                    tuple(b[0] for b in box),
                    tuple(b[1] for b in box),
                    tuple(b[3] for b in box),
                    tuple(b[2] for b in box),
                    tuple(b[4] for b in box),
                )
            )
    return out


def planned_reads(plan: ReshardPlan, fqn: str, rank: int) -> list[BruteRead]:
    return [
        (r.fqn, r.chunk.offsets, r.chunk.sizes, r.dest_offsets, r.storage_offsets, r.lengths)
        for r in plan.reads(rank)
        if (r.dest_fqn or r.fqn) == fqn
    ]


# ---------------------------------------------------------------------------------------
# the planned reads are the brute force's, rank by rank

PLACEMENTS: Final[list[Shard | Replicate | StridedShard]] = [
    S0,
    S1,
    R,
    StridedShard(0, split_factor=2),
    StridedShard(0, split_factor=3),
]


@st.composite
def cases(
    draw: st.DrawFn,
) -> tuple[Packed, int, Mesh, Mesh, list[SourceLayout], SourceLayout, bool]:
    """Parts, columns, the saving and loading meshes, a saved layout per source (one for
    the fused tensor, else one per part), the loaded layout, and whether the fused tensor
    is the one saved."""
    count = draw(st.integers(2, 3))
    packed = Packed(
        [Part(f"p{i}", draw(st.integers(1, 4)), draw(st.integers(1, 2))) for i in range(count)]
    )
    cols = draw(st.integers(1, 4))
    src = Mesh({"a": draw(st.integers(1, 3)), "b": draw(st.integers(1, 3))})
    dst = Mesh({"c": draw(st.integers(1, 4)), "d": draw(st.integers(1, 2))})
    split = draw(st.booleans())
    saved_mesh, loaded_mesh = (src, dst)

    def pick(mesh: Mesh) -> SourceLayout:
        return on(mesh, *(draw(st.sampled_from(PLACEMENTS)) for _ in mesh.names))

    saved = [pick(saved_mesh)] if split else [pick(saved_mesh) for _ in range(count)]
    return packed, cols, saved_mesh, loaded_mesh, saved, pick(loaded_mesh), split


@settings(max_examples=150)
@given(cases())
def test_part_reads_are_the_brute_forces_on_every_rank(
    case: tuple[Packed, int, Mesh, Mesh, list[SourceLayout], SourceLayout, bool],
) -> None:
    packed, cols, src_mesh, dst_mesh, saved, loaded, split = case
    fused_shape = (packed.length, cols)
    names = {part.name: f"{part.name}.weight" for part in packed.parts}
    shapes: dict[str, ParamShape] = {
        "fused.weight": ParamShape(fused_shape, "float32", structure={0: packed})
    }
    spans = {part.name: (start, stop) for part, start, stop in packed.spans()}
    for part in packed.parts:
        shapes[names[part.name]] = ParamShape((part.length, cols), "float32")
    if split:
        src = ParamLayoutTable({"fused.weight": saved[0]})
        dst = ParamLayoutTable({fqn: loaded for fqn in names.values()})
    else:
        src = ParamLayoutTable(dict(zip(names.values(), saved, strict=True)))
        dst = ParamLayoutTable({"fused.weight": loaded})
    plan = reshard_plan(
        src,
        dst,
        shapes,
        src_sizes={"dense": src_mesh},
        dst_sizes={"dense": dst_mesh},
        parts={"fused.weight": names},
    )
    for rank in range(dst_mesh.size):
        expected: dict[str, list[BruteRead]] = {}
        if split:
            for name, fqn in names.items():
                lo, hi = spans[name]
                source = ("fused.weight", saved[0], src_mesh, fused_shape, (0, hi - lo, lo))
                expected[fqn] = brute_reads(
                    (loaded, dst_mesh, shapes[fqn].shape), [source], 0, rank
                )
        else:
            sources = [
                (fqn, layout, src_mesh, shapes[fqn].shape, (*spans[name], -spans[name][0]))
                for (name, fqn), layout in zip(names.items(), saved, strict=True)
            ]
            expected["fused.weight"] = brute_reads(
                (loaded, dst_mesh, fused_shape), sources, 0, rank
            )
        nbytes = 0
        for fqn, reads in expected.items():
            assert planned_reads(plan, fqn, rank) == reads, (fqn, rank)
            nbytes += 4 * sum(_numel(r[5]) for r in reads)
        assert plan.bytes_read[rank] == nbytes
    for fqn in dst:
        every = sum(len(planned_reads(plan, fqn, r)) for r in range(dst_mesh.size))
        assert plan.chunks_read(fqn) == every


def _numel(lengths: tuple[int, ...]) -> int:
    n = 1
    for x in lengths:
        n *= x
    return n


# ---------------------------------------------------------------------------------------
# work: per signature, and growing with the world, not its square

FUSED: Final = "gate_up_proj.weight"
PARTS: Final = {"gate": "gate_proj.weight", "up": "up_proj.weight"}


def _layered(
    layers: int, rows: int, cols: int
) -> tuple[ParamLayoutTable, ParamLayoutTable, dict[str, ParamShape], dict[str, dict[str, str]]]:
    """``layers`` fused gate_up weights saved (rows over ``tp`` and FSDP), loaded unfused."""
    tp = SourceLayout("dense", ["tp"], [S0])
    saved: dict[str, SourceLayout] = {}
    loaded: dict[str, SourceLayout] = {}
    shapes: dict[str, ParamShape] = {}
    parts: dict[str, dict[str, str]] = {}
    whole = Packed([Part("gate", rows), Part("up", rows)])
    for i in range(layers):
        fused = f"layers.{i}.{FUSED}"
        saved[fused] = tp
        shapes[fused] = ParamShape((2 * rows, cols), "bfloat16", structure={0: whole})
        parts[fused] = {}
        for name, fqn in PARTS.items():
            loaded[f"layers.{i}.{fqn}"] = tp
            shapes[f"layers.{i}.{fqn}"] = ParamShape((rows, cols), "bfloat16")
            parts[fused][name] = f"layers.{i}.{fqn}"
    return ParamLayoutTable(saved), ParamLayoutTable(loaded), shapes, parts


def _sizes(world: int, tp: int) -> dict[str, dict[str, int]]:
    return {"dense": {"dp_shard": world // tp, "tp": tp}}


def _plan(world: tuple[int, int], layers: int = 1) -> ReshardPlan:
    src, dst, shapes, parts = _layered(layers, 4096, 256)
    return reshard_plan(
        src,
        dst,
        shapes,
        src_sizes=_sizes(world[0], 8),
        dst_sizes=_sizes(world[1], 16),
        fsdp={"dense": "dp_shard"},
        parts=parts,
    )


def test_the_work_grows_with_the_world_not_its_square(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each destination run is searched for once per source (a bisection), and planning
    lists no rank's reads: the searches grow as the world does."""
    searched: list[int] = []
    listed: list[int] = []
    count_all, pieces_at = SavedRows.count_all, PartGeometry.pieces_at

    def counting(self: SavedRows, begins: Sequence[int], ends: Sequence[int]) -> object:
        searched.append(len(begins))
        return count_all(self, begins, ends)

    def listing(self: PartGeometry, indices: Sequence[int]) -> object:
        listed.append(1)
        return pieces_at(self, indices)

    monkeypatch.setattr(SavedRows, "count_all", counting)
    monkeypatch.setattr(PartGeometry, "pieces_at", listing)
    work = []
    for world in (256, 1024):
        searched.clear()
        _plan((world, world))
        work.append(sum(searched))
    assert listed == []
    small, large = work
    assert 0 < large <= 4 * small + 64, work  # the square would be 16 times


def test_equal_signatures_are_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[int] = []
    made: list[int] = []
    geometry, dest_of = PartPlanner._geometry, DestRows.of

    def counting(self: PartPlanner, *args: object, **kwargs: object) -> PartGeometry:
        planned.append(1)
        return geometry(self, *args, **kwargs)  # type: ignore[arg-type]  # passed through

    def making(n: int, chain: object) -> DestRows:
        made.append(1)
        return dest_of(n, chain)  # type: ignore[arg-type]  # passed through

    monkeypatch.setattr(PartPlanner, "_geometry", counting)
    monkeypatch.setattr(DestRows, "of", making)
    plan = _plan((64, 64), layers=12)
    assert len(planned) == 2  # gate and up: one signature each, for all 12 layers
    assert len(made) == 2  # the loaded dims: rows over dp_shard and tp, columns whole
    one = _plan((64, 64))
    assert plan.bytes_read == tuple(12 * b for b in one.bytes_read)
    assert plan.chunks_read("layers.11.up_proj.weight") == one.chunks_read(
        "layers.0.up_proj.weight"
    )


def test_sixteen_thousand_ranks_read_what_they_hold() -> None:
    """Loading the parts from their fused tensor, each rank reads its own shards: the
    bytes of the plan that loads them from an unfused checkpoint."""
    plan = _plan((16_384, 16_384), layers=2)
    _, dst, shapes, _ = _layered(2, 4096, 256)
    plain = reshard_plan(
        compose_table(dst, fsdp={"dense": "dp_shard"}, mesh_sizes=_sizes(16_384, 8)),
        compose_table(dst, fsdp={"dense": "dp_shard"}, mesh_sizes=_sizes(16_384, 16)),
        shapes,
        src_sizes=_sizes(16_384, 8),
        dst_sizes=_sizes(16_384, 16),
    )
    assert plan.bytes_read == plain.bytes_read
    rank = 12_345
    assert sum(r.numel for r in plan.reads(rank)) * 2 == plan.bytes_read[rank]
