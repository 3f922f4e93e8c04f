"""The model a ``save_pretrained`` folder's ``config.json`` describes, built on the meta
device, for what its checkpoint's headers cannot say (which dims are heads, KV heads,
fused blocks or experts) and for the activations its forward saves, traced on fake
tensors.

This is the one place the package imports transformers itself, and only when asked: the
config is read from the folder alone (no hub, no network), code the folder names
(``auto_map``) is never trusted, and no weight is read or allocated.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import Any

import torch
from torch import nn

from layout_algebra._text import clip
from layout_algebra.activations import Activations
from layout_algebra.errors import LayoutError
from layout_algebra.shapes import as_dtype
from layout_algebra.torch_bridge.activations import activations_from_module

__all__ = ["config_dtype", "model_from_config", "traced_activations"]


def _transformers() -> ModuleType:
    """transformers, imported here only.

    Raises:
        ImportError: it is not installed (``.name`` the missing module).
    """
    try:
        import transformers  # noqa: PLC0415 (slow, and only this reader needs it)
    except ModuleNotFoundError as e:
        msg = "transformers is not installed (pip install transformers)"
        raise ImportError(msg, name=e.name) from e
    return transformers


def _layers(config: Any) -> object:
    """The config's layer count, of its text model for a multimodal one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "num_hidden_layers", None)


def _model(transformers: ModuleType, config: Any) -> nn.Module:
    """The class ``config.architectures`` names (what ``save_pretrained`` recorded, so its
    FQNs are the checkpoint's), else the causal LM or base model of its type."""
    base = transformers.PreTrainedModel
    for name in getattr(config, "architectures", None) or ():
        # only a model class transformers itself exports, never a name the file makes up
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_"):
            found = getattr(transformers, name, None)
            if isinstance(found, type) and issubclass(found, base):
                model: nn.Module = found(config)
                return model
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except ValueError:  # a type with no causal LM: its base model
        model = transformers.AutoModel.from_config(config, trust_remote_code=False)
    return model


def model_from_config(directory: str, *, max_layers: int) -> tuple[str, nn.Module]:
    """The model transformers builds on the meta device from ``directory``'s
    ``config.json``, and its class's name.

    Args:
        directory: a folder as ``save_pretrained`` writes it.
        max_layers: the most layers the config may ask for (its checkpoint's tensor
            count): a config asking for more is not this checkpoint's, and building it
            would take as long as it asks.

    Raises:
        ImportError: transformers is not installed.
        LayoutError: the config cannot be read or its model built (transformers' reason
            quoted), or it asks for more than ``max_layers`` layers.
    """
    transformers = _transformers()
    path = os.path.join(directory, "config.json")
    hf_logging = transformers.utils.logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its advice on old configs would interleave the report
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = transformers.AutoConfig.from_pretrained(
                directory, local_files_only=True, trust_remote_code=False
            )
            layers = _layers(config)
            if isinstance(layers, int) and layers > max_layers:
                msg = (
                    f"{clip(path)} asks for {layers:,} layers, more than its checkpoint's "
                    f"{max_layers:,} tensors hold; is it this checkpoint's config?"
                )
                raise LayoutError(msg)
            with torch.device("meta"):
                model = _model(transformers, config)
    except LayoutError:
        raise
    except Exception as e:  # whatever transformers refuses in the config, said as its reason
        msg = (
            f"transformers cannot build the model of {clip(path)} "
            f"({type(e).__name__}: {clip(str(e))})"
        )
        raise LayoutError(msg) from e
    finally:
        hf_logging.set_verbosity(level)
    return type(model).__name__, model


def config_dtype(model: nn.Module) -> str | None:
    """The dtype ``model``'s config names (its ``dtype``, which transformers also reads
    from an older config's ``torch_dtype``), ``None`` when it names none the package
    knows."""
    value = getattr(getattr(model, "config", None), "dtype", None)
    if value is None:
        return None
    try:
        return as_dtype(str(value))
    except LayoutError:
        return None


def traced_activations(
    model: nn.Module, *, dtype: str, batch: int, seq_len: int, checkpointing: str
) -> Activations:
    """``activations_from_module`` of ``model`` (as ``model_from_config`` built it, on the
    meta device) with its floating parameters cast to ``dtype``, the dtype FSDP2 computes
    in: a model left in float32 would save float32 copies where the run saves ``dtype``.

    Raises:
        LayoutError: as ``activations_from_module``.
    """
    wanted = getattr(torch, dtype)
    if not wanted.is_floating_point:
        msg = (
            f"cannot trace the activations in {dtype}: FSDP2 computes in a floating dtype; "
            "give one such as 'bfloat16'"
        )
        raise LayoutError(msg)
    model.to(wanted)  # casts floating parameters and buffers only
    return activations_from_module(model, batch=batch, seq_len=seq_len, checkpointing=checkpointing)
