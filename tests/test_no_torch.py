"""Without torch: the core, serialization and the command line work; the bridge says why not.

torch is an optional dependency (``layout_algebra[torch]``). Each test runs a fresh
interpreter in which torch cannot be imported: a ``sitecustomize`` on ``PYTHONPATH`` puts
a finder first on ``sys.meta_path`` that refuses ``torch`` and every ``torch.*`` module,
exactly as a Python without torch installed would (``ModuleNotFoundError``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pytest

from layout_algebra import ModulePlan, ParamLayoutTable, ParamShape, Replicate, Shard, ShardingPlan
from layout_algebra import SourceLayout as L
from layout_algebra.cli import main
from layout_algebra.serialization import plan_to_json, shapes_to_json, to_json

ROOT: Final = Path(__file__).resolve().parent.parent

_SITECUSTOMIZE: Final = '''
import sys

class _NoTorch:
    """Refuses torch and its submodules, as an interpreter without torch installed does."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
'''


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter that cannot import torch."""
    site = tmp_path_factory.mktemp("no_torch")
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site), str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def run(env: dict[str, str], args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_code(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return run(env, ["-c", textwrap.dedent(code)])


def test_torch_is_unimportable(no_torch_env: dict[str, str]) -> None:
    # the premise of every other test here: the finder is in place
    result = run_code(
        no_torch_env,
        """
        try:
            import torch
        except ModuleNotFoundError as e:
            print("refused", e.name)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused torch"


def test_core_and_serialization_work(no_torch_env: dict[str, str]) -> None:
    result = run_code(
        no_torch_env,
        """
        import importlib, pkgutil, sys
        import layout_algebra
        from layout_algebra import (
            ModulePlan, ParamLayoutTable, Shard, ShardingPlan, SourceLayout, build_table,
            compose_fsdp, local_shape_and_offset,
        )
        from layout_algebra.serialization import from_json, plan_from_json, plan_to_json, to_json

        # every module outside the bridge (and the demo, which is torch by nature) imports
        # (and __main__, which runs the command line)
        skipped = ("layout_algebra.torch_bridge", "layout_algebra._demo", "layout_algebra.__main__")
        for info in pkgutil.walk_packages(layout_algebra.__path__, "layout_algebra."):
            if not info.name.startswith(skipped):
                importlib.import_module(info.name)

        plan = ShardingPlan(
            {"layers.0.wq": ModulePlan({"weight": {"tp": Shard(0)}})},
            mesh_axes=("dp_shard", "tp"),
        )
        assert plan_from_json(plan_to_json(plan)) == plan
        table = build_table(plan, ("dp_shard", "tp"))
        assert from_json(to_json(table)) == table
        sizes = {"dp_shard": 2, "tp": 4}
        composed = compose_fsdp(
            table["layers.0.wq.weight"], shard_axis="dp_shard", mesh_sizes=sizes
        )
        shape, offset = local_shape_and_offset((10, 4), composed, sizes, {"dp_shard": 1, "tp": 3})
        print(str(table["layers.0.wq.weight"]), str(composed), shape, offset)
        assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "dense[tp=S(0)]"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    s0, r = Shard(0), Replicate()
    a = ParamLayoutTable(
        {
            "emb.weight": L("dense", ["tp"], [s0]),
            "head.weight": L("dense", ["tp"], [s0]),
            "norm.weight": L("dense", ["tp"], [r]),
        },
        tied=[{"emb.weight", "head.weight"}],
    )
    b = ParamLayoutTable({**a, "norm.weight": L("dense", ["tp"], [s0])}, tied=a.tied)
    plan = ShardingPlan(
        {"emb": ModulePlan({"weight": {"tp": s0}}), "norm": ModulePlan({"weight": {"tp": r}})},
        mesh_axes=("dp_shard", "tp"),
    )
    shapes = shapes_to_json(
        {
            "emb.weight": ParamShape((10, 4), "bfloat16"),
            "head.weight": ParamShape((10, 4), "bfloat16"),
            "norm.weight": ParamShape((4,), "float32"),
        }
    )
    out = {}
    documents = (
        ("a", to_json(a)),
        ("b", to_json(b)),
        ("plan", plan_to_json(plan)),
        ("shapes", shapes),
    )
    for name, text in documents:
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        out[name] = str(path)
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "{a}"),
        ("diff", "{a}", "{a}"),
        ("diff", "{a}", "{b}"),
        ("check", "{plan}", "--mesh", "dp_shard=2,tp=4"),
        ("check", "{plan}", "--mesh", "dp_shard=2,tpp=4"),
        ("show", "{plan}"),
        (
            "draw",
            "{a}",
            "emb.weight",
            "--shape",
            "10,4",
            "--mesh",
            "dp_shard=2,tp=2",
            "--fsdp",
            "dp_shard",
        ),
        (
            "lint",
            "{plan}",
            "--shapes",
            "{shapes}",
            "--mesh",
            "dp_shard=2,tp=2",
            "--fsdp",
            "dp_shard",
        ),
        ("reshard", "{a}", "{b}", "--shapes", "{shapes}", "--mesh", "tp=2", "--to-mesh", "tp=4"),
    ],
)
def test_cli_works(
    no_torch_env: dict[str, str],
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
) -> None:
    # the same command in this process, where torch is importable, is the reference:
    # without torch the command line prints the same and exits the same
    args = [a.format(**files) for a in argv]
    code = main(args)
    out, err = capsys.readouterr()
    result = run(no_torch_env, ["-m", "layout_algebra", *args])
    assert (result.returncode, result.stdout, result.stderr) == (code, out, err)
    assert "Traceback" not in result.stderr


def test_bridge_names_the_extra(no_torch_env: dict[str, str]) -> None:
    result = run_code(
        no_torch_env,
        """
        try:
            import layout_algebra.torch_bridge
        except ImportError as e:
            print(type(e).__name__, "|", e)
        """,
    )
    assert result.returncode == 0, result.stderr
    kind, _, message = result.stdout.strip().partition(" | ")
    assert kind == "ImportError"
    assert "layout_algebra.torch_bridge needs torch" in message
    assert "pip install 'layout_algebra[torch]'" in message


def test_demo_names_the_extra(no_torch_env: dict[str, str]) -> None:
    result = run(no_torch_env, ["-m", "layout_algebra", "demo"])
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "pip install 'layout_algebra[torch]'" in result.stderr
