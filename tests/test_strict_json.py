"""Every JSON rlsim writes is strict JSON (what jq, JavaScript and Go accept): no NaN, no Infinity.

Each JSON-producing path runs on the small shipped PPO trace and its output is parsed with a parser that
refuses the constants NaN / Infinity / -Infinity; the target cases use a score the first eval already reached (-1),
where a time-to-target does not exist and must be null, not NaN (a score nobody reached, 2.0, is refused).
"""
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fuzz_props import TRACES, invoke, strict_loads

TRACE = TRACES / "ppo_b256.parquet"
RUN = ["run", "--trace", TRACE, "--batch", "64", "--updates", "2", "--json"]


def _walk(obj, path=""):
    """Every (path, value) of a parsed JSON document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def _strict_file(path: Path):
    try:
        return strict_loads(Path(path).read_text())
    except ValueError as e:
        bad = [ln.strip() for ln in Path(path).read_text().splitlines() if "NaN" in ln or "Infinity" in ln][:5]
        raise AssertionError(f"{path} is not strict JSON ({e}): {bad}") from None


@pytest.mark.parametrize("target", [None, "-1", "0.5"])
def test_run_json(target):
    args = RUN + (["--target", target] if target else [])
    r = invoke(args)  # raises unless exit 0 with strict JSON (or exit 2 with one line)
    assert r["exit"] == 0, r
    if target == "-1":  # reached before training: the time-to-target does not exist -> null
        nulls = {p for p, v in _walk(r["json"]) if v is None}
        assert any("time_to_target_s" in p for p in nulls), sorted(nulls)


@pytest.mark.parametrize("extra", [[], ["--sampled"]])
def test_replay_json(extra):
    assert invoke(["replay", TRACE, "--json", *extra])["exit"] == 0


def test_rank_json(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text("config,responses_per_s,samples_to_target\np128,250,4000\np256,400,6000\np512,520,\np1024,600,nan\n")
    r = invoke(["rank", "--measurements", csv, "--reference", "p128", "--json"])
    assert r["exit"] in (0, 2), r
    csv.write_text("config,sigma,rho\np128,1,1\np256,1.6,1.5\np512,2.1,2.5\n")
    assert invoke(["rank", "--measurements", csv, "--reference", "p128", "--json"])["exit"] == 0


def test_a_target_nobody_reached_is_one_line():
    assert invoke(RUN + ["--target", "2.0"])["exit"] == 2


@pytest.mark.parametrize("target", [None, "-1"])
def test_sweep_json_and_parquet_metadata(tmp_path, target):
    out = tmp_path / "sweep"
    args = ["sweep", "--trace", TRACE, "--batch", "32,64", "--updates", "2", "--out", out, "--no-charts",
            "--workers", "1"]
    r = invoke(args + (["--target", target] if target else []), json_out=False)
    assert r["exit"] == 0, r
    _strict_file(out / "sweep.json")
    raw = pq.read_schema(out / "results.parquet").metadata
    assert raw, "results.parquet has no key-value metadata"
    for key, val in raw.items():
        if key.startswith(b"rlsim"):
            try:
                strict_loads(val.decode())
            except ValueError as e:
                raise AssertionError(f"results.parquet metadata {key!r} is not strict JSON ({e})") from None


def test_export_perfetto_recorded(tmp_path):
    out = tmp_path / "recorded.json"
    assert invoke(["export", "perfetto", TRACE, "-o", out], json_out=False)["exit"] == 0
    _strict_file(out)


@pytest.mark.parametrize("extra", [[], ["--target", "2.0"]])
def test_export_perfetto_simulated(tmp_path, extra):
    out = tmp_path / "simulated.json"
    r = invoke(["export", "perfetto", "--simulate", "--trace", TRACE, "--batch", "64", "--updates", "2", "-o", out,
                *extra], json_out=False)
    assert r["exit"] == 0, r
    _strict_file(out)


def test_the_strict_parser_refuses_nan():
    for text in ('{"a": NaN}', "[Infinity]", "-Infinity"):
        with pytest.raises(ValueError):
            strict_loads(text)
    assert json.loads('{"a": NaN}')  # the stdlib default would have let it through
