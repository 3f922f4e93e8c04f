"""The draw renderer: pictures of which rank holds which block, read back cell by cell.

Each picture is parsed back into the set of elements every rank holds and compared with
what torch's own placements cut out of an index tensor on every rank of the mesh (and,
with FSDP, with the placements torch's ``fully_shard`` really gives the parameter).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Shard as TorchShard
from torch.distributed.tensor.placement_types import _StridedShard

from layout_algebra import LayoutError, Replicate, Shard, SourceLayout, StridedShard
from layout_algebra._text import columns, escape
from layout_algebra.draw import draw
from layout_algebra.mesh import Mesh
from layout_algebra.mesh import coordinates as rank_coordinates
from layout_algebra.torch_bridge import to_torch
from tests.torch_oracle import (
    MeshFactory,
    coordinates,
    dtensor_indices,
    dtensor_shape_and_offset,
    fully_sharded,
    layout_of,
)

S0, S1, R = Shard(0), Shard(1), Replicate()
WO = SourceLayout("dense", ["tp"], [S1])
EMB = SourceLayout("dense", ["tp"], [S0])
NORM = SourceLayout("dense", ["tp"], [R])
EXPERT = SourceLayout("expert", ["ep", "tp"], [S0, S1])


def parse_ranks(text: str) -> set[int]:
    """``"0-2,5"`` → ``{0, 1, 2, 5}``."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def parse_span(text: str) -> range:
    lo, hi = text.split(":")
    return range(int(lo), int(hi))


def read_picture(out: str, ndim: int) -> tuple[dict[int, set[tuple[int, ...]]], set[int]]:
    """Which elements each rank holds according to the picture, and the ranks not drawn."""
    lines = out.splitlines()
    first_rule = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("+"))
    cols = [parse_span(t) for t in lines[first_rule - 1].split()]
    held: dict[int, set[tuple[int, ...]]] = {}
    for ln in lines[first_rule:]:
        if "|" not in ln:
            if not ln.lstrip().startswith("+"):
                break
            continue
        label, *cells, _ = ln.split("|")
        rows = [parse_span(label.strip())] if ndim == 2 else [range(1)]
        assert len(cells) == len(cols)
        for col, cell in zip(cols, cells, strict=True):
            for rank in parse_ranks(cell.strip()):
                for i, j in itertools.product(rows[0], col):
                    held.setdefault(rank, set()).add((i, j) if ndim == 2 else (j,))
    empty: set[int] = set()
    m = re.search(r"^not drawn: ranks? (\S+) holds? an empty shard", out, re.MULTILINE)
    if m:
        empty = parse_ranks(m.group(1))
    return held, empty


def torch_blocks(
    shape: Sequence[int], sizes: Mapping[str, int], layout: SourceLayout
) -> list[tuple[set[tuple[int, ...]], tuple[int, ...], tuple[int, ...]]]:
    """Per rank (row-major over ``sizes``): the elements torch's placements give it, and
    DTensor's local shape and offset for its coordinate."""
    out = []
    for at in coordinates(list(sizes), sizes):
        elements = set(itertools.product(*dtensor_indices(shape, layout, sizes, at)))
        out.append((elements, *dtensor_shape_and_offset(shape, layout, sizes, at)))
    return out


def legend(out: str, ranks: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each rank's local shape and offset, as the legend below the picture states them."""
    rows = []
    for rank in range(ranks):
        m = re.search(rf"^{rank} .*?(\([0-9, ]*\)) +(\([0-9, ]*\))", out, re.MULTILINE)
        assert m is not None, rank
        rows.append((eval_tuple(m.group(1)), eval_tuple(m.group(2))))
    return rows


def eval_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip("()").split(",") if x.strip())


def assert_picture_matches_torch(
    out: str,
    shape: Sequence[int],
    sizes: Mapping[str, int],
    layout: SourceLayout,
) -> None:
    held, empty = read_picture(out, len(shape))
    expected = torch_blocks(shape, sizes, layout)
    for rank, (elements, local, offset) in enumerate(expected):
        assert held.get(rank, set()) == elements, rank
        assert (rank in empty) == (not elements), rank
        assert (local, offset) == legend(out, len(expected))[rank], rank


def test_draw_2d_even(world_mesh: MeshFactory) -> None:
    sizes = {"dp_shard": 2, "tp": 4}
    out = draw(WO, (16, 8), sizes, fqn="layers.0.wo.weight")
    assert out.startswith("layers.0.wo.weight: shape (16, 8) on mesh (dp_shard=2, tp=4)\n")
    assert "layout dense[tp=S(1)]" in out
    # tp cuts the columns; ranks differing only in dp_shard hold the same block
    assert "| 0,4 | 1,5 | 2,6 | 3,7 |" in out
    assert_picture_matches_torch(out, (16, 8), sizes, WO)

    # rank 0's block agrees with DTensor on a real mesh of the fake process group
    assert legend(out, 8)[0] == compute_local_shape_and_global_offset(
        (16, 8), world_mesh(sizes), [to_torch(R), to_torch(S1)]
    )


