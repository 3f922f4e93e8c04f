"""``table_from_dcp``: a checkpoint's layouts, read from its metadata alone.

Two kinds of tests. Metadata files written here (the boxes ``dcp_chunks`` gives a layout,
each on the rank DTensor puts it) check the reading of every layout form and every
chunk set no layout writes. One spawn of real gloo ranks (``tests/dcp_runs.py``) saves
checkpoints under tensor parallelism, FSDP2 over it, an expert mesh, HSDP and the
uneven strided hazard, then loads some under other layouts: the layouts read back are
the ones they were saved under, ``reshard_plan`` from them makes torch's own reads, and
the hazard is refused.
"""

from __future__ import annotations

import math
import pickle
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from layout_algebra import (
    Chunk,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_fsdp,
    dcp_chunks,
    lint,
    local_shape_and_offset,
    reshard_plan,
)
from layout_algebra.torch_bridge import DcpLayouts, table_from_dcp
from tests import dcp_runs
from tests.torch_oracle import on_gloo

S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()

# ---------------------------------------------------------------------------------------
# metadata written here


def write_metadata(
    where: Path,
    tensors: Mapping[str, tuple[Sequence[int], Sequence[Chunk], Mapping[Chunk, int]]],
    *,
    other: Sequence[str] = (),
) -> str:
    """A checkpoint directory holding only a ``.metadata``: per FQN the shape, the boxes
    and the rank whose file holds each (as ``FileSystemWriter`` names it)."""
    where.mkdir(parents=True, exist_ok=True)
    entries: dict[str, Any] = {}
    storage: dict[MetadataIndex, object] = {}
    for fqn, (shape, chunks, writers) in tensors.items():
        entries[fqn] = TensorStorageMetadata(
            TensorProperties(dtype=torch.bfloat16),
            torch.Size(shape),
            [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in chunks],
        )
        for c, rank in writers.items():
            info = _StorageInfo(relative_path=f"__{rank}_0.distcp", offset=0, length=0)
            storage[MetadataIndex(fqn, torch.Size(c.offsets))] = info
    for fqn in other:
        entries[fqn] = BytesStorageMetadata()
    (where / ".metadata").write_bytes(
        pickle.dumps(Metadata(state_dict_metadata=entries, storage_data=storage))
    )
    return str(where)


def saved_by(
    layout: SourceLayout, shape: Sequence[int], mesh: Mesh
) -> tuple[Sequence[int], Sequence[Chunk], dict[Chunk, int]]:
    """What DCP records of a tensor under ``layout``: its boxes, each written by the
    lowest rank that holds it (the first of the replicas)."""
    writers: dict[Chunk, int] = {}
    for rank in range(mesh.size):
        at = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
        sizes, offsets = local_shape_and_offset(shape, layout, mesh, at)
        writers.setdefault(Chunk(offsets, sizes), rank)
    chunks = dcp_chunks(layout, shape, mesh)
    assert set(writers) == set(chunks)
    return shape, chunks, writers


def on(mesh: Mesh, *placements: Shard | Replicate | StridedShard) -> SourceLayout:
    return SourceLayout("dense", mesh.names, placements)


FSDP_TP = Mesh({"dp_shard": 2, "tp": 2})
HSDP = Mesh({"dp_replicate": 2, "dp_shard": 2})
CUBE = Mesh({"dp_shard": 2, "ep": 2, "tp": 2})

