"""A transformers checkpoint's shapes, read onto the model's runtime parameters.

transformers 5 saves some parameters other than it holds them: a mixture-of-experts
layer's experts are saved one by one (``model.layers.0.mlp.experts.0.gate_proj.weight``)
and fused when loaded into the runtime parameters (``experts.gate_up_proj``: the experts
stacked, gate and up concatenated). Its conversion mapping for the model's type says how:
key renames and merges (``WeightRenaming``, ``WeightConverter`` with ``MergeModulelist``,
``Concatenate``, ...). ``shapes_from_checkpoint`` reads the checkpoint's headers and runs
that very mapping, the installed transformers' own objects, on meta tensors of the
headers' shapes and dtypes, so every runtime parameter gets the shape its loading gives.

The package never imports transformers: its loading modules are the ones the model's
own module brought in (``transformers.modeling_utils`` imports them).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from copy import deepcopy
from types import ModuleType, SimpleNamespace
from typing import Any, Final

import torch
from torch import nn

from layout_algebra._frozen import FrozenMap
from layout_algebra._text import clip, quote, some_of
from layout_algebra.errors import LayoutError
from layout_algebra.shapes import ParamShape, shapes_from_safetensors
from layout_algebra.torch_bridge._checks import check_module
from layout_algebra.torch_bridge._walk import named_parameters
from layout_algebra.torch_bridge.structure import structure_from_module

__all__ = ["shapes_from_checkpoint"]

_WHO: Final = "shapes_from_checkpoint"
_HOW: Final = (
    "lint with the model's own shapes instead: shapes_from_module(model) (on the command "
    "line, give --shapes a shapes.json written from it)"
)
_EXPERT: Final = re.compile("[0-9]+")
_SHOWN: Final = 4


def _loading_modules(model: nn.Module) -> tuple[ModuleType, ModuleType]:
    """transformers' ``conversion_mapping`` and ``core_model_loading``, as the model's
    own transformers imported them; a model that is not a transformers one is refused."""
    utils = sys.modules.get("transformers.modeling_utils")
    mapping = sys.modules.get("transformers.conversion_mapping")
    loading = sys.modules.get("transformers.core_model_loading")
    base = getattr(utils, "PreTrainedModel", None)
    if (
        mapping is None
        or loading is None
        or not isinstance(base, type)
        or not isinstance(model, base)
    ):
        msg = (
            f"{_WHO}(model=...) takes a transformers model (a PreTrainedModel), got "
            f"{type(model).__name__}: only transformers' loading renames and fuses checkpoint "
            f"keys; read other checkpoints with shapes_from_safetensors(path), or {_HOW}"
        )
        raise LayoutError(msg)
    for module, names in (
        (mapping, ("get_model_conversion_mapping",)),
        (
            loading,
            ("WeightRenaming", "WeightConverter", "rename_source_key", "dot_natural_key"),
        ),
    ):
        lacking = [n for n in names if not hasattr(module, n)]
        if lacking:
            msg = (
                f"{_WHO}: the installed transformers has no {module.__name__}.{lacking[0]}, "
                f"so its checkpoint conversion cannot be followed; {_HOW}"
            )
            raise LayoutError(msg)
    return mapping, loading


def _split(module: str, key: str) -> tuple[str, str]:
    """``key``'s first name under ``module`` and the rest (``("", "")`` for a key elsewhere):
    ``("0", "gate_proj.weight")`` for ``experts.0.gate_proj.weight`` under ``experts``."""
    if not key.startswith(f"{module}."):
        return "", ""
    first, _, rest = key[len(module) + 1 :].partition(".")
    return first, rest


def _unmapped(model: nn.Module, missing: list[str], unexpected: list[str]) -> LayoutError:
    """The error for checkpoint keys the conversion does not bring onto the parameters:
    which keys look fused into which parameter, and how to lint instead."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    of_type = f" (model type {quote(model_type)})" if isinstance(model_type, str) else ""
    fused: list[str] = []
    for fqn in missing:
        module = fqn.rpartition(".")[0]
        keys = sorted(
            {
                f"{module}.<n>.{leaf}"
                for number, leaf in (_split(module, k) for k in unexpected)
                if _EXPERT.fullmatch(number)
            }
        )
        if keys:
            fused.append(f"{some_of(keys, show=quote)} into {quote(fqn)}")
    if fused:
        lead = (
            "the checkpoint stores experts per expert, and the installed transformers' "
            f"conversion mapping for {type(model).__name__}{of_type} does not fuse them into "
            f"the runtime parameters: {'; '.join(fused[:_SHOWN])}"
        )
    elif missing:
        lead = (
            f"the checkpoint holds no tensor for the parameters {some_of(missing, show=quote)} of "
            f"{type(model).__name__}{of_type}, as the installed transformers loads it"
        )
        if unexpected:
            lead += f", and keys the model has no parameter for: {some_of(unexpected, show=quote)}"
    else:
        lead = (
            f"the checkpoint holds keys {type(model).__name__}{of_type} has no parameter "
            "for, as the installed transformers loads it: "
            f"{some_of(unexpected, show=quote)}; is it a checkpoint of this model?"
        )
    return LayoutError(f"{_WHO}: {lead}; {_HOW}", fqn=missing[0] if missing else None)


