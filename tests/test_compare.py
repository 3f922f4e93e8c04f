"""``checkpoint_diff``: two tables compared by the box each rank holds, as a checkpoint
sees them; the boxes come from ``local_shape_and_offset``, DTensor's own reading."""

from __future__ import annotations

import pytest

from layout_algebra import (
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
)
from layout_algebra._compare import checkpoint_diff

S0, S1, R = Shard(0), Shard(1), Replicate()
MESHES = {"dense": Mesh({"dp": 2, "tp": 2})}


def table(layout: SourceLayout) -> ParamLayoutTable:
    return ParamLayoutTable({"w": layout})


def dense(axes: list[str], *placements: Shard | Replicate | StridedShard) -> SourceLayout:
    return SourceLayout("dense", axes, placements)


@pytest.mark.parametrize(
    ("rows", "a", "b", "same"),
    [
        # R on an axis one names and the other omits: one sharding
        (4, dense(["dp", "tp"], S0, R), dense(["dp"], S0), True),
        # FSDP's strided shard over even rows is the plain S(0) of (tp, dp) order...
        (
            8,
            dense(["dp", "tp"], StridedShard(0, split_factor=2), S0),
            dense(["tp", "dp"], S0, S0),
            True,
        ),
        # ... but not of (dp, tp) order, whose boxes sit on other ranks
        (
            8,
            dense(["dp", "tp"], StridedShard(0, split_factor=2), S0),
            dense(["dp", "tp"], S0, S0),
            False,
        ),
        # another dim
        (4, dense(["dp"], S0), dense(["dp"], S1), False),
    ],
)
def test_a_change_is_a_box_that_moves(
    rows: int, a: SourceLayout, b: SourceLayout, same: bool
) -> None:
    shapes = {"w": ParamShape((rows, 4), "float32")}
    got = checkpoint_diff(table(a), table(b), shapes, MESHES)
    assert (not got) is same
    assert dict(got.changed) == ({} if same else {"w": (a, b)})


def test_entries_in_one_table_only_are_added_or_removed() -> None:
    old = ParamLayoutTable({"w": dense(["dp"], S0), "gone": dense(["dp"], S0)})
    new = ParamLayoutTable({"w": dense(["dp"], S0), "new": dense(["tp"], S0)})
    got = checkpoint_diff(old, new, {"w": ParamShape((4,), "float32")}, MESHES)
    assert (dict(got.added), dict(got.removed), dict(got.changed)) == (
        {"new": dense(["tp"], S0)},
        {"gone": dense(["dp"], S0)},
        {},
    )


@pytest.mark.parametrize(
    ("shapes", "meshes", "words"),
    [
        ({}, MESHES, "w: no shape given"),
        ({"w": ParamShape((4, 4), "float32")}, {"expert": Mesh({"ep": 4})}, "not given"),
        (
            {"w": ParamShape((4, 4), "float32")},
            {**MESHES, "expert": Mesh({"ep": 8})},
            "lay out different worlds",
        ),
        (
            {"w": ParamShape((4, 4), "float32")},
            {"dense": Mesh({"dp": 2**20, "tp": 2})},
            "more than the 1,048,576 a world has",
        ),
    ],
)
def test_what_cannot_be_compared_names_why(
    shapes: dict[str, ParamShape], meshes: dict[str, Mesh], words: str
) -> None:
    with pytest.raises(LayoutError, match=words):
        checkpoint_diff(table(dense(["dp"], S0)), table(dense(["dp"], S1)), shapes, meshes)
