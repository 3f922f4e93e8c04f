"""Placements: their printed forms, their checks and the DSL that spells them."""

from __future__ import annotations

import copy
import pickle
import re
from collections.abc import Callable
from typing import assert_never

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from layout_algebra import (
    LayoutError,
    Partial,
    Placement,
    PlacementSyntaxError,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
    parse_placement,
)
from tests.strategies import placements

EVERY_KIND: list[tuple[Placement, str, str]] = [
    (Shard(0), "Shard(dim=0)", "S(0)"),
    (Shard(3), "Shard(dim=3)", "S(3)"),
    (Replicate(), "Replicate()", "R"),
    (Partial(), "Partial(reduce_op='sum')", "P(sum)"),
    (Partial("max"), "Partial(reduce_op='max')", "P(max)"),
    (StridedShard(0, split_factor=2), "StridedShard(dim=0, split_factor=2)", "_S(0, 2)"),
]


@pytest.mark.parametrize(("placement", "shown", "dsl"), EVERY_KIND)
def test_repr_is_constructor_shaped_and_str_is_the_dsl(
    placement: Placement, shown: str, dsl: str
) -> None:
    assert repr(placement) == shown
    assert str(placement) == dsl
    assert format_placement(placement) == dsl


def test_partial_defaults_to_a_sum() -> None:
    assert Partial() == Partial("sum") == Partial(reduce_op="sum")


def test_strided_shard_split_factor_is_keyword_only() -> None:
    with pytest.raises(LayoutError, match="keywords"):
        StridedShard(0, 2)  # type: ignore[call-arg]  # the factor must be named, as in torch


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Shard(-1), "dim must be an int from 0 to 63, got -1"),
        (lambda: Shard(True), "dim must be an int from 0 to 63, got True"),
        (lambda: Shard(1.0), "dim must be an int from 0 to 63, got 1.0"),  # type: ignore[arg-type]  # run-time check
        (lambda: StridedShard(-2, split_factor=2), "dim must be an int from 0 to 63, got -2"),
        (lambda: StridedShard(True, split_factor=2), "dim must be an int from 0 to 63, got True"),
        (
            lambda: StridedShard(0, split_factor=1),
            "split_factor must be an int from 2 to 2**31 - 1, got 1",
        ),
        (
            lambda: StridedShard(0, split_factor=0),
            "split_factor must be an int from 2 to 2**31 - 1, got 0",
        ),
        (
            lambda: StridedShard(0, split_factor=True),
            "split_factor must be an int from 2 to 2**31 - 1, got True",
        ),
        (
            lambda: Partial("mean"),  # type: ignore[arg-type]  # run-time check
            "reduce_op must be one of sum, avg, min, max, product; got 'mean'",
        ),
        (lambda: Partial("SUM"), "got 'SUM'"),  # type: ignore[arg-type]  # run-time check
    ],
)
def test_invalid_fields_are_rejected(make: Callable[[], Placement], message: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("placement", [p for p, _, _ in EVERY_KIND])
def test_placements_are_frozen(placement: Placement) -> None:
    field = next(iter(attrs.fields_dict(type(placement))), "dim")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(placement, field, 1)


@given(placements(), placements())
def test_equal_placements_hash_equal(a: Placement, b: Placement) -> None:
    assert (a == b) == (repr(a) == repr(b))
    if a == b:
        assert hash(a) == hash(b)


@given(placements())
def test_a_placement_equals_its_copy(p: Placement) -> None:
    copy = attrs.evolve(p)
    assert copy == p
    assert hash(copy) == hash(p)


@given(placements())
def test_equal_placements_made_anew_are_one_object(p: Placement) -> None:
    # A planner writes Shard(0) for every parameter: each is the one Shard(0), made
    # again by the constructor, evolve, copy or pickle (StridedShard is not shared).
    again = [attrs.evolve(p), copy.copy(p), copy.deepcopy(p)]
    again += [pickle.loads(pickle.dumps(p, protocol)) for protocol in range(6)]
    for q in again:
        assert q == p
        assert (q is p) == (not isinstance(p, StridedShard))


def test_a_rejected_value_is_never_shared() -> None:
    for make in (lambda: Shard(-1), lambda: Shard(True), lambda: Partial("mean")):  # type: ignore[arg-type]
        with pytest.raises(LayoutError):
            make()
    assert Shard(1) is Shard(dim=1)
    assert Partial() is Partial("sum")
    assert Replicate() is Replicate()


def test_a_placement_subclass_is_its_own_object() -> None:
    @attrs.frozen
    class Mine(Shard):
        pass

    mine = Mine(0)
    assert type(mine) is Mine
    assert mine is not Shard(0)
    assert type(Shard(0)) is Shard


def test_different_placements_differ() -> None:
    distinct: list[Placement] = [
        Shard(0),
        Shard(1),
        StridedShard(0, split_factor=2),
        StridedShard(0, split_factor=3),
        Replicate(),
        Partial("sum"),
        Partial("max"),
    ]
    assert len(set(distinct)) == len(distinct)
    assert [a == b for a in distinct for b in distinct].count(True) == len(distinct)


PARSED: list[tuple[str, Placement]] = [
    ("S(0)", Shard(0)),
    ("s(1)", Shard(1)),
    ("S( 12 )", Shard(12)),
    ("shard(0)", Shard(0)),
    ("Shard(2)", Shard(2)),
    ("SHARD (3)", Shard(3)),
    ("R", Replicate()),
    ("r", Replicate()),
    ("replicate", Replicate()),
    ("Replicate", Replicate()),
    (" REPLICATE ", Replicate()),
    ("replicate()", Replicate()),
    ("P(sum)", Partial("sum")),
    ("p(MAX)", Partial("max")),
    ("P( avg )", Partial("avg")),
    ("partial", Partial("sum")),
    ("Partial", Partial("sum")),
    ("partial()", Partial("sum")),
    ("partial(max)", Partial("max")),
    ("Partial(Product)", Partial("product")),
    ("partial(min)", Partial("min")),
    ("_S(0, 2)", StridedShard(0, split_factor=2)),
    ("_s(1,4)", StridedShard(1, split_factor=4)),
    ("  _S ( 0 , 8 ) ", StridedShard(0, split_factor=8)),
    ("\tS(0)\n", Shard(0)),
]


@pytest.mark.parametrize(("text", "expected"), PARSED)
def test_parse_accepts_both_spellings_ignoring_case_and_spaces(
    text: str, expected: Placement
) -> None:
    assert parse_placement(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "S",
        "S()",
        "S(-1)",
        "S(x)",
        "S(0",
        "S(0))",
        "S(0, 2)",
        "shard",
        "P(mean)",
        "partial(mean)",
        "_S(0)",
        "_S(0, 1)",
        "_S(-1, 2)",
        "Shard(dim=0)",
        "Replicate(0)",
        "RR",
        "x" * 200,
        "S(0)" + " " * 100,
    ],
)
def test_parse_rejects_text_outside_the_grammar(text: str) -> None:
    with pytest.raises(PlacementSyntaxError) as info:
        parse_placement(text)
    message = str(info.value)
    assert repr(text[:200]) in message
    assert "grammar: S(dim) | shard(dim) | R | replicate | P(op) | partial" in message
    assert "case and spaces ignored" in message
    assert info.value.text == text


