"""The product's layering: the simulator side runs without torch or vLLM, and nothing imports runner/."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(package: str):
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield path, [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, [node.module]


def test_sim_and_replay_never_import_runner_or_torch():
    bad = [(p.relative_to(ROOT), n) for pkg in ("sim", "replay") for p, names in _imports(pkg)
           for n in names if n.split(".")[0] in {"runner", "torch", "vllm", "transformers"}]
    assert bad == []


def test_replay_does_not_import_simpy():
    assert [n for _, names in _imports("replay") for n in names if n.split(".")[0] == "simpy"] == []


def test_simulator_cli_loads_without_torch():
    code = ("import sys, sim.cli, replay.io; "
            "bad = [m for m in ('torch', 'vllm', 'transformers', 'runner') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
