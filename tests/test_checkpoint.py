"""Checkpoint chunks and reshard reads, checked against torch's distributed checkpoint code.

The oracles, run without a process group: every rank's box as DTensor computes it
(``_compute_local_shape_and_global_offset``), made into the write items DCP's planner
makes and passed through DCP's own save planning (``dedup_save_plans``,
``create_default_global_save_plan``), whose metadata holds the chunks a checkpoint
records; and the read items DCP's resharding (``create_read_items_for_chunk_list``) makes
for each destination rank's box against that metadata. ``tests/test_dcp.py`` does the
same on real gloo ranks with real DTensors and a real checkpoint on disk.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from layout_algebra import (
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Partial,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    complete_default,
    lint,
    local_shape_and_offset,
)
from layout_algebra.checkpoint import (
    Chunk,
    Read,
    ReshardPlan,
    dcp_chunks,
    reshard_plan,
)
from layout_algebra.cli import main
from layout_algebra.fsdp import compose_table
from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.shapes import ParamShape
from tests.torch_oracle import dtensor_shape_and_offset, rank_coordinates

S0, S1, R = Shard(0), Shard(1), Replicate()


class Shape(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


# ---------------------------------------------------------------------------------------
# the oracle: torch's DCP planning on boxes DTensor computes


def torch_box(
    shape: Sequence[int],
    layout: SourceLayout,
    coordinate: Mapping[str, int],
    sizes: Mapping[str, int],
) -> ChunkStorageMetadata:
    """The box DCP's planner gives a rank's DTensor shard."""
    local, offsets = dtensor_shape_and_offset(shape, layout, sizes, coordinate)
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(local))


def torch_metadata(
    params: Mapping[str, tuple[SourceLayout, tuple[int, ...]]], sizes: Mapping[str, int]
) -> dict[str, TensorStorageMetadata]:
    """What DCP's save planning records for ``params`` saved from every rank of ``sizes``."""
    plans = []
    for coordinate in rank_coordinates(sizes):
        items = []
        for fqn, (layout, shape) in params.items():
            box = torch_box(shape, layout, coordinate, sizes)
            items.append(
                WriteItem(
                    index=MetadataIndex(fqn, box.offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=box,
                        properties=TensorProperties(dtype=torch.float32),
                        size=torch.Size(shape),
                    ),
                )
            )
        plans.append(SavePlan(items))
    _, metadata = create_default_global_save_plan(dedup_save_plans(plans))
    out = {}
    for fqn, md in metadata.state_dict_metadata.items():
        assert isinstance(md, TensorStorageMetadata)
        out[fqn] = md
    return out


def as_chunk(box: ChunkStorageMetadata) -> Chunk:
    return Chunk(tuple(box.offsets), tuple(box.sizes))


