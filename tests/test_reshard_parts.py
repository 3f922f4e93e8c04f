"""``reshard_plan(parts=...)``: a fused tensor saved and its parts loaded, or the reverse.

The reads are applied as torch's checkpoint reader applies a read item: the saved
chunk's storage is the local tensor of the rank DCP kept for that box (torch's own
``_split_tensor`` gives it), a box of that storage is copied into a box of the
destination's local shard. Every destination rank must end with the block torch's
placements give it of the true unfused (or fused) tensor, every element written once.
On real gloo ranks, DCP writes the checkpoint and its own reader executes the reads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import pytest
import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.tensor import distribute_tensor

from layout_algebra import (
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
)
from layout_algebra.checkpoint import Chunk, Read, reshard_plan
from layout_algebra.errors import LayoutError
from layout_algebra.torch_bridge import to_torch
from tests.torch_oracle import (
    MeshFactory,
    coordinates,
    dtensor_block,
    dtensor_shape_and_offset,
    on_gloo,
)

FUSED: Final = "mlp.gate_up_proj.weight"
GATE: Final = "mlp.gate_proj.weight"
UP: Final = "mlp.up_proj.weight"
PARTS: Final = {FUSED: {"gate": GATE, "up": UP}}
S0, S1, R = Shard(0), Shard(1), Replicate()


def on(axes: Mapping[str, object], *placements: Shard | Replicate | StridedShard) -> SourceLayout:
    return SourceLayout("dense", list(axes), placements)


def gate_up(rows: int, cols: int) -> ParamShape:
    return ParamShape(
        (2 * rows, cols), "float32", structure={0: Packed([Part("gate", rows), Part("up", rows)])}
    )


def rank_sizes(sizes: Mapping[str, int]) -> list[dict[str, int]]:
    return list(coordinates(list(sizes), sizes))


def saved_storage(
    full: torch.Tensor, layout: SourceLayout, sizes: Mapping[str, int]
) -> dict[tuple[int, ...], torch.Tensor]:
    """What DCP stores for ``full`` under ``layout``: each rank's local tensor, keyed by
    the offsets DTensor reports, the first rank of each offset kept."""
    out: dict[tuple[int, ...], torch.Tensor] = {}
    for at in rank_sizes(sizes):
        shape, offset = dtensor_shape_and_offset(full.shape, layout, sizes, at)
        block = dtensor_block(full, layout, sizes, at)
        assert tuple(block.shape) == tuple(shape)
        out.setdefault(tuple(offset), block)
    return out


def apply(
    reads: tuple[Read, ...],
    storages: Mapping[str, dict[tuple[int, ...], torch.Tensor]],
    dests: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The reads applied as torch's reader does; elements written twice stay NaN."""
    counts = {fqn: torch.zeros_like(t) for fqn, t in dests.items()}
    out = {fqn: t.clone() for fqn, t in dests.items()}
    for read in reads:
        assert read.dest_fqn is not None, read
        storage = storages[read.fqn][read.chunk.offsets]
        assert tuple(storage.shape) == read.chunk.sizes
        src = storage
        dst = out[read.dest_fqn]
        seen = counts[read.dest_fqn]
        for dim, (s, d, n) in enumerate(
            zip(read.storage_offsets, read.dest_offsets, read.lengths, strict=True)
        ):
            src = src.narrow(dim, s, n)
            dst = dst.narrow(dim, d, n)
            seen = seen.narrow(dim, d, n)
        dst.copy_(src)
        seen += 1
    for fqn, seen in counts.items():
        out[fqn][seen != 1] = float("nan")
    return out


def _fused_case(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, dict[str, ParamShape]]:
    """A random fused ``gate_up`` tensor of two ``rows x cols`` parts, and the shapes of
    it and its parts."""
    torch.manual_seed(seed)
    shapes = {FUSED: gate_up(rows, cols), GATE: ParamShape((rows, cols), "float32")}
    shapes[UP] = shapes[GATE]
    return torch.randn(2 * rows, cols), shapes


