"""Will it fit, in every answer (rlsim.whatif.memory): the memory line and object of `rlsim run`, the warning of a
configuration that does not fit, unknown memory when the model's size is not in the trace, the KV cache the
simulated engine gets on the target device, and sweeps and plans that never put an infeasible config first."""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.core.config import WhatIf
from rlsim.whatif.memory import Load, candidate_memory, memory_line, memory_object, trace_memory
from rlsim.sweeps.plan import Scored, _feasible, pick, scores
from rlsim.replay.io import read_trace
from rlsim.replay.memory import usable_memory_gb
from rlsim.present.results import rank_rows
from rlsim.present.tables import items, ranking_table, sweep_verdict
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import memory_of, models_for, prepare, sim_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "verl"
P128 = ROOT / "traces" / "grpo_p128.parquet"
runner = CliRunner()


def _ok(args):
    r = runner.invoke(app, args, env={"COLUMNS": "2000"})
    assert r.exit_code == 0, r.output
    return r.output


def _import(tmp, config: Path) -> Path:
    out = tmp / "verl.parquet"
    _ok(["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config", str(config), "--device", "h100",
         "-o", str(out)])
    return out


@pytest.fixture(scope="module")
def verl(tmp_path_factory):
    return _import(tmp_path_factory.mktemp("verl"), EXAMPLE / "config.yaml")


@pytest.fixture(scope="module")
def mystery(tmp_path_factory):
    """The verl example with a model whose size neither its name nor the import gives."""
    tmp = tmp_path_factory.mktemp("mystery")
    cfg = tmp / "config.yaml"
    cfg.write_text((EXAMPLE / "config.yaml").read_text().replace("Qwen/Qwen2.5-3B-Instruct", "acme/mystery-model"))
    return _import(tmp, cfg)


def test_verl_example_fits_on_8_h100_and_not_on_1_a100_40gb(verl):
    out = _ok(["run", "--trace", str(verl), "--device", "h100-sxm", "--gpus", "8", "--updates", "3"])
    line = next(x for x in out.splitlines() if x.startswith("memory:"))
    assert line.endswith(": fits") and "of 79.1 GiB" in line
    assert "does not fit" not in out
    out = _ok(["run", "--trace", str(verl), "--device", "a100-40gb", "--gpus", "1", "--updates", "3"])
    line = next(x for x in out.splitlines() if x.startswith("memory:"))
    assert "does not fit" in line and "of 39.6 GiB" in line
    warning = next(x for x in out.splitlines() if x.startswith("warning: does not fit in memory"))
    # both phases overflow; generation most: the config packs micro-batches (use_remove_padding) and the log records
    # a mean prompt + response of 391 of 1536 tokens, so the log-prob passes' micro-batch (32) is sized at 31 x 391
    # + 1536 tokens, and the actor's unsharded states stay resident while vLLM generates
    gen_gb, train_gb = (float(line.split(f"{p} ")[1].split(" GiB")[0]) for p in ("generation", "training"))
    assert gen_gb > train_gb > 39.6
    assert "generation needs" in warning and "its largest term: trainer states (resident)" in warning
    assert "the smallest change that fits:" in warning
    assert "does not fit in memory" in next(x for x in out.splitlines() if x.startswith("verdict:"))
    # what the warning says would fit does: the fewest GPUs it names
    gpus = int(warning.split(" GPUs (from 1)")[0].rsplit(" ", 1)[-1])
    out = _ok(["run", "--trace", str(verl), "--device", "a100-40gb", "--gpus", str(gpus), "--updates", "3"])
    assert next(x for x in out.splitlines() if x.startswith("memory:")).endswith(": fits")


