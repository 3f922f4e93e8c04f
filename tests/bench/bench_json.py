"""``to_json`` + ``from_json`` against stdlib ``json`` on the same document, in one process.

The table comes from the MoE plan; the stdlib side dumps and loads the very document
``converter.unstructure(table)`` gives (its fingerprint included, computed beforehand),
with no checks; ours writes the document, fingerprint and all, and reads it back
strictly, checking the fingerprint (the report shows what computing the fingerprint
twice adds to the ratio). Best of several runs, interleaved, the garbage collector off
for both sides, at three scales; the targets are at the middle one: the round trip, and
each side against its own stdlib side, writing (``to_json`` / ``json.dumps``) and
reading (``from_json`` / ``json.loads``). Beside reading, its floor: what any strict
reader of the format does before it checks an entry, parsing the text with each object
as its pairs (so that a key given twice is seen) and computing the fingerprint it
checks. The peak memory of ``from_json`` against ``json.loads`` of the same text is
traced with ``tracemalloc`` at the middle scale, and shown. Run alone with ``python -m
tests.bench.bench_json [--quick]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import attrs

from layout_algebra.algebra import build_table
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.serialization import converter, from_json, to_json
from tests.bench import alone
from tests.bench.baseline import DENSE_AXES, EXPERT_AXES, moe_plan, sharding_plan
from tests.bench.bench_build import timed, verdict
from tests.bench.bench_e2e import peak
from tests.bench.targets import record

__all__ = ["Scale", "main", "measure", "run"]

RATIO_TARGET: Final = 1.5
"""``to_json`` + ``from_json`` over ``json.dumps`` + ``json.loads``, at the middle scale."""
WRITE_TARGET: Final = 1.0
"""``to_json`` over ``json.dumps``: each distinct layout's text is made once, so writing
the text, fingerprint included, costs no more than dumping every entry's object."""
READ_TARGET: Final = 2.5
"""``from_json`` over ``json.loads``: the same parse (about 1x), the fingerprint computed
and checked, and every entry checked in Python, where ``json.loads`` checks nothing."""
SCALES: Final = (10_000, 100_000, 1_000_000)
QUICK_SCALES: Final = (1_000, 10_000, 100_000)
REPEATS: Final = (7, 5, 3)


@attrs.frozen
class Scale:
    """Best times in seconds of each side at one scale, and the document's sizes."""

    entries: int
    dumps: float
    loads: float
    to_json: float
    from_json: float
    fingerprint: float
    pairs: float
    ours_chars: int
    stdlib_chars: int

    @property
    def stdlib(self) -> float:
        return self.dumps + self.loads

    @property
    def ours(self) -> float:
        return self.to_json + self.from_json

    @property
    def ratio(self) -> float:
        return self.ours / self.stdlib

    @property
    def writing(self) -> float:
        return self.to_json / self.dumps

    @property
    def reading(self) -> float:
        return self.from_json / self.loads

    @property
    def reading_floor(self) -> float:
        """Parsing our text as the reader must (each object as its pairs) and computing
        the fingerprint it checks, over ``json.loads``: what reading costs before any
        entry is checked."""
        return (self.pairs + self.fingerprint) / self.loads

    @property
    def fingerprint_share(self) -> float:
        """What computing the fingerprint twice (to write it, to check it) adds to ``ratio``."""
        return 2 * self.fingerprint / self.stdlib


