"""`rlrun`: record real RL runs as rlsim traces, and summarise a trace.

Thin: parse -> RunConfig -> one library call. torch and vLLM are imported only when a run starts,
so `--help` and bad-input errors are fast, and `inspect` works in the base install. Every RlsimError is
one line and exit code 2, a missing engine extra included.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import typer

from rlsim.replay.errors import RlsimError, cli_errors
from rlsim.runner.config import RunConfig, field_help

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Record real GRPO/PPO runs (vLLM generates, torch trains) as rlsim traces.")
H = field_help()
ENGINE = ("torch", "vllm", "transformers")  # what `record` and `calibrate` import: the cpu or gpu extra


def _run(cfg: RunConfig, interrupted: str, **kw) -> None:
    """Record after checking the engine is installed (bad input was reported first, whatever is installed)."""
    missing = [m for m in ENGINE if importlib.util.find_spec(m) is None]
    if missing:
        raise RlsimError(f"rlrun needs torch and vLLM ({', '.join(missing)} not installed): pip install torch==2.13.0 && "
                         'pip install -e ".[cpu]" (CPU) or pip install -e ".[gpu]" (CUDA)')
    from rlsim.runner.loop import record as run_record

    try:
        run_record(cfg, **kw)
    except KeyboardInterrupt:  # before the trace was opened (model build, engine start)
        typer.echo(interrupted, err=True)
        raise typer.Exit(130) from None


@app.command()
@cli_errors
def record(
    out: str = typer.Option(..., "--out", "-o", help=H["out"]),
    algo: str = typer.Option("grpo", help=H["algo"]),
    prompts: int = typer.Option(32, "--prompts", "-P", help=H["prompts"]),
    group: Optional[int] = typer.Option(None, "--group", "-G", help=H["group"]),
    steps: int = typer.Option(50, help=H["steps"]),
    lr: float = typer.Option(3e-4, help=H["lr"]),
    lr_rule: str = typer.Option("sqrt", help=H["lr_rule"]),
    lr_ref_batch: int = typer.Option(1024, help=H["lr_ref_batch"]),
    critic_lr: float = typer.Option(1e-3, help=H["critic_lr"]),
    max_tokens: int = typer.Option(48, help=H["max_tokens"]),
    temperature: float = typer.Option(1.0, help=H["temperature"]),
    eval_every: int = typer.Option(5, help=H["eval_every"]),
    eval_prompts: int = typer.Option(128, help=H["eval_prompts"]),
    eval_k: int = typer.Option(4, help=H["eval_k"]),
    task: str = typer.Option("add2", help=H["task"]),
    dataset: Optional[str] = typer.Option(None, help=H["dataset"]),
    reward: str = typer.Option("exact", help=H["reward"]),
    model: Optional[str] = typer.Option(None, help=H["model"]),
    seed: int = typer.Option(0, help=H["seed"]),
    std_scale: bool = typer.Option(True, "--std-scale/--no-std-scale", help=H["std_scale"]),
    loss_agg: str = typer.Option("token", help=H["loss_agg"]),
    gamma: float = typer.Option(1.0, help=H["gamma"]),
    lam: float = typer.Option(0.95, help=H["lam"]),
    minibatches: int = typer.Option(1, help=H["minibatches"]),
    epochs: int = typer.Option(1, help=H["epochs"]),
    micro_batch: int = typer.Option(0, help=H["micro_batch"]),
    mode: str = typer.Option("colocated", help=H["mode"]),
    gen_devices: int = typer.Option(1, help=H["gen_devices"]),
    train_devices: int = typer.Option(1, help=H["train_devices"]),
    max_staleness: int = typer.Option(0, help=H["max_staleness"]),
    partial_rollout: bool = typer.Option(False, "--partial-rollout/--no-partial-rollout", help=H["partial_rollout"]),
    off_policy: str = typer.Option("none", help=H["off_policy"]),
    tis_cap: float = typer.Option(2.0, help=H["tis_cap"]),
    threads: int = typer.Option(0, help=H["threads"]),
    compile: bool = typer.Option(False, "--compile/--no-compile", help=H["compile"]),
    max_num_seqs: int = typer.Option(1024, help=H["max_num_seqs"]),
    gen_batch: int = typer.Option(0, help=H["gen_batch"]),
    kv_cache_gib: float = typer.Option(1.0, help=H["kv_cache_gib"]),
    dtype: str = typer.Option("auto", help=H["dtype"]),
    record_steps: bool = typer.Option(True, "--record-steps/--no-record-steps", help=H["record_steps"]),
    calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate", help=H["calibrate"]),
    progress: bool = typer.Option(True, "--progress/--no-progress", help=H["progress"]),
    overwrite: bool = typer.Option(False, "--overwrite", help=H["overwrite"]),
):
    """Run GRPO or PPO for --steps updates and record every event to a Parquet trace."""
    cfg = RunConfig(
        algo=algo, prompts=prompts, group=group, steps=steps, lr=lr, lr_rule=lr_rule, lr_ref_batch=lr_ref_batch,
        critic_lr=critic_lr, max_tokens=max_tokens, temperature=temperature, eval_every=eval_every,
        eval_prompts=eval_prompts, eval_k=eval_k, task=task, dataset=dataset, reward=reward, model=model, seed=seed,
        std_scale=std_scale, loss_agg=loss_agg, gamma=gamma, lam=lam, minibatches=minibatches, epochs=epochs,
        micro_batch=micro_batch, train_devices=train_devices, mode=mode,
        gen_devices=gen_devices, max_staleness=max_staleness, partial_rollout=partial_rollout, off_policy=off_policy,
        tis_cap=tis_cap, threads=threads, compile=compile, max_num_seqs=max_num_seqs, gen_batch=gen_batch,
        kv_cache_gib=kv_cache_gib, dtype=dtype, record_steps=record_steps, calibrate=calibrate, progress=progress, out=out,
        overwrite=overwrite,
    ).validate()
    _run(cfg, "interrupted before recording started; no trace written")


@app.command("calibrate")
@cli_errors
def calibrate_cmd(
    out: str = typer.Option(..., "--out", "-o", help="output calibration trace (.parquet)"),
    algo: str = typer.Option("grpo", help=H["algo"]),
    prompts: int = typer.Option(32, "--prompts", "-P", help=H["prompts"] + "; the ladders are sized from P x G"),
    group: Optional[int] = typer.Option(None, "--group", "-G", help=H["group"]),
    max_tokens: int = typer.Option(48, help=H["max_tokens"]),
    temperature: float = typer.Option(1.0, help=H["temperature"]),
    task: str = typer.Option("add2", help=H["task"]),
    dataset: Optional[str] = typer.Option(None, help=H["dataset"]),
    reward: str = typer.Option("exact", help=H["reward"]),
    model: Optional[str] = typer.Option(None, help=H["model"]),
    seed: int = typer.Option(0, help=H["seed"]),
    micro_batch: int = typer.Option(0, help=H["micro_batch"]),
    compile: bool = typer.Option(False, "--compile/--no-compile", help=H["compile"]),
    max_num_seqs: int = typer.Option(1024, help=H["max_num_seqs"]),
    gen_batch: int = typer.Option(0, help=H["gen_batch"]),
    kv_cache_gib: float = typer.Option(1.0, help=H["kv_cache_gib"]),
    max_model_len: int = typer.Option(256, help=H["max_model_len"]),
    dtype: str = typer.Option("auto", help=H["dtype"]),
    threads: int = typer.Option(0, help=H["threads"]),
    overwrite: bool = typer.Option(False, "--overwrite", help=H["overwrite"]),
):
    """Profile engine steps and training passes alone (what `record` does before its first update) and write
    a trace with only the calibration rows; `rlsim run --trace OLD --calibration FILE` uses it."""
    cfg = RunConfig(
        algo=algo, prompts=prompts, group=group, steps=1, max_tokens=max_tokens, temperature=temperature, task=task,
        dataset=dataset, reward=reward, model=model, seed=seed, micro_batch=micro_batch, compile=compile,
        max_num_seqs=max_num_seqs, gen_batch=gen_batch, kv_cache_gib=kv_cache_gib, max_model_len=max_model_len,
        dtype=dtype, threads=threads, calibrate=True, progress=False, out=out, overwrite=overwrite,
    ).validate()
    _run(cfg, "interrupted; no calibration written", only_calibration=True)


@app.command()
@cli_errors
def inspect(trace: str = typer.Argument(..., help="trace file (.parquet, or a .partial.arrow left by a killed run)")):
    """Print a human summary of a trace: config, hardware, events, step-time split, throughput, evals."""
    from rlsim.runner.summary import summarize

    typer.echo(summarize(trace))


def main() -> None:
    try:
        app()
    except RlsimError as e:  # pragma: no cover - commands wrap their own
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