def check_split(
    size: tuple[int, int],
    src: tuple[SourceLayout, Mapping[str, int]],
    dst: tuple[SourceLayout, Mapping[str, int]],
    *,
    seed: int = 0,
) -> None:
    """The fused tensor saved under ``saved``, its parts loaded under ``loaded``."""
    (rows, cols), (saved, src_sizes), (loaded, dst_sizes) = size, src, dst
    full, shapes = _fused_case(rows, cols, seed)
    plan = reshard_plan(
        ParamLayoutTable({FUSED: saved}),
        ParamLayoutTable({GATE: loaded, UP: loaded}),
        shapes,
        src_sizes={"dense": src_sizes},
        dst_sizes={"dense": dst_sizes},
        parts=PARTS,
    )
    storages = {FUSED: saved_storage(full, saved, src_sizes)}
    truth = {GATE: full[:rows], UP: full[rows:]}
    for rank, at in enumerate(rank_sizes(dst_sizes)):
        local, _ = dtensor_shape_and_offset((rows, cols), loaded, dst_sizes, at)
        empty = {f: torch.full(local, float("nan")) for f in truth}
        got = apply(plan.reads(rank), storages, empty)
        for fqn, whole in truth.items():
            want = dtensor_block(whole, loaded, dst_sizes, at)
            assert torch.equal(got[fqn], want), (fqn, rank, str(saved), str(loaded))
        nbytes = sum(r.numel for r in plan.reads(rank)) * 4
        assert plan.bytes_read[rank] == nbytes


def check_fuse(
    size: tuple[int, int],
    src: tuple[SourceLayout, Mapping[str, int]],
    dst: tuple[SourceLayout, Mapping[str, int]],
    *,
    seed: int = 0,
) -> None:
    """The parts saved under ``saved``, the fused tensor loaded under ``loaded``."""
    (rows, cols), (saved, src_sizes), (loaded, dst_sizes) = size, src, dst
    full, shapes = _fused_case(rows, cols, seed)
    plan = reshard_plan(
        ParamLayoutTable({GATE: saved, UP: saved}),
        ParamLayoutTable({FUSED: loaded}),
        shapes,
        src_sizes={"dense": src_sizes},
        dst_sizes={"dense": dst_sizes},
        parts=PARTS,
    )
    storages = {
        GATE: saved_storage(full[:rows], saved, src_sizes),
        UP: saved_storage(full[rows:], saved, src_sizes),
    }
    for rank, at in enumerate(rank_sizes(dst_sizes)):
        local, _ = dtensor_shape_and_offset(full.shape, loaded, dst_sizes, at)
        got = apply(plan.reads(rank), storages, {FUSED: torch.full(local, float("nan"))})
        want = dtensor_block(full, loaded, dst_sizes, at)
        assert torch.equal(got[FUSED], want), (rank, str(saved), str(loaded))


def test_a_strided_fused_weight_loads_as_its_parts() -> None:
    tp = {"tp": 2}
    check_split((6, 4), (on(tp, StridedShard(0, split_factor=2)), tp), (on(tp, S0), tp))
    plan = reshard_plan(
        ParamLayoutTable({FUSED: on(tp, StridedShard(0, split_factor=2))}),
        ParamLayoutTable({GATE: on(tp, S0), UP: on(tp, S0)}),
        {FUSED: gate_up(6, 4), GATE: ParamShape((6, 4), "float32"), UP: ParamShape((6, 4), "F32")},
        src_sizes={"dense": tp},
        dst_sizes={"dense": tp},
        parts=PARTS,
    )
    # rank 1 holds gate rows 3:6 and up rows 3:6, the second half of each saved chunk's
    # first and second run: DCP records rank 1's chunk from its first row, 3
    assert [str(r) for r in plan.reads(1)] == [
        f"{FUSED}[3:6, 0:4] from chunk [3:9, 0:4] into {GATE}",
        f"{FUSED}[6:9, 0:4] from chunk [3:9, 0:4] into {UP}",
    ]
    assert plan.bytes_read == (96, 96)
    assert plan.chunks_read(GATE) == 2
    assert f"{FUSED} dense[tp=_S(0, 2)] -> dense[tp=S(0)]" in str(plan)


def test_parts_load_as_a_strided_fused_weight() -> None:
    tp = {"tp": 2}
    check_fuse((6, 4), (on(tp, S0), tp), (on(tp, StridedShard(0, split_factor=2)), tp))


LAYOUTS: Final = ("S0", "S1", "R", "SS")


def placement(kind: str, split: int) -> Shard | Replicate | StridedShard:
    if kind == "SS":
        return StridedShard(0, split_factor=split)
    plain: dict[str, Shard | Replicate] = {"S0": S0, "S1": S1, "R": R}
    return plain[kind]


@pytest.mark.parametrize("seed", range(150))
def test_random_sizes_and_layouts_read_the_rows_slicing_gives(seed: int) -> None:
    rng = random.Random(seed)
    rows, cols = rng.randint(1, 9), rng.randint(1, 5)
    src_sizes = {"a": rng.randint(1, 3), "b": rng.randint(1, 3)}
    dst_sizes = {"c": rng.randint(1, 4), "d": rng.randint(1, 2)}

    def pick(sizes: Mapping[str, int]) -> SourceLayout:
        return on(sizes, *(placement(rng.choice(LAYOUTS), rng.randint(2, 3)) for _ in sizes))

    fused, unfused = pick(src_sizes), pick(dst_sizes)
    check_split((rows, cols), (fused, src_sizes), (unfused, dst_sizes), seed=seed)
    fused, unfused = pick(dst_sizes), pick(src_sizes)
    check_fuse((rows, cols), (unfused, src_sizes), (fused, dst_sizes), seed=seed)