def test_draw_2d_blocks_with_fsdp(world_mesh: MeshFactory) -> None:
    sizes = {"dp_shard": 2, "tp": 4}
    out = draw(WO, (16, 8), sizes, fqn="wo", fsdp="dp_shard")
    composed = layout_of(fully_sharded(world_mesh(sizes), WO, (16, 8), shard="dp_shard"))
    assert [a.name for a in composed.axes] == ["dp_shard", "tp"]
    assert "with FSDP over 'dp_shard': dense[dp_shard=S(0), tp=S(1)]" in out
    assert_picture_matches_torch(out, (16, 8), sizes, composed)
    held, empty = read_picture(out, 2)
    assert not empty and all(len(e) == 8 * 2 for e in held.values())


def test_draw_uneven_rows() -> None:
    # 10 rows over 4 ranks: 3, 3, 3, 1
    out = draw(EMB, (10, 8), {"tp": 4})
    labels = re.findall(r"^ *(\d+:\d+) \|", out, re.MULTILINE)
    assert labels == ["0:3", "3:6", "6:9", "9:10"]
    assert "not drawn" not in out
    assert_picture_matches_torch(out, (10, 8), {"tp": 4}, EMB)


def test_draw_leaves_out_empty_shards_and_says_so() -> None:
    # 2 rows over 4 ranks: 1, 1, 0, 0
    out = draw(EMB, (2, 3), {"tp": 4})
    assert "not drawn: ranks 2,3 hold an empty shard (local shape (0, 3))" in out
    held, empty = read_picture(out, 2)
    assert set(held) == {0, 1} and empty == {2, 3}
    assert_picture_matches_torch(out, (2, 3), {"tp": 4}, EMB)


def test_draw_of_a_tensor_without_elements_draws_nothing() -> None:
    out = draw(EMB, (3, 0), {"tp": 2})
    assert "(shape (3, 0) has no elements: nothing to draw)" in out
    assert "+" not in out
    expected = torch_blocks((3, 0), {"tp": 2}, EMB)
    assert legend(out, 2) == [(local, offset) for _, local, offset in expected]


def test_draw_strided_shards_under_fsdp(world_mesh: MeshFactory) -> None:
    # tp=4 cuts 10 rows 3, 3, 3, 1; FSDP over dp_shard=2 cuts each tp shard again, so
    # dp_shard's shards interleave with tp's: _S(0, 4), and rank 7 gets nothing
    sizes = {"dp_shard": 2, "tp": 4}
    out = draw(EMB, (10, 8), sizes, fsdp="dp_shard")
    w = fully_sharded(world_mesh(sizes), EMB, (10, 8), shard="dp_shard")
    assert w.device_mesh.mesh_dim_names == ("dp_shard", "tp")
    assert w.placements == (_StridedShard(0, split_factor=4), TorchShard(0))
    assert "dense[dp_shard=_S(0, 4), tp=S(0)]" in out
    assert "not drawn: rank 7 holds an empty shard (local shape (0, 8))" in out
    assert_picture_matches_torch(out, (10, 8), sizes, layout_of(w))


def test_draw_strided_expert_weight_across_two_source_axes(world_mesh: MeshFactory) -> None:
    # the expert mesh's ep and tp, FSDP over dp_shard: a 2-D slice of an expert weight
    sizes = {"dp_shard": 2, "ep": 2, "tp": 2}
    out = draw(EXPERT, (6, 5), sizes, fsdp="dp_shard")
    composed = layout_of(fully_sharded(world_mesh(sizes), EXPERT, (6, 5), shard="dp_shard"))
    assert [a.name for a in composed.axes] == list(sizes)
    assert_picture_matches_torch(out, (6, 5), sizes, composed)


def test_draw_1d(world_mesh: MeshFactory) -> None:
    sizes = {"dp_shard": 2, "tp": 4}
    out = draw(NORM, (10,), sizes, fsdp="dp_shard")
    assert "| 0-3 | 4-7  |" in out
    composed = layout_of(fully_sharded(world_mesh(sizes), NORM, (10,), shard="dp_shard"))
    assert_picture_matches_torch(out, (10,), sizes, composed)


def test_draw_with_a_mesh_axis_the_layout_lacks_replicates_over_it() -> None:
    out = draw(EMB, (4,), {"tp": 2, "sp": 3})
    assert "| 0-2 | 3-5 |" in out
    assert_picture_matches_torch(out, (4,), {"tp": 2, "sp": 3}, EMB)


