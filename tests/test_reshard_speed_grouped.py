"""Grouped work against the same work done one tensor at a time.

``reshard_plan`` groups the parameters of a table by (saved layout, layout, shape, dtype)
when every shape is a ``ParamShape``, and plans each group once; shapes of another type
take the path that plans one parameter at a time, which is the reference here: the same
plan, reads, report and problems, whatever the order of the tables and shapes. Each
parameter is also planned alone, as a table of one, and the bytes summed. ``compose_table``
composes each (layout, shard dim) once; the reference is ``compose_fsdp`` of every entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_fsdp,
    lint,
)
from layout_algebra._ranks import chunk_lengths
from layout_algebra.checkpoint import ReshardPlan, reshard_plan
from layout_algebra.fsdp import compose_table
from layout_algebra.lint import LintReport
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import Packed, Part

R, S0, S1, S2 = Replicate(), Shard(0), Shard(1), Shard(2)

SRC_SIZES = {"dense": {"dp": 2, "tp": 2}, "expert": {"dp": 2, "ep": 2}}
DST_SIZES = {"dense": {"tp": 4}, "expert": {"ep": 2, "tp": 2}}

SRC_LAYOUTS = [
    SourceLayout("dense", (), ()),
    SourceLayout("dense", ["dp", "tp"], [S0, S1]),
    SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), S0]),
    SourceLayout("dense", ["tp"], [S1]),
    SourceLayout("expert", ["dp", "ep"], [S1, S0]),
    SourceLayout("expert", ["ep"], [S2]),  # no dim 2 in a 2-dim tensor: a problem
]
DST_LAYOUTS = [
    SourceLayout("dense", ["tp"], [S0]),
    SourceLayout("dense", ["tp"], [R]),
    SourceLayout("dense", (), ()),
    SourceLayout("expert", ["ep", "tp"], [S0, S1]),
    SourceLayout("expert", ["tp"], [S2]),  # a problem but in a 3-dim tensor
]
SHAPES = [
    ((4, 6), "float32"),
    ((4, 6), "bfloat16"),
    ((6, 4), "bfloat16"),
    ((4, 6, 3), "int64"),
    ((5,), "float32"),  # most layouts here shard dim 1: a problem
]


class Shape(NamedTuple):
    """A shape that is no ``ParamShape``: planned one parameter at a time."""

    shape: tuple[int, ...]
    dtype: str


def param_shape(shape: tuple[int, ...], dtype: str, packed: bool) -> ParamShape:
    """A new ``ParamShape`` object each time (equal values, not one object), and one with
    a structure now and then (it does not change what is read)."""
    if packed and shape and shape[0] % 2 == 0:
        half = shape[0] // 2
        return ParamShape(shape, dtype, structure={0: Packed([Part("a", half), Part("b", half)])})
    return ParamShape(shape, dtype)


@st.composite
def cases(
    draw: st.DrawFn,
) -> tuple[ParamLayoutTable, ParamLayoutTable, dict[str, ParamShape]]:
    """Two tables of the same FQNs (now and then one that ``src`` lacks), each in an
    order of its own or the same, and shapes for them (now and then one missing)."""
    n = draw(st.integers(1, 12))
    fqns = [f"layers.{i}.w" for i in range(n)]
    src_order = draw(st.permutations(fqns)) if draw(st.booleans()) else fqns
    shape_order = draw(st.permutations(fqns)) if draw(st.booleans()) else fqns
    pick = st.sampled_from
    src = {
        f: draw(pick(SRC_LAYOUTS[:-1] if draw(st.integers(0, 9)) else SRC_LAYOUTS))
        for f in src_order
    }
    dst = {
        f: draw(pick(DST_LAYOUTS[:-1] if draw(st.integers(0, 9)) else DST_LAYOUTS)) for f in fqns
    }
    if draw(st.integers(0, 9)) == 0:
        del src[draw(pick(fqns))]
    shapes = {}
    for fqn in shape_order:
        shape, dtype = draw(pick(SHAPES[:-1] if draw(st.integers(0, 9)) else SHAPES))
        shapes[fqn] = param_shape(shape, dtype, draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:
        del shapes[draw(pick(fqns))]
    return ParamLayoutTable(src), ParamLayoutTable(dst), shapes


def planned(
    src: ParamLayoutTable, dst: ParamLayoutTable, shapes: Mapping[str, object]
) -> ReshardPlan | list[tuple[str | None, str]]:
    """The plan, or the problems it raises (each one's FQN and message)."""
    try:
        return reshard_plan(src, dst, shapes, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)  # type: ignore[arg-type]
    except PlanError as error:
        return [(p.fqn, p.message) for p in error.problems]


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_grouped_reshard_plans_as_one_tensor_at_a_time(
    case: tuple[ParamLayoutTable, ParamLayoutTable, dict[str, ParamShape]],
) -> None:
    src, dst, shapes = case
    grouped = planned(src, dst, shapes)
    each = planned(src, dst, {f: Shape(s.shape, s.dtype) for f, s in shapes.items()})
    event("planned" if isinstance(grouped, ReshardPlan) else "problems")
    if not isinstance(grouped, ReshardPlan) or not isinstance(each, ReshardPlan):
        assert grouped == each
        return
    assert grouped == each
    assert list(grouped.by_param.items()) == list(each.by_param.items()) != []
    assert all(grouped.reads(r) == each.reads(r) for r in range(grouped.world_size))
    assert all(grouped.chunks_read(f) == each.chunks_read(f) for f in dst)
    assert grouped.report() == each.report()
    # each parameter alone, as a table of one: its bytes add up to the whole
    total = [0] * grouped.world_size
    for fqn, layout in dst.items():
        one = reshard_plan(
            ParamLayoutTable({fqn: src[fqn]}),
            ParamLayoutTable({fqn: layout}),
            {fqn: shapes[fqn]},
            src_sizes=SRC_SIZES,
            dst_sizes=DST_SIZES,
        )
        assert one.by_param[fqn] == grouped.by_param[fqn]
        total = [a + b for a, b in zip(total, one.bytes_read, strict=True)]
    assert tuple(total) == grouped.bytes_read


SOURCES = [
    SourceLayout("dense", (), ()),
    SourceLayout("dense", ["tp"], [S0]),
    SourceLayout("dense", ["tp"], [S1]),
    SourceLayout("expert", ["ep"], [S0]),
    SourceLayout("expert", ["ep", "tp"], [S0, S1]),
    SourceLayout("moe", ["tp"], [S0]),  # no FSDP axis for this role: a problem
    SourceLayout("dense", ["dp", "tp"], [S0, S1]),  # FSDP's own axis: a problem
]
MESHES = {"dense": {"dp": 2, "tp": 2}, "expert": {"dp": 1, "ep": 2, "tp": 2}, "moe": {"tp": 4}}
FSDP = {"dense": "dp", "expert": "dp"}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 12))
def test_grouped_compose_table_composes_as_entry_by_entry(data: st.DataObject, n: int) -> None:
    fqns = [f"layers.{i}.w" for i in range(n)]
    bad = data.draw(st.integers(0, 4)) == 0
    layouts = st.sampled_from(SOURCES if bad else SOURCES[:-2])
    entries = {f: data.draw(layouts) for f in fqns}
    tie = n > 1 and data.draw(st.booleans())
    if tie:  # a tied pair shares one storage, so one layout
        entries[fqns[1]] = entries[fqns[0]]
    table = ParamLayoutTable(entries, tied=[fqns[:2]] if tie else [])
    tied = set(table.tied[0]) if table.tied else set()
    dims = {
        f: data.draw(st.integers(0, 1)) for f in fqns if f not in tied and data.draw(st.booleans())
    }
    want: dict[str, SourceLayout] = {}
    wrong: list[str] = []
    for fqn, layout in table.items():
        role = layout.mesh
        if role not in FSDP or any(a.name == "dp" for a in layout.axes):
            wrong.append(fqn)
            continue
        want[fqn] = compose_fsdp(
            layout, shard_axis="dp", mesh_sizes=MESHES[role], shard_dim=dims.get(fqn, 0)
        )
    if wrong:
        with pytest.raises(PlanError) as raised:
            compose_table(table, fsdp=FSDP, mesh_sizes=MESHES, shard_dim=dims)
        assert [p.fqn for p in raised.value.problems] == wrong
        return
    got = compose_table(table, fsdp=FSDP, mesh_sizes=MESHES, shard_dim=dims)
    assert list(got.items()) == list(want.items())
    assert got == ParamLayoutTable(want, tied=table.tied)
    # equal layouts are one object, as in any table
    assert all(got[f] is ParamLayoutTable({"x": got[f]})["x"] for f in got)


