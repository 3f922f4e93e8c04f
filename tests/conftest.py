"""Shared fixtures: Hypothesis profiles, one fake 8-rank process group and its meshes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tests.torch_oracle import MeshFactory
    from tests.torchtitan_runs import Titan

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "fast", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# tests/typing is type-checked by mypy and never run; benchmarks are scripts (make bench).
collect_ignore = ["typing", "bench"]

FAKE_WORLD_SIZE = 8


@pytest.fixture(scope="session")
def fake_world() -> Iterator[int]:
    """A fake process group of 8 ranks (this process is rank 0); yields the world size.

    The fake backend moves no data: collectives return at once. It is enough for
    ``init_device_mesh``, ``distribute_tensor`` metadata and ``fully_shard``'s placements.
    """
    import torch.distributed as dist  # noqa: PLC0415 - torch loads only for tests with a mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC0415

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD_SIZE)
    yield FAKE_WORLD_SIZE


@pytest.fixture(scope="session")
def world_mesh(fake_world: int) -> MeshFactory:
    """``world_mesh({"dp_shard": 2, "tp": 4})``: the fake world's mesh with these axes.

    Each distinct (shape, names) is built once per session and shared by every test that
    asks for it; ``world_mesh.unnamed(8)`` gives a mesh without dim names.
    """
    from tests.torch_oracle import MeshFactory  # noqa: PLC0415 - torch loads only for tests with a mesh

    return MeshFactory(fake_world)


@pytest.fixture
def titan(monkeypatch: pytest.MonkeyPatch) -> Titan:
    """torchtitan's runs on the fake world, patched for the CPU (skipped without torchtitan)."""
    pytest.importorskip("torchtitan")
    from tests.torchtitan_runs import Titan  # noqa: PLC0415 - torchtitan loads only for its tests

    return Titan(monkeypatch)
