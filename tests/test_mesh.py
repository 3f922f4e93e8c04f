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

from layout_algebra import LayoutError, Mesh, Shard, SourceLayout, local_shape_and_offset

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
    if mesh.names:
        assert Mesh.parse(str(mesh)) == mesh
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


def test_a_mesh_is_taken_wherever_sizes_by_axis_are() -> None:
    layout = SourceLayout("dense", ["tp"], [Shard(0)])
    mesh = Mesh({"dp_shard": 2, "tp": 4})
    by_dict = local_shape_and_offset((16, 8), layout, {"dp_shard": 2, "tp": 4}, {"tp": 3})
    assert local_shape_and_offset((16, 8), layout, mesh, {"tp": 3}) == by_dict


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
        "",
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