def test_json_and_api_carry_the_memory_object(verl):
    d = json.loads(_ok(["run", "--trace", str(verl), "--device", "a100-40gb", "--gpus", "1", "--updates", "3",
                        "--json"]))
    m = d["memory"]
    assert {"generation_gb", "training_gb", "per_device_gb", "limit_gb", "fits"} <= set(m)
    assert m["fits"] is False and d["fits"] is False and m["per_device_gb"] > m["limit_gb"]
    assert m["fix"] and m["overflow"] and d["reference"]["memory"]["fits"] is False
    assert any(w.startswith("does not fit in memory") for w in d["warnings"])
    import rlsim
    df = rlsim.predict(str(verl), batch=512, updates=3)
    assert list(df["fits"]) == [True, True] and df.loc["candidate", "memory_limit_gb"] == pytest.approx(79.12)
    assert df.loc["candidate", "memory_per_device_gb"] == pytest.approx(df.loc["reference", "memory_per_device_gb"])


def test_unknown_model_is_reported_unknown_never_guessed(mystery):
    d = json.loads(_ok(["run", "--trace", str(mystery), "--updates", "3", "--json"]))
    assert d["fits"] is None and d["memory"]["fits"] is None and d["memory"]["per_device_gb"] is None
    assert "--model-params" in d["memory"]["unknown"] and any("--model-params" in n for n in d["notes"])
    out = _ok(["run", "--trace", str(mystery), "--updates", "3"])
    assert next(x for x in out.splitlines() if x.startswith("memory:")).startswith("memory: unknown (")
    # its parameter count sizes the training state; the KV cache and activations stay unknown
    d = json.loads(_ok(["run", "--trace", str(mystery), "--updates", "3", "--model-params", "3e9", "--json"]))
    assert "unknown" not in d["memory"] and d["memory"]["training_gb"] is None
    terms = {t["name"]: t["gb"] for t in d["memory"]["terms"]}
    assert terms["vLLM weights"] == pytest.approx(3e9 * 2 / 2 / 2 ** 30, abs=0.01)   # bf16 over TP 2
    assert terms["actor activations"] is None and d["fits"] is None
    r = runner.invoke(app, ["run", "--trace", str(mystery), "--model-params", "-1"])
    assert r.exit_code == 2 and "--model-params" in r.output and "Traceback" not in r.output


def test_unknown_model_says_so_once_in_every_command(mystery, tmp_path):
    out = _ok(["run", "--trace", str(mystery), "--updates", "3"])
    line = next(x for x in out.splitlines() if x.startswith("memory:"))
    assert "--model-params" in line and "--model-config" in line and out.count("--model-params") == 1  # no note too
    # the import says what the memory estimate will lack
    cfg = tmp_path / "config.yaml"
    cfg.write_text((EXAMPLE / "config.yaml").read_text().replace("Qwen/Qwen2.5-3B-Instruct", "acme/mystery-model"))
    out = _ok(["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config", str(cfg), "-o",
               str(tmp_path / "m.parquet")])
    assert "note: memory unknown" in out and "--model-params" in out and "--model-config" in out
    # sweep: the reason is one note, not cut at its punctuation
    _ok(["sweep", "--trace", str(mystery), "--batch", "128,512", "--updates", "3", "--out", str(tmp_path / "s"),
         "--workers", "1"])
    import pyarrow.parquet as pq
    row = pq.read_table(tmp_path / "s" / "results.parquet").to_pylist()[0]
    assert any(n.startswith("memory unknown") and "--model-params" in n for n in items(row["notes"]))
    import rlsim
    df = rlsim.predict(str(mystery), batch=512, updates=3, model_params=3e9)
    assert df.loc["candidate", "memory_limit_gb"] == pytest.approx(79.12) and df.loc["candidate", "fits"] is None
    df = rlsim.sweep(str(mystery), {"batch": [128], "model_params": [3e9], "updates": [3]})
    assert df["memory_limit_gb"].iloc[0] == pytest.approx(79.12)


