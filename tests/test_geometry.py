"""FSDP composition and shard geometry, checked against torch's ``fully_shard`` and DTensor.

The oracles: placements of parameters after a real ``fully_shard`` on the fake 8-rank
process group; DTensor's own local-shape/offset computation for every rank coordinate;
and the index blocks torch's placements cut when they split a tensor.
"""

from __future__ import annotations

import inspect
import itertools
import math
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from layout_algebra import (
    AxisName,
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    Partial,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    compose_fsdp,
    compose_table,
    local_shape_and_offset,
)
from layout_algebra.fsdp import MAX_FSDP_SOURCE_AXES
from layout_algebra.geometry import local_runs
from layout_algebra.torch_bridge import distribute
from tests.models import TiedTP
from tests.torch_oracle import (
    MeshFactory,
    coordinates,
    dtensor_indices,
    dtensor_shape_and_offset,
    fully_sharded,
    layout_of,
)

S0, S1, R = Shard(0), Shard(1), Replicate()


def names(layout: SourceLayout) -> list[str]:
    return [a.name for a in layout.axes]


# ---------------------------------------------------------------------------------------
# compose_fsdp: worked cases


def test_fsdp_over_tp_rows_is_strided() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    composed = compose_fsdp(layout, shard_axis="dp_shard", mesh_sizes={"dp_shard": 4, "tp": 2})
    assert composed == SourceLayout(
        "dense", ["dp_shard", "tp"], [StridedShard(0, split_factor=2), S0]
    )
    assert str(composed) == "dense[dp_shard=_S(0, 2), tp=S(0)]"


@pytest.mark.parametrize("source", [S1, R])
def test_fsdp_over_a_dim_the_source_leaves_alone_is_a_plain_shard(source: Placement) -> None:
    layout = SourceLayout("dense", ["tp"], [source])
    composed = compose_fsdp(layout, shard_axis="dp_shard", mesh_sizes={"dp_shard": 4, "tp": 2})
    assert composed.placements == (S0, source)


def test_hsdp_of_the_reference_mesh() -> None:
    # Mesh (2, 4, 2), FSDP on the middle dim, source S(0) on the last: (R, _S(0, 2), S(0)).
    layout = SourceLayout("dense", ["tp"], [S0])
    sizes = {"dp_replicate": 2, "dp_shard": 4, "tp": 2}
    composed = compose_fsdp(
        layout, shard_axis="dp_shard", replicate_axes=("dp_replicate",), mesh_sizes=sizes
    )
    assert str(composed) == "dense[dp_replicate=R, dp_shard=_S(0, 2), tp=S(0)]"


def test_split_factor_counts_every_source_shard_of_the_dim() -> None:
    layout = SourceLayout("expert", ["ep", "tp"], [S0, S0])
    sizes = {"edp_shard": 2, "ep": 4, "tp": 2}
    composed = compose_fsdp(layout, shard_axis="edp_shard", mesh_sizes=sizes)
    assert str(composed) == "expert[edp_shard=_S(0, 8), ep=S(0), tp=S(0)]"


def test_size_one_source_axes_do_not_stride() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    composed = compose_fsdp(layout, shard_axis="dp", mesh_sizes={"dp": 8, "tp": 1})
    assert composed.placements == (S0, S0)


def test_shard_dim_follows_fsdp() -> None:
    layout = SourceLayout("dense", ["tp"], [S1])
    composed = compose_fsdp(
        layout, shard_axis="dp_shard", mesh_sizes={"dp_shard": 2, "tp": 4}, shard_dim=1
    )
    assert str(composed) == "dense[dp_shard=_S(1, 4), tp=S(1)]"


def test_a_layout_without_source_axes_is_plain_fsdp() -> None:
    layout = SourceLayout("dense", [], [])
    composed = compose_fsdp(
        layout, shard_axis="dp_shard", replicate_axes=["dp_replicate"],
        mesh_sizes={"dp_replicate": 2, "dp_shard": 4},
    )  # fmt: skip
    assert str(composed) == "dense[dp_replicate=R, dp_shard=S(0)]"


def test_compose_takes_axis_names_and_ignores_other_sizes() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    sizes = {"dp_shard": 2, "tp": 2, "pp": 4, "cp": 2}
    assert compose_fsdp(layout, shard_axis=AxisName("dp_shard"), mesh_sizes=sizes) == (
        compose_fsdp(layout, shard_axis="dp_shard", mesh_sizes=sizes)
    )