KNOWN: dict[str, tuple[SourceLayout, tuple[int, ...], Mesh]] = {
    # even rows: the chunks are those of S(0) over 4 ranks; the writers tell them apart
    "strided-even": (on(FSDP_TP, StridedShard(0, split_factor=2), S0), (8, 4), FSDP_TP),
    "both-S0-even": (on(FSDP_TP, S0, S0), (8, 4), FSDP_TP),
    "strided-uneven": (on(FSDP_TP, StridedShard(0, split_factor=2), S0), (6, 4), FSDP_TP),
    "rowwise": (on(FSDP_TP, S0, S1), (4, 6), FSDP_TP),
    "columns-first": (on(FSDP_TP, S1, S0), (4, 6), FSDP_TP),
    "fsdp-replicated-tp": (on(FSDP_TP, S0, R), (6,), FSDP_TP),
    "hsdp": (on(HSDP, R, S0), (6, 2), HSDP),
    "experts-fsdp": (on(CUBE, StridedShard(0, split_factor=4), S0, S0), (8, 3), CUBE),
    "experts-3d": (on(CUBE, S1, S0, S2), (4, 6, 8), CUBE),
    "scalar": (on(FSDP_TP, R, R), (), FSDP_TP),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_layouts_are_read_back_on_the_mesh_given(tmp_path: Path, name: str) -> None:
    layout, shape, mesh = KNOWN[name]
    path = write_metadata(tmp_path, {"w": saved_by(layout, shape, mesh)})
    got = table_from_dcp(path, mesh=mesh)
    assert got.table["w"] == layout
    assert got.shapes["w"] == ParamShape(shape, "bfloat16")
    assert dict(got.meshes) == {"dense": mesh}
    assert got.skipped == ()


@pytest.mark.parametrize("name", list(KNOWN))
def test_layouts_are_read_back_without_a_mesh(tmp_path: Path, name: str) -> None:
    """The inferred mesh names its axes d0, d1, ...; the boxes are the same, and so are
    the placements where every rank writes a box of its own (replicas write one copy, so
    the ranks that write none are not seen: HSDP's here)."""
    layout, shape, mesh = KNOWN[name]
    path = write_metadata(tmp_path, {"w": saved_by(layout, shape, mesh)})
    got = table_from_dcp(path)
    (role,) = got.meshes
    inferred = got.table["w"]
    assert inferred.mesh == role == "dense"
    assert [a.name for a in inferred.axes] == [f"d{i}" for i in range(len(inferred.axes))]
    assert dcp_chunks(inferred, shape, got.meshes[role]) == dcp_chunks(layout, shape, mesh)
    if name in {"strided-even", "strided-uneven", "rowwise", "columns-first"}:
        assert got.meshes[role].sizes == mesh.sizes
        assert inferred.placements == layout.placements


def random_layout(rng: random.Random) -> tuple[SourceLayout, tuple[int, ...], Mesh]:
    """A source layout on 1 or 2 axes, composed with FSDP (HSDP at times), on a random shape."""
    ndim = rng.choice([1, 2, 2, 3])
    shape = tuple(rng.randint(1, 9) for _ in range(ndim))
    n_source = rng.choice([1, 1, 2])
    hsdp = rng.random() < 0.25
    names = (["dp_replicate"] if hsdp else []) + ["dp_shard"] + ["ep", "tp"][2 - n_source :]
    sizes = {name: rng.choice([2, 2, 3]) for name in names}
    source = SourceLayout(
        "dense",
        names[-n_source:],
        [rng.choice([Shard(d) for d in range(ndim)] + [R]) for _ in range(n_source)],
    )
    dim = rng.randrange(ndim)
    layout = compose_fsdp(
        source,
        shard_axis="dp_shard",
        replicate_axes=["dp_replicate"] if hsdp else [],
        mesh_sizes=sizes,
        shard_dim=dim,
    )
    return layout, shape, Mesh(sizes)


def test_without_file_names_the_first_layout_that_writes_the_boxes_is_read(
    tmp_path: Path,
) -> None:
    """Another storage's file names say nothing of ranks: even rows split over both axes
    are read as FSDP2 writes them, ``_S`` first, and load the same reads either way."""
    layout, shape, mesh = KNOWN["both-S0-even"]
    _, chunks, _ = saved_by(layout, shape, mesh)
    got = table_from_dcp(write_metadata(tmp_path, {"w": (shape, chunks, {})}), mesh=mesh)
    assert got.table["w"] == on(mesh, StridedShard(0, split_factor=2), S0)
    assert dcp_chunks(got.table["w"], shape, mesh) == chunks


def hazardous(layout: SourceLayout, shape: tuple[int, ...], mesh: Mesh) -> bool:
    """Whether FSDP2 keeps other rows than DTensor reads ``layout`` (lint's "storage")."""
    report = lint(
        ParamLayoutTable({"w": layout}),
        {"w": ParamShape(shape, "bfloat16")},
        mesh_sizes={"dense": mesh},
    )
    return any(p.kind == "storage" for p in report.problems)


def test_random_layouts_read_back_write_the_same_boxes(tmp_path: Path) -> None:
    rng = random.Random(0)
    for i in range(40):
        layout, shape, mesh = random_layout(rng)
        path = write_metadata(tmp_path / str(i), {"w": saved_by(layout, shape, mesh)})
        if hazardous(layout, shape, mesh):
            with pytest.raises(PlanError, match="hazard of uneven strided shards"):
                table_from_dcp(path, mesh=mesh)
            continue
        for given in (mesh, None):
            got = table_from_dcp(path, mesh=given)
            role = got.table["w"].mesh
            assert dcp_chunks(got.table["w"], shape, got.meshes[role]) == dcp_chunks(
                layout, shape, mesh
            ), (i, layout, shape, given)


BAD = {
    "ragged": ([Chunk((0,), (3,)), Chunk((3,), (7,))], "torch.chunk"),
    "gap": ([Chunk((0,), (4,)), Chunk((6,), (4,))], "a gap"),
    "overlap": ([Chunk((0,), (6,)), Chunk((4,), (6,))], "[0:6] and [4:10] overlap"),
    "beyond": ([Chunk((0,), (5,)), Chunk((5,), (7,))], "[5:12] reaches beyond the tensor"),
}


@pytest.mark.parametrize("name", list(BAD))
@pytest.mark.parametrize("mesh", [None, Mesh({"tp": 2})])
def test_chunks_no_layout_writes_are_an_error_naming_the_tensor_and_chunks(
    tmp_path: Path, name: str, mesh: Mesh | None
) -> None:
    chunks, why = BAD[name]
    good = saved_by(on(Mesh({"tp": 2}), S0), (4,), Mesh({"tp": 2}))
    path = write_metadata(tmp_path, {"good": good, "layers.0.w": ((10,), chunks, {})})
    with pytest.raises(PlanError) as info:
        table_from_dcp(path, mesh=mesh)
    (problem,) = info.value.problems
    assert problem.fqn == "layers.0.w"
    assert "layers.0.w: no layout of" in str(problem)
    assert str(chunks[0]) in str(problem) and str(chunks[1]) in str(problem)
    assert why in str(problem)


def test_non_tensor_entries_are_listed_apart(tmp_path: Path) -> None:
    w = saved_by(on(Mesh({"tp": 2}), S1), (2, 4), Mesh({"tp": 2}))
    path = write_metadata(tmp_path, {"w": w}, other=["step", "lr_scheduler.last_epoch"])
    got = table_from_dcp(path)
    assert isinstance(got, DcpLayouts)
    assert list(got.table) == ["w"] and list(got.shapes) == ["w"]
    assert got.skipped == ("step", "lr_scheduler.last_epoch")


def test_a_damaged_entry_is_an_error_naming_it(tmp_path: Path) -> None:
    damaged = TensorStorageMetadata(None, torch.Size([4]), [])  # type: ignore[arg-type]  # on purpose
    entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {"w": damaged}
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata=entries)))
    with pytest.raises(LayoutError, match=r"w: the checkpoint's metadata gives its properties\."):
        table_from_dcp(tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("table", {"w": None}),
        ("shapes", [1]),
        ("meshes", {"dense": {"tp": 2}}),
        ("skipped", "step"),
    ],
)
def test_dcp_layouts_checks_its_fields(field: str, value: object) -> None:
    fields: dict[str, object] = {
        "table": ParamLayoutTable({"w": on(Mesh({"tp": 2}), S0)}),
        "shapes": {"w": ParamShape((4,), "float32")},
        "meshes": {"dense": Mesh({"tp": 2})},
        "skipped": ("step",),
    }
    assert DcpLayouts(**fields).skipped == ("step",)  # type: ignore[arg-type]  # checked at run time
    fields[field] = value
    with pytest.raises(LayoutError, match=f"DcpLayouts.{field}"):
        DcpLayouts(**fields)  # type: ignore[arg-type]  # wrong on purpose


