"""torchtitan's own models and parallelize functions, run small on the fake process group.

torchtitan is not a dependency of the package: the tests that use this module skip where it
is absent (``pytest.importorskip``), and mypy, which does not see it, reads it through the
few typed helpers below (``object`` results, checked where they are used).

Each :class:`Run` builds one of torchtitan's debug models (two layers, on the meta device),
sets its sharding configs as its ``update_from_config`` does for the run, and applies
torchtitan's own parallelism to it: the model's parallelize function (tensor and expert
parallelism, then FSDP) under the ``partial_dtensor`` and ``full_dtensor`` backends, and
``Module.parallelize`` (the tensor and expert parallelism that function starts with) under
``spmd_types``, whose FSDP needs DTensor parameters from a newer torch than this one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Literal, TypeAlias

import attrs
import pytest
import torch
from torch import nn
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

from layout_algebra import Replicate, Shard, SourceLayout

Backend: TypeAlias = Literal["spmd_types", "full_dtensor", "partial_dtensor"]
"""torchtitan 0.3's three ways of holding a sharded parameter."""

BACKENDS: tuple[Backend, ...] = ("spmd_types", "full_dtensor", "partial_dtensor")
WORLD = 8
"""The fake world's size (``conftest.FAKE_WORLD_SIZE``)."""


def module(name: str) -> ModuleType:
    """A torchtitan (or spmd_types) module, imported by name."""
    return importlib.import_module(name)


def function(module_name: str, name: str) -> Callable[..., object]:
    """A callable of a torchtitan module; what it returns is checked by the caller."""
    found: object = getattr(module(module_name), name)
    assert callable(found), (module_name, name)
    return found


def get(obj: object, path: str) -> object:
    """An attribute, dotted, of a torchtitan object (a config, a model)."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@attrs.frozen
class Model:
    """Where torchtitan keeps one model family: its flavours, sharding setter, parallelize."""

    package: str
    configs: str
    flavor: str
    setter: str
    parallelize: str
    takes_ep: bool = True
    builder_args: tuple[tuple[str, str], ...] = (("attn_backend", "flex"),)


MODELS: Mapping[str, Model] = {
    "llama3": Model(
        "llama3",
        "llama3_configs",
        "debugmodel",
        "set_llama3_sharding_config",
        "parallelize_llama",
        takes_ep=False,
    ),
    "qwen3": Model(
        "qwen3", "qwen3_configs", "debugmodel", "set_qwen3_sharding_config", "parallelize_qwen3"
    ),
    "qwen3_moe": Model(
        "qwen3",
        "qwen3_configs",
        "debugmodel_moe",
        "set_qwen3_sharding_config",
        "parallelize_qwen3",
    ),
    "deepseek_v3": Model(
        "deepseek_v3",
        "deepseekv3_configs",
        "debugmodel",
        "set_deepseek_v3_sharding_config",
        "parallelize_deepseekv3",
        builder_args=(("attn_backend", "flex"), ("moe_comm_backend", "standard")),
    ),
    "gpt_oss": Model(
        "gpt_oss",
        "gptoss_configs",
        "debugmodel",
        "set_gpt_oss_sharding_config",
        "parallelize_gptoss",
        builder_args=(("attn_backend", "flex"), ("moe_comm_backend", "standard")),
    ),
}


@attrs.frozen
class Run:
    """One model under one parallelism: its degrees, backend and options."""

    model: str
    backend: Backend
    tp: int
    ep: int = 1
    experts: int | None = None
    """Rebuild the MoE blocks with this many experts (fewer than the ranks: FSDP dim 1)."""
    checkpointing: bool = False
    """Wrap each block with torchtitan's full activation checkpointing."""
    replicate: int = 1
    """HSDP's replicate degree (``dp_replicate``)."""

    @property
    def dp_shard(self) -> int:
        return WORLD // (self.replicate * self.tp)

    @property
    def fsdp(self) -> dict[str, str | tuple[str, str]]:
        """FSDP's axis by mesh role, ``(replicate, shard)`` for HSDP."""
        shard = {"dense": self.fsdp_axis, "expert": "efsdp"}
        if self.replicate == 1:
            return dict(shard)
        return {role: ("dp_replicate", axis) for role, axis in shard.items()}

    @property
    def fsdp_axis(self) -> str:
        """The name of FSDP's dense axis on the DTensors torchtitan makes."""
        return "fsdp" if self.backend == "partial_dtensor" else "dp_shard"

    @property
    def dense(self) -> dict[str, int]:
        """The dense mesh, as the parameters' DTensors name it after FSDP."""
        return {"dp_replicate": self.replicate, self.fsdp_axis: self.dp_shard, "tp": self.tp}

    @property
    def expert(self) -> dict[str, int]:
        """The expert mesh (efsdp borrows the ranks of FSDP and tp that ep does not take)."""
        efsdp = WORLD // (self.replicate * self.ep)
        return {"dp_replicate": self.replicate, "efsdp": efsdp, "ep": self.ep}

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        """The run's axes: tp and ep only where they have more than one rank."""
        axes = ["dp_replicate", self.fsdp_axis] + (["tp"] if self.tp > 1 else [])
        return (*axes, "efsdp", "ep") if self.ep > 1 else tuple(axes)

    def __str__(self) -> str:
        extra = "".join(
            [
                f" experts={self.experts}" if self.experts else "",
                " ac" if self.checkpointing else "",
            ]
        )
        return f"{self.model} {self.backend} tp={self.tp} ep={self.ep}{extra}"