# ---------------------------------------------------------------------------------------
# compose_fsdp: what FSDP2 cannot compose is refused up front


def test_more_source_axes_than_fsdp_supports() -> None:
    layout = SourceLayout("dense", ["ep", "tp", "sp"], [S0, S1, R])
    sizes = {"dp_shard": 1, "ep": 2, "tp": 2, "sp": 2}
    with pytest.raises(LayoutError, match=r"1-D TP/EP or 2-D EP\+TP") as info:
        compose_fsdp(layout, shard_axis="dp_shard", mesh_sizes=sizes)
    assert str(MAX_FSDP_SOURCE_AXES) in info.value.message
    assert "dense[ep=S(0), tp=S(1), sp=R]" in info.value.message
    assert (info.value.axis, info.value.placement) == ("sp", "R")


def test_fsdp_takes_its_one_shard_axis_by_name() -> None:
    """``shard_axis`` is one axis, required; the old ``shard_axes`` list is gone."""
    params = inspect.signature(compose_fsdp).parameters
    assert "shard_axes" not in params
    assert params["shard_axis"].default is inspect.Parameter.empty
    layout = SourceLayout("dense", ["tp"], [S0])
    sizes = {"dp_shard": 2, "tp": 2}
    with pytest.raises(
        LayoutError, match=r"shard_axis: an axis name must be a str .* \['dp_shard'\]"
    ):
        compose_fsdp(layout, shard_axis=["dp_shard"], mesh_sizes=sizes)  # type: ignore[arg-type]


def test_compose_takes_a_mesh_as_it_takes_sizes() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    sizes = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
    by_mapping = compose_fsdp(
        layout, shard_axis="dp_shard", replicate_axes=["dp_replicate"], mesh_sizes=sizes
    )
    by_mesh = compose_fsdp(
        layout, shard_axis="dp_shard", replicate_axes=["dp_replicate"], mesh_sizes=Mesh(sizes)
    )
    assert by_mesh == by_mapping
    assert str(by_mesh) == "dense[dp_replicate=R, dp_shard=_S(0, 2), tp=S(0)]"
    table = ParamLayoutTable({"w": layout, "e": SourceLayout("expert", ["ep"], [S0])})
    fsdp = {"dense": "dp_shard", "expert": "efsdp"}
    meshes = {"dense": Mesh({"dp_shard": 4, "tp": 2}), "expert": Mesh({"efsdp": 2, "ep": 4})}
    plain = {role: dict(mesh) for role, mesh in meshes.items()}
    mixed = {"dense": meshes["dense"], "expert": plain["expert"]}
    expected = compose_table(table, fsdp=fsdp, mesh_sizes=plain)
    assert compose_table(table, fsdp=fsdp, mesh_sizes=meshes) == expected
    assert compose_table(table, fsdp=fsdp, mesh_sizes=mixed) == expected
    with pytest.raises(LayoutError, match=r"every role's mesh spans the whole world"):
        compose_table(table, fsdp=fsdp, mesh_sizes={**meshes, "expert": Mesh({"ep": 2})})


def test_hsdp_replicates_over_at_most_one_axis() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    sizes = {"a": 2, "b": 2, "dp_shard": 2, "tp": 1}
    with pytest.raises(LayoutError, match="at most one mesh axis") as info:
        compose_fsdp(layout, shard_axis="dp_shard", replicate_axes=["a", "b"], mesh_sizes=sizes)
    assert info.value.axis == "b"


def test_an_axis_cannot_be_fsdp_and_source() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    with pytest.raises(LayoutError, match="'tp' is a source axis") as info:
        compose_fsdp(layout, shard_axis="tp", mesh_sizes={"tp": 2})
    assert (info.value.axis, info.value.placement) == ("tp", "S(0)")
    with pytest.raises(LayoutError, match="both a replicate and a shard axis"):
        compose_fsdp(layout, shard_axis="dp", replicate_axes=["dp"], mesh_sizes={"dp": 2})


def test_a_pending_reduction_is_not_a_parameter() -> None:
    layout = SourceLayout("dense", ["tp"], [Partial()])
    with pytest.raises(LayoutError, match=r"P\(sum\) on axis 'tp'") as info:
        compose_fsdp(layout, shard_axis="dp", mesh_sizes={"dp": 2, "tp": 2})
    assert info.value.message.endswith("declare R or S(dim) on that axis")


