"""Every module and parameter of a module with its FQN, as torch's walks name them.

Torch's walk is two nested generators per module (``named_modules`` recursing into
itself, ``_named_members`` around it), so on a model of a million parameters the walk
costs more than anything the bridge does with what it yields. ``named_parameters`` here
gives the pairs of ``named_parameters(remove_duplicate=False)`` in the same order with
one loop over the modules and one over each module's own parameters: pre-order, children
in registration order, a ``None`` child or parameter skipped, every alias kept (nothing
is deduplicated). ``parameter_groups`` is the same walk a module at a time, for a
caller's own loop over the parameters, and ``named_modules`` the modules themselves, as
``named_modules(remove_duplicate=False)`` gives them.

It is torch's walk whenever a module of the tree could make the answer differ: the root's
class overriding ``named_parameters`` or ``_named_members``, or any module's class
overriding ``named_modules`` (those are what torch's walk calls). The modules are
checked before the first pair is yielded, so a caller never sees half of one walk and
half of the other.

A module that holds one of its own ancestors (``root.block.parent = root``) makes every
walk of the tree endless (torch's own recurses until ``RecursionError``): the walk keeps
the modules whose subtree it is in, and meeting one of them again is a ``BindError``
naming the path that closes the cycle. A module shared at two places of the tree, not
inside itself, is walked at both, as torch walks it.

Every FQN is given as torch's state dict gives it (``state_dict_fqn``): activation
checkpointing's wrapper (``checkpoint_wrapper``, ``apply_activation_checkpointing``)
holds the wrapped module as ``_checkpoint_wrapped_module``, a segment its state-dict hooks
drop, so ``layers.0._checkpoint_wrapped_module.attn.weight`` is ``layers.0.attn.weight``
(and the wrapper and the module it wraps share one FQN).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Final, TypeAlias, TypeVar

from torch import nn

from layout_algebra._text import quote
from layout_algebra.errors import BindError, LayoutError

__all__ = ["named_modules", "named_parameters", "parameter_groups", "state_dict_fqn"]

T = TypeVar("T")

_NAMED_MODULES = nn.Module.named_modules
_NAMED_PARAMETERS = nn.Module.named_parameters
_NAMED_MEMBERS = nn.Module._named_members

_WRAPPER_SEGMENT: Final = "_checkpoint_wrapped_module"
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
    if _WRAPPER_SEGMENT not in name:
        return name
    return ".".join(part for part in name.split(".") if part != _WRAPPER_SEGMENT)


ParamGroup: TypeAlias = tuple[str, str, Iterable[tuple[str, "nn.Parameter | None"]]]
"""A module's FQN, its prefix (the FQN and a dot, ``""`` for the root) and its
``(name, parameter)`` pairs: each FQN is ``prefix + name``. A pair's parameter may be
``None``, to be skipped. (Torch's own walk is one group of the root's: ``""``, ``""``
and every FQN as a name.)"""


def named_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters(remove_duplicate=False)``, walked in one loop.

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
    """
    for _, prefix, group in parameter_groups(module):
        for name, param in group:
            if param is not None:
                yield prefix + name, param


