"""Cold vs warm training passes, and the calibration's synthetic batches vs the run's real ones, paired in one process.

One process, P=32, G=8: the trainer's warm-up pass, then calibration-style passes right away ("cold"), then 10 real
updates each followed by passes of the calibration's synthetic batch and of the update's real batch at 1/8x, 1x and 8x,
in a shuffled order. Prints microseconds per token per kind (medians). docs/results.md section 6 quotes its output
(70 us/token cold vs 37 warm at 1x; synthetic and real batches 7 % apart).

    VLLM_CPU_KVCACHE_SPACE=2 flock /tmp/rlsim-heavy.lock python -m bench.calibration_warmth   # ~3 min on 2 cores
"""
import os
import random
import statistics as S
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
from rlsim.runner.config import RunConfig
from rlsim.runner.loop import setup
from rlsim.runner.engine import Engine
from rlsim.runner.algo import Trainer, Sample, grpo_advantages

def main() -> None:
    cfg = RunConfig(out="/tmp/rlsim-warmth.parquet", prompts=32, steps=1).validate()
    ctx = setup(cfg, print)
    engine = Engine(str(ctx.model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=0)
    trainer = Trainer(ctx.policy, cfg, ctx.pad_id, ctx.device)
    sampling = engine.sampling(cfg.max_tokens, cfg.temperature)
    warm = engine.generate([(None, ids, 1) for ids in ctx.eval_ids[:64]], sampling)
    trainer.warmup([Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [ctx.pad_id], reward=0.0,
                           advantage=1.0) for c in warm])
    stream = ctx.task.train_stream(123)
    prompts = [ctx.encode(next(stream).prompt) for _ in range(512)]
    resp = [list(c.token_ids) for c in warm if c.token_ids]
    G = cfg.G
    def calib_samples(R):
        out = []
        for i in range(R):
            j = i // G
            r = resp[(i * 7 + j) % len(resp)]
            out.append(Sample(prompt_ids=prompts[j % len(prompts)], response_ids=list(r), reward=float(i % 2),
                              prompt_id=j, group_index=i % G, advantage=1.0 if i % 2 else -1.0))
        return out
    def real_batch():
        st = ctx.task.train_stream(random.randrange(10**6))
        ex = [next(st) for _ in range(cfg.prompts)]
        outs = engine.generate([(j, ctx.encode(e.prompt), G) for j, e in enumerate(ex)], sampling)
        outs.sort(key=lambda c: (c.tag, c.index))
        ss = [Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [ctx.pad_id],
                     reward=ctx.task.reward(ctx.tok.decode(c.token_ids, skip_special_tokens=True), ex[c.tag]),
                     prompt_id=c.tag, group_index=k % G) for k, c in enumerate(outs)]
        for s, a in zip(ss, grpo_advantages([s.reward for s in ss], G, cfg.std_scale)):
            s.advantage = a
        return ss
    def prof(samples):
        st = trainer.profile(samples)
        return (st.t_forward + st.t_backward) / st.num_tokens * 1e6, st.num_tokens
    B = cfg.responses_per_update
    res = {}
    def rec(k, v):
        res.setdefault(k, []).append(v)
    # cold: the calibration as it runs today (right after warm-up)
    for f in (0.125, 0.125, 1.0, 8.0):
        rec(f"cold calib x{f}", prof(calib_samples(max(G, int(round(f * B / G)) * G)))[0])
    for step in range(10):
        ss = real_batch()
        st = trainer.update(ss, cfg.lr_effective)
        rec("update fwd+bwd", (st.t_forward + st.t_backward) / st.num_tokens * 1e6)
        order = ["calib1", "real1", "calib8", "real8", "calib1/8", "real1/8"]
        random.shuffle(order)
        for o in order:
            if o == "calib1":
                rec("warm calib x1", prof(calib_samples(B))[0])
            if o == "real1":
                rec("warm real x1", prof(ss)[0])
            if o == "calib8" and step % 3 == 0:
                rec("warm calib x8", prof(calib_samples(8 * B))[0])
            if o == "real8" and step % 3 == 0:
                rec("warm real x8", prof((ss * 8))[0])
            if o == "calib1/8":
                rec("warm calib x1/8", prof(calib_samples(B // 8))[0])
            if o == "real1/8":
                rec("warm real x1/8", prof(ss[: B // 8])[0])
    for k, v in res.items():
        print(f"{k:18s} n={len(v):2d} us/token median {S.median(v):.3f}  all {[round(x,2) for x in v]}")
    print("tokens: calib x1", prof(calib_samples(B))[1], "real x1", prof(ss)[1], "update", st.num_tokens, "micro",
          trainer.micro_for(B), cfg.micro)


if __name__ == "__main__":
    main()