@pytest.mark.parametrize(
    ("shape", "sizes", "fsdp", "needle"),
    [
        ((4, 4), {"dp_shard": 2}, None, "uses axis 'tp', which --mesh"),
        ((4, 4), {"tp": 2}, "dp", "--fsdp dp: no such axis"),
        ((4,), {"tp": 2, "dp": 2}, None, "S(1)"),  # S(1) on a 1-D tensor
    ],
)
def test_draw_refuses_what_it_cannot_draw(
    shape: tuple[int, ...], sizes: dict[str, int], fsdp: str | None, needle: str
) -> None:
    with pytest.raises(LayoutError) as e:
        draw(WO, shape, sizes, fqn="wo", fsdp=fsdp)
    assert needle in e.value.message


def test_mesh_coordinates_are_row_major_like_torchs_mesh(world_mesh: MeshFactory) -> None:
    sizes = {"a": 2, "b": 1, "c": 4}
    mesh = world_mesh(sizes)
    coords = list(rank_coordinates(Mesh(sizes)))
    assert len(coords) == mesh.size()
    for rank, coord in enumerate(coords):
        assert [int(i) for i in (mesh.mesh == rank).nonzero()[0]] == list(coord.values())
        assert tuple(coord.values()) == Mesh(sizes).coordinate(rank)


def test_draw_takes_a_mesh_as_it_takes_sizes() -> None:
    sizes = {"dp_shard": 2, "tp": 2}
    assert draw(WO, (4, 4), Mesh(sizes), fsdp="dp_shard") == draw(
        WO, (4, 4), sizes, fsdp="dp_shard"
    )


def test_columns_align_left_and_strip_the_right() -> None:
    assert columns([["a", "bb", "c"], ["ccc", "d", ""]]) == ["a    bb  c", "ccc  d"]
    assert columns([]) == []


# ---------------------------------------------------------------------------------------
# parameters of any rank, and plain parameters


def holds(out: str, ranks: int) -> list[list[set[int]]]:
    """Each rank's held indices per dim, as the ``holds`` column states them."""
    rows = []
    for rank in range(ranks):
        m = re.search(rf"^{rank} .*\) +((?:\[[0-9:+\[\]]*\](?: x )?)+)$", out, re.MULTILINE)
        assert m is not None, rank
        dims = []
        for part in m.group(1).split(" x "):
            runs = re.findall(r"\[(\d+):(\d+)\]", part)
            dims.append({i for lo, hi in runs for i in range(int(lo), int(hi))})
        rows.append(dims)
    return rows


def assert_every_dim_matches_torch(
    out: str, shape: Sequence[int], sizes: Mapping[str, int], layout: SourceLayout
) -> None:
    """The rank table's runs, local shape and offset equal torch's on every dim."""
    stated = holds(out, len(list(coordinates(list(sizes), sizes))))
    for rank, at in enumerate(coordinates(list(sizes), sizes)):
        indices = dtensor_indices(shape, layout, sizes, at)
        assert [set(ix) for ix in indices] == stated[rank], rank
    expected = [local_and_offset for _, *local_and_offset in torch_blocks(shape, sizes, layout)]
    assert [list(x) for x in legend(out, len(expected))] == expected


def test_draw_a_3d_expert_weight_by_its_sharded_dims(world_mesh: MeshFactory) -> None:
    # experts over ep, their hidden dim over tp, FSDP over dp_shard: dims 0 and 1 pictured
    sizes = {"dp_shard": 2, "ep": 2, "tp": 2}
    shape = (4, 6, 5)
    out = draw(EXPERT, shape, sizes, fqn="moe.experts.w1", fsdp="dp_shard")
    composed = layout_of(fully_sharded(world_mesh(sizes), EXPERT, shape, shard="dp_shard"))
    assert "the picture shows dims 0 and 1 of 3; every rank holds dim 2 whole" in out
    assert "rows down (dim 0), columns across (dim 1)" in out
    held, empty = read_picture(out, 2)
    for rank, at in enumerate(coordinates(list(sizes), sizes)):
        d0, d1, d2 = dtensor_indices(shape, composed, sizes, at)
        assert held.get(rank, set()) == set(itertools.product(d0, d1)), rank
        assert d2 == tuple(range(5))
    assert not empty
    assert_every_dim_matches_torch(out, shape, sizes, composed)


