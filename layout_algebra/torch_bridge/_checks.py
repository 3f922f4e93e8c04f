"""The bridge's argument checks: a value of the wrong type is a ``BindError`` naming it.

Each public function and constructor of the bridge checks its arguments with these
first, so ``bind(table, None, meshes)`` says which argument is wrong and what it should
be rather than failing with an ``AttributeError`` deep inside torch.

The importers read the user's objects further (a model's ``config`` and ``tp_plan``, a
module's ``head_dim``, a torchtitan module's sharding config): ``read_attr`` and
``reading`` are the one rule for that, whatever the object raises while it is read
becoming a ``LayoutError`` naming what was read, its exception the ``__cause__``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from layout_algebra import layout
from layout_algebra._args import mapping_items, plain_str
from layout_algebra._text import quote, some_of
from layout_algebra.axes import AxisLike, axis_name_set
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.layout import ParamLayoutTable

__all__ = [
    "check_meshes",
    "check_module",
    "check_table",
    "check_type",
    "kind",
    "owned_names",
    "parameters",
    "read_attr",
    "read_error",
    "reading",
    "refuse_spmd_local",
    "spmd_local",
]


def kind(value: object) -> str:
    """The type of ``value`` as a message names it (``int``, ``torch.Tensor``)."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_type(
    value: object, expected: type | tuple[type, ...], arg: str, what: str, remedy: str = ""
) -> None:
    """Refuse ``value`` unless it is an instance of ``expected``.

    Args:
        value: the argument given.
        expected: the type(s) it must have.
        arg: the argument as the message names it, e.g. ``"bind(module=...)"``.
        what: what it must be, e.g. ``"a torch.nn.Module"``.
        remedy: what to do, e.g. ``"pass the model the table names"`` (by default: pass
            ``what``).

    Raises:
        BindError: ``"{arg}: must be {what}, got {type} {value}; {remedy}"``.
    """
    if not isinstance(value, expected):
        msg = f"{arg}: must be {what}, got {kind(value)} {quote(value)}; {remedy or 'pass ' + what}"
        raise BindError(msg)


def check_module(module: object, arg: str) -> nn.Module:
    """``module`` itself when it is an ``nn.Module``; anything else is refused for ``arg``.

    Raises:
        BindError: ``module`` is not an ``nn.Module``.
    """
    check_type(module, nn.Module, arg, "a torch.nn.Module", "pass the model itself")
    assert isinstance(module, nn.Module)
    return module


def check_table(table: object, arg: str) -> ParamLayoutTable:
    """The package's one table check (``layout.check_table``) for the bridge: a
    ``BindError`` naming ``arg``."""
    try:
        return layout.check_table(table, arg)
    except LayoutError as e:
        raise BindError(e.message) from None


def check_meshes(meshes: object, arg: str) -> dict[str, DeviceMesh]:
    """Refuse anything but a mapping of mesh roles (str) to ``DeviceMesh`` for ``arg``;
    its items, read once, as a new dict (what the caller then reads instead)."""
    remedy = "pass e.g. {'dense': world_mesh, 'expert': expert_mesh}"
    check_type(meshes, Mapping, arg, "a mapping of mesh roles to DeviceMesh", remedy)
    assert isinstance(meshes, Mapping)
    out: dict[str, DeviceMesh] = {}
    for role, mesh in mapping_items(meshes, arg, "{'dense': world_mesh}", error=BindError):
        if not isinstance(role, str):
            msg = f"{arg}: a mesh role must be a str, got {kind(role)} {quote(role)}; {remedy}"
            raise BindError(msg)
        check_type(mesh, DeviceMesh, f"{arg}[{quote(role)}]", "a DeviceMesh", remedy)
        out[plain_str(role)] = mesh  # a str subclass's own __eq__ never reaches a lookup
    return out


def owned_names(owned: Iterable[AxisLike], arg: str) -> frozenset[str]:
    """The names of the owned axes ``owned``, checked (a bare str is refused)."""
    try:
        return axis_name_set(owned, arg)
    except LayoutError as e:
        raise BindError(e.message, axis=e.axis) from None


def parameters(params: object, arg: str) -> list[nn.Parameter]:
    """``params`` as a list of ``nn.Parameter``: a collection, never a tensor or a str.

    A tensor is iterable (by rows), so ``ignored_params=param`` would silently mean its
    rows; it is refused with the remedy.
    """
    remedy = "pass a collection such as {model.pos_emb} or list(module.parameters())"
    if isinstance(params, torch.Tensor | str | bytes | Mapping) or not isinstance(params, Iterable):
        check_type(params, (), arg, "a collection of nn.Parameter", remedy)
    assert isinstance(params, Iterable)
    out: list[nn.Parameter] = []
    for p in params:
        check_type(p, nn.Parameter, f"{arg} item {len(out)}", "an nn.Parameter", remedy)
        out.append(p)
    return out


