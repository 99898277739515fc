"""The record loop: generate -> reward -> advantages -> one update -> weight sync -> (eval), traced.

Every event goes through `replay.io.TraceWriter`; rows of an RL step are added and flushed together
when the step completes (after its sync), so a SIGKILL keeps every completed update and no half step.
Ctrl-C finishes cleanly: the trace is closed with status "interrupted".
"""
from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from rlsim.replay.errors import RlsimError
from rlsim.runner.config import RunConfig


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
        raise RlsimError(f"cannot load the model in {model_dir} ({type(e).__name__}: {str(e).splitlines()[0][:100]})") from None
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    eval_set = task.eval_set(cfg.eval_prompts, cfg.seed)
    eval_ids = [list(tok(ex.prompt)["input_ids"]) for ex in eval_set]
    return Setup(cfg, Path(model_dir), task, tok, policy, pad_id, device, eval_set, eval_ids)


def record(cfg: RunConfig, log: Callable[[str], None] = _log, *, only_calibration: bool = False) -> Path:
    """Run and record one RL run as a trace at `cfg.out`; returns its path. `only_calibration` (`rlrun
    calibrate`): set up and calibrate as a run would, write the calibration rows and metadata, stop."""
    cfg.validate()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import random

    import torch

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ctx = setup(cfg, log)
    if cfg.mode == "split":
        from rlsim.runner.split import record_split

        return Path(record_split(cfg, ctx, log))
    from rlsim.runner.placement import pinned, place

    pl = place(cfg.mode, cfg.gen_devices, cfg.train_devices, threads=cfg.threads)
    # --threads (e.g. `rlrun calibrate --threads 1`: profile at a split side's threads): on that many cores
    cores = sorted(os.sched_getaffinity(0))[:cfg.threads] if cfg.threads and pl.kind == "cpu" else None
    with pinned(cores, cfg.threads or None):
        return _record_colocated(cfg, ctx, pl, log, only_calibration)


