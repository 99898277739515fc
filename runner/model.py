"""The tiny default policy: a Llama-architecture model and a character tokenizer, made locally.

`ensure_model(task)` returns a folder vLLM and transformers both load. The first call builds the model
and runs a short supervised warm-up on the task's scratchpad format (about 1-2 minutes on 2 CPU cores),
giving a base policy with a held-out pass rate of roughly 10-50% at temperature 1, so RL has signal.
The folder is cached under `$RLSIM_CACHE` (default `~/.cache/rlsim`) by a hash of the recipe and
reused afterwards. `--model DIR` replaces all of this with any local HF causal LM.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlsim.replay.errors import RlsimError

CHARS = "0123456789+=;#-"
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


# Warm-up steps per task, chosen on 2 CPU cores for a held-out pass rate of roughly 10-50% at temperature 1, so
# RL has signal (the pass rates they gave: docs/results.md sections 10, 24, 27). add3 is not calibrated.
SFT_STEPS = {"add2": 140, "addmix": 115, "add3": 300, "add4": 250, "sub3": 300, "sum3": 350}


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the default model; its hash names the cache folder."""

    task: str = "add2"
    hidden: int = 128
    layers: int = 3
    heads: int = 2
    head_dim: int = 64  # vLLM's CPU attention rejects head_dim 16
    intermediate: int = 384
    max_position: int = 256
    sft_steps: int = 140  # see SFT_STEPS
    sft_batch: int = 128
    sft_lr: float = 3e-3
    seed: int = 0
    version: int = 2  # bump when the recipe's code changes

    @classmethod
    def for_task(cls, task: str) -> "Recipe":
        """The default recipe of a built-in task, with its calibrated warm-up length."""
        return cls(task=task, sft_steps=SFT_STEPS.get(task, cls.sft_steps))

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def _log(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("RLSIM_CACHE") or Path.home() / ".cache" / "rlsim")


def make_tokenizer():
    """A per-character WordLevel tokenizer that prepends <s> and knows </s> as end of sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=256,
    )


def build_model(recipe: Recipe, vocab_size: int, special_ids: dict[str, int]):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.heads,
        head_dim=recipe.head_dim, max_position_embeddings=recipe.max_position, tie_word_embeddings=False,
        bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"], pad_token_id=special_ids["pad"],
    )
    return LlamaForCausalLM(cfg)


def warm_up(model, tok, recipe: Recipe, log=None) -> dict[str, Any]:
    """Supervised warm-up on scratchpad solutions (loss on the response tokens only)."""
    import torch

    from rlsim.runner.tasks import ArithmeticTask

    task = ArithmeticTask(recipe.task)
    stream = task.train_stream(seed=10_000 + recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0, betas=(0.9, 0.98))
    warm = 50
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    t0, loss_v = time.perf_counter(), float("nan")
    eos = tok.eos_token_id
    for step in range(recipe.sft_steps):
        seqs, masks = [], []
        for _ in range(recipe.sft_batch):
            ex = next(stream)
            p = tok(ex.prompt)["input_ids"]
            r = tok(task.sft_text(ex), add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(p + r)
            masks.append([0] * len(p) + [1] * len(r))
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), tok.pad_token_id, dtype=torch.long)
        lm = torch.zeros((len(seqs), L), dtype=torch.float32)
        att = torch.zeros((len(seqs), L), dtype=torch.long)
        for i, (s, m) in enumerate(zip(seqs, masks)):
            ids[i, : len(s)] = torch.tensor(s)
            lm[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
            att[i, : len(s)] = 1
        logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * lm[:, 1:]).sum() / lm[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_v = loss.item()
        if log and (step + 1) % int(os.environ.get("RLSIM_LOG_EVERY", "100")) == 0:
            log(f"warm-up step {step + 1}/{recipe.sft_steps}: loss {loss_v:.3f} ({time.perf_counter() - t0:.0f} s)")
    model.eval()
    return {"sft_steps": recipe.sft_steps, "sft_final_loss": loss_v, "sft_seconds": time.perf_counter() - t0}


def ensure_model(recipe: Recipe | None = None, log=None) -> Path:
    """The cached default model folder for the recipe, made on first use (atomic, safe across processes)."""
    recipe = recipe or Recipe()
    log = log or _log
    folder = cache_root() / f"tiny-llama-{recipe.task}-{recipe.key()}"
    if (folder / "rlsim_recipe.json").exists():
        return folder
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)  # another process may be building the same recipe
        if (folder / "rlsim_recipe.json").exists():
            return folder
        import torch

        if log:
            log(f"building the default model ({recipe.task}, {recipe.sft_steps} warm-up steps; cached in {folder})")
        tok = make_tokenizer()
        model = build_model(recipe, len(tok),
                            {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id})
        threads = torch.get_num_threads()
        info = warm_up(model, tok, recipe, log=log)
        torch.set_num_threads(threads)
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.generation_config.do_sample = True
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "rlsim_recipe.json").write_text(json.dumps({**asdict(recipe), **info}, indent=1))
        os.replace(tmp, folder)
    return folder


def check_model_dir(path: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise RlsimError(f"model folder not found: {path} (pass a local Hugging Face model folder with config.json, or "
                         "omit --model for the built-in tiny model)")
    if not (p / "config.json").is_file():
        raise RlsimError(f"{path} has no config.json: not a Hugging Face model folder")
    return p


def model_info(model, folder: Path) -> dict[str, Any]:
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    head_dim = getattr(cfg, "head_dim", None) or (hidden // heads if hidden and heads else None)
    info = {
        "name": folder.name, "path": str(folder), "architecture": (cfg.architectures or [type(model).__name__])[0],
        "parameters": params, "bytes": nbytes, "hidden": hidden, "layers": getattr(cfg, "num_hidden_layers", None),
        "heads": heads, "kv_heads": getattr(cfg, "num_key_value_heads", None), "head_dim": head_dim,
        "intermediate": getattr(cfg, "intermediate_size", None), "vocab": getattr(cfg, "vocab_size", None),
    }
    recipe = folder / "rlsim_recipe.json"
    if recipe.exists():
        info["recipe"] = json.loads(recipe.read_text())
    return info