def test_every_axis_needs_a_size() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    with pytest.raises(LayoutError, match="no size for axis 'dp_shrad'") as info:
        compose_fsdp(layout, shard_axis="dp_shrad", mesh_sizes={"dp_shard": 2, "tp": 2})
    assert info.value.axis == "dp_shrad"


@pytest.mark.parametrize("size", [0, -1, True, 2.0])
def test_sizes_are_positive_ints(size: object) -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    bad: dict[str, object] = {"dp": 2, "tp": size}
    with pytest.raises(LayoutError, match=r"mesh_sizes\['tp'\] must be an int from 1 to "):
        compose_fsdp(layout, shard_axis="dp", mesh_sizes=bad)  # type: ignore[arg-type]  # bad input on purpose


@pytest.mark.parametrize("shard_dim", [-1, 1.0])
def test_shard_dim_counts_from_zero(shard_dim: object) -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    with pytest.raises(LayoutError, match="shard_dim must be an int from 0 to 63"):
        compose_fsdp(
            layout, shard_axis="dp", mesh_sizes={"dp": 2, "tp": 2},
            shard_dim=shard_dim,  # type: ignore[arg-type]  # bad input on purpose
        )  # fmt: skip


def test_compose_wants_a_layout() -> None:
    with pytest.raises(LayoutError, match="expected a SourceLayout"):
        compose_fsdp("dense[tp=S(0)]", shard_axis="dp", mesh_sizes={"dp": 2})  # type: ignore[arg-type]  # bad input on purpose


# ---------------------------------------------------------------------------------------
# compose_fsdp against torch's fully_shard


class Setup(NamedTuple):
    """One parameter under fully_shard: the world mesh, FSDP's axes, the source layout."""

    sizes: dict[str, int]
    replicate: tuple[str, ...]
    shard: str
    source: SourceLayout
    shard_dim: int
    shape: tuple[int, ...]


def setup(
    sizes: dict[str, int],
    replicate: tuple[str, ...],
    source: dict[str, Placement],
    shard_dim: int,
    shape: tuple[int, ...],
) -> Setup:
    """A setup whose shard axis is the one mesh axis neither replicate nor source."""
    shard = next(a for a in sizes if a not in replicate and a not in source)
    layout = SourceLayout("dense", list(source), list(source.values()))
    return Setup(sizes, replicate, shard, layout, shard_dim, shape)


def torch_fully_shard(world_mesh: MeshFactory, case: Setup) -> DTensor:
    """The parameter torch's fully_shard makes of one laid out as ``case.source``."""
    return fully_sharded(
        world_mesh(case.sizes),
        case.source,
        case.shape,
        shard=case.shard,
        replicate=case.replicate,
        shard_dim=case.shard_dim,
    )


def assert_composes_like_fsdp(world_mesh: MeshFactory, case: Setup) -> None:
    w = torch_fully_shard(world_mesh, case)
    composed = compose_fsdp(
        case.source,
        shard_axis=case.shard,
        replicate_axes=case.replicate,
        mesh_sizes=case.sizes,
        shard_dim=case.shard_dim,
    )
    assert composed == layout_of(w, case.source.mesh)
    # ... and where this rank's shard lies, as the sharded parameter itself says.
    coordinate = w.device_mesh.get_coordinate()
    assert coordinate is not None
    here = dict(zip(names(composed), coordinate, strict=True))
    expected = compute_local_shape_and_global_offset(case.shape, w.device_mesh, w.placements)
    assert local_shape_and_offset(case.shape, composed, case.sizes, here) == expected
    assert expected[0] == tuple(w.to_local().shape)


