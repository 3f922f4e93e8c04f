"""Reading a checkpoint runs nothing from it, and what torch never writes is refused.

A DCP ``.metadata`` is a pickle, which may name any callable to rebuild its objects. The
payloads here name ``os.system`` (a command that would create a marker file), at the top
of the file and nested inside otherwise ordinary metadata; every reader of the package
and every command that takes a checkpoint directory must refuse them, naming the file
and the refused ``module.name``, with the marker never created. Real checkpoints read as
torch's own reader reads them: every tensor's shape, dtype and boxes, field by field.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.state_dict_saver import save

import layout_algebra.dcp as dcp_module
from layout_algebra import (
    Chunk,
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    local_shape_and_offset,
    reshard_plan,
)
from layout_algebra._dcp_pickle import load_metadata
from layout_algebra.cli import main
from layout_algebra.dcp import DcpLayouts, table_from_dcp
from layout_algebra.mesh import MAX_WORLD
from layout_algebra.serialization import plan_to_json, to_json
from layout_algebra.torch_bridge import table_from_dcp as bridge_table_from_dcp
from tests.test_table_from_dcp import on, saved_by, write_metadata

ROOT: Final = Path(__file__).resolve().parent.parent
TP2: Final = Mesh({"tp": 2})


class Payload:
    """An object whose pickle runs ``touch MARKER`` when a standard reader loads it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def good_metadata() -> Metadata:
    """Ordinary metadata: one tensor sharded over two ranks, a counter beside it."""
    chunks = [((0, 0), (2, 4)), ((2, 0), (2, 4))]
    return Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.float32),
                torch.Size([4, 4]),
                [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks],
            ),
            "step": BytesStorageMetadata(),
        },
        storage_data={
            MetadataIndex("w", torch.Size(o)): _StorageInfo(f"__{r}_0.distcp", 0, 64)
            for r, (o, _) in enumerate(chunks)
        },
    )


def top_level(marker: Path) -> object:
    return Payload(marker)


def in_planner_data(marker: Path) -> object:
    md = good_metadata()
    md.planner_data = {"w": ("w",), "hook": [Payload(marker)]}
    return md


def in_a_chunk(marker: Path) -> object:
    md = good_metadata()
    entry = md.state_dict_metadata["w"]
    assert isinstance(entry, TensorStorageMetadata)
    entry.chunks[1].offsets = Payload(marker)  # type: ignore[assignment]  # the attack
    return md


def in_storage(marker: Path) -> object:
    md = good_metadata()
    md.storage_data[MetadataIndex("w", torch.Size([0, 0]))] = Payload(marker)
    return md


PAYLOADS: Final = {
    "top-level": top_level,
    "planner-data": in_planner_data,
    "chunk-offsets": in_a_chunk,
    "storage-record": in_storage,
}


