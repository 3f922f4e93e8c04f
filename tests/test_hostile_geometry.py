"""Hostile input to the geometry, checkpoint, JAX and drawing modules.

Each class of hole is pinned here: a shard of a dim the tensor lacks, text where a
sequence belongs, one bound on dims (64 accepted, 65 refused) everywhere, a split factor
that cannot be checked without sizes, value types that accept anything, and shapes or
shape mappings whose reading raises. Every one is a ``LayoutError`` naming what is wrong.
"""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import attrs
import pytest
import torch
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor import distribute_tensor

from layout_algebra import (
    Chunk,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    PlanError,
    Read,
    ReshardPlan,
    Shard,
    SourceLayout,
    StridedShard,
    compose_fsdp,
    compose_table,
    dcp_chunks,
    from_partition_spec,
    local_shape_and_offset,
    reshard_plan,
    to_partition_spec,
)
from layout_algebra._args import MAX_NDIM
from layout_algebra.axes import AxisName
from layout_algebra.draw import draw
from layout_algebra.fsdp import FsdpParts, fsdp_storage_runs, split_fsdp
from layout_algebra.geometry import local_runs
from tests.torch_oracle import MeshFactory

S0, S1 = Shard(0), Shard(1)
TP0: Final = SourceLayout("dense", ["tp"], [S0])
TP1: Final = SourceLayout("dense", ["tp"], [S1])
SIZES: Final = {"tp": 2}
ROLES: Final = {"dense": {"tp": 2}}
CHUNK: Final = Chunk((0, 0), (4, 8))
FSDP_SIZES: Final = {"dp": 2, "tp": 2}
FSDP_ROLES: Final = {"dense": FSDP_SIZES}
COMPOSED: Final = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), S0])


def _raises(make: Callable[[], object], *words: str) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        make()
    for word in words:
        assert word in info.value.message, info.value.message
    assert type(info.value).__module__ == "layout_algebra.errors"
    return info.value


# ---------------------------------------------------------------------------------------
# a dim the tensor lacks: one rule for every reader of a layout against a shape

LACKING: Final = [
    pytest.param(TP1, (4,), "S(1)", id="S(1) on 1-D"),
    pytest.param(TP0, (), "S(0)", id="S(0) on 0-d"),
    pytest.param(
        SourceLayout("dense", ["dp", "tp"], [StridedShard(1, split_factor=2), S0]),
        (8,),
        "_S(1, 2)",
        id="_S(1, 2) on 1-D",
    ),
]


@pytest.mark.parametrize(("layout", "shape", "shown"), LACKING)
def test_dcp_chunks_refuses_a_dim_the_tensor_lacks(
    layout: SourceLayout, shape: tuple[int, ...], shown: str
) -> None:
    sizes = {"dp": 2, "tp": 2}
    error = _raises(lambda: dcp_chunks(layout, shape, sizes), f"{shown} on axis", "shards dim")
    assert error.placement == shown
    # the same rule, the same message, as local_shape_and_offset
    coordinate = {"dp": 0, "tp": 0}
    same = _raises(lambda: local_shape_and_offset(shape, layout, sizes, coordinate))
    assert same.message == error.message


@pytest.mark.parametrize(("layout", "shape", "shown"), LACKING)
def test_every_reader_refuses_a_dim_the_tensor_lacks(
    layout: SourceLayout, shape: tuple[int, ...], shown: str
) -> None:
    sizes = {"dp": 2, "tp": 2}
    ndim = len(shape)
    _raises(lambda: local_runs(shape, layout, sizes, {"dp": 0, "tp": 0}), shown)
    _raises(lambda: fsdp_storage_runs(shape, layout, sizes, {"dp": 0, "tp": 0}), shown)
    _raises(lambda: to_partition_spec(layout, ndim, mesh_sizes=sizes), shown)
    if shape:  # draw takes parameters of one dim or more
        _raises(lambda: draw(layout, shape, sizes, fqn="w"), "w: ", shown)


def test_torch_refuses_a_dim_the_tensor_lacks_too(world_mesh: MeshFactory) -> None:
    with pytest.raises(Exception):  # noqa: B017 - torch's own error, whatever its type
        distribute_tensor(torch.zeros(4), world_mesh({"tp": 8}), [TorchShard(1)])


