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


def _tree_paths() -> set[str]:
    """Every file the tree names, as a path: a line's names (`a.py, b.py   text` names both) sit in the folder of
    the nearest line above indented less that ends in `/`."""
    paths: set[str] = set()
    folders: list[str] = []
    for line in _layout_tree().splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        folders = folders[:depth]
        for n in (n.strip() for n in head.split(",") if n.strip()):
            if n.endswith("/"):
                folders.append(n)
            else:
                paths.add("".join(folders) + n)
    return paths


def _modules() -> set[str]:
    """The product's modules: sim/ with its subpackages, replay/ and runner/ (replay/importers/ is one folder)."""
    files = [*(ROOT / "sim").rglob("*.py"), *(ROOT / "replay").glob("*.py"), *(ROOT / "runner").glob("*.py")]
    return {str(f.relative_to(ROOT)) for f in files if f.name != "__init__.py"}


def test_readme_tree_names_every_module():
    missing = sorted(_modules() - _tree_paths())
    assert not missing, f"README's layout tree does not name {missing}"


def test_readme_tree_names_only_modules_that_exist():
    extra = sorted(p for p in _tree_paths() - _modules() if p.endswith(".py"))
    assert not extra, f"README's layout tree names modules that do not exist: {extra}"


def test_readme_cli_line_names_every_command():
    line = next(ln for ln in _layout_tree().splitlines() if ln.strip().startswith("cli/"))
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


def test_module_docstrings_say_what_and_why_briefly():
    """A module docstring says what the module is for and why in about 20 lines; the detail lives in docs/."""
    import ast

    long = {}
    for folder in ("sim", "replay", "runner"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
            if doc.count("\n") + 1 > 20:
                long[str(path.relative_to(ROOT))] = doc.count("\n") + 1
    assert not long, f"module docstrings over 20 lines (move the detail to docs/): {long}"
