"""Every module and parameter of a model with its FQN: torch's walks, as the state dict names them.

``named_parameters`` and ``named_modules`` are torch's ``named_parameters`` and ``named_modules``
with ``remove_duplicate=False`` (every alias of a tied parameter, every place of a shared module),
so a class that overrides how its members are named is read as torch reads it. Where no class of the
tree overrides them, the parameters are walked here in one loop (``parameter_lists``), in torch's
order and with torch's names. Each FQN is given as torch's state dict gives it (``state_dict_fqn``):
activation checkpointing's wrapper (``checkpoint_wrapper``, ``apply_activation_checkpointing``)
holds the wrapped module as ``_checkpoint_wrapped_module``, a segment its state-dict hooks drop, so
``layers.0._checkpoint_wrapped_module.attn.weight`` is ``layers.0.attn.weight``.

A module that holds one of its own ancestors (``root.block.parent = root``) makes torch's walk
recurse until ``RecursionError`` (the loop here stops at that depth): that is a ``BindError``
naming the path that closes the cycle. Anything else a walk raises (a class whose
``named_parameters`` fails) is a ``LayoutError`` naming the walk and the module
(``_checks.reading``), and so is a module's own ``named_parameters(recurse=False)`` or
``named_children()`` failing (``own_parameters``, ``children``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Final, TypeVar

from torch import nn

from layout_algebra._text import quote
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.torch_bridge._checks import read_error, reading

__all__ = [
    "WRAPPER_SEGMENT",
    "children",
    "named_modules",
    "named_parameters",
    "own_parameters",
    "parameter_lists",
    "state_dict_fqn",
    "walk_error",
]

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


def named_parameters(module: nn.Module, path: str = "") -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters(remove_duplicate=False)``, FQNs as the state dict gives them;
    ``path`` is the module's FQN in the model, for the messages (``""``: the model).

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
        LayoutError: the walk raised anything else, naming it (its exception the cause).
    """
    names, params = parameter_lists(module, path)
    yield from zip(names, params, strict=True)


_NAMED_PARAMETERS: Final = nn.Module.named_parameters
_NAMED_MEMBERS: Final = nn.Module._named_members
_NAMED_MODULES: Final = nn.Module.named_modules


def parameter_lists(module: nn.Module, path: str = "") -> tuple[list[str], list[nn.Parameter]]:
    """The FQNs and the parameters of ``named_parameters(module, path)``, as two lists.

    Where every class of the tree walks as ``nn.Module`` does (the root's
    ``named_parameters``, every module's ``named_modules``), the tree is walked here in one
    loop, in torch's order (a module's own parameters, then each child's subtree): torch's
    chain of nested generators passes every parameter up through each level, which at 1e5
    parameters costs ``bind`` more than its whole budget. Any other tree is torch's to walk.

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
        LayoutError: torch's walk raised anything else, naming it (its exception the cause).
    """
    walked = _walk_as_torch(module)
    if walked is not None:
        return walked
    names: list[str] = []
    params: list[nn.Parameter] = []
    walk = _torch_walk(
        module, path, "named_parameters", lambda: module.named_parameters(remove_duplicate=False)
    )
    for name, param in walk:
        names.append(name if WRAPPER_SEGMENT not in name else state_dict_fqn(name))
        params.append(param)
    return names, params


def _walk_as_torch(root: nn.Module) -> tuple[list[str], list[nn.Parameter]] | None:
    """``parameter_lists(root)`` walked here, or ``None`` when a class of the tree walks
    its own way (or was not set up by ``nn.Module.__init__``): torch's walk then decides."""
    cls = type(root)
    if cls.named_parameters is not _NAMED_PARAMETERS or cls._named_members is not _NAMED_MEMBERS:
        return None
    names: list[str] = []
    params: list[nn.Parameter] = []
    deepest = sys.getrecursionlimit()  # torch's recursive walk fails before this depth
    # Depth first, one entry per level (its prefix, head and children left): a walk keeps
    # no more objects alive than torch's generators do, so it sets off no more collections.
    stack: list[tuple[str, str, Iterator[tuple[str, nn.Module | None]]]] = []
    prefix, module = "", root
    while True:
        if type(module).named_modules is not _NAMED_MODULES:
            return None
        try:
            own, subs = module._parameters, module._modules
        except AttributeError:
            return None
        head = f"{prefix}." if prefix else ""  # torch's join, even of names registered empty
        for key, param in own.items():
            if param is not None:
                names.append(head + key)
                params.append(param)
        if subs:
            if len(stack) == deepest:  # a cycle, or a tree deeper than torch's walk goes
                raise walk_error(root)
            stack.append((prefix, head, iter(subs.items())))
        while stack:  # the next module: the next child of the deepest level with one left
            above, above_head, children = stack[-1]
            for name, sub in children:
                if sub is not None:
                    # the checkpoint wrapper's segment is dropped, as its state dict drops it
                    prefix = above if name == WRAPPER_SEGMENT else above_head + name
                    module = sub
                    break
            else:
                stack.pop()
                continue
            break
        else:
            return names, params


def named_modules(module: nn.Module, path: str = "") -> Iterator[tuple[str, nn.Module]]:
    """``module.named_modules(remove_duplicate=False)``, FQNs as the state dict gives them;
    ``path`` is the module's FQN in the model, for the messages (``""``: the model).

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
        LayoutError: the walk raised anything else, naming it (its exception the cause).
    """
    walk = _torch_walk(
        module, path, "named_modules", lambda: module.named_modules(remove_duplicate=False)
    )
    for name, sub in walk:
        yield state_dict_fqn(name), sub


def own_parameters(
    module: nn.Module, path: str, *, remove_duplicate: bool = False
) -> list[tuple[str, nn.Parameter]]:
    """``module.named_parameters(recurse=False, remove_duplicate=...)`` of the module at
    ``path``, read whole.

    Raises:
        LayoutError: the module's walk raised, naming ``path`` (its exception the cause).
    """
    with _reading(path, "named_parameters(recurse=False)"):
        return list(module.named_parameters(recurse=False, remove_duplicate=remove_duplicate))


def children(module: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    """``module.named_children()`` of the module at ``path``, read whole.

    Raises:
        LayoutError: it raised, naming ``path`` (its exception the cause).
    """
    with _reading(path, "named_children()"):
        return list(module.named_children())


def _reading(path: str, call: str) -> AbstractContextManager[None]:
    """``reading`` the module at ``path``'s ``call``: what it raises names the module."""
    return reading(f"{call} of {_where(path)}", remedy=_remedy(call), fqn=path or None)


def _where(path: str) -> str:
    return f"module {quote(path)}" if path else "the model"


def _remedy(call: str) -> str:
    name = call.partition("(")[0]
    return (
        f"fix the class's {name} (torch's own walk of a module, which every reader of the "
        "bridge uses)"
    )


def _torch_walk(
    root: nn.Module, path: str, call: str, walk: Callable[[], Iterator[tuple[str, T]]]
) -> Iterator[tuple[str, T]]:
    """Torch's walk of ``root`` (its ``call``; the module at ``path``), its
    ``RecursionError`` (a cycle, or a tree that deep) a ``BindError``, anything else it
    raises a ``LayoutError`` naming ``call`` and ``path``."""
    try:
        yield from walk()
    except RecursionError:
        raise walk_error(root) from None
    except LayoutError:
        raise
    except Exception as e:
        shown = f"{call}(remove_duplicate=False) of {_where(path)}"
        raise read_error(shown, e, _remedy(call), fqn=path or None) from e


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