def test_other_parameters_are_read_as_before() -> None:
    tp = {"tp": 2}
    shapes = {
        FUSED: gate_up(2, 2),
        GATE: ParamShape((2, 2), "float32"),
        UP: ParamShape((2, 2), "float32"),
        "norm": ParamShape((2,), "float32"),
    }
    src = ParamLayoutTable({FUSED: on(tp, S0), "norm": on(tp, R)})
    dst = ParamLayoutTable({GATE: on(tp, S0), UP: on(tp, S0), "norm": on(tp, S0)})
    plan = reshard_plan(
        src, dst, shapes, src_sizes={"dense": tp}, dst_sizes={"dense": tp}, parts=PARTS
    )
    plain = [r for r in plan.reads(0) if r.dest_fqn is None]
    assert [str(r) for r in plain] == ["norm[0:1] from chunk [0:2]"]


def bad(parts: object, shapes: Mapping[str, ParamShape] | None = None) -> str:
    tp = {"tp": 2}
    given = shapes or {
        FUSED: gate_up(2, 2),
        GATE: ParamShape((2, 2), "float32"),
        UP: ParamShape((2, 2), "float32"),
    }
    with pytest.raises(LayoutError) as info:
        reshard_plan(
            ParamLayoutTable({FUSED: on(tp, S0)}),
            ParamLayoutTable({GATE: on(tp, S0), UP: on(tp, S0)}),
            given,
            src_sizes={"dense": tp},
            dst_sizes={"dense": tp},
            parts=parts,  # type: ignore[arg-type]  # wrong on purpose
        )
    return str(info.value)


def test_a_part_the_structure_lacks_is_an_error_naming_it() -> None:
    said = bad({FUSED: {"gate": GATE, "down": UP}})
    assert FUSED in said and "'down'" in said and "name one of ['gate', 'up']" in said


def test_a_part_of_another_shape_is_an_error() -> None:
    shapes = {
        FUSED: gate_up(2, 2),
        GATE: ParamShape((2, 2), "float32"),
        UP: ParamShape((3, 2), "float32"),
    }
    said = bad(PARTS, shapes)
    assert FUSED in said and "'up'" in said and "float32[2, 2]" in said
    assert "float32[3, 2]" in said and "its shape and dtype" in said


def test_a_fused_shape_without_structure_is_an_error() -> None:
    shapes = {
        FUSED: ParamShape((4, 2), "float32"),
        GATE: ParamShape((2, 2), "float32"),
        UP: ParamShape((2, 2), "float32"),
    }
    said = bad(PARTS, shapes)
    assert FUSED in said and "no dim packed" in said and "structure=" in said


@pytest.mark.parametrize(
    ("parts", "says"),
    [
        ([1], "parts must map a fused FQN"),
        ({FUSED: "gate"}, "must map part names to FQNs"),
        ({FUSED: {"gate": 3}}, "str to str"),
        ({"other": {"gate": GATE}}, "neither table"),
        ({FUSED: {"gate": "missing"}}, "which dst lacks"),
    ],
)
def test_parts_of_the_wrong_form_are_errors(parts: object, says: str) -> None:
    assert says in bad(parts)


def test_a_read_checks_its_dest_fqn() -> None:
    chunk = Chunk((0,), (2,))
    assert Read("w", chunk, (0,), (0,), (2,)).dest_fqn is None
    assert str(Read("w", chunk, (0,), (0,), (2,), "v")) == "w[0:2] from chunk [0:2] into v"
    with pytest.raises(LayoutError, match=r"Read\.dest_fqn"):
        Read("w", chunk, (0,), (0,), (2,), 3)  # type: ignore[arg-type]  # wrong on purpose


def test_loading_the_fused_tensor_needs_every_part() -> None:
    tp = {"tp": 2}
    with pytest.raises(LayoutError, match=r"\['up'\] name no tensor"):
        reshard_plan(
            ParamLayoutTable({GATE: on(tp, S0)}),
            ParamLayoutTable({FUSED: on(tp, S0)}),
            {FUSED: gate_up(2, 2), GATE: ParamShape((2, 2), "float32")},
            src_sizes={"dense": tp},
            dst_sizes={"dense": tp},
            parts={FUSED: {"gate": GATE}},
        )


# ---------------------------------------------------------------------------------------
# real ranks: DCP writes, DCP's reader executes the reads