def test_a_problem_of_one_group_names_every_parameter_of_it() -> None:
    src = ParamLayoutTable({f"w{i}": SourceLayout("dense", ["tp"], [S2]) for i in range(3)})
    dst = ParamLayoutTable({f"w{i}": SourceLayout("dense", ["tp"], [S0]) for i in range(3)})
    shapes = {f"w{i}": ParamShape((4, 6), "float32") for i in range(3)}
    with pytest.raises(PlanError) as raised:
        reshard_plan(src, dst, shapes, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)
    assert [p.fqn for p in raised.value.problems] == ["w0", "w1", "w2"]
    assert all(isinstance(p, LayoutError) for p in raised.value.problems)


# ---------------------------------------------------------------------------------------
# lint


class OtherShape(ParamShape):
    """A ``ParamShape`` of another class: lint counts its parameters one at a time."""


LINT_SIZES = {"dense": {"dp": 2, "tp": 2}, "expert": {"dp": 1, "ep": 2, "tp": 2}}
LINT_LAYOUTS = [
    *SOURCES[:5],  # the layouts both meshes have
    SourceLayout("expert", ["ep"], [S2]),  # a problem but in a 3-dim tensor
]
LINT_SHAPES = [((4, 6), "float32"), ((4, 6), "bfloat16"), ((5, 6), "float32"), ((3, 4, 2), "int8")]


