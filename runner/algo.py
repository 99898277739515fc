"""GRPO and PPO updates on packed sequences, with gradient-noise diagnostics.

- GRPO (DeepSeekMath's, as simplified in nanochat's chat_rl.py): group-relative advantages (divided by the
  group's std when `std_scale`), the PPO-clipped policy loss (with one update per batch exactly REINFORCE with
  a group baseline, no old-log-prob pass), token or sequence aggregation; no KL penalty, no entropy bonus.
- PPO: a value model (a copy of the policy's decoder with a zero-initialised scalar head), GAE per sequence,
  the clipped policy loss and a squared-error value loss.
- Off-policy correction (`--off-policy tis`): truncated importance sampling, each token's loss weighted by
  min(exp(logp_train - logp_behavior), `tis_cap`) with the engine's recorded behaviour log-probs.
- Packing (`pack`): a group's prompt once, then its G responses, an attention mask letting each response see
  the prompt and itself only; logits only at response positions.
- Data-parallel ranks (`runner/dp.py`) run this code with a hook (`dp`) that all-reduces the batch totals, the
  gradients and the diagnostic sums.
- Gradient diagnostics: `grad_norm` (full batch, before clipping), `grad_norm_micro` (RMS of the micro-batch
  norms) and `micro_batch`: the two batch sizes of the gradient-noise-scale estimator.

Each rule in full: docs/usage.md, "GRPO, PPO and the gradient diagnostics".
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    prompt_id: int = 0
    group_index: int = 0
    advantage: float = 0.0  # GRPO: per-sequence advantage
    # log-prob the engine sampled each response token with (one per response token; None/empty: unknown)
    behavior_logprobs: list[float] | None = None


@dataclass
class UpdateStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    grad_norm_micro: float = 0.0
    micro_batch: int = 0
    critic_loss: float | None = None
    critic_grad_norm: float | None = None
    critic_grad_norm_micro: float | None = None
    t_forward: float = 0.0
    t_backward: float = 0.0
    t_optimizer: float = 0.0
    prep_time: float = 0.0
    num_tokens: int = 0
    response_tokens: int = 0
    optimizer_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def grpo_advantages(rewards: list[float], group: int, std_scale: bool = True) -> list[float]:
    """Group-relative advantages; rewards are ordered group by group."""
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group)
    a = r - r.mean(dim=1, keepdim=True)
    if std_scale:
        a = a / (r.std(dim=1, keepdim=True, unbiased=True) + 1e-6) if group > 1 else a
    return a.flatten().tolist()


def gae(values: list[float], reward: float, gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """GAE over one response: `values[t]` is V before response token t; the reward arrives after the last."""
    T = len(values)
    adv = [0.0] * T
    last = 0.0
    for t in range(T - 1, -1, -1):
        nxt = values[t + 1] if t + 1 < T else 0.0
        r = reward if t == T - 1 else 0.0
        last = r + gamma * nxt - values[t] + gamma * lam * last
        adv[t] = last
    return adv, [a + v for a, v in zip(adv, values)]


def pack(samples: list[Sample], row_tokens: int, pad_id: int, device,
         share_prompts: bool = True) -> dict[str, torch.Tensor]:
    """Lay sequences out in rows; return ids, position ids, the attention mask and the response targets.

    A unit is a run of consecutive samples with the same prompt (a GRPO group, split where it would
    exceed `row_tokens`; one sample when `share_prompts` is off): the prompt once, then each response without its last
    token, positions restarting at the prompt's length for every response. Units are packed greedily
    into rows of about `row_tokens` (a longer unit gets a row of its own). Attention (bool mask, True =
    attend): within a unit, causal, and a response token sees the prompt and its own response only.
    The target of response token k is predicted at the position before it: the prompt's last token for
    k = 0. So each log-prob and gradient is the one of the sequence on its own, while a group's prompt
    is computed once instead of G times.

    Returns input_ids, position_ids (rows, width), attention_mask (rows, 1, width, width), tgt_index
    (flat row * width + col), tgt_tokens and seq_of_tgt (one per response token, in sample order), and
    num_tokens: the tokens trained on, each unit's prompt once plus every response token (what the
    simulator's update-cost model counts).
    """
    units: list[tuple[list[int], list[Sample]]] = []
    unit_len = 0
    for smp in samples:
        add = len(smp.response_ids) - 1
        # a unit stays within one row (a group longer than that repeats its prompt), so the row width and
        # the (width x width) mask stay bounded by row_tokens or one sequence, as without sharing
        if share_prompts and units and units[-1][0] == smp.prompt_ids and unit_len + add <= row_tokens:
            units[-1][1].append(smp)
            unit_len += add
        else:
            units.append((smp.prompt_ids, [smp]))
            unit_len = len(smp.prompt_ids) + add
    # per row: token ids, positions, branch (0: prompt, i: response i of the unit), unit id
    rows: list[tuple[list[int], list[int], list[int], list[int]]] = []
    where: list[tuple[int, int]] = []  # (row, col) predicting each target
    tgt_tokens: list[int] = []
    seq_of_tgt: list[int] = []
    si = 0
    for uid, (prompt, group) in enumerate(units):
        P = len(prompt)
        length = P + sum(len(smp.response_ids) - 1 for smp in group)
        if not rows or (rows[-1][0] and len(rows[-1][0]) + length > row_tokens):
            rows.append(([], [], [], []))
        ids, pos, br, un = rows[-1]
        r, col = len(rows) - 1, len(ids)
        last_prompt = col + P - 1
        ids.extend(prompt)
        pos.extend(range(P))
        br.extend([0] * P)
        un.extend([uid] * P)
        col += P
        for b, smp in enumerate(group, start=1):
            resp = smp.response_ids
            inp = resp[:-1]
            ids.extend(inp)
            pos.extend(range(P, P + len(inp)))
            br.extend([b] * len(inp))
            un.extend([uid] * len(inp))
            where.extend([(r, last_prompt)] + [(r, col + k) for k in range(len(inp))])
            tgt_tokens.extend(resp)
            seq_of_tgt.extend([si] * len(resp))
            col += len(inp)
            si += 1
    width = max(len(r[0]) for r in rows)
    n = len(rows)
    ids_t = torch.full((n, width), pad_id, dtype=torch.long)
    pos_t = torch.zeros((n, width), dtype=torch.long)
    br_t = torch.zeros((n, width), dtype=torch.long)
    un_t = -2 - torch.arange(width).repeat(n, 1)  # pad tokens: a unit each, attending to themselves only
    for i, (ids, pos, br, un) in enumerate(rows):
        L = len(ids)
        ids_t[i, :L], pos_t[i, :L] = torch.tensor(ids), torch.tensor(pos)
        br_t[i, :L], un_t[i, :L] = torch.tensor(br), torch.tensor(un)
    c = torch.arange(width)
    # (rows, query, key): same unit, key not after query, key in the prompt or in the query's own response
    mask = ((un_t[:, :, None] == un_t[:, None, :]) & (c[None, None, :] <= c[None, :, None])
            & ((br_t[:, None, :] == 0) | (br_t[:, :, None] == br_t[:, None, :])))
    return {
        "input_ids": ids_t.to(device), "position_ids": pos_t.to(device), "attention_mask": mask[:, None].to(device),
        "tgt_index": torch.tensor([r * width + col for r, col in where], dtype=torch.long, device=device),
        "tgt_tokens": torch.tensor(tgt_tokens, dtype=torch.long, device=device),
        "seq_of_tgt": torch.tensor(seq_of_tgt, dtype=torch.long, device=device),
        "num_tokens": sum(len(prompt) + sum(len(smp.response_ids) for smp in group) for prompt, group in units),
    }


def _rms(xs: list[float]) -> float:
    """Root mean square of the micro-batch (or step) norms."""
    return math.sqrt(sum(x * x for x in xs) / len(xs))


def _hidden(model, batch) -> torch.Tensor:
    """Final hidden states of the decoder, flattened to (rows*width, hidden)."""
    out = model.base_model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                           attention_mask=batch["attention_mask"], use_cache=False)
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return h.reshape(-1, h.shape[-1])


def token_logprobs(policy, batch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the response targets, logits computed only at those positions."""
    h = _hidden(policy, batch).index_select(0, batch["tgt_index"])
    logits = policy.get_output_embeddings()(h).float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return -F.cross_entropy(logits, batch["tgt_tokens"], reduction="none")


