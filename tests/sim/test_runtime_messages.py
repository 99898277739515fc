"""Evidence apart from the product: a runtime message states what was computed and names a document at most once,
never a study's figures or a section number of the docs."""
import ast
import re
from pathlib import Path

from rlsim.replay.rho import staleness_rho
from rlsim.replay.io import read_trace
from rlsim.whatif.study import prepare

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"§|\bsection \d|\.md\)? ?\d[a-z]?\b|\.md §")


def _strings(path: Path):
    """The string literals of a module that are not docstrings (f-strings' literal parts included)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.lineno, n.value


def test_no_section_numbers_in_runtime_strings():
    assert all(SECTION.search(s) for s in ("docs/results.md 1c", "(docs/results.md §4)", "results section 3"))
    assert not SECTION.search("docs/results.md: treat rho as a guess")
    bad = [(p.relative_to(ROOT), line, s[:80]) for pkg in ("sim", "replay") for p in sorted((ROOT / pkg).rglob("*.py"))
           for line, s in _strings(p) if SECTION.search(s)]
    assert bad == []


def test_noise_scale_warning_states_its_interval_and_names_the_doc_once():
    study = prepare([read_trace(ROOT / "traces" / "grpo_p128.parquet")])
    w = next(w for w in study.warnings if "gradient noise scale" in w)
    num = r"[\d.]+(?:e[+-]\d+)?"  # %.4g: 986, 1.245e+04
    assert re.search(rf"B_crit {num} responses \(90 % bootstrap over its updates {num}\.\.{num}\)", w)
    assert w.count("docs/") == 1 and not SECTION.search(w)


def test_staleness_notes_quote_no_figures():
    study = prepare([read_trace(ROOT / "traces" / "grpo_p128.parquet")])
    _, notes = staleness_rho(study.curves, study.target, study.b_ref, 8)
    text = " ".join(notes)
    assert "arXiv:2505.24298" in text and text.count("arXiv") == 1
    assert not re.search(r"\d+\.\d", text.replace("arXiv:2505.24298", ""))  # no scores quoted from the paper