def test_storage_entries_of_other_forms_say_nothing_of_ranks(tmp_path: Path) -> None:
    """Entries whose index or file name is not ``FileSystemWriter``'s are no evidence."""
    layout, shape, mesh = KNOWN["rowwise"]
    _, chunks, _ = saved_by(layout, shape, mesh)
    path = write_metadata(tmp_path, {"w": (shape, chunks, {})})
    md = FileSystemReader(path).read_metadata()
    odd = MetadataIndex("w", torch.Size([0, 0]))
    object.__setattr__(odd, "offset", ("a",))  # offsets of no Size
    md.storage_data = {
        MetadataIndex("w", torch.Size([0, 0])): _StorageInfo("shard-0.bin", 0, 0),
        odd: _StorageInfo("__1_0.distcp", 0, 0),
        MetadataIndex("w", torch.Size([0, 3])): None,
        "w": None,
    }
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    assert table_from_dcp(path, mesh=mesh).table["w"] == layout


def test_roles_are_tried_in_order(tmp_path: Path) -> None:
    dense, expert = Mesh({"tp": 4}), Mesh({"ep": 2, "tp": 2})
    emb = saved_by(on(dense, S0), (8, 4), dense)
    w1 = saved_by(SourceLayout("expert", expert.names, [S0, S1]), (2, 4, 4), expert)
    path = write_metadata(tmp_path, {"emb": emb, "w1": w1})
    got = table_from_dcp(path, mesh={"dense": dense, "expert": expert})
    assert got.table["emb"] == SourceLayout("dense", ["tp"], [S0])
    assert got.table["w1"] == SourceLayout("expert", ["ep", "tp"], [S0, S1])
    # sizes by axis stand for a Mesh, as everywhere
    assert table_from_dcp(path, mesh={"dense": {"tp": 4}, "expert": {"ep": 2, "tp": 2}}) == got
    # the expert mesh first: the dense weight is written by it too (S(0) on both axes)
    swapped = table_from_dcp(path, mesh={"expert": expert, "dense": dense})
    assert swapped.table["emb"] == SourceLayout("expert", ["ep", "tp"], [S0, S0])