def test_reshard_plan_refuses_a_saved_layout_of_a_dim_the_tensor_lacks() -> None:
    """The saved side is read by ``dcp_chunks``'s rule: a 1-D tensor saved under ``S(1)``
    is no checkpoint, whatever it is loaded under."""
    src = ParamLayoutTable({"w": TP1})
    dst = ParamLayoutTable({"w": TP0})
    with pytest.raises(PlanError) as info:
        reshard_plan(src, dst, {"w": ParamShape((4,), "float32")}, src_sizes=ROLES, dst_sizes=ROLES)
    (problem,) = info.value.problems
    assert problem.fqn == "w" and "S(1) on axis 'tp' shards dim 1," in problem.message


# ---------------------------------------------------------------------------------------
# text where a sequence belongs


def _shape_of(value: object) -> Any:
    return type("P", (), {"shape": value, "dtype": "float32"})()


def _h(value: object) -> Any:
    """A hostile value, passed where the signature says otherwise."""
    return value


TEXT_AS_SEQUENCE: Final[dict[str, Callable[[Any], object]]] = {
    "dcp_chunks": lambda t: dcp_chunks(TP0, t, SIZES),
    "local_shape_and_offset": lambda t: local_shape_and_offset(t, TP0, SIZES, {"tp": 0}),
    "local_runs": lambda t: local_runs(t, TP0, SIZES, {"tp": 0}),
    "fsdp_storage_runs": lambda t: fsdp_storage_runs(t, TP0, SIZES, {"tp": 0}),
    "draw": lambda t: draw(TP0, t, SIZES),
    "to_partition_spec(shape=)": lambda t: to_partition_spec(TP0, 2, mesh_sizes=SIZES, shape=t),
    "from_partition_spec(spec)": lambda t: from_partition_spec(
        t, mesh="dense", axes=["tp"], mesh_sizes=SIZES
    ),
    "from_partition_spec(axes=)": lambda t: from_partition_spec(
        ("tp",), mesh="dense", axes=t, mesh_sizes=SIZES
    ),
    "Chunk.offsets": lambda t: Chunk(t, (4, 8)),
    "Chunk.sizes": lambda t: Chunk((0, 0), t),
    "Read.dest_offsets": lambda t: Read("w", CHUNK, t, (0, 0), (4, 8)),
    "Read.storage_offsets": lambda t: Read("w", CHUNK, (0, 0), t, (4, 8)),
    "Read.lengths": lambda t: Read("w", CHUNK, (0, 0), (0, 0), t),
    "FsdpParts.replicate": lambda t: FsdpParts(TP0, t, None, 0),
    "compose_fsdp(replicate_axes=)": lambda t: compose_fsdp(
        TP0, shard_axis="dp", replicate_axes=t, mesh_sizes=FSDP_SIZES
    ),
    "compose_table(owned=)": lambda t: compose_table(
        ParamLayoutTable({"w": TP0}), fsdp={"dense": "dp"}, mesh_sizes=FSDP_ROLES, owned=t
    ),
    "split_fsdp(owned=)": lambda t: split_fsdp(COMPOSED, FSDP_SIZES, owned=t),
    "fsdp_storage_runs(owned=)": lambda t: fsdp_storage_runs(
        (4, 8), COMPOSED, FSDP_SIZES, {"dp": 0, "tp": 0}, owned=t
    ),
    "Mesh(axes)": Mesh,
    "Mesh.rank(coordinate)": lambda t: Mesh({"a": 2, "b": 2}).rank(t),
    "reshard_plan(shapes[fqn].shape)": lambda t: reshard_plan(
        ParamLayoutTable({"w": TP0}),
        ParamLayoutTable({"w": TP0}),
        {"w": _shape_of(t)},
        src_sizes=ROLES,
        dst_sizes=ROLES,
    ),
}


@pytest.mark.parametrize("text", ["tp", b"tp", "ab", b"\x04\x08"], ids=repr)
@pytest.mark.parametrize("name", sorted(TEXT_AS_SEQUENCE))
def test_text_given_for_a_sequence_never_gives_a_result(name: str, text: str | bytes) -> None:
    """``b"tp"`` is never the sizes 116 and 112, nor ``"tp"`` the axes ``t`` and ``p``."""
    with pytest.raises(LayoutError):
        TEXT_AS_SEQUENCE[name](text)


