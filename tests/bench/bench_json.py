"""``to_json`` + ``from_json`` against stdlib ``json`` on the same document, in one process.

The table comes from the MoE plan; the stdlib side dumps and loads the very document
``converter.unstructure(table)`` gives, with no checks. Best of several runs, the
garbage collector off for both sides. Run alone with
``python -m tests.bench.bench_json [--quick]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Final

from layout_algebra.algebra import build_table
from layout_algebra.serialization import converter, from_json, to_json
from tests.bench.baseline import DENSE_AXES, EXPERT_AXES, moe_plan, sharding_plan
from tests.bench.bench_build import timed, verdict

__all__ = ["main", "run"]

RATIO_TARGET: Final = 1.5
ENTRIES: Final = 1_000_000
QUICK_ENTRIES: Final = 100_000


def run(*, quick: bool = False, repeats: int = 3) -> tuple[int, int]:
    """Measure the round trip and print the report; how many targets were met, of how many."""
    n = QUICK_ENTRIES if quick else ENTRIES
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
    stdlib = best["dumps"] + best["loads"]
    ours = best["to_json"] + best["from_json"]
    ratio = ours / stdlib
    rows = [
        (f"JSON round trip, {len(table):,} entries", "target", ""),
        ("  stdlib json.dumps + json.loads", "", f"{best['dumps']:.3f} + {best['loads']:.3f} s"),
        ("  to_json + from_json", "", f"{best['to_json']:.3f} + {best['from_json']:.3f} s"),
        (
            "  document size, ours / stdlib",
            "",
            f"{len(text) / 2**20:.1f} / {len(plain) / 2**20:.1f} MB",
        ),
        (
            "  round-trip ratio",
            f"<= {RATIO_TARGET:.2f}",
            f"{ratio:.2f} {verdict(ratio, RATIO_TARGET)}",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for label, target, value in rows:
        print(f"{label:<{widths[0]}}  {target:<{widths[1]}}  {value:>{widths[2]}}".rstrip())
    return int(ratio <= RATIO_TARGET), 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_json", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a 1e5-entry table, for a smoke run")
    args = parser.parse_args(argv)
    run(quick=args.quick)


if __name__ == "__main__":
    main()
