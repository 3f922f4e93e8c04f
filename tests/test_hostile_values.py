"""Values stay values: hostile lookups, keys and calls meet a LayoutError, never a rewrite.

Reports and their problems compare by value (pickled and copied too) and cannot be
reassigned; table equality is one transitive rule that ``hash`` follows; a second
``__init__`` never rewrites a frozen value (an interned placement least of all); keys
that are not text, text whose own ``__hash__`` or ``__eq__`` raises, and required
arguments left out each give a ``LayoutError`` naming what was wrong.
"""

from __future__ import annotations

import copy
import inspect
import operator
import pickle
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layout_algebra import (
    AxisName,
    Drop,
    LayoutError,
    LintNote,
    LintProblem,
    LintReport,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    Partial,
    PlanError,
    RankMemory,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    lint,
)
from layout_algebra._frozen import FrozenMap

W = SourceLayout("dense", ["tp"], [Shard(0)])
X = SourceLayout("dense", ["tp"], [Replicate()])


def _raises(make: Callable[[], object], *parts: str) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        make()
    for part in parts:
        assert part in str(info.value)
    return info.value


def _report() -> LintReport:
    """A report with a problem (storage, on three ranks) and a note."""
    table = ParamLayoutTable({"experts.w1": SourceLayout("expert", ["ep", "tp"], [Shard(0)] * 2)})
    return lint(
        table,
        {"experts.w1": ParamShape((5, 3), "bfloat16")},
        mesh_sizes={"expert": {"dp_shard": 2, "ep": 2, "tp": 2}},
        fsdp={"expert": "dp_shard"},
    )


# --- reports and problems are values ----------------------------------------------------


def test_a_report_with_problems_equals_its_pickled_and_copied_selves() -> None:
    report = _report()
    assert report.problems and report.notes
    again = _report()
    assert again == report and hash(again) == hash(report)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(report, protocol)) == report
    assert copy.deepcopy(report) == report == copy.copy(report)
    assert len({report, again, copy.deepcopy(report)}) == 1


def _problem(**changes: object) -> LintProblem:
    fields: dict[str, Any] = {"kind": "storage", "fqn": "w", "ranks": (1, 2), "axis": "dp"}
    fields |= {"placement": "S(0)", **changes}
    message = fields.pop("message", "w: wrong")
    return LintProblem(message, **fields)


def test_problems_compare_and_hash_by_value() -> None:
    p = _problem()
    assert p == _problem() and hash(p) == hash(_problem())
    assert p == _problem(ranks=[1, 2])  # ranks are a tuple whatever they were given as
    for change in (
        {"message": "w: other"},
        {"kind": "layout"},
        {"fqn": "v"},
        {"ranks": (1,)},
        {"axis": None},
        {"placement": "R"},
    ):
        assert p != _problem(**change), change
    assert p != LayoutError("w: wrong", fqn="w", axis="dp", placement="S(0)")

    class Other(LintProblem):
        pass

    assert p != Other(
        "w: wrong", kind="storage", fqn="w", ranks=(1, 2), axis="dp", placement="S(0)"
    )


def test_a_problem_cannot_be_reassigned_but_can_be_raised() -> None:
    p = _problem()
    for name, value in (
        ("fqn", "v"),
        ("ranks", ()),
        ("kind", "layout"),
        ("axis", "tp"),
        ("placement", "R"),
        ("args", ("other",)),
        ("extra", 1),
    ):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(p, name, value)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            delattr(p, name)
    assert p == _problem()
    # what Python sets on an exception it raises and chains stays settable
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise p from inner
    except LintProblem as caught:
        assert caught is p and p.__traceback__ is not None
        assert isinstance(p.__cause__, KeyError) and p.__context__ is p.__cause__
    p.add_note("seen in a test")
    p.__traceback__ = None
    assert p == _problem() and p.__notes__ == ["seen in a test"]
    _raises(lambda: p.__init__("x", kind="layout", fqn="v"), "immutable")  # type: ignore[misc]
    assert p == _problem() and p.args == ("w: wrong",)


