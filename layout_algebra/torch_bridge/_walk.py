"""Every parameter of a module with its FQN, as ``named_parameters(remove_duplicate=False)``.

Torch's walk is two nested generators per module (``named_modules`` recursing into
itself, ``_named_members`` around it), so on a model of a million parameters the walk
costs more than anything the bridge does with what it yields. ``named_parameters`` here
gives the same pairs in the same order with one loop over the modules and one over each
module's own parameters: pre-order, children in registration order, a ``None`` child or
parameter skipped, every alias kept (nothing is deduplicated). ``parameter_groups`` is
the same walk a module at a time, for a caller's own loop over the parameters.

It is torch's walk whenever a module of the tree could make the answer differ: the root's
class overriding ``named_parameters`` or ``_named_members``, or any module's class
overriding ``named_modules`` (those are what torch's walk calls). The modules are
checked before the first pair is yielded, so a caller never sees half of one walk and
half of the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeAlias

from torch import nn

__all__ = ["named_parameters", "parameter_groups"]

_NAMED_MODULES = nn.Module.named_modules
_NAMED_PARAMETERS = nn.Module.named_parameters
_NAMED_MEMBERS = nn.Module._named_members


ParamGroup: TypeAlias = tuple[str, str, Iterable[tuple[str, "nn.Parameter | None"]]]
"""A module's FQN, its prefix (the FQN and a dot, ``""`` for the root) and its
``(name, parameter)`` pairs: each FQN is ``prefix + name``. A pair's parameter may be
``None``, to be skipped. (Torch's own walk is one group of the root's: ``""``, ``""``
and every FQN as a name.)"""


def named_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``module.named_parameters(remove_duplicate=False)``, walked in one loop."""
    for _, prefix, group in parameter_groups(module):
        for name, param in group:
            if param is not None:
                yield prefix + name, param


def parameter_groups(module: nn.Module) -> Iterator[ParamGroup]:
    """The pairs of ``module.named_parameters(remove_duplicate=False)``, a module at a time
    (one group of them all, torch's own, when the root's class overrides how they are
    named)."""
    root = type(module)
    if root.named_parameters is not _NAMED_PARAMETERS or root._named_members is not _NAMED_MEMBERS:
        yield "", "", module.named_parameters(remove_duplicate=False)
        return
    # Pre-order, each module's own parameters before its children's, names joined as
    # torch joins them (an empty FQN takes no dot).
    stack: list[tuple[str, nn.Module]] = [("", module)]
    pop, push = stack.pop, stack.extend
    visited = 0
    while stack:
        fqn, sub = pop()
        if type(sub).named_modules is not _NAMED_MODULES:
            # Torch's walk of the modules from here on (the ones so far are its first).
            for fqn, sub in islice(module.named_modules(remove_duplicate=False), visited, None):
                yield fqn, (f"{fqn}." if fqn else ""), sub._parameters.items()
            return
        visited += 1
        prefix = f"{fqn}." if fqn else ""
        params = sub._parameters
        if params:
            yield fqn, prefix, params.items()
        children = sub._modules
        if children:  # pushed last first, so popped in registration order
            push([(prefix + k, m) for k, m in reversed(children.items()) if m is not None])
