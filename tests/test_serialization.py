"""JSON for tables and plans: round trips, the documented format, and strict reading."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import attrs
import cattrs
import cattrs.preconf.json
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layout_algebra import (
    AxisName,
    Drop,
    ModulePlan,
    ParamLayoutTable,
    ParamShape,
    Partial,
    Placement,
    Replicate,
    SerializationError,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
)
from layout_algebra.serialization import (
    configure_converter,
    converter,
    from_json,
    make_converter,
    plan_from_json,
    plan_to_json,
    shapes_from_json,
    shapes_to_json,
    to_json,
)
from layout_algebra.structure import Packed, Part
from tests.strategies import (
    MESH_ROLES,
    axis_names,
    param_fqns,
    placements,
    sharding_plans,
    tables,
)

EMB = SourceLayout("dense", ["tp", "ep"], [Shard(0), Replicate()])
TABLE = ParamLayoutTable(
    {
        "emb.weight": EMB,
        "head.weight": EMB,
        "layers.7.w": SourceLayout("expert", ["ep", "tp"], [Shard(0), Shard(1)]),
    },
    tied=[{"emb.weight", "head.weight"}],
)
PLAN = ShardingPlan(
    {
        "": ModulePlan({"emb.weight": {"tp": Shard(0)}}),
        "layers.0.moe": ModulePlan(
            {"experts.w1": {"ep": Shard(0), "tp": Shard(1)}, "gate.weight": {}},
            expert_parallel=True,
        ),
    },
    mesh_axes=["dp_shard", "ep", "tp"],
    tied_pairs=[("emb.weight", "head.weight")],
)


def test_table_document_is_the_documented_format() -> None:
    doc = json.loads(to_json(TABLE))
    assert doc == {
        "version": 1,
        "entries": {
            "emb.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]},
            "head.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]},
            "layers.7.w": {"mesh": "expert", "axes": ["ep", "tp"], "placements": ["S(0)", "S(1)"]},
        },
        "tied": [["emb.weight", "head.weight"]],
        "fingerprint": TABLE.fingerprint(),
    }
    assert converter.unstructure(TABLE) == doc


def test_table_document_has_one_entry_per_line() -> None:
    lines = to_json(TABLE).splitlines()
    assert [line for line in lines if '"mesh"' in line] == [
        '  "emb.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]},',
        '  "head.weight": {"mesh": "dense", "axes": ["tp", "ep"], "placements": ["S(0)", "R"]},',
        '  "layers.7.w": {"mesh": "expert", "axes": ["ep", "tp"], "placements": ["S(0)", "S(1)"]}',
    ]


def test_empty_table_round_trips() -> None:
    assert from_json(to_json(ParamLayoutTable({}))) == ParamLayoutTable({})


def test_read_layouts_are_shared_values() -> None:
    table = from_json(to_json(TABLE))
    assert table["emb.weight"] is table["head.weight"]


def test_plan_document_is_the_documented_format() -> None:
    doc = json.loads(plan_to_json(PLAN))
    assert doc["version"] == 1
    assert doc["mesh_axes"] == ["dp_shard", "ep", "tp"]
    assert doc["tied_pairs"] == [["emb.weight", "head.weight"]]
    assert doc["modules"]["layers.0.moe"] == {
        "params": {"experts.w1": {"ep": "S(0)", "tp": "S(1)"}, "gate.weight": {}},
        "expert_parallel": True,
    }
    assert converter.unstructure(PLAN) == doc


def test_plan_file_words_are_read() -> None:
    text = json.dumps(
        {
            "version": 1,
            "mesh_axes": ["tp"],
            "modules": {
                "attn": {"params": {"wq.weight": {"tp": "shard(0)"}, "b": {"tp": "Replicate"}}}
            },
        }
    )
    plan = plan_from_json(text)
    assert plan.modules["attn"].params["wq.weight"]["tp"] == Shard(0)
    assert plan.modules["attn"].params["b"]["tp"] == Replicate()
    assert plan.tied_pairs == ()
    assert not plan.modules["attn"].expert_parallel


def test_converter_structures_every_value_type() -> None:
    assert converter.structure(converter.unstructure(TABLE), ParamLayoutTable) == TABLE
    assert converter.structure(converter.unstructure(PLAN), ShardingPlan) == PLAN
    assert converter.structure("_S(0, 2)", StridedShard) == StridedShard(0, split_factor=2)
    assert converter.unstructure(Partial("max")) == "P(max)"
    with pytest.raises(SerializationError, match="expected a Shard placement"):
        converter.structure("R", Shard)


@given(tables())
def test_table_round_trip(table: ParamLayoutTable) -> None:
    assert from_json(to_json(table)) == table
    assert converter.structure(converter.unstructure(table), ParamLayoutTable) == table


@given(sharding_plans())
def test_plan_round_trip(plan: ShardingPlan) -> None:
    assert plan_from_json(plan_to_json(plan)) == plan


# --------------------------------------------------------------------------------------
# the placements build_table dropped: written with the table, read back strictly

DROPS: Final = (
    Drop("layers.7.w", "expert", "tp", Shard(1)),
    Drop("emb.weight", "dense", "cp", StridedShard(0, split_factor=2)),
    Drop("head.weight", "expert", "tp", Shard(1)),
)
DROPPED: Final = ParamLayoutTable(TABLE, tied=TABLE.tied, dropped=DROPS)
GOOD_DROP: Final[dict[str, Any]] = {
    "fqn": "layers.7.w",
    "mesh": "expert",
    "axis": "tp",
    "placement": "S(1)",
}


def test_drops_are_written_one_per_line_after_the_tied_groups() -> None:
    text = to_json(DROPPED)
    assert text.endswith(
        ' "tied": [["emb.weight", "head.weight"]],\n'
        ' "dropped": [\n'
        '  {"fqn": "layers.7.w", "mesh": "expert", "axis": "tp", "placement": "S(1)"},\n'
        '  {"fqn": "emb.weight", "mesh": "dense", "axis": "cp", "placement": "_S(0, 2)"},\n'
        '  {"fqn": "head.weight", "mesh": "expert", "axis": "tp", "placement": "S(1)"}\n'
        " ],\n"
        f' "fingerprint": "{DROPPED.fingerprint()}"}}'
    )
    assert converter.unstructure(DROPPED) == json.loads(text)
    assert "dropped" not in json.loads(to_json(TABLE))  # a table without drops reads as before


def test_drops_round_trip() -> None:
    text = to_json(DROPPED)
    # read as written, with other spacing, and by the converter
    for back in [
        from_json(text),
        from_json(text.encode()),
        from_json(json.dumps(json.loads(text))),
        converter.structure(json.loads(text), ParamLayoutTable),
    ]:
        assert back == DROPPED
        assert back.dropped == DROPS  # not part of equality: compared on their own
        assert to_json(back) == text


def test_any_order_of_fields_reads_alike() -> None:
    text = json.dumps(json.loads(to_json(DROPPED)), sort_keys=True, indent=2)
    back = from_json(text)
    assert back == DROPPED and back.dropped == DROPS
    assert to_json(back) == to_json(DROPPED)


def test_a_document_without_drops_has_none() -> None:
    assert from_json(_table_doc()).dropped == ()
    assert from_json(_table_doc(dropped=[])).dropped == ()
    text = to_json(TABLE).removesuffix("}") + ',\n "dropped": []}'
    assert from_json(text).dropped == ()


@given(
    tables(),
    st.lists(
        st.builds(Drop, param_fqns(), st.sampled_from(MESH_ROLES), axis_names(), placements()),
        max_size=4,
    ),
)
def test_tables_with_drops_round_trip(table: ParamLayoutTable, drops: list[Drop]) -> None:
    dropped = ParamLayoutTable(table, tied=table.tied, dropped=drops)
    text = to_json(dropped)
    for back in [
        from_json(text),
        from_json(json.dumps(json.loads(text))),
        converter.structure(converter.unstructure(dropped), ParamLayoutTable),
    ]:
        assert back == table
        assert back.dropped == tuple(drops)


@pytest.mark.parametrize(
    ("dropped", "path", "words"),
    [
        (5, "dropped", "JSON array"),
        ({"fqn": "w"}, "dropped", "JSON array"),
        ([["w", "dense", "tp", "S(0)"]], "dropped[0]", "JSON object"),
        ([{**GOOD_DROP, "fqn": ""}], "dropped[0].fqn", "non-empty"),
        ([{**GOOD_DROP, "fqn": 5}], "dropped[0].fqn", "expected a string"),
        ([{**GOOD_DROP, "mesh": ""}], "dropped[0].mesh", "non-empty"),
        ([{**GOOD_DROP, "mesh": None}], "dropped[0].mesh", "expected a string"),
        ([{**GOOD_DROP, "axis": "1tp"}], "dropped[0].axis", "'1tp'"),
        ([{**GOOD_DROP, "placement": "S(x)"}], "dropped[0].placement", "'S(x)'"),
        ([{**GOOD_DROP, "placement": ["S(0)"]}], "dropped[0].placement", "expected a string"),
        ([{**GOOD_DROP, "why": 1}], "dropped[0].why", "unknown field 'why'"),
        ([{"fqn": "w", "mesh": "dense", "axis": "tp"}], "dropped[0].placement", "missing"),
        # after a good drop of the same kind: still read in full
        ([GOOD_DROP, {**GOOD_DROP, "fqn": ""}], "dropped[1].fqn", "non-empty"),
        ([GOOD_DROP, {**GOOD_DROP, "fqn": ["w"]}], "dropped[1].fqn", "expected a string"),
    ],
)
def test_bad_drops(dropped: object, path: str, words: str) -> None:
    reads: list[Callable[[], ParamLayoutTable]] = [
        lambda: from_json(_table_doc(dropped=dropped)),
        lambda: converter.structure(json.loads(_table_doc(dropped=dropped)), ParamLayoutTable),
    ]
    for read in reads:
        with pytest.raises(SerializationError) as info:
            read()
        assert info.value.path == path
        assert words in info.value.message


# --------------------------------------------------------------------------------------
# the fingerprint: written last, and checked when a document has it


def _unsigned(text: str) -> str:
    doc = json.loads(text)
    del doc["fingerprint"]
    return json.dumps(doc)


def test_the_fingerprint_is_written_last_on_its_own_line() -> None:
    for table in [TABLE, DROPPED, ParamLayoutTable({})]:
        last = to_json(table).splitlines()[-1]
        assert last == f' "fingerprint": "{table.fingerprint()}"}}'


def test_a_document_without_a_fingerprint_is_read_unchecked() -> None:
    assert from_json(_unsigned(to_json(DROPPED))).dropped == DROPS
    assert converter.structure(json.loads(_unsigned(to_json(TABLE))), ParamLayoutTable) == TABLE


def test_other_spacing_and_order_keep_the_fingerprint() -> None:
    doc = json.loads(to_json(DROPPED))
    doc["entries"] = dict(reversed(doc["entries"].items()))
    doc["tied"] = [list(reversed(group)) for group in doc["tied"]]
    back = from_json(json.dumps(doc, indent=4))
    assert back == DROPPED and back.dropped == DROPS


EDITS: Final = [
    ('"placements": ["S(0)", "S(1)"]', '"placements": ["S(0)", "R"]'),  # a placement
    ('"tied": [["emb.weight", "head.weight"]]', '"tied": []'),  # a tied group
]  # a drop is no part of the table's value, nor of its fingerprint


@pytest.mark.parametrize(("old", "new"), EDITS)
def test_a_document_changed_after_it_was_written_is_refused(old: str, new: str) -> None:
    text = to_json(DROPPED)
    assert old in text
    edited = text.replace(old, new)
    changed = from_json(_unsigned(edited))  # deleting the field accepts the edit
    assert changed.fingerprint() != DROPPED.fingerprint()
    reads: list[Callable[[], object]] = [
        lambda: from_json(edited),
        lambda: converter.structure(json.loads(edited), ParamLayoutTable),
    ]
    for read in reads:
        with pytest.raises(SerializationError) as info:
            read()
        assert info.value.path == "fingerprint"
        message = info.value.message
        assert DROPPED.fingerprint() in message and changed.fingerprint() in message
        assert "the file was changed after it was written" in message
        assert 'delete the "fingerprint" field to accept the edit' in message
    raw = {"name": "x", "table": json.loads(edited)}
    with pytest.raises(SerializationError) as info:
        converter.structure(raw, RunConfig)
    assert info.value.path == "table.fingerprint"


@pytest.mark.parametrize(
    ("fingerprint", "words"),
    [
        (5, "expected a string"),
        (None, "expected a string"),
        (["v1:00"], "expected a string"),
        ("", "the file was changed after it was written"),
        ("v1:" + "0" * 64, "the file was changed after it was written"),
        ("v9:" + "0" * 64, "'v9:"),
        ("x" * 10_000, "(10000 characters)"),
    ],
)
def test_a_bad_fingerprint_is_refused(fingerprint: object, words: str) -> None:
    doc = {**json.loads(to_json(TABLE)), "fingerprint": fingerprint}
    with pytest.raises(SerializationError) as info:
        from_json(json.dumps(doc))
    assert info.value.path == "fingerprint"
    assert words in info.value.message
    assert len(info.value.message) < 1000


def test_a_fingerprint_of_another_version_says_so() -> None:
    doc = {**json.loads(to_json(TABLE)), "fingerprint": "v9:" + "0" * 64}
    with pytest.raises(SerializationError) as info:
        from_json(json.dumps(doc))
    assert "another version" in info.value.message
    assert "changed after" not in info.value.message
    assert 'delete the "fingerprint" field' in info.value.message


# --------------------------------------------------------------------------------------
# strict reading: every bad document names the JSON path of its first bad value

GOOD_ENTRY: dict[str, Any] = {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}


def _table_doc(**changes: Any) -> str:
    doc: dict[str, Any] = {"version": 1, "entries": {"layers.7.w": dict(GOOD_ENTRY)}, "tied": []}
    doc.update(changes)
    return json.dumps(doc)


def _entry(**changes: Any) -> str:
    return _table_doc(entries={"layers.7.w": {**GOOD_ENTRY, **changes}})


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        ("{", "$", "not valid JSON"),
        ("", "$", "not valid JSON"),
        ("[]", "$", "expected a JSON object"),
        ('{"version": NaN, "entries": {}}', "$", "NaN"),
        (_table_doc(version=2), "version", "unsupported version"),
        (_table_doc(version="1"), "version", "unsupported version"),
        (_table_doc(version=True), "version", "unsupported version"),
        ('{"entries": {}}', "version", "missing field 'version'"),
        ('{"version": 1}', "entries", "missing field 'entries'"),
        (_table_doc(tide=[]), "tide", "unknown field 'tide'"),
        (_table_doc(entries=[]), "entries", "expected a JSON object"),
        (_entry(placements=["S(x)"]), 'entries["layers.7.w"].placements[0]', "'S(x)'"),
        (_entry(placements=[0]), 'entries["layers.7.w"].placements[0]', "expected a string"),
        (_entry(placements=["P(sum)"]), 'entries["layers.7.w"].placements[0]', "P(sum)"),
        (_entry(placements="S(0)"), 'entries["layers.7.w"].placements', "JSON array"),
        (_entry(axes=["1tp"]), 'entries["layers.7.w"].axes[0]', "'1tp'"),
        (_entry(axes=[["tp"]]), 'entries["layers.7.w"].axes[0]', "expected a string"),
        (_entry(axes=["tp", "ep"]), 'entries["layers.7.w"].placements', "2 axes"),
        (
            _entry(axes=["tp", "tp"], placements=["R", "R"]),
            'entries["layers.7.w"].axes[1]',
            "names axis 'tp' twice",
        ),
        (_entry(mesh=3), 'entries["layers.7.w"].mesh', "expected a string"),
        # after an equal good entry: still read in full
        (
            _table_doc(entries={"a": GOOD_ENTRY, "b": {**GOOD_ENTRY, "axes": [["tp"]]}}),
            'entries["b"].axes[0]',
            "expected a string",
        ),
        (
            _table_doc(entries={"a": GOOD_ENTRY, "b": {**GOOD_ENTRY, "mesh": {"d": 1}}}),
            'entries["b"].mesh',
            "expected a string",
        ),
        (
            _table_doc(entries={"a": GOOD_ENTRY, "b": {**GOOD_ENTRY, "axes": [1]}}),
            'entries["b"].axes[0]',
            "expected a string",
        ),
        (
            '{"version": 1, "entries": {"a": {"mesh": "d", "axes": [], "placements": []}, '
            '"b": {"mesh": "d", "axes": [], "placements": [], "mesh": "d"}}}',
            'entries["b"].mesh',
            "appears twice",
        ),
        (
            '{"version": 1, "entries": {"a": {"mesh": "d", "axes": [], "placements": []}, '
            '"b": {"axes": [], "mesh": "d", "axes": []}}}',
            'entries["b"].axes',
            "appears twice",
        ),
        (_entry(mesh=""), 'entries["layers.7.w"].mesh', "non-empty"),
        (_entry(extra=1), 'entries["layers.7.w"].extra', "unknown field 'extra'"),
        (_table_doc(entries={"layers.7.w": 5}), 'entries["layers.7.w"]', "JSON object"),
        (_table_doc(tied=[["layers.7.w", "absent.w"]]), "tied[0][1]", "no entry"),
        (_table_doc(tied=[["layers.7.w"]]), "tied[0]", "fewer than two"),
        (_table_doc(tied=[["layers.7.w", ""]]), "tied[0][1]", "non-empty"),
        (_table_doc(tied={"a": 1}), "tied", "JSON array"),
        ('{"version": 1, "entries": {"a": {}, "a": {}}}', 'entries["a"]', "appears twice"),
        (  # the entries' keys are checked before their values
            '{"version": 1, "entries": {"b": {}, "a": {}, "a": {}}}',
            'entries["a"]',
            "appears twice",
        ),
        ('{"version": 1, "entries": {"b": {}, "": {}}}', 'entries[""]', "non-empty"),
        (
            '{"version": 1, "entries": {"a": {"mesh": "d", "axes": [], "placements": []}, '
            '"a": {"mesh": "d", "axes": [], "placements": []}}}',
            'entries["a"]',
            "appears twice",
        ),
        (
            '{"version": 1, "entries": {"b": {"mesh": "d", "axes": [], "placements": []}, '
            '"c": {"mesh": "d", "axes": [], "placements": []}, "b": {}}}',
            'entries["b"]',
            "appears twice",
        ),
        ('{"version": 1, "version": 1, "entries": {}}', "version", "appears twice"),
        (
            '{"version": 1, "entries": {"a": {"mesh": "d", "mesh": "e", "axes": [], '
            '"placements": []}}}',
            'entries["a"].mesh',
            "appears twice",
        ),
    ],
)
def test_bad_table_documents(text: str, path: str, words: str) -> None:
    with pytest.raises(SerializationError) as info:
        from_json(text)
    assert info.value.path == path
    assert path in str(info.value)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"version": 1, "mesh_axes": ["tp"]}, "modules"),
        ({"version": 1, "mesh_axes": "tp", "modules": {}}, "mesh_axes"),
        ({"version": 1, "mesh_axes": ["tp", "ep", "tp"], "modules": {}}, "mesh_axes[2]"),
        ({"version": 1, "mesh_axes": [], "modules": {"a..b": {"params": {}}}}, 'modules["a..b"]'),
        (
            {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {"w..x": {}}}}},
            'modules["a"].params["w..x"]',
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {"": {}}}}},
            'modules["a"].params[""]',
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {}, "tied_pairs": [["a", ""]]},
            "tied_pairs[0][1]",
        ),
        ({"version": 1, "mesh_axes": ["tp"], "modules": {"a": {}}}, 'modules["a"].params'),
        (
            {"version": 1, "mesh_axes": ["tp"], "modules": {"a": {"params": {"w": {"tp": "X"}}}}},
            'modules["a"].params["w"]["tp"]',
        ),
        (
            {"version": 1, "mesh_axes": ["tp"], "modules": {"a": {"params": {"w": {"t p": "R"}}}}},
            'modules["a"].params["w"]["t p"]',
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {}, "expert_parallel": 1}}},
            'modules["a"].expert_parallel',
        ),
        ({"version": 1, "mesh_axes": [], "modules": {}, "tied_pairs": [["a"]]}, "tied_pairs[0]"),
        (
            {"version": 1, "mesh_axes": [], "modules": {}, "tied_pairs": [["a", 2]]},
            "tied_pairs[0][1]",
        ),
    ],
)
def test_bad_plan_documents(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(SerializationError) as info:
        plan_from_json(json.dumps(doc))
    assert info.value.path == path


def test_nothing_from_the_input_is_imported_or_executed() -> None:
    text = _entry(placements=["__import__('os').system('false')"])
    with pytest.raises(SerializationError, match="is not a placement"):
        from_json(text)
    hostile = json.dumps({"py/object": "os.system", "version": 1, "entries": {}})
    with pytest.raises(SerializationError, match="unknown field 'py/object'"):
        from_json(hostile)


# --------------------------------------------------------------------------------------
# every one-field corruption of a real document is either valid or a SerializationError;
# with its fingerprint, it is the table written or a SerializationError

_SIGNED: Final[dict[str, Any]] = json.loads(to_json(DROPPED))
_REAL: Final = {k: v for k, v in _SIGNED.items() if k != "fingerprint"}

_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.sampled_from(["S(0)", "R", "P(sum)", "_S(0, 2)", "tp", "dense", "emb.weight"]),
    st.lists(st.sampled_from(["tp", "R", "S(1)"]), max_size=3),
    st.dictionaries(st.sampled_from(["mesh", "axes", "x"]), st.just("tp"), max_size=2),
)


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


_ALL_PATHS = _paths(_REAL)
_SIGNED_PATHS = _paths(_SIGNED)


def _replace(doc: object, path: tuple[object, ...], new: object) -> object:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in doc.items()}
    assert isinstance(doc, list)
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(doc)]


@given(st.sampled_from(_ALL_PATHS), _JUNK)
def test_one_field_corruptions_are_valid_or_serialization_errors(
    path: tuple[object, ...], junk: object
) -> None:
    text = json.dumps(_replace(_REAL, path, junk))
    try:
        table = from_json(text)
    except SerializationError as e:
        assert e.path
        assert "Traceback" not in str(e)
    else:
        assert from_json(to_json(table)) == table


@given(st.sampled_from(_ALL_PATHS[1:]))
def test_deleting_any_field_is_valid_or_a_serialization_error(path: tuple[object, ...]) -> None:
    *head, last = path
    doc = json.loads(json.dumps(_REAL))
    target: Any = doc
    for step in head:
        target = target[step]
    del target[last]
    try:
        from_json(json.dumps(doc))
    except SerializationError as e:
        assert e.path


def _is_the_signed_table_or_refused(doc: object) -> None:
    try:
        table = from_json(json.dumps(doc))
    except SerializationError as e:
        assert e.path
    else:
        assert table == DROPPED  # what the fingerprint signs: the value, not the drops


@given(st.sampled_from(_SIGNED_PATHS), _JUNK)
def test_a_corrupted_signed_document_is_the_table_written_or_refused(
    path: tuple[object, ...], junk: object
) -> None:
    _is_the_signed_table_or_refused(_replace(_SIGNED, path, junk))


@given(st.sampled_from([p for p in _SIGNED_PATHS[1:] if p != ("fingerprint",)]))
def test_a_signed_document_less_any_field_is_the_table_written_or_refused(
    path: tuple[object, ...],
) -> None:
    *head, last = path
    doc = json.loads(json.dumps(_SIGNED))
    target: Any = doc
    for step in head:
        target = target[step]
    del target[last]
    _is_the_signed_table_or_refused(doc)


@pytest.mark.parametrize(
    ("tied", "path", "words"),
    [
        ([["a", "b"], ["b", "c"]], "tied[1][0]", "two tied groups"),
        ([["a", "b"], ["c", "d"]], "tied[1]", "different layouts"),
    ],
)
def test_tied_groups_are_reported_at_the_group(
    tied: list[list[str]], path: str, words: str
) -> None:
    s0 = {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}
    s1 = {"mesh": "dense", "axes": ["tp"], "placements": ["S(1)"]}
    doc = {"version": 1, "entries": {"a": s0, "b": s0, "c": s0, "d": s1}, "tied": tied}
    with pytest.raises(SerializationError) as info:
        from_json(json.dumps(doc))
    assert info.value.path == path
    assert words in info.value.message


# --------------------------------------------------------------------------------------
# hostile values: keys that are not strings, huge numbers, huge strings


@pytest.mark.parametrize(
    ("doc", "kind", "path"),
    [  # a Python object given to the converter may have any keys
        ({"version": 1, "entries": {1: GOOD_ENTRY}}, ParamLayoutTable, "entries[1]"),
        ({"version": 1, "entries": {None: GOOD_ENTRY}}, ParamLayoutTable, "entries[None]"),
        ({1: 1, "version": 1, "entries": {}}, ParamLayoutTable, "1"),
        (
            {"version": 1, "entries": {"w": dict([*GOOD_ENTRY.items(), (2, 0)])}},
            ParamLayoutTable,
            'entries["w"][2]',
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {("a",): {"params": {}}}},
            ShardingPlan,
            "modules[('a',)]",
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {3: {}}}}},
            ShardingPlan,
            'modules["a"].params[3]',
        ),
        (
            {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {"w": {0: "R"}}}}},
            ShardingPlan,
            'modules["a"].params["w"][0]',
        ),
    ],
)
def test_keys_that_are_not_strings_are_serialization_errors(
    doc: dict[Any, Any], kind: type[object], path: str
) -> None:
    with pytest.raises(SerializationError) as info:
        converter.structure(doc, kind)
    assert info.value.path == path
    assert "keys are strings" in info.value.message


def test_a_huge_version_is_a_serialization_error() -> None:
    for version in [10**5000, -(10**5000)]:
        with pytest.raises(SerializationError) as info:
            converter.structure({"version": version, "entries": {}}, ParamLayoutTable)
        assert info.value.path == "version"
        assert len(info.value.message) < 300
    with pytest.raises(SerializationError) as info:
        from_json('{"version": ' + "9" * 5000 + ', "entries": {}}')
    assert info.value.path == "$"


HUGE: Final = "x" * 50_000_000


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 1, "entries": {"w": {**GOOD_ENTRY, "placements": [HUGE]}}},
        {"version": 1, "entries": {"w": {**GOOD_ENTRY, "axes": [HUGE + "-"]}}},
        {"version": 1, "entries": {HUGE: {**GOOD_ENTRY, "placements": ["P(sum)"]}}},
        {"version": 1, "entries": {HUGE: 5}},
        {"version": HUGE, "entries": {}},
        {"version": 1, "entries": {}, HUGE: 1},
        {"version": 1, "entries": {"w": {**GOOD_ENTRY, "mesh": [HUGE]}}},
    ],
    ids=["placement", "axis", "fqn", "fqn-key", "version", "field", "nested"],
)
def test_messages_quote_at_most_a_few_hundred_characters(doc: dict[str, Any]) -> None:
    with pytest.raises(SerializationError) as info:
        from_json(json.dumps(doc))
    assert len(str(info.value)) < 1000
    assert len(info.value.path) < 400


@pytest.mark.parametrize("depth", [1, 50, 900])
def test_a_deeply_nested_value_is_shown_a_few_levels_deep(depth: int) -> None:
    nested = '{"a": ' * depth + '["S(0)"]' + "}" * depth
    for text, path in [
        (f'{{"version": 1, "entries": {{"w": {nested}}}}}', 'entries["w"].axes'),
        (f'{{"version": 1, "entries": [{nested}]}}', "entries"),
    ]:
        with pytest.raises(SerializationError) as info:
            from_json(text)
        assert info.value.path == path
        assert "{'a': " in info.value.message  # shown as the object it is, never its type
        assert "cannot be shown" not in info.value.message
        assert len(info.value.message) < 1000


def test_a_huge_plan_key_is_quoted_briefly() -> None:
    doc = {"version": 1, "mesh_axes": [], "modules": {"a": {"params": {HUGE + "..": {}}}}}
    with pytest.raises(SerializationError) as info:
        plan_from_json(json.dumps(doc))
    assert len(str(info.value)) < 1000
    assert info.value.path.startswith('modules["a"].params["xxx')


# --------------------------------------------------------------------------------------
# wrong types into every public function: a SerializationError, never a bare exception

_WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.just(TABLE),
    st.just(PLAN),
    st.just(EMB),
    st.builds(object),
)
_KINDS: Final[list[Any]] = [
    ParamLayoutTable,
    ParamShape,
    ShardingPlan,
    ModulePlan,
    SourceLayout,
    AxisName,
    Placement,
    Shard,
    Replicate,
    Partial,
    StridedShard,
]


@given(_WRONG, st.sampled_from(_KINDS))
def test_public_functions_given_wrong_types_raise_serialization_errors(
    value: object, kind: Any
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: from_json(value),  # type: ignore[arg-type]
        lambda: plan_from_json(value),  # type: ignore[arg-type]
        lambda: shapes_from_json(value),  # type: ignore[arg-type]
        lambda: shapes_to_json(value),  # type: ignore[arg-type]
        lambda: converter.structure(value, kind),
        lambda: converter.structure([value], list[kind]),
        lambda: converter.structure({"k": value}, dict[str, kind]),
        lambda: converter.structure((EMB, value), tuple[SourceLayout, kind]),
    ]
    if not isinstance(value, ParamLayoutTable):
        calls.append(lambda: to_json(value))  # type: ignore[arg-type]
    if not isinstance(value, ShardingPlan):
        calls.append(lambda: plan_to_json(value))  # type: ignore[arg-type]
    for call in calls:
        try:
            call()
        except SerializationError as e:
            assert e.path and len(e.message) < 1000
    # what a wrong value is written as by the right function is for cattrs; ours are exact
    assert to_json(TABLE) == to_json(from_json(to_json(TABLE)))


# --------------------------------------------------------------------------------------
# the converter, configured the way cattrs.preconf does it


@attrs.frozen
class RunConfig:
    """A user's own config: a name, a table and a plan, with cattrs' own types around."""

    name: str
    table: ParamLayoutTable
    plan: ShardingPlan | None = None
    layouts: tuple[SourceLayout, ...] = ()
    default: Placement = attrs.field(factory=Replicate)


def test_a_users_own_converter_holds_tables_and_plans() -> None:
    config = RunConfig("llama", TABLE, PLAN, (EMB,), Shard(1))
    for c in [configure_converter(cattrs.Converter()), make_converter()]:
        raw = c.unstructure(config)
        assert raw["table"] == json.loads(to_json(TABLE))
        assert raw["plan"] == json.loads(plan_to_json(PLAN))
        assert raw["default"] == "S(1)"
        back = c.structure(json.loads(json.dumps(raw)), RunConfig)
        assert back == config
    preconf = configure_converter(cattrs.preconf.json.make_converter())
    assert preconf.loads(preconf.dumps(config), RunConfig) == config


def test_a_users_converter_reads_strictly() -> None:
    c = make_converter()
    assert c is not converter
    raw = {"name": "x", "table": {"version": 1, "entries": {"w": {**GOOD_ENTRY, "axes": [1]}}}}
    with pytest.raises(SerializationError) as info:
        c.structure(raw, RunConfig)
    assert info.value.path == 'table.entries["w"].axes[0]'
    assert info.value.message.startswith('table.entries["w"].axes[0]: expected a string')
    # a bare cattrs converter the user configured groups the errors, as cattrs does
    with pytest.raises(ExceptionGroup) as group:
        configure_converter(cattrs.Converter()).structure(raw, RunConfig)
    assert [type(e) for e in group.value.exceptions] == [SerializationError]


GOOD_LAYOUT: Final[dict[str, Any]] = {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}


@pytest.mark.parametrize(
    ("value", "kind", "path", "words"),
    [
        ([GOOD_LAYOUT, {**GOOD_LAYOUT, "mesh": 1}], list[SourceLayout], "[1].mesh", "a string"),
        ([{**GOOD_LAYOUT, "axes": [1]}], list[SourceLayout], "[0].axes[0]", "a string"),
        ({"w": {**GOOD_LAYOUT, "x": 1}}, dict[str, SourceLayout], '["w"].x', "unknown field"),
        ((GOOD_LAYOUT, "R", "Q"), tuple[SourceLayout, ...], "[1]", "JSON object"),
        (["R", "Q"], list[Placement], "[1]", "'Q' is not a placement"),
        ([["S(0)"], ["R", "S(x)"]], list[list[Shard]], "[1][0]", "expected a Shard"),
        (
            {"name": "x", "table": {"version": 2, "entries": {}}},
            RunConfig,
            "table.version",
            "version",
        ),
        ({"name": "x", "table": TABLE}, RunConfig, "table", "JSON object"),
        ({"table": {"version": 1, "entries": {}}}, RunConfig, "name", "KeyError"),
        (
            [{"version": 1, "entries": {"w": {**GOOD_LAYOUT, "mesh": ""}}}],
            list[ParamLayoutTable],
            '[0].entries["w"].mesh',
            "non-empty",
        ),
        (
            {"w": {"shape": [-1], "dtype": "float32"}},
            dict[str, ParamShape],
            '["w"].shape[0]',
            "got -1",
        ),
        ("x", int, "$", "ValueError"),
    ],
)
def test_the_converter_reports_one_error_at_the_first_bad_value(
    value: object, kind: Any, path: str, words: str
) -> None:
    for c in [converter, make_converter()]:
        with pytest.raises(SerializationError) as info:
            c.structure(value, kind)
        assert info.value.path == path
        assert info.value.message.startswith(f"{path}: ")
        assert words in info.value.message


# --------------------------------------------------------------------------------------
# shapes.json: parameter shapes and dtypes by FQN

SHAPES: Final = {
    "emb.weight": ParamShape((50, 16), "bfloat16"),
    "layers.0.moe.experts.w1": ParamShape((4, 24, 16), "BF16"),
    "norm.weight": ParamShape((16,), "float32"),
    "scalar": ParamShape((), "int64"),
}


def test_shapes_document_is_the_documented_format() -> None:
    text = shapes_to_json(SHAPES)
    assert json.loads(text) == {
        "version": 1,
        "params": {
            "emb.weight": {"shape": [50, 16], "dtype": "bfloat16"},
            "layers.0.moe.experts.w1": {"shape": [4, 24, 16], "dtype": "bfloat16"},
            "norm.weight": {"shape": [16], "dtype": "float32"},
            "scalar": {"shape": [], "dtype": "int64"},
        },
    }
    assert len(text.splitlines()) == 2 + len(SHAPES) + 1
    back = shapes_from_json(text)
    assert dict(back) == SHAPES and list(back) == list(SHAPES)
    assert converter.structure(json.loads(text)["params"], dict[str, ParamShape]) == SHAPES


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.builds(
            ParamShape,
            # at most 2**60 elements: within int64, as a tensor's
            st.lists(st.integers(0, 2**15), max_size=4).map(tuple),
            st.sampled_from(["float32", "bfloat16", "F16", "int8", "torch.float64"]),
        ),
        max_size=8,
    )
)
def test_shapes_round_trip(shapes: dict[str, ParamShape]) -> None:
    assert dict(shapes_from_json(shapes_to_json(shapes))) == shapes


class _FreshShapes(Mapping[str, ParamShape]):
    """Shapes built afresh on every access and freed after use, as a lazy loader hands
    them out: each new value may take the memory (and id) of the one before."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, fqn: str) -> ParamShape:
        return ParamShape((int(fqn[1:]) + 1, 4), "float32")

    def __iter__(self) -> Iterator[str]:
        return (f"w{i}" for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def test_shapes_built_lazily_are_written_each_as_itself() -> None:
    lazy = _FreshShapes(12)
    assert dict(shapes_from_json(shapes_to_json(lazy))) == dict(lazy.items())


@pytest.mark.parametrize(
    ("params", "path", "words"),
    [
        ({"w": {"shape": [4, -1], "dtype": "float32"}}, 'params["w"].shape[1]', "got -1"),
        ({"w": {"shape": [4, 1.0], "dtype": "float32"}}, 'params["w"].shape[1]', "an int"),
        ({"w": {"shape": [4], "dtype": "flaot32"}}, 'params["w"].dtype', "did you mean"),
        ({"w": {"shape": "4", "dtype": "float32"}}, 'params["w"].shape', "JSON array"),
        ({"w": {"shape": [4]}}, 'params["w"].dtype', "missing field"),
        ({"": {"shape": [4], "dtype": "float32"}}, 'params[""]', "non-empty"),
        ({"w": [4]}, 'params["w"]', "JSON object"),
        # after an equal good entry (1 == true == 1.0): still no size
        (
            {"v": {"shape": [1], "dtype": "bfloat16"}, "w": {"shape": [True], "dtype": "bfloat16"}},
            'params["w"].shape[0]',
            "an int",
        ),
        (
            {"v": {"shape": [2], "dtype": "bfloat16"}, "w": {"shape": [2.0], "dtype": "bfloat16"}},
            'params["w"].shape[0]',
            "an int",
        ),
    ],
)
def test_bad_shapes_documents(params: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(SerializationError) as info:
        shapes_from_json(json.dumps({"version": 1, "params": params}))
    assert info.value.path == path
    assert words in info.value.message


QKV: Final = Packed([Part("q", 32, 128), Part("k", 8, 128), Part("v", 8, 128)])


def test_a_shapes_structure_is_written_and_read_back() -> None:
    shapes = {
        "qkv.weight": ParamShape((6144, 16), "bfloat16", structure={0: QKV}),
        "norm.weight": ParamShape((16,), "float32"),
    }
    text = shapes_to_json(shapes)
    doc = json.loads(text)["params"]
    assert doc["qkv.weight"]["structure"] == {
        "0": [
            {"name": "q", "count": 32, "size": 128},
            {"name": "k", "count": 8, "size": 128},
            {"name": "v", "count": 8, "size": 128},
        ]
    }
    assert "structure" not in doc["norm.weight"]  # a plain shape reads as before
    assert dict(shapes_from_json(text)) == shapes
    assert shapes_from_json(text)["qkv.weight"].structure == {0: QKV}
    for shape in shapes.values():
        assert converter.structure(converter.unstructure(shape), ParamShape) == shape


@pytest.mark.parametrize(
    ("structure", "path", "words"),
    [
        ([1], 'params["w"].structure', "expected a structure"),
        ({"0": [{"name": "q", "count": 3}]}, 'params["w"].structure', "spans 3 elements"),
        ({"1": [{"name": "q", "count": 16}]}, 'params["w"].structure', "is for dim 1"),
        ({"0": [{"name": "q", "count": "16"}]}, 'params["w"].structure["0"][0].count', "an int"),
    ],
)
def test_bad_structures(structure: object, path: str, words: str) -> None:
    params = {"w": {"shape": [16], "dtype": "float32", "structure": structure}}
    reads: list[tuple[Callable[[], object], str]] = [
        (lambda: shapes_from_json(json.dumps({"version": 1, "params": params})), path),
        (
            lambda: converter.structure(params, dict[str, ParamShape]),
            path.removeprefix("params"),
        ),
    ]
    for read, where in reads:
        with pytest.raises(SerializationError) as info:
            read()
        assert info.value.path == where
        assert words in info.value.message


def test_a_structure_key_given_twice_is_refused() -> None:
    text = (
        '{"version": 1, "params": {"w": {"shape": [16], "dtype": "float32", '
        '"structure": {"0": [{"name": "q", "count": 16}], "0": []}}}}'
    )
    with pytest.raises(SerializationError) as info:
        shapes_from_json(text)
    assert info.value.path == 'params["w"].structure["0"]'
    assert "appears twice" in info.value.message


def test_plan_keys_with_patterns_round_trip() -> None:
    plan = ShardingPlan(
        {
            "layers.*.attention": ModulePlan({"wq.weight": {"tp": Shard(0)}, "*.bias": {}}),
            "layers.*.moe.experts": ModulePlan({"w1": {"ep": Shard(0)}}, expert_parallel=True),
            "layers.0.attention": ModulePlan({"wq.weight": {"tp": Shard(1)}}),
        },
        mesh_axes=["ep", "tp"],
    )
    text = plan_to_json(plan)
    assert '"layers.*.attention": {' in text and '"*.bias": {}' in text
    assert plan_from_json(text) == plan
    assert converter.structure(converter.unstructure(plan), ShardingPlan) == plan


def test_a_python_tuple_is_an_object_of_pairs_never_an_array() -> None:
    """The reader takes a JSON object as the tuple of its pairs: so is a Python tuple read
    where the converter is handed one, and refused where an array belongs."""
    entry = {"mesh": "dense", "axes": ["tp"], "placements": ["S(0)"]}
    as_pairs = {"version": 1, "entries": {"w": tuple(entry.items())}}
    expected = from_json(json.dumps({"version": 1, "entries": {"w": entry}}))
    assert converter.structure(as_pairs, ParamLayoutTable) == expected
    as_tuples = {"version": 1, "entries": {"w": {**entry, "axes": ("tp",)}}}
    with pytest.raises(SerializationError) as info:
        converter.structure(as_tuples, ParamLayoutTable)
    assert info.value.path == 'entries["w"].axes'
    bad = [(("w",), "entries"), (("ab", "cd"), "entries"), (((1, entry),), "entries[1]")]
    for entries, path in bad:
        with pytest.raises(SerializationError) as info:
            converter.structure({"version": 1, "entries": entries}, ParamLayoutTable)
        assert info.value.path == path
