"""Hostile input, round three: messages quoting self-sharing values, byte sizes given to
``--budget``, empty or malformed training flags, a directory holding both a
transformers checkpoint and a DCP one, and problem lists printed as lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Final

import pytest

from layout_algebra._text import quote

# ---------------------------------------------------------------------------------------
# a value that holds one list many times over is quoted at once

_SHARED_CALLS: Final = textwrap.dedent(
    """
    import json
    from layout_algebra import (
        AxisName, Mesh, ParamLayoutTable, ParamShape, Part, Shard, ShardingPlan,
        SourceLayout, Training, build_table, lint, parse_placement, resolve,
    )
    from layout_algebra._text import quote
    from layout_algebra.errors import LayoutError
    from layout_algebra.serialization import converter

    deep = []
    for _ in range(60):  # its repr is 2**60 lists long
        deep = [deep, deep]
    wide = []
    for _ in range(8):  # sixteen of one list, eight levels down
        wide = [wide] * 16
    calls = {
        "Mesh": lambda: Mesh(deep),
        "Mesh sizes": lambda: Mesh({"tp": deep}),
        "resolve": lambda: resolve(deep, ["tp"]),
        "ParamShape": lambda: ParamShape(deep, "bfloat16"),
        "ParamShape dtype": lambda: ParamShape((2,), deep),
        "build_table": lambda: build_table(deep, deep),
        "lint": lambda: lint(deep, deep, mesh_sizes=deep),
        "parse_placement": lambda: parse_placement(deep),
        "Shard": lambda: Shard(deep),
        "SourceLayout": lambda: SourceLayout("dense", deep, deep),
        "Training": lambda: Training(units=deep),
        "AxisName": lambda: AxisName(deep),
        "Part": lambda: Part(deep, 1),
        "table from Python": lambda: converter.structure(
            {"version": 1, "entries": wide}, ParamLayoutTable
        ),
        "plan from Python": lambda: converter.structure(
            {"version": 1, "mesh_axes": [wide], "modules": {}}, ShardingPlan
        ),
    }
    shown = {}
    for name, call in calls.items():
        try:
            call()
        except LayoutError as e:
            shown[name] = len(str(e))
        else:
            shown[name] = None
    shown["quote"] = len(quote({"a": deep, "b": wide}))
    print(json.dumps(shown))
    """
)


def test_a_self_sharing_value_is_quoted_at_once() -> None:
    # Its full repr would never finish: the time limit fails the test instead of hanging.
    done = subprocess.run(
        [sys.executable, "-c", _SHARED_CALLS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    refused = {name: size for name, size in shown.items() if name != "quote"}
    assert all(size is not None and size < 1000 for size in refused.values()), refused
    assert shown["quote"] < 300


@pytest.mark.parametrize(
    "value",
    [
        [],
        (),
        {},
        set(),
        frozenset(),
        (1,),
        [1, "a", None, 2.5, b"x", True],
        {"tp": [1, 2], "ep": (3,), "x": {4}},
        frozenset({"a"}),
        [[[]]],
    ],
)
def test_quote_spells_small_containers_as_repr_does(value: object) -> None:
    assert quote(value) == repr(value)


def test_quote_shows_a_container_within_itself_as_repr_does() -> None:
    looped: list[object] = [1]
    looped.append(looped)
    assert quote(looped) == repr(looped) == "[1, [...]]"


def test_quote_cuts_a_long_container_and_counts_its_items() -> None:
    shown = quote(list(range(10**6)))
    assert shown.startswith("[0, 1, 2, ")
    assert shown.endswith("... (a list of 1000000 items)")
    assert len(shown) < 300
    nested: list[object] = []
    for _ in range(100_000):  # deeper than repr can recurse
        nested = [nested]
    assert quote(nested).endswith("... (a list of 1 item)")