ReadKey = tuple[Chunk, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def torch_reads(fqn: str, md: TensorStorageMetadata, box: ChunkStorageMetadata) -> list[ReadKey]:
    """The read items DCP's resharding makes to fill ``box`` from ``md``, sorted."""
    out = []
    for item in create_read_items_for_chunk_list(fqn, md, [box]):
        assert item.storage_index.index is not None
        saved = md.chunks[item.storage_index.index]
        assert tuple(item.storage_index.offset or ()) == tuple(saved.offsets)
        assert tuple(item.dest_index.offset or ()) == tuple(box.offsets)
        out.append(
            (
                as_chunk(saved),
                tuple(item.dest_offsets),
                tuple(item.storage_offsets),
                tuple(item.lengths),
            )
        )
    return sorted(out)


def mine(reads: Sequence[Read], fqn: str) -> list[ReadKey]:
    return sorted(
        (r.chunk, r.dest_offsets, r.storage_offsets, r.lengths) for r in reads if r.fqn == fqn
    )


# ---------------------------------------------------------------------------------------
# random geometries


@st.composite
def layouts(draw: st.DrawFn, shape: tuple[int, ...], sizes: Mapping[str, int]) -> SourceLayout:
    """A layout over some of ``sizes``' axes, in mesh order, sharding dims of ``shape``."""
    axes = [a for a in sizes if draw(st.booleans())]
    if not shape:
        return SourceLayout("dense", axes, [R] * len(axes))
    dims = st.integers(0, len(shape) - 1)
    placement = st.one_of(
        st.just(R),
        st.builds(Shard, dims),
        st.builds(lambda d, k: StridedShard(d, split_factor=k), dims, st.integers(2, 3)),
    )
    return SourceLayout(
        "dense", axes, draw(st.lists(placement, min_size=len(axes), max_size=len(axes)))
    )


def meshes(prefix: str) -> st.SearchStrategy[dict[str, int]]:
    return st.lists(st.integers(1, 3), min_size=1, max_size=3).map(
        lambda ns: {f"{prefix}{i}": n for i, n in enumerate(ns)}
    )


shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


@settings(max_examples=300)
@given(data=st.data(), shape=shapes, sizes=meshes("m"))
def test_dcp_chunks_are_the_chunks_dcp_records(
    data: st.DataObject, shape: tuple[int, ...], sizes: dict[str, int]
) -> None:
    layout = data.draw(layouts(shape, sizes))
    md = torch_metadata({"w": (layout, shape)}, sizes)["w"]
    theirs = sorted(as_chunk(c) for c in md.chunks)
    assert list(dcp_chunks(layout, shape, sizes)) == theirs
    assert len(set(theirs)) == len(theirs)


@settings(max_examples=200)
@given(
    data=st.data(),
    shape=shapes,
    src_sizes=meshes("m"),
    dst_sizes=meshes("n"),
    dtype=st.sampled_from(["float32", "bfloat16", "int64"]),
)
def test_reshard_reads_are_the_reads_dcp_makes(
    data: st.DataObject,
    shape: tuple[int, ...],
    src_sizes: dict[str, int],
    dst_sizes: dict[str, int],
    dtype: str,
) -> None:
    src = data.draw(layouts(shape, src_sizes))
    dst = data.draw(layouts(shape, dst_sizes))
    md = torch_metadata({"w": (src, shape)}, src_sizes)["w"]
    plan = reshard_plan(
        ParamLayoutTable({"w": src}),
        ParamLayoutTable({"w": dst}),
        {"w": Shape(shape, dtype)},
        src_sizes={"dense": src_sizes},
        dst_sizes={"dense": dst_sizes},
    )
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    assert plan.world_size == math.prod(dst_sizes.values())
    for rank, coordinate in enumerate(rank_coordinates(dst_sizes)):
        theirs = torch_reads("w", md, torch_box(shape, dst, coordinate, dst_sizes))
        assert mine(plan.reads(rank), "w") == theirs
        assert plan.bytes_read[rank] == itemsize * sum(math.prod(t[3]) for t in theirs)
    assert plan.total == sum(plan.bytes_read) == plan.by_param["w"]


# ---------------------------------------------------------------------------------------
# a model: two mesh roles, FSDP, a tied pair, plain parameters


DENSE = {"dp_shard": 2, "tp": 2}
EXPERT = {"edp_shard": 2, "ep": 2}
MODEL = {
    "emb.weight": Shape((17, 8), "bfloat16"),
    "head.weight": Shape((17, 8), "bfloat16"),
    "up.weight": Shape((12, 8), "float32"),
    "up.bias": Shape((12,), "float32"),
    "norm.weight": Shape((8,), "float32"),
    "experts.w1": Shape((4, 8, 6), "bfloat16"),
}


def source_table(*, vocab: Shard, up: Shard, experts: Shard) -> ParamLayoutTable:
    tp = SourceLayout("dense", ["tp"], [vocab])
    return ParamLayoutTable(
        {
            "emb.weight": tp,
            "head.weight": tp,
            "up.weight": SourceLayout("dense", ["tp"], [up]),
            "up.bias": SourceLayout("dense", ["tp"], [S0 if up == S0 else R]),
            "norm.weight": SourceLayout("dense", (), ()),
            "experts.w1": SourceLayout("expert", ["ep"], [experts]),
        },
        tied=[frozenset({"emb.weight", "head.weight"})],
    )


def model_metadata(
    table: ParamLayoutTable, sizes: Mapping[str, Mapping[str, int]]
) -> dict[str, TensorStorageMetadata]:
    """DCP's metadata for ``table``, every role's mesh laid over one world."""
    world = list(rank_coordinates(sizes["dense"]))
    expert = list(rank_coordinates(sizes["expert"]))
    plans = []
    for rank in range(len(world)):
        items = []
        for fqn, layout in table.items():
            role = sizes[layout.mesh]
            coordinate = (world if layout.mesh == "dense" else expert)[rank]
            shape = MODEL[fqn].shape
            box = torch_box(shape, layout, coordinate, role)
            items.append(
                WriteItem(
                    index=MetadataIndex(fqn, box.offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=box, properties=TensorProperties(), size=torch.Size(shape)
                    ),
                )
            )
        plans.append(SavePlan(items))
    _, metadata = create_default_global_save_plan(dedup_save_plans(plans))
    return {
        k: v
        for k, v in metadata.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }


FSDP = {"dense": "dp_shard", "expert": "edp_shard"}
SRC_SIZES = {"dense": DENSE, "expert": EXPERT}
DST_SIZES = {"dense": {"tp": 4}, "expert": {"ep": 4}}


def test_a_reshard_plan_is_made_by_reshard_plan_only() -> None:
    dst = source_table(vocab=S1, up=S1, experts=S0)
    plan = reshard_plan(dst, dst, MODEL, src_sizes=DST_SIZES, dst_sizes=DST_SIZES)
    fields = {k.lstrip("_"): v for k, v in attrs.asdict(plan, recurse=False).items()}
    for args in ((), tuple(fields.values())):
        with pytest.raises(LayoutError, match=r"^ReshardPlan values are made by reshard_plan"):
            ReshardPlan(*args)
    with pytest.raises(LayoutError, match=r"made by reshard_plan"):
        ReshardPlan(**fields)
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.reads(3) == plan.reads(3)
    assert copy.copy(plan) == plan


def test_a_model_resharded_reads_what_dcp_reads() -> None:
    src = compose_table(
        source_table(vocab=S0, up=S0, experts=S0),
        fsdp=FSDP,
        mesh_sizes=SRC_SIZES,
        shard_dim={"experts.w1": 1},
    )
    dst = source_table(vocab=S1, up=S1, experts=S0)
    plan = reshard_plan(src, dst, MODEL, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)
    md = model_metadata(src, SRC_SIZES)
    for fqn, layout in src.items():
        assert dcp_chunks(layout, MODEL[fqn].shape, SRC_SIZES[layout.mesh]) == tuple(
            sorted(as_chunk(c) for c in md[fqn].chunks)
        )
    dst_world = {role: list(rank_coordinates(s)) for role, s in DST_SIZES.items()}
    for rank in range(4):
        expected = 0
        for fqn, layout in dst.items():
            box = torch_box(
                MODEL[fqn].shape, layout, dst_world[layout.mesh][rank], DST_SIZES[layout.mesh]
            )
            theirs = torch_reads(fqn, md[fqn], box)
            assert mine(plan.reads(rank), fqn) == theirs
            expected += getattr(torch, MODEL[fqn].dtype).itemsize * sum(
                math.prod(t[3]) for t in theirs
            )
        assert plan.bytes_read[rank] == expected
    # every destination rank reads the whole tensor of a plain parameter, its own shard of the rest
    assert plan.by_param["norm.weight"] == 4 * 8 * 4
    assert plan.by_param["emb.weight"] == plan.by_param["head.weight"] == 17 * 8 * 2
    assert plan.chunks_read("emb.weight") == 4 * 4  # each tp rank's columns from 4 row chunks


def test_fsdp_argument_composes_both_tables() -> None:
    src = source_table(vocab=S0, up=S0, experts=S0)
    dst = source_table(vocab=S1, up=S0, experts=S1)
    dst_sizes = {"dense": {"tp": 2, "dp_shard": 2}, "expert": {"ep": 2, "edp_shard": 2}}
    given_fsdp = reshard_plan(
        src, dst, MODEL, src_sizes=SRC_SIZES, dst_sizes=dst_sizes, fsdp=FSDP, shard_dim=0
    )
    by_hand = reshard_plan(
        compose_table(src, fsdp=FSDP, mesh_sizes=SRC_SIZES),
        compose_table(dst, fsdp=FSDP, mesh_sizes=dst_sizes),
        MODEL,
        src_sizes=SRC_SIZES,
        dst_sizes=dst_sizes,
    )
    assert given_fsdp == by_hand
    assert all(given_fsdp.reads(r) == by_hand.reads(r) for r in range(4))


def test_the_same_layout_reads_each_rank_its_own_chunk() -> None:
    table = compose_table(
        source_table(vocab=S0, up=S1, experts=S0), fsdp=FSDP, mesh_sizes=SRC_SIZES
    )
    plan = reshard_plan(table, table, MODEL, src_sizes=SRC_SIZES, dst_sizes=SRC_SIZES)
    for rank in range(4):
        for read in plan.reads(rank):
            assert read.storage_offsets == read.dest_offsets == (0,) * len(read.lengths)
            assert read.lengths == read.chunk.sizes
    worlds = {role: list(rank_coordinates(s)) for role, s in SRC_SIZES.items()}
    for rank in range(4):
        own = 0
        for fqn, layout in table.items():
            at = worlds[layout.mesh][rank]
            local, _ = local_shape_and_offset(MODEL[fqn].shape, layout, SRC_SIZES[layout.mesh], at)
            own += getattr(torch, MODEL[fqn].dtype).itemsize * math.prod(local)
        assert plan.bytes_read[rank] == own


# ---------------------------------------------------------------------------------------
# values, reports and errors


def test_empty_tail_shards_are_saved_as_empty_boxes() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    chunks = dcp_chunks(layout, (5, 2), {"tp": 4})
    assert [str(c) for c in chunks] == ["[0:2, 0:2]", "[2:4, 0:2]", "[4:5, 0:2]", "[5:5, 0:2]"]
    assert [c.numel for c in chunks] == [4, 4, 2, 0]


def test_a_plain_tensor_is_one_box_and_every_rank_reads_it_whole() -> None:
    plain = SourceLayout("dense", (), ())
    assert dcp_chunks(plain, (3, 4), {}) == (Chunk((0, 0), (3, 4)),)
    table = ParamLayoutTable({"b": plain})
    plan = reshard_plan(
        table,
        table,
        {"b": Shape((3, 4), "float32")},
        src_sizes={"dense": {"tp": 2}},
        dst_sizes={"dense": {"tp": 3}},
    )
    assert plan.bytes_read == (48, 48, 48)
    assert plan.reads(2) == (Read("b", Chunk((0, 0), (3, 4)), (0, 0), (0, 0), (3, 4)),)


def test_a_scalar_is_read_whole() -> None:
    table = ParamLayoutTable({"s": SourceLayout("dense", ["tp"], [R])})
    plan = reshard_plan(
        table,
        table,
        {"s": Shape((), "float32")},
        src_sizes={"dense": {"tp": 2}},
        dst_sizes={"dense": {"tp": 2}},
    )
    assert plan.reads(1) == (Read("s", Chunk((), ()), (), (), ()),)
    assert plan.bytes_read == (4, 4)


def test_values_print_as_boxes() -> None:
    chunk = Chunk((4, 0), (4, 8))
    assert str(chunk) == "[4:8, 0:8]"
    assert repr(chunk) == "Chunk(offsets=(4, 0), sizes=(4, 8))"
    read = Read("w", chunk, (0, 0), (1, 2), (2, 3))
    assert str(read) == "w[5:7, 2:5] from chunk [4:8, 0:8]"
    assert read.numel == 6
    assert sorted([Chunk((2,), (1,)), Chunk((0,), (2,))])[0] == Chunk((0,), (2,))


@pytest.mark.parametrize(
    ("offsets", "sizes"), [((0,), (1, 2)), ((-1,), (1,)), ("ab", (1, 2)), ((0,), None)]
)
def test_a_chunk_is_checked(offsets: object, sizes: object) -> None:
    with pytest.raises(LayoutError):
        Chunk(offsets, sizes)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "torch.bfloat16", "BF16", "I64", "bool", "F8_E4M3"])
