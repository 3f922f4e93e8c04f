"""Every module and parameter of a model with its FQN: torch's own walks, as the state
dict names them.

``named_parameters`` and ``named_modules`` are torch's ``named_parameters`` and
``named_modules`` with ``remove_duplicate=False`` (every alias of a tied parameter, every
place of a shared module), so a class that overrides how its members are named is read as
torch reads it. Each FQN is given as torch's state dict gives it (``state_dict_fqn``):
activation checkpointing's wrapper (``checkpoint_wrapper``,
``apply_activation_checkpointing``) holds the wrapped module as
``_checkpoint_wrapped_module``, a segment its state-dict hooks drop, so
``layers.0._checkpoint_wrapped_module.attn.weight`` is ``layers.0.attn.weight``.

A module that holds one of its own ancestors (``root.block.parent = root``) makes torch's
walk recurse until ``RecursionError``: that is a ``BindError`` naming the path that closes
the cycle.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, TypeVar

from torch import nn

from layout_algebra._text import quote
from layout_algebra.errors import BindError, LayoutError

__all__ = ["WRAPPER_SEGMENT", "named_modules", "named_parameters", "state_dict_fqn", "walk_error"]

T = TypeVar("T")

WRAPPER_SEGMENT: Final = "_checkpoint_wrapped_module"
"""The segment torch's activation-checkpoint wrapper adds, which its state dict drops."""


def state_dict_fqn(name: str) -> str:
    """``name`` as torch's state dict shows it: without activation checkpointing's segment.

    >>> state_dict_fqn("layers.0._checkpoint_wrapped_module.attention.wo.weight")
    'layers.0.attention.wo.weight'

    Raises:
        LayoutError: ``name`` is not a str.
    """
    raw: object = name
    if not isinstance(raw, str):
        msg = f"state_dict_fqn(name=...) takes a parameter FQN (a str), got {quote(raw)}"
        raise LayoutError(msg)
    if WRAPPER_SEGMENT not in name:
        return name
    return ".".join(part for part in name.split(".") if part != WRAPPER_SEGMENT)


def named_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters(remove_duplicate=False)``, FQNs as the state dict gives them.

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
    """
    for name, param in _torch_walk(module, module.named_parameters(remove_duplicate=False)):
        yield (name if WRAPPER_SEGMENT not in name else state_dict_fqn(name)), param


def named_modules(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``module.named_modules(remove_duplicate=False)``, FQNs as the state dict gives them.

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
    """
    for name, sub in _torch_walk(module, module.named_modules(remove_duplicate=False)):
        yield state_dict_fqn(name), sub


def _torch_walk(root: nn.Module, walk: Iterator[tuple[str, T]]) -> Iterator[tuple[str, T]]:
    """Torch's walk of ``root``, its ``RecursionError`` (a cycle, or a tree that deep) a
    ``BindError``."""
    try:
        yield from walk
    except RecursionError:
        raise walk_error(root) from None


def walk_error(root: nn.Module) -> BindError:
    """The error for torch's walk of ``root`` recursing past Python's limit: the cycle of
    submodules that made it, or a tree that deep."""
    return _find_cycle(root) or _too_deep()


def _too_deep() -> BindError:
    msg = (
        "the model's own walk of its modules recursed past Python's limit: a module that "
        "contains itself (a cycle of submodules) or a tree that deep; keep back-references "
        "out of the module tree (a weakref.ref, or an attribute set with object.__setattr__)"
    )
    return BindError(msg)


def _find_cycle(root: nn.Module) -> BindError | None:
    """The error naming the first module, in torch's walk order, that is one of its own
    ancestors; ``None`` when there is none (the walk only went that deep).

    The modules torch's walk enters are followed: a class whose ``named_modules`` is its
    own decides its subtree, which is not entered here.
    """
    # Depth first, iterative; each entry holds the path of (FQN, module) from the root.
    stack: list[list[tuple[str, nn.Module]]] = [[("", root)]]
    while stack:
        path = stack.pop()
        fqn, sub = path[-1]
        for first, ancestor in path[:-1]:
            if ancestor is sub:
                return _cycle(state_dict_fqn(fqn), state_dict_fqn(first))
        if type(sub).named_modules is not nn.Module.named_modules:
            continue
        prefix = f"{fqn}." if fqn else ""
        children = [[*path, (prefix + name, child)] for name, child in sub.named_children()]
        stack.extend(reversed(children))
    return None


def _cycle(fqn: str, first: str) -> BindError:
    """The error for the module at ``fqn``, which is also its ancestor at ``first``."""
    ancestor = f"the module at {quote(first)}" if first else "the root module"
    msg = (
        f"module {quote(fqn)} is {ancestor}, which contains it: a cycle of submodules, "
        "which no walk of the model (torch's named_parameters, state_dict) ever finishes; "
        "keep the back-reference out of the module tree (a weakref.ref, or an attribute "
        "set with object.__setattr__)"
    )
    return BindError(msg, fqn=fqn)
