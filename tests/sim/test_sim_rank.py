"""`rank` reproduces the article's published decision table (its sigma and rho give its T ratios)."""
import pytest

from rlsim.replay.errors import RlsimError
from rlsim.sweeps.rank import rank_file

# GRPO, Qwen3-30B-A3B, reference P=128 (lr rescaled unless noted). sigma = end-to-end throughput gain,
# rho = extra responses to the target: P=1024 +41% throughput, same responses -> 0.71x; P=2048/4096 ~60%
# more responses vs +30%/+36% throughput -> 1.23x/1.18x; P=256 with a fixed lr +17% throughput, 67% more
# responses (1.5-1.67x; 0.83x updates at 2x batch) -> 1.42x; P=512 -> 0.74x with rho = 1 (sigma 1/0.74).
ARTICLE = """config,sigma,rho
p128,1.0,1.0
p256-fixed-lr,1.17,1.666
p512,1.351,1.0
p1024,1.41,1.0
p2048,1.30,1.6
p4096,1.36,1.6
"""
PUBLISHED = {"p128": 1.0, "p256-fixed-lr": 1.42, "p512": 0.74, "p1024": 0.71, "p2048": 1.23, "p4096": 1.18}


def test_article_decision_table(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text(ARTICLE)
    ranked, present = rank_file(f, "p128")
    assert present
    got = {r.config: round(r.time_to_target_ratio, 2) for r in ranked}
    assert got == PUBLISHED
    assert [r.config for r in ranked] == ["p1024", "p512", "p128", "p4096", "p2048", "p256-fixed-lr"]
    regimes = {r.config: r.regime for r in ranked}
    assert regimes["p1024"] == regimes["p512"] == "time falls"
    assert regimes["p2048"] == regimes["p4096"] == regimes["p256-fixed-lr"] == "time rises"
    assert regimes["p128"] == "reference"


def test_absolute_form_ppo_generation_gain(tmp_path):
    # PPO: batch 256 -> 1024 (4x responses), collection time 39 s -> 68 s: gain 4 / (68/39) = 2.29x;
    # batches 256-2048 align, so equal samples to target.
    f = tmp_path / "ppo.csv"
    f.write_text(f"config,responses_per_s,samples_to_target\nb256,{256 / 39},100000\nb1024,{1024 / 68},100000\n")
    ranked, _ = rank_file(f, "b256")
    top = ranked[0]
    assert top.config == "b1024" and round(top.sigma, 2) == 2.29 and top.rho == 1.0
    assert top.time_to_target_ratio == pytest.approx(68 / 39 / 4)


def test_grpo_generation_gains(tmp_path):
    # generation throughput gains only (rho = 1 inside the invariant range): 128->256 1.31x, 128->512 1.36x
    f = tmp_path / "gen.csv"
    f.write_text("config,sigma,rho\np128,1,1\np256,1.31,1\np512,1.36,1\n")
    ranked, _ = rank_file(f, "p128")
    assert ([(r.config, round(r.time_to_target_ratio, 3)) for r in ranked]
            == [("p512", 0.735), ("p256", 0.763), ("p128", 1.0)])


@pytest.mark.parametrize("text,msg", [
    ("config,foo\na,1\n", "expected config,sigma,rho"),
    ("config,sigma,rho\na,x,1\n", "not a number"),
    ("config,sigma,rho\na,0,1\n", "positive"),
    ("config,sigma,rho\n", "no data rows"),
    ("config,sigma,rho\na,1,1\na,2,1\n", "twice"),
])
def test_bad_csv(tmp_path, text, msg):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(RlsimError, match=msg):
        rank_file(f, "a")


def test_absolute_form_needs_the_reference(tmp_path):
    f = tmp_path / "abs.csv"
    f.write_text("config,responses_per_s,samples_to_target\na,1,1\n")
    with pytest.raises(RlsimError, match="--reference zz is not a config of"):
        rank_file(f, "zz")
    with pytest.raises(RlsimError, match=r"holds absolute measurements .*: name the reference row with "
                                         r"--reference \(its configs: a\)$"):
        rank_file(f)


def test_an_unknown_reference_is_refused_and_none_takes_the_measurements_as_relative(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text(ARTICLE)
    with pytest.raises(RlsimError, match=r"^--reference p999 is not a config of .*runs.csv; its configs: p128, "
                                         r"p256-fixed-lr, p512, p1024, p2048, p4096 \(leave --reference out"):
        rank_file(f, "p999")
    with pytest.raises(RlsimError, match=r"--reference p1025 is not a config of .* \(did you mean p1024\?\)"):
        rank_file(f, "p1025")
    ranked, present = rank_file(f)  # no reference named: sigma and rho as given, nothing relabelled
    assert not present and {r.config: r.regime for r in ranked}["p128"] == "flat"
    assert [r.config for r in ranked] == [r.config for r in rank_file(f, "p128")[0]]  # p128 is 1, 1 here


def test_rank_cli_refusal_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from rlsim.cli import app

    f = tmp_path / "runs.csv"
    f.write_text(ARTICLE)
    r = CliRunner().invoke(app, ["rank", "-m", str(f), "--reference", "p999"])
    assert r.exit_code == 2 and r.output.startswith("error: --reference p999 is not a config of ")
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["rank", "-m", str(f), "--json"])
    assert r.exit_code == 0 and '"reference": null' in r.output
