"""How messages and reports show what they were given: bounded quotes, one "did you
mean", escaped names, aligned columns, bytes, lists of problems and runs of ranks.

Every message of the package that shows an input value goes through ``quote`` (its
``repr``, at most a few hundred characters) or ``clip`` (a name shown as it is), so a
50 MB string in a document gives a message of a few hundred characters, and a value
whose ``repr`` fails or is unbounded (a 5,000-digit int) still gives a message. Every
report spells bytes with ``human_bytes``, lists problems with ``listed`` (line by line) or
``some_of`` (inside a sentence) and names ranks with ``ranks_text``, so they read alike at 8
ranks and at 16,384; ``alike_lines`` makes one line of a message repeated in every layer.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, TypeAlias, TypeVar

__all__ = [
    "MAX_INLINE",
    "MAX_LISTED",
    "MAX_QUOTED",
    "alike_lines",
    "clip",
    "columns",
    "did_you_mean",
    "escape",
    "exact_bytes",
    "human_bytes",
    "label",
    "listed",
    "quote",
    "rank_groups",
    "ranks_str",
    "ranks_text",
    "some_of",
    "suggest",
]

MAX_QUOTED: Final = 200
"""At most this many characters of any one input value appear in a message."""

MAX_LISTED: Final = 50
"""How many problems (or other items) a report or a message spells out; the value that
carries them holds them all."""

MAX_INLINE: Final = 5
"""How many items a list inside a one-line message spells out (``some_of``)."""

_MAX_RANK_RUNS: Final = 12
"""How many runs of ranks a message spells out."""

_MAX_LAYER_DIGITS: Final = 9
"""The longest number ``alike_lines`` reads as a layer's in an FQN."""

_BYTE_UNITS: Final = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_MAX_INT_BITS: Final = 256
_MAX_CANDIDATES: Final = 1000

