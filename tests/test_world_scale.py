"""Per-rank answers grouped by signature equal a plain per-(tensor, rank) reference.

``lint``, ``dcp_chunks`` and ``reshard_plan`` compute each distinct (layout, shape) once
and spread it over the ranks by per-axis arithmetic. The reference here follows every
tensor on every global rank with the public geometry (``fsdp_storage_runs``,
``local_runs``, ``local_shape_and_offset``), on small random worlds with uneven shapes,
strided layouts and tied tensors. The checkpoint coverage certificate is tested on layouts
that cover each element once, and on chunk sets that cover some twice or not at all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from layout_algebra import (
    ParamLayoutTable,
    Placement,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_table,
)
from layout_algebra._ranks import cover_problem, read_dim
from layout_algebra.checkpoint import dcp_chunks, reshard_plan
from layout_algebra.fsdp import fsdp_storage_runs, split_fsdp
from layout_algebra.geometry import local_runs, local_shape_and_offset
from layout_algebra.lint import lint
from layout_algebra.mesh import Mesh
from layout_algebra.shapes import ParamShape
from layout_algebra.training import Training, training_cost

_SIZES = st.integers(1, 3)
_DTYPES = st.sampled_from(["float32", "bfloat16", "int8"])


@st.composite
def _worlds(draw: st.DrawFn) -> dict[str, dict[str, int]]:
    """A dense and an expert mesh over one world of at most 27 ranks."""
    dp, ep, tp = draw(_SIZES), draw(_SIZES), draw(_SIZES)
    return {
        "dense": {"dp_shard": dp * ep, "tp": tp},
        "expert": {"dp_shard": dp, "ep": ep, "tp": tp},
    }


@st.composite
def _source(draw: st.DrawFn, role: str, ndim: int) -> SourceLayout:
    axes = ["tp"] if role == "dense" else ["ep", "tp"]
    choices: list[Placement] = [Replicate(), *(Shard(d) for d in range(ndim))]
    placements = [draw(st.sampled_from(choices)) for _ in axes]
    return SourceLayout(role, axes, placements)


@st.composite
def _cases(
    draw: st.DrawFn,
) -> tuple[ParamLayoutTable, dict[str, ParamShape], dict[str, dict[str, int]], int]:
    """A source table (a tied pair among it, sometimes), shapes, sizes and FSDP's dim."""
    sizes = draw(_worlds())
    entries: dict[str, SourceLayout] = {}
    shapes: dict[str, ParamShape] = {}
    dim = draw(st.integers(0, 1))
    for i in range(draw(st.integers(1, 4))):
        ndim = draw(st.integers(dim + 1, 3))
        role = draw(st.sampled_from(["dense", "expert"]))
        entries[f"p{i}"] = draw(_source(role, ndim))
        shape = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
        shapes[f"p{i}"] = ParamShape(shape, draw(_DTYPES))
    tied: tuple[frozenset[str], ...] = ()
    if draw(st.booleans()):
        entries["alias"] = entries["p0"]
        tied = (frozenset({"p0", "alias"}),)  # the alias has no shape of its own
    return ParamLayoutTable(entries, tied=tied), shapes, sizes, dim


def _coordinates(sizes: Mapping[str, int]) -> list[dict[str, int]]:
    """Every global rank's coordinate, by rank (row-major)."""
    mesh = Mesh(sizes)
    return [dict(zip(mesh.names, mesh.coordinate(r), strict=True)) for r in range(mesh.size)]


def _numel(runs: tuple[tuple[range, ...], ...]) -> int:
    return math.prod(sum(map(len, r)) for r in runs)


