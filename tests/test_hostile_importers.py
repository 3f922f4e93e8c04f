"""Hostile input to the importers: what the user's model raises is named, and a module's
own head fields are what its heads are.

Every importer reads attributes of the user's objects (a model's ``config`` and
``tp_plan``, a module's ``is_transposed``, a torchtitan module's sharding config, the
model's own walk of its parameters). Whatever one raises while it is read is a
``LayoutError`` naming what was read, the model's own exception its ``__cause__``; an
attribute the object does not have is still read as missing. A module that carries its
own head fields (a gated delta net's ``head_k_dim`` and ``head_v_dim``) is read by them,
not by the config's head size.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from layout_algebra import LayoutError, lint
from layout_algebra.structure import Packed, Part
from layout_algebra.torch_bridge import (
    plan_from_hf,
    plan_from_parallelize,
    shapes_from_module,
    table_from_hf,
    table_from_module,
    table_from_parallelize,
    tied_pairs_from_module,
)
from layout_algebra.torch_bridge._checks import read_attr
from layout_algebra.torch_bridge.torchtitan import (
    plan_from_torchtitan,
    shard_dims_from_torchtitan,
)


class Boom(RuntimeError):
    """What the hostile attributes raise: its type identifies the cause."""


def _boom(name: str, kind: type[Exception] = Boom) -> Any:
    msg = f"{name} is broken"
    raise kind(msg)


def _raised_from(
    call: Callable[[], object], kind: type[Exception] = Boom
) -> tuple[str, LayoutError]:
    """The message of the ``LayoutError`` ``call`` raises, whose cause is a ``kind``."""
    with pytest.raises(LayoutError) as info:
        call()
    cause = info.value.__cause__
    assert isinstance(cause, kind), repr(cause)
    assert "is broken" in str(cause)
    return str(info.value), info.value


# ---------------------------------------------------------------------------------------
# shapes_from_module: the config, a module's attributes, the model's tp_plan


_PLAN: Final = {"attn.q_proj": "colwise"}


class _Configured(nn.Module):
    """A transformers-like model: an attention module and an experts module, a config and
    a ``tp_plan``, any of whose reads can be made to raise (``broken`` names it)."""

    def __init__(
        self, broken: str = "", kind: type[Exception] = Boom, plan: object = _PLAN
    ) -> None:
        super().__init__()
        self.broken, self.kind = broken, kind
        object.__setattr__(self, "plan", plan)  # kept as given: nn.Module would take a dict
        self.attn = nn.Module()
        for name, rows in (("q_proj", 32), ("k_proj", 16), ("v_proj", 16)):
            setattr(self.attn, name, nn.Linear(32, rows, bias=False))
        self.attn.o_proj = nn.Linear(32, 32, bias=False)
        self.experts = _Experts(self)

    def read(self, name: str, value: object) -> object:
        return _boom(name, self.kind) if name == self.broken else value

    @property
    def config(self) -> object:
        return self.read("config", types.SimpleNamespace(get_text_config=self._text))

    def _text(self) -> object:
        config = types.SimpleNamespace(hidden_size=32, num_attention_heads=4)
        return self.read("get_text_config", config)

    @property
    def tp_plan(self) -> object:
        return self.read("tp_plan", object.__getattribute__(self, "plan"))


class _Experts(nn.Module):
    """Four experts, ``gate_up_proj`` ``(E, H, 2I)`` (transposed)."""

    num_experts = 4

    def __init__(self, owner: _Configured) -> None:
        super().__init__()
        object.__setattr__(self, "owner", owner)  # not a submodule: no cycle
        self.gate_up_proj = nn.Parameter(torch.zeros(4, 8, 12))

    @property
    def is_transposed(self) -> object:
        owner: _Configured = object.__getattribute__(self, "owner")
        return owner.read("is_transposed", True)


def test_the_structure_of_an_unbroken_model_is_read() -> None:
    shapes = shapes_from_module(_Configured())
    assert shapes["attn.q_proj.weight"].structure == {0: Packed([Part("q", 4, 8)])}
    assert shapes["experts.gate_up_proj"].structure == {
        0: Packed([Part("experts", 4)]),
        2: Packed([Part("gate", 6), Part("up", 6)]),
    }


@pytest.mark.parametrize("kind", [Boom, AttributeError, TypeError])
@pytest.mark.parametrize(
    ("broken", "shown", "fqn"),
    [
        ("config", "model.config", None),
        ("get_text_config", "model.config.get_text_config()", None),
        ("is_transposed", "the is_transposed of module 'experts'", "experts"),
        ("tp_plan", "model.tp_plan", None),
    ],
)
def test_an_attribute_shapes_from_module_reads_that_raises_is_named(
    broken: str, shown: str, fqn: str | None, kind: type[Exception]
) -> None:
    """Even an ``AttributeError``: a property that fails is not a missing attribute (read
    as missing, ``is_transposed`` would silently be ``False``), and the cause is the
    property's own exception, not ``nn.Module``'s "has no attribute"."""
    message, error = _raised_from(lambda: shapes_from_module(_Configured(broken, kind)), kind)
    assert message.startswith(f"reading {shown} raised {kind.__name__}('{broken} is broken')")
    assert message.endswith(f"the structure of the model's weights cannot be read: fix {shown}")
    assert error.fqn == fqn


class _Plan(dict[str, str]):
    """A ``tp_plan`` whose items cannot be read."""

    def items(self) -> Any:
        return _boom("items")


def test_a_tp_plan_that_raises_or_holds_no_style_names_is_named() -> None:
    message, _ = _raised_from(lambda: shapes_from_module(_Configured(plan=_Plan(a="colwise"))))
    assert message.startswith("model.tp_plan could not be read as a mapping such as {")
    for plan, shown in (
        ({"attn.q_proj": ["colwise"]}, "maps 'attn.q_proj' to ['colwise']"),  # unhashable
        ({("attn", "q_proj"): "colwise"}, "maps ('attn', 'q_proj') to 'colwise'"),
        (["colwise"], "got ['colwise']"),
    ):
        with pytest.raises(LayoutError, match=r"^model\.tp_plan ") as info:
            shapes_from_module(_Configured(plan=plan))
        assert shown in str(info.value)
        assert str(info.value).endswith("fix the model's tp_plan")
    assert shapes_from_module(_Configured(plan=None))["attn.q_proj.weight"].structure


class _Slotted:
    __slots__ = ("set_", "unset")

    def __init__(self) -> None:
        self.set_ = 1


def test_a_missing_attribute_is_still_missing() -> None:
    """Only an attribute the object has can fail: a missing one, an unset slot, and
    ``nn.Module``'s own "has no attribute" for a name it lacks give the default."""
    for obj, name in (
        (types.SimpleNamespace(), "head_dim"),
        (_Slotted(), "unset"),
        (nn.Linear(2, 2), "head_dim"),
        (None, "get_text_config"),
    ):
        assert read_attr(obj, name, name, remedy="", default=7) == 7
    assert read_attr(_Slotted(), "set_", "set_", remedy="") == 1


