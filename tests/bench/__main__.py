"""Every benchmark, one after the other: ``python -m tests.bench [--quick]``.

Building the table, the JSON round trip, planning a checkpoint reshard, binding a table
to a live model (when ``tests.bench.bench_bind`` is present), then linting a whole table
with its shapes. Each compares against a baseline measured in this same process and
prints its targets with PASS or MISS; ``--quick`` runs smaller scales as a smoke test. The exit status is 0 either way:
timings depend on the machine.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Sequence

from tests.bench import bench_build, bench_json, bench_lint, bench_reshard


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller scales, for a smoke run")
    args = parser.parse_args(argv)

    met, total = bench_build.run(quick=args.quick)
    print()
    json_met, json_total = bench_json.run(quick=args.quick)
    met, total = met + json_met, total + json_total
    print()
    reshard_met, reshard_total = bench_reshard.run(quick=args.quick)
    met, total = met + reshard_met, total + reshard_total
    if importlib.util.find_spec("tests.bench.bench_bind") is not None:
        print()
        importlib.import_module("tests.bench.bench_bind").main()
    print()
    lint_met, lint_total = bench_lint.run(quick=args.quick)
    met, total = met + lint_met, total + lint_total
    print()
    print(f"build, JSON, reshard and lint targets met: {met} of {total}")


if __name__ == "__main__":
    main()
