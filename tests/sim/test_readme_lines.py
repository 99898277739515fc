"""The README's "What each line means" table covers every line `rlsim run` prints: the table's row labels and
column heads and the kinds of the lines under it, collected by running `run` on the shipped traces in each
setting that adds lines (colocated, PPO, a split with staleness and data-parallel training, another device)."""
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli import app

ROOT = Path(__file__).resolve().parents[2]
RUNS = {
    "colocated": ["-t", "traces/grpo_p64.parquet", "--batch", "128"],
    "ppo": ["-t", "traces/ppo_b256.parquet", "--batch", "512"],
    "split": ["-t", "traces/grpo_p64.parquet", "--batch", "128", "--gen-gpus", "1", "--train-gpus", "2",
              "--staleness", "1"],
    "device": ["-t", "traces/grpo_p128.parquet", "--batch", "256", "--device", "h200", "--gpus", "8"],
}


def kind(text: str) -> str:
    """A line's kind as the README names it: no backticks, no trailing colon or parenthesis ('idle (rewards,
    other)' -> 'idle', 'recorded (median of the trace's updates)' -> 'recorded')."""
    text = text.replace("`", "").strip().rstrip(":").strip()
    return re.sub(r"\s*\([^()]*\)$", "", text).strip()


def readme_kinds() -> set[str]:
    """The kinds the README's table names: its first column, items split at commas outside brackets and at ' / '."""
    section = (ROOT / "README.md").read_text().split("What each line means")[1].split("\n## ")[0]
    out = set()
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| line |"):
            for item in re.split(r",\s*(?![^()]*\))", line.split(" | ")[0].lstrip("| ")):
                out |= {kind(item)} | {kind(x) for x in item.split(" / ")}
    return out


def printed_kinds(output: str) -> set[str]:
    """The kinds `run` printed: the table's row labels and column heads, and each line under it up to its colon."""
    out = set()
    for line in output.splitlines():
        if line[:1] in "│┃":
            cells = [c.strip() for c in line.strip("│┃").split("│" if line[0] == "│" else "┃")]
            out |= {kind(c) for c in cells[:1] + (cells[1:] if line[0] == "┃" else []) if c}
        elif ":" in line and not line.startswith(" ") and not line.startswith("rlsim run:"):
            out.add(kind(line.split(":")[0]))
    return out


@pytest.fixture(scope="module")
def printed():
    got = {}
    for name, args in RUNS.items():
        res = CliRunner().invoke(app, ["run", *args, "--updates", "5"], env={"COLUMNS": "2000"})
        assert res.exit_code == 0, res.output
        got[name] = printed_kinds(res.output)
    return got


def test_every_line_run_prints_is_in_the_readme_table(printed):
    documented = readme_kinds()
    for name, kinds in printed.items():
        assert kinds - documented == set(), name


def test_the_settings_print_their_own_lines(printed):
    """Each setting above adds lines the others lack (so the check sees them all)."""
    assert "gradient noise scale" in printed["ppo"] - printed["colocated"]
    assert {"devices", "waiting for generation", "generator idle", "all-reduce / update",
            "hardware"} <= printed["split"]
    assert "hardware" in printed["device"] - printed["colocated"]
    assert {"prompts P", "sigma", "verdict", "warning", "intervals", "fit"} <= printed["colocated"]