TEXT_AS_MAPPING: Final[dict[str, Callable[[Any], object]]] = {
    "compose_fsdp(mesh_sizes=)": lambda t: compose_fsdp(TP0, shard_axis="dp", mesh_sizes=t),
    "compose_table(mesh_sizes=)": lambda t: compose_table(
        ParamLayoutTable({"w": TP0}), fsdp={"dense": "dp"}, mesh_sizes=t
    ),
    "compose_table(mesh_sizes[role])": lambda t: compose_table(
        ParamLayoutTable({"w": TP0}), fsdp={"dense": "dp"}, mesh_sizes={"dense": t}
    ),
    "local_runs(mesh_sizes)": lambda t: local_runs((4, 8), TP0, t, {"tp": 0}),
    "local_runs(coordinate)": lambda t: local_runs((4, 8), TP0, SIZES, t),
    "local_shape_and_offset(mesh_sizes)": lambda t: local_shape_and_offset(
        (4, 8), TP0, t, {"tp": 0}
    ),
    "fsdp_storage_runs(mesh_sizes)": lambda t: fsdp_storage_runs(
        (4, 8), COMPOSED, t, {"dp": 0, "tp": 0}
    ),
    "split_fsdp(mesh_sizes)": lambda t: split_fsdp(COMPOSED, t),
    "draw(mesh_sizes)": lambda t: draw(TP0, (4, 8), t),
    "to_partition_spec(mesh_sizes=)": lambda t: to_partition_spec(TP0, 2, mesh_sizes=t),
    "from_partition_spec(mesh_sizes=)": lambda t: from_partition_spec(
        ("tp",), mesh="dense", axes=["tp"], mesh_sizes=t
    ),
}


@pytest.mark.parametrize("text", ["tp", b"tp", "tp=2", b"\x04\x08"], ids=repr)
@pytest.mark.parametrize("name", sorted(TEXT_AS_MAPPING))
def test_text_given_for_sizes_by_axis_never_gives_a_result(name: str, text: str | bytes) -> None:
    """A mesh is a ``Mesh`` or a mapping; its text is read by ``Mesh.parse`` only."""
    with pytest.raises(LayoutError):
        TEXT_AS_MAPPING[name](text)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: local_runs((4,), TP0, m, {"tp": 0}),
        lambda m: local_shape_and_offset((4,), TP0, m, {"tp": 0}),
        lambda m: compose_fsdp(TP0, shard_axis="dp", mesh_sizes={"dp": 2, **m}),
        lambda m: draw(TP0, (4,), m),
        lambda m: dcp_chunks(TP0, (4,), m),
        lambda m: to_partition_spec(TP0, 1, mesh_sizes=m, shape=(4,)),
    ],
    ids=["local_runs", "local_shape_and_offset", "compose_fsdp", "draw", "dcp_chunks", "jax"],
)
def test_an_axis_given_twice_is_never_one_of_its_sizes(call: Callable[[Any], object]) -> None:
    """``'tp'`` and ``AxisName('tp')`` are one axis: two sizes for it are refused, not the
    last one taken."""
    error = _raises(lambda: call({"tp": 2, AxisName("tp"): 4}), "names axis 'tp' twice")
    assert error.axis == "tp"


def test_a_coordinate_given_twice_on_an_axis_is_refused() -> None:
    where: Any = {"tp": 0, AxisName("tp"): 1}
    _raises(lambda: local_runs((4,), TP0, SIZES, where), "coordinate names axis 'tp' twice")


def test_dcp_chunks_of_bytes_is_no_checkpoint_of_a_116_by_112_tensor() -> None:
    _raises(lambda: dcp_chunks(TP0, b"tp", SIZES), "global_shape", "b'tp'")


# ---------------------------------------------------------------------------------------
# one bound on dims: 64 accepted, 65 refused, everywhere