@pytest.mark.parametrize(
    ("mesh", "says"),
    [
        ("tp=2", "mesh must be a Mesh"),
        ({}, "mesh must be a Mesh"),
        ({"tp": 2}, "maps roles to meshes"),
        ({"dense": Mesh({"tp": 2}), "expert": Mesh({"ep": 4})}, "meshes of one size"),
        (Mesh({"tp": 2}), "files name rank 3"),
        (Mesh({"dp": 2**20, "tp": 4}), "more than the"),
    ],
)
def test_bad_meshes_are_errors(tmp_path: Path, mesh: object, says: str) -> None:
    w = saved_by(on(Mesh({"tp": 4}), S0), (8,), Mesh({"tp": 4}))
    path = write_metadata(tmp_path, {"w": w})
    with pytest.raises(LayoutError, match=says):
        table_from_dcp(path, mesh=mesh)  # type: ignore[arg-type]  # wrong on purpose


def test_a_directory_that_is_no_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="is not a directory"):
        table_from_dcp(tmp_path / "missing")
    with pytest.raises(LayoutError, match=r"has no \.metadata file"):
        table_from_dcp(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(LayoutError, match="could not be read"):
        table_from_dcp(tmp_path)
    with pytest.raises(LayoutError, match=r"table_from_dcp\(path=\.\.\.\) must be a file path"):
        table_from_dcp(3)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(LayoutError, match="cannot be read as a directory"):
        table_from_dcp("x" * 5000)  # longer than any file system takes
    with pytest.raises(LayoutError, match="holds a NUL character"):
        table_from_dcp("ckpt\0")


# ---------------------------------------------------------------------------------------
# checkpoints real ranks wrote


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Every checkpoint of ``dcp_runs.SAVES``, and each rank's report of the loads."""
    root = tmp_path_factory.mktemp("checkpoints")
    return root, on_gloo(dcp_runs.run, str(root), world_size=dcp_runs.WORLD_SIZE)


def over_mesh(layout: SourceLayout, mesh: Mesh) -> SourceLayout:
    """``layout`` over every axis of ``mesh``, R where it has none: as a checkpoint reads."""
    placements = {a.name: p for a, p in zip(layout.axes, layout.placements, strict=True)}
    return SourceLayout(layout.mesh, mesh.names, [placements.get(n, R) for n in mesh.names])


def recorded(path: Path) -> dict[str, tuple[Chunk, ...]]:
    md = FileSystemReader(str(path)).read_metadata()
    out: dict[str, tuple[Chunk, ...]] = {}
    for fqn, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue  # the step counter
        out[fqn] = tuple(sorted(Chunk(tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks))
    return out


SAVED_WELL = [name for name in dcp_runs.SAVES if name != "hazard"]


@pytest.mark.distributed
@pytest.mark.parametrize("name", SAVED_WELL)
def test_real_checkpoints_give_back_their_composed_layouts(
    written: tuple[Path, list[dict[str, Any]]], name: str
) -> None:
    root, _ = written
    case = dcp_runs.SAVES[name]
    expected = dcp_runs.composed(case)
    got = table_from_dcp(root / name, mesh=dict(case.meshes))
    assert got.table == ParamLayoutTable(
        {fqn: over_mesh(layout, case.meshes[layout.mesh]) for fqn, layout in expected.items()}
    )
    assert dict(got.shapes) == dcp_runs.shapes(case)
    assert dict(got.meshes) == dict(case.meshes)
    assert got.skipped == ("step",)
    # without the mesh: the same boxes, on meshes of the same world
    inferred = table_from_dcp(root / name)
    chunks = recorded(root / name)
    for fqn, layout in inferred.table.items():
        assert dcp_chunks(layout, case.shapes[fqn], inferred.meshes[layout.mesh]) == chunks[fqn]
    assert {m.size for m in inferred.meshes.values()} == {dcp_runs.WORLD_SIZE}
    if len(case.meshes) == 1:
        (mesh,) = case.meshes.values()
        assert [m.sizes for m in inferred.meshes.values()] == [mesh.sizes]
        assert [layout.placements for layout in inferred.table.values()] == [
            over_mesh(layout, mesh).placements for layout in expected.values()
        ]


@pytest.mark.distributed
@pytest.mark.parametrize("name", [n for n, job in dcp_runs.LOADS.items() if job.saved != "hazard"])
def test_reshard_plan_from_a_real_checkpoint_makes_torch_reads(
    written: tuple[Path, list[dict[str, Any]]], name: str
) -> None:
    root, ranks = written
    job = dcp_runs.LOADS[name]
    source = table_from_dcp(root / job.saved)
    plan = reshard_plan(
        source.table,
        dcp_runs.composed(job.into),
        source.shapes,
        src_sizes=source.meshes,
        dst_sizes=dict(job.into.meshes),
    )
    # the directory alone: its metadata gives the layouts, shapes and sizes
    from_dir = reshard_plan(
        root / job.saved, dcp_runs.composed(job.into), dst_sizes=dict(job.into.meshes)
    )
    assert from_dir.bytes_read == plan.bytes_read
    assert all(from_dir.reads(r) == plan.reads(r) for r in range(len(ranks)))
    for rank, report in enumerate(ranks):
        loaded = report[name]
        assert loaded["differ"] == [], (rank, loaded)  # the values are the saved ones
        theirs = sorted(
            tuple(tuple(v) if isinstance(v, list) else v for v in item) for item in loaded["reads"]
        )
        mine = sorted(
            (r.fqn, r.chunk.offsets, r.chunk.sizes, r.dest_offsets, r.storage_offsets, r.lengths)
            for r in plan.reads(rank)
        )
        assert mine == theirs, rank
        assert plan.bytes_read[rank] == sum(4 * math.prod(item[-1]) for item in theirs)  # float32


@pytest.mark.distributed
@pytest.mark.parametrize("mesh", [None, dcp_runs.SAVES["hazard"].meshes])
def test_the_uneven_strided_hazard_is_refused(
    written: tuple[Path, list[dict[str, Any]]], mesh: Mapping[str, Mesh] | None
) -> None:
    root, ranks = written
    # torch wrote it and loads it back without a word, but not the values it saved
    assert any(report["hazard_back"].get("differ") for report in ranks), ranks
    with pytest.raises(PlanError) as info:
        table_from_dcp(root / "hazard", mesh=None if mesh is None else dict(mesh))
    (problem,) = info.value.problems
    assert problem.fqn == "up"
    assert "hazard of uneven strided shards" in str(problem)
    assert "_S(0, 2)" in str(problem)


def test_reshard_plan_of_a_directory_reads_what_it_lacks_from_the_metadata(
    tmp_path: Path,
) -> None:
    layout, shape, mesh = KNOWN["strided-even"]
    path = write_metadata(tmp_path, {"w": saved_by(layout, shape, mesh)})
    dst = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [S0])})
    plan = reshard_plan(Path(path), dst, dst_sizes={"dense": {"tp": 2}})
    source = table_from_dcp(path)
    same = reshard_plan(
        source.table, dst, source.shapes, src_sizes=source.meshes, dst_sizes={"dense": {"tp": 2}}
    )
    assert plan.bytes_read == same.bytes_read == (32, 32)  # bfloat16 rows of 4
    assert plan.reads(1) == same.reads(1)
    with pytest.raises(LayoutError, match="no shapes given; give it, or give src as a checkpoint"):
        reshard_plan(dst, dst, dst_sizes={"dense": {"tp": 2}})
    with pytest.raises(LayoutError, match="no src_sizes given"):
        reshard_plan(dst, dst, source.shapes, dst_sizes={"dense": {"tp": 2}})
