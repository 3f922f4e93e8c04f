"""The bridge's readers on models as real trainers leave them.

torchtitan's default backend (plain local shards with spmd_types records), torch's
activation-checkpoint wrapper, transformers' own meshes and expert parallelism: each read
back as the library made it, the library as the oracle.
"""

from __future__ import annotations

import pytest
from torch import nn

from layout_algebra import LayoutError
from layout_algebra.torch_bridge import shapes_from_module, table_from_module
from tests.torchtitan_runs import Run, Titan, build

pytestmark = [
    pytest.mark.usefixtures("fake_world"),
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


@pytest.fixture
def titan(monkeypatch: pytest.MonkeyPatch) -> Titan:
    pytest.importorskip("torchtitan")
    return Titan(monkeypatch)


# ---------------------------------------------------------------------------------------
# torchtitan's spmd_types backend: plain local shards are refused, never read as whole


def test_spmd_types_shards_are_refused_naming_them(titan: Titan) -> None:
    run = Run("llama3", "spmd_types", tp=2)
    model = build(run)
    whole = shapes_from_module(model)
    titan.parallelize(run, model, titan.parallel_dims(run))
    local = {n: tuple(p.shape) for n, p in model.named_parameters()}
    # what the old reading gave: a local shard's shape as the global one
    assert any(local[n] != whole[n].shape for n in local)
    for reader in (table_from_module, shapes_from_module):
        with pytest.raises(LayoutError, match="spmd_types") as info:
            reader(model)
        message = info.value.message
        assert "layers.0.attention.wq.weight" in message or "layers.0.attention" in message
        assert "plan_from_torchtitan" in message and "full_dtensor" in message
        assert info.value.fqn is not None and info.value.fqn in local


def test_spmd_types_replicated_records_are_plain(titan: Titan) -> None:
    """A record with no V or P entry (every rank holds the whole tensor) reads as before."""
    run = Run("llama3", "spmd_types", tp=2)
    model = build(run)
    titan.parallelize(run, model, titan.parallel_dims(run))
    norm = model.get_submodule("norm")
    assert isinstance(norm, nn.Module)
    kept = {n: getattr(p, "_local_type", None) for n, p in norm.named_parameters()}
    assert kept and all(v is not None for v in kept.values())
    assert set(shapes_from_module(norm)) == set(kept)
    assert all(not layout.axes for _, layout in table_from_module(norm).items())
