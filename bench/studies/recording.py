"""What the recording studies share: the repository root, the console scripts beside this Python, one lock that
serialises every timed recording on the machine, and the test of whether a run is already recorded (resumable)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # bench/studies/ -> the repository root
LOCK = "/tmp/rlsim-heavy.lock"  # `flock` on it: no two timed recordings at once


def tool(name: str) -> str:
    """`rlrun` / `rlsim` of this Python's environment (else from PATH)."""
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def complete(path: Path, steps: int | None) -> bool:
    """True when `path` reads as a complete recording of `steps` updates (None: a calibration file)."""
    from rlsim.replay.errors import RlsimError
    from rlsim.replay.io import read_trace

    if not path.exists():
        return False
    try:
        t = read_trace(path)
    except RlsimError:
        return False
    if steps is None:
        return bool(t.count("calib_gen"))
    return t.meta.get("status") == "complete" and t.count("update") == steps


def run_locked(cmd: list[str], log=print) -> None:
    """Run one recording under the lock; exit with its stderr tail when it fails."""
    log(" ".join(cmd))
    t0 = time.perf_counter()
    p = subprocess.run(["flock", LOCK, *cmd], cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    log(f"  {time.perf_counter() - t0:.0f} s wall")
    sys.stdout.flush()
