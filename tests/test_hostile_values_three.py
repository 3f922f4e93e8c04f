"""Hostile input, round three: order, bounds, one reader, and the laws of every value.

A collection whose order is part of a value (a dim's parts, the units, a layout's axes, a
shape, a mesh's axes) is refused when it is a set, and read only up to its bound; the
converter reads ``Part`` and ``Packed`` with the checks of ``shapes.json``; every public
value refuses a second ``__init__``, and names the argument of a call it cannot take;
``==``, ``hash`` and the fingerprint agree.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import operator
import pickle
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, cast

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layout_algebra
from layout_algebra import (
    Chunk,
    Drop,
    LayoutError,
    LintNote,
    LintProblem,
    LintReport,
    Mesh,
    ModulePlan,
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Partial,
    RankMemory,
    Read,
    Replicate,
    ReshardPlan,
    SerializationError,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    TableDiff,
    Training,
    reshard_plan,
    strip,
)
from layout_algebra._frozen import NOT_GIVEN, FrozenMap
from layout_algebra.fsdp import FsdpParts
from layout_algebra.lint import Coverage
from layout_algebra.serialization import converter, from_json, shapes_from_json, to_json
from layout_algebra.structure import MAX_PARTS, structure_from_obj
from layout_algebra.training import MAX_UNITS, BudgetExcess, TrainingCost
from tests.strategies import meshes, packeds, param_shapes, parts, trainings

W = SourceLayout("dense", ["tp"], [Shard(0)])
X = SourceLayout("dense", ["tp"], [Replicate()])
MEMORY = RankMemory((8, 8), {"dense": (8, 8)}, (8, 8))
PROBLEM = LintProblem("w: wrong", kind="storage", fqn="w", ranks=(1, 2), axis="dp")


def _raises(make: Callable[[], object], *parts: str) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        make()
    for part in parts:
        assert part in str(info.value), (part, str(info.value))
    return info.value


class _Counted:
    """An iterable that counts what is read of it: ``items`` for ever, or up to ``stop``."""

    def __init__(self, items: Iterator[object], stop: int) -> None:
        self.items, self.stop, self.read = items, stop, 0

    def __iter__(self) -> Iterator[object]:
        for item in self.items:
            if self.read >= self.stop:
                return  # a test must end: the code before the fix read all of it
            self.read += 1
            yield item


# --- item 6: order and bounds ----------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (Packed, "Packed(parts)"),
        (lambda v: Training(units=v), "Training(units=...)"),
        (lambda v: SourceLayout("dense", v, [Shard(0)]), "axes"),
        (strip, "axes"),
        (lambda v: ShardingPlan({}, mesh_axes=v), "mesh_axes"),
        (Mesh, "Mesh"),
        (lambda v: ParamShape(v, "float32"), "a shape"),
        (lambda v: Chunk(v, (4,)), "Chunk.offsets"),
        (lambda v: RankMemory(v, {}, (8,)), "RankMemory(bytes_per_rank)"),
        (lambda v: LintReport(v, (), MEMORY), "LintReport(problems)"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.parametrize("kind", [set, frozenset])
def test_a_set_where_order_counts_is_refused(
    make: Callable[[object], object], argument: str, kind: type
) -> None:
    items: dict[str, object] = {
        "Packed(parts)": Part("q", 4),
        "Training(units=...)": "layers.*",
        "Mesh": ("tp", 2),
        "a shape": 4,
        "Chunk.offsets": 0,
        "RankMemory(bytes_per_rank)": 8,
        "LintReport(problems)": PROBLEM,
    }
    value = kind([items.get(argument, "tp")])
    error = _raises(lambda: make(value), argument, "order", "list or tuple")
    assert "set" in error.message


def test_what_keeps_an_order_of_its_own_is_read_in_it() -> None:
    sizes = {"dp": 2, "tp": 4}
    layout = SourceLayout("dense", sizes.keys(), [Replicate()] * 2)
    assert [a.name for a in layout.axes] == ["dp", "tp"]
    assert Mesh(sizes.items()) == Mesh(sizes) and Mesh(iter([("dp", 2)])) == Mesh({"dp": 2})
    made = Packed(p for p in [Part("q", 4), Part("k", 2)])  # type: ignore[arg-type]  # any iterable
    assert made.parts[1].name == "k"
    assert Training(units=iter(["b", "a"])).units == ("b", "a")
    # a set of owned or inactive axes has no order to lose
    assert [a.name for a in strip(["dp", "tp"], owned={"dp"})] == ["tp"]
    assert [a.name for a in strip(["dp", "tp"], owned=frozenset({"dp", "cp"}))] == ["tp"]


@pytest.mark.parametrize(
    ("make", "bound", "words"),
    [
        (Packed, MAX_PARTS, ["Packed(parts)", "more than"]),
        (lambda it: Training(units=it), MAX_UNITS, ["Training(units=...)", "more than"]),
        (lambda it: RankMemory(it, {}, ()), 2**20, ["RankMemory(bytes_per_rank)", "more than"]),
    ],
    ids=["Packed", "Training", "RankMemory"],
)
def test_an_endless_iterable_is_read_up_to_its_bound(
    make: Callable[[object], object], bound: int, words: list[str]
) -> None:
    endless: dict[str, Iterator[object]] = {
        "Packed(parts)": itertools.repeat(Part("q", 1)),
        "Training(units=...)": (f"layers.{i}" for i in itertools.count()),
        "RankMemory(bytes_per_rank)": itertools.repeat(8),
    }
    counted = _Counted(endless[words[0]], stop=4 * bound)
    _raises(lambda: make(counted), *words)
    assert counted.read <= bound + 1


@pytest.mark.parametrize("items", [itertools.repeat(Part("q", 1)), itertools.count()])
def test_endless_parts_of_any_kind_are_refused(items: Iterator[object]) -> None:
    counted = _Counted(items, stop=4 * MAX_PARTS)
    _raises(lambda: Packed(counted), "Packed(parts)")  # type: ignore[arg-type]
    assert counted.read <= MAX_PARTS + 1


class _EndlessMapping(Mapping[object, object]):
    """A mapping whose keys never end (each key built on demand), counting what is read."""

    def __init__(self, value: object) -> None:
        self.value, self.read = value, 0

    def __getitem__(self, key: object) -> object:
        return self.value

    def __iter__(self) -> Iterator[object]:
        for key in itertools.count():
            if self.read >= 10_000:
                return  # a test must end: the code before the fix read all of it
            self.read += 1
            yield key

    def __len__(self) -> int:
        return 1


def test_an_endless_structure_is_read_up_to_its_bound() -> None:
    structure = _EndlessMapping(Packed([Part("q", 4)]))
    _raises(lambda: ParamShape((4,), "float32", structure=structure), "structure", "64")  # type: ignore[arg-type]
    assert structure.read <= 65


def test_an_endless_mesh_mapping_is_read_up_to_its_bound() -> None:
    sizes = _EndlessMapping(2)
    _raises(lambda: Mesh(sizes), "Mesh", "256")  # type: ignore[arg-type]
    assert sizes.read <= 257


# --- items 7 and 16: every public value, its __init__ and its calls ----------------------


def _table_plan() -> ReshardPlan:
    table = ParamLayoutTable({"w": W})
    shapes = {"w": ParamShape((4, 4), "float32")}
    return reshard_plan(
        table, table, shapes, src_sizes={"dense": {"tp": 2}}, dst_sizes={"dense": {"tp": 2}}
    )


Call = tuple[tuple[object, ...], dict[str, object]]


def _call(*args: object, **kwargs: object) -> Call:
    return args, kwargs


SAMPLES: Final[dict[type, tuple[Call, Call]]] = {
    layout_algebra.AxisName: (_call("tp"), _call("ep")),
    Chunk: (_call((0, 0), (4, 4)), _call((4, 0), (4, 4))),
    Drop: (_call("w", "dense", "tp", Shard(0)), _call("v", "dense", "ep", Shard(1))),
    LintNote: (_call("w", "uneven"), _call("v", "other", 3)),
    LintReport: (_call((), (), MEMORY), _call((PROBLEM,), (), MEMORY)),
    Mesh: (_call({"tp": 2}), _call({"dp": 2, "tp": 2})),
    ModulePlan: (_call({"w": {"tp": Shard(0)}}), _call({"v": {"tp": Shard(1)}})),
    Packed: (_call([Part("q", 4)]), _call([Part("k", 2), Part("v", 2)])),
    ParamLayoutTable: (_call({"a": W}), _call({"b": X}, tied=())),
    ParamShape: (_call((4, 4), "float32"), _call((8,), "bfloat16")),
    Part: (_call("q", 4), _call("k", 2, 8)),
    Partial: (_call(), _call("max")),
    RankMemory: (_call((8, 8), {"dense": (8, 8)}, (8, 8)), _call((1,), {}, (1,))),
    Read: (
        _call("w", Chunk((0,), (4,)), (0,), (0,), (4,)),
        _call("v", Chunk((0,), (2,)), (0,), (0,), (2,)),
    ),
    Replicate: (_call(), _call()),
    Shard: (_call(0), _call(5)),
    ShardingPlan: (
        _call({"m": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"]),
        _call({}, mesh_axes=["ep"]),
    ),
    SourceLayout: (_call("dense", ["tp"], [Shard(0)]), _call("expert", ["ep"], [Replicate()])),
    StridedShard: (_call(0, split_factor=2), _call(1, split_factor=4)),
    TableDiff: (_call({}, {}, {}), _call({"w": W}, {}, {})),
    Training: (_call(), _call(optimizer="sgd", units=["layers.*"])),
    layout_algebra.Activations: (
        _call(units={"layers.0": {"heads": 64}}, batch=1, seq_len=2),
        _call(units={"": {"fixed": 8}}, batch=2, seq_len=4, checkpointing="full"),
    ),
    layout_algebra.FSDPUnit: (
        _call("layers.*"),
        _call(["norm", "lm_head"], reshard_after_forward=False),
    ),
    layout_algebra.Optimizer: (_call(states=2, scalars=1), _call(states=1)),
    layout_algebra.Stages: (
        _call("pp", [["embed", "layers.0"], ["layers.1", "head"]]),
        _call("pp", [["a"], ["b"], ["c"], ["d"]], schedule="interleaved-1f1b", microbatches=8),
    ),
    # values inside the reports, and the package's own frozen mapping
    Coverage: (
        _call(W, ParamShape((4, 4), "float32"), 1),
        _call(X, ParamShape((2,), "float32"), 2, "twice"),
    ),
    TrainingCost: (
        _call(
            {k: (8,) for k in layout_algebra.training.KINDS},
            {t: (1,) for t in layout_algebra.training.TRAFFIC},
            (8,),
        ),
        _call(
            {k: (4,) for k in layout_algebra.training.KINDS},
            {t: (2,) for t in layout_algebra.training.TRAFFIC},
            (4,),
        ),
    ),
    BudgetExcess: (_call("over", "w", (0,)), _call("far over", "v", (0, 1))),
    layout_algebra.FitRow: (
        _call({"dense": Mesh({"dp_shard": 2})}, 8, {"all_gather": 4}),
        _call(Mesh({"dp_shard": 4}), 16, {}, ("a note",)),
    ),
    FrozenMap: (_call({"tp": 2}), _call({"ep": 4})),
    FsdpParts: (_call(X, (), None, 0), _call(W, (), layout_algebra.AxisName("dp"), 1)),
}
"""Two valid calls of each value class: the value, and other arguments for its ``__init__``."""

EXPORTED: Final = [
    value
    for name in layout_algebra.__all__
    if isinstance(value := getattr(layout_algebra, name), type)
    and not issubclass(value, BaseException)
]

UNCHANGED_BY_DESIGN: Final = {
    Replicate: "no fields: its __init__ has nothing to set (Python runs it on the one object)",
    ModulePlan: "made whole in __new__: its __init__ is object's, which sets nothing",
}


def test_every_public_value_class_has_samples() -> None:
    made_by_calls = (ReshardPlan, layout_algebra.FitReport)  # each refuses any __init__
    missing = sorted(c.__name__ for c in EXPORTED if c not in SAMPLES and c not in made_by_calls)
    assert not missing, f"add two valid calls of {missing} to SAMPLES"


def _make(cls: type, call: Call) -> Any:
    args, kwargs = call
    return cls(*args, **kwargs)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_a_second_init_never_changes_a_value(cls: type) -> None:
    value, other = SAMPLES[cls]
    made = _make(cls, value)
    before, hashed, copied = repr(made), hash(made), copy.deepcopy(made)
    args, kwargs = other
    if cls in UNCHANGED_BY_DESIGN:
        made.__init__(*args, **kwargs)
    else:
        _raises(lambda: made.__init__(*args, **kwargs), "immutable", cls.__name__)
    assert repr(made) == before and hash(made) == hashed and made == copied
    assert made == _make(cls, value) and hash(_make(cls, value)) == hashed


def test_a_reshard_plan_refuses_any_init() -> None:
    plan = _table_plan()
    before, hashed = repr(plan), hash(plan)
    _raises(plan.__init__, "reshard_plan")  # type: ignore[misc]
    _raises(lambda: ReshardPlan(not_an_argument=1), "ReshardPlan", "reshard_plan")
    assert repr(plan) == before and hash(plan) == hashed


def _named_call(cls: type, call: Call) -> dict[str, object]:
    """``call`` with every argument given by name."""
    args, kwargs = call
    return dict(inspect.signature(cls).bind(*args, **kwargs).arguments)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_a_call_a_value_cannot_take_names_the_class_and_the_argument(cls: type) -> None:
    args, kwargs = SAMPLES[cls][0]
    name = cls.__name__
    error = _raises(
        lambda: cls(*args, **kwargs, not_an_argument=1), f"{name}()", "'not_an_argument'"
    )
    assert f"call {name}(" in error.message
    _raises(lambda: cls(*args, *([None] * 9), **kwargs), f"{name}()", "positional", f"call {name}(")
    required = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.default is NOT_GIVEN or p.default is inspect.Parameter.empty
    ]
    named = _named_call(cls, SAMPLES[cls][0])
    for arg in required:
        rest = {k: v for k, v in named.items() if k != arg}
        _raises(lambda: cls(**rest), f"{name}()", f"'{arg}'", "not given")  # noqa: B023
    for arg in list(named)[:1]:
        twice = {arg: named[arg]}
        positional = [v for k, v in named.items() if k == arg]
        if inspect.signature(cls).parameters[arg].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            _raises(lambda: cls(*positional, **twice), f"{name}()", f"'{arg}' twice")  # noqa: B023


def test_a_misspelt_argument_is_suggested() -> None:
    _raises(lambda: Training(unit=["layers.*"]), "Training()", "'unit'", "did you mean 'units'")  # type: ignore[call-arg]
    _raises(lambda: Part("q", 4, sise=2), "Part()", "'sise'", "did you mean 'size'")  # type: ignore[call-arg]
    _raises(lambda: Training("adamw"), "Training()", "keywords")  # type: ignore[call-arg]


def test_a_call_that_fits_keeps_its_own_type_error_out_of_the_way() -> None:
    # the arguments fit: whatever the value's own checks say is what is raised
    _raises(lambda: Part("q", "4"), "count")  # type: ignore[arg-type]
    assert inspect.signature(Part).parameters.keys() == {"name", "count", "size"}
    assert inspect.signature(Shard).parameters.keys() == {"dim"}


# --- item 16: the laws of equality, hash and the fingerprint ------------------------------


def test_the_mesh_of_no_axes_prints_what_parse_reads() -> None:
    empty = Mesh({})
    assert str(empty) == "" and Mesh.parse(str(empty)) == empty == Mesh(())
    assert empty.size == 1 and empty.coordinate(0) == () and empty.rank(()) == 0
    assert Mesh.parse(" ") == empty
    _raises(lambda: Mesh.parse("\u3000"), "name=size")  # only ASCII spaces are blank


@given(meshes())
def test_every_mesh_prints_what_parse_reads(mesh: Mesh) -> None:
    assert Mesh.parse(str(mesh)) == mesh and hash(Mesh.parse(str(mesh))) == hash(mesh)


def test_a_mesh_equals_only_a_mesh_with_its_axes_in_order() -> None:
    ab, ba = Mesh({"a": 2, "b": 3}), Mesh({"b": 3, "a": 2})
    assert ab != ba
    for other in (
        {"a": 2, "b": 3},
        FrozenMap({"b": 3, "a": 2}),
        types.MappingProxyType({"a": 2, "b": 3}),
    ):
        assert ab != other and other != ab
        assert ba != other and other != ba
    assert ab == Mesh([("a", 2), ("b", 3)]) and hash(ab) == hash(Mesh([("a", 2), ("b", 3)]))


@st.composite
def _mappings(draw: st.DrawFn) -> Mapping[str, int]:
    """Sizes by axis of a few kinds: a mesh, a dict, a FrozenMap, a read-only proxy."""
    mesh = draw(meshes(max_axes=2))
    kind = draw(st.sampled_from(["mesh", "dict", "frozen", "proxy"]))
    if kind == "mesh":
        return mesh
    items = dict(mesh)
    if kind == "frozen":
        return FrozenMap(items)
    return items if kind == "dict" else types.MappingProxyType(items)


@given(_mappings(), _mappings(), _mappings())
def test_mesh_equality_is_an_equivalence_and_hash_follows_it(
    a: Mapping[str, int], b: Mapping[str, int], c: Mapping[str, int]
) -> None:
    assert a == a  # noqa: PLR0124  # reflexive: what is tested
    assert (a == b) == (b == a)
    assert operator.ne(a, b) is not operator.eq(a, b)
    if a == b and b == c:
        assert a == c
    if a == b and isinstance(a, Mesh | FrozenMap) and isinstance(b, Mesh | FrozenMap):
        assert hash(a) == hash(b)
    if isinstance(a, Mesh) and a == b:
        assert isinstance(b, Mesh) and a.axes == b.axes


def test_equal_tables_have_one_fingerprint_whatever_they_dropped() -> None:
    entries = {"emb.weight": W, "norm.weight": X}
    plain = ParamLayoutTable(entries)
    dropped = ParamLayoutTable(entries, dropped=[Drop("norm.weight", "dense", "tpp", Shard(0))])
    assert plain == dropped and hash(plain) == hash(dropped)
    assert plain.fingerprint() == dropped.fingerprint()
    assert ParamLayoutTable({**entries, "x": W}).fingerprint() != plain.fingerprint()
    assert "dropped" in (ParamLayoutTable.fingerprint.__doc__ or "")


def test_a_drop_edited_in_a_signed_document_leaves_the_table_it_signs() -> None:
    table = ParamLayoutTable({"w": W}, dropped=[Drop("w", "dense", "tpp", Shard(0))])
    text = to_json(table)
    edited = text.replace('"placement": "S(0)"', '"placement": "S(1)"')
    assert edited != text
    back = from_json(edited)
    assert back == table and back.fingerprint() == table.fingerprint()
    assert back.dropped == (Drop("w", "dense", "tpp", Shard(1)),)


# --- item 8: one reader of parts --------------------------------------------------------

_BAD_PARTS: Final[list[tuple[dict[str, object], str]]] = [
    ({"name": "q", "count": 4.9}, "count"),
    ({"name": "q", "count": 4.0}, "count"),
    ({"name": "q", "count": "4"}, "count"),
    ({"name": "q", "count": True}, "count"),
    ({"name": "q", "count": "\u0667"}, "count"),
    ({"name": "q", "count": "1_000"}, "count"),
    ({"name": "q", "count": 4, "size": "2"}, "size"),
    ({"name": "q", "count": 4, "size": 2.0}, "size"),
    ({"name": True, "count": 4}, "name"),
    ({"name": 7, "count": 4}, "name"),
    ({"name": "a b", "count": 4}, "name"),
    ({"name": "q", "count": 0}, "count"),
    ({"name": "q", "count": 4, "heads": 2}, ""),
    ({"name": "q"}, ""),
    ({"count": 4}, ""),
]


@pytest.mark.parametrize(("obj", "field"), _BAD_PARTS, ids=lambda v: repr(v)[:40])
def test_the_converter_refuses_a_part_as_shapes_json_does(
    obj: dict[str, object], field: str
) -> None:
    with pytest.raises(SerializationError) as direct:
        converter.structure(obj, Part)
    assert direct.value.path == (field or "$")
    with pytest.raises(SerializationError) as packed:
        converter.structure([{"name": "k", "count": 2}, obj], Packed)
    assert packed.value.path == "[1]" + (f".{field}" if field else "")
    with pytest.raises(SerializationError) as in_shapes:
        structure_from_obj({"0": [{"name": "k", "count": 2}, obj]})
    assert in_shapes.value.path == '"0"[1]' + (f".{field}" if field else "")
    # the same words: one reader
    assert direct.value.message.partition(": ")[2] == in_shapes.value.message.partition(": ")[2]
    doc = {
        "version": 1,
        "params": {"w": {"shape": [6], "dtype": "float32", "structure": {"0": [obj]}}},
    }
    with pytest.raises(SerializationError):
        shapes_from_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"parts": [{"name": "q", "count": 4}]}, "$"),  # a Packed is the list of its parts
        ([], "$"),
        ([{"name": "q", "count": 4}, {"name": "q", "count": 4}], "$"),
        ("[q: 4]", "$"),
        ([{"name": "q", "count": 4}, [1]], "[1]"),
    ],
)
def test_the_converter_refuses_a_packed_as_shapes_json_does(obj: object, path: str) -> None:
    with pytest.raises(SerializationError) as info:
        converter.structure(obj, Packed)
    assert info.value.path == path


@attrs.frozen
class _Holder:
    """A user's own attrs class holding the values inside a dim."""

    packed: Packed
    parts: list[Part]