def as_lint_text(report: LintReport) -> tuple[object, ...]:
    """The report with its coverage's shapes as their fields (whatever their class)."""
    cover = [
        (c.layout, c.shape.shape, c.shape.dtype, c.tensors, c.problem) for c in report.coverage
    ]
    return report.problems, report.notes, report.memory, cover, str(report)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 12))
def test_grouped_lint_counts_as_one_tensor_at_a_time(data: st.DataObject, n: int) -> None:
    fqns = [f"layers.{i}.w" for i in range(n)]
    entries = {f: data.draw(st.sampled_from(LINT_LAYOUTS)) for f in fqns}
    tie = n > 1 and data.draw(st.booleans())
    if tie:  # a tied pair shares one storage, so one layout and one shape
        entries[fqns[1]] = entries[fqns[0]]
    table = ParamLayoutTable(entries, tied=[fqns[:2]] if tie else [])
    order = data.draw(st.permutations(fqns)) if data.draw(st.booleans()) else fqns
    shapes: dict[str, ParamShape] = {}
    for fqn in order:
        shape, dtype = data.draw(st.sampled_from(LINT_SHAPES))
        shapes[fqn] = param_shape(shape, dtype, data.draw(st.booleans()))
    if tie:
        shapes[fqns[1]] = shapes[fqns[0]]
    if data.draw(st.integers(0, 4)) == 0:  # a shape the table lacks: a problem
        shapes["extra.w"] = ParamShape((4, 6), "float32")
    dims = {f: 1 for f in fqns if f not in fqns[:2] and data.draw(st.integers(0, 4)) == 0}

    def linted(given: Mapping[str, ParamShape]) -> LintReport:
        return lint(table, given, mesh_sizes=LINT_SIZES, fsdp=FSDP, shard_dim=dims)

    each = {f: OtherShape(s.shape, s.dtype, structure=s.structure) for f, s in shapes.items()}
    assert as_lint_text(linted(shapes)) == as_lint_text(linted(each))


@given(n=st.integers(0, 200), chunks=st.integers(1, 70))
def test_chunk_lengths_are_torch_chunks(n: int, chunks: int) -> None:
    pieces = torch.arange(n).chunk(chunks) if n else ()
    want = [len(p) for p in pieces] + [0] * (chunks - len(pieces))
    assert chunk_lengths(n, chunks) == want
