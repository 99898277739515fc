"""Verifiable-reward tasks: prompt streams, held-out eval prompts, and a reward function per task.

Built-in tasks (no network, character vocabulary of `runner.model.CHARS`):

- `add2`: two-digit addition with a digit-by-digit scratchpad, e.g. `59+63=` -> `9+3+0=12;5+6+1=12#122`
  (about 21 tokens with the end token).
- `add3`, `add4`: the same with three- and four-digit operands (about 30 and 40 tokens).
- `addmix`: operands of 1 to 3 digits, so responses range from about 8 to 30 tokens.
- `sum3`: three two-digit operands, three digits and the carry (up to 2) a column, `2+4+6+0=12;1+3+5+1=10#102`.
- `sub3`: three-digit subtraction, the larger operand first, column by column with the borrow:
  `523-187=` -> `3-7-0=6;2-8-1=3;5-1-1=13#336` (each column writes 10 + x - y - borrow: two digits mean no
  borrow into the next column, one digit a borrow; about 30 tokens).

The reward is 1.0 when the text after the last `#` equals the result, else 0.0 (the scratchpad itself is
not scored). `--dataset FILE` (JSONL or Parquet with `prompt` and `answer`) uses exact-match reward on
the whole stripped response, or numeric reward (the last number in the response equals the answer).

Streams are deterministic in the seed. Held-out eval prompts are disjoint from training prompts:
for built-in tasks the pair space is split by a hash, for datasets the last `eval_fraction` of rows.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlsim.replay.errors import RlsimError

# task: (fewest and most digits of an operand, operator, operands)
ARITHMETIC = {"add2": ((2, 2), "+", 2), "add3": ((3, 3), "+", 2), "add4": ((4, 4), "+", 2),
              "addmix": ((1, 3), "+", 2), "sum3": ((2, 2), "+", 3), "sub3": ((3, 3), "-", 2)}
BUILTIN_TASKS = tuple(ARITHMETIC)


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def scratchpad(*operands: int) -> str:
    """Digit-by-digit column addition of any number of operands, least significant first: `59+63` ->
    `9+3+0=12;5+6+1=12#122`; each column writes its digits, the carry in, and their sum."""
    rev = [str(n)[::-1] for n in operands]
    steps, carry = [], 0
    for i in range(max(map(len, rev))):
        digits = [int(d[i]) if i < len(d) else 0 for d in rev]
        s = sum(digits) + carry
        steps.append("+".join(map(str, digits)) + f"+{carry}={s}")
        carry = s // 10
    return ";".join(steps) + f"#{sum(operands)}"


def scratchpad_sub(a: int, b: int) -> str:
    """Column subtraction (a >= b), least significant first; each column writes s = 10 + x - y - borrow, whose
    tens digit says whether it borrowed: `523-187` -> `3-7-0=6;2-8-1=3;5-1-1=13#336`."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, borrow = [], 0
    for i in range(len(da)):
        x, y = int(da[i]), int(db[i]) if i < len(db) else 0
        s = 10 + x - y - borrow
        steps.append(f"{x}-{y}-{borrow}={s}")
        borrow = int(s < 10)
    return ";".join(steps) + f"#{a - b}"


def _is_held_out(*operands: int) -> bool:
    # a fixed hash split of the operand space: ~1/8 of pairs (or triples) are held out, never trained on
    return (sum(n * k for n, k in zip(operands, (7919, 104729, 1299709))) * 2654435761) % 8 == 0


def _sample_operands(rng: random.Random, task: str) -> tuple[int, ...]:
    (lo, hi), op, count = ARITHMETIC[task]
    def num() -> int:
        d = rng.randint(lo, hi)
        return rng.randint(10 ** (d - 1) if d > 1 else 0, 10 ** d - 1)
    ops = tuple(num() for _ in range(count))
    return tuple(sorted(ops, reverse=True)) if op == "-" else ops


