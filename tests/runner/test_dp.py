"""Data-parallel training (runner/dp.py: real gloo ranks in spawned processes) and the TIS off-policy weights,
on a tiny random Llama saved in a tmp folder (no downloads, no engine)."""
from __future__ import annotations

import math
import os
import random
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlsim.runner.algo import Sample, Trainer, grpo_advantages, pack, token_logprobs  # noqa: E402
from rlsim.runner.config import RunConfig  # noqa: E402
from rlsim.runner.dp import DataParallel  # noqa: E402

VOCAB = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama of ~4.5k parameters (fp32), saved as a HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    d = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def _samples(prompts, group, seed=0):
    """P groups of G samples with random prompts, responses, 0/1 rewards and GRPO advantages."""
    rng = random.Random(seed)
    out = []
    for j in range(prompts):
        prompt = [1] + [rng.randint(3, VOCAB - 1) for _ in range(rng.randint(3, 7))]
        for g in range(group):
            out.append(Sample(prompt_ids=prompt,
                              response_ids=[rng.randint(3, VOCAB - 1) for _ in range(rng.randint(1, 15))],
                              reward=float(rng.random() < 0.5), prompt_id=j, group_index=g))
    for s, a in zip(out, grpo_advantages([s.reward for s in out], group)):
        s.advantage = a if group > 1 else rng.gauss(0, 1)
    return out


def _capture(tr):
    """Record the gradients each optimizer (policy, critic) steps with."""
    seen = {}
    for name, opt, mod in (("policy", tr.opt, tr.policy), ("critic", tr.critic_opt, tr.critic)):
        if opt is None:
            continue
        orig = opt.step

        def step(orig=orig, name=name, mod=mod):
            seen[name] = torch.cat([p.grad.flatten().clone() for p in mod.parameters()])
            return orig()

        opt.step = step
    return seen


def _flat(mod):
    return torch.cat([p.detach().flatten() for p in mod.parameters()])


def _single(model_dir, cfg, ss, lr):
    tr = Trainer(_load(model_dir), cfg.with_(train_devices=1), 0, "cpu")
    seen = _capture(tr)
    st = tr.update(ss, lr)
    return st, seen, tr


CONFIGS = {
    # clipping active (the gradient norm is above clip_grad), so the clip uses the all-reduced norm
    "token": RunConfig(prompts=4, group=4, micro_batch=4, train_devices=2, loss_agg="token", clip_grad=0.2),
    "seq": RunConfig(prompts=4, group=4, micro_batch=4, train_devices=2, loss_agg="seq", clip_grad=0.2),
    "ppo": RunConfig(algo="ppo", prompts=8, micro_batch=2, train_devices=2),
}


@pytest.fixture(scope="module")
def parallel(model_dir):
    """Rank 0 of each config's N=2 run: (DataParallel, its Trainer, captured gradients). The helpers are
    started at once (their start is mostly importing torch and transformers, one core each), each pinned
    to its own core; rank 0 (this process) runs on one thread meanwhile: on 2 cores, two ranks with a full
    intra-op pool each oversubscribe the cores and an update of this tiny model takes seconds, not ms."""
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    t0 = time.perf_counter()

    def start(i_name):
        i, name = i_name
        cfg = CONFIGS[name]
        tr = Trainer(_load(model_dir), cfg, 0, "cpu")
        seen = _capture(tr)
        pin = [[cores[0]], [cores[i % len(cores)]]] if len(cores) >= 2 else None
        return name, (DataParallel(tr, cfg, str(model_dir), 0, t0=t0, cores=pin), tr, seen)

    with ThreadPoolExecutor(len(CONFIGS)) as ex:
        runs = dict(ex.map(start, enumerate(CONFIGS, start=1)))
    yield runs
    for dp, _, _ in runs.values():
        dp.close()
    torch.set_num_threads(threads)


def _parallel(parallel, name, ss, lr):
    dp, tr, seen = parallel[name]
    st, rows, ars = dp.update(ss, lr)
    dp.close()
    assert all(not p.is_alive() for p in dp._procs)
    dp.close()  # idempotent
    return st, seen, tr, rows, ars


def _assert_same_update(a, b, critic=False):
    (st1, g1, tr1), (st2, g2, tr2) = a, b
    assert st2.grad_norm == pytest.approx(st1.grad_norm, rel=1e-5)
    assert st2.grad_norm_micro == pytest.approx(st1.grad_norm_micro, rel=1e-5)
    assert st2.loss == pytest.approx(st1.loss, rel=1e-5, abs=1e-7)
    assert torch.allclose(g2["policy"], g1["policy"], rtol=1e-5, atol=1e-7)
    assert torch.allclose(_flat(tr2.policy), _flat(tr1.policy), rtol=0, atol=1e-6)
    if critic:
        assert st2.critic_grad_norm == pytest.approx(st1.critic_grad_norm, rel=1e-5)
        assert st2.critic_loss == pytest.approx(st1.critic_loss, rel=1e-5)
        assert torch.allclose(g2["critic"], g1["critic"], rtol=1e-5, atol=1e-7)
        assert torch.allclose(_flat(tr2.critic), _flat(tr1.critic), rtol=0, atol=1e-6)