def test_bytes_follow_the_dtype_in_torch_and_safetensors_spelling(dtype: str) -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [S0])})
    sizes = {"dense": {"tp": 2}}
    plan = reshard_plan(table, table, {"w": Shape((4, 3), dtype)}, src_sizes=sizes, dst_sizes=sizes)
    torch_name = {"BF16": "bfloat16", "I64": "int64", "F8_E4M3": "float8_e4m3fn"}.get(dtype, dtype)
    itemsize = getattr(torch, torch_name.removeprefix("torch.")).itemsize
    assert plan.bytes_read == (6 * itemsize, 6 * itemsize)


def test_the_report_names_the_parameters_that_move_most() -> None:
    src = compose_table(source_table(vocab=S0, up=S0, experts=S0), fsdp=FSDP, mesh_sizes=SRC_SIZES)
    dst = source_table(vocab=S1, up=S1, experts=S0)
    plan = reshard_plan(src, dst, MODEL, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)
    text = str(plan)
    lines = text.splitlines()
    assert lines[0] == (
        f"reshard: 6 parameters, 4 destination ranks read {plan.total / 1024:.2f} KiB in all"
    )
    rank, most = plan.largest
    assert most == max(plan.bytes_read)
    assert f"largest: rank {rank} reads" in lines[1]
    top = lines[lines.index("parameters that move most (bytes read by all ranks):") + 1]
    assert top.split()[0] == min(plan.by_param, key=lambda f: (-plan.by_param[f], f))
    assert "dense[dp_shard=_S(0, 2), tp=S(0)] -> dense[tp=S(1)]" in text
    assert repr(plan) == f"ReshardPlan(ranks=4, params=6, total={plan.total})"


