"""The product's layering. Which module may import which (layers, no cycles, nothing on the simulator side
imports runner/, torch, vLLM or transformers, rlsim.replay no SimPy) is import-linter's: the contracts in
pyproject's [tool.importlinter], checked by `make lint-imports` (part of `make test`, so of CI). Here what they
cannot check: what loads at run time, old import names in tests and benches, private names, the Ray package."""
import ast
import pathlib
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlsim.cli import COMMANDS, build

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(package: str):
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield path, [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, [node.module]


def test_simulator_cli_loads_without_torch():
    code = ("import sys, rlsim, rlsim.cli, rlsim.replay.io; rlsim.cli.app; "
            "bad = [m for m in ('torch', 'vllm', 'transformers', 'rlsim.runner') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_command_loads_only_its_own_module():
    code = ("import sys; from rlsim.cli import build; build('run'); "
            "print([m for m in ('rlsim.cli.imports', 'rlsim.replay.importers', 'rlsim.cli.plan', "
            "'rlsim.sweeps.plan', 'rlsim.cli.study', 'rlsim.present.report') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_runs_from_the_cli_built_for_it(command):
    res = CliRunner().invoke(build(command), [command, "--help"], prog_name="rlsim")
    assert res.exit_code == 0 and f"rlsim {command} [OPTIONS]" in " ".join(res.output.split()), res.output


def test_no_module_imports_the_old_top_level_names():
    """`sim`, `replay` and `runner` are folders, not import names: everything imports `rlsim.*`
    (an old name would import a second copy of a module, with its own exception classes)."""
    bad = [(p.relative_to(ROOT), n) for pkg in ("sim", "replay", "runner", "tests", "bench")
           for p, names in _imports(pkg)
           for n in names if n.split(".")[0] in {"sim", "replay", "runner"}]
    assert bad == []


def test_no_private_name_is_imported_across_modules():
    """A name starting with `_` stays in its module: neither `from rlsim.x import _name` nor `x._name` elsewhere."""
    bad = []
    for pkg in ("sim", "replay"):
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            modules = set()  # the names this file binds to rlsim modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlsim"):
                    bad += [(path.relative_to(ROOT), node.module, a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
                    modules |= {a.asname or a.name for a in node.names}
                elif isinstance(node, ast.Import):
                    modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("rlsim")}
            bad += [(path.relative_to(ROOT), ast.unparse(node.value), node.attr) for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and ast.unparse(node.value).split(".")[0] in modules]
    assert bad == []


def test_ray_ships_an_importable_rlsim(tmp_path):
    """What `rlsim sweep --ray-address` uploads is one folder `rlsim` holding the simulator and its
    `replay` subpackage: importable on its own, ahead of the installed package."""
    from rlsim.sweeps.backends import ship_package

    root = ship_package(tmp_path)
    # every module from the shipped folder, none through the editable install's finder
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import rlsim.whatif.predict, rlsim.replay.fit, rlsim.cli; "
            "print(rlsim.__file__, rlsim.replay.fit.__file__, rlsim.whatif.predict.__file__, rlsim.cli.__file__)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(root / "__init__.py"), str(root / "replay" / "fit.py"),
                                   str(root / "whatif" / "predict.py"), str(root / "cli" / "__init__.py")]
    assert not (root / "runner").exists()


def test_no_product_function_over_100_lines():
    """Functions short enough to hold in the head: none in sim/, replay/ or runner/ runs past 100 lines."""
    long = []
    for package in ("sim", "replay", "runner"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 100:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions into named steps: " + "; ".join(long)