def measure(n: int, repeats: int) -> tuple[Scale, str]:
    """Both sides on the table of an ``n``-parameter plan; also our text, for peaks."""
    table = build_table(sharding_plan(moe_plan(n)), DENSE_AXES, expert_axes=EXPERT_AXES)
    doc = converter.unstructure(table)
    text = to_json(table)
    plain = json.dumps(doc)
    assert from_json(text) == table, "to_json/from_json does not round-trip"
    assert json.loads(plain) == doc

    sides = ("to_json", "from_json", "fingerprint", "pairs", "dumps", "loads")
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):  # interleaved, so both sides see the same machine
        best["dumps"] = min(best["dumps"], timed(lambda: json.dumps(doc)))
        best["loads"] = min(best["loads"], timed(lambda: json.loads(plain)))
        best["pairs"] = min(best["pairs"], timed(lambda: json.loads(text, object_pairs_hook=tuple)))
        # a new equal table each run: nothing the last run computed about it is reused
        fresh = ParamLayoutTable(table, tied=table.tied, dropped=table.dropped)
        best["to_json"] = min(best["to_json"], timed(lambda: to_json(fresh)))  # noqa: B023
        fresh = ParamLayoutTable(table, tied=table.tied, dropped=table.dropped)
        best["fingerprint"] = min(best["fingerprint"], timed(fresh.fingerprint))
        best["from_json"] = min(best["from_json"], timed(lambda: from_json(text)))
    scale = Scale(len(table), **best, ours_chars=len(text), stdlib_chars=len(plain))
    return scale, text


def run(*, quick: bool = False) -> None:
    """Measure every scale and print the report (its targets go to ``targets.RESULTS``)."""
    scales = QUICK_SCALES if quick else SCALES
    measured = [measure(n, r) for n, r in zip(scales, REPEATS, strict=True)]
    sizes = [scale for scale, _ in measured]
    middle, text = measured[1]
    ours_peak = peak(lambda: from_json(text))
    stdlib_peak = peak(lambda: json.loads(text))
    record(
        f"to_json + from_json / json.dumps + json.loads, N={middle.entries:,}",
        middle.ratio,
        RATIO_TARGET,
    )
    record(f"to_json / json.dumps, N={middle.entries:,}", middle.writing, WRITE_TARGET)
    record(
        f"from_json / json.loads, N={middle.entries:,}",
        middle.reading,
        READ_TARGET,
        f"floor {middle.reading_floor:.2f} (the parse as pairs and the fingerprint)",
    )

    def each(fmt: str) -> list[str]:
        return [fmt.format(s) for s in sizes]

    def marked(value: float, target: float, scale: Scale) -> str:
        return f"{value:.2f}" + (f" {verdict(value, target)}" if scale is middle else "")

    rows = [
        ("JSON round trip, MoE table", "target", *each("N={0.entries:,}")),
        ("  stdlib json.dumps + json.loads", "", *each("{0.dumps:.3f} + {0.loads:.3f} s")),
        ("  to_json + from_json", "", *each("{0.to_json:.3f} + {0.from_json:.3f} s")),
        (
            "  document size, ours / stdlib",
            "",
            *(f"{s.ours_chars / 2**20:.1f} / {s.stdlib_chars / 2**20:.1f} MB" for s in sizes),
        ),
        (
            "  round-trip ratio",
            f"<= {RATIO_TARGET:.2f}",
            *(marked(s.ratio, RATIO_TARGET, s) for s in sizes),
        ),
        (
            "  of which the fingerprint, written and checked",
            "",
            *each("{0.fingerprint_share:.2f}"),
        ),
        (
            "  writing, to_json / json.dumps",
            f"<= {WRITE_TARGET:.2f}",
            *(marked(s.writing, WRITE_TARGET, s) for s in sizes),
        ),
        (
            "  reading, from_json / json.loads",
            f"<= {READ_TARGET:.2f}",
            *(marked(s.reading, READ_TARGET, s) for s in sizes),
        ),
        (
            "    its floor: the parse as pairs + the fingerprint",
            "",
            *each("{0.reading_floor:.2f}"),
        ),
        (
            "  peak, from_json / json.loads",
            "",
            "",
            f"{ours_peak / 2**20:.0f} / {stdlib_peak / 2**20:.0f} MB",
            "",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_json", __doc__, run, argv, smaller="smaller tables")


if __name__ == "__main__":
    main()