class ValueModel(torch.nn.Module):
    """A copy of the policy's decoder with a zero-initialised scalar head."""

    def __init__(self, policy):
        super().__init__()
        self.base_model = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def values(self, batch) -> torch.Tensor:
        # value of the state before each response token = output at the position that predicts it
        h = _hidden(self, batch).index_select(0, batch["tgt_index"])
        return self.head(h).squeeze(-1).float()


class _GradAccumulator:
    """Full-batch gradient as a weighted sum of micro-batch gradients, with each micro norm recorded.

    The accumulators are views of one flat buffer (when all parameters share dtype and device), so a
    data-parallel all-reduce sums them in place with one collective and no copy."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self.flat = None
        if self.params and len({(p.dtype, p.device) for p in self.params}) == 1:
            self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype,
                                    device=self.params[0].device)
            offs = [0]
            for p in self.params:
                offs.append(offs[-1] + p.numel())
            self.acc = [self.flat[a:b].view_as(p) for p, a, b in zip(self.params, offs, offs[1:])]
        else:
            self.acc = [torch.zeros_like(p) for p in self.params]
        self.micro_sq: list[float] = []

    def buffers(self) -> list[torch.Tensor]:
        """The accumulated gradient as tensors to all-reduce (the flat buffer, or one per parameter)."""
        return [self.flat] if self.flat is not None else self.acc

    def add(self, weight: float) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self.micro_sq.append(float(norm) ** 2)
        torch._foreach_add_(self.acc, grads, alpha=weight)
        for p in self.params:
            p.grad = None

    def finish(self, sq_sum: float | None = None, count: float | None = None) -> tuple[float, float]:
        """Set the gradients; return the full norm and the micro-norm RMS (over `sq_sum`/`count`, the
        all-reduced sum of squared micro norms and their number, when given)."""
        for p, a in zip(self.params, self.acc):
            p.grad = a
        full = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a) for a in self.acc])))
        if sq_sum is None:
            sq_sum, count = sum(self.micro_sq), len(self.micro_sq)
        rms = math.sqrt(sq_sum / max(1, count))
        return full, rms


class Trainer:
    """Owns the policy (and PPO critic) and their Adam optimizers; `update(samples, lr)` runs one RL step."""

    def __init__(self, policy, cfg, pad_id: int, device):
        self.policy, self.cfg, self.pad_id, self.device = policy, cfg, pad_id, device
        self.policy.train()
        self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr_effective, betas=(0.9, cfg.adam_beta2),
                                    weight_decay=cfg.weight_decay)
        self.critic = self.critic_opt = None
        if cfg.algo == "ppo":
            self.critic = ValueModel(policy).to(device)
            self.critic.train()
            self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr, betas=(0.9, cfg.adam_beta2))
        # packed row length: short rows keep the masked-out attention small; a group longer than a row
        # repeats its prompt per row. 256 holds a whole add2 group (G=8, ~167 tokens) in one row: B=1024,
        # 2 CPU cores, compiled 0.98 s vs 1.36 s at 128 (groups split 6 + 2), eager 1.21 vs 1.60 s
        # (`bench/train_step.py --variants compile:128,compile:256,eager:128,eager:256`)
        self.row_tokens = 256
        # lay each group's prompt out once (see `pack`); off: one unit per sample, for A/B measurements
        self.share_prompts = True
        self.cuda = torch.device(device).type == "cuda"
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if self.cuda and torch.cuda.is_bf16_supported() else None)
        if cfg.compile:
            # in place (Module.compile), so state_dict keys, the weight sync and the optimizer see the same
            # parameters; dynamic: micro-batches differ in rows and row width. Inductor fuses the norms,
            # rotary and SiLU-gate elementwise ops that dominate after the matmuls at hidden 128.
            for m in (self.policy, self.critic):
                if m is not None:
                    m.base_model.compile(dynamic=True)

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _policy_loss(self, logp, old_logp, adv_tok, seq_of_tgt, n_seq, denom_tokens, tis_w=None):
        ratio = torch.exp(logp - old_logp)
        eps = self.cfg.clip_eps
        per_tok = -torch.minimum(ratio * adv_tok, torch.clamp(ratio, 1 - eps, 1 + eps) * adv_tok)
        if tis_w is not None:  # --off-policy tis: detached truncated importance weights
            per_tok = per_tok * tis_w
        if self.cfg.loss_agg == "token":
            return per_tok.sum() / denom_tokens
        lens = torch.bincount(seq_of_tgt, minlength=n_seq).clamp(min=1).float()
        per_seq = torch.zeros(n_seq, device=per_tok.device).index_add_(0, seq_of_tgt, per_tok) / lens
        return per_seq.sum() / max(1, n_seq)

    def warmup(self, samples: list[Sample]) -> float:
        """Run the training graphs once (forward, backward, and the no-grad log-prob pass when rollouts are
        reused) on `samples` without touching weights or optimizer state, so compilation and first-call
        costs stay out of the recorded updates. Returns the seconds it took."""
        t0 = time.perf_counter()
        # as many responses as a real micro-batch: compiled graphs carry size guards (one seen:
        # rows x width <= 4096), so a smaller warm-up batch would recompile at the first real update
        samples = [samples[i % len(samples)] for i in range(max(len(samples), self.cfg.micro))]
        b = pack(samples, self.row_tokens, self.pad_id, self.device, self.share_prompts)
        with self.autocast or _null():
            loss = token_logprobs(self.policy, b, self.cfg.temperature).mean()
            if self.critic is not None:
                loss = loss + self.critic.values(b).mean()
        loss.backward()
        for m in (self.policy, self.critic):
            if m is not None:
                m.zero_grad(set_to_none=True)
        if self.cfg.minibatches > 1 or self.cfg.epochs > 1:
            self._old_logprobs([b])
        self._sync()
        return time.perf_counter() - t0

    def micro_for(self, responses: int) -> int:
        """Responses per micro-batch of an update of `responses` (the rule of RunConfig.micro at that batch)."""
        cfg = self.cfg
        per_update = max(responses // (cfg.minibatches * cfg.train_devices), 1)
        if cfg.micro_batch:
            return min(cfg.micro_batch, per_update)
        return max(min(per_update, 4), per_update // 4)

    def profile(self, samples: list[Sample], micro: int | None = None) -> UpdateStats:
        """Time the forward and backward passes of one update on `samples` for calibration: micro-batches
        as `update` packs them (at this batch's micro-batch size, or `micro` responses), gradients accumulated
        and normed as `update` does, then discarded. No optimizer step, no clipping: weights and optimizer state
        are untouched (gradients are left None). `st.duration`-like total: t_forward + t_backward."""
        st = UpdateStats()
        m = micro or self.micro_for(len(samples))
        st.micro_batch = m
        micro_samples = [samples[i:i + m] for i in range(0, len(samples), m)]
        micros = [pack(s, self.row_tokens, self.pad_id, self.device, self.share_prompts) for s in micro_samples]
        st.num_tokens = sum(b["num_tokens"] for b in micros)
        st.response_tokens = sum(len(s.response_ids) for s in samples)
        self._step(micros, micro_samples, None, st, apply=False)
        self._tis_finish(st)
        return st

    def _tis_weights(self, logp_train: torch.Tensor, ss: list[Sample], sums: list[float]) -> torch.Tensor:
        """Truncated importance weights min(exp(logp_train - logp_behavior), tis_cap), one per response token
        of `ss` (in `pack`'s target order), detached; 1 where a sample has no behaviour log-probs. Adds
        (sum of weights, tokens capped, tokens with behaviour log-probs) to `sums`."""
        beh, has = [], []
        for s in ss:
            n = len(s.response_ids)
            b = s.behavior_logprobs
            if b:
                if len(b) != n:
                    raise ValueError(f"sample has {len(b)} behavior_logprobs for {n} response tokens")
                beh.extend(b)
                has.extend([True] * n)
            else:
                beh.extend([0.0] * n)
                has.extend([False] * n)
        lp = logp_train.detach().float()
        beh_t = torch.tensor(beh, dtype=torch.float32, device=lp.device)
        has_t = torch.tensor(has, dtype=torch.bool, device=lp.device)
        ratio = torch.exp(lp - beh_t)
        cap = self.cfg.tis_cap
        w = torch.where(has_t, torch.clamp(ratio, max=cap), torch.ones_like(ratio))
        sums[0] += float(w[has_t].sum())
        sums[1] += float((has_t & (ratio > cap)).sum())
        sums[2] += float(has_t.sum())
        return w

    @staticmethod
    def _tis_finish(st: UpdateStats) -> None:
        sums = st.extra.pop("_tis", None)
        if sums is not None:
            st.extra["tis_weight_mean"] = sums[0] / sums[2] if sums[2] else 1.0
            st.extra["tis_capped_frac"] = sums[1] / sums[2] if sums[2] else 0.0
            st.extra["tis_tokens"] = int(sums[2])

    def _old_logprobs(self, micros) -> list[torch.Tensor]:
        with torch.no_grad():
            return [token_logprobs(self.policy, b, self.cfg.temperature).detach() for b in micros]

    def update(self, samples: list[Sample], lr: float, dp=None) -> UpdateStats:
        """One RL step on `samples`. `dp`: data-parallel hook (`runner/dp.py`; None: this process alone), an
        object with `totals(n_tgt, n_seq) -> (n_tgt, n_seq)`, the target tokens and sequences of the whole
        optimizer step summed over all ranks (called once per optimizer step, before its first forward), and
        `allreduce(tensors, scalars) -> scalars`, which sums the gradient buffers in place over the ranks and
        returns the summed float scalars (called once per optimizer step, after the last backward). With it,
        `samples` is this rank's shard and the step's gradient, loss and norms are those of the whole batch."""
        cfg, st = self.cfg, UpdateStats()
        for g in self.opt.param_groups:
            g["lr"] = lr
        reuse = cfg.minibatches > 1 or cfg.epochs > 1
        m = cfg.micro
        st.micro_batch = m
        # micro-batches, packed once and reused across epochs
        micro_samples = [samples[i:i + m] for i in range(0, len(samples), m)]
        micros = [pack(s, self.row_tokens, self.pad_id, self.device, self.share_prompts) for s in micro_samples]
        st.num_tokens = sum(b["num_tokens"] for b in micros)
        st.response_tokens = sum(len(s.response_ids) for s in samples)
        old = None
        if reuse:  # only with rollout reuse do the old log-probs differ from the current ones
            t0 = time.perf_counter()
            old = self._old_logprobs(micros)
            self._sync()
            st.prep_time = time.perf_counter() - t0
        per_mb = len(micros) // cfg.minibatches if len(micros) >= cfg.minibatches else 1
        norms, micro_norms, c_norms, c_micro, losses, c_losses = [], [], [], [], [], []
        gen = torch.Generator().manual_seed(cfg.seed)
        for epoch in range(cfg.epochs):
            order = list(range(len(micros)))
            if epoch > 0:
                order = torch.randperm(len(micros), generator=gen).tolist()
            for k in range(0, len(order), per_mb):
                idx = order[k:k + per_mb]
                f, fm, cf, cfm, lo, clo = self._step([micros[i] for i in idx], [micro_samples[i] for i in idx],
                                                     None if old is None else [old[i] for i in idx], st, dp=dp)
                norms.append(f)
                micro_norms.append(fm)
                losses.append(lo)
                if cf is not None:
                    c_norms.append(cf)
                    c_micro.append(cfm)
                    c_losses.append(clo)
                st.optimizer_steps += 1
        st.grad_norm, st.grad_norm_micro, st.loss = _rms(norms), _rms(micro_norms), sum(losses) / len(losses)
        if c_norms:
            st.critic_grad_norm, st.critic_grad_norm_micro = _rms(c_norms), _rms(c_micro)
            st.critic_loss = sum(c_losses) / len(c_losses)
        self._tis_finish(st)
        return st

    def _step(self, micros, micro_samples, old, st: UpdateStats, apply: bool = True, dp=None):
        cfg = self.cfg
        n_tgt = [int(b["tgt_tokens"].numel()) for b in micros]
        n_seq = [len(s) for s in micro_samples]
        tot_tgt, tot_seq = sum(n_tgt), sum(n_seq)
        if dp is not None:  # weights relative to the whole batch over all ranks
            tot_tgt, tot_seq = dp.totals(tot_tgt, tot_seq)
        acc = _GradAccumulator(list(self.policy.parameters()))
        cacc = _GradAccumulator(list(self.critic.parameters())) if self.critic is not None else None
        loss_sum = closs_sum = 0.0
        tis = cfg.off_policy == "tis"
        tis_sums = [0.0, 0.0, 0.0]
        for i, (b, ss) in enumerate(zip(micros, micro_samples)):
            # each micro loss is its own estimate of the batch loss; weight w puts it into the batch sum
            w = (n_tgt[i] / tot_tgt) if cfg.loss_agg == "token" else (n_seq[i] / tot_seq)
            t0 = time.perf_counter()
            ctx = self.autocast or _null()
            with ctx:
                logp = token_logprobs(self.policy, b, cfg.temperature)
                if self.critic is not None:
                    values = self.critic.values(b)
                    adv, ret = self._gae(values, b, ss)
                else:
                    adv = torch.tensor([s.advantage for s in ss], dtype=torch.float32,
                                       device=logp.device)[b["seq_of_tgt"]]
                old_logp = logp.detach() if old is None else old[i]
                tis_w = self._tis_weights(old_logp, ss, tis_sums) if tis else None
                loss = self._policy_loss(logp, old_logp, adv, b["seq_of_tgt"], n_seq[i], n_tgt[i], tis_w)
                if self.critic is not None:
                    closs = 0.5 * ((values - ret) ** 2).mean()
            self._sync()
            t1 = time.perf_counter()
            loss.backward()
            if self.critic is not None:
                closs.backward()
            self._sync()
            t2 = time.perf_counter()
            acc.add(w)
            if cacc is not None:
                cacc.add(n_tgt[i] / tot_tgt)
                closs_sum += float(closs.detach()) * n_tgt[i] / tot_tgt
            loss_sum += float(loss.detach()) * w
            st.t_forward += t1 - t0
            st.t_backward += t2 - t1 + (time.perf_counter() - t2)
        csq = (sum(cacc.micro_sq), len(cacc.micro_sq)) if cacc is not None else (0.0, 0)
        psq = (sum(acc.micro_sq), len(acc.micro_sq))
        if dp is not None:  # sum the gradients and the diagnostic sums over all ranks
            bufs = acc.buffers() + (cacc.buffers() if cacc is not None else [])
            red = dp.allreduce(bufs, [psq[0], psq[1], loss_sum, closs_sum, csq[0], csq[1], *tis_sums])
            psq, loss_sum, closs_sum, csq, tis_sums = (red[0], red[1]), red[2], red[3], (red[4], red[5]), red[6:9]
        if tis:
            prev = st.extra.setdefault("_tis", [0.0, 0.0, 0.0])
            st.extra["_tis"] = [a + b for a, b in zip(prev, tis_sums)]
        if not apply:  # calibration (`profile`): the gradients are computed and normed, then discarded
            full, micro_rms = acc.finish(*psq)
            if cacc is not None:
                cacc.finish(*csq)
            for mod in (self.policy, self.critic):
                if mod is not None:
                    mod.zero_grad(set_to_none=True)
            self._sync()
            return full, micro_rms, None, None, loss_sum, None
        t3 = time.perf_counter()
        full, micro_rms = acc.finish(*psq)
        if cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.clip_grad)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        cfull = cmicro = None
        if cacc is not None:
            cfull, cmicro = cacc.finish(*csq)
            if cfg.clip_grad > 0:
                torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.clip_grad)
            self.critic_opt.step()
            self.critic_opt.zero_grad(set_to_none=True)
        self._sync()
        st.t_optimizer += time.perf_counter() - t3
        return full, micro_rms, cfull, cmicro, loss_sum, (closs_sum if cacc is not None else None)

    def _gae(self, values: torch.Tensor, b, ss: list[Sample]):
        v = values.detach().float().cpu().tolist()
        advs, rets, start = [], [], 0
        for s in ss:
            n = len(s.response_ids)
            a, r = gae(v[start:start + n], s.reward, self.cfg.gamma, self.cfg.lam)
            advs.extend(a)
            rets.extend(r)
            start += n
        dev = values.device
        return torch.tensor(advs, device=dev), torch.tensor(rets, device=dev)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