BOUNDED: Final[dict[str, Callable[[int], object]]] = {
    "local_shape_and_offset": lambda n: local_shape_and_offset((2,) * n, TP0, SIZES, {"tp": 1}),
    "local_runs": lambda n: local_runs((2,) * n, TP0, SIZES, {"tp": 1}),
    "fsdp_storage_runs": lambda n: fsdp_storage_runs((2,) * n, TP0, SIZES, {"tp": 1}),
    "dcp_chunks": lambda n: dcp_chunks(TP0, (2,) * n, SIZES),
    "Chunk": lambda n: Chunk((0,) * n, (1,) * n),
    "Read": lambda n: Read("w", Chunk((0,) * n, (1,) * n), (0,) * n, (0,) * n, (1,) * n),
    "draw": lambda n: draw(TP0, (2,) * n, SIZES),
    "to_partition_spec": lambda n: to_partition_spec(TP0, n),
    "to_partition_spec(shape=)": lambda n: to_partition_spec(
        TP0, min(n, MAX_NDIM), mesh_sizes=SIZES, shape=(2,) * n
    ),
    "from_partition_spec": lambda n: from_partition_spec(
        ("tp", *(None,) * (n - 1)), mesh="dense", axes=["tp"], mesh_sizes=SIZES
    ),
    "reshard_plan": lambda n: reshard_plan(
        ParamLayoutTable({"w": TP0}),
        ParamLayoutTable({"w": TP0}),
        {"w": _shape_of((2,) * n)},
        src_sizes=ROLES,
        dst_sizes=ROLES,
    ),
}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_one_bound_on_dims_64_accepted_65_refused(name: str) -> None:
    assert MAX_NDIM == 64
    assert BOUNDED[name](64) is not None
    with pytest.raises(LayoutError) as info:
        BOUNDED[name](65)
    assert "64" in str(info.value)


def test_an_endless_shape_stops_at_the_bound() -> None:
    _raises(lambda: local_shape_and_offset(itertools.repeat(1), TP0, SIZES, {"tp": 0}), "64")
    _raises(lambda: dcp_chunks(TP0, itertools.count(1), SIZES), "more than 64 dims")
    _raises(lambda: from_partition_spec(itertools.repeat(None), mesh="d", axes=[], mesh_sizes={}))


def test_a_shape_is_read_once() -> None:
    """An iterator is a shape like any other: read once, never again for the offsets."""
    got = local_shape_and_offset(iter([10, 4]), TP0, {"tp": 4}, {"tp": 3})
    assert got == local_shape_and_offset((10, 4), TP0, {"tp": 4}, {"tp": 3}) == ((1, 4), (9, 0))


# ---------------------------------------------------------------------------------------
# a split factor that cannot be checked without sizes


def test_to_partition_spec_without_sizes_refuses_an_unverifiable_split_factor() -> None:
    wrong = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=3), S0])
    error = _raises(lambda: to_partition_spec(wrong, 1), "_S(0, 3)", "mesh_sizes")
    assert (error.axis, error.placement) == ("dp", "_S(0, 3)")
    # with sizes it is refused for what it is
    _raises(lambda: to_partition_spec(wrong, 1, mesh_sizes={"dp": 2, "tp": 2}), "not the product")
    # the right one, given sizes, is JAX's (tp, dp); the spec of _S(0, 2), never of _S(0, 3)
    right = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), S0])
    assert to_partition_spec(right, 1, mesh_sizes={"dp": 3, "tp": 2}) == (("tp", "dp"),)
    _raises(lambda: to_partition_spec(right, 1), "mesh_sizes")
    # plain shards need no sizes
    assert to_partition_spec(SourceLayout("dense", ["dp", "tp"], [S0, S0]), 1) == (("dp", "tp"),)