def test_every_problem_of_a_reshard_is_reported() -> None:
    src = ParamLayoutTable({"a": SourceLayout("dense", ["tp"], [S0])})
    dst = ParamLayoutTable(
        {
            "a": SourceLayout("dense", ["tp"], [S1]),
            "b": SourceLayout("dense", ["tp"], [S0]),
            "c": SourceLayout("other", ["tp"], [S0]),
        }
    )
    with pytest.raises(PlanError) as caught:
        reshard_plan(
            src.with_entries({"c": SourceLayout("dense", ["tp"], [S0])}),
            dst,
            {"a": Shape((4,), "float32"), "c": Shape((4,), "float32")},
            src_sizes={"dense": {"tp": 2}},
            dst_sizes={"dense": {"tp": 2}},
        )
    problems = {p.fqn: p.message for p in caught.value.problems}
    assert "shards dim 1, but shape (4,) has 1 dim" in problems["a"]
    assert "not in the checkpoint's table" in problems["b"]
    assert "mesh role 'other', which dst_sizes has no sizes for" in problems["c"]


def test_missing_shapes_sizes_and_partials_are_named() -> None:
    table = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [S0])})
    sizes = {"dense": {"tp": 2}}
    with pytest.raises(PlanError, match="w: no shape given"):
        reshard_plan(table, table, {}, src_sizes=sizes, dst_sizes=sizes)
    with pytest.raises(PlanError, match="w: 'f13' is not a dtype"):
        reshard_plan(table, table, {"w": Shape((2,), "f13")}, src_sizes=sizes, dst_sizes=sizes)
    with pytest.raises(PlanError, match="no size for axis 'tp'"):
        reshard_plan(
            table,
            table,
            {"w": Shape((2,), "float32")},
            src_sizes={"dense": {"dp": 2}},
            dst_sizes=sizes,
        )
    with pytest.raises(LayoutError, match=r"P\(sum\) on axis 'tp'.*a checkpoint saves whole"):
        dcp_chunks(SourceLayout("dense", ["tp"], [Partial()]), (4,), {"tp": 2})
    with pytest.raises(LayoutError, match=r"reshard_plan\(src=\.\.\.\) must be a ParamLayoutTable"):
        reshard_plan({}, table, {}, src_sizes=sizes, dst_sizes=sizes)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="global_shape must be a sequence"):
        dcp_chunks(SourceLayout("dense", ["tp"], [S0]), "44", {"tp": 2})  # type: ignore[arg-type]
    plan = reshard_plan(
        table, table, {"w": Shape((2,), "float32")}, src_sizes=sizes, dst_sizes=sizes
    )
    with pytest.raises(LayoutError, match=r"rank must be an int in \[0, 2\)"):
        plan.reads(2)
    with pytest.raises(LayoutError, match="'v' is not a parameter"):
        plan.chunks_read("v")


