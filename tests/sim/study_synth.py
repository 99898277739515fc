"""Small synthetic traces for the sweep / chart / report / Perfetto tests (made by
rlsim.replay.synthetic), and a stand-in `evaluate` for the sweep machinery alone."""
from __future__ import annotations

from pathlib import Path

from rlsim.replay.synthetic import SynthSpec, synthetic_trace

def make_trace(path: Path, *, prompts: int = 8, group: int = 4, updates: int = 6, max_num_seqs: int = 16,
               seed: int = 0, eval_every: int = 2, lr: float = 3e-4, kv_cache_tokens: int = 16384) -> Path:
    """A small vLLM-like recording made by rlsim.replay.synthetic (the one generator), with a learning
    curve that rises over a few updates and the metadata a real `rlrun record` writes."""
    spec = SynthSpec(prompts=prompts, group=group, steps=updates, max_num_seqs=max_num_seqs, seed=seed,
                     eval_every=eval_every, kv_cache_tokens=kv_cache_tokens, max_tokens=40, min_tokens=8,
                     score_scale=4.0 * prompts * group, noise=0.01)
    meta = {"created": "2026-11-29T21:30:00Z",
            "config": {"lr": lr, "lr_ref_batch": prompts * group, "temperature": 1.0, "task": "add2", "max_tokens": 48},
            "engine": {"name": "vllm", "version": "0.32.0", "dtype": "float32", "start_time_s": 2.1},
            "hardware": {"device_count": 1, "cpu_cores": 2, "memory_gb": 23.4},
            "model": {"name": "tiny-llama-add2", "architecture": "LlamaForCausalLM", "hidden": 128, "layers": 3,
                      "heads": 2, "head_dim": 64, "vocab": 23},
            "packages": {"rlsim": "0.1.0", "python": "3.11"}}
    return synthetic_trace(path, spec, meta_overrides=meta)


class FakeOutcome:
    def __init__(self, d):
        self._d = d

    def to_dict(self):
        return dict(self._d)


def fake_evaluate(study, cfg):
    """A deterministic stand-in for `sim.whatif.evaluate` (tests of the sweep machinery alone)."""
    p = cfg.prompts or study["prompts"]
    g = cfg.group or study["group"]
    b = p * g
    ref = study["prompts"] * study["group"]
    sigma = (min(b, 1024) / ref) ** 0.6
    rho = 1.0 if b <= 512 else b / 512 * (1.2 if cfg.lr_rule == "fixed" else 1.0)
    ratio = rho / sigma
    return FakeOutcome({"prompts": p, "group": g, "lr_rule": cfg.lr_rule or "sqrt", "responses_per_s": 100 * sigma,
                        "step_time_s": b / (100 * sigma), "sigma": sigma, "rho": rho, "time_to_target_ratio": ratio,
                        "regime": "falls" if ratio < 0.95 else ("rises" if ratio > 1.05 else "flat"),
                        "warnings": ["extrapolating"] if b > 16 * ref else []})