def test_plan_takes_model_params(mystery):
    d = json.loads(_ok(["plan", str(mystery), "--batch", "128,512", "--json"]))
    assert any(n.startswith("memory unknown") and "--model-params" in n for n in d["notes"])
    d = json.loads(_ok(["plan", str(mystery), "--batch", "128,512", "--model-params", "3e9", "--json"]))
    assert not any(n.startswith("memory unknown") for n in d["notes"])
    assert any(n.startswith("memory undecided") and "--model-config" in n for n in d["notes"])
    r = runner.invoke(app, ["plan", str(mystery), "--batch", "128,512", "--model-params", "-1"])
    assert r.exit_code == 2 and "--model-params" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["plan", str(mystery), "--batch", "128,512", "--gpus", "4"])
    assert r.exit_code == 2 and "not --gpus" in r.output


def test_model_config_at_import_gives_the_full_estimate(tmp_path, verl):
    cfg = tmp_path / "config.yaml"
    cfg.write_text((EXAMPLE / "config.yaml").read_text().replace("Qwen/Qwen2.5-3B-Instruct", "acme/mystery-model"))
    hf = tmp_path / "config.json"  # Qwen2.5-3B's config.json under another name
    hf.write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 36, "hidden_size": 2048,
                              "num_attention_heads": 16, "num_key_value_heads": 2, "intermediate_size": 11008,
                              "vocab_size": 151936, "tie_word_embeddings": True}))
    out = tmp_path / "c.parquet"
    text = _ok(["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config", str(cfg), "--device", "h100",
                "--model-config", str(hf), "-o", str(out)])
    assert "memory" not in text
    got = json.loads(_ok(["run", str(out), "--updates", "3", "--json"]))["memory"]
    want = json.loads(_ok(["run", str(verl), "--updates", "3", "--json"]))["memory"]
    assert got["fits"] is True and got["per_device_gb"] == want["per_device_gb"]
    hf.write_text("{not json")
    r = runner.invoke(app, ["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config", str(cfg),
                            "--model-config", str(hf), "-o", str(tmp_path / "d.parquet")])
    assert r.exit_code == 2 and "--model-config" in r.output and "Traceback" not in r.output


def test_rlrun_trace_reproduces_its_recorded_kv_capacity():
    tr = read_trace(P128)
    tm = trace_memory(tr.meta)
    assert tm.shape is not None and tm.shape.full and tm.cpu and tm.gen.kv_cache_gb == tr.config["kv_cache_gib"]
    est, engines, why = memory_of(prepare([tr]), WhatIf())
    assert why == "" and engines == 1 and est.fits is True
    # rlrun fixes vLLM's pool at kv_cache_gib: the model gives the engine's own "GPU KV cache size"
    assert est.kv_capacity_tokens == tr.meta["engine"]["kv_cache_tokens"]
    assert est.limit_gb == pytest.approx(usable_memory_gb(tr.meta["hardware"]["memory_gb"]))


def test_simulated_kv_cache_is_the_memory_models_on_the_target_device():
    st = prepare([read_trace(P128)])
    cfg = WhatIf(device="h100", gpus=1, updates=3, max_num_seqs=16384, prompts=2048)
    est, engines, _ = memory_of(st, cfg)
    rescaled = models_for(st, cfg)[1].kv_cache_tokens
    eng = sim_config(st, cfg).engine
    assert eng.kv_cache_tokens == est.kv_capacity_tokens * engines < rescaled
    o = evaluate(st, cfg)
    assert o.peak_running <= eng.kv_blocks < cfg.max_num_seqs  # the KV cache, not max_num_seqs, caps concurrency
    assert "vLLM queues the rest" in memory_line(o.memory)
    # a user's --kv-cache-tokens is taken as given
    assert sim_config(st, replace(cfg, kv_cache_tokens=rescaled)).engine.kv_cache_tokens == rescaled