def test_tied_members_share_a_shape() -> None:
    tp = SourceLayout("dense", ["tp"], [S0])
    table = ParamLayoutTable({"a": tp, "b": tp}, tied=[frozenset({"a", "b"})])
    sizes = {"dense": {"tp": 2}}
    plan = reshard_plan(
        table, table, {"b": Shape((4, 2), "float32")}, src_sizes=sizes, dst_sizes=sizes
    )
    assert dict(plan.by_param) == {"a": 32, "b": 32}


# ---------------------------------------------------------------------------------------
# the command line


def write_files(tmp_path: Path) -> tuple[str, str, str]:
    train = source_table(vocab=S0, up=S0, experts=S0)
    serve = source_table(vocab=S1, up=S1, experts=S0)
    paths = tmp_path / "train.json", tmp_path / "serve.json", tmp_path / "shapes.json"
    paths[0].write_text(to_json(train))
    paths[1].write_text(to_json(serve))
    paths[2].write_text(shapes_to_json({f: ParamShape(s.shape, s.dtype) for f, s in MODEL.items()}))
    return str(paths[0]), str(paths[1]), str(paths[2])


def test_the_command_line_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, serve, shapes = write_files(tmp_path)
    argv = [
        "reshard", train, serve, "--shapes", shapes,
        "--mesh", "dp_shard=2,tp=2", "--expert-mesh", "edp_shard=2,ep=2",
        "--fsdp", "dp_shard", "--expert-fsdp", "edp_shard",
        "--to-mesh", "tp=4", "--to-expert-mesh", "ep=4", "--top", "3",
    ]  # fmt: skip
    assert main(argv) == 0
    plan = reshard_plan(
        compose_table(source_table(vocab=S0, up=S0, experts=S0), fsdp=FSDP, mesh_sizes=SRC_SIZES),
        source_table(vocab=S1, up=S1, experts=S0),
        MODEL,
        src_sizes=SRC_SIZES,
        dst_sizes=DST_SIZES,
    )
    out = capsys.readouterr().out
    assert out == (
        "saved on dense (dp_shard=2, tp=2); expert (edp_shard=2, ep=2), "
        "loaded on dense (tp=4); expert (ep=4)\n" + plan.report(top=3) + "\n"
    )
    assert "  ... and 3 more" in out