def test_parse_names_the_bad_reduce_op() -> None:
    with pytest.raises(PlacementSyntaxError, match="unknown reduce op 'mean'"):
        parse_placement("P(mean)")


def test_parse_explains_a_field_check_it_fails() -> None:
    with pytest.raises(
        PlacementSyntaxError, match=r"split_factor must be an int from 2 to 2\*\*31 - 1, got 1"
    ):
        parse_placement("_S(0, 1)")


@pytest.mark.parametrize("value", [0, None, b"S(0)", Shard(0)])
def test_parse_rejects_non_text(value: object) -> None:
    with pytest.raises(PlacementSyntaxError, match="a placement must be text") as info:
        parse_placement(value)  # type: ignore[arg-type]  # checked at run time
    assert info.value.text == repr(value)


def test_placement_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="is not a placement"):
        parse_placement("bogus")


@given(placements(max_dim=63, max_split_factor=2**31 - 1))
def test_format_then_parse_is_the_identity(p: Placement) -> None:
    assert parse_placement(format_placement(p)) == p
    assert parse_placement(str(p)) == p


def _spaced(text: str) -> str:
    return " ".join(text)


@given(placements(), st.sampled_from([str.upper, str.lower, _spaced]))
def test_parse_ignores_case_and_spaces_of_formatted_text(
    p: Placement, spell: Callable[[str], str]
) -> None:
    assert parse_placement(spell(format_placement(p))) == p


def _describe(p: Placement) -> str:
    match p:
        case Shard(dim):
            return f"split on {dim}"
        case Replicate():
            return "whole"
        case Partial(op):
            return f"pending {op}"
        case StridedShard(dim, split_factor=k):
            return f"split on {dim} in {k} strides"
        case _:
            assert_never(p)


@pytest.mark.parametrize(
    ("placement", "described"),
    [
        (Shard(1), "split on 1"),
        (Replicate(), "whole"),
        (Partial("avg"), "pending avg"),
        (StridedShard(0, split_factor=4), "split on 0 in 4 strides"),
    ],
)
def test_placements_work_with_match(placement: Placement, described: str) -> None:
    assert _describe(placement) == described


def test_match_args_are_the_constructor_fields() -> None:
    assert Shard.__match_args__ == ("dim",)
    assert Partial.__match_args__ == ("reduce_op",)
    assert StridedShard.__match_args__ == ("dim",)
    assert Replicate.__match_args__ == ()
