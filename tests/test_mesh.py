"""``Mesh``: one value for a mesh's axes and sizes, checked once.

Rank and coordinate are compared with numpy's row-major ravel/unravel and with the
layout torch's ``init_device_mesh`` gives a world (``torch.arange(n).reshape(sizes)``).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layout_algebra
from layout_algebra import (
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    Shard,
    SourceLayout,
    StridedShard,
    compose_fsdp,
    compose_table,
    dcp_chunks,
    from_partition_spec,
    local_runs,
    local_shape_and_offset,
    reshard_plan,
    to_partition_spec,
)
from layout_algebra.draw import draw
from layout_algebra.mesh import as_mesh, as_role_sizes, coordinates

NAMES = st.sampled_from(["dp", "dp_shard", "tp", "ep", "cp", "pp", "x_1"])
MESHES = st.lists(st.tuples(NAMES, st.integers(1, 6)), max_size=4, unique_by=lambda p: p[0]).map(
    Mesh
)


@given(MESHES, st.data())
def test_rank_and_coordinate_are_row_major_as_numpy_ravels_them(
    mesh: Mesh, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, mesh.size - 1))
    coordinate = mesh.coordinate(rank)
    assert coordinate == tuple(int(i) for i in np.unravel_index(rank, mesh.sizes))
    assert mesh.rank(coordinate) == rank


@given(MESHES)
def test_str_parses_back_and_the_value_survives_pickle_and_copy(mesh: Mesh) -> None:
    assert Mesh.parse(str(mesh)) == mesh  # the mesh of no axes too: ""
    assert pickle.loads(pickle.dumps(mesh)) == mesh
    assert copy.deepcopy(mesh) == mesh
    assert hash(Mesh(dict(mesh))) == hash(mesh)


def test_the_torch_device_mesh_lays_ranks_out_as_mesh_does() -> None:
    torch = pytest.importorskip("torch")
    mesh = Mesh({"dp_shard": 2, "ep": 3, "tp": 2})
    grid = torch.arange(mesh.size).reshape(mesh.sizes)  # init_device_mesh's own layout
    for rank in range(mesh.size):
        assert int(grid[mesh.coordinate(rank)]) == rank


def test_a_mesh_is_a_mapping_of_sizes_in_order() -> None:
    mesh = Mesh([("dp_shard", 8), ("tp", 4)])
    assert mesh.names == ("dp_shard", "tp")
    assert mesh.sizes == (8, 4)
    assert mesh.size == 32
    assert mesh["tp"] == 4
    assert list(mesh) == ["dp_shard", "tp"]
    assert "tp" in mesh and "ep" not in mesh
    assert str(mesh) == "dp_shard=8,tp=4"
    assert Mesh.parse(" dp_shard = 8 , tp=4") == mesh
    # order is part of the value: the same sizes in another order lay ranks out otherwise
    assert Mesh({"tp": 4, "dp_shard": 8}) != mesh


SIZES = {"dp_shard": 2, "tp": 4}
LAYOUT = SourceLayout("dense", ["tp"], [Shard(0)])
STRIDED = SourceLayout("dense", ["dp_shard", "tp"], [StridedShard(0, split_factor=4), Shard(0)])
TABLE = ParamLayoutTable({"w": LAYOUT})
SHAPES = {"w": ParamShape((16, 8), "float32")}

BY_AXIS: dict[str, object] = {
    "compose_fsdp": lambda m: compose_fsdp(LAYOUT, shard_axis="dp_shard", mesh_sizes=m),
    "local_shape_and_offset": lambda m: local_shape_and_offset((16, 8), LAYOUT, m, {"tp": 3}),
    "local_runs": lambda m: local_runs((16, 8), STRIDED, m, {"dp_shard": 1, "tp": 3}),
    "dcp_chunks": lambda m: dcp_chunks(LAYOUT, (16, 8), m),
    "draw": lambda m: draw(STRIDED, (16, 8), m),
    "to_partition_spec": lambda m: to_partition_spec(STRIDED, 2, mesh_sizes=m, shape=(16, 8)),
    "from_partition_spec": lambda m: from_partition_spec(
        (("tp", "dp_shard"), None), mesh="dense", axes=["dp_shard", "tp"], mesh_sizes=m
    ),
}
"""Every argument that takes sizes by axis, given sizes ``m``."""

BY_ROLE: dict[str, object] = {
    "compose_table": lambda m: compose_table(TABLE, fsdp={"dense": "dp_shard"}, mesh_sizes=m),
    "lint": lambda m: layout_algebra.lint(TABLE, SHAPES, mesh_sizes=m),
    "reshard_plan": lambda m: reshard_plan(TABLE, TABLE, SHAPES, src_sizes=m, dst_sizes=m),
}
"""Every argument that takes sizes by mesh role, given sizes ``m`` by role."""


@pytest.mark.parametrize("name", sorted(BY_AXIS))
def test_a_mesh_is_taken_wherever_sizes_by_axis_are(name: str) -> None:
    call = BY_AXIS[name]
    assert callable(call)
    assert call(Mesh(SIZES)) == call(SIZES)
    # the same check, in the same words, for a mesh given as a mapping
    with pytest.raises(LayoutError, match=r"mesh_sizes\['tp'\] must be an int from 1 to 1,048,576"):
        call({"dp_shard": 2, "tp": 0})


@pytest.mark.parametrize("name", sorted(BY_ROLE))
def test_a_mesh_by_role_is_taken_wherever_sizes_by_role_are(name: str) -> None:
    call = BY_ROLE[name]
    assert callable(call)
    assert call({"dense": Mesh(SIZES)}) == call({"dense": SIZES})
    with pytest.raises(LayoutError, match=r"mesh_sizes\['dense'\]\['tp'\] must be an int from 1"):
        call({"dense": {"dp_shard": 2, "tp": 0}})


def test_sizes_are_checked_once_in_the_same_words_for_a_mesh_and_a_mapping() -> None:
    with pytest.raises(LayoutError) as made:
        Mesh({"dp": 2, "tp": 0})
    with pytest.raises(LayoutError) as given:
        as_mesh({"dp": 2, "tp": 0}, "mesh_sizes")
    assert made.value.message == "Mesh['tp'] must be an int from 1 to 1,048,576, got 0"
    assert given.value.message == "mesh_sizes['tp'] must be an int from 1 to 1,048,576, got 0"
    assert made.value.axis == given.value.axis == "tp"
    with pytest.raises(LayoutError, match="mesh_sizes names axis 'tp' twice"):
        as_mesh({"tp": 2, layout_algebra.AxisName("tp"): 2})  # type: ignore[dict-item]
    mesh = Mesh(SIZES)
    assert as_mesh(mesh) is mesh
    assert as_role_sizes({"dense": SIZES}) == {"dense": mesh}


@given(MESHES)
def test_coordinates_list_every_rank_in_order(mesh: Mesh) -> None:
    listed = list(coordinates(mesh))
    assert len(listed) == mesh.size
    for rank, coordinate in enumerate(listed):
        assert list(coordinate) == list(mesh.names)
        assert tuple(coordinate.values()) == mesh.coordinate(rank)


@pytest.mark.parametrize(
    "axes",
    [
        None,
        "tp",
        4,
        {"tp": 0},
        {"tp": 2**21},
        {"tp": True},
        {"t-p": 2},
        [("tp", 2), ("tp", 2)],
        [("tp",)],
        [("tp", 2, 3)],
        {1: 2},
        ["tp=2"],
    ],
)
def test_bad_axes_are_a_layout_error(axes: object) -> None:
    with pytest.raises(LayoutError):
        Mesh(axes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "tp",
        "tp=",
        "=2",
        "tp=2,,",
        "tp=+2",
        "tp=\u0663",
        "tp=2,tp=2",
        "tp=0",
        "tp=" + "9" * 30,
        None,
        b"tp=2",
    ],
)
def test_bad_text_is_a_layout_error(text: object) -> None:
    with pytest.raises(LayoutError):
        Mesh.parse(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [-1, 8, 2**70, None, "1", 1.0, True])
def test_a_rank_off_the_mesh_is_a_layout_error(rank: object) -> None:
    with pytest.raises(LayoutError, match="rank"):
        Mesh({"dp": 2, "tp": 4}).coordinate(rank)  # type: ignore[arg-type]


@pytest.mark.parametrize("coordinate", [(0,), (0, 4), (2, 0), (0, 0, 0), "01", None, (0, True)])
def test_a_coordinate_off_the_mesh_is_a_layout_error(coordinate: object) -> None:
    with pytest.raises(LayoutError, match="coordinate"):
        Mesh({"dp": 2, "tp": 4}).rank(coordinate)  # type: ignore[arg-type]


@given(MESHES)
def test_the_converter_writes_an_ordered_object_and_reads_it_back(mesh: Mesh) -> None:
    import json  # noqa: PLC0415

    from layout_algebra.serialization import converter  # noqa: PLC0415

    text = json.dumps(converter.unstructure(mesh))
    assert list(json.loads(text)) == list(mesh.names)
    assert converter.structure(json.loads(text), Mesh) == mesh


@pytest.mark.parametrize(
    ("doc", "path"),
    [(None, "$"), ([["tp", 2]], "$"), ({"tp": 0}, "tp"), ({"tp": "2"}, "tp"), ({"t-p": 2}, "t-p")],
)
def test_a_bad_mesh_document_is_a_serialization_error_at_its_path(doc: object, path: str) -> None:
    from layout_algebra import SerializationError  # noqa: PLC0415
    from layout_algebra.serialization import converter  # noqa: PLC0415

    with pytest.raises(SerializationError) as info:
        converter.structure(doc, Mesh)
    assert str(info.value).startswith(f"{path}:")
