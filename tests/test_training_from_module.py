"""``torch_bridge.training_from_module``: frozen parameters and units read off a model, the
units compared with what transformers' and torchtitan's own FSDP2 code wraps.

Each library's wrapping runs for real (torch's ``fully_shard`` on the fake 8-rank world,
models on the meta device) and is read back from FSDP2's own parameter groups: which
parameters each ``fully_shard`` call manages, and whether it reshards after forward. A
``Training`` puts each parameter in the innermost unit naming it, the rest in the root.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from layout_algebra import FSDPUnit, Training
from layout_algebra._units import compact, repeated_blocks
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.torch_bridge import tied_pairs_from_module, training_from_module
from layout_algebra.torch_bridge._walk import state_dict_fqn
from tests.torch_oracle import MeshFactory

if TYPE_CHECKING:
    from tests.torchtitan_runs import Titan

pytestmark = pytest.mark.usefixtures("fake_world")

Units: TypeAlias = set[tuple[frozenset[str], bool | int | str]]
"""Each ``fully_shard`` call's parameters and its ``reshard_after_forward`` (``"root"``)."""


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


def _matches(pattern: list[str], segments: list[str]) -> bool:
    return len(pattern) == len(segments) and all(
        w in ("*", s) for w, s in zip(pattern, segments, strict=True)
    )


def units_of(training: Training, fqns: Iterable[str]) -> Units:
    """The parameters of each ``fully_shard`` call ``training`` names: one per module a
    pattern matches, one per ``FSDPUnit`` of several modules; the root's the rest."""
    calls: list[tuple[list[str], int, bool | int, bool]] = []
    for i, unit in enumerate(training.units):
        if isinstance(unit, str):
            calls.append((unit.split("."), i, training.reshard_after_forward, False))
        else:
            grouped = len(unit.modules) > 1
            for module in unit.modules:
                calls.append((module.split("."), i, unit.reshard_after_forward, grouped))
    by_call: dict[tuple[object, bool | int | str], set[str]] = {}
    for fqn in fqns:
        segments = fqn.split(".")
        best: tuple[int, object, bool | int | str] = (0, "", "root")
        for segs, i, reshard, grouped in calls:
            k = len(segs)
            if best[0] < k < len(segments) and _matches(segs, segments[:k]):
                best = (k, i if grouped else ".".join(segments[:k]), reshard)
        by_call.setdefault(best[1:], set()).add(fqn)
    return {(frozenset(v), reshard) for (_, reshard), v in by_call.items()}


def wrapped_units(model: nn.Module) -> Units:
    """The parameters of each ``fully_shard`` group torch made of ``model``, and whether
    the group reshards after forward (``"root"`` for the root's)."""
    names = {id(m): fqn for fqn, m in reversed(list(model.named_modules(remove_duplicate=False)))}
    root = model._get_fsdp_state()._fsdp_param_group if isinstance(model, FSDPModule) else None
    groups: dict[int, Any] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                groups[id(group)] = group
    out: Units = set()
    for group in groups.values():
        fqns = set()
        for fp in group.fsdp_params:
            info = fp._module_info
            owners = [(info.module, info.param_name)]
            owners += list(zip(info.shared_modules, info.shared_param_names, strict=True))
            for owner, name in owners:
                fqns.add(state_dict_fqn(f"{names[id(owner)]}.{name}".lstrip(".")))
        reshard = "root" if group is root else group.post_forward_mesh_info is not None
        out.add((frozenset(fqns), reshard))
    return out


def _params(model: nn.Module) -> list[str]:
    return [state_dict_fqn(n) for n, _ in model.named_parameters(remove_duplicate=False)]