def parallelism(run: Run) -> object:
    return function("torchtitan.config", "ParallelismConfig")(
        tensor_parallel_degree=run.tp, expert_parallel_degree=run.ep, spmd_backend=run.backend
    )


def config(run: Run, *, sharded: bool = True) -> object:
    """The model's debug config, two layers, its sharding set as ``update_from_config`` does."""
    spec = MODELS[run.model]
    package = f"torchtitan.models.{spec.package}"
    flavors = get(module(package), spec.configs)
    assert isinstance(flavors, Mapping)
    make = flavors[spec.flavor]
    cfg: object = make(**dict(spec.builder_args))
    layers = get(cfg, "layers")
    assert isinstance(layers, list)
    if run.experts is not None:
        layers = [_with_experts(layer, run.experts) for layer in layers]
    object.__setattr__(cfg, "layers", layers[:2])  # slotted dataclass: plain setattr
    if sharded:
        par = parallelism(run)
        flags = {"enable_sp": get(par, "enable_sequence_parallel")}
        if spec.takes_ep:
            flags["enable_ep"] = run.ep > 1
        function(f"{package}.sharding", spec.setter)(cfg, **flags)
    return cfg


def _with_experts(layer: object, count: int) -> object:
    """``layer`` with its MoE (if any) rebuilt by torchtitan's builders with ``count`` experts."""
    moe = get(layer, "moe")
    if moe is None:
        return layer
    helpers = "torchtitan.models.common.config_utils"
    gate = get(moe, "router.gate")
    inner = get(moe, "routed_experts.inner_experts")
    top_k = min(2, count)
    router = function(helpers, "make_router_config")(
        dim=get(gate, "in_features"),
        num_experts=count,
        gate_param_init=get(gate, "param_init"),
        top_k=top_k,
        score_func=get(moe, "router.score_func"),
    )
    routed = function(helpers, "make_routed_experts_config")(
        dim=get(inner, "dim"),
        hidden_dim=get(inner, "hidden_dim"),
        num_experts=count,
        top_k=top_k,
        param_init=get(inner, "param_init"),
        comm_backend="standard",
    )
    new = function(helpers, "make_moe_config")(
        num_experts=count,
        router=router,
        routed_experts=routed,
        shared_experts=get(moe, "shared_experts"),
    )
    object.__setattr__(layer, "moe", new)
    return layer


def build(run: Run, *, sharded: bool = True) -> nn.Module:
    """The model of ``run`` on the meta device, not yet parallelized."""
    cfg = config(run, sharded=sharded)
    with torch.device("meta"):
        built = function_of(cfg, "build")()
    assert isinstance(built, nn.Module)
    return built