def test_draw_a_3d_weight_sharded_on_its_last_dim() -> None:
    layout = SourceLayout("dense", ["tp"], [Shard(2)])
    sizes = {"tp": 4}
    out = draw(layout, (2, 3, 10), sizes)
    assert "the picture shows dim 2 of 3; every rank holds dims 0, 1 whole" in out
    held, _ = read_picture(out, 1)
    for rank, at in enumerate(coordinates(["tp"], sizes)):
        assert held[rank] == {(i,) for i in dtensor_indices((2, 3, 10), layout, sizes, at)[2]}
    assert_every_dim_matches_torch(out, (2, 3, 10), sizes, layout)


def test_draw_refuses_three_sharded_dims() -> None:
    layout = SourceLayout("dense", ["a", "b", "c"], [S0, S1, Shard(2)])
    with pytest.raises(LayoutError, match="shards 3 dims"):
        draw(layout, (4, 4, 4), {"a": 2, "b": 2, "c": 2})


def test_draw_a_plain_parameter(world_mesh: MeshFactory) -> None:
    plain = SourceLayout("dense", (), ())
    sizes = {"dp_shard": 8}
    out = draw(plain, (10, 3), sizes, fqn="norm.weight")
    assert "  layout dense[]" in out
    assert "| 0-7 |" in out  # every rank holds all of it
    assert_picture_matches_torch(out, (10, 3), sizes, plain)
    # under FSDP: only FSDP's own shard, as fully_shard makes of a plain tensor
    out = draw(plain, (10, 3), sizes, fqn="norm.weight", fsdp="dp_shard")
    composed = layout_of(fully_sharded(world_mesh(sizes), plain, (10, 3), shard="dp_shard"))
    assert f"with FSDP over 'dp_shard': {composed}" in out
    assert_picture_matches_torch(out, (10, 3), sizes, composed)


# ---------------------------------------------------------------------------------------
# bounded work: what cannot be printed is refused before the work


def test_draw_a_64_by_64_mesh() -> None:
    layout = SourceLayout("dense", ["dp", "tp"], [S0, S1])
    out = draw(layout, (64, 128), {"dp": 64, "tp": 64})
    assert len(out.splitlines()) == 7 + 2 * 64 + 1 + 1 + 4096
    held, empty = read_picture(out, 2)
    assert len(held) == 4096 and not empty
    assert held[4095] == {(63, 126), (63, 127)}


@pytest.mark.parametrize(
    ("layout", "shape", "sizes", "words"),
    [
        (EMB, (8,), {"tp": 65, "dp": 64}, "has 4160 ranks"),
        (
            SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2**31 - 1), S0]),
            (10, 4),
            {"dp": 2, "tp": 2},
            "into 2147483647 pieces on each of 4 ranks",
        ),
        (
            SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=32), S1]),
            (4096, 64),
            {"dp": 64, "tp": 64},
            "would have 2048 x 64 cells",
        ),
    ],
    ids=["ranks", "pieces", "cells"],
)
def test_draw_refuses_what_it_cannot_print(
    layout: SourceLayout, shape: tuple[int, ...], sizes: dict[str, int], words: str
) -> None:
    with pytest.raises(LayoutError) as e:
        draw(layout, shape, sizes, fqn="w")
    assert words in e.value.message and "draw" in e.value.message


class _BrokenShape(Sequence[int]):
    """A sequence of sizes whose reading fails."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:  # type: ignore[override]
        raise RuntimeError("the caller's shape broke")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((None, (4,), {"tp": 2}), "layout: expected a SourceLayout"),
        ((EMB, "4", {"tp": 2}), "global_shape must be a sequence"),
        ((EMB, (4.0,), {"tp": 2}), "sizes from 0 to"),
        ((EMB, (2**63,), {"tp": 2}), "sizes from 0 to"),
        ((EMB, (), {"tp": 2}), "has 0 dims"),
        ((EMB, (1,) * 65, {"tp": 2}), "has more than 64 dims"),
        ((EMB, _BrokenShape(), {"tp": 2}), "global_shape could not be read"),
        ((EMB, (4,), ["tp"]), "mesh_sizes must map axis name to int"),
        ((EMB, (4,), {"tp": 2, "dp": 2**21}), "mesh_sizes['dp'] must be an int from 1"),
        ((EMB, (4,), {"tp": 0}), "mesh_sizes['tp'] must be an int from 1"),
        ((EMB, (4,), {"tp": True}), "mesh_sizes['tp'] must be an int from 1"),
    ],
)
def test_draw_given_wrong_values_raises_layout_errors(args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(words)):
        draw(*args)


def test_draw_escapes_the_name() -> None:
    out = draw(EMB, (4,), {"tp": 2}, fqn="a\x1b[2J\nb")
    assert out.startswith("a\\x1b[2J\\nb: shape (4,)")
    assert escape("plain.name") == "plain.name"
    assert escape("lone\udc80") == "lone\\udc80"