# ---------------------------------------------------------------------------------------
# the model's own walk: named_parameters, named_children


class _BrokenWalk(nn.Linear):
    """A Linear whose ``named_parameters`` (or ``named_children``) raises."""

    def __init__(self, broken: str) -> None:
        super().__init__(4, 4)
        self.broken = broken

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        if self.broken == "named_parameters":
            _boom("named_parameters")
        return super().named_parameters(*args, **kwargs)

    def named_children(self) -> Iterator[tuple[str, nn.Module]]:
        if self.broken == "named_children":
            _boom("named_children")
        return super().named_children()


def test_table_from_parallelize_names_a_walk_that_raises() -> None:
    # the model's own named_parameters
    message, _ = _raised_from(
        lambda: table_from_parallelize(
            _BrokenWalk("named_parameters"), ColwiseParallel(), mesh_axes=["tp"]
        )
    )
    assert message.startswith(
        "reading named_parameters(remove_duplicate=False) of the model raised Boom("
    )
    assert "fix the class's named_parameters" in message
    # a module's own parameters, as parallelize_module reads them
    model = nn.Sequential(nn.Linear(4, 4), _BrokenWalk("named_parameters"))
    message, error = _raised_from(
        lambda: table_from_parallelize(model, {"1": ColwiseParallel()}, mesh_axes=["tp"])
    )
    assert message.startswith("reading named_parameters(remove_duplicate=False) of module '1'")
    assert error.fqn == "1"
    # a module's children, as a plan key is followed down
    model = nn.Sequential(_BrokenWalk("named_children"))
    message, error = _raised_from(
        lambda: table_from_parallelize(model, {"0.x": ColwiseParallel()}, mesh_axes=["tp"])
    )
    assert message.startswith("reading named_children() of module '0' raised Boom(")
    assert error.fqn == "0"


class _HfBrokenWalk(_BrokenWalk):
    tp_plan: Final = {"": "colwise"}