def _record_colocated(cfg: RunConfig, ctx: Setup, pl, log, only_calibration: bool) -> Path:
    import torch

    from rlsim.replay.io import TraceWriter, recording
    from rlsim.runner.algo import Sample, Trainer, grpo_advantages
    from rlsim.runner.dp import DataParallel
    from rlsim.runner.engine import Engine

    task, tok, policy, pad_id, device, model_dir = ctx.task, ctx.tok, ctx.policy, ctx.pad_id, ctx.device, ctx.model_dir
    gen_threads = torch.get_num_threads()
    # colocated ranks: rank 0 generates on all its cores, then trains on its share like the other ranks
    train_threads = pl.threads(pl.train[0], cfg.threads) if pl.kind == "cpu" and cfg.train_devices > 1 else gen_threads
    engine = Engine(str(model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=cfg.seed)
    log(f"engine started in {engine.start_time_s:.1f} s ({engine.kv_cache_tokens} KV tokens, dtype {engine.dtype})")
    trainer = Trainer(policy, cfg, pad_id, device)
    sampling = engine.sampling(cfg.max_tokens, cfg.temperature, logprobs=cfg.off_policy == "tis")

    encode, eval_set, eval_ids = ctx.encode, ctx.eval_set, ctx.eval_ids
    # warm-up outside the recorded run: the first engine steps carry one-time costs
    t_w = time.perf_counter()
    warm = engine.generate([(None, ids, 1) for ids in eval_ids[: min(len(eval_ids), 64)]], sampling)
    log(f"engine warm-up generate: {time.perf_counter() - t_w:.2f} s")
    # data-parallel ranks (none beyond this process with one training device): rank r trains on pl.train[r]
    dp = DataParallel(trainer, cfg, str(model_dir), pad_id, t0=0.0,
                      cores=[list(c) for c in pl.train] if pl.kind == "cpu" and cfg.train_devices > 1 else None,
                      gpus=[c[0] for c in pl.train] if pl.kind == "cuda" else None)
    # trainer warm-up on every rank (compilation with --compile) on the warm-up responses; weights are not changed
    try:
        torch.set_num_threads(train_threads)
        t_train_warm = dp.warmup([Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [pad_id],
                                         reward=0.0, advantage=1.0) for c in warm])
        torch.set_num_threads(gen_threads)
    except Exception as e:  # inductor needs a working C++ compiler on CPU; nothing has been recorded yet
        if not cfg.compile:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise RlsimError(f"--compile failed in torch.compile ({type(e).__name__}: {first}); install a C++ compiler "
                         "(e.g. apt install g++) or record without --compile") from None
    log(f"trainer warm-up{' (torch.compile)' if cfg.compile else ''}: {t_train_warm:.2f} s")
    calib_rows: list[tuple[str, dict[str, Any]]] = []
    calib_info = None
    if cfg.calibrate or only_calibration:
        # after the warm-ups, before the first update: weights and optimizer state are not changed
        from rlsim.runner.calibrate import run_calibration

        cal_stream = task.train_stream(cfg.seed + 104729)  # the task's prompts, not the run's stream
        cal_prompts = [encode(next(cal_stream).prompt) for _ in range(512)]
        cal_resp = [list(c.token_ids) for c in warm if c.token_ids] or [[pad_id]]
        calib_rows, calib_info = run_calibration(engine, trainer, cfg, cal_prompts, cal_resp, log=log)

    meta = ctx.meta(engine={**engine.facts(), "warmup_excluded": True},
                    trainer={"compile": cfg.compile, "warmup_s": t_train_warm, "row_tokens": trainer.row_tokens,
                             "share_prompts": trainer.share_prompts})
    if calib_info is not None:  # the thread count it was profiled at: a split side may run at fewer
        meta["calibration"] = {**calib_info, "threads": gen_threads}
    if only_calibration:
        meta["kind"] = "calibration"
        with TraceWriter(cfg.out, meta, overwrite=cfg.overwrite) as w:
            for kind, r in calib_rows:
                w.add(kind, **r)
        log(f"calibration written: {cfg.out} ({len(calib_rows)} rows)")
        dp.close()
        return Path(cfg.out)
    stream = task.train_stream(cfg.seed)
    P, G, B = cfg.prompts, cfg.G, cfg.batch
    lr = cfg.lr_effective
    T0 = time.perf_counter()
    clock = lambda: time.perf_counter() - T0  # noqa: E731
    engine.clock = clock
    prog = _Progress(cfg.progress and sys.stderr.isatty(), cfg.steps)
    cum_resp = cum_tok = 0
    next_prompt_id = 0
    last_score = float("nan")
    writer = TraceWriter(cfg.out, meta, overwrite=cfg.overwrite)

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
                rows: list[tuple[str, dict[str, Any]]] = []
                t_step = clock()
                examples = [next(stream) for _ in range(P)]
                pids = list(range(next_prompt_id, next_prompt_id + P))
                next_prompt_id += P
                # one request per prompt with n = G samples; over-generation (gen_batch > B) adds samples
                # G, G+1, ... round-robin over the prompts, and the first G of each prompt to finish are kept
                extra = cfg.gen_responses - B
                reqs = [(j, encode(ex.prompt), G + extra // P + (j < extra % P)) for j, ex in enumerate(examples)]

                def on_step(s, _step=step):
                    rows.append(("gen_step", dict(t_start=s.t_start, duration=s.duration, step=_step, policy_version=_step,
                                                  num_running=s.num_running, num_waiting=s.num_waiting,
                                                  prefill_tokens=s.prefill_tokens, decode_tokens=s.decode_tokens,
                                                  context_tokens=s.context_tokens, kv_usage=s.kv_usage,
                                                  finished=s.finished)))

                outs = engine.generate(reqs, sampling, on_step if cfg.record_steps else None)
                gen_time = clock() - t_step
                t_r = clock()
                if extra:
                    by_prompt: dict[int, list] = {}
                    for c in sorted(outs, key=lambda c: c.t_finished):
                        lst = by_prompt.setdefault(c.tag, [])
                        if len(lst) < G:
                            lst.append(c)
                    outs = [c for j in range(P) for c in by_prompt.get(j, [])]
                outs.sort(key=lambda c: (c.tag, c.index))
                samples = []
                for k, c in enumerate(outs):
                    j, g = c.tag, k % G  # G per prompt, in prompt order: k % G is the index within the group
                    text = tok.decode(c.token_ids, skip_special_tokens=True)
                    r = task.reward(text, examples[j])
                    samples.append(Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [pad_id], reward=r,
                                          prompt_id=pids[j], group_index=g,
                                          behavior_logprobs=list(c.logprobs) if c.logprobs else None))
                if cfg.algo == "grpo":
                    for s, a in zip(samples, grpo_advantages([s.reward for s in samples], G, cfg.std_scale)):
                        s.advantage = a
                reward_time = clock() - t_r
                t_u = clock()
                torch.set_num_threads(train_threads)
                st, rank_rows, ar_rows = dp.update(samples, lr)
                torch.set_num_threads(gen_threads)
                u_dur = clock() - t_u
                if cfg.train_devices > 1:  # per-rank compute and the gradient all-reduce (run clock: minus T0)
                    rows += [("train_rank", dict(r, t_start=r["t_start"] - T0, step=step, policy_version=step)) for r in rank_rows]
                    rows += [("allreduce", dict(r, t_start=r["t_start"] - T0, step=step, policy_version=step)) for r in ar_rows]
                t_s = clock()
                nbytes = engine.sync(policy.state_dict())
                s_dur = clock() - t_s
                step_time = clock() - t_step
                mean_r = sum(s.reward for s in samples) / len(samples)
                for c, s in zip(outs, samples):
                    rows.append(("response", dict(t_start=c.t_queued, duration=(c.t_finished or c.t_queued) - c.t_queued,
                                                  step=step, policy_version=step, prompt_id=s.prompt_id,
                                                  group_index=s.group_index, prompt_tokens=len(c.prompt_ids),
                                                  response_tokens=len(c.token_ids), reward=s.reward, consumed_step=step,
                                                  t_queued=c.t_queued, t_first_token=c.t_first_token,
                                                  t_finished=c.t_finished)))
                rows.append(("update", dict(t_start=t_u, duration=u_dur, step=step, policy_version=step,
                                            num_responses=len(samples), num_tokens=st.num_tokens,
                                            response_tokens_total=st.response_tokens, lr=lr, loss=st.loss,
                                            reward=mean_r, t_forward=st.t_forward, t_backward=st.t_backward,
                                            t_optimizer=st.t_optimizer, grad_norm=st.grad_norm,
                                            grad_norm_micro=st.grad_norm_micro, micro_batch=st.micro_batch,
                                            critic_loss=st.critic_loss, critic_grad_norm=st.critic_grad_norm,
                                            critic_grad_norm_micro=st.critic_grad_norm_micro, step_time=step_time,
                                            gen_time=gen_time, reward_time=reward_time, prep_time=st.prep_time)))
                rows.append(("sync", dict(t_start=t_s, duration=s_dur, step=step, policy_version=step + 1, bytes=nbytes)))
                cum_resp += len(samples)
                cum_tok += st.num_tokens
                done = step + 1
                if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
                    ev = evaluate(done)
                    last_score = ev["score"]
                    rows.append(("eval", ev))
                for kind, r in rows:
                    writer.add(kind, **r)
                writer.flush()
                rps = len(samples) / step_time
                info = f"reward {mean_r:.3f}  eval {last_score:.3f}  {rps:.0f} resp/s"
                prog.update(done, info)
                if prog.bar is None and (done % max(1, cfg.eval_every or 10) == 0 or done == cfg.steps):
                    log(f"step {done}/{cfg.steps}: {info}  (step {step_time:.2f} s: gen {gen_time:.2f}, train {u_dur:.2f}, sync {s_dur:.3f})")
        finally:
            prog.close()
            dp.close()
    return Path(cfg.out)
