"""The public strategies keep their promises: bounds, kinds and valid values."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis.errors import InvalidArgument

from layout_algebra import (
    FSDP_OWNED_AXES,
    AxisName,
    ParamLayoutTable,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
)
from layout_algebra.testing import (
    axis_names,
    placements,
    sharding_plans,
    source_layouts,
    source_placements,
    tables,
)


@given(axis_names(max_length=3))
def test_axis_names_are_bounded(axis: AxisName) -> None:
    assert len(axis.name) <= 3 or axis.name in FSDP_OWNED_AXES | {"tp", "ep", "sp", "etp"}


@given(placements(kinds=(Shard, StridedShard), max_dim=2, max_split_factor=3))
def test_placements_draw_only_the_kinds_asked_for(p: Placement) -> None:
    assert isinstance(p, Shard | StridedShard)
    assert p.dim <= 2
    if isinstance(p, StridedShard):
        assert 2 <= p.split_factor <= 3


@given(source_placements(max_dim=1))
def test_source_placements_are_replicate_or_shard(p: Placement) -> None:
    assert p in (Replicate(), Shard(0), Shard(1))


@given(source_layouts(mesh="expert", axes=["ep", "tp"]))
def test_source_layouts_use_the_mesh_and_axes_given(layout: SourceLayout) -> None:
    assert layout.mesh == "expert"
    assert [a.name for a in layout.axes] == ["ep", "tp"]


@given(source_layouts(max_axes=2))
def test_source_layouts_have_no_owned_axis(layout: SourceLayout) -> None:
    assert len(layout.axes) <= 2
    assert not {a.name for a in layout.axes} & FSDP_OWNED_AXES


@given(tables(max_entries=3, tied=False))
def test_tables_are_bounded(table: ParamLayoutTable) -> None:
    assert len(table) <= 3
    assert table.tied == ()


@given(sharding_plans(["tp", "dp_shard"], expert_parallel=False, max_modules=2, max_params=1))
def test_sharding_plans_follow_their_arguments(plan: ShardingPlan) -> None:
    assert [a.name for a in plan.mesh_axes] == ["tp", "dp_shard"]
    assert 1 <= len(plan.modules) <= 2
    for spec in plan.modules.values():
        assert not spec.expert_parallel
        assert len(spec.params) <= 1
    build_table(plan, ["dp_shard", "tp"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: placements(kinds=()),
        lambda: placements(kinds=(int,)),  # type: ignore[arg-type]  # run-time check
        lambda: placements(max_dim=-1),
        lambda: placements(max_split_factor=1),
        lambda: axis_names(max_length=0),
        lambda: sharding_plans(max_modules=0),
    ],
)
def test_bad_bounds_are_invalid_arguments(make: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgument):
        make()


_NO_HYPOTHESIS = """
import sys

class _NoHypothesis:
    # refuses hypothesis, as an interpreter without it installed does
    def find_spec(self, name, path=None, target=None):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoHypothesis())
"""


def test_without_hypothesis_the_strategies_name_the_extra(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(_NO_HYPOTHESIS)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    code = (
        "import layout_algebra, layout_algebra.serialization\n"
        "try:\n"
        "    import layout_algebra.testing\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    kind, _, message = result.stdout.strip().partition(" | ")
    assert kind == "ImportError"
    assert "pip install 'layout_algebra[testing]'" in message
