"""A calibration object over a real engine and trainer in this process, for benches that time calibration passes.

`rig(out, prompts=32)` sets up the default model at P=`prompts`, G=8, starts a vLLM engine and a trainer, generates
warm-up responses (their lengths make the calibration's batches) and returns (cfg, trainer, `_Calibration`). Set
VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vLLM (the benches do it at their top).
"""
from __future__ import annotations

import random

from rlsim.runner.algo import Trainer
from rlsim.runner.calibrate import _Calibration
from rlsim.runner.config import RunConfig
from rlsim.runner.engine import Engine
from rlsim.runner.loop import setup


def rig(out: str, prompts: int = 32):
    cfg = RunConfig(out=out, prompts=prompts, group=8, steps=1).validate()
    ctx = setup(cfg, print)
    engine = Engine(str(ctx.model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=0)
    trainer = Trainer(ctx.policy, cfg, ctx.pad_id, ctx.device)
    warm = engine.generate([(None, ids, 1) for ids in ctx.eval_ids[:64]],
                           engine.sampling(cfg.max_tokens, cfg.temperature))
    stream = ctx.task.train_stream(123)
    cal = _Calibration(engine, trainer, cfg, [ctx.encode(next(stream).prompt) for _ in range(512)],
                       [list(c.token_ids) for c in warm if c.token_ids], None, random.Random(0))
    return cfg, trainer, cal
