"""One rule, one place: the inline list ``some_of``, the runs of ranks sharing its
wording, and the one "must be a table" message, the bridge's included."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import nn

from layout_algebra import BindError, LayoutError, ParamShape, Shard, SourceLayout
from layout_algebra._text import MAX_INLINE, quote, ranks_text, some_of
from layout_algebra.layout import check_table
from layout_algebra.torch_bridge import bind, distribute
from layout_algebra.torch_bridge._checks import refuse_spmd_local
from layout_algebra.training import Training, training_cost


def test_some_of_spells_the_first_few_then_how_many_more() -> None:
    names = [f"n{i}" for i in range(8)]
    assert some_of(names) == "n0, n1, n2, n3, n4 and 3 more"
    assert some_of(names, 2, show=quote) == "'n0', 'n1' and 6 more"
    assert some_of(names[:MAX_INLINE]) == "n0, n1, n2, n3, n4"
    assert some_of([]) == ""


def test_some_of_bounds_each_name() -> None:
    shown = some_of(["x" * 10**6, "y" * 10**6], 1, show=quote)
    assert len(shown) < 300 and shown.endswith(" and 1 more")


def test_ranks_text_counts_ranks_in_some_of_wording() -> None:
    ranks = [r for r in range(100) if r % 3 != 2]  # runs of two: 0-1, 3-4, ...
    shown = ranks_text(ranks)
    assert shown.startswith("ranks 0-1, 3-4, ")
    assert shown.endswith(f" and {len(ranks) - 24} more")  # 12 runs of 2 shown


def test_the_bridge_says_must_be_a_table_as_the_package_does() -> None:
    cases: list[tuple[str, object, Callable[[], object]]] = [
        ("bind(table=...)", None, lambda: bind(None, nn.Linear(2, 2), {})),  # type: ignore[arg-type]
        ("distribute(table=...)", [], lambda: distribute(nn.Linear(2, 2), [], {})),  # type: ignore[arg-type]
    ]
    for arg, value, call in cases:
        with pytest.raises(BindError) as bridge:
            call()
        with pytest.raises(LayoutError) as package:
            check_table(value, arg)
        assert str(bridge.value) == str(package.value)


def test_spmd_local_lists_some_fqns_and_counts_the_rest() -> None:
    fqns = [f"layers.{i}.w" for i in range(MAX_INLINE + 2)]
    with pytest.raises(LayoutError) as info:
        refuse_spmd_local(fqns, "table_from_module")
    assert "'layers.4.w' and 2 more;" in str(info.value)
    assert "'layers.5.w'" not in str(info.value)


def test_a_budget_names_the_other_ranks_above_it_as_runs() -> None:
    fsdp = SourceLayout("dense", ["dp_shard"], [Shard(0)])
    layouts = {"w": fsdp}
    shapes = {"w": ParamShape((10, 4), "float32")}  # ranks 0-2 hold 3 rows, rank 3 one
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 4}}, Training(), budget=1)
    excess = cost.over_budget
    assert excess is not None and excess.ranks == (0, 1, 2, 3)
    assert excess.message.startswith("rank 0 (and ranks 1-3) needs ")