def test_the_command_line_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, serve, shapes = write_files(tmp_path)
    base = ["reshard", train, serve, "--shapes", shapes, "--to-mesh", "tp=4"]
    assert main([*base, "--mesh", "dp_shard=2,tp=2"]) == 1
    assert "experts.w1 is on the 'expert' mesh; give its sizes with --expert-mesh" in (
        capsys.readouterr().err
    )
    assert main([*base, "--mesh", "tp=4", "--expert-mesh", "ep=2", "--to-expert-mesh", "ep=4"]) == 1
    assert "--mesh (tp=4) has 4 ranks but --expert-mesh (ep=2) has 2" in capsys.readouterr().err
    argv = [
        *base,
        "--mesh",
        "tp=4",
        "--expert-mesh",
        "ep=4",
        "--to-expert-mesh",
        "ep=4",
        "--fsdp",
        "dp",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("layout-algebra: the reshard has 6 problems:\n")
    assert "mesh_sizes has no size for axis 'dp'" in err
    assert main(["reshard", train, serve, "--mesh", "tp=4", "--to-mesh", "tp=4"]) == 2


def test_work_is_bounded_by_the_ranks_a_world_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = {"a": 2**20, "b": 2**20}
    layout = SourceLayout("dense", ["a", "b"], [S0, S1])
    with pytest.raises(LayoutError, match="more than the 1,048,576"):
        dcp_chunks(layout, (4, 4), huge)
    table = ParamLayoutTable({"w": SourceLayout("dense", ["a"], [S0])})
    with pytest.raises(LayoutError, match="dst_sizes lay out 1,099,511,627,776 ranks"):
        reshard_plan(
            table,
            table,
            {"w": Shape((4,), "float32")},
            src_sizes={"dense": {"a": 2}},
            dst_sizes={"dense": huge},
        )
    # lint examines every rank too: each axis within bounds, the world not
    shapes = {"w": ParamShape((4,), "float32")}
    with pytest.raises(LayoutError, match="mesh_sizes lay out 1,099,511,627,776 ranks"):
        lint(table, shapes, mesh_sizes={"dense": huge})
    (tmp_path / "t.json").write_text(to_json(table))
    (tmp_path / "s.json").write_text(shapes_to_json(shapes))
    argv = ["lint", str(tmp_path / "t.json"), "--shapes", str(tmp_path / "s.json")]
    assert main([*argv, "--mesh", "a=1048576,b=1048576"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ranks, more than the 1,048,576" in err


# --- tables kept by module ------------------------------------------------------------


def _moe_table(split: bool, expert: Shard) -> ParamLayoutTable:
    """The MODEL's parameters by a plan without ties (kept by module), ``experts.w1``
    under the root module or, with ``split``, as ``w1`` of a module ``experts``."""
    modules = {
        "": ModulePlan(
            {
                "emb.weight": {"tp": S0},
                "head.weight": {"tp": S0},
                "up.weight": {"tp": S0},
                "up.bias": {"tp": S0},
                "norm.weight": {},
            }
        )
    }
    experts = {"ep": expert}
    if split:
        modules["experts"] = ModulePlan({"w1": experts}, expert_parallel=True)
    else:
        modules[""] = ModulePlan(
            {**modules[""].params, "experts.w1": experts}, expert_parallel=True
        )
    plan = ShardingPlan(modules, mesh_axes=["dp_shard", "edp_shard", "ep", "tp"])
    table = build_table(plan, ["dp_shard", "tp"], expert_axes=["edp_shard", "ep"])
    return table


def _spelled(table: ParamLayoutTable) -> ParamLayoutTable:
    return ParamLayoutTable(dict(table.items()), tied=table.tied)


def _reshards_as_spelled_out(
    src: ParamLayoutTable, dst: ParamLayoutTable, shapes: Mapping[str, Shape]
) -> None:
    """``reshard_plan`` of tables kept apart is that of the same tables spelled out."""
    ours = reshard_plan(src, dst, shapes, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES)
    spelled = reshard_plan(
        _spelled(src), _spelled(dst), shapes, src_sizes=SRC_SIZES, dst_sizes=DST_SIZES
    )
    assert ours == spelled
    assert ours.bytes_read == spelled.bytes_read
    assert ours.by_param == spelled.by_param
    for rank in range(ours.world_size):
        assert list(ours.reads(rank)) == list(spelled.reads(rank))


@pytest.mark.parametrize(("src_split", "dst_split"), [(False, False), (True, False), (False, True)])
def test_tables_kept_by_module_compose_and_reshard_as_spelled_out_ones(
    src_split: bool, dst_split: bool
) -> None:
    source = _moe_table(src_split, S0)
    composed = compose_table(source, fsdp=FSDP, mesh_sizes=SRC_SIZES)
    assert composed == compose_table(_spelled(source), fsdp=FSDP, mesh_sizes=SRC_SIZES)
    assert list(composed.items()) == list(
        compose_table(_spelled(source), fsdp=FSDP, mesh_sizes=SRC_SIZES).items()
    )
    dst = _moe_table(dst_split, S0)
    shapes = {f: MODEL[f] for f in source}
    _reshards_as_spelled_out(composed, dst, shapes)


@pytest.mark.parametrize("split", [False, True])
def test_tables_of_one_plan_reshard_in_step_as_spelled_out_ones(split: bool) -> None:
    """Train and serve tables built from one plan share its modules: walked in step."""
    modules = {
        "": ModulePlan({"emb.weight": {"tp": S0}, "head.weight": {"tp": S1}, "norm.weight": {}}),
        "up": ModulePlan({"weight": {"tp": S0}, "bias": {"tp": S0}}),
    }
    if split:
        modules["experts"] = ModulePlan({"w1": {"ep": S0}}, expert_parallel=True)
    else:
        modules[""] = ModulePlan(
            {**modules[""].params, "experts.w1": {"ep": S0}}, expert_parallel=True
        )
    plan = ShardingPlan(modules, mesh_axes=["dp_shard", "edp_shard", "ep", "tp"])
    train = build_table(plan, ["dp_shard", "tp"], expert_axes=["edp_shard", "ep"])
    serve = build_table(plan, ["tp"], expert_axes=["ep"])
    composed = compose_table(train, fsdp=FSDP, mesh_sizes=SRC_SIZES)
    shapes = {f: MODEL[f] for f in serve}
    _reshards_as_spelled_out(composed, serve, shapes)


@pytest.mark.parametrize(("src_names", "dst_names"), [(2, 2), (2, 4), (4, 2)])
def test_completed_tables_kept_by_module_reshard_as_spelled_out_ones(
    src_names: int, dst_names: int
) -> None:
    """``complete_default`` keeps a table by module, what it adds under the root module:
    a parameter may then be under a module in one table and the root in the other."""
    plan = ShardingPlan(
        {
            "emb": ModulePlan({"weight": {"tp": S0}}),
            "head": ModulePlan({"weight": {"tp": S1}}),
            "up": ModulePlan({"weight": {"tp": S0}}),
            "experts": ModulePlan({"w1": {"ep": S0}}, expert_parallel=True),
        },
        mesh_axes=["dp_shard", "edp_shard", "ep", "tp"],
    )
    unnamed = ["up.bias", "norm.weight", "up.weight", "emb.weight"]
    source = complete_default(
        build_table(plan, ["dp_shard", "tp"], expert_axes=["edp_shard", "ep"]),
        unnamed[:src_names],
        ["dp_shard", "tp"],
    )
    dst = complete_default(
        build_table(plan, ["tp"], expert_axes=["ep"]), unnamed[:dst_names], ["tp"], plain=True
    )
    composed = compose_table(source, fsdp=FSDP, mesh_sizes=SRC_SIZES)
    assert list(composed.items()) == list(
        compose_table(_spelled(source), fsdp=FSDP, mesh_sizes=SRC_SIZES).items()
    )
    _reshards_as_spelled_out(composed, dst, MODEL)