@pytest.mark.parametrize(
    "read",
    [
        shapes_from_module,
        tied_pairs_from_module,
        table_from_module,
        lambda m: plan_from_parallelize(m, ColwiseParallel(), mesh_axes=["tp"]),
        lambda m: plan_from_hf(m, ep_axis=None, mesh_axes=["tp"]),
        lambda m: table_from_hf(m, mesh_axes=["tp"]),
    ],
    ids=[
        "shapes_from_module",
        "tied_pairs_from_module",
        "table_from_module",
        "plan_from_parallelize",
        "plan_from_hf",
        "table_from_hf",
    ],
)
def test_every_importer_names_a_walk_that_raises(read: Callable[[nn.Module], object]) -> None:
    message, _ = _raised_from(lambda: read(_HfBrokenWalk("named_parameters")))
    assert message.startswith("reading named_parameters(remove_duplicate=False) of the model")


# ---------------------------------------------------------------------------------------
# torchtitan


class _Dim:
    """A spmd type whose ``dim`` raises."""

    @property
    def dim(self) -> int:
        return int(_boom("dim"))


def _titan(layout: object = None, *, broken: str = "") -> nn.Module:
    """A Linear carrying a torchtitan-like sharding config (``broken``: what raises)."""

    class Titan(nn.Linear):
        @property
        def _sharding_config(self) -> object:
            if broken == "_sharding_config":
                _boom("_sharding_config")
            return types.SimpleNamespace(state_shardings={"weight": layout, "bias": layout})

    return Titan(4, 4)


class _BrokenConfig:
    @property
    def state_shardings(self) -> object:
        return _boom("state_shardings")


def test_plan_from_torchtitan_names_what_raises() -> None:
    message, error = _raised_from(
        lambda: plan_from_torchtitan(_titan(broken="_sharding_config"), mesh_axes=["tp"])
    )
    assert message.startswith(
        "plan_from_torchtitan: reading model._sharding_config raised Boom('_sharding_config"
    )
    assert message.endswith("or build the model from torchtitan's own config")
    layout = types.SimpleNamespace(axis_types={"tp": _Dim()}, partition_spec=None)
    message, error = _raised_from(lambda: plan_from_torchtitan(_titan(layout), mesh_axes=["tp"]))
    assert message.startswith(
        "plan_from_torchtitan: reading the dim of weight's spmd type on 'tp' raised Boom("
    )
    assert error.fqn == "weight"
    model = nn.Sequential(nn.Linear(4, 4))
    object.__setattr__(model[0], "_sharding_config", _BrokenConfig())
    message, error = _raised_from(lambda: plan_from_torchtitan(model, mesh_axes=["tp"]))
    assert message.startswith(
        "plan_from_torchtitan: reading the state_shardings of module '0''s sharding config"
    )
    assert error.fqn == "0"


class _Block(nn.Module):
    """A torchtitan-like MoE block: ``moe.routed_experts.inner_experts.num_experts``."""

    def __init__(self, experts: object) -> None:
        super().__init__()
        self.moe_enabled = True
        self.moe = nn.Module()
        self.moe.routed_experts = nn.Module()
        self.moe.routed_experts.inner_experts = inner = _Inner()
        object.__setattr__(inner, "count", experts)
        inner.w1 = nn.Parameter(torch.zeros(4, 2, 2))


class _Inner(nn.Module):
    @property
    def num_experts(self) -> object:
        count: object = object.__getattribute__(self, "count")
        return _boom("num_experts") if count == "boom" else count


_DIMS: Final = types.SimpleNamespace(dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1)


def test_shard_dims_from_torchtitan_refuses_no_experts_and_names_what_raises() -> None:
    blocks = nn.ModuleDict({"layers": nn.ModuleList([_Block(4)])})
    assert shard_dims_from_torchtitan(blocks, parallel_dims=_DIMS) == {
        "layers.0.moe.routed_experts.inner_experts.w1": 1
    }
    for count in (0, -2):
        blocks = nn.ModuleDict({"layers": nn.ModuleList([_Block(count)])})
        with pytest.raises(LayoutError) as info:
            shard_dims_from_torchtitan(blocks, parallel_dims=_DIMS)
        assert str(info.value) == (
            f"shard_dims_from_torchtitan: block 'layers.0''s experts have "
            f"num_experts={count}, but an MoE block holds at least one expert; fix the "
            "block's MoE config (num_experts)"
        )
        assert info.value.fqn == "layers.0"
    blocks = nn.ModuleDict({"layers": nn.ModuleList([_Block("boom")])})
    message, error = _raised_from(lambda: shard_dims_from_torchtitan(blocks, parallel_dims=_DIMS))
    assert message.startswith(
        "shard_dims_from_torchtitan: reading the num_experts of block 'layers.0''s experts"
    )
    assert error.fqn == "layers.0"

    class Dims:
        dp_replicate = dp_shard = cp = ep = 1

        @property
        def tp(self) -> int:
            return int(_boom("tp"))

    message, _ = _raised_from(lambda: shard_dims_from_torchtitan(blocks, parallel_dims=Dims()))
    assert message.startswith("shard_dims_from_torchtitan: reading parallel_dims.tp raised Boom(")
    assert message.endswith(
        "pass torchtitan's ParallelDims for the run "
        "(ParallelDims.from_config(job_config.parallelism, world_size))"
    )