@pytest.mark.parametrize("loss_agg", ["token", "seq"])
def test_two_ranks_equal_one_rank_grpo(model_dir, parallel, loss_agg):
    """N=2 gloo ranks give the single-rank gradient (before clipping: grad_norm; after: the optimizer's
    input), loss, micro-norm RMS and new weights; clipping is active (norm above clip_grad)."""
    cfg = CONFIGS[loss_agg]
    ss = _samples(4, 4, seed=1)
    ref = _single(model_dir, cfg, ss, 1e-2)
    assert ref[0].grad_norm > cfg.clip_grad
    st, seen, tr, rows, ars = _parallel(parallel, loss_agg, ss, 1e-2)
    _assert_same_update(ref, (st, seen, tr))
    assert not torch.allclose(_flat(tr.policy), _flat(_load(model_dir)), atol=1e-4)  # weights moved
    assert st.num_tokens == ref[0].num_tokens and st.response_tokens == ref[0].response_tokens
    # rows: one per rank, sane times on the run clock, the gradient's bytes
    n_params = sum(p.numel() for p in tr.policy.parameters())
    assert [r["rank"] for r in rows] == [0, 1] and [r["rank"] for r in ars] == [0, 1]
    for r in rows:
        assert r["duration"] > 0 and r["t_start"] > 0 and r["num_responses"] == 8
        assert r["duration"] == pytest.approx(r["t_forward"] + r["t_backward"])
    assert sum(r["num_tokens"] for r in rows) == st.num_tokens
    for a in ars:
        assert a["duration"] > 0 and a["bytes"] == 4 * n_params
        assert a["t_start"] >= min(r["t_start"] for r in rows)
    assert abs(rows[0]["t_start"] - rows[1]["t_start"]) < 5.0  # one clock


def test_two_ranks_equal_one_rank_ppo(model_dir, parallel):
    cfg = CONFIGS["ppo"]
    ss = _samples(8, 1, seed=2)
    ref = _single(model_dir, cfg, ss, 1e-2)
    st, seen, tr, rows, ars = _parallel(parallel, "ppo", ss, 1e-2)
    _assert_same_update(ref, (st, seen, tr), critic=True)
    n_params = sum(p.numel() for p in tr.policy.parameters()) + sum(p.numel() for p in tr.critic.parameters())
    assert all(a["bytes"] == 4 * n_params for a in ars)


def test_one_rank_is_the_trainer(model_dir):
    cfg = RunConfig(prompts=2, group=4, micro_batch=4)
    ss = _samples(2, 4, seed=3)
    ref = _single(model_dir, cfg, ss, 1e-3)
    tr = Trainer(_load(model_dir), cfg, 0, "cpu")
    seen = _capture(tr)
    with DataParallel(tr, cfg, str(model_dir), 0, t0=time.perf_counter()) as dp:
        st, rows, ars = dp.update(ss, 1e-3)
        assert not dp._procs
    assert st.grad_norm == ref[0].grad_norm and torch.equal(seen["policy"], ref[1]["policy"])
    assert torch.equal(_flat(tr.policy), _flat(ref[2].policy))
    assert rows[0]["rank"] == 0 and rows[0]["duration"] > 0 and ars[0]["bytes"] == 0


def _own_logprobs(model_dir, ss):
    with torch.no_grad():
        lp = token_logprobs(_load(model_dir), pack(ss, 256, 0, "cpu")).tolist()
    out, k = [], 0
    for s in ss:
        out.append(lp[k:k + len(s.response_ids)])
        k += len(s.response_ids)
    return out


def test_tis_weights(model_dir):
    """--off-policy tis: without behaviour log-probs nothing changes; behaviour = the trainer's own log-probs:
    weight 1, the plain update; behaviour lower by log(10): every weight capped at tis_cap, so the
    gradient is tis_cap times the plain one."""
    import copy

    base = RunConfig(prompts=3, group=4, micro_batch=4, clip_grad=0.0)
    ss = _samples(3, 4, seed=4)
    none = _single(model_dir, base, ss, 1e-3)
    tis = base.with_(off_policy="tis", tis_cap=2.0)
    st0, g0, tr0 = _single(model_dir, tis, ss, 1e-3)  # no behaviour log-probs: weight 1, bit-identical
    assert torch.equal(g0["policy"], none[1]["policy"]) and torch.equal(_flat(tr0.policy), _flat(none[2].policy))
    assert st0.extra["tis_tokens"] == 0
    own = _own_logprobs(model_dir, ss)
    same = [copy.copy(s) for s in ss]
    for s, lp in zip(same, own):
        s.behavior_logprobs = lp
    st1, g1, tr1 = _single(model_dir, tis, same, 1e-3)
    assert st1.extra["tis_weight_mean"] == pytest.approx(1.0, abs=1e-5) and st1.extra["tis_capped_frac"] == 0.0
    assert st1.extra["tis_tokens"] == sum(len(s.response_ids) for s in ss)
    assert torch.allclose(g1["policy"], none[1]["policy"], rtol=1e-5, atol=1e-7)
    assert torch.allclose(_flat(tr1.policy), _flat(none[2].policy), rtol=0, atol=1e-6)
    low = [copy.copy(s) for s in ss]
    for s, lp in zip(low, own):
        s.behavior_logprobs = [x - math.log(10) for x in lp]
    st2, g2, _ = _single(model_dir, tis, low, 1e-3)
    assert st2.extra["tis_capped_frac"] == 1.0 and st2.extra["tis_weight_mean"] == pytest.approx(2.0)
    assert torch.allclose(g2["policy"], 2.0 * none[1]["policy"], rtol=1e-5, atol=1e-7)
    assert st2.grad_norm == pytest.approx(2.0 * none[0].grad_norm, rel=1e-5)