# ---------------------------------------------------------------------------------------
# values check their fields


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Read(_h(5), _h(None), (0,), (0,), (1,)), "Read.fqn"),
        (lambda: Read("", CHUNK, (0, 0), (0, 0), (4, 8)), "Read.fqn"),
        (lambda: Read("w", _h(None), (0,), (0,), (1,)), "Read.chunk"),
        (lambda: Read("w", _h((0, 4)), (0,), (0,), (1,)), "Read.chunk"),
        (lambda: Read("w", CHUNK, _h(None), (0, 0), (4, 8)), "Read.dest_offsets"),
        (lambda: Read("w", CHUNK, (0, 0), (0, -1), (4, 8)), "Read.storage_offsets"),
        (lambda: Read("w", CHUNK, (0, 0), (0, 0), _h((4.0, 8))), "Read.lengths"),
        (lambda: Read("w", CHUNK, (0,), (0, 0), (4, 8)), "one int per dim"),
        (lambda: Read("w", CHUNK, (0, 0), (2, 0), (4, 8)), "beyond chunk [0:4, 0:8]"),
        (lambda: Chunk(_h(None), (4,)), "Chunk.offsets"),
        (lambda: Chunk((0,), (True,)), "Chunk.sizes"),
        (lambda: Chunk((0,), (4, 4)), "one offset and one size per dim"),
        (lambda: Chunk((2**63 - 1,), (1,)), "beyond 2**63 - 1"),
        (lambda: FsdpParts(_h(None), (), None, 0), "FsdpParts.source"),
        (lambda: FsdpParts(TP0, _h(None), None, 0), "FsdpParts.replicate"),
        (lambda: FsdpParts(TP0, (), _h(5), 0), "FsdpParts.shard"),
        (lambda: FsdpParts(TP0, (), "dp_shard", _h("0")), "FsdpParts.shard_dim"),
        (lambda: FsdpParts(TP0, (), "dp_shard", 64), "FsdpParts.shard_dim"),
    ],
)
def test_values_refuse_fields_of_the_wrong_type(make: Callable[[], object], field: str) -> None:
    _raises(make, field)


def test_accepted_values_print() -> None:
    read = Read("w", CHUNK, (0, 0), (2, 0), (2, 8))
    assert str(read) == "w[2:4, 0:8] from chunk [0:4, 0:8]"
    parts = FsdpParts(TP0, ["dp_replicate"], "dp_shard", 1)
    assert parts.replicate == (AxisName("dp_replicate"),) and parts.shard == AxisName("dp_shard")


