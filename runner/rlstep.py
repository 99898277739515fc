"""One synchronous RL step on the colocated engine: generate -> reward -> advantages -> one update -> weight sync.

`start` brings up what every step of a colocated run shares (the vLLM engine, the trainer and its data-parallel
ranks, the sampling parameters) with the warm-ups that keep one-time costs out of the recorded steps: one
engine generate on held-out prompts and one trainer pass (compilation with --compile). `Colocated.step` runs
one RL step and returns its trace rows and timings. `rlrun record` (runner/loop.py) runs it once per update at
one batch size, `rlrun probe` (runner/probe.py) at several sizes in one process: the rows of a step are the
same in both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rlsim.replay.errors import RlsimError
from rlsim.runner.config import RunConfig
from rlsim.runner.peaks import PhasePeak
from rlsim.runner.placement import set_threads

Rows = list[tuple[str, dict[str, Any]]]


@dataclass
class StepResult:
    """One RL step: its trace rows (gen_step, train_rank/allreduce, response, update, sync, in that order) and
    what the caller logs."""
    rows: Rows
    responses: int
    tokens: int
    mean_reward: float
    step_time: float
    gen_time: float
    update_time: float
    sync_time: float


@dataclass
class Colocated:
    """The engine and trainer of one colocated run, and the run's clock (seconds since `start_clock`)."""
    ctx: Any  # runner.loop.Setup
    engine: Any
    trainer: Any
    dp: Any
    sampling: Any
    gen_threads: int
    train_threads: int
    warm: list  # the engine warm-up's completions (calibration reuses their responses)
    warmup_s: float  # the trainer warm-up's seconds
    T0: float = 0.0
    peak: Any = None  # runner.peaks.PhasePeak of the trainer's device (set by `start`)

    def start_clock(self) -> None:
        """Time zero of the recorded run: every row's t_start is seconds since (the engine's too)."""
        self.T0 = time.perf_counter()
        self.engine.clock = self.clock

    def clock(self) -> float:
        return time.perf_counter() - self.T0

    def trainer_meta(self, compile_: bool) -> dict[str, Any]:
        return {"compile": compile_, "warmup_s": self.warmup_s, "row_tokens": self.trainer.row_tokens,
                "share_prompts": self.trainer.share_prompts}

    def close(self) -> None:
        self.dp.close()

    def step(self, cfg: RunConfig, step: int, stream: Iterator, first_prompt_id: int) -> StepResult:
        """One RL step at `cfg`'s size (P = cfg.prompts prompts from `stream`, ids from `first_prompt_id`, lr
        by its rule), rows labelled `step` (policy version `step`, `step + 1` after the sync)."""

        clock, engine, P, G, B = self.clock, self.engine, cfg.prompts, cfg.G, cfg.responses_per_update
        # the trainer sizes its micro-batches from its config (RunConfig.micro, a function of B): this step's
        self.trainer.cfg = cfg
        rows: Rows = []
        t_step = clock()
        examples = [next(stream) for _ in range(P)]
        pids = list(range(first_prompt_id, first_prompt_id + P))
        # one request per prompt with n = G samples; over-generation (gen_batch > B) adds samples
        # G, G+1, ... round-robin over the prompts, and the first G of each prompt to finish are kept
        extra = cfg.gen_responses - B
        reqs = [(j, self.ctx.encode(ex.prompt), G + extra // P + (j < extra % P)) for j, ex in enumerate(examples)]
        self.peak.reset()
        outs = engine.generate(reqs, self.sampling, _gen_step_rows(rows, step) if cfg.record_steps else None)
        gen_time = clock() - t_step
        gen_peak = self.peak.peak()
        t_r = clock()
        if extra:
            outs = _first_g(outs, P, G)
        outs.sort(key=lambda c: (c.tag, c.index))
        samples = self._samples(cfg, outs, examples, pids)
        reward_time = clock() - t_r
        t_u = clock()
        set_threads(self.train_threads)
        self.peak.reset()
        st, rank_rows, ar_rows = self.dp.update(samples, cfg.lr_effective)
        train_peak = self.peak.peak()
        set_threads(self.gen_threads)
        u_dur = clock() - t_u
        if cfg.train_devices > 1:  # per-rank compute and the gradient all-reduce (run clock: minus T0)
            rows += [("train_rank", dict(r, t_start=r["t_start"] - self.T0, step=step, policy_version=step))
                     for r in rank_rows]
            rows += [("allreduce", dict(r, t_start=r["t_start"] - self.T0, step=step, policy_version=step))
                     for r in ar_rows]
        t_s = clock()
        nbytes = engine.sync(self.ctx.policy.state_dict())
        s_dur = clock() - t_s
        step_time = clock() - t_step
        mean_r = sum(s.reward for s in samples) / len(samples)
        rows += _response_rows(outs, samples, step)
        rows.append(("update", dict(t_start=t_u, duration=u_dur, step=step, policy_version=step,
                                    num_responses=len(samples), num_tokens=st.num_tokens,
                                    response_tokens_total=st.response_tokens, lr=cfg.lr_effective, loss=st.loss,
                                    reward=mean_r, t_forward=st.t_forward, t_backward=st.t_backward,
                                    t_optimizer=st.t_optimizer, grad_norm=st.grad_norm,
                                    grad_norm_micro=st.grad_norm_micro, micro_batch=st.micro_batch,
                                    critic_loss=st.critic_loss, critic_grad_norm=st.critic_grad_norm,
                                    critic_grad_norm_micro=st.critic_grad_norm_micro, step_time=step_time,
                                    gen_time=gen_time, reward_time=reward_time, prep_time=st.prep_time,
                                    mem_gen_peak_bytes=gen_peak, mem_train_peak_bytes=train_peak)))
        rows.append(("sync", dict(t_start=t_s, duration=s_dur, step=step, policy_version=step + 1, bytes=nbytes)))
        return StepResult(rows, len(samples), st.num_tokens, mean_r, step_time, gen_time, u_dur, s_dur)

    def _samples(self, cfg: RunConfig, outs: list, examples: list, pids: list[int]) -> list:
        """The step's completions rewarded, as training samples (GRPO: with group-relative advantages)."""
        from rlsim.runner.algo import Sample, grpo_advantages

        tok, task, pad_id, G = self.ctx.tok, self.ctx.task, self.ctx.pad_id, cfg.G
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
        return samples


def _gen_step_rows(rows: Rows, step: int) -> Callable:
    """The engine's per-step callback: one gen_step row per engine step."""
    def on_step(s) -> None:
        rows.append(("gen_step", dict(t_start=s.t_start, duration=s.duration, step=step, policy_version=step,
                                      num_running=s.num_running, num_waiting=s.num_waiting,
                                      prefill_tokens=s.prefill_tokens, decode_tokens=s.decode_tokens,
                                      context_tokens=s.context_tokens, kv_usage=s.kv_usage, finished=s.finished)))
    return on_step


def _first_g(outs: list, P: int, G: int) -> list:
    """The first G completions of each prompt to finish, in prompt order (over-generation)."""
    by_prompt: dict[int, list] = {}
    for c in sorted(outs, key=lambda c: c.t_finished):
        lst = by_prompt.setdefault(c.tag, [])
        if len(lst) < G:
            lst.append(c)
    return [c for j in range(P) for c in by_prompt.get(j, [])]


def _response_rows(outs: list, samples: list, step: int) -> Rows:
    return [("response", dict(t_start=c.t_queued, duration=(c.t_finished or c.t_queued) - c.t_queued,
                              step=step, policy_version=step, prompt_id=s.prompt_id, group_index=s.group_index,
                              prompt_tokens=len(c.prompt_ids), response_tokens=len(c.token_ids), reward=s.reward,
                              consumed_step=step, t_queued=c.t_queued, t_first_token=c.t_first_token,
                              t_finished=c.t_finished)) for c, s in zip(outs, samples)]


def start(cfg: RunConfig, ctx, pl, log: Callable[[str], None]) -> Colocated:
    """Start the engine and the trainer ranks for `cfg` on placement `pl`, and warm both up outside the
    recorded run (weights unchanged)."""
    import torch

    from rlsim.runner.algo import Sample, Trainer
    from rlsim.runner.dp import DataParallel
    from rlsim.runner.engine import Engine

    pad_id, model_dir = ctx.pad_id, ctx.model_dir
    gen_threads = torch.get_num_threads()
    # colocated ranks: rank 0 generates on all its cores, then trains on its share like the other ranks
    train_threads = pl.threads(pl.train[0], cfg.threads) if pl.kind == "cpu" and cfg.train_devices > 1 else gen_threads
    engine = Engine(str(model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=cfg.seed)
    log(f"engine started in {engine.start_time_s:.1f} s ({engine.kv_cache_tokens} KV tokens, dtype {engine.dtype})")
    trainer = Trainer(ctx.policy, cfg, pad_id, ctx.device)
    sampling = engine.sampling(cfg.max_tokens, cfg.temperature, logprobs=cfg.off_policy == "tis")
    # warm-up outside the recorded run: the first engine steps carry one-time costs
    t_w = time.perf_counter()
    warm = engine.generate([(None, ids, 1) for ids in ctx.eval_ids[: min(len(ctx.eval_ids), 64)]], sampling)
    log(f"engine warm-up generate: {time.perf_counter() - t_w:.2f} s")
    # data-parallel ranks (none beyond this process with one training device): rank r trains on pl.train[r]
    dp = DataParallel(trainer, cfg, str(model_dir), pad_id, t0=0.0,
                      cores=[list(c) for c in pl.train] if pl.kind == "cpu" and cfg.train_devices > 1 else None,
                      gpus=[c[0] for c in pl.train] if pl.kind == "cuda" else None)
    # trainer warm-up on every rank (compilation with --compile) on the warm-up responses; weights are not changed
    try:
        set_threads(train_threads)
        t_train_warm = dp.warmup([Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [pad_id],
                                         reward=0.0, advantage=1.0) for c in warm])
        set_threads(gen_threads)
    except Exception as e:  # inductor needs a working C++ compiler on CPU; nothing has been recorded yet
        if not cfg.compile:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise RlsimError(f"--compile failed in torch.compile ({type(e).__name__}: {first}); install a C++ compiler "
                         "(e.g. apt install g++) or record without --compile") from None
    log(f"trainer warm-up{' (torch.compile)' if cfg.compile else ''}: {t_train_warm:.2f} s")
    return Colocated(ctx, engine, trainer, dp, sampling, gen_threads, train_threads, warm, t_train_warm,
                     peak=PhasePeak(ctx.device))
