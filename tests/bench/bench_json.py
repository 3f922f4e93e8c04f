"""``to_json`` + ``from_json`` against stdlib ``json`` on the same document, in one process.

The table comes from the MoE plan; the stdlib side dumps and loads the very document
``converter.unstructure(table)`` gives (its fingerprint included, computed beforehand),
with no checks; ours writes the document, fingerprint and all, and reads it back
strictly, checking the fingerprint (the report shows what computing the fingerprint
twice adds to the ratio). Best of several runs, interleaved, the garbage collector off
for both sides, at three scales: the ratio is the target at the middle one, the
per-entry growth from the first to the last is held to the stdlib's own. The peak memory
of ``from_json`` against ``json.loads`` of the same text is traced with ``tracemalloc``
at the middle scale, and shown. Run alone with ``python -m tests.bench.bench_json
[--quick]``.
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

    best = dict.fromkeys(("to_json", "from_json", "fingerprint", "dumps", "loads"), float("inf"))
    for _ in range(repeats):  # interleaved, so both sides see the same machine
        best["dumps"] = min(best["dumps"], timed(lambda: json.dumps(doc)))
        best["loads"] = min(best["loads"], timed(lambda: json.loads(plain)))
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
    first, middle, last = sizes = [scale for scale, _ in measured]
    text = measured[1][1]
    ours_peak = peak(lambda: from_json(text))
    stdlib_peak = peak(lambda: json.loads(text))
    growth = (last.ours / last.entries) / (first.ours / first.entries)
    stdlib_growth = (last.stdlib / last.entries) / (first.stdlib / first.entries)
    record(
        f"to_json + from_json / json.dumps + json.loads, N={middle.entries:,}",
        middle.ratio,
        RATIO_TARGET,
    )
    record("per-entry growth, JSON round trip", growth, stdlib_growth, "target: the stdlib's own")

    def side_growth(side: str) -> float:
        at_last: float = getattr(last, side)
        at_first: float = getattr(first, side)
        return (at_last / last.entries) / (at_first / first.entries)

    def each(fmt: str) -> list[str]:
        return [fmt.format(s) for s in sizes]

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
            *(
                f"{s.ratio:.2f}" + (f" {verdict(s.ratio, RATIO_TARGET)}" if s is middle else "")
                for s in sizes
            ),
        ),
        (
            "  of which the fingerprint, written and checked",
            "",
            *each("{0.fingerprint_share:.2f}"),
        ),
        (
            "  peak, from_json / json.loads",
            "",
            "",
            f"{ours_peak / 2**20:.0f} / {stdlib_peak / 2**20:.0f} MB",
            "",
        ),
        (
            "  per-entry growth, first to last",
            f"<= {stdlib_growth:.2f}",
            "",
            "",
            f"{growth:.2f} {verdict(growth, stdlib_growth)}",
        ),
        (  # where the growth is: each side beside the stdlib's same side
            "    of from_json / of json.loads",
            "",
            "",
            "",
            f"{side_growth('from_json'):.2f} / {side_growth('loads'):.2f}",
        ),
        (
            "    of to_json / of json.dumps",
            "",
            "",
            "",
            f"{side_growth('to_json'):.2f} / {side_growth('dumps'):.2f}",
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
