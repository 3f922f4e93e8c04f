"""Plan keys with ``*``: which key gives each parameter FQN its rule.

A key is dotted segments; a ``*`` segment matches exactly one segment of an FQN
(``layers.*.attention.wq.weight`` matches ``layers.7.attention.wq.weight``). Among the keys
matching an FQN the most specific win: those with the most literal segments. An exact key
has only literal segments, so it beats every pattern of its length; ``best`` returns every
key of the top specificity, so the caller sees a tie.

Matching a million FQNs against tens of patterns must not try every pattern on every FQN.
Two facts make it a dict lookup: a pattern matches only FQNs with as many segments as it
has, and whether it matches depends on each segment only through "is it the literal some
pattern names at this position, and which". So each FQN is reduced to a *signature* (its
segments, with every segment no pattern names at that position replaced by ``None``), and
the answer is computed once per signature: ``layers.0.wq.weight`` and
``layers.31.wq.weight`` have one signature when no pattern names a layer number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Final, Generic, TypeVar

import attrs

__all__ = ["WILDCARD", "Matcher", "Rule", "is_pattern"]

T = TypeVar("T")

WILDCARD: Final = "*"
"""The segment that matches any one segment."""


_MAX_PICKED: Final = 1 << 16
"""How many distinct picked segment tuples a matcher remembers."""


def _nothing(_: list[str]) -> object:
    """What an all-``*`` pattern looks at in an FQN: nothing."""
    return ()


def is_pattern(key: str) -> bool:
    """Whether ``key`` has a ``*`` segment."""
    return WILDCARD in key.split(".")


@attrs.frozen
class Rule(Generic[T]):
    """One key of a plan and what it carries (the caller's value)."""

    key: str
    value: T
    segments: tuple[str, ...] = attrs.field(init=False)

    @segments.default
    def _split(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    @property
    def literals(self) -> int:
        """How specific the key is: its number of literal (non-``*``) segments."""
        return sum(s != WILDCARD for s in self.segments)

    @property
    def exact(self) -> bool:
        """Whether the key names one FQN (no ``*``)."""
        return WILDCARD not in self.segments


class Matcher(Generic[T]):
    """The most specific rules for each FQN, and which rules matched nothing."""

    def __init__(self, rules: Iterable[Rule[T]]) -> None:
        self._rules: list[Rule[T]] = list(rules)
        self._used = [False] * len(self._rules)
        self._exact: dict[str, list[int]] = {}
        # Patterns by segment count: (segments, index); per position the literals named.
        self._patterns: dict[int, list[tuple[tuple[str, ...], int]]] = {}
        literals: dict[int, list[set[str]]] = {}
        for i, rule in enumerate(self._rules):
            if rule.exact:
                self._exact.setdefault(rule.key, []).append(i)
                continue
            n = len(rule.segments)
            self._patterns.setdefault(n, []).append((rule.segments, i))
            names = literals.setdefault(n, [set() for _ in range(n)])
            for position, segment in enumerate(rule.segments):
                if segment != WILDCARD:
                    names[position].add(segment)
        # Per segment count, only the positions some pattern names a literal at matter.
        self._positions: dict[int, list[tuple[int, set[str]]]] = {
            n: [(i, known) for i, known in enumerate(names) if known]
            for n, names in literals.items()
        }
        self._unused_patterns = sum(not r.exact for r in self._rules)
        self._by_signature: dict[tuple[int, tuple[str | None, ...]], tuple[int, ...]] = {}
        # The segments at those positions, picked at C speed: FQNs equal there have one
        # signature, so the answer is found by them first (bounded: they are raw input).
        self._pick: dict[int, Callable[[list[str]], object]] = {
            n: itemgetter(*[i for i, _ in positions]) if positions else _nothing
            for n, positions in self._positions.items()
        }
        self._by_picked: dict[tuple[int, object], tuple[int, ...]] = {}
        # Positions no pattern of any length names a literal at (the layer index of
        # layers.*.mlp): an FQN split only up to the last of them is told apart by its
        # other leading segments and the rest, whatever its length.
        longest = max((len(segments) for segments, _ in self._by_length()), default=0)
        free = [
            p
            for p in range(longest)
            if all(p >= len(seg) or seg[p] == WILDCARD for seg, _ in self._by_length())
        ]
        self._split_at = free[-1] + 1 if free else 0
        kept = [p for p in range(self._split_at) if p not in free]
        self._head: Callable[[list[str]], object] = itemgetter(*kept, self._split_at)
        self._by_head: dict[object, tuple[int, ...]] = {}

    def answers(self) -> set[tuple[int, ...]]:
        """Every distinct answer ``match`` and ``match_all`` can have given so far (``()``,
        each exact key's, and each pattern signature's)."""
        found = {(), *self._by_signature.values()}
        found.update(map(tuple, self._exact.values()))
        return found

    def rule(self, index: int) -> Rule[T]:
        """The rule at ``index``, as ``match`` returns them."""
        return self._rules[index]

    def match(self, fqn: str) -> tuple[int, ...]:
        """The indices of the matching rules of the highest specificity (several on a
        tie), or ``()``. Equal answers are one tuple object."""
        exact = self._exact.get(fqn)
        if exact is None:
            return self._patterns_for(fqn)
        if self._unused_patterns:
            self._patterns_for(fqn)  # only to mark the patterns it also matches
        for i in exact:
            self._used[i] = True
        return tuple(exact)

    def _by_length(self) -> Iterator[tuple[tuple[str, ...], int]]:
        for patterns in self._patterns.values():
            yield from patterns

    def match_all(self, fqns: Iterable[str]) -> list[tuple[int, ...]]:
        """``match`` of each FQN, in order: one loop, an FQN a pattern decided before
        costs a split and a dict lookup (and a lookup among the exact keys only when one
        is as long as it)."""
        out: list[tuple[int, ...]] = []
        append, exact, match = out.append, self._exact, self.match
        split_at, head, by_head = self._split_at, self._head, self._by_head
        get = by_head.get
        # An FQN split into more than split_at parts is no exact key shorter than that.
        long_exact = any(key.count(".") >= split_at for key in exact)
        for fqn in fqns:
            if split_at:
                parts = fqn.split(".", split_at)
                if len(parts) > split_at and not (long_exact and fqn in exact):
                    key = head(parts)
                    found = get(key)
                    if found is None:
                        found = self._patterns_for(fqn)
                        if len(by_head) < _MAX_PICKED:
                            by_head[key] = found
                    append(found)
                    continue
            append(match(fqn))
        return out

    def best(self, fqn: str) -> tuple[Rule[T], ...]:
        """The matching rules of the highest specificity (several on a tie), or ``()``."""
        return tuple(self._rules[i] for i in self.match(fqn))

    def unused(self) -> list[Rule[T]]:
        """The rules that matched no FQN given to ``best`` so far, in rule order."""
        return [r for r, used in zip(self._rules, self._used, strict=True) if not used]

    def _patterns_for(self, fqn: str) -> tuple[int, ...]:
        segments = fqn.split(".")
        n = len(segments)
        pick = self._pick.get(n)
        if pick is None:
            return ()
        picked = (n, pick(segments))
        found = self._by_picked.get(picked)
        if found is None:
            positions = self._positions[n]
            signature = (
                n,
                tuple([segments[i] if segments[i] in known else None for i, known in positions]),
            )
            found = self._by_signature.get(signature)
            if found is None:
                found = self._by_signature[signature] = self._match(segments)
            if len(self._by_picked) < _MAX_PICKED:
                self._by_picked[picked] = found
        return found

    def _match(self, segments: Sequence[str]) -> tuple[int, ...]:
        matches = [
            i
            for pattern, i in self._patterns[len(segments)]
            if all(p in (WILDCARD, s) for p, s in zip(pattern, segments, strict=True))
        ]
        for i in matches:
            if not self._used[i]:
                self._used[i] = True
                self._unused_patterns -= 1
        if not matches:
            return ()
        top = max(self._rules[i].literals for i in matches)
        return tuple(i for i in matches if self._rules[i].literals == top)
