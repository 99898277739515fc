"""The memory high-water mark of one phase (generation, training) of the recording process.

- CPU (Linux): the process's resident-set peak. Writing "5" to /proc/self/clear_refs resets the kernel's
  high-water mark (VmHWM in /proc/self/status) to the current resident set; reading VmHWM after the phase gives
  the largest resident set the phase reached, with no sampling thread and nothing missed between samples. The
  process holds the in-process vLLM engine and the trainer, so the peak is the host memory the colocated run
  needed during the phase (Python, torch and vLLM runtime included). Where /proc is absent or not writable
  the peak is None (a null column), never a guess.
- CUDA: torch.cuda.max_memory_allocated on the phase's device after torch.cuda.reset_peak_memory_stats. The
  in-process engine allocates its weights and its KV pool through torch's allocator on that device, so the
  peak holds them; memory outside torch's allocator (the CUDA context, NCCL buffers) is not in it.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
RESET_HWM = "5"  # clear_refs value that resets the peak resident set size (Documentation/filesystems/proc.rst)


def resident_peak() -> int | None:
    """VmHWM of this process, bytes (None off Linux)."""
    try:
        m = re.search(r"^VmHWM:\s+(\d+)\s+kB", STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


class PhasePeak:
    """`reset()` before a phase, `peak()` after it: the phase's peak memory in bytes, or None when it cannot be
    measured on this host. `device`: the torch device the phase runs on (None or CPU: the resident set)."""

    def __init__(self, device: Any = None):
        self.cuda = getattr(device, "type", str(device or "cpu").split(":")[0]) == "cuda"
        self.device = device
        self.ok = True

    def reset(self) -> None:
        if self.cuda:
            import torch  # only on a CUDA device, where the runner has loaded torch already

            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            CLEAR_REFS.write_text(RESET_HWM)
            self.ok = True
        except OSError:  # no /proc (not Linux) or not writable: the peak would be the whole run's, so none
            self.ok = False

    def peak(self) -> int | None:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return resident_peak() if self.ok else None
