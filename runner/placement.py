"""Which devices each side of a run gets: generation engine replicas and data-parallel training ranks.

No torch import (it runs in `RunConfig.validate`, before anything heavy starts). A device is a GPU on a
CUDA machine and a CPU core otherwise (the cores this process may run on, `os.sched_getaffinity`).

- colocated: rank r gets the r-th equal share of the devices for training; the engine lives in rank 0's
  process and generates on all of them (CPU: rank 0 keeps every core and switches its torch threads
  between generation and training; GPU: GPU 0, as the run without ranks).
- split: engine replica i gets device i; training rank r gets device gen_devices + r. Devices beyond
  gen_devices + train_devices are left unused; two sides never share one.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlsim.replay.errors import RlsimError


def machine_devices() -> tuple[str, list[int]]:
    """("cuda", GPU ids) when NVIDIA GPUs are visible, else ("cpu", usable core ids)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        if vis is not None:
            ids = [int(x) for x in vis.split(",") if x.strip().isdigit()]
        else:
            ids = list(range(len(list(gpus.iterdir()))))
        if ids:
            return "cuda", ids
    try:
        return "cpu", sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return "cpu", list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class Placement:
    kind: str                          # "cpu" or "cuda"
    gen: tuple[tuple[int, ...], ...]   # per engine replica: its devices (split) / () in colocated mode
    train: tuple[tuple[int, ...], ...]  # per training rank: its devices
    total: int                         # devices on the machine
    visible: tuple[int, ...] = ()      # cuda: the physical GPU id of each torch index (CUDA_VISIBLE_DEVICES order)

    def physical(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """Ids for CUDA_VISIBLE_DEVICES of a process (GPUs); core ids as they are (CPU)."""
        return tuple(self.visible[d] for d in devices) if self.kind == "cuda" else devices

    def threads(self, devices: tuple[int, ...], override: int) -> int:
        """CPU threads for a side on `devices` (--threads overrides)."""
        return override or max(1, len(devices))


def place(mode: str, gen_devices: int, train_devices: int, have: tuple[str, list[int]] | None = None,
          threads: int = 0) -> Placement:
    """Assign devices or raise RlsimError with the fix in one line. Devices are core ids on CPU and torch
    indices (0..n-1) on CUDA (`Placement.physical` maps them back for CUDA_VISIBLE_DEVICES)."""
    kind, ids = have or machine_devices()
    what = "GPUs" if kind == "cuda" else "CPU cores"
    n = len(ids)
    if kind == "cpu" and threads > n:
        raise RlsimError(f"--threads {threads} is more than the {n} CPU cores this process may use; use at most {n}")
    visible = tuple(ids) if kind == "cuda" else ()
    if kind == "cuda":
        ids = list(range(n))
    if mode == "split":
        need = gen_devices + train_devices
        if need > n:
            raise RlsimError(f"split mode needs separate devices for each side: --gen-gpus {gen_devices} + "
                             f"--train-gpus {train_devices} = {need}, but this machine has {n} {what}; "
                             f"lower them so the sum is at most {n}")
        gen = tuple((ids[i],) for i in range(gen_devices))
        train = tuple((ids[gen_devices + r],) for r in range(train_devices))
        return Placement(kind, gen, train, n, visible)
    if train_devices > n:
        raise RlsimError(f"--train-gpus {train_devices} is more than the {n} {what} this machine has; "
                         f"use at most {n}")
    share = n // train_devices
    train = tuple(tuple(ids[r * share:(r + 1) * share]) for r in range(train_devices))
    return Placement(kind, (), train, n, visible)


def set_threads(n: int) -> None:
    """torch's intra-op threads = n. vLLM's CPU worker replaces `torch.set_num_threads` with a no-op that logs a
    warning once it has bound its OpenMP threads to cores (vllm/v1/worker/cpu_worker.py), so after an engine
    starts in this process every later call would be silently ignored (a one-core calibration then ran on both
    cores). The builtin stays in torch._C; its pool's threads keep the cores vLLM bound them to."""
    import torch  # function-level: the runner's heavy dependency, imported when threads are set

    torch._C.set_num_threads(int(n))


@contextmanager
def pinned(cores, threads: int | None):
    """This process on `cores` (None: as it is) with `threads` torch threads, restored afterwards (a library
    caller, e.g. a test session, keeps its own affinity)."""
    import torch

    before, before_threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        if cores is not None:
            os.sched_setaffinity(0, set(cores))
        if threads:
            set_threads(threads)
        yield
    finally:
        os.sched_setaffinity(0, before)
        set_threads(before_threads)
