"""What an install gives a planner outside the repository: every module, and its types.

A planner's own ``mypy --strict`` must see the package (``py.typed``) wherever it runs,
as ``make`` installs it (an editable install as a plain path entry) and as a wheel
installs it (every subpackage, the command line's included).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent

PLANNER: Final = """
from layout_algebra import Mesh, Shard, SourceLayout
from layout_algebra.cli import main

def layout() -> SourceLayout:
    return SourceLayout("dense", ["tp"], [Shard(0)])

mesh: Mesh = Mesh({"tp": 2})
exit_code: int = main(["show", "t.json"])
"""


def mypy(where: Path, source: str) -> subprocess.CompletedProcess[str]:
    (where / "planner.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in {"MYPYPATH", "PYTHONPATH"}}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "planner.py"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_mypy_outside_the_repository_sees_the_packages_types(tmp_path: Path) -> None:
    done = mypy(tmp_path, PLANNER)
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = mypy(tmp_path, PLANNER + "count: str = layout().placements\n")
    assert wrong.returncode == 1
    assert 'incompatible types in assignment (expression has type "tuple[' in wrong.stdout.lower()


def test_a_wheel_holds_every_module_and_py_typed(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        check=True,
    )
    (wheel,) = tmp_path.glob("layout_algebra-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "layout_algebra").rglob("*.py")}
    assert modules - names == set()
    assert "layout_algebra/py.typed" in names