def transformers_wraps(model: nn.Module, world_mesh: MeshFactory) -> Units:
    """What transformers' own FSDP2 (``apply_fully_sharded_data_parallelism``, its plan
    resolved as ``from_pretrained(distributed_config=...)`` resolves it) makes of ``model``.

    With tied weights transformers wraps the embedding with the norm and leaves the head,
    whose weight is the same parameter, to the root; loading weights then ties the head
    to the embedding's sharded parameter again (``_finalize_model_loading``), so the
    head's alias is read as the embedding's call's.
    """
    distributed = pytest.importorskip("transformers.distributed")
    from transformers.distributed.fsdp import (  # noqa: PLC0415 - only with transformers
        apply_fully_sharded_data_parallelism,
    )

    class Meshes:
        def get_mesh(self, names: object) -> object:
            return world_mesh({"fsdp": 8})["fsdp"]

    aliases = {b: a for a, b in tied_pairs_from_module(model)}
    resolve: Any = model._resolve_parallel_plans
    _, ep_plan, fsdp_plan = resolve(distributed.DistributedConfig(fsdp_size=8))
    meshes: Any = Meshes()  # the one method transformers' FSDP asks of its mesh manager
    apply_fully_sharded_data_parallelism(model, meshes, fsdp_plan, ep_plan)
    wrapped = wrapped_units(model)
    for alias, first in aliases.items():
        held = [u for u in wrapped if alias in u[0] and u[1] == "root"]
        owner = [u for u in wrapped if first in u[0] and u[1] != "root"]
        if not owner:  # the embedding is the root's too: nothing to fold
            continue
        for (fqns, reshard), (their, rule) in zip(held, owner, strict=True):
            wrapped -= {(fqns, reshard), (their, rule)}
            wrapped |= {(their | {alias}, rule)}
            if fqns - {alias}:
                wrapped.add((fqns - {alias}, reshard))
    return wrapped


KEPT = {"reshard_after_forward": False}


@pytest.mark.parametrize(
    ("kind", "tied", "units"),
    [
        (
            "llama",
            False,
            ("model.embed_tokens", "model.layers.*", FSDPUnit(["model.norm", "lm_head"], **KEPT)),
        ),
        (
            "qwen3_moe",
            False,
            ("model.embed_tokens", "model.layers.*", FSDPUnit(["model.norm", "lm_head"], **KEPT)),
        ),
        (
            "llama",
            True,
            ("model.layers.*", FSDPUnit(["model.embed_tokens", "model.norm", "lm_head"], **KEPT)),
        ),
    ],
)
def test_transformers_units_are_what_its_fsdp_wraps(
    kind: str, tied: bool, units: tuple[str | FSDPUnit, ...], world_mesh: MeshFactory
) -> None:
    model = tiny(kind, tied=tied)
    fqns = _params(model)
    training = training_from_module(model, param_dtype="bfloat16")
    assert training.units == units
    assert training.param_dtype == "bfloat16"
    assert units_of(training, fqns) == transformers_wraps(model, world_mesh)


def small(kind: str) -> nn.Module:
    """transformers' model of ``kind`` from its default config, two layers, on meta."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: PLC0415
    from transformers.models.auto.modeling_auto import (  # noqa: PLC0415
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    config = CONFIG_MAPPING[kind]()
    for field in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(config, field):
            setattr(config, field, 2)
    with torch.device("meta"):
        model: nn.Module = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[kind])(config)
    return model


@pytest.mark.parametrize(
    ("kind", "units"),
    [
        ("gpt2", ()),  # no rule of its plan names a module: transformers shards the root alone
        ("gpt_neox", ("gpt_neox.layers.*",)),
        ("opt", ("model.decoder.layers.*",)),
        # the tied embedding kept alone (its norm is no "norm"), the head's alias with it
        ("lfm2", (FSDPUnit(["model.embed_tokens", "lm_head"], **KEPT), "model.layers.*")),
    ],
)
def test_a_models_own_fsdp_plan_is_what_its_fsdp_wraps(
    kind: str, units: tuple[str | FSDPUnit, ...], world_mesh: MeshFactory
) -> None:
    """A transformers model is wrapped as transformers' own FSDP2 wraps it, its plan
    resolved by transformers, not as a decoder of the usual names would be."""
    model = small(kind)
    training = training_from_module(model)
    assert training.units == units
    assert units_of(training, _params(model)) == transformers_wraps(model, world_mesh)


def test_a_transformers_model_without_an_fsdp_plan_is_wrapped_as_a_decoder() -> None:
    """transformers has no FSDP2 for a model without a plan: the usual decoder's units."""
    model = tiny()

    def no_plan(config: object) -> object:
        msg = "`fsdp_size=2` was requested, but the model has no `fsdp_plan`"
        raise ValueError(msg)

    model._resolve_parallel_plans = no_plan  # type: ignore[assignment]  # on purpose
    units = ("model.embed_tokens", "model.layers.*", FSDPUnit(["model.norm", "lm_head"], **KEPT))
    assert training_from_module(model).units == units


