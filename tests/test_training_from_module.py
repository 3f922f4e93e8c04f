"""``torch_bridge.training_from_module``: frozen parameters and units read off a model, the
units compared with what transformers' and torchtitan's own FSDP2 code wraps.

Each library's wrapping runs for real (torch's ``fully_shard`` on the fake 8-rank world,
models on the meta device) and is read back from FSDP2's own parameter groups. A
``Training`` holds each parameter in the innermost unit naming it, the rest in the root;
both libraries also wrap the final norm and the head (and a tied embedding) in one call
kept unsharded through the step, which the package's root is (the same shards, gradients
and collectives), so those groups are read as the root's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from layout_algebra import Training
from layout_algebra._units import compact, repeated_blocks
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.torch_bridge import training_from_module
from layout_algebra.torch_bridge._walk import state_dict_fqn
from tests.torch_oracle import MeshFactory

if TYPE_CHECKING:
    from tests.torchtitan_runs import Titan

pytestmark = pytest.mark.usefixtures("fake_world")


def tiny(kind: str = "llama", *, tied: bool = False) -> nn.Module:
    """A two-layer transformers model of ``kind`` on the meta device."""
    transformers = pytest.importorskip("transformers")
    common: dict[str, Any] = {
        "vocab_size": 50,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tied,
    }
    with torch.device("meta"):
        if kind == "llama":
            model: nn.Module = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
        else:
            experts: dict[str, Any] = {"moe_intermediate_size": 8, "num_experts": 4}
            config = transformers.Qwen3MoeConfig(**common, **experts)
            model = transformers.Qwen3MoeForCausalLM(config)
    return model


def _matches(pattern: str, segments: list[str]) -> bool:
    want = pattern.split(".")
    return len(want) == len(segments) and all(
        w in ("*", s) for w, s in zip(want, segments, strict=True)
    )


def units_of(training: Training, fqns: Iterable[str]) -> set[frozenset[str]]:
    """The parameters of each unit ``training`` names, the root's the rest."""
    patterns = [u for u in training.units if isinstance(u, str)]
    assert len(patterns) == len(training.units), "one module per unit"
    by_unit: dict[str, set[str]] = {}
    for fqn in fqns:
        segments = fqn.split(".")
        depth = max(
            (
                len(p.split("."))
                for p in patterns
                if len(p.split(".")) < len(segments) and _matches(p, segments[: len(p.split("."))])
            ),
            default=0,
        )
        by_unit.setdefault(".".join(segments[:depth]), set()).add(fqn)
    return {frozenset(v) for v in by_unit.values()}


def wrapped_units(model: nn.Module) -> set[frozenset[str]]:
    """The parameters of each ``fully_shard`` group torch made of ``model``: the groups
    freed after forward each, the root's and those kept through the step as one."""
    names = {id(m): fqn for fqn, m in model.named_modules(remove_duplicate=False)}
    root = model._get_fsdp_state()._fsdp_param_group if isinstance(model, FSDPModule) else None
    groups: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                groups[id(group)] = group
    kept: set[str] = set()
    freed: set[frozenset[str]] = set()
    for group in groups.values():
        fqns = set()
        for fp in group.fsdp_params:
            info = fp._module_info
            owners = [(info.module, info.param_name)]
            owners += list(zip(info.shared_modules, info.shared_param_names, strict=True))
            for owner, name in owners:
                fqns.add(state_dict_fqn(f"{names[id(owner)]}.{name}".lstrip(".")))
        if group is root or group.post_forward_mesh_info is None:
            kept |= fqns
        else:
            freed.add(frozenset(fqns))
    return {*freed, frozenset(kept)} if kept else freed


def _params(model: nn.Module) -> list[str]:
    return [state_dict_fqn(n) for n, _ in model.named_parameters(remove_duplicate=False)]


def transformers_wraps(model: nn.Module, world_mesh: MeshFactory) -> set[frozenset[str]]:
    """What transformers' own FSDP2 (``apply_fully_sharded_data_parallelism``, its plan
    resolved as ``from_pretrained(distributed_config=...)`` resolves it) makes of ``model``."""
    distributed = pytest.importorskip("transformers.distributed")
    from transformers.distributed.fsdp import (  # noqa: PLC0415 - only with transformers
        apply_fully_sharded_data_parallelism,
    )

    class Meshes:
        def get_mesh(self, names: object) -> object:
            return world_mesh({"fsdp": 8})["fsdp"]

    resolve: Any = model._resolve_parallel_plans
    _, ep_plan, fsdp_plan = resolve(distributed.DistributedConfig(fsdp_size=8))
    meshes: Any = Meshes()  # the one method transformers' FSDP asks of its mesh manager
    apply_fully_sharded_data_parallelism(model, meshes, fsdp_plan, ep_plan)
    return wrapped_units(model)


