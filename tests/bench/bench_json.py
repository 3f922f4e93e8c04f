"""``to_json`` + ``from_json`` against stdlib ``json`` on the same document, in one process.

The table comes from the MoE plan; the stdlib side dumps and loads the very document
``converter.unstructure(table)`` gives, with no checks. Best of several runs, the
garbage collector off for both sides, at two scales (the per-entry growth from the small
to the large one, the stdlib's own beside it); the peak memory of ``from_json`` against
``json.loads`` of the same text is traced with ``tracemalloc`` at the large scale. Run
alone with ``python -m tests.bench.bench_json [--quick]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import attrs

from layout_algebra.algebra import build_table
from layout_algebra.serialization import converter, from_json, to_json
from tests.bench import alone
from tests.bench.baseline import DENSE_AXES, EXPERT_AXES, moe_plan, sharding_plan
from tests.bench.bench_build import timed, verdict
from tests.bench.bench_e2e import peak
from tests.bench.targets import record

__all__ = ["Scale", "main", "measure", "run"]

RATIO_TARGET: Final = 1.0
PEAK_TARGET: Final = 1.2
GROWTH_TARGET: Final = 1.1
SCALES: Final = (100_000, 1_000_000)
QUICK_SCALES: Final = (10_000, 100_000)


@attrs.frozen
class Scale:
    """Best times in seconds of each side at one scale, and the document's sizes."""

    entries: int
    dumps: float
    loads: float
    to_json: float
    from_json: float
    ours_chars: int
    stdlib_chars: int

    @property
    def stdlib(self) -> float:
        return self.dumps + self.loads

    @property
    def ours(self) -> float:
        return self.to_json + self.from_json


def measure(n: int, repeats: int) -> tuple[Scale, str]:
    """Both sides on the table of an ``n``-parameter plan; also our text, for peaks."""
    table = build_table(sharding_plan(moe_plan(n)), DENSE_AXES, expert_axes=EXPERT_AXES)
    doc = converter.unstructure(table)
    text = to_json(table)
    plain = json.dumps(doc)
    assert from_json(text) == table, "to_json/from_json does not round-trip"
    assert json.loads(plain) == doc

    best = dict.fromkeys(("to_json", "from_json", "dumps", "loads"), float("inf"))
    for _ in range(repeats):  # interleaved, so both sides see the same machine
        best["dumps"] = min(best["dumps"], timed(lambda: json.dumps(doc)))
        best["loads"] = min(best["loads"], timed(lambda: json.loads(plain)))
        best["to_json"] = min(best["to_json"], timed(lambda: to_json(table)))
        best["from_json"] = min(best["from_json"], timed(lambda: from_json(text)))
    scale = Scale(len(table), **best, ours_chars=len(text), stdlib_chars=len(plain))
    return scale, text


def run(*, quick: bool = False, repeats: int = 3) -> None:
    """Measure both scales and print the report (its targets go to ``targets.RESULTS``)."""
    small_n, large_n = QUICK_SCALES if quick else SCALES
    small, _ = measure(small_n, repeats)
    large, text = measure(large_n, repeats)
    ours_peak = peak(lambda: from_json(text))
    stdlib_peak = peak(lambda: json.loads(text))
    ratios = (small.ours / small.stdlib, large.ours / large.stdlib)
    growth = (large.ours / large.entries) / (small.ours / small.entries)
    stdlib_growth = (large.stdlib / large.entries) / (small.stdlib / small.entries)
    peak_ratio = ours_peak / stdlib_peak
    record("to_json + from_json / json.dumps + json.loads, large", ratios[1], RATIO_TARGET)
    record("peak of from_json / of json.loads, large", peak_ratio, PEAK_TARGET)
    record(
        "per-entry growth, JSON round trip",
        growth,
        GROWTH_TARGET,
        f"stdlib's own {stdlib_growth:.2f}",
    )

    def pair(a: Scale, b: Scale, fmt: str) -> tuple[str, str]:
        return fmt.format(a), fmt.format(b)

    rows = [
        ("JSON round trip, MoE table", "target", f"N={small.entries:,}", f"N={large.entries:,}"),
        (
            "  stdlib json.dumps + json.loads",
            "",
            *pair(small, large, "{0.dumps:.3f} + {0.loads:.3f} s"),
        ),
        ("  to_json + from_json", "", *pair(small, large, "{0.to_json:.3f} + {0.from_json:.3f} s")),
        (
            "  document size, ours / stdlib",
            "",
            *(
                f"{s.ours_chars / 2**20:.1f} / {s.stdlib_chars / 2**20:.1f} MB"
                for s in (small, large)
            ),
        ),
        (
            "  round-trip ratio",
            f"<= {RATIO_TARGET:.2f}",
            *(f"{r:.2f} {verdict(r, RATIO_TARGET)}" for r in ratios),
        ),
        (
            "  peak, from_json / json.loads",
            f"<= {PEAK_TARGET:.2f}",
            "",
            f"{ours_peak / 2**20:.0f} / {stdlib_peak / 2**20:.0f} MB = {peak_ratio:.2f} "
            f"{verdict(peak_ratio, PEAK_TARGET)}",
        ),
        (
            "  per-entry growth, large/small",
            f"<= {GROWTH_TARGET:.2f}",
            "",
            f"{growth:.2f} {verdict(growth, GROWTH_TARGET)}",
        ),
        ("    the stdlib's own growth", "", "", f"{stdlib_growth:.2f}"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    w0, w1, w2, w3 = widths
    for a, t, s, g in rows:
        print(f"{a:<{w0}}  {t:<{w1}}  {s:>{w2}}  {g:>{w3}}".rstrip())


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_json", __doc__, run, argv, smaller="smaller tables")


if __name__ == "__main__":
    main()