_ABSENT: Final = object()


def read_error(
    shown: str, e: BaseException, remedy: str, *, caller: str = "", fqn: str | None = None
) -> LayoutError:
    """The error for reading ``shown`` (``model.tp_plan``, ``the head_dim of module
    'layers.0.attn'``) off the user's object, which raised ``e``; ``remedy`` says what to do,
    ``caller`` (the public function) leads the message, ``fqn`` is set on the error."""
    who = f"{caller}: " if caller else ""
    msg = f"{who}reading {shown} raised {quote(e)}; {remedy}"
    return LayoutError(msg, fqn=fqn)


def read_attr(
    obj: object,
    name: str,
    shown: str,
    *,
    remedy: str,
    caller: str = "",
    default: object = None,
    fqn: str | None = None,
) -> object:
    """``obj.name``, read once; ``default`` when ``obj`` has no such attribute.

    An attribute ``obj`` has (its class or its own dict defines it) whose reading raises is
    an error, ``AttributeError`` included: a property that fails is not an attribute that
    is missing, and read as missing it would silently change the answer (an experts
    module's ``is_transposed``). An unset slot is missing.

    Raises:
        LayoutError: from ``read_error``, its ``__cause__`` what ``obj`` raised (a
            ``LayoutError`` it raises passes untouched).
    """
    try:
        return getattr(obj, name)
    except LayoutError:
        raise
    except AttributeError as e:
        found = _static(obj, name)
        if found is _ABSENT:
            return default
        own = _own_error(found, obj) or e
        raise read_error(shown, own, remedy, caller=caller, fqn=fqn) from own
    except Exception as e:
        raise read_error(shown, e, remedy, caller=caller, fqn=fqn) from e


def _static(obj: object, name: str) -> object:
    """What ``obj``'s class or own dict holds as ``name`` (looked up without running it),
    ``_ABSENT`` when nothing or an unset slot."""
    try:
        found = inspect.getattr_static(obj, name, _ABSENT)
    except Exception:  # a class whose lookup itself fails: its getattr said missing
        return _ABSENT
    return _ABSENT if inspect.ismemberdescriptor(found) else found


def _own_error(found: object, obj: object) -> Exception | None:
    """The exception a descriptor (a property) raises itself. After it raises
    ``AttributeError``, Python asks the class's ``__getattr__`` (``nn.Module``'s says the
    attribute does not exist), and that is all ``getattr`` shows."""
    get = getattr(type(found), "__get__", None)
    if get is None:
        return None
    try:
        get(found, obj, type(obj))
    except Exception as e:
        return e
    return None


@contextmanager
def reading(shown: str, *, remedy: str, caller: str = "", fqn: str | None = None) -> Iterator[None]:
    """Run the block that reads ``shown`` (a call on the user's object:
    ``model.config.get_text_config()``), whatever it raises becoming ``read_error``'s error
    (a ``LayoutError`` passes untouched)."""
    try:
        yield
    except LayoutError:
        raise
    except Exception as e:
        raise read_error(shown, e, remedy, caller=caller, fqn=fqn) from e


_SPMD_SHARDED = frozenset({"V", "P"})
"""spmd_types' local types a plain tensor cannot be read whole from: varying (a shard) and
partial (a pending sum)."""


def spmd_local(param: torch.Tensor) -> bool:
    """Whether ``param`` is a plain tensor holding a spmd_types shard (or partial sum).

    torchtitan's default ``spmd_types`` backend leaves a sharded parameter a plain tensor
    of the local shape, recording its layout as ``_local_type`` (mesh axis -> R/I/V/P);
    read as a plain parameter it would be whole, with its local shape as the global one.
    """
    if isinstance(param, DTensor):
        return False
    local: object = getattr(param, "_local_type", None)
    if not isinstance(local, Mapping):
        return False
    return any(getattr(k, "name", str(k)) in _SPMD_SHARDED for k in local.values())


def refuse_spmd_local(fqns: list[str], caller: str) -> None:
    """Refuse the parameters ``fqns`` (``spmd_local`` ones), if any, for ``caller``."""
    if not fqns:
        return
    shown = some_of(fqns, show=quote)
    msg = (
        f"{caller}: {len(fqns)} parameter(s) are plain tensors holding a spmd_types shard "
        f"(a V or P entry in _local_type), not whole tensors: {shown}; their layout and "
        "global shape cannot be read off them. Take the layouts from torchtitan's sharding "
        "configs with plan_from_torchtitan(model, mesh_axes=...) (on the model before "
        "parallelize, for its global shapes), or run torchtitan with a DTensor backend "
        "(spmd_backend='full_dtensor' or 'partial_dtensor')"
    )
    raise LayoutError(msg, fqn=fqns[0])