FSDP = {"dp_shard": 4, "tp": 2}
HSDP = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
EP_TP = {"dp_shard": 2, "ep": 2, "tp": 2}
HSDP_EP_TP = {"dp_replicate": 1, "dp_shard": 2, "ep": 2, "tp": 2}
REP = ("dp_replicate",)
FSDP_CASES = {
    "fsdp-tp-rows": setup(FSDP, (), {"tp": S0}, 0, (16, 8)),
    "fsdp-tp-cols": setup(FSDP, (), {"tp": S1}, 0, (16, 8)),
    "fsdp-tp-replicated": setup(FSDP, (), {"tp": R}, 0, (16, 8)),
    "fsdp-tp-uneven": setup(FSDP, (), {"tp": S0}, 0, (7, 5)),
    "hsdp-tp": setup(HSDP, REP, {"tp": S0}, 0, (16, 8)),
    "fsdp-ep-tp": setup(EP_TP, (), {"ep": S0, "tp": S1}, 0, (8, 8)),
    "fsdp-ep-tp-same-dim": setup(EP_TP, (), {"ep": S0, "tp": S0}, 0, (8, 8)),
    "hsdp-ep-tp": setup(HSDP_EP_TP, REP, {"ep": S0, "tp": S0}, 0, (12, 4)),
    "fsdp-plain": setup({"dp_shard": 8}, (), {}, 0, (10, 3)),
    "hsdp-plain": setup({"dp_replicate": 2, "dp_shard": 4}, REP, {}, 0, (10, 3)),
    # A plain parameter on a world that also has tp: FSDP's placement only, no tp=R.
    "fsdp-plain-beside-tp": setup(FSDP, (), {}, 0, (10, 3)),
    "hsdp-plain-beside-tp": setup(HSDP, REP, {}, 0, (10, 3)),
    "dim1-tp-cols": setup(FSDP, (), {"tp": S1}, 1, (8, 16)),
    "dim1-tp-rows": setup(FSDP, (), {"tp": S0}, 1, (8, 16)),
}


@pytest.mark.parametrize("case", list(FSDP_CASES.values()), ids=list(FSDP_CASES))
def test_compose_fsdp_matches_fully_shard(
    fake_world: int, world_mesh: MeshFactory, case: Setup
) -> None:
    assert math.prod(case.sizes.values()) == fake_world
    assert_composes_like_fsdp(world_mesh, case)


# Every way to lay 8 ranks out as (dp_replicate?, dp_shard, source axes...), powers of two.
_FACTORINGS = [
    sizes
    for n in range(1, 5)
    for sizes in itertools.product([1, 2, 4, 8], repeat=n)
    if math.prod(sizes) == 8
]


@st.composite
def fsdp_setups(draw: st.DrawFn) -> Setup:
    hsdp = draw(st.booleans())
    n_source = draw(st.integers(0, MAX_FSDP_SOURCE_AXES))
    n_axes = n_source + 1 + hsdp
    fitting = [f for f in _FACTORINGS if len(f) == n_axes]
    factoring = draw(st.sampled_from(fitting))
    axes = (["dp_replicate"] if hsdp else []) + ["dp_shard"] + ["ep", "tp"][2 - n_source :]
    sizes = dict(zip(axes, factoring, strict=True))
    choices: list[Placement] = [S0, S1, R]
    placements = draw(st.lists(st.sampled_from(choices), min_size=n_source, max_size=n_source))
    shard_dim = draw(st.sampled_from([0, 1]))
    # FSDP wants even sharding on dim 1 only; 16 columns split evenly over any 8-rank mesh.
    rows = draw(st.integers(1, 20)) if shard_dim == 0 else 16
    role = draw(st.sampled_from(["dense", "expert"]))
    layout = SourceLayout(role, axes[1 + hsdp :], placements)
    return Setup(sizes, tuple(axes[:hsdp]), "dp_shard", layout, shard_dim, (rows, 16))


@settings(max_examples=min(settings().max_examples, 30))
@given(case=fsdp_setups())
def test_compose_fsdp_matches_fully_shard_everywhere(world_mesh: MeshFactory, case: Setup) -> None:
    assert_composes_like_fsdp(world_mesh, case)


def test_fully_shard_refuses_what_compose_fsdp_refuses(world_mesh: MeshFactory) -> None:
    sizes = {"dp_shard": 1, "ep": 2, "tp": 2, "sp": 2}
    layout = SourceLayout("dense", ["ep", "tp", "sp"], [S0, S0, R])
    with pytest.raises(NotImplementedError, match="1D TP/EP or 2D EP"):
        torch_fully_shard(world_mesh, Setup(sizes, (), "dp_shard", layout, 0, (8, 8)))
    with pytest.raises(LayoutError, match="1-D TP/EP or 2-D EP"):
        compose_fsdp(layout, shard_axis="dp_shard", mesh_sizes=sizes)


# ---------------------------------------------------------------------------------------
# local_shape_and_offset: worked cases


def test_uneven_rows_shrink_at_the_tail() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    got = [local_shape_and_offset((10, 4), layout, {"tp": 4}, {"tp": i}) for i in range(4)]
    assert got == [((3, 4), (0, 0)), ((3, 4), (3, 0)), ((3, 4), (6, 0)), ((1, 4), (9, 0))]