def _reference(
    composed: ParamLayoutTable,
    shapes: Mapping[str, ParamShape],
    sizes: Mapping[str, Mapping[str, int]],
) -> tuple[list[int], dict[str, list[int]], list[int], set[tuple[str, str, tuple[int, ...]]]]:
    """Per (tensor, rank): bytes kept, by role, allocated, and storage/uneven ranks."""
    world = Mesh(next(iter(sizes.values()))).size
    total, padded = [0] * world, [0] * world
    by_role = {role: [0] * world for role in sizes}
    problems: set[tuple[str, str, tuple[int, ...]]] = set()
    aliases = {m for g in composed.tied for m in sorted(g)[1:]}
    for fqn, layout in composed.items():
        shape = shapes.get(fqn) or shapes["p0"]
        role_sizes = sizes[layout.mesh]
        parts = split_fsdp(layout, role_sizes)
        assert parts.shard is not None
        fsdp = role_sizes[parts.shard.name]
        differ, uneven = [], []
        for rank, where in enumerate(_coordinates(role_sizes)):
            kept = fsdp_storage_runs(shape.shape, layout, role_sizes, where)
            read = local_runs(shape.shape, layout, role_sizes, where)
            source = local_runs(shape.shape, parts.source, role_sizes, where)
            held = sum(map(len, source[parts.shard_dim]))
            rest = math.prod(sum(map(len, r)) for e, r in enumerate(source) if e != parts.shard_dim)
            if read != kept and (_numel(kept) or _numel(read)):
                differ.append(rank)
            if parts.shard_dim > 0 and held % fsdp:
                uneven.append(rank)
            if fqn in aliases:
                continue
            nbytes = _numel(kept) * shape.itemsize
            total[rank] += nbytes
            by_role[layout.mesh][rank] += nbytes
            padded[rank] += -(-held // fsdp) * rest * shape.itemsize
        if differ:
            problems.add((fqn, "storage", tuple(differ)))
        if uneven:
            problems.add((fqn, "fsdp-uneven", tuple(uneven)))
    return total, by_role, padded, problems


def _covers_once(layout: SourceLayout, shape: tuple[int, ...], sizes: Mapping[str, int]) -> bool:
    """Every element in exactly one saved box per replica, counted element by element."""
    sharding = [
        a.name for a, p in zip(layout.axes, layout.placements, strict=True) if p != Replicate()
    ]
    boxes = set()
    for index in itertools.product(*(range(sizes[a]) for a in sharding)):
        where = {a.name: 0 for a in layout.axes} | dict(zip(sharding, index, strict=True))
        local, offset = local_shape_and_offset(shape, layout, sizes, where)
        boxes.add((index, offset, local))
    for element in itertools.product(*(range(n) for n in shape)):
        inside = sum(
            all(o <= x < o + n for x, o, n in zip(element, offset, local, strict=True))
            for _, offset, local in boxes
        )
        if inside != 1:
            return False
    return True


@given(_cases())
def test_grouped_lint_equals_the_per_rank_reference(
    case: tuple[ParamLayoutTable, dict[str, ParamShape], dict[str, dict[str, int]], int],
) -> None:
    table, shapes, sizes, dim = case
    fsdp = {"dense": "dp_shard", "expert": "dp_shard"}
    report = lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp, shard_dim=dim)
    composed = compose_table(table, fsdp=fsdp, mesh_sizes=sizes, shard_dim=dim)
    total, by_role, padded, problems = _reference(composed, shapes, sizes)
    assert report.memory.bytes_per_rank == tuple(total)
    assert report.memory.padded_bytes_per_rank == tuple(padded)
    assert {r: list(v) for r, v in report.memory.by_role.items()} == by_role
    got = {(p.fqn, p.kind, p.ranks) for p in report.problems if p.kind != "coverage"}
    assert got == problems
    for c in report.coverage:
        assert c.exact == _covers_once(c.layout, c.shape.shape, sizes[c.layout.mesh])
    assert sum(c.tensors for c in report.coverage) == len(shapes)


_STRIDED = st.builds(
    lambda d, k: StridedShard(d, split_factor=k), st.integers(0, 1), st.integers(2, 3)
)


@st.composite
def _any_layouts(draw: st.DrawFn) -> tuple[SourceLayout, tuple[int, ...], dict[str, int]]:
    """Any layout of Shard, StridedShard and Replicate over up to three axes."""
    names = ["a", "b", "c"][: draw(st.integers(1, 3))]
    choices = st.one_of(st.just(Replicate()), st.builds(Shard, st.integers(0, 1)), _STRIDED)
    placements = [draw(choices) for _ in names]
    shape = (draw(st.integers(0, 9)), draw(st.integers(0, 4)))
    return SourceLayout("dense", names, placements), shape, {n: draw(_SIZES) for n in names}


@given(_any_layouts())
def test_dcp_chunks_and_coverage_equal_the_per_rank_reference(
    case: tuple[SourceLayout, tuple[int, ...], dict[str, int]],
) -> None:
    layout, shape, sizes = case
    boxes = {
        local_shape_and_offset(shape, layout, sizes, where)[::-1] for where in _coordinates(sizes)
    }
    by_offsets: dict[tuple[int, ...], tuple[int, ...]] = {}
    for offsets, local in sorted(boxes):
        by_offsets.setdefault(offsets, local)
    got = dcp_chunks(layout, shape, sizes)
    assert {c.offsets for c in got} == set(by_offsets)
    assert [c.offsets for c in got] == sorted(by_offsets)
    report = lint(
        ParamLayoutTable({"w": layout}),
        {"w": ParamShape(shape, "float32")},
        mesh_sizes={"dense": sizes},
    )
    if report.coverage:
        (cover,) = report.coverage
        assert cover.exact == _covers_once(layout, shape, sizes)
        assert cover.exact == all(p.kind != "coverage" for p in report.problems)