class Task:
    """A prompt source with a reward function."""

    name: str

    def train_stream(self, seed: int):  # pragma: no cover - interface
        raise NotImplementedError

    def eval_set(self, n: int, seed: int) -> list[Example]:  # pragma: no cover - interface
        raise NotImplementedError

    def reward(self, response: str, ex: Example) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class ArithmeticTask(Task):
    def __init__(self, name: str):
        if name not in BUILTIN_TASKS:
            raise RlsimError(f"unknown task {name!r}; choose one of {', '.join(BUILTIN_TASKS)} or pass --dataset FILE")
        self.name = name
        self.op = ARITHMETIC[name][1]

    def example(self, *operands: int) -> Example:
        answer = sum(operands) if self.op == "+" else operands[0] - sum(operands[1:])
        return Example(prompt=self.op.join(map(str, operands)) + "=", answer=str(answer))

    def train_stream(self, seed: int):
        rng = random.Random(f"train-{self.name}-{seed}")
        while True:
            ops = _sample_operands(rng, self.name)
            if not _is_held_out(*ops):
                yield self.example(*ops)

    def eval_set(self, n: int, seed: int = 0) -> list[Example]:
        rng = random.Random(f"eval-{self.name}")  # fixed across seeds so scores compare between runs
        out, seen = [], set()
        while len(out) < n:
            ops = _sample_operands(rng, self.name)
            if _is_held_out(*ops) and ops not in seen:
                seen.add(ops)
                out.append(self.example(*ops))
            if len(seen) == 0 and len(out) > 10 * n:  # pragma: no cover
                break
        return out

    def reward(self, response: str, ex: Example) -> float:
        tail = response.rsplit("#", 1)
        return 1.0 if len(tail) == 2 and tail[1].strip() == ex.answer else 0.0

    def sft_text(self, ex: Example) -> str:
        operands = map(int, ex.prompt[:-1].split(self.op))
        return (scratchpad if self.op == "+" else scratchpad_sub)(*operands)


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


class DatasetTask(Task):
    """Prompt/answer rows from a JSONL or Parquet file."""

    def __init__(self, path: str, reward: str = "exact", eval_fraction: float = 0.1):
        self.name = f"dataset:{Path(path).name}"
        self.reward_kind = reward
        rows = load_dataset(path)
        n_eval = max(1, int(len(rows) * eval_fraction)) if len(rows) > 1 else 0
        self.train = rows[: len(rows) - n_eval] or rows
        self.eval = rows[len(rows) - n_eval:] or rows

    def train_stream(self, seed: int):
        rng = random.Random(f"train-{self.name}-{seed}")
        while True:
            order = list(range(len(self.train)))
            rng.shuffle(order)
            for i in order:
                yield self.train[i]

    def eval_set(self, n: int, seed: int = 0) -> list[Example]:
        return self.eval[:n]

    def reward(self, response: str, ex: Example) -> float:
        if self.reward_kind == "numeric":
            nums = _NUM.findall(response)
            try:
                return 1.0 if nums and abs(float(nums[-1]) - float(ex.answer)) < 1e-6 else 0.0
            except ValueError:
                return 0.0
        return 1.0 if response.strip() == ex.answer.strip() else 0.0


def load_dataset(path: str) -> list[Example]:
    """Read prompt/answer rows; any problem becomes one RlsimError line."""
    p = Path(path)
    if not p.is_file():
        raise RlsimError(f"dataset not found: {path} (pass a JSONL or Parquet file with `prompt` and `answer` columns)")
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(p)
            if not {"prompt", "answer"} <= set(table.column_names):
                raise RlsimError(f"{path} lacks `prompt`/`answer` columns (has {', '.join(table.column_names)})")
            raw = [{"prompt": pr, "answer": an}
                   for pr, an in zip(table["prompt"].to_pylist(), table["answer"].to_pylist())]
        else:
            raw = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    except RlsimError:
        raise
    except Exception as e:
        raise RlsimError(f"cannot read dataset {path} ({type(e).__name__}: {str(e)[:80]}); expected JSONL or Parquet "
                         "with `prompt` and `answer`") from None
    rows = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict) or "prompt" not in r or "answer" not in r:
            raise RlsimError(f"{path} row {i + 1} lacks `prompt` or `answer`; every row needs both")
        rows.append(Example(prompt=str(r["prompt"]), answer=str(r["answer"])))
    if not rows:
        raise RlsimError(f"dataset {path} has no rows")
    return rows


def make_task(name: str, dataset: str | None = None, reward: str = "exact") -> Task:
    if dataset:
        return DatasetTask(dataset, reward)
    return ArithmeticTask(name)


RewardFn = Callable[[str, Example], float]