def test_candidate_memory_follows_the_devices():
    tm = trace_memory(read_trace(P128).meta)
    tm = replace(tm, cpu=False, device_memory_gb=None)
    load = Load(responses_per_update=1024, gen_requests=1024, seq_len=256, recorded_devices=1)
    est, _, why = candidate_memory(tm, WhatIf(), load)
    assert est is None and "--device" in why and memory_object(est, why)["fits"] is None
    est, _, _ = candidate_memory(tm, WhatIf(device="a100-40gb", gpus=4), load)
    assert est.limit_gb == pytest.approx(usable_memory_gb(40))
    split, _, _ = candidate_memory(tm, WhatIf(device="h100", gen_gpus=2, train_gpus=2), load)
    assert not split.colocated and est.colocated


def _row(t, fits, step=1.0):
    return {"time_to_target_ratio": t, "time_to_target_ratio_lo": t * 0.99, "time_to_target_ratio_hi": t * 1.01,
            "step_time_s": step, "fits": fits, "regime": "time falls", "prompts": int(t * 100), "group": 8,
            "responses_per_update": int(t * 800)}


def test_sweep_ranks_an_infeasible_config_last_and_never_names_it():
    rows = [_row(0.5, False), _row(0.8, True), _row(0.7, None)]  # the fastest does not fit
    ranked = rank_rows(rows)
    assert [r["time_to_target_ratio"] for r in ranked] == [0.7, 0.8, 0.5] and ranked[-1]["rank"] == 3
    v = sweep_verdict(ranked)
    assert v["best"]["time_to_target_ratio"] == 0.7 and all(r["fits"] is not False for r in v["tied"])
    assert sweep_verdict(rank_rows([_row(0.5, False)]))["title"] == "No verdict"
    from rich.console import Console
    con = Console(width=200, record=True)
    con.print(ranking_table(ranked, ["prompts"]))
    text = con.export_text()
    assert "fits" in text and "never the verdict" in text
    con = Console(width=200, record=True)
    con.print(ranking_table(rank_rows(rows[1:]), ["prompts"]))
    assert "fits" not in con.export_text()  # no column when every config fits


def test_sweep_cli_marks_and_ranks_infeasible_configs(verl, tmp_path):
    out = _ok(["sweep", "--trace", str(verl), "--device", "h100", "--gpus", "1,8", "--batch", "256,512",
               "--updates", "3", "--out", str(tmp_path / "s"), "--workers", "1"])
    assert "fits" in out
    meta = json.loads((tmp_path / "s" / "sweep.json").read_text())
    import pyarrow.parquet as pq
    table = pq.read_table(tmp_path / "s" / "results.parquet").to_pylist()
    fits = [r["fits"] for r in table]
    assert fits == sorted(fits, reverse=True) and fits.count(False) == 2  # 1 GPU holds no 3B trainer
    assert meta["verdict"]["title"] and all(r["gpus"] == 8 for r in table[:2]) and "fits" in meta["ranking"]
    assert table[0]["memory_per_device_gb"] < table[0]["memory_limit_gb"] < table[-1]["memory_per_device_gb"]
    assert "does not fit in memory" in table[-1]["warnings"] and table[-1]["memory_fix"]


def test_plan_never_picks_an_infeasible_size():
    class Pred:
        def __init__(self, fits):
            self.fits, self.memory = fits, {"overflow": "training needs 90 of 79 GiB"}
    rng = np.random.default_rng(0)
    T = np.exp(rng.normal(0, 0.02, (400, 3))) * np.array([1.0, 0.9, 0.5])  # size 2 fastest, and does not fit
    s = Scored([64, 128, 256], 0, [Pred(True), Pred(True), Pred(False)], T, np.zeros_like(T), np.ones(400), {0}, [])
    assert pick(s.T, s.w, 0) == 2
    masked, warnings = _feasible(s)
    assert pick(masked.T, masked.w, 0) == 1 and "P=256 does not fit" in warnings[0]
    er, p5 = scores(masked.T, masked.w)
    assert p5[2] == 0 and er[2] > 1e3
    # the reference ran: it stays, and a model saying it does not fit is flagged
    s2 = replace(s, preds=[Pred(False), Pred(True), Pred(True)])
    assert _feasible(s2)[0] is s2 and "yet it ran" in _feasible(s2)[1][0]