def test_empty_tail_shards_sit_at_the_end() -> None:
    layout = SourceLayout("dense", ["tp"], [S0])
    got = [local_shape_and_offset((2, 3), layout, {"tp": 4}, {"tp": i}) for i in range(4)]
    assert got == [((1, 3), (0, 0)), ((1, 3), (1, 0)), ((0, 3), (2, 0)), ((0, 3), (2, 0))]


def test_strided_blocks_interleave() -> None:
    layout = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), S0])
    sizes = {"dp": 2, "tp": 2}
    blocks = {
        (c["dp"], c["tp"]): local_runs((8, 2), layout, sizes, c)[0]
        for c in coordinates(["dp", "tp"], sizes)
    }
    assert blocks == {
        (0, 0): (range(0, 2),),
        (1, 0): (range(2, 4),),
        (0, 1): (range(4, 6),),
        (1, 1): (range(6, 8),),
    }
    runs = local_runs(
        (8, 2),
        layout.with_placements([StridedShard(0, split_factor=2), R]),
        sizes,
        {"dp": 1, "tp": 0},
    )
    assert runs == ((range(2, 4), range(6, 8)), (range(0, 2),))


def test_coordinates_and_sizes_may_name_more_axes() -> None:
    layout = SourceLayout("dense", ["tp"], [S1])
    got = local_shape_and_offset((4, 10), layout, {"dp": 2, "tp": 2}, {"dp": 1, "tp": 1, "pp": 3})
    assert got == ((4, 5), (0, 5))


def test_replicate_and_partial_keep_the_whole_tensor() -> None:
    layout = SourceLayout("dense", ["a", "b"], [R, Partial("max")])
    assert local_shape_and_offset((3, 5), layout, {"a": 2, "b": 2}, {"a": 1, "b": 1}) == (
        (3, 5),
        (0, 0),
    )


def test_geometry_errors_name_the_problem() -> None:
    layout = SourceLayout("dense", ["tp"], [Shard(2)])
    with pytest.raises(LayoutError, match=r"shards dim 2, but shape \(4, 4\) has 2 dims") as info:
        local_shape_and_offset((4, 4), layout, {"tp": 2}, {"tp": 0})
    assert (info.value.axis, info.value.placement) == ("tp", "S(2)")
    layout = SourceLayout("dense", ["tp"], [S0])
    with pytest.raises(LayoutError, match="no index for axis 'tp'"):
        local_shape_and_offset((4, 4), layout, {"tp": 2}, {"dp": 0})
    with pytest.raises(LayoutError, match="outside the axis of size 2"):
        local_shape_and_offset((4, 4), layout, {"tp": 2}, {"tp": 2})
    with pytest.raises(LayoutError, match=r"coordinate\['tp'\] must be an int from 0 to "):
        local_shape_and_offset((4, 4), layout, {"tp": 2}, {"tp": -1})
    with pytest.raises(LayoutError, match="no size for axis 'tp'"):
        local_shape_and_offset((4, 4), layout, {}, {"tp": 0})
    with pytest.raises(LayoutError, match="global_shape holds sizes from 0 to "):
        local_shape_and_offset((4, -1), layout, {"tp": 2}, {"tp": 0})
    with pytest.raises(LayoutError, match="global_shape must be a sequence"):
        local_shape_and_offset(4, layout, {"tp": 2}, {"tp": 0})  # type: ignore[arg-type]  # bad input on purpose


def test_huge_tensors_cost_nothing() -> None:
    """Runs, not indices: 10**12 rows cost what 65536 do (torch, the oracle, needs the latter).

    Every block boundary is a multiple of rows / (64 * 1024) here, so scaling the rows
    scales each shape and offset alike.
    """
    layout = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=64), S0])
    sizes, at = {"dp": 1024, "tp": 64}, {"dp": 1023, "tp": 62}
    small = 64 * 1024
    scale = 10**12 // small
    (rows, cols), (row0, col0) = dtensor_shape_and_offset((small, 4), layout, sizes, at)
    got = local_shape_and_offset((small * scale, 4), layout, sizes, at)
    assert got == ((rows * scale, cols), (row0 * scale, col0))


# ---------------------------------------------------------------------------------------
# local_shape_and_offset against DTensor, every rank of random meshes


