"""Axis names, the owned axes, and plain strings wherever an axis is taken."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given

from layout_algebra import (
    FSDP_OWNED_AXES,
    AxisName,
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    build_table,
    complete_default,
    resolve,
    strip,
)
from layout_algebra.axes import AxisLike
from tests.strategies import axis_names


@pytest.mark.parametrize("name", ["tp", "ep", "dp_shard", "_", "_x1", "A", "mesh2d", "T_P_0"])
def test_identifiers_are_axis_names(name: str) -> None:
    axis = AxisName(name)
    assert axis.name == name
    assert str(axis) == name
    assert repr(axis) == f"AxisName(name={name!r})"


@pytest.mark.parametrize("name", ["", "1tp", "t-p", "tp ", " tp", "t.p", "tp\n", "ép", "t p"])
def test_non_identifiers_are_rejected(name: str) -> None:
    with pytest.raises(LayoutError, match="is not an identifier") as info:
        AxisName(name)
    assert repr(name) in str(info.value)
    assert "letters, digits and '_'" in str(info.value)
    assert info.value.axis == name


@pytest.mark.parametrize("value", [None, 0, b"tp", ("tp",)])
def test_non_strings_are_rejected(value: object) -> None:
    with pytest.raises(LayoutError, match="an axis name must be a str"):
        AxisName(value)  # type: ignore[arg-type]  # checked at run time


@given(axis_names())
def test_str_of_an_axis_is_its_name(axis: AxisName) -> None:
    assert str(axis) == axis.name
    assert AxisName(str(axis)) == axis
    assert hash(AxisName(axis.name)) == hash(axis)


def test_axis_names_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        AxisName("tp").name = "ep"  # type: ignore[misc]  # the point of the test


def test_axis_names_are_not_equal_to_strings() -> None:
    axis: object = AxisName("tp")
    assert axis != "tp"


def test_the_owned_axes() -> None:
    assert (
        frozenset(
            {
                "dp",
                "dp_replicate",
                "dp_shard",
                "cp",
                "pp",
                "fsdp_replicate",
                "fsdp_shard",
                "edp",
                "edp_replicate",
                "edp_shard",
                "fsdp",
                "efsdp",
            }
        )
        == FSDP_OWNED_AXES
    )
    assert isinstance(FSDP_OWNED_AXES, frozenset)
    assert all(isinstance(a, str) for a in FSDP_OWNED_AXES)


TP, EP, DP = AxisName("tp"), AxisName("ep"), AxisName("dp_shard")


def test_strip_takes_strings_and_axis_names() -> None:
    assert strip(["dp_shard", "tp", "ep"]) == strip([DP, TP, EP]) == strip([DP, "tp", EP])
    assert strip(["dp_shard", "tp", "ep"]) == (TP, EP)
    assert strip(["tp", "ep"], owned=[TP]) == strip(["tp", "ep"], owned=["tp"]) == (EP,)


def test_resolve_takes_strings_and_axis_names() -> None:
    expected = SourceLayout("dense", [TP, EP], [Shard(0), Replicate()])
    assert resolve({"tp": Shard(0)}, ["tp", "ep"]) == expected
    assert resolve({TP: Shard(0)}, [TP, EP]) == expected
    mixed: dict[AxisLike, Placement] = {TP: Shard(0), "sp": Shard(1)}
    assert resolve(mixed, [TP, EP], inactive=[AxisName("sp")]) == expected
    assert resolve({"tp": Shard(0)}, ["tp", "ep", "x"], owned=[AxisName("x")]) == expected


def test_layouts_tables_and_plans_take_strings_and_axis_names() -> None:
    assert SourceLayout("dense", ["tp"], [Shard(0)]) == SourceLayout("dense", [TP], [Shard(0)])
    assert SourceLayout("dense", ["tp"], [Shard(0)]).axes == (TP,)
    empty = ParamLayoutTable({})
    assert complete_default(empty, ["w"], ["tp"]) == complete_default(empty, ["w"], [TP])
    assert complete_default(empty, ["w"], ["tp", "x"], owned=[AxisName("x")])["w"].axes == (TP,)
    by_str = ShardingPlan({"m": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=["tp"])
    by_axis = ShardingPlan({"m": ModulePlan({"w": {TP: Shard(0)}})}, mesh_axes=[TP])
    assert by_str == by_axis
    assert by_str.mesh_axes == (TP,)
    assert build_table(by_str, ["tp"]) == build_table(by_axis, [TP])
    assert build_table(by_str, ["tp", "dp"], owned=[AxisName("dp")]) == build_table(by_str, [TP])


def test_a_bare_string_is_not_a_sequence_of_axes() -> None:
    with pytest.raises(LayoutError, match=r"not the string 'tp' .*; write \('tp',\)"):
        SourceLayout("dense", "tp", [Shard(0)])


def test_an_invalid_axis_anywhere_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match="is not an identifier"):
        strip(["tp", "t-p"])
    with pytest.raises(LayoutError, match="is not an identifier"):
        resolve({"t p": Shard(0)}, ["tp"])
    with pytest.raises(LayoutError, match="is not an identifier"):
        ShardingPlan({}, mesh_axes=["1d"])