T = TypeVar("T")


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` as it is when short, else its first ``limit`` characters and its length.

    >>> clip("x" * 300, 10)
    'xxxxxxxxxx... (300 characters)'
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def quote(value: object, limit: int = MAX_QUOTED) -> str:
    """The ``repr`` of ``value`` for a message: at most about ``limit`` characters.

    Strings and bytes are cut before they are quoted (no copy of a huge input is made);
    an int too long to print shows its size; a value whose ``repr`` raises shows its type.
    Lists, tuples, dicts and sets are spelled as ``repr`` spells them but only up to
    ``limit`` characters, so a huge or self-sharing one (``x = [x, x]``, 60 levels deep)
    costs no more than its first ``limit`` characters.

    >>> quote("tp")
    "'tp'"
    >>> quote(10**5000)
    '<an int of 16610 bits>'
    >>> quote({"tp": [1, 2], "ep": (3,)})
    "{'tp': [1, 2], 'ep': (3,)}"
    >>> quote(list(range(10**6)), 12)
    '[0, 1, 2, 3,... (a list of 1000000 items)'
    """
    if isinstance(value, str | bytes):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    base = _container(value)
    if base is None:
        return clip(_leaf(value, limit), limit)
    try:
        text = _walk(value, limit)
        if len(text) <= limit:
            return text
        size = base.__len__(value)
    except Exception:  # a dict changed by a repr it called, say
        return f"<a {type(value).__name__} that cannot be shown>"
    items = "item" if size == 1 else "items"
    return f"{text[:limit]}... (a {type(value).__name__} of {size} {items})"


class _Text(str):
    """Text the walk writes as it is (brackets, separators), not a value to show."""

    __slots__ = ()


def _container(value: object) -> type[Any] | None:
    """The built-in container whose ``repr`` spells ``value`` (a subclass that keeps
    that ``repr`` included), or ``None``."""
    spelled = type(value).__repr__
    for base in (list, tuple, dict, set, frozenset):
        if spelled is base.__repr__:
            return base
    return None


def _leaf(value: object, limit: int) -> str:
    """The ``repr`` of a value that is no container, cut once past ``limit``."""
    if isinstance(value, str | bytes):
        return repr(value if len(value) <= limit else value[: limit + 1])
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        return f"<an int of {value.bit_length()} bits>"
    try:
        return repr(value)
    except Exception:
        return f"<a {type(value).__name__} that cannot be shown>"


def _items(value: Any, base: type[Any]) -> tuple[str, Iterator[object], str]:
    """How ``repr`` opens and closes a container, and what it shows in between: values
    and ``_Text`` separators, read through the built-in type (a subclass's ``__iter__``
    is not what ``repr`` reads)."""
    if base is dict:
        body = (
            x
            for i, (k, v) in enumerate(dict.items(value))
            for x in ((_Text(", "),) if i else ()) + (k, _Text(": "), v)
        )
        return "{", body, "}"
    items = _separated(base.__iter__(value))
    if base is list:
        return "[", items, "]"
    if base is tuple:
        return "(", items, ",)" if tuple.__len__(value) == 1 else ")"
    name = type(value).__name__  # a set: {1, 2}, frozenset({1, 2}), set(), frozenset()
    if not base.__len__(value):
        return f"{name}(", items, ")"
    if type(value) is set:
        return "{", items, "}"
    return f"{name}({{", items, "})"


def _separated(values: Iterator[object]) -> Iterator[object]:
    for i, v in enumerate(values):
        if i:
            yield _Text(", ")
        yield v


def _walk(value: object, limit: int) -> str:
    """``repr(value)`` for a container, up to a character or two past ``limit``.

    The walk keeps its own stack (a value nested 100,000 deep is no ``RecursionError``)
    and stops once past ``limit``, so it visits at most that many values however often
    one is shared; a container met inside itself is ``[...]``, as in ``repr``.
    """
    pieces: list[str] = []
    size = 0
    stack: list[tuple[Iterator[object], str, int]] = []
    active: set[int] = set()
    item: object = value
    while True:
        base = _container(item)
        if isinstance(item, _Text):
            piece = str(item)
        elif base is None:
            piece = _leaf(item, limit)
        elif (ident := id(item)) in active:  # value holds every container on the stack
            piece = _WITHIN_ITSELF[base]
        else:
            piece, body, close = _items(item, base)
            stack.append((body, close, ident))
            active.add(ident)
        pieces.append(piece[: limit + 1 - size])
        size += len(pieces[-1])
        # close the containers whose items are all shown, up to the next item to show
        while size <= limit and stack:
            body, close, ident = stack[-1]
            item = next(body, _DONE)
            if item is not _DONE:
                break
            stack.pop()
            active.discard(ident)
            pieces.append(close)
            size += len(close)
        else:
            return "".join(pieces)


_DONE: Final = object()
_WITHIN_ITSELF: Final[dict[type[Any], str]] = {
    list: "[...]",
    tuple: "(...)",
    dict: "{...}",
    set: "{...}",
    frozenset: "{...}",
}


def label(value: object) -> str:
    """The name of an argument for a message: as given when it is text (``clip``), else
    its ``quote``, so a label of any type or size still gives a bounded message."""
    return clip(value) if isinstance(value, str) else quote(value)


def suggest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (a typo's likely intent), or ``None``.

    >>> suggest("tpp", ["dp_shard", "tp", "ep"])
    'tp'
    """
    pool = [c for _, c in zip(range(_MAX_CANDIDATES), candidates, strict=False) if c != word]
    found = difflib.get_close_matches(word[:MAX_QUOTED], pool, n=1, cutoff=0.5)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'tp'?)"`` for the closest candidate, or ``""`` when none is close."""
    found = suggest(word, candidates)
    return f" (did you mean {quote(found)}?)" if found is not None else ""


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as lines of left-aligned columns two spaces apart, right-stripped."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def escape(text: str, encoding: str | None = None) -> str:
    """``text`` with every character that is not printable escaped, as ``repr`` spells it.

    Control characters, line breaks and lone surrogates in an FQN would otherwise move
    the cursor, split a line or fail to encode: ``"a\\nb"`` is shown as ``a\\nb``. With
    ``encoding`` (the terminal's), a printable character it cannot write is escaped too,
    as the terminal's stream would write it (``\\xe9`` for ``é`` in ASCII), so a column
    of escaped names is as wide as it is counted.

    >>> print(escape("layers.0\\x1b[2J.w"))
    layers.0\\x1b[2J.w
    >>> print(escape("caf\\u00e9.w", "ascii"))
    caf\\xe9.w
    """
    shown = (
        text
        if text.isprintable()
        else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    )
    if encoding is None or shown.isascii():
        return shown
    try:
        return shown.encode(encoding, "backslashreplace").decode(encoding)
    except (LookupError, UnicodeError):  # an encoding Python does not know, or not text
        return shown


def human_bytes(n: int) -> str:
    """``n`` bytes for a person, the one spelling of every report: exact below 1 KiB,
    else two decimals in the largest binary unit that keeps the figure below 1024.

    >>> human_bytes(12), human_bytes(1536), human_bytes(3 * 2**50)
    ('12 B', '1.50 KiB', '3.00 PiB')
    """
    if n < 1024:
        return f"{n} B"
    value = float(n)
    unit = _BYTE_UNITS[0]
    for unit in _BYTE_UNITS:  # noqa: B007  # the unit the loop stops at is the one shown
        value /= 1024
        if round(value, 2) < 1024:
            break
    return f"{value:.2f} {unit}"


def exact_bytes(n: int) -> str:
    """``human_bytes(n)`` with the exact count beside it once they differ.

    >>> exact_bytes(1572864), exact_bytes(12)
    ('1.50 MiB (1,572,864 B)', '12 B')
    """
    shown = human_bytes(n)
    return shown if n < 1024 else f"{shown} ({n:,} B)"


def listed(items: Sequence[str], limit: int = MAX_LISTED, *, where: str = "") -> list[str]:
    """The one problem list of every report and message: ``  - item`` lines, the first
    ``limit`` of them, then ``  ... and N more`` (and ``where`` to find them all).

    >>> listed(["a", "b", "c"], 2, where="see .problems")
    ['  - a', '  - b', '  ... and 1 more (see .problems)']
    """
    lines = [f"  - {item}" for item in items[:limit]]
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more" + (f" ({where})" if where else ""))
    return lines


def some_of(
    names: Sequence[str], limit: int = MAX_INLINE, *, show: Callable[[str], str] = clip
) -> str:
    """The one list inside a sentence: the first ``limit`` of ``names``, comma-separated,
    each shown by ``show`` (``clip``: as it is; ``quote`` where the message quotes), then
    ``and N more`` for the rest.

    >>> some_of(["a", "b", "c", "d"], 2, show=quote), some_of(["3", "8"])
    ("'a', 'b' and 2 more", '3, 8')
    """
    return ", ".join(map(show, names[:limit])) + _and_more(len(names) - limit)


def _and_more(rest: int) -> str:
    """The tail of an inline list that leaves ``rest`` items out: `` and 2 more``, or ``""``."""
    return f" and {rest} more" if rest > 0 else ""


def rank_groups(rows: Sequence[T]) -> list[tuple[range, T]]:
    """Consecutive ranks with equal rows, as ``(ranks, row)``.

    >>> rank_groups([5, 5, 7])
    [(range(0, 2), 5), (range(2, 3), 7)]
    """
    out: list[tuple[range, T]] = []
    for rank, row in enumerate(rows):
        if out and out[-1][1] == row:
            out[-1] = (range(out[-1][0].start, rank + 1), row)
        else:
            out.append((range(rank, rank + 1), row))
    return out


def ranks_str(ranks: range) -> str:
    """A run of ranks: ``3`` or ``0-1023``."""
    return str(ranks.start) if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}"


def ranks_text(ranks: Sequence[int]) -> str:
    """Ascending ranks for a message, runs of consecutive ranks as ranges.

    >>> ranks_text([0, 1, 2, 3, 8]), ranks_text([5])
    ('ranks 0-3, 8', 'rank 5')
    """
    return f"rank{'s' if len(ranks) != 1 else ''} {_runs_text(ranks)}"


def _runs_text(numbers: Sequence[int]) -> str:
    """Ascending numbers, runs of consecutive ones as ranges: ``0-3, 8``."""
    runs: list[range] = []
    for n in numbers:
        if runs and runs[-1].stop == n:
            runs[-1] = range(runs[-1].start, n + 1)
        else:
            runs.append(range(n, n + 1))
    # the tail counts numbers, not runs, so it is ``some_of``'s wording on its own count
    shown = ", ".join(ranks_str(r) for r in runs[:_MAX_RANK_RUNS])
    return shown + _and_more(sum(map(len, runs[_MAX_RANK_RUNS:])))


_Alike: TypeAlias = tuple[str, str, str]
"""A message's FQN before its first number, after it, and the message's text after the FQN."""


def _numbered(fqn: str, message: str) -> tuple[_Alike, int] | None:
    """What ``message`` says with its FQN's first number taken out, and that number;
    ``None`` when the FQN holds none or the message does not start with it."""
    if not message.startswith(f"{fqn}: "):
        return None
    segments = fqn.split(".")
    for i, segment in enumerate(segments):
        # one spelling per number, so every FQN of a group is spelled back as it was; a
        # layer's number is short (and int() of thousands of digits refuses)
        short = 0 < len(segment) <= _MAX_LAYER_DIGITS and segment.isascii()
        if short and segment.isdecimal() and str(int(segment)) == segment:
            before = "".join(f"{s}." for s in segments[:i])
            after = "".join(f".{s}" for s in segments[i + 1 :])
            return (before, after, message[len(fqn) + 2 :]), int(segment)
    return None


def alike_lines(items: Iterable[tuple[str, str]]) -> list[str]:
    """Messages about FQNs, ``(fqn, message)`` with the message starting ``fqn: ``, those
    that differ only in the FQN's first number (a layer's, in every model the package
    reads) as one line naming the pattern, how many and which; the others as they are,
    in the order of each one's first message.

    >>> alike_lines([(f"layers.{i}.wk", f"layers.{i}.wk: cut") for i in (0, 1, 2, 5)])
    ['layers.*.wk in 4 layers (0-2, 5): cut']
    >>> alike_lines([("layers.0.wk", "layers.0.wk: cut"), ("head", "head: odd")])
    ['layers.0.wk: cut', 'head: odd']
    """
    order: list[str | _Alike] = []
    groups: dict[_Alike, list[int]] = {}
    for fqn, message in items:
        found = _numbered(fqn, message)
        if found is None:
            order.append(message)
            continue
        key, number = found
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(number)
    lines: list[str] = []
    for entry in order:
        if isinstance(entry, str):
            lines.append(entry)
            continue
        before, after, text = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:  # one layer (or one message said twice): as it was
            lines.extend(f"{before}{n}{after}: {text}" for n in groups[entry])
            continue
        # the budget message's "and 31 alike", here with the layers named
        what = "experts" if before.endswith("experts.") else "layers"
        lines.append(f"{before}*{after} in {len(numbers):,} {what} ({_runs_text(numbers)}): {text}")
    return lines
