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

Each signature's answer is kept for the matcher's life (FQNs of one signature are
many, signatures few). A signature's answer is found in a trie of the patterns of its
length (one branch per literal segment, one for ``*``), so thousands of keys that each
name their own literal (``experts.{i}.*``) cost a walk down the segments, not a test of every key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Generic, TypeVar

import attrs

__all__ = ["WILDCARD", "Matcher", "Rule", "is_pattern"]

T = TypeVar("T")

WILDCARD: Final = "*"
"""The segment that matches any one segment."""


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


class _Node:
    """A trie node over pattern segments: a child per literal, one for ``*``, and the
    indices of the patterns that end here."""

    __slots__ = ("ends", "literal", "star")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.ends: list[int] = []

    def add(self, segments: Sequence[str], index: int) -> None:
        node = self
        for segment in segments:
            if segment == WILDCARD:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            else:
                child = node.literal.get(segment)
                if child is None:
                    child = node.literal[segment] = _Node()
                node = child
        node.ends.append(index)

    def matches(self, segments: Sequence[str]) -> list[tuple[int, int]]:
        """``(literal segments, index)`` of every pattern below this node matching
        ``segments`` (as long as the patterns): each branch the segments can take, once."""
        found: list[tuple[int, int]] = []
        depth_end = len(segments)
        stack: list[tuple[_Node, int, int]] = [(self, 0, 0)]
        while stack:
            node, depth, literals = stack.pop()
            if depth == depth_end:
                found.extend((literals, i) for i in node.ends)
                continue
            child = node.literal.get(segments[depth])
            if child is not None:
                stack.append((child, depth + 1, literals + 1))
            if node.star is not None:
                stack.append((node.star, depth + 1, literals))
        return found


class Matcher(Generic[T]):
    """The most specific rules for each FQN, and which rules matched nothing."""

    def __init__(self, rules: Iterable[Rule[T]]) -> None:
        self._rules: list[Rule[T]] = list(rules)
        self._used = [False] * len(self._rules)
        self._exact: dict[str, list[int]] = {}
        # Patterns by segment count, in a trie each; per position the literals named.
        self._tries: dict[int, _Node] = {}
        literals: dict[int, list[set[str]]] = {}
        for i, rule in enumerate(self._rules):
            if rule.exact:
                self._exact.setdefault(rule.key, []).append(i)
                continue
            n = len(rule.segments)
            trie = self._tries.get(n)
            if trie is None:
                trie = self._tries[n] = _Node()
            trie.add(rule.segments, i)
            names = literals.get(n)
            if names is None:
                names = literals[n] = [set() for _ in range(n)]
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
        self._every_by_signature: dict[tuple[int, tuple[str | None, ...]], tuple[int, ...]] = {}
        self._lengths = sorted({len(r.segments) for r in self._rules})
        self._length_set = frozenset(self._lengths)

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
        # The patterns an exact key's FQN also matches are marked by ``unused``: only
        # those no other FQN matched are looked for then.
        for i in exact:
            self._used[i] = True
        return tuple(exact)

    def match_all(self, fqns: Iterable[str]) -> list[tuple[int, ...]]:
        """``match`` of each FQN, in order."""
        return list(map(self.match, fqns))

    def best(self, fqn: str) -> tuple[Rule[T], ...]:
        """The matching rules of the highest specificity (several on a tie), or ``()``."""
        return tuple(self._rules[i] for i in self.match(fqn))

    def unused(self) -> list[Rule[T]]:
        """The rules that matched no FQN given to ``match`` so far, in rule order."""
        used = self._used
        for key, exact in self._exact.items():
            if not self._unused_patterns:
                break
            if used[exact[0]]:  # an FQN given: the patterns it matches are used
                segments = key.split(".")
                trie = self._tries.get(len(segments))
                if trie is not None:
                    self._mark(trie.matches(segments))
        return [r for r, is_used in zip(self._rules, used, strict=True) if not is_used]

    def prefixes(self, fqn: str, *, whole: bool = True) -> list[tuple[int, tuple[int, ...]]]:
        """Every dotted prefix of ``fqn`` some key names, shortest first: its number of
        segments and the indices of *every* key naming it (not only the most specific).

        ``layers.3.mlp.w`` under the keys ``layers.*`` and ``layers.*.mlp`` gives
        ``[(2, (0,)), (3, (1,))]``. ``whole=False`` leaves ``fqn`` itself out (keys that
        name modules never name a parameter). Like ``match``, each answer is worked out
        once per signature of the prefix, and the keys found are marked used.
        """
        segments = fqn.split(".")
        longest = len(segments) if whole else len(segments) - 1
        out: list[tuple[int, tuple[int, ...]]] = []
        for n in self._lengths:
            if n > longest:
                break
            found = self._every(segments, n)
            if found:
                out.append((n, found))
        return out

    def every(self, fqn: str) -> tuple[int, ...]:
        """The indices of *every* key naming ``fqn`` itself (not only the most specific),
        in key order; ``()`` when none does. Worked out once per signature, and the keys
        found are marked used."""
        n = fqn.count(".") + 1
        if n not in self._length_set:  # no key of its length: nothing to split
            return ()
        return self._every(fqn.split("."), n)

    def _every(self, segments: Sequence[str], n: int) -> tuple[int, ...]:
        """The indices of every key naming the first ``n`` of ``segments``."""
        exact = self._exact.get(".".join(segments[:n]))
        if exact is not None:
            for i in exact:
                self._used[i] = True
        positions = self._positions.get(n)
        found: tuple[int, ...] = ()
        if positions is not None:
            signature = (
                n,
                tuple([segments[i] if segments[i] in known else None for i, known in positions]),
            )
            cached = self._every_by_signature.get(signature)
            if cached is None:
                matches = self._tries[n].matches(segments[:n])
                self._mark(matches)
                cached = self._every_by_signature[signature] = tuple(sorted(i for _, i in matches))
            found = cached
        return found if exact is None else tuple(sorted((*exact, *found)))

    def _patterns_for(self, fqn: str) -> tuple[int, ...]:
        segments = fqn.split(".")
        n = len(segments)
        positions = self._positions.get(n)
        if positions is None:
            return ()
        signature = (
            n,
            tuple([segments[i] if segments[i] in known else None for i, known in positions]),
        )
        found = self._by_signature.get(signature)
        if found is None:
            found = self._by_signature[signature] = self._match(segments)
        return found

    def _mark(self, matches: Iterable[tuple[int, int]]) -> None:
        """Mark the patterns of ``matches`` (``(literals, index)``) used."""
        used = self._used
        for _, i in matches:
            if not used[i]:
                used[i] = True
                self._unused_patterns -= 1

    def _match(self, segments: Sequence[str]) -> tuple[int, ...]:
        matches = self._tries[len(segments)].matches(segments)
        self._mark(matches)
        if not matches:
            return ()
        top = max(literals for literals, _ in matches)
        return tuple(sorted(i for literals, i in matches if literals == top))