def test_raise_for_problems_still_raises_the_problems_as_one_plan_error() -> None:
    report = _report()
    with pytest.raises(PlanError) as info:
        report.raise_for_problems()
    assert info.value.problems == report.problems
    assert info.value.fqn == "experts.w1"


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"message": None}, "LintProblem(message)"),
        ({"kind": 5}, "LintProblem(kind=...)"),
        ({"fqn": ""}, "LintProblem(fqn=...)"),
        ({"ranks": "12"}, "LintProblem(ranks=...)"),
        ({"ranks": [[1]]}, "LintProblem(ranks=...)"),
        ({"ranks": [-1]}, "LintProblem(ranks=...)"),
        ({"axis": ["dp"]}, "LintProblem(axis=...)"),
        ({"placement": 0}, "LintProblem(placement=...)"),
    ],
)
def test_a_problem_checks_its_fields(changes: dict[str, object], argument: str) -> None:
    _raises(lambda: _problem(**changes), argument)


MEMORY = RankMemory((8, 8), FrozenMap({"dense": (8, 8)}), (8, 8))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: LintNote(None, "uneven"), "LintNote(fqn)"),  # type: ignore[arg-type]
        (lambda: LintNote("w", ["uneven"]), "LintNote(message)"),  # type: ignore[arg-type]
        (lambda: LintNote("w", "uneven", -1), "LintNote(padding_bytes=...)"),
        (lambda: LintNote("w", "uneven", True), "LintNote(padding_bytes=...)"),
        (lambda: RankMemory("88", {"dense": (8, 8)}, (8, 8)), "RankMemory(bytes_per_rank)"),  # type: ignore[arg-type]
        (lambda: RankMemory((8, 8), [("dense", (8, 8))], (8, 8)), "RankMemory(by_role)"),  # type: ignore[arg-type]
        (lambda: RankMemory((8, 8), {"dense": [[8]]}, (8, 8)), "RankMemory(by_role)['dense']"),  # type: ignore[list-item]
        (lambda: RankMemory((8, 8), {5: (8, 8)}, (8, 8)), "RankMemory(by_role): a role"),  # type: ignore[dict-item]
        (lambda: RankMemory((8, 8), {"dense": (8,)}, (8, 8)), "RankMemory(by_role['dense'])"),
        (lambda: RankMemory((8, 8), {}, (8, 8.0)), "RankMemory(padded_bytes_per_rank)"),  # type: ignore[arg-type]
        (lambda: RankMemory((8, 8), {}, (8,)), "RankMemory(padded_bytes_per_rank) has 1"),
        (lambda: LintReport([None], (), MEMORY), "LintReport(problems)"),  # type: ignore[list-item]
        (lambda: LintReport((), "note", MEMORY), "LintReport(notes)"),  # type: ignore[arg-type]
        (lambda: LintReport((), (), {}), "LintReport(memory)"),  # type: ignore[arg-type]
    ],
)
def test_the_report_values_check_their_fields(make: Callable[[], object], argument: str) -> None:
    _raises(make, argument)


def test_the_report_values_take_any_collection_and_keep_it_as_a_value() -> None:
    memory = RankMemory([8, 8], {"dense": [8, 8]}, iter((8, 8)))
    assert memory == MEMORY and hash(memory) == hash(MEMORY)
    report = LintReport([_problem()], [LintNote("w", "uneven")], memory)
    assert report == LintReport((_problem(),), (LintNote("w", "uneven", 0),), MEMORY)


# --- one rule for table equality ----------------------------------------------------------

_ENTRIES = st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from([W, X]), max_size=2)


@st.composite
def _mappings(draw: st.DrawFn) -> Mapping[str, SourceLayout]:
    """A table (tied when it can be), or a mapping of another kind, of a few entries."""
    entries = draw(_ENTRIES)
    kind = draw(st.sampled_from(["table", "tied", "dict", "frozen", "proxy"]))
    if kind == "tied" and len(entries) == 2 and entries["a"] == entries["b"]:
        return ParamLayoutTable(entries, tied=[draw(st.permutations(["a", "b"]))])
    if kind in ("table", "tied"):
        return ParamLayoutTable(entries)
    if kind == "frozen":
        return FrozenMap(entries)
    return entries if kind == "dict" else types.MappingProxyType(entries)