@st.composite
def geometries(draw: st.DrawFn) -> tuple[tuple[int, ...], SourceLayout, dict[str, int]]:
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=1, max_size=3)))
    n_axes = draw(st.integers(0, 3))
    axes = [f"m{i}" for i in range(n_axes)]
    sizes = {a: draw(st.integers(1, 4)) for a in axes}
    dims = st.integers(0, len(shape) - 1)
    placement = st.one_of(
        st.just(R),
        st.builds(Shard, dims),
        st.builds(lambda d, k: StridedShard(d, split_factor=k), dims, st.integers(2, 4)),
        st.just(Partial()),
    )
    placements = draw(st.lists(placement, min_size=n_axes, max_size=n_axes))
    return shape, SourceLayout("dense", axes, placements), sizes


@settings(max_examples=300)  # x every coordinate of the mesh: well over 1,000 rank cases
@given(geometry=geometries())
def test_local_shape_and_offset_match_dtensor_on_every_rank(
    geometry: tuple[tuple[int, ...], SourceLayout, dict[str, int]],
) -> None:
    shape, layout, sizes = geometry
    mesh = Mesh(sizes)
    for coordinate in coordinates(names(layout), sizes):
        expected = dtensor_shape_and_offset(shape, layout, sizes, coordinate)
        assert local_shape_and_offset(shape, layout, sizes, coordinate) == expected
        assert local_shape_and_offset(shape, layout, mesh, coordinate) == expected


@given(geometry=geometries())
def test_local_runs_are_the_blocks_torch_cuts(
    geometry: tuple[tuple[int, ...], SourceLayout, dict[str, int]],
) -> None:
    shape, layout, sizes = geometry
    for coordinate in coordinates(names(layout), sizes):
        runs = local_runs(shape, layout, sizes, coordinate)
        theirs = dtensor_indices(shape, layout, sizes, coordinate)
        for dim in range(len(shape)):
            mine = tuple(i for run in runs[dim] for i in run)
            assert mine == theirs[dim]
            assert all(len(r) > 0 for r in runs[dim])
            assert all(a.stop < b.start for a, b in itertools.pairwise(runs[dim]))


@given(geometry=geometries())
def test_ranks_tile_each_dim(
    geometry: tuple[tuple[int, ...], SourceLayout, dict[str, int]],
) -> None:
    """Along every dim each index is held by exactly the ranks of the axes not sharding it."""
    shape, layout, sizes = geometry
    for dim, n in enumerate(shape):
        counts = [0] * n
        for coordinate in coordinates(names(layout), sizes):
            for run in local_runs(shape, layout, sizes, coordinate)[dim]:
                for i in run:
                    counts[i] += 1
        replicas = math.prod(
            sizes[a.name]
            for a, p in zip(layout.axes, layout.placements, strict=True)
            if not (isinstance(p, Shard | StridedShard) and p.dim == dim)
        )
        assert counts == [replicas] * n


# ---------------------------------------------------------------------------------------
# a whole model, parameter by parameter: plan -> table -> distribute -> fully_shard


def tied_tp_plan() -> ShardingPlan:
    return ShardingPlan(
        {
            "emb": ModulePlan({"weight": {"tp": S0}}),
            "up": ModulePlan({"weight": {"tp": S0}, "bias": {"tp": S0}}),
            "down": ModulePlan({"weight": {"tp": S1}, "bias": {"tp": R}}),
            "head": ModulePlan({"weight": {"tp": R}}),
        },
        mesh_axes=["dp_replicate", "dp_shard", "tp"],
        tied_pairs=[("emb.weight", "head.weight")],
    )


@pytest.mark.parametrize(
    ("sizes", "replicate"),
    [(FSDP, ()), (HSDP, REP)],
    ids=["fsdp", "hsdp"],
)
def test_compose_fsdp_predicts_a_whole_model(
    world_mesh: MeshFactory, sizes: dict[str, int], replicate: tuple[str, ...]
) -> None:
    mesh = world_mesh(sizes)
    table = build_table(tied_tp_plan(), list(sizes))
    assert table["head.weight"] == table["emb.weight"]  # R ⊔ S(0): the finer sharding wins
    model = TiedTP()
    distribute(model, table, {"dense": mesh})
    fully_shard(model, mesh=mesh[(*replicate, "dp_shard")])
    assert model.head.weight is model.emb.weight
    for fqn, param in model.named_parameters(remove_duplicate=False):
        assert isinstance(param, DTensor)
        predicted = compose_fsdp(
            table[fqn], shard_axis="dp_shard", replicate_axes=replicate, mesh_sizes=sizes
        )
        assert predicted == layout_of(param), fqn