def _not_loaded(
    model: nn.Module, missing: list[str], unexpected: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """The parameters the checkpoint gives no tensor and its keys the model has no place
    for, less those transformers lets pass (the model's ``_keys_to_ignore_on_load_*``
    rules, applied by its own ``_adjust_missing_and_unexpected_keys``)."""
    adjust = getattr(model, "_adjust_missing_and_unexpected_keys", None)
    if not (missing or unexpected) or not callable(adjust):
        return missing, list(unexpected)
    info = SimpleNamespace(missing_keys=set(missing), unexpected_keys=set(unexpected.values()))
    try:
        adjust(info)
    except Exception as e:  # the model's own rules failing: say so rather than guess
        msg = (
            f"{_WHO}: transformers cannot apply the model's rules for keys to ignore "
            f"({clip(str(e))}); {_HOW}"
        )
        raise LayoutError(msg) from e
    kept = [fqn for fqn in missing if fqn in info.missing_keys]
    return kept, [key for key, renamed in unexpected.items() if renamed in info.unexpected_keys]


def _meta(shape: ParamShape) -> torch.Tensor:
    return torch.empty(shape.shape, dtype=getattr(torch, shape.dtype), device="meta")


def _collect(
    model: nn.Module, conversion: ModuleType, loading: ModuleType, stored: Mapping[str, ParamShape]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The first loop of transformers' ``convert_and_load_state_dict_in_model``, less the
    loading: each checkpoint key renamed and routed to its step (a ``WeightConverter``
    per fused parameter) with a meta tensor of its shape; the keys the model has no place
    for, by their renamed names."""
    try:
        weight_mapping: list[Any] = list(conversion.get_model_conversion_mapping(model))
    except Exception as e:  # any failure of its lookup is the model's, reported as ours
        msg = (
            f"{_WHO}: transformers cannot give {type(model).__name__}'s conversion "
            f"mapping ({clip(str(e))}); {_HOW}"
        )
        raise LayoutError(msg) from e
    renamings = [w for w in weight_mapping if isinstance(w, loading.WeightRenaming)]
    converters = [w for w in weight_mapping if isinstance(w, loading.WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta_state = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None)
    to_load: dict[str, Any] = {}
    unexpected: dict[str, str] = {}  # checkpoint key -> its name after renaming
    for key in sorted(stored, key=loading.dot_natural_key):
        try:
            renamed, pattern = loading.rename_source_key(
                key, renamings, converters, prefix, meta_state
            )
            if renamed not in meta_state and key in meta_state:
                renamed, pattern = loading.rename_source_key(
                    key, [], [], base_model_prefix=prefix, meta_state_dict=meta_state
                )
            if renamed not in meta_state:
                unexpected[key] = renamed
                continue
            if pattern is not None:
                step = to_load.setdefault(renamed, deepcopy(by_pattern[pattern]))
            else:
                step = to_load.setdefault(renamed, loading.WeightRenaming(key, renamed))
                pattern = key
            step.add_tensor(renamed, key, pattern, _meta(stored[key]))
        except Exception as e:  # transformers' renaming failing on this key
            msg = (
                f"{_WHO}: transformers cannot rename the checkpoint key {quote(key)} "
                f"({clip(str(e))}); {_HOW}"
            )
            raise LayoutError(msg) from e
    return to_load, unexpected


def _convert(model: nn.Module, to_load: Mapping[str, Any]) -> dict[str, ParamShape]:
    """Each step run, transformers' merges on meta tensors: every target's shape and dtype."""
    loaded: dict[str, ParamShape] = {}
    for first, step in to_load.items():
        sources = sorted({s for ss in step.layer_targets.values() for s in ss})
        try:
            realized = step.convert(first, model=model, config=getattr(model, "config", None))
            for target, value in realized.items():
                tensor = value[0] if isinstance(value, list) else value
                loaded[target] = ParamShape(tuple(tensor.shape), str(tensor.dtype))
        except Exception as e:  # transformers' own ops failing on these shapes
            msg = (
                f"{_WHO}: transformers' conversion of the checkpoint keys "
                f"{some_of(sources, show=quote)} into {quote(first)} fails ({clip(str(e))}); {_HOW}"
            )
            raise LayoutError(msg, fqn=first) from e
    return loaded


def shapes_from_checkpoint(
    model: nn.Module, path: str | os.PathLike[str]
) -> Mapping[str, ParamShape]:
    """The shape and dtype of every parameter of ``model`` as transformers loads it from
    the safetensors checkpoint at ``path``, by FQN.

    ``path`` is what ``shapes_from_safetensors`` reads (a ``.safetensors`` file or a
    ``model.safetensors.index.json``); only headers are read. Each checkpoint key is
    renamed and merged by the conversion mapping the installed transformers picks for
    the model (``get_model_conversion_mapping``: by class name, then model type, per
    sub-model), exactly as ``from_pretrained`` does, the merges run on meta tensors:
    per-expert keys become the stacked ``experts.gate_up_proj`` (gate and up
    concatenated) and ``experts.down_proj``. Dtypes are the checkpoint's (what loading
    with ``dtype="auto"`` gives). A tied parameter the checkpoint leaves out
    (``lm_head.weight``) takes its source's shape; keys that land on buffers are left
    out, as ``shapes_from_module`` lists parameters only. The result equals
    ``shapes_from_module`` of the model the checkpoint was saved from: same FQNs, in the
    model's order, same shapes, dtypes and structure (read off the model).

    Raises:
        LayoutError: ``model`` is not a transformers model; checkpoint keys the
            conversion does not bring onto the model's parameters, or parameters it
            gives no tensor (per-expert keys the model fuses: naming the keys and the
            parameter they belong to), or a shape other than the model's (naming the
            FQN); each says how to lint instead.
        SerializationError: the checkpoint cannot be read (see
            ``shapes_from_safetensors``).
    """
    check_module(model, f"{_WHO}(model=...)")
    conversion, loading = _loading_modules(model)
    stored = shapes_from_safetensors(path)
    to_load, unexpected = _collect(model, conversion, loading, stored)
    loaded = _convert(model, to_load)
    params = dict(named_parameters(model))
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, Mapping):
        for target, source in tied.items():
            if not (isinstance(target, str) and isinstance(source, str)):
                continue  # not a tie transformers makes: the parameter stays missing
            if target in params and target not in loaded and source in loaded:
                loaded[target] = loaded[source]
    missing, ignored = _not_loaded(model, [fqn for fqn in params if fqn not in loaded], unexpected)
    if missing or ignored:
        raise _unmapped(model, missing, ignored)
    for fqn, param in params.items():
        if fqn not in loaded:  # left to the model by its rules: it initializes them
            loaded[fqn] = ParamShape(tuple(param.shape), str(param.dtype))
        elif tuple(param.shape) != loaded[fqn].shape:
            msg = (
                f"{_WHO}: the checkpoint gives {fqn} the shape {list(loaded[fqn].shape)}, the "
                f"model has {list(param.shape)}; from_pretrained refuses it (is it a "
                f"checkpoint of this model's config?); {_HOW}"
            )
            raise LayoutError(msg, fqn=fqn)
    found = structure_from_module(model)  # what the model's dims are made of, as its own
    return FrozenMap({fqn: loaded[fqn].with_structure(found.get(fqn, {})) for fqn in params})