@attrs.define
class Titan:
    """torchtitan set up for one backend on the fake world (CPU meshes)."""

    monkeypatch: pytest.MonkeyPatch

    def backend(self, backend: Backend) -> None:
        # torchtitan keeps its backend in a module global, and builds meshes on its own
        # device type (cuda on a machine without a GPU); its own CPU tests patch it so.
        utils = module("torchtitan.distributed.utils")
        self.monkeypatch.setattr(utils, "_spmd_backend", backend)
        self.monkeypatch.setattr(
            module("torchtitan.distributed.parallel_dims"), "device_type", "cpu"
        )

    def parallel_dims(self, run: Run) -> object:
        self.backend(run.backend)
        # DTensor caches the specs its ops give, and an equal mesh of an earlier run is
        # equal: its cached specs would hand this run's parameters that run's mesh object,
        # which FSDP under full_dtensor refuses (one torchtitan job builds one mesh).
        _clear_sharding_prop_cache()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        dims = function("torchtitan.distributed", "ParallelDims")(
            dp_replicate=run.replicate,
            dp_shard=-1,
            cp=1,
            tp=run.tp,
            pp=1,
            ep=run.ep,
            world_size=WORLD,
            spmd_backend=run.backend,
        )
        function_of(dims, "build_mesh")()
        return dims

    def parallelize(self, run: Run, model: nn.Module, dims: object) -> nn.Module:
        """``model`` after torchtitan's own parallelism for ``run`` (see the module doc)."""
        if run.backend == "spmd_types":
            function_of(model, "parallelize")(dims)
            return model
        spec = MODELS[run.model]
        checkpointing = None
        if run.checkpointing:
            full = get(module("torchtitan.distributed.activation_checkpoint"), "FullAC")
            checkpointing = function_of(full, "Config")()
        out = function(f"torchtitan.models.{spec.package}", spec.parallelize)(
            model,
            parallel_dims=dims,
            training=function("torchtitan.config", "TrainingConfig")(),
            parallelism=parallelism(run),
            compile_config=function("torchtitan.config", "CompileConfig")(),
            ac_config=checkpointing,
            dump_folder="",
        )
        assert out is model
        return model


def function_of(obj: object, name: str) -> Callable[..., object]:
    found: object = getattr(obj, name)
    assert callable(found), name
    return found


# ---------------------------------------------------------------------------------------
# spmd_types' records on a plain parameter


def spmd_groups(dims: object) -> dict[str, object]:
    """The ``spmd_types`` mesh axes (rank groups) of the run's ``tp`` and ``ep``, by name.

    A spmd_types mesh axis is its ranks, not its name: with tp and ep of one size, the two
    are the same group of ranks, and so the same axis.
    """
    mesh_axis = get(module("spmd_types"), "MeshAxis.of")
    assert callable(mesh_axis)
    out: dict[str, object] = {}
    for getter in ("spmd_dense_mesh", "spmd_sparse_mesh"):
        mesh = function_of(dims, getter)()
        names = get(mesh, "mesh_dim_names") if mesh is not None else ()
        assert isinstance(names, tuple)
        for name in names:
            if name in ("tp", "ep") and function_of(mesh, "size")(names.index(name)) != 1:
                out[name] = mesh_axis(function_of(mesh, "get_group")(name))
    return out


def spmd_record(param: torch.Tensor, groups: Mapping[str, object]) -> dict[object, str]:
    """What spmd_types' records on ``param`` say of the ``tp`` and ``ep`` rank groups: the
    placement in the package's spelling, ``S(d)`` where the group varies (``V``) and the
    ``_partition_spec`` names dim ``d``, ``R`` where it does not (``R`` or ``I``)."""
    local: object = getattr(param, "_local_type", None)
    spec: object = getattr(param, "_partition_spec", None) or ()
    assert isinstance(local, Mapping), "no spmd_types record"
    assert isinstance(spec, tuple)
    wanted = set(groups.values())
    record: dict[object, str] = {}
    for axis, kind in local.items():
        if axis not in wanted:
            continue  # a data-parallel group: FSDP's
        if get(kind, "name") == "V":
            dims = [d for d, e in enumerate(spec) if axis in (e if isinstance(e, tuple) else (e,))]
            assert len(dims) == 1, (axis, spec)
            record[axis] = str(Shard(dims[0]))
        else:
            record[axis] = str(Replicate())
    return record


def layout_record(layout: SourceLayout, groups: Mapping[str, object]) -> dict[object, str]:
    """The record ``spmd_record`` should read for a parameter laid out as ``layout``."""
    return {groups[a.name]: str(p) for a, p in zip(layout.axes, layout.placements, strict=True)}