def _hashable(value: object) -> bool:
    return isinstance(value, ParamLayoutTable | FrozenMap)


@given(_mappings(), _mappings(), _mappings())
def test_table_equality_is_an_equivalence_and_hash_follows_it(
    a: Mapping[str, SourceLayout], b: Mapping[str, SourceLayout], c: Mapping[str, SourceLayout]
) -> None:
    assert a == a  # noqa: PLR0124  # reflexive: what is tested
    assert (a == b) == (b == a)
    assert operator.ne(a, b) is not operator.eq(a, b)
    if a == b and b == c:
        assert a == c
    if a == b and _hashable(a) and _hashable(b):
        assert hash(a) == hash(b)
    tied = [m for m in (a, b) if isinstance(m, ParamLayoutTable) and m.tied]
    if tied and a == b:  # a table with tied groups equals only tables with the same groups
        assert isinstance(a, ParamLayoutTable) and isinstance(b, ParamLayoutTable)
        assert a.tied == b.tied


def test_the_intransitive_triple_of_the_issue() -> None:
    tied = ParamLayoutTable({"a": W, "b": W}, tied=[("a", "b")])
    plain = {"a": W, "b": W}
    untied = ParamLayoutTable(plain)
    assert untied == plain
    assert tied != plain and plain != tied
    assert tied != untied


# --- a second __init__ rewrites nothing ---------------------------------------------------


def _values() -> list[tuple[object, tuple[object, ...], dict[str, object]]]:
    """Each frozen value, with other arguments for ``__init__`` (valid ones)."""
    return [
        (Shard(0), (5,), {}),
        (Shard(0), (False,), {}),
        (Partial(), ("max",), {}),
        (StridedShard(0, split_factor=2), (1,), {"split_factor": 4}),
        (AxisName("tp"), ("ep",), {}),
        (W, ("expert", ["ep"], [Replicate()]), {}),
        (Drop("w", "dense", "tp", Shard(0)), ("v", "dense", "ep", Shard(1)), {}),
        (ParamLayoutTable({"a": W}), ({"b": X},), {"tied": (), "dropped": ()}),
        (FrozenMap({"tp": 2}), ({"ep": 4},), {}),
        (LintNote("w", "uneven"), ("v", "other", 3), {}),
        (MEMORY, ((1,), {}, (1,)), {}),
        (LintReport((), (), MEMORY), ((_problem(),), (), MEMORY), {}),
        (_problem(), ("other",), {"kind": "layout", "fqn": "v"}),
    ]


@pytest.mark.parametrize(
    ("value", "args", "kwargs"), _values(), ids=lambda v: type(v).__name__ if v else ""
)
def test_a_second_init_is_refused(value: Any, args: tuple[object, ...], kwargs: Any) -> None:
    before, hashed, copied = repr(value), hash(value), copy.deepcopy(value)
    _raises(lambda: value.__init__(*args, **kwargs), "values are immutable", "cannot run again")
    assert repr(value) == before and hash(value) == hashed and value == copied


def test_interned_placements_are_still_handed_out_and_unchanged() -> None:
    shard = Shard(0)
    with pytest.raises(LayoutError):
        shard.__init__(5)  # type: ignore[misc]
    assert Shard(0) is shard and Shard(0).dim == 0 and Shard(dim=0) is shard
    assert Partial() is Partial("sum") and Partial("sum").reduce_op == "sum"
    assert Shard(7).dim == 7 and Shard(7) is Shard(7)
    with pytest.raises(LayoutError, match="must be an int"):
        Shard(True)
    assert Shard(1).dim == 1 and Shard(0).dim == 0


# --- keys that are not text, text that misbehaves ----------------------------------------


class _Touchy(str):
    """Text whose own ``__hash__`` and ``__eq__`` raise (a hostile ``str`` subclass)."""

    def __hash__(self) -> int:
        raise RuntimeError("no hash")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    def __ne__(self, other: object) -> bool:
        raise RuntimeError("no ne")