@given(_cases(), _worlds())
def test_grouped_reshard_equals_the_per_rank_reference(
    case: tuple[ParamLayoutTable, dict[str, ParamShape], dict[str, dict[str, int]], int],
    dst_sizes: dict[str, dict[str, int]],
) -> None:
    table, shapes, src_sizes, dim = case
    fsdp = {"dense": "dp_shard", "expert": "dp_shard"}
    plan = reshard_plan(
        table, table, shapes, src_sizes=src_sizes, dst_sizes=dst_sizes, fsdp=fsdp, shard_dim=dim
    )
    src = compose_table(table, fsdp=fsdp, mesh_sizes=src_sizes, shard_dim=dim)
    dst = compose_table(table, fsdp=fsdp, mesh_sizes=dst_sizes, shard_dim=dim)
    world = Mesh(dst_sizes["dense"]).size
    expected = [0] * world
    reads: list[list[tuple[object, ...]]] = [[] for _ in range(world)]
    for fqn, layout in dst.items():
        shape = shapes.get(fqn) or shapes["p0"]
        saved = dcp_chunks(src[fqn], shape.shape, src_sizes[src[fqn].mesh])
        role = dst_sizes[layout.mesh]
        for rank, where in enumerate(_coordinates(role)):
            local, offset = local_shape_and_offset(shape.shape, layout, role, where)
            for chunk in saved:
                spans = list(zip(chunk.offsets, chunk.sizes, offset, local, strict=True))
                if not all(o < d + m and d < o + n for o, n, d, m in spans):
                    continue
                starts = [max(o, d) for o, _, d, _ in spans]
                lengths = tuple(
                    min(o + n, d + m) - a for (o, n, d, m), a in zip(spans, starts, strict=True)
                )
                storage = tuple(a - o for a, (o, _, _, _) in zip(starts, spans, strict=True))
                dest = tuple(a - d for a, (_, _, d, _) in zip(starts, spans, strict=True))
                reads[rank].append((fqn, chunk, dest, storage, lengths))
                expected[rank] += math.prod(lengths) * shape.itemsize
    assert plan.bytes_read == tuple(expected)
    for rank in range(world):
        got = [
            (r.fqn, r.chunk, r.dest_offsets, r.storage_offsets, r.lengths) for r in plan.reads(rank)
        ]
        assert got == reads[rank]
    assert plan.total == sum(plan.by_param.values())


def test_the_certificate_tells_once_from_twice_and_from_a_gap() -> None:
    # once: Shard chains and FSDP's strided layout over equal pieces
    assert read_dim(10, (("dp", 4, 1), ("tp", 2, 1))).cover is None
    assert read_dim(16, (("dp", 2, 2), ("tp", 2, 1))).cover is None
    # a duplicated shard: two ranks save rows 2:4
    assert cover_problem(8, [(0, 4), (2, 2), (4, 4)]) == "rows 2:4 are saved twice"
    # a gap: no rank saves rows 6:8
    assert cover_problem(8, [(0, 3), (3, 3), (8, 0)]) == "rows 6:8 are in no chunk"
    # a layout that does both: _S(0, 2) alone reads each rank's first row on as a block
    got = read_dim(8, (("tp", 2, 2),))
    assert got.cover == "rows 2:4 are saved twice"
    table = ParamLayoutTable(
        {"w": SourceLayout("dense", ["tp"], [StridedShard(0, split_factor=2)])}
    )
    report = lint(table, {"w": ParamShape((8, 2), "float32")}, mesh_sizes={"dense": {"tp": 2}})
    assert [p.kind for p in report.problems] == ["coverage"]
    assert report.problems[0].fqn == "w"
    assert "rows 2:4 are saved twice" in report.problems[0].message
    (cover,) = report.coverage
    assert not cover.exact and cover.tensors == 1
    assert "checkpoint coverage: 1 of 1 (layout, shape) pair (1 storage) not saved" in str(report)


def test_lint_with_training_gives_its_cost_and_the_budget_problem() -> None:
    tp = SourceLayout("dense", ["tp"], [Shard(0)])
    table = ParamLayoutTable({"layers.0.w": tp, "layers.1.w": tp, "head": tp})
    shapes = {fqn: ParamShape((10, 4), "float32") for fqn in table}
    sizes = {"dense": {"dp_shard": 2, "tp": 2}}
    fsdp = {"dense": "dp_shard"}
    training = Training(param_dtype="bfloat16", units=["layers.*"])
    report = lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp, training=training)
    composed = compose_table(table, fsdp=fsdp, mesh_sizes=sizes)
    cost = training_cost(dict(composed.items()), shapes, sizes, training)
    assert report.memory.by_kind == cost.by_kind
    assert report.traffic == cost.traffic
    # FSDP2's padded storage, as lint's allocated figure
    assert report.memory.by_kind["params"] == report.memory.padded_bytes_per_rank
    assert report.ok and "training memory per rank" in str(report)
    assert report.to_dict()["traffic"] == {k: list(v) for k, v in cost.traffic.items()}
    assert report.assumptions == cost.assumptions and "assumptions:" in str(report)
    assert report.to_dict()["assumptions"] == list(cost.assumptions)
    tight = min(cost.peak)
    over = lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp, training=training, budget=tight)
    (problem,) = over.problems
    assert problem.kind == "budget"
    assert problem.ranks == tuple(r for r, n in enumerate(cost.peak) if n > tight)
    assert lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp, budget=10**12).ok
    assert not lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp).memory.by_kind
