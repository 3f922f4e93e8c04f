"""Units and frozen parameters read off a model's FQNs alone: no torch, no model object.

A model's repeated blocks sit in a numbered container (``nn.ModuleList`` or a
``ModuleDict`` keyed by layer number): ``model.layers.0``, ``model.layers.1``, ... Those
are the modules transformers and torchtitan give ``fully_shard`` one by one, so given
only a model's parameter FQNs (a ``shapes.json``), ``repeated_blocks`` names them as unit
patterns. ``compact`` writes a set of FQNs as patterns wherever a ``*`` loses nothing;
``in_module_order`` puts a table in the order the step runs its units in.

>>> fqns = ["model.embed_tokens.weight", "model.layers.0.mlp.w1.weight",
...         "model.layers.1.mlp.w1.weight", "model.norm.weight", "lm_head.weight"]
>>> repeated_blocks(fqns)
('model.layers.*',)
>>> compact(["model.layers.0.mlp.w1.weight", "model.layers.1.mlp.w1.weight"], fqns)
('model.layers.*.mlp.w1.weight',)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from layout_algebra._args import as_items
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._text import quote
from layout_algebra.errors import LayoutError
from layout_algebra.layout import ParamLayoutTable

__all__ = ["compact", "in_module_order", "repeated_blocks"]

_WILDCARD: Final = "*"


def _fqns(value: Iterable[str], arg: str) -> tuple[str, ...]:
    items = as_items(value, arg, "['layers.0.w', 'layers.1.w']")
    for item in items:
        raw: object = item
        if not isinstance(raw, str) or not raw or "" in raw.split("."):
            msg = (
                f"{arg} holds dotted FQNs such as 'layers.0.w' (no empty segment), got {quote(raw)}"
            )
            raise LayoutError(msg)
    return items


def _is_index(segment: str) -> bool:
    """Whether ``segment`` is a container's position: ASCII digits, as torch names them."""
    return segment.isascii() and segment.isdigit()


def repeated_blocks(fqns: Iterable[str]) -> tuple[str, ...]:
    """The repeated numbered blocks of the model these FQNs (parameters or modules) come
    from, as unit patterns: ``model.layers.*`` for ``model.layers.0.*``,
    ``model.layers.1.*``, ...

    A block container is the prefix before the first numeric segment of an FQN, holding at
    least two numbered children (one numbered child repeats nothing). Only the outermost
    container on a path counts: the experts numbered inside a layer are parts of that
    layer's unit, not units of their own. Several containers (an encoder's and a decoder's
    layers) give several patterns, in the order their first FQN comes.

    >>> repeated_blocks(["layers.0.experts.0.w", "layers.0.experts.1.w", "layers.1.experts.0.w"])
    ('layers.*',)
    >>> repeated_blocks(["encoder.blocks.0.w", "encoder.blocks.1.w", "decoder.layers.0.w",
    ...                  "decoder.layers.1.w", "head.0.w"])
    ('encoder.blocks.*', 'decoder.layers.*')

    Raises:
        LayoutError: ``fqns`` is no collection of dotted FQNs.
    """
    children: dict[tuple[str, ...], set[str]] = {}  # container -> its numbered children
    for fqn in _fqns(fqns, "repeated_blocks(fqns=...)"):
        segments = fqn.split(".")
        at = next((i for i, s in enumerate(segments) if _is_index(s)), None)
        if at is not None:
            children.setdefault(tuple(segments[:at]), set()).add(segments[at])
    return tuple(
        ".".join((*container, _WILDCARD))
        for container, numbers in children.items()
        if len(numbers) > 1
    )


def compact(chosen: Iterable[str], every: Iterable[str]) -> tuple[str, ...]:
    """``chosen`` (FQNs among ``every``) as patterns: each FQN with its numeric segments
    written ``*`` where that pattern stands for several chosen FQNs and matches no other
    FQN of ``every``, else the FQN itself. Each pattern once, in the order of the first
    FQN it stands for.

    >>> every = ["layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b", "head.w"]
    >>> compact(["layers.0.w", "layers.1.w", "head.w"], every)
    ('layers.*.w', 'head.w')
    >>> compact(["layers.0.w", "layers.0.b"], every)
    ('layers.0.w', 'layers.0.b')
    >>> compact(["layers.0.w", "layers.1.w"], [*every, "layers.extra.w"])  # * is any segment
    ('layers.0.w', 'layers.1.w')

    Raises:
        LayoutError: either argument is no collection of dotted FQNs.
    """
    picked = tuple(dict.fromkeys(_fqns(chosen, "compact(chosen=...)")))
    wanted = set(picked)
    stands: dict[str, int] = {}  # pattern -> how many chosen FQNs it stands for
    for fqn in picked:
        stands[_starred(fqn)] = stands.get(_starred(fqn), 0) + 1
    candidates = [p for p, n in stands.items() if n > 1]
    # a pattern loses nothing when every FQN it matches (``*``: any one segment) is chosen
    matcher = Matcher(Rule(p, None) for p in candidates)
    pure = [True] * len(candidates)
    for fqn in _fqns(every, "compact(every=...)"):
        if fqn not in wanted:
            whole = fqn.count(".") + 1
            for n, found in matcher.prefixes(fqn):
                for i in found if n == whole else ():
                    pure[i] = False
    kept = {p for p, ok in zip(candidates, pure, strict=True) if ok}
    out: dict[str, None] = {}
    for fqn in picked:
        key = _starred(fqn)
        out[key if key in kept else fqn] = None
    return tuple(out)


def _starred(fqn: str) -> str:
    return ".".join(_WILDCARD if _is_index(s) else s for s in fqn.split("."))


def in_module_order(table: ParamLayoutTable, order: Sequence[str]) -> ParamLayoutTable:
    """``table`` with its entries in ``order`` (the model's FQNs in module order), any
    others after: the step runs units in the order of their parameters, and a plan built
    by hand may list the parameters it places before the others. ``table`` itself when
    already so."""
    if all(a == b for a, b in zip(table, order, strict=False)):
        return table
    entries = {fqn: table[fqn] for fqn in order if fqn in table}
    entries.update((fqn, layout) for fqn, layout in table.items() if fqn not in entries)
    return ParamLayoutTable(entries, tied=table.tied, dropped=table.dropped)