@pytest.fixture(params=list(PAYLOADS))
def crafted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A checkpoint directory whose ``.metadata`` carries a payload, and its marker."""
    marker = tmp_path / "ran"
    where = tmp_path / "ckpt"
    where.mkdir()
    (where / ".metadata").write_bytes(pickle.dumps(PAYLOADS[request.param](marker)))
    yield where, marker
    assert not marker.exists(), "the payload ran"


def test_the_payloads_do_run_under_a_standard_reader(tmp_path: Path) -> None:
    """The test's premise: torch's own reader runs them."""
    for name, make in PAYLOADS.items():
        marker = tmp_path / f"ran-{name}"
        where = tmp_path / name
        where.mkdir()
        (where / ".metadata").write_bytes(pickle.dumps(make(marker)))
        # a payload where torch expects a Size may break its reader after it ran
        with contextlib.suppress(Exception):
            FileSystemReader(str(where)).read_metadata()
        assert marker.exists(), name


def refused(error: BaseException | str, where: Path) -> None:
    text = str(error)
    assert "'posix.system'" in text or "'os.system'" in text, text
    assert str(where / ".metadata") in text
    assert "nothing in the file was run" in text


@pytest.mark.parametrize("reader", [table_from_dcp, bridge_table_from_dcp])
def test_table_from_dcp_refuses_the_payload(
    crafted: tuple[Path, Path], reader: Callable[..., object]
) -> None:
    where, _ = crafted
    with pytest.raises(LayoutError) as info:
        reader(where)
    refused(info.value, where)
    with pytest.raises(LayoutError) as info:
        reader(where, mesh=TP2)
    refused(info.value, where)


def test_reshard_plan_refuses_the_payload(crafted: tuple[Path, Path]) -> None:
    where, _ = crafted
    dst = ParamLayoutTable({"w": on(TP2, Shard(0))})
    with pytest.raises(LayoutError) as info:
        reshard_plan(where, dst, dst_sizes={"dense": TP2})
    refused(info.value, where)


def files(tmp_path: Path) -> dict[str, str]:
    table = ParamLayoutTable({"w": on(TP2, Shard(0))})
    plan = ShardingPlan({"": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    (tmp_path / "t.json").write_text(to_json(table))
    (tmp_path / "plan.json").write_text(plan_to_json(plan))
    return {"table": str(tmp_path / "t.json"), "plan": str(tmp_path / "plan.json")}


COMMANDS: Final = {
    "reshard": ["reshard", "{ckpt}", "{table}", "--to-mesh", "tp=2"],
    "reshard-on-mesh": ["reshard", "{ckpt}", "{table}", "--mesh", "tp=2", "--to-mesh", "tp=2"],
    "diff": ["diff", "{ckpt}", "{table}", "--mesh", "tp=2"],
    "lint-shapes": ["lint", "{table}", "--shapes", "{ckpt}", "--mesh", "tp=2"],
    "check-fqns": ["check", "{plan}", "--mesh", "tp=2", "--fqns", "{ckpt}"],
    "table-fqns": ["table", "{plan}", "--mesh", "tp=2", "--fqns", "{ckpt}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_the_payload(
    crafted: tuple[Path, Path],
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    where, _ = crafted
    given = {**files(tmp_path), "ckpt": str(where)}
    code = main([arg.format(**given) for arg in COMMANDS[command]])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1, err
    refused(err, where)


def test_a_refused_checkpoint_imports_no_torch(tmp_path: Path) -> None:
    """In a fresh interpreter: the refusal needs no torch, and nothing of it is run."""
    marker = tmp_path / "ran"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(in_planner_data(marker)))
    script = f"""
import sys
from layout_algebra import LayoutError
from layout_algebra.dcp import DcpLayouts, table_from_dcp
try:
    table_from_dcp({str(tmp_path)!r})
except LayoutError as e:
    print(e)
assert "torch" not in sys.modules, "torch was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    refused(done.stdout, tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("builtins.eval", "'builtins.eval'"),
        ("torch.load", "'torch.load'"),
        ("copyreg._reconstructor", "'copyreg._reconstructor'"),
        ("torch.distributed.checkpoint.metadata.__builtins__", "__builtins__"),
    ],
)
def test_any_other_name_is_refused_before_it_is_looked_up(
    tmp_path: Path, name: str, words: str
) -> None:
    """A protocol-4 pickle that names one global (``STACK_GLOBAL``) and stops."""
    module, _, attr = name.rpartition(".")
    data = b"\x80\x04\x8c" + bytes([len(module)]) + module.encode()
    data += b"\x8c" + bytes([len(attr)]) + attr.encode() + b"\x93."
    (tmp_path / ".metadata").write_bytes(data)
    with pytest.raises(LayoutError, match=words):
        table_from_dcp(tmp_path)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "could not be read"),
        (b"\x80\x04K\x03.", "holds no DCP Metadata"),
        (pickle.dumps(good_metadata())[:-20], "could not be read"),
        (b"\x80\x04" + b"(" * 200_000 + b".", "could not be read"),
    ],
    ids=["empty", "an-int", "truncated", "deep"],
)
def test_damaged_metadata_is_one_error(tmp_path: Path, data: bytes, words: str) -> None:
    (tmp_path / ".metadata").write_bytes(data)
    with pytest.raises(LayoutError, match=words):
        table_from_dcp(tmp_path)


def test_a_metadata_that_is_no_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".metadata")
    with pytest.raises(LayoutError, match="FIFO"):
        load_metadata(str(tmp_path / ".metadata"))


# ---------------------------------------------------------------------------------------
# what torch never writes


def with_entry(tmp_path: Path, fqn: object, entry: object) -> Path:
    md = good_metadata()
    md.state_dict_metadata = {fqn: entry}  # type: ignore[dict-item]  # on purpose
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    return tmp_path