def test_the_paths_inside_a_users_class_reach_the_bad_value() -> None:
    good = {"packed": [{"name": "q", "count": 4, "size": 2}], "parts": [{"name": "e", "count": 8}]}
    held = converter.structure(good, _Holder)
    assert held == _Holder(Packed([Part("q", 4, 2)]), [Part("e", 8)])
    assert converter.unstructure(held) == {
        "packed": [{"name": "q", "count": 4, "size": 2}],
        "parts": [{"name": "e", "count": 8, "size": 1}],
    }
    bad = {**good, "parts": [{"name": "e", "count": 8}, {"name": "f", "count": "8"}]}
    with pytest.raises(SerializationError) as info:
        converter.structure(bad, _Holder)
    assert info.value.path == "parts[1].count"
    bad = {**good, "packed": [{"name": "q", "count": 4, "size": 2.5}]}
    with pytest.raises(SerializationError) as info:
        converter.structure(bad, _Holder)
    assert info.value.path == "packed[0].size"


# --- the new values under Hypothesis: values by every law --------------------------------

_VALUES = st.one_of(parts(), packeds(), meshes(), param_shapes(), trainings())


@given(_VALUES)
def test_the_newer_values_are_values(value: object) -> None:
    again = copy.deepcopy(value)
    assert again == value and hash(again) == hash(value)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(value, protocol))
        assert back == value and hash(back) == hash(value)
    obj = converter.unstructure(value)
    assert converter.structure(json.loads(json.dumps(obj)), type(value)) == value
    fields = attrs.fields(cast("type[attrs.AttrsInstance]", type(value)))
    with pytest.raises(LayoutError, match="immutable"):
        value.__init__(*(getattr(value, f.name) for f in fields if not f.kw_only))  # type: ignore[misc]
    assert copy.deepcopy(value) == again


@given(_VALUES, st.sampled_from([set, frozenset]))
def test_the_newer_values_are_never_made_from_a_set(value: object, kind: type) -> None:
    make: dict[type, Callable[[Any], object]] = {
        Part: lambda v: Packed(kind([v])),
        Packed: lambda v: Packed(kind(v.parts)),
        Mesh: lambda v: Mesh(kind(v.axes)),
        ParamShape: lambda v: ParamShape(kind(v.shape), v.dtype),
        Training: lambda v: Training(units=kind(v.units)),
    }
    _raises(lambda: make[type(value)](value), "order")
