"""The record loop: generate -> reward -> advantages -> one update -> weight sync -> (eval), traced.

The RL step itself (and the engine and trainer it runs on) is runner/rlstep.py's, shared with `rlrun probe`.

Every event goes through `replay.io.TraceWriter`; rows of an RL step are added and flushed together
when the step completes (after its sync), so a SIGKILL keeps every completed update and no half step.
Ctrl-C finishes cleanly: the trace is closed with status "interrupted".
"""
from __future__ import annotations

import os
import platform
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import TraceWriter, recording
from rlsim.runner.calibrate import BUDGET_S, DriftProbe, run_calibration
from rlsim.runner.config import RunConfig
from rlsim.runner.placement import pinned, place
from rlsim.runner.rlstep import start


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def hardware_info(device) -> dict[str, Any]:
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):  # pragma: no cover
        mem = None
    info = {"device": device.type, "cpu_name": _cpu_name(), "cpu_cores": cores,
            "memory_gb": round(mem, 1) if mem else None, "mem_bandwidth_gbs": None,
            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info.update(device_name=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                    device_memory_gb=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    else:
        info.update(device_name=info["cpu_name"], device_count=1)
    return info


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("rlsim", "torch", "vllm", "transformers", "tokenizers", "pyarrow"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    try:
        import torch
        import vllm

        out["torch"], out["vllm"] = torch.__version__, vllm.__version__
    except ImportError:  # pragma: no cover
        pass
    return out


class _Progress:
    """A rich progress bar with step, reward, eval score and responses/s (or nothing)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]rlrun"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[info]}"), console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task("record", total=total, info="")
            self.bar.start()

    def update(self, done: int, info: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _command() -> str | None:
    """The rlrun command line that made the run (None when called as a library)."""
    argv0 = Path(sys.argv[0]).name if sys.argv else ""
    if argv0 == "rlrun" or sys.argv[0].endswith(("runner/cli.py", "rlsim.runner.cli")):
        import shlex

        return " ".join(["rlrun", *map(shlex.quote, sys.argv[1:])])
    return None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Setup:
    """What both record loops (colocated here, split in runner/split.py) start from."""
    cfg: RunConfig
    model_dir: Path
    task: Any
    tok: Any
    policy: Any
    pad_id: int
    device: Any
    eval_set: list
    eval_ids: list[list[int]]

    def encode(self, prompt: str) -> list[int]:
        """Token ids by the trainer's own tokenizer call: the engine sees exactly the trained contexts."""
        return list(self.tok(prompt)["input_ids"])

    def meta(self, **sections) -> dict[str, Any]:
        from rlsim.runner.model import model_info

        return {"created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "seed": self.cfg.seed,
                "config": self.cfg.to_meta(), **sections, "hardware": hardware_info(self.device),
                "model": model_info(self.policy, Path(self.model_dir)), "packages": package_versions(),
                "task": {"name": self.task.name, "eval_prompts": len(self.eval_set)}, "command": _command()}


def setup(cfg: RunConfig, log: Callable[[str], None]) -> Setup:
    """Model (built and cached when not given), tokenizer, task, policy on its device, eval prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlsim.runner.model import Recipe, check_model_dir, ensure_model
    from rlsim.runner.tasks import make_task

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_dir = check_model_dir(cfg.model) if cfg.model else ensure_model(Recipe.for_task(cfg.task), log=log)
    task = make_task(cfg.task, cfg.dataset, cfg.reward)
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    except (OSError, ValueError) as e:
        raise RlsimError(f"cannot load the model in {model_dir} "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:100]})") from None
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    eval_set = task.eval_set(cfg.eval_prompts, cfg.seed)
    eval_ids = [list(tok(ex.prompt)["input_ids"]) for ex in eval_set]
    return Setup(cfg, Path(model_dir), task, tok, policy, pad_id, device, eval_set, eval_ids)


def begin(cfg: RunConfig, log: Callable[[str], None]) -> Setup:
    """What a real run does first, after validation: vLLM in this process, the seeds, `setup`."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import random

    import torch

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return setup(cfg, log)


@contextmanager
def colocated_placement(cfg: RunConfig) -> Iterator[Any]:
    """The colocated placement of `cfg`, this process pinned to it while the run lasts."""

    pl = place(cfg.mode, cfg.gen_devices, cfg.train_devices, threads=cfg.threads)
    # --threads (e.g. `rlrun calibrate --threads 1`: profile at a split side's threads): on that many cores
    cores = sorted(os.sched_getaffinity(0))[:cfg.threads] if cfg.threads and pl.kind == "cpu" else None
    with pinned(cores, cfg.threads or None):
        yield pl


def record(cfg: RunConfig, log: Callable[[str], None] = _log, *, only_calibration: bool = False) -> Path:
    """Run and record one RL run as a trace at `cfg.out`; returns its path. `only_calibration` (`rlrun
    calibrate`): set up and calibrate as a run would, write the calibration rows and metadata, stop."""
    cfg.validate()
    ctx = begin(cfg, log)
    if cfg.mode == "split":
        from rlsim.runner.split import record_split

        return Path(record_split(cfg, ctx, log))
    with colocated_placement(cfg) as pl:
        return _record_colocated(cfg, ctx, pl, log, only_calibration)


def _record_colocated(cfg: RunConfig, ctx: Setup, pl, log, only_calibration: bool) -> Path:
    run = start(cfg, ctx, pl, log)  # the engine and trainer ranks, warmed up
    engine, trainer, pad_id, task, tok = run.engine, run.trainer, ctx.pad_id, ctx.task, ctx.tok
    encode, eval_set, eval_ids = ctx.encode, ctx.eval_set, ctx.eval_ids
    calib_rows: list[tuple[str, dict[str, Any]]] = []
    calib_info = None
    on_cpu = ctx.device.type == "cpu"
    cal_stream = task.train_stream(cfg.seed + 104729)  # the task's prompts, not the run's stream
    cal_prompts = [encode(next(cal_stream).prompt) for _ in range(512)]
    cal_resp = [list(c.token_ids) for c in run.warm if c.token_ids] or [[pad_id]]
    if cfg.calibrate or only_calibration:
        # after the warm-ups, before the first update: weights and optimizer state are not changed;
        # one device's speed (a core on CPU) for split what-ifs, when the run holds more than one
        # (core k: a split's engine on the first, its trainer on the second, as runner/placement.py places them)
        cores = sorted(os.sched_getaffinity(0))
        one_core = ((lambda k=0: pinned(cores[k:k + 1], 1)) if on_cpu and run.gen_threads > 1 else None)
        calib_rows, calib_info = run_calibration(engine, trainer, cfg, cal_prompts, cal_resp, log=log,
                                                 budget_s=BUDGET_S if only_calibration else None,
                                                 threads=run.gen_threads if on_cpu else None, device_threads=one_core,
                                                 interference=one_core is not None and len(cores) > 1)

    meta = ctx.meta(engine={**engine.facts(), "warmup_excluded": True}, trainer=run.trainer_meta(cfg.compile))
    if calib_info is not None:  # the thread count it was profiled at: a split side may run at fewer
        meta["calibration"] = {**calib_info, "threads": run.gen_threads}
    if only_calibration:
        meta["kind"] = "calibration"
        with TraceWriter(cfg.out, meta, overwrite=cfg.overwrite) as w:
            for kind, r in calib_rows:
                w.add(kind, **r)
        log(f"calibration written: {cfg.out} ({len(calib_rows)} rows)")
        run.close()
        return Path(cfg.out)
    stream = task.train_stream(cfg.seed)
    P = cfg.prompts
    run.start_clock()
    clock = run.clock
    prog = _Progress(cfg.progress and sys.stderr.isatty(), cfg.steps)
    cum_resp = cum_tok = 0
    next_prompt_id = 0
    last_score = float("nan")
    writer = TraceWriter(cfg.out, meta, overwrite=cfg.overwrite)
    sampling = run.sampling
    drift = None
    if cfg.drift_every:  # the machine's speed over the run (replay/drift.py), between steps, outside their times

        drift = DriftProbe(engine, trainer, cfg, cal_prompts, cal_resp, clock,
                           threads=run.gen_threads if on_cpu else None)

    def evaluate(version: int) -> dict[str, Any]:
        t0 = clock()
        outs = engine.generate([(i, ids, cfg.eval_k) for i, ids in enumerate(eval_ids)], sampling)
        rewards = [task.reward(tok.decode(c.token_ids, skip_special_tokens=True), eval_set[c.tag]) for c in outs]
        score = sum(rewards) / max(1, len(rewards))
        t1 = clock()
        return dict(t_start=t1, duration=t1 - t0, step=version, policy_version=version, cum_responses=cum_resp,
                    cum_tokens=cum_tok, score=score, eval_k=cfg.eval_k, eval_prompts=len(eval_set))

    with recording(writer, log):
        try:
            for kind, r in calib_rows:
                writer.add(kind, **r)
            ev = evaluate(0)
            last_score = ev["score"]
            writer.add("eval", **ev)
            writer.flush()
            log(f"step 0: eval score {last_score:.3f}")
            for step in range(cfg.steps):
                # generate -> reward -> advantages -> one update -> weight sync (runner/rlstep.py)
                res = run.step(cfg, step, stream, next_prompt_id)
                rows = res.rows
                next_prompt_id += P
                cum_resp += res.responses
                cum_tok += res.tokens
                done = step + 1
                if drift is not None and (step == 0 or done % cfg.drift_every == 0):
                    rows += drift(step)
                if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
                    ev = evaluate(done)
                    last_score = ev["score"]
                    rows.append(("eval", ev))
                for kind, r in rows:
                    writer.add(kind, **r)
                writer.flush()
                rps = res.responses / res.step_time
                info = f"reward {res.mean_reward:.3f}  eval {last_score:.3f}  {rps:.0f} resp/s"
                prog.update(done, info)
                if prog.bar is None and (done % max(1, cfg.eval_every or 10) == 0 or done == cfg.steps):
                    log(f"step {done}/{cfg.steps}: {info}  (step {res.step_time:.2f} s: gen {res.gen_time:.2f}, "
                        f"train {res.update_time:.2f}, sync {res.sync_time:.3f})")
        finally:
            prog.close()
            run.close()
    return Path(cfg.out)