def tensor(size: Any = (4,), offsets: Any = (0,), sizes: Any = (4,), dtype: Any = None) -> Any:
    chunk = ChunkStorageMetadata(torch.Size([0]), torch.Size([4]))
    chunk.offsets, chunk.sizes = offsets, sizes
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4]), [chunk])
    entry.size = size
    if dtype is not None:
        entry.properties.dtype = dtype
    return entry


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (tensor(size=(4.0,)), "size"),
        (tensor(size=(True,)), "size"),
        (tensor(size=("4",)), "size"),
        (tensor(size=[4]), "size"),
        (tensor(size=(-4,)), "size"),
        (tensor(offsets=(0.0,)), r"chunks\[0\].offsets"),
        (tensor(offsets=(False,)), r"chunks\[0\].offsets"),
        (tensor(sizes=("4",)), r"chunks\[0\].sizes"),
        (tensor(dtype="float32"), "properties.dtype"),
        (tensor(offsets=(0, 0)), "chunk 0 has 2 offsets"),
    ],
    ids=[
        "float-size",
        "bool-size",
        "str-size",
        "list-size",
        "negative-size",
        "float-offset",
        "bool-offset",
        "str-chunk-size",
        "str-dtype",
        "offsets-of-another-rank",
    ],
)
def test_fields_torch_never_writes_are_refused_naming_tensor_and_field(
    tmp_path: Path, entry: object, field: str
) -> None:
    with pytest.raises(LayoutError, match=rf"^w: .*{field}") as info:
        table_from_dcp(with_entry(tmp_path, "w", entry))
    assert info.value.fqn == "w"


@pytest.mark.parametrize("fqn", [3, b"w", None, ("w",)])
def test_an_fqn_of_no_str_is_refused(tmp_path: Path, fqn: object) -> None:
    with pytest.raises(LayoutError, match="which is no FQN"):
        table_from_dcp(with_entry(tmp_path, fqn, tensor()))


