"""Source layouts and the read-only table of them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
from hypothesis import given

from layout_algebra import (
    AxisName,
    Drop,
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Partial,
    Placement,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
)
from layout_algebra import _frozen as frozen_module
from layout_algebra._frozen import FrozenMap
from tests.strategies import source_layouts, tables

TP, EP = AxisName("tp"), AxisName("ep")
W = SourceLayout("dense", ["tp", "ep"], [Shard(0), Replicate()])
X = SourceLayout("expert", ["ep"], [Shard(0)])


# --- SourceLayout ---------------------------------------------------------------------


def test_a_layout_holds_one_placement_per_axis() -> None:
    assert W.mesh == "dense"
    assert W.axes == (TP, EP)
    assert W.placements == (Shard(0), Replicate())
    assert isinstance(W.placements, tuple)


def test_str_and_repr_of_a_layout() -> None:
    assert str(W) == "dense[tp=S(0), ep=R]"
    assert str(X) == "expert[ep=S(0)]"
    assert str(SourceLayout("dense", [], [])) == "dense[]"
    assert str(SourceLayout("dense", ["tp"], [StridedShard(0, split_factor=2)])) == (
        "dense[tp=_S(0, 2)]"
    )
    assert repr(X) == (
        "SourceLayout(mesh='expert', axes=(AxisName(name='ep'),), placements=(Shard(dim=0),))"
    )


def test_a_layout_may_hold_partial_but_no_table_entry_may() -> None:
    layout = SourceLayout("dense", ["tp"], [Partial()])
    assert str(layout) == "dense[tp=P(sum)]"


@pytest.mark.parametrize(
    ("axes", "placements", "message"),
    [
        (["tp", "ep"], [Shard(0)], "dense: 2 axes ['tp', 'ep'] but 1 placements ['S(0)']"),
        (["tp"], [Shard(0), Replicate()], "1 axes ['tp'] but 2 placements ['S(0)', 'R']"),
        ([], [Replicate()], "0 axes [] but 1 placements ['R']"),
    ],
)
def test_a_layout_needs_as_many_placements_as_axes(
    axes: list[str], placements: list[Placement], message: str
) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        SourceLayout("dense", axes, placements)


def test_a_layout_names_each_axis_once() -> None:
    with pytest.raises(
        LayoutError,
        match=r"the dense layout names axis 'tp' twice: \['tp', 'ep', 'tp'\]; give each axis once",
    ) as e:
        SourceLayout("dense", ["tp", "ep", "tp"], [Shard(0), Replicate(), Replicate()])
    assert e.value.axis == "tp"


@pytest.mark.parametrize("mesh", ["", None, 3, AxisName("dense")])
def test_a_layout_needs_a_mesh_role(mesh: object) -> None:
    with pytest.raises(LayoutError, match="mesh role must be a non-empty string such as 'dense'"):
        SourceLayout(mesh, ["tp"], [Shard(0)])  # type: ignore[arg-type]  # run-time check


@pytest.mark.parametrize("bad", ["S(0)", 0, None, Shard])
def test_a_layout_holds_only_placements(bad: object) -> None:
    with pytest.raises(LayoutError, match="is not a placement; use Shard"):
        SourceLayout("dense", ["tp"], [bad])  # type: ignore[list-item]  # run-time check


def test_a_layout_is_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        W.mesh = "expert"  # type: ignore[misc]  # the point of the test


def test_a_layout_converts_its_sequences_to_tuples() -> None:
    axes = ["tp"]
    placements: list[Placement] = [Shard(0)]
    layout = SourceLayout("dense", axes, placements)
    axes.append("ep")
    placements.append(Replicate())
    assert layout == SourceLayout("dense", ("tp",), (Shard(0),))


def test_layout_helpers() -> None:
    assert W.placement_on("ep") == Replicate()
    assert W.placement_on(TP) == Shard(0)
    with pytest.raises(LayoutError, match=r"dense\[tp=S\(0\), ep=R\] has no axis 'sp'"):
        W.placement_on("sp")
    assert W.with_placements([Replicate(), Shard(1)]) == SourceLayout(
        "dense", ["tp", "ep"], [Replicate(), Shard(1)]
    )
    assert W.with_mesh("expert").mesh == "expert"
    assert not W.is_replicated
    assert W.with_placements([Replicate(), Replicate()]).is_replicated
    assert SourceLayout("dense", [], []).is_replicated
    with pytest.raises(LayoutError, match="2 axes"):
        W.with_placements([Shard(0)])


@given(source_layouts(), source_layouts())
def test_equal_layouts_hash_equal(a: SourceLayout, b: SourceLayout) -> None:
    assert (a == b) == (str(a) == str(b))
    if a == b:
        assert hash(a) == hash(b)


# --- ParamLayoutTable -------------------------------------------------------------------

ENTRIES = {"emb.weight": W, "layers.0.w1": X, "head.weight": W}


def test_a_table_is_a_read_only_mapping() -> None:
    table = ParamLayoutTable(ENTRIES)
    assert isinstance(table, Mapping)
    assert table["layers.0.w1"] == X
    assert len(table) == 3
    assert list(table) == ["emb.weight", "layers.0.w1", "head.weight"]
    assert list(table.keys()) == list(ENTRIES.keys())
    assert list(table.values()) == list(ENTRIES.values())
    assert list(table.items()) == list(ENTRIES.items())
    assert "emb.weight" in table
    assert "nope" not in table
    assert not table.__contains__(3)
    assert table.get("head.weight") == W
    assert table.get("nope") is None
    assert table.get("nope", X) == X
    assert dict(table) == ENTRIES
    with pytest.raises(KeyError):
        table["nope"]


def test_a_table_keeps_insertion_order() -> None:
    entries = {f"layers.{i}.w": W for i in (3, 1, 2, 0)}
    assert list(ParamLayoutTable(entries)) == [
        "layers.3.w",
        "layers.1.w",
        "layers.2.w",
        "layers.0.w",
    ]


def test_a_table_cannot_be_changed() -> None:
    table = ParamLayoutTable(ENTRIES)
    with pytest.raises(TypeError, match="does not support item assignment"):
        table["x"] = W  # type: ignore[index]  # the point of the test
    with pytest.raises(TypeError, match="does not support item deletion"):
        del table["emb.weight"]  # type: ignore[attr-defined]  # the point of the test
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        table.tied = ()  # type: ignore[misc]  # the point of the test
    for mutator in ("pop", "update", "clear", "setdefault", "popitem"):
        assert not hasattr(table, mutator)
    assert table == ParamLayoutTable(ENTRIES)


def test_a_table_does_not_follow_changes_to_its_source() -> None:
    entries = dict(ENTRIES)
    table = ParamLayoutTable(entries)
    entries["new"] = X
    del entries["emb.weight"]
    assert list(table) == ["emb.weight", "layers.0.w1", "head.weight"]


def test_a_table_rejects_partial_naming_the_fqn() -> None:
    bad = SourceLayout("dense", ["tp", "ep"], [Replicate(), Partial("max")])
    with pytest.raises(LayoutError) as info:
        ParamLayoutTable({"emb.weight": W, "layers.2.wo.weight": bad})
    message = str(info.value)
    assert message.startswith("layers.2.wo.weight: P(max) on axis 'ep' in dense[tp=R, ep=P(max)]")
    assert "declare R or S(dim) on that axis" in message
    assert (info.value.fqn, info.value.axis, info.value.placement) == (
        "layers.2.wo.weight",
        "ep",
        "P(max)",
    )


def test_a_table_checks_a_shared_layout_once_for_every_fqn() -> None:
    bad = SourceLayout("dense", ["tp"], [Partial()])
    with pytest.raises(LayoutError, match=r"^a: P"):
        ParamLayoutTable({"a": bad, "b": bad})
    equal = SourceLayout("dense", ["tp"], [Partial()])  # equal, made apart: the first named
    with pytest.raises(LayoutError) as info:
        ParamLayoutTable({"ok": W, "a": bad, "b": equal})
    assert (info.value.fqn, info.value.axis, info.value.placement) == ("a", "tp", "P(sum)")


def test_a_str_subclass_fqn_is_its_text() -> None:
    class Name(str):
        __slots__ = ()
        armed = False

        def __hash__(self) -> int:
            assert not Name.armed, "a str subclass's own __hash__ ran"
            return str.__hash__(self)

    given: dict[str, SourceLayout] = {Name("w"): X}
    Name.armed = True
    table = ParamLayoutTable({"v": W}).with_entries(given)
    assert list(table) == ["v", "w"] and all(type(f) is str for f in table)
    assert table[Name("w")] is table["w"] and Name("w") in table


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"": W}, "a parameter FQN must be a non-empty string, got ''"),
        ({3: W}, "a parameter FQN must be a non-empty string, got 3"),
        ({"w": "dense[tp=S(0)]"}, "w: 'dense[tp=S(0)]' is not a SourceLayout"),
        ({"w": Shard(0)}, "w: Shard(dim=0) is not a SourceLayout"),
        ({"v": W, "w": ["dense"]}, "w: ['dense'] is not a SourceLayout"),  # unhashable
        ({"v": W, "w": {"tp": Shard(0)}}, "w: {'tp': Shard(dim=0)} is not a SourceLayout"),
        ({"v": W, "w": None}, "w: None is not a SourceLayout"),
        ([("w", W)], "a table's entries must be a mapping from FQN to SourceLayout"),
    ],
)
def test_a_table_checks_its_entries(entries: object, message: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        ParamLayoutTable(entries)  # type: ignore[arg-type]  # run-time check


def test_tied_groups_are_recorded() -> None:
    table = ParamLayoutTable(ENTRIES, tied=[["emb.weight", "head.weight"]])
    assert table.tied == (frozenset({"emb.weight", "head.weight"}),)
    assert table.group_of("head.weight") == frozenset({"emb.weight", "head.weight"})
    assert table.group_of("layers.0.w1") == frozenset({"layers.0.w1"})


@pytest.mark.parametrize(
    ("tied", "message"),
    [
        ([["emb.weight"]], r"tied group \['emb.weight'\] has fewer than two members"),
        (
            [["emb.weight", "head.weight"], ["head.weight", "out.weight"]],
            r"head.weight is in two tied groups .* tied groups are disjoint",
        ),
        (
            [["emb.weight", "out.weight"]],
            r"out.weight: tied in \['emb.weight', 'out.weight'\] but has no entry",
        ),
        (
            [["emb.weight", "layers.0.w1"]],
            r"tied group \['emb.weight', 'layers.0.w1'\] has different layouts "
            r"\(emb.weight: dense\[tp=S\(0\), ep=R\], layers.0.w1: expert\[ep=S\(0\)\]\)",
        ),
        ([["emb.weight", ""]], "tied: a group holds parameter FQNs, got ''"),
        ([["emb.weight", 3]], "tied: a group holds parameter FQNs, got 3"),
    ],
)
def test_tied_groups_are_checked(tied: list[list[object]], message: str) -> None:
    with pytest.raises(LayoutError, match=message):
        ParamLayoutTable(ENTRIES, tied=tied)  # type: ignore[arg-type]  # run-time check


def test_str_and_repr_of_a_table() -> None:
    table = ParamLayoutTable(
        {"emb.weight": W, "layers.0.w1": X, "head.weight": W},
        tied=[["head.weight", "emb.weight"]],
    )
    assert str(table) == (
        "emb.weight   dense[tp=S(0), ep=R]\n"
        "layers.0.w1  expert[ep=S(0)]\n"
        "head.weight  dense[tp=S(0), ep=R]\n"
        "tied: emb.weight, head.weight"
    )
    assert str(ParamLayoutTable({})) == "(empty table)"
    assert repr(ParamLayoutTable({"w": X})) == (
        "ParamLayoutTable({'w': SourceLayout(mesh='expert', axes=(AxisName(name='ep'),), "
        "placements=(Shard(dim=0),))})"
    )
    assert repr(ParamLayoutTable({})) == "ParamLayoutTable({})"
    assert repr(table).endswith(", tied=(frozenset({'emb.weight', 'head.weight'}),))") or repr(
        table
    ).endswith(", tied=(frozenset({'head.weight', 'emb.weight'}),))")


def test_with_entries_adds_and_replaces() -> None:
    table = ParamLayoutTable({"a": W, "b": X})
    assert table.with_entries({"b": W, "c": X}) == ParamLayoutTable({"a": W, "b": W, "c": X})
    assert table == ParamLayoutTable({"a": W, "b": X})


@given(tables(), tables())
def test_equal_tables_hash_equal(a: ParamLayoutTable, b: ParamLayoutTable) -> None:
    assert (a == b) == (dict(a) == dict(b) and a.tied == b.tied)
    if a == b:
        assert hash(a) == hash(b)


@given(tables())
def test_a_table_equals_its_rebuilt_copy(table: ParamLayoutTable) -> None:
    copy = ParamLayoutTable(dict(table), tied=table.tied)
    assert copy == table
    assert hash(copy) == hash(table)
    assert list(copy.items()) == list(table.items())


@given(tables())
def test_drawn_tables_keep_their_invariants(table: ParamLayoutTable) -> None:
    members = [fqn for group in table.tied for fqn in group]
    assert len(members) == len(set(members))
    for group in table.tied:
        assert len(group) >= 2
        assert len({table[fqn] for fqn in group}) == 1
    for layout in table.values():
        assert not any(isinstance(p, Partial) for p in layout.placements)


# --- read-only mappings compare as mappings -------------------------------------------


def test_a_table_equals_any_mapping_with_its_entries() -> None:
    entries = {"a": W, "b": X}
    table = ParamLayoutTable(entries)
    assert table == entries
    assert entries == table
    assert table == types.MappingProxyType(entries)
    assert table == FrozenMap(entries)
    assert hash(table) == hash(FrozenMap(entries))
    assert table != {"a": W}
    assert table != {"a": W, "b": W}
    assert table != [("a", W), ("b", X)]


def test_tables_also_compare_their_tied_groups() -> None:
    entries = {"a": W, "b": W}
    tied = ParamLayoutTable(entries, tied=[("a", "b")])
    assert tied != ParamLayoutTable(entries)
    assert tied != entries  # a mapping has no tied groups: equal would not be transitive
    assert tied != FrozenMap(entries) and FrozenMap(entries) != tied
    assert ParamLayoutTable(entries) == entries == FrozenMap(entries)
    assert tied == ParamLayoutTable(entries, tied=[("b", "a")])
    assert hash(tied) == hash(ParamLayoutTable(entries, tied=[("b", "a")]))


def test_a_frozen_map_equals_any_mapping_with_its_items() -> None:
    m = FrozenMap({"tp": 2, "ep": 4})
    assert m == {"ep": 4, "tp": 2}
    assert m == {"ep": 4, "tp": 2}
    assert m == types.MappingProxyType({"tp": 2, "ep": 4})
    assert m != {"tp": 2}
    assert hash(m) == hash(FrozenMap({"ep": 4, "tp": 2}))
    assert len({m, FrozenMap({"ep": 4, "tp": 2})}) == 1


# --- interning and fingerprints --------------------------------------------------------


def test_equal_layouts_in_tables_are_one_object() -> None:
    made_apart = [SourceLayout("dense", ["tp"], [Shard(0)]) for _ in range(3)]
    first = ParamLayoutTable({"a": made_apart[0], "b": made_apart[1]})
    second = ParamLayoutTable({"c": made_apart[2]})
    assert first["a"] is first["b"] is second["c"]
    added = first.with_entries({"d": SourceLayout("dense", ["tp"], [Shard(0)])})
    assert added["d"] is first["a"]


_DROP = Drop("w", "dense", "tpp", Shard(0))


def _fingerprinted() -> ParamLayoutTable:
    entries = {"emb.weight": W, "head.weight": W, "norm.weight": X, "odd\nname \u00e9": X}
    return ParamLayoutTable(entries, tied=[("emb.weight", "head.weight")], dropped=[_DROP])


def test_a_fingerprint_is_versioned_hex() -> None:
    assert re.fullmatch(r"v1:[0-9a-f]{64}", _fingerprinted().fingerprint())


def test_a_fingerprint_does_not_depend_on_insertion_order() -> None:
    table = _fingerprinted()
    backwards = ParamLayoutTable(
        dict(reversed(list(table.items()))),
        tied=[("head.weight", "emb.weight")],
        dropped=list(reversed([_DROP, Drop("v", "dense", "tpp", Shard(1))])),
    )
    forwards = ParamLayoutTable(
        dict(table.items()), tied=table.tied, dropped=[_DROP, Drop("v", "dense", "tpp", Shard(1))]
    )
    assert backwards.fingerprint() == forwards.fingerprint()


def test_a_fingerprint_is_the_same_in_every_process() -> None:
    script = "from tests.test_layout import _fingerprinted\nprint(_fingerprinted().fingerprint())\n"
    seen = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent.parent,
        )
        seen.add(done.stdout.strip())
    assert seen == {_fingerprinted().fingerprint()}


@pytest.mark.parametrize(
    "change",
    ["placement", "mesh", "fqn", "entry", "tied"],
)
def test_a_fingerprint_differs_when_the_table_does(change: str) -> None:
    table = _fingerprinted()
    entries = dict(table.items())
    tied: list[tuple[str, ...]] = [tuple(sorted(g)) for g in table.tied]
    drops = list(table.dropped)
    if change == "placement":
        entries["norm.weight"] = SourceLayout("expert", ["ep"], [Shard(1)])
    elif change == "mesh":
        entries["norm.weight"] = SourceLayout("dense", ["ep"], [Shard(0)])
    elif change == "fqn":
        entries["norm.bias"] = entries.pop("norm.weight")
    elif change == "entry":
        entries["extra.weight"] = X
    else:
        tied = [("emb.weight", "head.weight", "tail.weight")]
        entries["tail.weight"] = W
    other = ParamLayoutTable(entries, tied=tied, dropped=drops)
    assert other.fingerprint() != table.fingerprint()
    if change == "tied":  # the same entries untied
        untied = ParamLayoutTable(entries, dropped=drops)
        assert untied.fingerprint() not in {other.fingerprint(), table.fingerprint()}


def test_a_full_interner_leaves_every_value_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frozen_module, "_MAX_INTERNED", 0)  # nothing new is kept
    made = [SourceLayout("full", ["tp"], [Shard(7)]) for _ in range(2)]
    table = ParamLayoutTable({"a": made[0], "b": made[1]})
    assert table["a"] == table["b"] == made[0]
    assert table == ParamLayoutTable({"b": made[0], "a": made[1]})
    params = {"full_interner.weight": {"tp": Shard(7)}}
    assert ModulePlan(params) == ModulePlan(params) and dict(ModulePlan(params).params) == params


@pytest.mark.parametrize(
    ("one", "other"),
    [  # what joining FQNs, or mesh roles, by newlines alone would spell alike
        ({"a\nb": W, "c": W}, {"a": W, "b\nc": W}),
        (  # "q[]\nn[]\nz[]" both
            {"a": SourceLayout("q[]\nn", [], []), "b": SourceLayout("z", [], [])},
            {"a": SourceLayout("q", [], []), "b": SourceLayout("n[]\nz", [], [])},
        ),
    ],
)
def test_a_fingerprint_tells_texts_holding_newlines_apart(
    one: dict[str, SourceLayout], other: dict[str, SourceLayout]
) -> None:
    assert ParamLayoutTable(one).fingerprint() != ParamLayoutTable(other).fingerprint()