def parameter_groups(module: nn.Module) -> Iterator[ParamGroup]:
    """The pairs of ``module.named_parameters(remove_duplicate=False)``, a module at a time
    (one group of them all, torch's own, when the root's class overrides how they are
    named).

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
    """
    root = type(module)
    if root.named_parameters is not _NAMED_PARAMETERS or root._named_members is not _NAMED_MEMBERS:
        pairs = _torch_walk(module.named_parameters(remove_duplicate=False))
        yield "", "", ((state_dict_fqn(name), param) for name, param in pairs)
        return
    # _walk's loop and its _enter, inlined (a generator between the two, or a call per
    # module, costs more than the walk's own work on a model of many small modules).
    stack: list[tuple[str, nn.Module, int]] = [("", module, 0)]
    pop, push = stack.pop, stack.extend
    path: list[int] = []
    inside: dict[int, str] = {}
    visited = 0
    while stack:
        fqn, sub, depth = pop()
        if type(sub).named_modules is not _NAMED_MODULES:
            walked = _torch_walk(module.named_modules(remove_duplicate=False))
            for raw, sub in islice(walked, visited, None):
                fqn = state_dict_fqn(raw)
                yield fqn, (f"{fqn}." if fqn else ""), sub._parameters.items()
            return
        children = sub._modules
        if children:  # _enter, inlined
            while len(path) > depth:
                del inside[path.pop()]
            key = id(sub)
            if key in inside:
                raise _cycle(fqn, inside[key])
            inside[key] = fqn
            path.append(key)
        visited += 1
        prefix = f"{fqn}." if fqn else ""
        params = sub._parameters
        if params:
            yield fqn, prefix, params.items()
        if children:
            depth += 1
            push(
                [
                    (prefix + k if k != _WRAPPER_SEGMENT else fqn, m, depth)
                    for k, m in reversed(children.items())
                    if m is not None
                ]
            )


def named_modules(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``module.named_modules(remove_duplicate=False)``: every module at every FQN.

    Raises:
        BindError: a module of the tree holds one of its ancestors (a cycle).
    """
    for fqn, _, sub in _walk(module):
        yield fqn, sub


def _walk(module: nn.Module) -> Iterator[tuple[str, str, nn.Module]]:
    """Each module of the tree with its FQN and prefix, as ``named_modules`` walks them."""
    # Pre-order, names joined as torch joins them (an empty FQN takes no dot). Each entry
    # of the stack holds its depth; ``path`` holds the ids of the modules with children
    # whose subtree the walk is in, ``inside`` the same ids, each with its FQN (see _enter).
    stack: list[tuple[str, nn.Module, int]] = [("", module, 0)]
    pop, push = stack.pop, stack.extend
    path: list[int] = []
    inside: dict[int, str] = {}
    visited = 0
    while stack:
        fqn, sub, depth = pop()
        if type(sub).named_modules is not _NAMED_MODULES:
            # Torch's walk of the modules from here on (the ones so far are its first).
            walked = _torch_walk(module.named_modules(remove_duplicate=False))
            for raw, sub in islice(walked, visited, None):
                fqn = state_dict_fqn(raw)
                yield fqn, (f"{fqn}." if fqn else ""), sub
            return
        children = sub._modules
        if children:  # a module without children is no one's ancestor
            _enter(path, inside, depth, id(sub), fqn)
        visited += 1
        prefix = f"{fqn}." if fqn else ""
        yield fqn, prefix, sub
        if children:  # pushed last first, so popped in registration order
            depth += 1
            push(
                [
                    (prefix + k if k != _WRAPPER_SEGMENT else fqn, m, depth)
                    for k, m in reversed(children.items())
                    if m is not None
                ]
            )


def _enter(path: list[int], inside: dict[int, str], depth: int, key: int, fqn: str) -> None:
    """Note that the walk enters the subtree of the module ``key`` (its id) at ``fqn``, at
    ``depth``: ``path`` and ``inside`` keep the ids of the modules it is inside (held by
    the walk's stack, so no id is reused meanwhile), and ``inside`` their FQNs.

    Raises:
        BindError: the walk is already inside that module (a cycle).
    """
    while len(path) > depth:  # the subtrees the walk has left since
        del inside[path.pop()]
    first = inside.get(key)
    if first is not None:
        raise _cycle(fqn, first)
    inside[key] = fqn
    path.append(key)


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


def _torch_walk(walk: Iterator[tuple[str, T]]) -> Iterator[tuple[str, T]]:
    """Torch's own walk, its ``RecursionError`` (a cycle, or a tree that deep) a ``BindError``."""
    try:
        yield from walk
    except RecursionError:
        msg = (
            "the model's own walk of its modules (a class of it overrides named_modules or "
            "named_parameters) recursed past Python's limit: a module that contains itself "
            "(a cycle of submodules) or a tree that deep; keep back-references out of the "
            "module tree (a weakref.ref, or an attribute set with object.__setattr__)"
        )
        raise BindError(msg) from None