def test_a_writer_beyond_the_world_bound_is_an_error(tmp_path: Path) -> None:
    md = good_metadata()
    md.storage_data = {
        MetadataIndex("w", torch.Size([0, 0])): _StorageInfo(f"__{MAX_WORLD}_0.distcp", 0, 64)
    }
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    for mesh in (None, Mesh({"tp": 4})):
        with pytest.raises(LayoutError, match=f"rank {MAX_WORLD:,}, beyond"):
            table_from_dcp(tmp_path, mesh=mesh)
    # the same with assertions off: no assert stood for the check
    script = f"""
from layout_algebra import LayoutError
from layout_algebra.dcp import DcpLayouts, table_from_dcp
try:
    table_from_dcp({str(tmp_path)!r})
except LayoutError as e:
    print("LayoutError:", e)
"""
    done = subprocess.run(
        [sys.executable, "-O", "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("LayoutError: w: ")


# ---------------------------------------------------------------------------------------
# real checkpoints read as torch reads them


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_saved_checkpoint_reads_as_torchs_reader_reads_it(tmp_path: Path) -> None:
    """Every entry of a ``dcp.save`` directory (one process): its shape, dtype and boxes
    as torch's reader gives them, its bytes entries skipped."""
    state = {
        "w": torch.zeros(4, 6, dtype=torch.bfloat16),
        "b": torch.zeros(6),
        "n": torch.zeros((), dtype=torch.int64),
        "step": 7,
        "extra": {"names": ["a", "b"]},
    }
    save(state, checkpoint_id=str(tmp_path), no_dist=True)
    torch_md = FileSystemReader(str(tmp_path)).read_metadata()
    got = table_from_dcp(tmp_path)
    tensors = {
        fqn: md
        for fqn, md in torch_md.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    assert list(got.shapes) == list(tensors)
    for fqn, md in tensors.items():
        assert got.shapes[fqn].shape == tuple(md.size)
        assert got.shapes[fqn].dtype == str(md.properties.dtype).removeprefix("torch.")
        mesh = got.meshes[got.table[fqn].mesh]
        from layout_algebra import dcp_chunks  # noqa: PLC0415

        assert dcp_chunks(got.table[fqn], md.size, mesh) == tuple(
            sorted(Chunk(c.offsets, c.sizes) for c in md.chunks)
        )
    assert set(got.skipped) == set(torch_md.state_dict_metadata) - set(tensors)


# ---------------------------------------------------------------------------------------
# the work of a refusal


def ragged(tmp_path: Path, n: int, *, last: int = 3, first: int = 3) -> Path:
    """``n`` boxes of a 1-D tensor of 3 rows each but the first and the last."""
    lengths = [first, *[3] * (n - 2), last]
    starts = [sum(lengths[:i]) for i in range(n)]
    chunks = [Chunk((o,), (size,)) for o, size in zip(starts, lengths, strict=True)]
    writers = {c: rank for rank, c in enumerate(chunks)}
    return Path(write_metadata(tmp_path, {"w": ((sum(lengths),), chunks, writers)}))


def even(tmp_path: Path, n: int) -> Path:
    chunks = [Chunk((4 * i,), (4,)) for i in range(n)]
    writers = {c: rank for rank, c in enumerate(chunks)}
    return Path(write_metadata(tmp_path, {"w": ((4 * n,), chunks, writers)}))


class Counted:
    """Counts the calls of one function of ``layout_algebra.dcp`` and the largest chain."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls = 0
        self.largest = 0
        inner = getattr(dcp_module, name)

        def counted(n: int, chain: tuple[tuple[str, int, int], ...]) -> object:
            self.calls += 1
            ranks = 1
            for _, size, _ in chain:
                ranks *= size
            self.largest = max(self.largest, ranks)
            return inner(n, chain)

        monkeypatch.setattr(dcp_module, name, counted)


def test_a_ragged_split_is_refused_without_working_out_a_dim_rank_by_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first box longer than the rest, as torch.chunk's is, but of no split: every mesh
    of 16 worlds is tried, each chain judged by its end boxes, and no dim's boxes are
    worked out rank by rank for a split its ends already rule out."""
    boxes = Counted(monkeypatch, "saved_boxes")
    with pytest.raises(PlanError, match="no layout of any mesh of 1024 to 1039 ranks"):
        table_from_dcp(ragged(tmp_path / "ragged", 1024, first=4))
    assert boxes.calls <= 8  # of the hundreds of chains tried
    refused = boxes.calls
    table_from_dcp(even(tmp_path / "even", 1024))
    assert boxes.calls == refused + 1


def test_a_piece_longer_than_the_first_is_refused_with_no_mesh_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = Counted(monkeypatch, "_end_boxes")
    with pytest.raises(PlanError, match="rows 3069:3074 are a longer piece than the first"):
        table_from_dcp(ragged(tmp_path, 1024, last=5))
    assert ends.calls == 0


def test_boxes_that_are_no_grid_are_refused_before_any_mesh_is_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends = Counted(monkeypatch, "_end_boxes")
    # 2-D boxes whose rows and columns do not form a product, many of them
    chunks = [Chunk((i, 0), (1, 2)) for i in range(600)] + [Chunk((600, 0), (1, 1))]
    chunks.append(Chunk((600, 1), (1, 1)))
    path = write_metadata(tmp_path, {"w": ((601, 2), chunks, {})})
    with pytest.raises(PlanError, match="not the product of each dim's pieces"):
        table_from_dcp(path)
    assert ends.calls == 0


def test_a_few_ranks_read_under_a_huge_mesh_work_out_no_huge_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 4-rank checkpoint read on a legal 2**20-rank mesh: the chains over the huge axis
    are ruled out by their end boxes, never followed rank by rank."""
    mesh = Mesh({"dp": 2**18, "tp": 4})
    layout = SourceLayout("dense", ["dp", "tp"], [Replicate(), Shard(0)])
    boxes = Counted(monkeypatch, "saved_boxes")
    path = write_metadata(
        tmp_path, {"w": saved_by(on(Mesh({"tp": 4}), Shard(0)), (8, 4), Mesh({"tp": 4}))}
    )
    assert table_from_dcp(path, mesh=mesh).table["w"] == layout
    assert boxes.largest <= 4


# ---------------------------------------------------------------------------------------
# reshard_plan of a checkpoint directory


def saved_checkpoint(tmp_path: Path) -> tuple[Path, Mesh]:
    """A ``.metadata`` of ``w`` (8 x 4) saved ``S(0)`` over ``tp=4`` and ``b`` replicated."""
    mesh = Mesh({"tp": 4})
    w = saved_by(on(mesh, Shard(0)), (8, 4), mesh)
    b = saved_by(on(mesh, Replicate()), (4,), mesh)
    return Path(write_metadata(tmp_path, {"w": w, "b": b})), mesh


def test_shapes_that_contradict_the_checkpoint_are_refused(tmp_path: Path) -> None:
    path, _ = saved_checkpoint(tmp_path)
    dst = ParamLayoutTable({"w": on(TP2, Shard(0)), "b": on(TP2, Replicate())})
    wrong = {"w": ParamShape((80, 4), "bfloat16"), "b": ParamShape((4,), "float32")}
    with pytest.raises(PlanError) as info:
        reshard_plan(path, dst, wrong, dst_sizes={"dense": TP2})
    assert [p.fqn for p in info.value.problems] == ["w", "b"]
    assert "shapes gives bfloat16[80, 4], but the checkpoint holds" in str(info.value)
    agreeing = {"w": ParamShape((8, 4), "bfloat16")}
    assert reshard_plan(path, dst, agreeing, dst_sizes={"dense": TP2}) == reshard_plan(
        path, dst, dst_sizes={"dense": TP2}
    )


def test_the_saving_mesh_names_a_checkpoints_axes(tmp_path: Path) -> None:
    path, mesh = saved_checkpoint(tmp_path)
    dst = ParamLayoutTable({"w": on(TP2, Shard(1)), "b": on(TP2, Replicate())})
    named = reshard_plan(path, dst, src_sizes={"dense": mesh}, dst_sizes={"dense": TP2})
    inferred = reshard_plan(path, dst, dst_sizes={"dense": TP2})
    assert named.bytes_read == inferred.bytes_read
    assert [str(r) for r in named.reads(1)] == [str(r) for r in inferred.reads(1)]
    with pytest.raises(PlanError, match="no layout of dense"):
        reshard_plan(path, dst, src_sizes={"dense": {"tp": 8}}, dst_sizes={"dense": TP2})


@pytest.mark.parametrize("given", [1, {"w": 1}])
def test_shard_dim_without_fsdp_is_refused(tmp_path: Path, given: object) -> None:
    path, _ = saved_checkpoint(tmp_path)
    dst = ParamLayoutTable({"w": on(TP2, Shard(0)), "b": on(TP2, Replicate())})
    for src in (path, dst):
        with pytest.raises(LayoutError, match=r"shard_dim=.* only fsdp= composes"):
            reshard_plan(
                src,
                dst,
                {"w": ParamShape((8, 4), "bfloat16"), "b": ParamShape((4,), "bfloat16")},
                src_sizes=None if src == path else {"dense": TP2},
                dst_sizes={"dense": TP2},
                shard_dim=given,  # type: ignore[arg-type]  # both forms are taken
            )


@given(
    n=st.integers(0, 400),
    sizes=st.lists(st.integers(2, 9), min_size=1, max_size=4),
    strided=st.booleans(),
)
def test_the_first_and_end_boxes_of_a_chain_are_the_geometrys(
    n: int, sizes: list[int], strided: bool
) -> None:
    """The search's arithmetic for the chains it makes (``Shard``s, FSDP2's ``_S(d, k)``
    first) against ``local_shape_and_offset`` of the same layout."""
    strided = strided and len(sizes) > 1
    later = math.prod(sizes[1:])
    chain = tuple(
        (f"a{i}", size, later if strided and i == 0 else 1) for i, size in enumerate(sizes)
    )
    layout = SourceLayout(
        "dense",
        [a for a, _, _ in chain],
        [Shard(0) if k == 1 else StridedShard(0, split_factor=k) for _, _, k in chain],
    )
    mesh = {a: size for a, size, _ in chain}
    indices = ([0] * len(sizes), [*[0] * (len(sizes) - 1), 1], [s - 1 for s in sizes])
    want = []
    for index in indices:
        (length,), (offset,) = local_shape_and_offset(
            (n,), layout, mesh, dict(zip(mesh, index, strict=True))
        )
        want.append((offset, length))
    assert dcp_module._end_boxes(n, chain) == tuple(want)
    assert dcp_module._first_length(n, chain) == want[0][1]


def test_dcp_layouts_names_a_bad_call_and_is_never_rewritten() -> None:
    empty = ParamLayoutTable({})
    with pytest.raises(LayoutError, match="needs the argument 'table'"):
        DcpLayouts()  # type: ignore[call-arg]  # on purpose
    got = DcpLayouts(empty, {}, {"dense": TP2})
    before = hash(got)
    with pytest.raises(LayoutError, match="immutable"):
        got.__init__(empty, {}, {}, ("step",))  # type: ignore[misc]  # on purpose
    assert (hash(got), got.meshes["dense"], got.skipped) == (before, TP2, ())


def test_a_bare_mesh_is_the_dense_roles_sizes(tmp_path: Path) -> None:
    path, mesh = saved_checkpoint(tmp_path)
    dst = ParamLayoutTable({"w": on(TP2, Shard(1)), "b": on(TP2, Replicate())})
    by_role = reshard_plan(path, dst, src_sizes={"dense": mesh}, dst_sizes={"dense": TP2})
    bare = reshard_plan(path, dst, src_sizes=mesh, dst_sizes=TP2)
    assert bare == by_role
    expert = ParamLayoutTable({"w": SourceLayout("expert", ["tp"], [Shard(0)])})
    with pytest.raises(PlanError, match="expert"):
        reshard_plan(path, expert, dst_sizes=TP2)
