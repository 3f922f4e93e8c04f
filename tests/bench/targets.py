"""The targets every benchmark checks, collected so one run prints them all in one table.

Each benchmark calls ``record`` for every figure that has a target; ``python -m
tests.bench`` prints ``summary()`` at the end: one row per target, its figure, and
PASS or MISS. Timings depend on the machine, so nothing here fails a run.
"""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["RESULTS", "Target", "record", "summary"]


@attrs.frozen
class Target:
    """One measured figure against its target (lower is better), with what it means."""

    measure: str
    value: float
    target: float
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.target


RESULTS: Final[list[Target]] = []
"""Every target recorded in this process, in the order the benchmarks ran."""


def record(measure: str, value: float, target: float, note: str = "") -> bool:
    """Keep ``value`` against ``target`` for the summary; whether it is met."""
    entry = Target(measure, value, target, note)
    RESULTS.append(entry)
    return entry.met


def summary(results: list[Target] | None = None) -> str:
    """Every recorded target as an aligned table, and how many were met."""
    rows = RESULTS if results is None else results
    lines = [("measure", "target", "figure", "", "")]
    lines.extend(
        (
            r.measure,
            f"<= {r.target:.2f}",
            f"{r.value:.2f}",
            "PASS" if r.met else "MISS",
            r.note,
        )
        for r in rows
    )
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    text = [
        f"{m:<{widths[0]}}  {t:<{widths[1]}}  {v:>{widths[2]}}  {ok:<{widths[3]}}  {note}".rstrip()
        for m, t, v, ok, note in lines
    ]
    met = sum(r.met for r in rows)
    text.append(f"targets met: {met} of {len(rows)}")
    return "\n".join(text)
