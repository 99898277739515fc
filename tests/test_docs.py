"""The docs follow the code: the README's layout tree names every module, its CLI line every command, and the
schema version the docs state is the one the writer stamps."""
import re
from pathlib import Path

import typer.main

from rlsim.cli import app
from rlsim.replay.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _layout_tree() -> str:
    section = README.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def _tree_names() -> set[str]:
    """Every file or folder name the tree's lines start with (`a.py, b.py   text` names both; `commands_*.py`
    is a pattern)."""
    names: set[str] = set()
    for line in _layout_tree().splitlines():
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names.update(n.strip() for n in head.split(",") if n.strip())
    return names


def test_readme_tree_names_every_module():
    names = _tree_names()
    patterns = [re.compile(re.escape(n).replace(r"\*", ".*") + "$") for n in names if "*" in n]
    missing = []
    for folder in ("sim", "replay", "runner"):
        for f in sorted((ROOT / folder).glob("*.py")):
            if f.name == "__init__.py" or f.name in names or any(p.match(f.name) for p in patterns):
                continue
            missing.append(f"{folder}/{f.name}")
    assert not missing, f"README's layout tree does not name {missing}"


def test_readme_tree_names_only_modules_that_exist():
    files = {f.name for folder in ("sim", "replay", "runner") for f in (ROOT / folder).glob("*.py")}
    named = {n for n in _tree_names() if n.endswith(".py") and "*" not in n}
    assert named <= files, f"README's layout tree names modules that do not exist: {sorted(named - files)}"


def test_readme_cli_line_names_every_command():
    line = next(ln for ln in _layout_tree().splitlines() if ln.strip().startswith("cli.py"))
    listed = {w.strip() for w in line.split("CLI:", 1)[1].split(",")}
    group = typer.main.get_group(app)
    assert set(group.commands) == listed


def test_docs_state_the_written_schema_version():
    assert f"(version {SCHEMA_VERSION})" in _layout_tree()
    fmt = (ROOT / "docs" / "trace-format.md").read_text()
    assert fmt.splitlines()[0] == f"# rlsim trace format (schema version {SCHEMA_VERSION})"
    assert f'"schema_version": {SCHEMA_VERSION},' in fmt
    for doc in ("docs/importing.md", "replay/importers/common.py"):
        text = (ROOT / doc).read_text()
        assert "(schema version 2" not in text, f"{doc} says imported traces are schema version 2"