WORLD_SIZE: Final = 4
ROWS: Final = 5
COLS: Final = 3
TP: Final = {"tp": 4}
STRIDED: Final = on(TP, StridedShard(0, split_factor=2))
ROWWISE: Final = on(TP, S0)


class PartsPlanner(DefaultLoadPlanner):
    """torch's load planner with the reads given in place of the ones it would make."""

    def __init__(self, reads: tuple[Read, ...]) -> None:
        super().__init__()
        self.reads = reads

    def create_local_plan(self) -> LoadPlan:
        return LoadPlan(
            [
                ReadItem(
                    type=LoadItemType.TENSOR,
                    dest_index=MetadataIndex(r.dest_fqn or r.fqn),
                    dest_offsets=torch.Size(r.dest_offsets),
                    storage_index=MetadataIndex(r.fqn, r.chunk.offsets),
                    storage_offsets=torch.Size(r.storage_offsets),
                    lengths=torch.Size(r.lengths),
                )
                for r in self.reads
            ]
        )


def real_shapes() -> dict[str, ParamShape]:
    return {
        FUSED: gate_up(ROWS, COLS),
        GATE: ParamShape((ROWS, COLS), "float32"),
        UP: ParamShape((ROWS, COLS), "float32"),
    }


def scenario(rank: int, root: str) -> list[str]:
    """One rank: save the fused weight (then the parts), load the other form by the reads.

    DCP refuses to save a ``_S(0, 2)`` shard of ``[gate | up]`` on tensor parallel ranks
    alone (each rank's rows are apart, and the boxes it would record overlap), so the
    fused weight is saved row-wise: 10 rows over 4 ranks, one chunk across the parts'
    boundary. Loaded fused, it is ``_S(0, 2)``.
    """
    failures: list[str] = []
    torch.manual_seed(0)
    full = torch.randn(2 * ROWS, COLS)
    gate, up = full[:ROWS].contiguous(), full[ROWS:].contiguous()
    mesh = MeshFactory(WORLD_SIZE)(TP)
    strided = [to_torch(p) for p in STRIDED.placements]
    rowwise = [to_torch(p) for p in ROWWISE.placements]
    at = {"tp": rank}
    sizes = {"dense": TP}

    # fused saved row-wise, the parts loaded row-wise
    saved = distribute_tensor(full, mesh, rowwise, src_data_rank=None)
    save({FUSED: saved}, checkpoint_id=f"{root}/fused")
    plan = reshard_plan(
        ParamLayoutTable({FUSED: ROWWISE}),
        ParamLayoutTable({GATE: ROWWISE, UP: ROWWISE}),
        real_shapes(),
        src_sizes=sizes,
        dst_sizes=sizes,
        parts=PARTS,
    )
    local, _ = dtensor_shape_and_offset((ROWS, COLS), ROWWISE, TP, at)
    loaded = {GATE: torch.full(local, float("nan")), UP: torch.full(local, float("nan"))}
    load(loaded, checkpoint_id=f"{root}/fused", planner=PartsPlanner(plan.reads(rank)))
    for fqn, whole in ((GATE, gate), (UP, up)):
        want = distribute_tensor(whole, mesh, rowwise, src_data_rank=None).to_local()
        if not torch.equal(loaded[fqn], want):
            failures.append(f"rank {rank}: {fqn} loaded from the fused weight differs")

    # the parts saved row-wise, the fused weight loaded under _S(0, 2)
    parts = {
        GATE: distribute_tensor(gate, mesh, rowwise, src_data_rank=None),
        UP: distribute_tensor(up, mesh, rowwise, src_data_rank=None),
    }
    save(parts, checkpoint_id=f"{root}/parts")
    plan = reshard_plan(
        ParamLayoutTable({GATE: ROWWISE, UP: ROWWISE}),
        ParamLayoutTable({FUSED: STRIDED}),
        real_shapes(),
        src_sizes=sizes,
        dst_sizes=sizes,
        parts=PARTS,
    )
    want = distribute_tensor(full, mesh, strided, src_data_rank=None).to_local()
    fused = {FUSED: torch.full(want.shape, float("nan"))}
    load(fused, checkpoint_id=f"{root}/parts", planner=PartsPlanner(plan.reads(rank)))
    if not torch.equal(fused[FUSED], want):
        failures.append(f"rank {rank}: the fused weight loaded from its parts differs")
    return failures


@pytest.mark.distributed
def test_dcp_checkpoints_convert_between_fused_and_parts_bit_for_bit(tmp_path: Path) -> None:
    results = on_gloo(scenario, str(tmp_path), world_size=WORLD_SIZE)
    assert results == [[]] * WORLD_SIZE
