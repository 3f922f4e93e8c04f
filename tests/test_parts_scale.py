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
from typing import Any, Final

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
    lint,
    local_runs,
)
from layout_algebra._parts import DestRows, PartGeometry, PartPlanner, SavedRows
from layout_algebra._ranks import chain_of, index_vector, source_runs
from layout_algebra._shards import chunk_bounds, strided_chunks
from layout_algebra._structure_rules import _Segments, _Strided, structure_problems
from layout_algebra._text import some_of
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


# ---------------------------------------------------------------------------------------
# the lint of many parts: per part and per run of rows, never per part per rank


def _brute_problem(
    packed: Packed, chain: tuple[tuple[str, int, int], ...], mesh: Mesh
) -> tuple[str, str, tuple[int, ...], tuple[int, ...]] | None:
    """The rules of ``structure_problems`` on one dim, rank by rank and part by part:
    ``(kind, axis, ranks, rows)``, ``rows`` the boundaries that cut a unit."""

    def within(runs: tuple[range, ...], start: int, stop: int) -> list[range]:
        cut = [range(max(r.start, start) - start, min(r.stop, stop) - start) for r in runs]
        return [r for r in cut if len(r)]

    def ranks(prefix: tuple[tuple[str, int, int], ...], indices: set[int]) -> tuple[int, ...]:
        vector = index_vector(mesh, [a for a, _, _ in prefix])
        return tuple(r for r, i in enumerate(vector) if i in indices)

    spans = list(packed.spans())
    prefixes = [chain[:n] for n in range(1, len(chain) + 1)]
    if len(packed.parts) > 1:
        for prefix in prefixes:
            rows = source_runs(packed.length, prefix)
            alone = {
                part.name: source_runs(part.length, tuple((a, s, 1) for a, s, _ in prefix))
                for part in packed.parts
            }
            mixed = {
                i
                for i, runs in enumerate(rows)
                for part, start, stop in spans
                if within(runs, start, stop) != list(alone[part.name][i])
            }
            if mixed:
                return "packed-contiguous", prefix[-1][0], ranks(prefix, mixed), ()
    for prefix in prefixes:
        rows = source_runs(packed.length, prefix)
        for part, start, stop in spans:
            cuts = {
                (i, start + e)
                for i, runs in enumerate(rows)
                for r in within(runs, start, stop)
                for e in (r.start, r.stop)
                if e % part.size
            }
            if cuts:
                bounds = tuple(sorted({b for _, b in cuts}))
                return "cuts-unit", prefix[-1][0], ranks(prefix, {i for i, _ in cuts}), bounds
    for prefix in prefixes:
        rows = source_runs(packed.length, prefix)
        for part, start, stop in spans:
            if part.name == "experts":
                held = [sum(map(len, within(r, start, stop))) // part.size for r in rows]
                if len(set(held)) > 1:
                    fewer = {i for i, n in enumerate(held) if n < max(held)}
                    return "experts", prefix[-1][0], ranks(prefix, fewer), ()
    return None


@st.composite
def structured(draw: st.DrawFn) -> tuple[Packed, SourceLayout, Mesh]:
    """A packed dim 0 of a few parts (an ``experts`` one at times), and a layout sharding
    it over one or two axes of 2 to 4 ranks, ``Shard`` or ``StridedShard``."""
    count = draw(st.integers(1, 4))
    names = [f"p{i}" for i in range(count)]
    if draw(st.booleans()):
        names[draw(st.integers(0, count - 1))] = "experts"
    packed = Packed(
        [Part(name, draw(st.integers(1, 6)), draw(st.integers(1, 3))) for name in names]
    )
    mesh = Mesh({"a": draw(st.integers(2, 4)), "b": draw(st.integers(2, 4))})
    choices: list[Shard | Replicate | StridedShard] = [
        S0,
        R,
        StridedShard(0, split_factor=2),
        StridedShard(0, split_factor=max(count, 2)),
        StridedShard(0, split_factor=3),
    ]
    placements = [draw(st.sampled_from(choices)) for _ in mesh.names]
    return packed, SourceLayout("dense", list(mesh.names), placements), mesh


@settings(max_examples=300)
@given(structured())
def test_structure_rules_are_the_brute_forces(case: tuple[Packed, SourceLayout, Mesh]) -> None:
    packed, layout, mesh = case
    shape = ParamShape((packed.length, 3), "bfloat16", structure={0: packed})
    found = structure_problems(layout, shape, mesh)
    want = _brute_problem(packed, chain_of(layout, 0, mesh), mesh)
    if want is None:
        assert found == ()
        return
    (got,) = found
    kind, axis, ranks, bounds = want
    assert (got.kind, got.axis, got.ranks) == (kind, axis, ranks)
    if kind == "cuts-unit":
        shown = some_of([str(b) for b in bounds])
        assert f"inside a unit at row{'s' if len(bounds) != 1 else ''} {shown}," in got.message


def _many(parts: int, count: int, size: int) -> ParamShape:
    whole = Packed([Part(f"p{i}", count, size) for i in range(parts)])
    return ParamShape((whole.length, 64), "bfloat16", structure={0: whole})


def _rows_looked_at(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs the rules look at, part by part."""
    seen: list[int] = []
    for kind in (_Segments, _Strided):
        within = kind.within

        def counting(
            self: object, start: int, stop: int, within: Any = within
        ) -> list[tuple[int, int, int]]:
            got: list[tuple[int, int, int]] = within(self, start, stop)
            seen.append(len(got))
            return got

        monkeypatch.setattr(kind, "within", counting)
    return seen


@pytest.mark.parametrize("placement", [S0, StridedShard(0, split_factor=2000)])
def test_two_thousand_parts_cost_their_runs_not_parts_times_ranks(
    monkeypatch: pytest.MonkeyPatch, placement: Shard | StridedShard
) -> None:
    """2,000 parts of 1x8 (``S(0)`` takes them as one block; ``_S(0, 2000)`` cuts each
    8-row unit over the ranks): the runs looked at grow with the parts and the ranks,
    never as their product, and no rank is followed one by one."""
    seen = _rows_looked_at(monkeypatch)
    ranked: list[object] = []
    monkeypatch.setattr("layout_algebra._structure_rules.source_runs", ranked.append)
    layout = SourceLayout("dense", ["tp"], [placement])
    shape = _many(2000, 1, 8)
    looked = []
    for tp in (64, 512):
        seen.clear()
        (problem,) = structure_problems(layout, shape, {"tp": tp})
        looked.append(sum(seen) + len(seen))
        assert len(problem.message) < 1500  # the parts are named a few at a time
    assert ranked == []
    small, large = looked
    assert large <= small + 2 * (512 - 64) + 16, looked  # parts x ranks would be 8 times


def test_a_whole_piece_per_part_is_checked_by_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_S(0, 2000)`` on 2,000 equal parts over 512 ranks, each part 512 units: every part
    is one piece, sharded as it would be alone, boundaries every unit: no runs listed."""
    seen = _rows_looked_at(monkeypatch)
    layout = SourceLayout("dense", ["tp"], [StridedShard(0, split_factor=2000)])
    assert structure_problems(layout, _many(2000, 512, 1), {"tp": 512}) == ()
    assert seen == []
    # 512 units of 2 over 512 ranks: still no cut; of 3 rows over 256: each cut, one found
    assert structure_problems(layout, _many(2000, 512, 2), {"tp": 512}) == ()
    (problem,) = structure_problems(layout, _many(2000, 512, 3), {"tp": 1024})
    assert problem.kind == "cuts-unit" and len(seen) == 1


def _piece_by_piece(n: int, chunks: int, index: int, split: int) -> list[tuple[int, int]]:
    """``strided_chunks`` as its docstring says it: every piece chunked, the rank's chunk
    of each taken."""
    out = []
    for piece in range(split):
        lo, hi = chunk_bounds(n, split, piece)
        start, stop = chunk_bounds(hi - lo, chunks, index)
        if start < stop:
            out.append((lo + start, lo + stop))
    return out


def test_a_strided_rank_takes_its_chunk_of_every_piece() -> None:
    for n, chunks, split in itertools.product(range(40), range(1, 7), range(2, 45)):
        for index in range(chunks):
            assert strided_chunks(n, chunks, index, split) == _piece_by_piece(
                n, chunks, index, split
            ), (n, chunks, index, split)


def test_a_strided_rank_of_nothing_costs_nothing_per_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,000 pieces of 8 rows over 512 ranks: rank 300 holds none, found once for all the
    full pieces (and once for a tail) rather than per piece."""
    calls: list[int] = []

    def counting(n: int, chunks: int, index: int) -> tuple[int, int]:
        calls.append(1)
        return chunk_bounds(n, chunks, index)

    monkeypatch.setattr("layout_algebra._shards.chunk_bounds", counting)
    assert strided_chunks(16_000, 512, 300, 2000) == []
    assert len(calls) <= 3
    calls.clear()
    assert len(strided_chunks(16_000, 512, 3, 2000)) == 2000  # row 3 of each piece
    assert len(calls) <= 3


def test_a_message_shows_a_dim_of_thousands_of_parts_by_its_ends() -> None:
    """``str`` of a 2,000-part dim, and lint's messages naming it, stay a few hundred
    characters: the first parts, the last one and the count."""
    parts = [Part(f"p{i}", 1, 8) for i in range(2000)]
    shape = ParamShape((16_000, 4), "float32", structure={0: Packed(parts)})
    assert str(Packed(parts)).endswith("| ... | p1999: 1x8] (2,000 parts)")
    assert len(str(shape)) < 200
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    sizes = {"dense": {"dp_shard": 3, "tp": 7}}
    report = lint(table, {"w": shape}, mesh_sizes=sizes, fsdp={"dense": "dp_shard"})
    assert report.problems
    assert all(len(str(p)) < 1000 for p in (*report.problems, *report.notes))
    assert str(Packed(parts[:8])) == "[" + " | ".join(map(str, parts[:8])) + "]"