class _Unhashable:
    """Not text, and not hashable either: its ``__hash__`` raises."""

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


def _kept_tables() -> Iterator[ParamLayoutTable]:
    """One table ``{"m.a": W, "m.b": W}`` kept each way: a dict, by module, listed."""
    yield ParamLayoutTable({"m.a": W, "m.b": W})
    plan = ShardingPlan(
        {"m": ModulePlan({"a": {"tp": Shard(0)}, "b": {"tp": Shard(0)}})}, mesh_axes=["tp"]
    )
    yield build_table(plan, ["tp"])
    pattern = ShardingPlan({"*": ModulePlan({"*": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    yield build_table(pattern, ["tp"], fqns=["m.a", "m.b"])


@pytest.mark.parametrize("table", list(_kept_tables()), ids=lambda t: type(t._items).__name__)
@pytest.mark.parametrize(
    "key", [["m.a"], 5, None, ("m.a",), _Unhashable(), b"m.a"], ids=lambda k: type(k).__name__
)
def test_a_key_that_is_not_text_is_in_no_table(table: ParamLayoutTable, key: Any) -> None:
    assert table == {"m.a": W, "m.b": W}
    assert key not in table
    assert table.get(key) is None and table.get(key, X) is X
    _raises(lambda: table[key], "looked up by parameter FQN", type(key).__name__)


@pytest.mark.parametrize("table", list(_kept_tables()), ids=lambda t: type(t._items).__name__)
def test_misbehaving_text_is_looked_up_as_the_text_it_holds(table: ParamLayoutTable) -> None:
    assert _Touchy("m.a") in table and _Touchy("m.c") not in table
    assert table[_Touchy("m.a")] == W and table.get(_Touchy("m.b")) == W
    assert table.get(_Touchy("m.c"), X) is X
    with pytest.raises(KeyError):
        table[_Touchy("m.c")]


def test_misbehaving_text_makes_plain_entries_groups_and_drops() -> None:
    a, b = _Touchy("a"), _Touchy("b")
    table = ParamLayoutTable(types.MappingProxyType({"a": W, "b": W}), tied=[(a, b)])
    assert table.tied == (frozenset({"a", "b"}),)
    assert table.group_of(a) == {"a", "b"}

    class Entries(Mapping[str, SourceLayout]):
        def __getitem__(self, key: str) -> SourceLayout:
            return W

        def __iter__(self) -> Iterator[str]:
            return iter([a, b])

        def __len__(self) -> int:
            return 2

    made = ParamLayoutTable(Entries(), tied=[(a, b)])
    assert made == table and all(type(fqn) is str for fqn in made)
    assert made.with_entries(Entries()) == table
    drop = Drop(a, "dense", "tp", Shard(0))
    assert type(drop.fqn) is str and hash(drop) == hash(Drop("a", "dense", "tp", Shard(0)))
    note = LintNote(a, "uneven")
    assert type(note.fqn) is str and hash(note) == hash(LintNote("a", "uneven"))
    assert hash(_problem(fqn=a)) == hash(_problem(fqn="a"))


class _EqualsRaises(str):
    """Text that hashes as the text it holds but whose ``__eq__`` raises: a dict holds it."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")


def test_lint_reads_shapes_keyed_by_misbehaving_text_as_plain_text() -> None:
    table = ParamLayoutTable({"w": W})
    shape = ParamShape((4, 4), "float32")
    sizes = {"dense": {"dp_shard": 2, "tp": 2}}
    fsdp = {"dense": "dp_shard"}
    expected = lint(table, {"w": shape}, mesh_sizes=sizes, fsdp=fsdp)
    keyed: dict[str, ParamShape] = {_EqualsRaises("w"): shape}
    for shapes in (keyed, FrozenMap(keyed)):
        assert lint(table, shapes, mesh_sizes=sizes, fsdp=fsdp) == expected
    bad: dict[Any, ParamShape] = {"w": shape, 5: shape}
    _raises(lambda: lint(table, bad, mesh_sizes=sizes, fsdp=fsdp), "shapes", "5")


def test_tied_groups_failing_midway_are_a_layout_error_naming_tied() -> None:
    def groups() -> Iterator[tuple[str, str]]:
        yield ("a", "b")
        raise RuntimeError("midway")

    def members() -> Iterator[str]:
        yield "a"
        raise RuntimeError("midway")

    entries = {"a": W, "b": W}
    _raises(lambda: ParamLayoutTable(entries, tied=groups()), "tied")
    _raises(lambda: ParamLayoutTable(entries, tied=[members()]), "tied")
    _raises(lambda: ParamLayoutTable(entries, tied=[("a", _Unhashable())]), "tied")  # type: ignore[list-item]


def test_a_frozen_map_with_an_unhashable_value_cannot_be_hashed() -> None:
    m: FrozenMap[str, list[int]] = FrozenMap({"a": []})
    _raises(lambda: hash(m), "FrozenMap", "list", "'a'", "cannot be hashed")
    assert m == {"a": []}  # it is still a mapping
    assert [] not in m and m.get([]) is None  # type: ignore[comparison-overlap, call-overload]
    _raises(lambda: m[[]], "no key of type list")  # type: ignore[index]
    assert hash(FrozenMap({"a": ()})) == hash(FrozenMap({"a": ()}))


# --- required arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Shard(), "Shard() needs the argument 'dim'"),  # type: ignore[call-arg]  # noqa: PLW0108  # the call is checked
        (lambda: StridedShard(0), "'split_factor'"),  # type: ignore[call-arg]
        (lambda: StridedShard(split_factor=2), "'dim'"),  # type: ignore[call-arg]
        (lambda: AxisName(), "'name'"),  # type: ignore[call-arg]  # noqa: PLW0108  # the call is checked
        (lambda: SourceLayout("dense"), "SourceLayout() needs the argument 'axes'"),  # type: ignore[call-arg]
        (lambda: SourceLayout("dense", ["tp"]), "'placements'"),  # type: ignore[call-arg]
        (lambda: Drop("w", "dense", "tp"), "'placement'"),  # type: ignore[call-arg]
        (lambda: ParamLayoutTable(), "'entries'"),  # type: ignore[call-arg]  # noqa: PLW0108  # the call is checked
        (lambda: ParamLayoutTable(tied=()), "'entries'"),  # type: ignore[call-arg]
        (lambda: FrozenMap(), "'items'"),  # type: ignore[call-arg]  # noqa: PLW0108  # the call is checked
        (lambda: LintNote("w"), "'message'"),  # type: ignore[call-arg]
        (lambda: RankMemory((8,), {}), "'padded_bytes_per_rank'"),  # type: ignore[call-arg]
        (lambda: LintReport((), ()), "'memory'"),  # type: ignore[call-arg]
    ],
)
def test_a_required_argument_left_out_is_a_layout_error_naming_it(
    make: Callable[[], object], named: str
) -> None:
    # The ignores are checked too: the type checker must still see each argument required.
    _raises(make, "needs the argument", named, "which was not given")


def test_signatures_and_reprs_still_read_as_before() -> None:
    assert str(inspect.signature(Shard)).startswith("(dim: 'int' = <required>)")
    assert str(inspect.signature(StridedShard)) == (
        "(dim: 'int' = <required>, *, split_factor: 'int' = <required>) -> None"
    )
    assert "(entries: 'Mapping[str, SourceLayout]' = <required>, *, tied:" in str(
        inspect.signature(ParamLayoutTable)
    )
    assert repr(Shard(0)) == "Shard(dim=0)"
    assert repr(StridedShard(0, split_factor=2)) == "StridedShard(dim=0, split_factor=2)"
    assert repr(W) == (
        "SourceLayout(mesh='dense', axes=(AxisName(name='tp'),), placements=(Shard(dim=0),))"
    )
    assert attrs.evolve(W, mesh="expert") == SourceLayout("expert", ["tp"], [Shard(0)])
