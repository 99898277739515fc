"""Hand-made FittedModels with round numbers, for exact-timeline tests of the SimPy model."""
import math

import numpy as np

from rlsim.replay.robust import AffineModel, FitQuality
from rlsim.replay.models import FittedModels, GenOverheadModel, GenStepModel, LengthModel, Recorded

Q = FitQuality(0, math.nan, math.nan, math.nan, math.nan)


def affine(a=0.0, b=0.0, name="x"):
    return AffineModel(name, "x", a, b, Q)


def hand_models(workload, *, c=(1.0, 0.1, 0.01, 0.001), update=(0.5, 0.1), sync=0.2, reward=0.0, prep=0.0, other=0.0,
                overhead=(0.0, 0.0, 0.0), max_num_seqs=2, kv_cache_tokens=4096, block_size=16, prompts=1, group=2):
    """workload: list of (prompt lengths, response lengths) per update, replayed with lengths='recorded'."""
    wl = tuple((np.asarray(p, np.int64), np.asarray(L, np.int64)) for p, L in workload)
    rec = Recorded(step=np.arange(len(wl)), step_time=np.ones(len(wl)), gen_time=np.ones(len(wl)),
                   train_time=np.ones(len(wl)), sync_time=np.ones(len(wl)),
                   num_responses=np.array([len(w[1]) for w in wl], float), gen_steps=np.ones(len(wl)), workload=wl)
    allp = np.concatenate([w[0] for w in wl])
    allL = np.concatenate([w[1] for w in wl])
    return FittedModels(
        gen=GenStepModel(*c, quality=Q, concurrency_range=(1, max_num_seqs)),
        gen_overhead=GenOverheadModel(*overhead, quality=Q),
        lengths=LengthModel(prompt_tokens=allp, response_tokens=allL, max_tokens=int(allL.max()), prefill_ratio=1.0),
        update=affine(*update), prep=affine(0.0, prep), reward=affine(0.0, reward), other=affine(other, 0.0),
        sync=affine(sync, 0.0), sync_bytes=1.0,
        engine={"max_num_seqs": max_num_seqs, "kv_cache_tokens": kv_cache_tokens, "block_size": block_size,
                "max_model_len": 256},
        config={"algo": "grpo", "prompts": prompts, "group": group, "lr_rule": "sqrt"}, recorded=rec)