@pytest.mark.parametrize(
    ("gives", "said"),
    [
        (RuntimeError("broken"), "reading model._resolve_parallel_plans(...) raised"),
        ("plans", "gave 'plans', not transformers' tp, ep and FSDP plans"),
        (({}, {}), "not transformers' tp, ep and FSDP plans"),
        (({}, {}, ["model.layers.0"]), "not transformers' tp, ep and FSDP plans"),
        (({}, {}, {3: "free_full_weight"}), "the FSDP plan a dict of module names"),
    ],
)
def test_a_plan_reader_that_fails_or_gives_no_plans_is_named(gives: object, said: str) -> None:
    """What transformers' plan reader raises or gives that is no plan is a LayoutError
    naming the call and saying what to do, never a silent guess."""
    model = tiny()

    def resolve(config: object) -> object:
        if isinstance(gives, Exception):
            raise gives
        return gives

    model._resolve_parallel_plans = resolve  # type: ignore[assignment]  # on purpose
    with pytest.raises(LayoutError, match=r"training_from_module") as info:
        training_from_module(model)
    assert said in str(info.value)
    assert "give units=[...] yourself" in str(info.value)


def test_transformers_blocks_are_its_no_split_modules() -> None:
    model = tiny("qwen3_moe")
    blocks = {type(m).__name__ for m in model.get_submodule("model.layers").children()}
    listed: Any = model._no_split_modules
    assert blocks <= set(listed)
    # what the command line infers from the FQNs alone
    assert repeated_blocks(_params(model)) == ("model.layers.*",)


TITAN_UNITS: dict[str, tuple[str | FSDPUnit, ...]] = {
    "llama3": ("tok_embeddings", "layers.*", FSDPUnit(["norm", "lm_head"], **KEPT)),
    "qwen3": ("layers.*", FSDPUnit(["tok_embeddings", "norm", "lm_head"], **KEPT)),  # tied
    "qwen3_moe": ("tok_embeddings", "layers.*", FSDPUnit(["norm", "lm_head"], **KEPT)),
}
"""torchtitan's debug models (dense, tied, with experts) and their units."""


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", TITAN_UNITS)
def test_torchtitan_units_are_what_its_fsdp_wraps(name: str, titan: Titan) -> None:
    from tests.torchtitan_runs import Run, build  # noqa: PLC0415 - torchtitan only here

    run = Run(name, "partial_dtensor", tp=1)
    model = build(run)
    fqns = _params(model)
    training = training_from_module(model)
    assert training.units == TITAN_UNITS[name]
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
    assert training.units[:2] == ("model.embed_tokens", "model.layers.*")


def test_frozen_given_is_kept() -> None:
    model, _ = frozen_llama()
    training = training_from_module(model, frozen=["model.embed_tokens.weight"])
    assert training.frozen == ("model.embed_tokens.weight",)


def test_nothing_frozen_passes_no_frozen() -> None:
    # nothing read from requires_grad reaches Training: the package's own default holds
    model = tiny()
    units = ("model.embed_tokens", "model.layers.*", FSDPUnit(["model.norm", "lm_head"], **KEPT))
    assert training_from_module(model) == Training(units=units)


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