# ---------------------------------------------------------------------------------------
# a module's own head fields win over the config's


def _olmo_hybrid() -> nn.Module:
    """A small OLMo-Hybrid on meta whose gated delta net has 4 key heads of 12 and 4 value
    heads of 24, where the config's head size is 96 / 6 = 16."""
    import transformers  # noqa: PLC0415 - only these tests need it
    from transformers import initialization  # noqa: PLC0415

    config = transformers.OlmoHybridConfig(
        vocab_size=48,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=96,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        linear_num_key_heads=4,
        linear_key_head_dim=12,
        linear_num_value_heads=4,
        linear_value_head_dim=24,
        layer_types=["linear_attention", "full_attention"],
    )
    with initialization.no_tie_weights(), torch.device("meta"):
        model: nn.Module = transformers.OlmoHybridForCausalLM(config)
    return model


_GDN: Final = "model.layers.0.linear_attn"


def test_a_gated_delta_net_is_read_by_its_own_head_fields() -> None:
    model = _olmo_hybrid()
    net: Any = model.get_submodule(_GDN)
    k, v = (net.num_k_heads, net.head_k_dim), (net.num_v_heads, net.head_v_dim)
    assert (k, v) == ((4, 12), (4, 24))  # what its forward views q, k and v by
    shapes = shapes_from_module(model)
    assert {
        fqn.removeprefix(f"{_GDN}."): dict(s.structure)
        for fqn, s in shapes.items()
        if fqn.startswith(_GDN) and s.structure
    } == {
        "q_proj.weight": {0: Packed([Part("q", *k)])},
        "k_proj.weight": {0: Packed([Part("k", *k)])},
        "v_proj.weight": {0: Packed([Part("v", *v)])},
        "o_proj.weight": {1: Packed([Part("o", *v)])},
    }


def test_lint_flags_the_tp_size_that_cuts_a_gated_delta_nets_heads() -> None:
    """tp=4 gives each rank one whole head of q, k and v (12, 12 and 24 rows); tp=3 gives
    16 and 32 rows, cutting them. Read with the config's 16, it was the other way round."""
    model = _olmo_hybrid()
    plan: dict[str, Any] = {f"{_GDN}.{p}_proj": ColwiseParallel() for p in "qkv"}
    plan[f"{_GDN}.o_proj"] = RowwiseParallel()
    table = table_from_parallelize(model, plan, mesh_axes=["tp"])
    shapes = shapes_from_module(model)
    found = {
        tp: [
            (p.fqn, p.kind) for p in lint(table, shapes, mesh_sizes={"dense": {"tp": tp}}).problems
        ]
        for tp in (3, 4)
    }
    assert found == {
        3: [(f"{_GDN}.{p}_proj.weight", "cuts-unit") for p in "qkvo"],
        4: [],
    }


def test_value_heads_of_their_own_size_are_read_by_it() -> None:
    """MiMo-V2-Flash's attention: q and k heads of ``head_dim`` 24, v and o heads of
    ``v_head_dim`` 16; before, v and o were read by 24, which divides neither."""
    import transformers  # noqa: PLC0415
    from transformers import initialization  # noqa: PLC0415

    config = transformers.MiMoV2FlashConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        layer_types=["full_attention"],
        mlp_layer_types=["dense"],
    )
    with initialization.no_tie_weights(), torch.device("meta"):
        model = transformers.MiMoV2FlashForCausalLM(config)
    shapes = shapes_from_module(model)
    attn = "model.layers.0.self_attn"
    got = {p: shapes[f"{attn}.{p}_proj.weight"].structure for p in "qkvo"}
    assert got == {
        "q": {0: Packed([Part("q", 4, 24)])},
        "k": {0: Packed([Part("k", 2, 24)])},
        "v": {0: Packed([Part("v", 2, 16)])},
        "o": {1: Packed([Part("o", 4, 16)])},
    }
