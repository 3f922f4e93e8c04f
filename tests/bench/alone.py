"""Running one benchmark alone: ``python -m tests.bench.<module> [--quick]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Protocol

__all__ = ["main"]


class Run(Protocol):
    """A benchmark's ``run``: measure and print its report (what it returns is unused)."""

    def __call__(self, *, quick: bool = False) -> object: ...


def main(
    module: str, doc: str | None, run: Run, argv: Sequence[str] | None, *, smaller: str
) -> None:
    """Parse ``argv`` for ``python -m {module}`` (``--quick``: ``smaller``, for a smoke
    run) and run the benchmark."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc)
    parser.add_argument("--quick", action="store_true", help=f"{smaller}, for a smoke run")
    run(quick=parser.parse_args(argv).quick)