def _plan() -> ReshardPlan:
    table = ParamLayoutTable({"w": TP0})
    return reshard_plan(
        table, table, {"w": ParamShape((8, 4), "float32")}, src_sizes=ROLES, dst_sizes=ROLES
    )


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((None,), {}),
        (((64,), {"w": 64}), {"src": ParamLayoutTable({}), "dst": ParamLayoutTable({})}),
    ],
)
def test_a_reshard_plan_is_made_by_reshard_plan_only(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """Its reads are planned, never given: whatever the arguments, the class says to call
    ``reshard_plan``."""
    _raises(lambda: ReshardPlan(*args, **kwargs), "reshard_plan(")
    assert _plan().bytes_read == (64, 64)


# ---------------------------------------------------------------------------------------
# shapes and shape mappings whose reading raises


class _LenBreaks(list[int]):
    """A shape whose ``__len__`` raises."""

    def __len__(self) -> int:
        raise RuntimeError("the caller's __len__ broke")


class _IterBreaks(list[int]):
    """A shape whose iteration raises."""

    def __iter__(self) -> Iterator[int]:
        raise RuntimeError("the caller's __iter__ broke")


def _outcome(call: Callable[[], object]) -> object:
    """What ``call`` returns, or the type of ``LayoutError`` it raises (nothing else)."""
    try:
        return call()
    except LayoutError as e:
        return type(e)


@pytest.mark.parametrize("name", sorted(set(TEXT_AS_SEQUENCE) - {"from_partition_spec(axes=)"}))
def test_a_shape_whose_reading_raises_is_a_layout_error(name: str) -> None:
    make = TEXT_AS_SEQUENCE[name]
    with pytest.raises(LayoutError) as info:
        make(_IterBreaks([4, 8]))
    error = info.value.problems[0] if isinstance(info.value, PlanError) else info.value
    assert "could not be read" in error.message
    assert isinstance(error.__cause__, RuntimeError)
    # its length is never asked: read once, it is the shape its items make
    assert _outcome(lambda: make(_LenBreaks([4, 8]))) == _outcome(lambda: make([4, 8]))


class _ShapesBreak(dict[str, ParamShape]):
    """A shape mapping whose ``__len__``, iteration and ``items()`` raise."""

    def __len__(self) -> int:
        raise RuntimeError("the caller's __len__ broke")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("the caller's __iter__ broke")

    def items(self) -> Any:
        raise RuntimeError("the caller's items() broke")


def test_a_shape_mapping_whose_reading_raises_names_shapes() -> None:
    table = ParamLayoutTable({"w": TP0})
    shapes = _ShapesBreak({"w": ParamShape((8, 4), "float32")})
    error = _raises(
        lambda: reshard_plan(table, table, shapes, src_sizes=ROLES, dst_sizes=ROLES), "shapes"
    )
    assert isinstance(error.__cause__, RuntimeError)


class _PropertyBreaks:
    dtype = "float32"

    @property
    def shape(self) -> tuple[int, ...]:
        raise RuntimeError("the caller's property broke")


def test_a_shape_whose_attribute_raises_is_a_problem_naming_the_fqn() -> None:
    table = ParamLayoutTable({"w": TP0})
    with pytest.raises(PlanError) as info:
        reshard_plan(table, table, {"w": _PropertyBreaks()}, src_sizes=ROLES, dst_sizes=ROLES)
    (problem,) = info.value.problems
    assert problem.fqn == "w" and "could not be read" in problem.message


# ---------------------------------------------------------------------------------------
# str subclasses never reach a lookup


class _EqBreaks(str):
    """A name whose ``__eq__`` raises (its hash is its text's)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("the caller's __eq__ broke")

    def __hash__(self) -> int:
        return str.__hash__(self)


class _HashBreaks(str):
    __slots__ = ()

    def __hash__(self) -> int:
        raise RuntimeError("the caller's __hash__ broke")


class _Pairs(Mapping[str, object]):
    """A mapping of given pairs, read by ``items()`` only: it holds keys no dict can."""

    def __init__(self, *pairs: tuple[str, object]) -> None:
        self.pairs = pairs

    def __getitem__(self, key: str) -> object:
        raise AssertionError(key)  # never looked up: read once by items()

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def items(self) -> Any:
        return list(self.pairs)


@pytest.mark.parametrize("kind", [_EqBreaks, _HashBreaks])
def test_str_subclasses_are_read_as_their_text(kind: type[str]) -> None:
    table = ParamLayoutTable({"w": TP0})
    shapes: Any = _Pairs((kind("w"), ParamShape((8, 4), "float32")))
    plan = reshard_plan(table, table, shapes, src_sizes=ROLES, dst_sizes=ROLES)
    assert plan == _plan()
    assert plan.chunks_read(kind("w")) == 2
    read = Read(kind("w"), CHUNK, (0, 0), (0, 0), (4, 8))
    assert type(read.fqn) is str and read == Read("w", CHUNK, (0, 0), (0, 0), (4, 8))
    dims: Any = _Pairs((kind("w"), 1))
    composed = compose_table(
        table, fsdp={"dense": "dp"}, mesh_sizes={"dense": {"dp": 2, "tp": 2}}, shard_dim=dims
    )
    assert str(composed["w"]) == "dense[dp=S(1), tp=S(0)]"
    assert draw(TP0, (4,), SIZES, fqn=kind("w")).startswith("w: shape (4,)")


# ---------------------------------------------------------------------------------------
# values stay what they were made


def _values() -> list[object]:
    return [CHUNK, Read("w", CHUNK, (0, 0), (0, 0), (4, 8)), FsdpParts(TP0, (), "dp", 0)]


@pytest.mark.parametrize("value", _values(), ids=lambda v: type(v).__name__)
def test_a_second_init_is_refused(value: Any) -> None:
    before, hashed = repr(value), hash(value)
    again = attrs.astuple(value, recurse=False)
    if isinstance(value, Chunk):
        again = ((9, 9), (1, 1))
    _raises(lambda: value.__init__(*again), "immutable", "__init__ cannot run again")
    assert repr(value) == before and hash(value) == hashed
    assert pickle.loads(pickle.dumps(value)) == value == copy.deepcopy(value)


@pytest.mark.parametrize("cls", [Chunk, Read, FsdpParts], ids=lambda c: c.__name__)
def test_a_missing_argument_is_a_layout_error_naming_it(cls: Any) -> None:
    first = attrs.fields(cls)[0].alias
    _raises(cls, f"{cls.__name__}() needs the argument {first!r}")