@pytest.mark.parametrize(
    ("kind", "tied", "units"),
    [
        ("llama", False, ("model.embed_tokens", "model.layers.*")),
        ("qwen3_moe", False, ("model.embed_tokens", "model.layers.*")),
        ("llama", True, ("model.layers.*",)),
    ],
)
def test_transformers_units_are_what_its_fsdp_wraps(
    kind: str, tied: bool, units: tuple[str, ...], world_mesh: MeshFactory
) -> None:
    model = tiny(kind, tied=tied)
    fqns = _params(model)
    training = training_from_module(model, param_dtype="bfloat16")
    assert training.units == units
    assert training.param_dtype == "bfloat16"
    assert units_of(training, fqns) == transformers_wraps(model, world_mesh)


def test_transformers_blocks_are_its_no_split_modules() -> None:
    model = tiny("qwen3_moe")
    blocks = {type(m).__name__ for m in model.get_submodule("model.layers").children()}
    listed: Any = model._no_split_modules
    assert blocks <= set(listed)
    # the experts, numbered inside each layer in older models, are no units of their own
    assert repeated_blocks(_params(model)) == ("model.layers.*",)


TITAN_RUNS = ["llama3", "qwen3", "qwen3_moe"]
"""torchtitan's debug models: dense, tied (qwen3), and with experts."""


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", TITAN_RUNS)
def test_torchtitan_units_are_what_its_fsdp_wraps(name: str, titan: Titan) -> None:
    from tests.torchtitan_runs import Run, build  # noqa: PLC0415 - torchtitan only here

    run = Run(name, "partial_dtensor", tp=1)
    model = build(run)
    fqns = _params(model)
    tied = name == "qwen3"
    training = training_from_module(model)
    assert training.units == (("layers.*",) if tied else ("tok_embeddings", "layers.*"))
    assert repeated_blocks(fqns) == ("layers.*",)
    titan.parallelize(run, model, titan.parallel_dims(run))
    assert units_of(training, fqns) == wrapped_units(model)


def frozen_llama() -> tuple[nn.Module, tuple[str, ...]]:
    """A transformers Llama with its embedding, its first layer and every layer's
    ``up_proj`` frozen, and those as ``compact`` writes them."""
    model = tiny()
    model.get_submodule("model.embed_tokens").requires_grad_(False)
    model.get_submodule("model.layers.0").requires_grad_(False)
    for layer in model.get_submodule("model.layers").children():
        layer.get_submodule("mlp.up_proj").requires_grad_(False)
    layer0 = [
        f"model.layers.0.{n}.weight"
        for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    ]
    expected = (
        "model.embed_tokens.weight",
        *layer0,
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.*.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    )
    return model, expected


def test_frozen_fqns_compact_where_every_layer_is_frozen() -> None:
    """What ``training_from_module`` gives ``Training(frozen=...)``."""
    model, expected = frozen_llama()
    fqns = _params(model)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert compact(frozen, fqns) == expected


def test_frozen_from_requires_grad() -> None:
    model, expected = frozen_llama()
    training = training_from_module(model)
    assert training.frozen == expected
    assert training.units == ("model.embed_tokens", "model.layers.*")


def test_frozen_given_is_kept() -> None:
    model, _ = frozen_llama()
    training = training_from_module(model, frozen=["model.embed_tokens.weight"])
    assert training.frozen == ("model.embed_tokens.weight",)


def test_nothing_frozen_passes_no_frozen() -> None:
    # nothing read from requires_grad reaches Training: the package's own default holds
    model = tiny()
    assert training_from_module(model) == Training(units=("model.embed_tokens", "model.layers.*"))


def test_units_given_are_kept_and_the_rest_passed_on() -> None:
    model = tiny()
    training = training_from_module(model, units=["model.layers.*"], optimizer="sgd")
    assert training == Training(units=["model.layers.*"], optimizer="sgd")


def test_a_model_without_blocks_is_one_unit() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    assert training_from_module(model).units == ()


def test_a_plain_model_with_numbered_blocks() -> None:
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    model.head = nn.Linear(4, 2)
    assert training_from_module(model).units == ("blocks.*",)


def test_what_training_refuses_is_its_error() -> None:
    with pytest.raises(LayoutError, match="optimizer"):
        training_from_module(tiny(), optimizer="lion")


def test_no_module_is_refused() -> None:
    with pytest.raises(BindError, match=r"training_from_module\(model=...\)"):
        training_from_module("model")  # type: ignore[arg-type]  # wrong on purpose


def test_a_model_whose_embedding_lookup_fails_names_it() -> None:
    class Broken(nn.Module):
        def get_input_embeddings(self) -> nn.Module:
            msg = "no embedding here"
            raise RuntimeError(msg)

    with pytest.raises(LayoutError, match=r"model\.get_input_embeddings\(\).*no embedding here"):
        training_from_module(Broken())
