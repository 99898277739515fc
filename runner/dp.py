"""Data-parallel training over `--train-gpus N`: N ranks, torch.distributed, ranks started here.

DDP-style, one gradient all-reduce after accumulation: this process is rank 0 (it also runs the record loop and
the engine); ranks 1..N-1 are spawned helpers that load the same model, build the same `Trainer` and join a
private process group (gloo on CPU, NCCL on CUDA; not torch's default group, which the in-process vLLM engine may
hold), after checking that every rank starts with identical weights. Per update the batch is cut into N shards of
whole groups; every rank runs `Trainer.update` with a hook (`_Collective`) that all-reduces the batch totals
first (so micro-batch weights are global) and the accumulated gradients and diagnostic sums last, then takes the
same clipped Adam step: the N-rank update equals the single-rank one up to float summation order.

No overlap of communication and computation: the micro-batch norms need each micro-batch's gradient apart, and
one reduction per step, recorded on its own (`allreduce` rows), lets a simulator model overlap itself. `update`
returns one compute row and one all-reduce row per rank, on the run clock. N == 1 starts nothing. In detail:
docs/usage.md, "Data-parallel training over --train-gpus N".
"""
from __future__ import annotations

import atexit
import datetime
import os
import signal
import time
import traceback
from typing import Any

import torch

from rlsim.replay.errors import RlsimError
from rlsim.runner.algo import Sample, Trainer, UpdateStats
from rlsim.runner.config import RunConfig
from rlsim.runner.placement import set_threads

_STARTUP_TIMEOUT_S = 600.0  # helper import + model load
_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)  # one update may take long; a dead peer errors at once
_JOIN_S = 5.0


class _Collective:
    """The hook `Trainer.update(dp=...)` calls: global totals and the gradient all-reduce; keeps the times.
    `pg` None: a single rank (nothing to reduce, times only)."""

    def __init__(self, pg, rank: int, t0: float, device: torch.device):
        self.pg, self.rank, self.t0, self.device = pg, rank, t0, device
        self.reset()

    def reset(self) -> None:
        self.t_compute: float | None = None
        self.ar_start: float | None = None
        self.ar_duration = 0.0
        self.ar_bytes = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _reduce(self, tensors: list[torch.Tensor]) -> None:
        works = [self.pg.allreduce([t]) for t in tensors]
        for w in works:
            w.wait()

    def totals(self, n_tgt: int, n_seq: int) -> tuple[int, int]:
        if self.pg is not None:
            t = torch.tensor([n_tgt, n_seq], dtype=torch.int64, device=self.device)
            self._reduce([t])
            n_tgt, n_seq = (int(x) for x in t.tolist())
        if self.t_compute is None:  # the first forward starts now
            self.t_compute = time.perf_counter() - self.t0
        return n_tgt, n_seq

    def allreduce(self, tensors: list[torch.Tensor], scalars: list[float]) -> list[float]:
        if self.pg is None:
            if self.ar_start is None:
                self.ar_start = time.perf_counter() - self.t0
            return list(scalars)
        self._sync()
        t = time.perf_counter()
        self._reduce(tensors)
        self._sync()
        dt = time.perf_counter() - t
        if self.ar_start is None:
            self.ar_start = t - self.t0
        self.ar_duration += dt
        self.ar_bytes += sum(x.numel() * x.element_size() for x in tensors)
        s = torch.tensor(scalars, dtype=torch.float64, device=self.device)
        self._reduce([s])
        return s.tolist()

    def rank_row(self, st: UpdateStats, samples: list[Sample]) -> dict[str, Any]:
        return dict(rank=self.rank, t_start=self.t_compute, duration=st.t_forward + st.t_backward,
                    num_responses=len(samples), num_tokens=st.num_tokens, t_forward=st.t_forward,
                    t_backward=st.t_backward)

    def allreduce_row(self) -> dict[str, Any]:
        return dict(rank=self.rank, t_start=self.ar_start, duration=self.ar_duration, bytes=self.ar_bytes)

    def check_identical(self, trainer: Trainer) -> bool:
        """Collective: every rank compares its parameter checksums and optimizer-state size with rank 0's;
        returns whether all ranks agree."""
        mods = [m for m in (trainer.policy, trainer.critic) if m is not None]
        params = [p.detach() for m in mods for p in m.parameters()]
        vec = torch.stack([p.double().sum() for p in params] + [p.double().abs().sum() for p in params]
                          + [torch.tensor(float(len(trainer.opt.state)), dtype=torch.float64, device=self.device)])
        vec = vec.to(self.device)
        ref = vec.clone()
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([ref], opts).wait()
        bad = torch.tensor([0.0 if torch.allclose(vec, ref, rtol=1e-9, atol=0.0) else 1.0],
                           dtype=torch.float64, device=self.device)
        self._reduce([bad])
        return float(bad) == 0.0


def _make_group(store, rank: int, world: int, device: torch.device):
    import torch.distributed as dist

    prefix = dist.PrefixStore("rlsim_dp", store)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        try:
            opts._timeout = _COLLECTIVE_TIMEOUT
        except AttributeError:  # pragma: no cover - older builds: the default (10 min)
            pass
        return dist.ProcessGroupNCCL(prefix, rank, world, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = _COLLECTIVE_TIMEOUT
    return dist.ProcessGroupGloo(prefix, rank, world, opts)


def _shutdown(pg) -> None:
    if pg is not None and hasattr(pg, "shutdown"):
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass


def _rank_device(gpu: int | None) -> torch.device:
    return torch.device(f"cuda:{gpu}") if gpu is not None else torch.device("cpu")


def _pin(cores: list[int] | None) -> None:
    if cores:
        os.sched_setaffinity(0, cores)
        set_threads(len(cores))


def _helper_main(rank: int, world: int, port: int, model_dir: str, cfg: RunConfig, pad_id: int, t0: float,
                 cores: list[int] | None, gpu: int | None, conn) -> None:
    """Rank `rank` (>= 1): load, join the group, then serve ("update", shard, lr) / ("warmup", samples) /
    ("close",) from rank 0, replying ("ok", payload) or ("error", text)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's; it closes the helpers
    pg, code = None, 0
    try:
        _pin(cores)
        cuda = gpu is not None
        if not cores and cfg.threads and not cuda:
            set_threads(cfg.threads)
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        device = _rank_device(gpu)
        if cuda:
            torch.cuda.set_device(device)
        torch.manual_seed(cfg.seed)
        policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
        trainer = Trainer(policy, cfg, pad_id, device)
        conn.send(("ok", "loaded"))
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=120))
        pg = _make_group(store, rank, world, device)
        hook = _Collective(pg, rank, t0, device)
        if not hook.check_identical(trainer):
            raise RlsimError(f"rank {rank} does not start from rank 0's weights and optimizer state")
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # rank 0 went away
                return
            if msg[0] == "close":
                return
            if msg[0] == "warmup":
                conn.send(("ok", trainer.warmup(msg[1])))
            elif msg[0] == "update":
                _, shard, lr = msg
                hook.reset()
                st = trainer.update(shard, lr, dp=hook)
                conn.send(("ok", (hook.rank_row(st, shard), hook.allreduce_row())))
            else:
                raise RuntimeError(f"unknown message {msg[0]!r}")
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, then this rank exits
        code = 1
        try:
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            conn.send(("error", f"{last}\n{traceback.format_exc()}"))
        except Exception:  # noqa: BLE001
            pass
    finally:
        _shutdown(pg)
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
        # nothing left to flush (replies are written synchronously): skip the interpreter's teardown of
        # torch and transformers, which takes about a second; multiprocessing's finalizers (semaphores
        # made by imports, e.g. tqdm's lock) still run, so the resource tracker has nothing to report
        try:
            from multiprocessing import util

            util._run_finalizers(0)
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)


class DataParallel:
    """Data-parallel training of `trainer` (rank 0, this process) over `cfg.train_devices` ranks.

    N = cfg.train_devices. N == 1: no processes, no process group; `update` calls `trainer.update`.
    N > 1: ranks 1..N-1 are spawned here, each loads the model from `model_dir` (float32), builds its own
    Trainer with the same cfg and seed and joins a private gloo (CPU) / NCCL (CUDA: rank r on cuda:gpus[r], default
    cuda:r) group;
    their start state is checked against rank 0's. `cores[r]`: the CPU cores of rank r (r >= 1 pinned with
    sched_setaffinity and set_threads(len(cores[r])); rank 0's affinity is the caller's business);
    None: left as is, except that a CPU helper takes cfg.threads intra-op threads when that is set. (On CPU,
    ranks whose thread pools together exceed the cores run many times slower: pin them.) Minibatches/epochs
    > 1 are supported (DDP semantics, see the module docstring). `warmup(samples)`: Trainer.warmup on all
    ranks at once (compilation with --compile).
    `close()` stops the helpers (also at interpreter exit). See the module docstring for the exact scheme.
    """

    def __init__(self, trainer: Trainer, cfg: RunConfig, model_dir: str, pad_id: int, *, t0: float,
                 cores: list[list[int]] | None = None, gpus: list[int] | None = None):
        self.trainer, self.cfg, self.t0 = trainer, cfg, t0
        self.world = int(cfg.train_devices)
        self.device = torch.device(trainer.device)
        self._procs: list = []
        self._conns: list = []
        self._pg = None
        self._store = None
        self._closed = self._failed = False
        if self.world == 1:
            self._hook = _Collective(None, 0, t0, self.device)
            return
        import multiprocessing as mp

        import torch.distributed as dist

        if cores is not None and len(cores) != self.world:
            raise RlsimError(f"cores lists {len(cores)} ranks for --train-gpus {self.world}")
        cuda = self.device.type == "cuda"
        if cuda and torch.cuda.device_count() < self.world:
            raise RlsimError(f"--train-gpus {self.world} needs {self.world} GPUs; {torch.cuda.device_count()} visible")
        atexit.register(self.close)
        try:
            # rank 0 hosts the rendezvous store on a free port (port 0: the OS picks one, no race)
            self._store = dist.TCPStore("127.0.0.1", 0, self.world, True, wait_for_workers=False,
                                        timeout=datetime.timedelta(seconds=120))
            ctx = mp.get_context("spawn")
            for r in range(1, self.world):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_helper_main, name=f"rlsim-dp-rank{r}",
                                args=(r, self.world, self._store.port, str(model_dir), cfg, pad_id, t0,
                                      None if cores is None else list(cores[r]),
                                      (gpus[r] if gpus is not None else r) if cuda else None, child))
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            for r in range(1, self.world):  # loaded: the group's rendezvous cannot wait on a dead rank
                self._recv(r, _STARTUP_TIMEOUT_S)
            self._pg = _make_group(self._store, 0, self.world, self.device)
            self._hook = _Collective(self._pg, 0, t0, self.device)
            if not self._hook.check_identical(trainer):
                raise RlsimError("data-parallel ranks do not start from identical weights and optimizer state: "
                                 "pass a fresh Trainer on the weights in the model folder")
        except BaseException:
            self.close()
            raise

    def _recv(self, r: int, timeout: float | None = None):
        """The payload of rank r's next reply; raises if it reports an error, dies or times out."""
        conn, proc = self._conns[r - 1], self._procs[r - 1]
        deadline = None if timeout is None else time.monotonic() + timeout
        while not conn.poll(0.2):
            if not proc.is_alive() and not conn.poll(0):
                raise RlsimError(f"data-parallel rank {r} exited (exit code {proc.exitcode})")
            if deadline is not None and time.monotonic() > deadline:
                raise RlsimError(f"data-parallel rank {r} did not answer within {timeout:.0f} s")
        try:
            kind, payload = conn.recv()
        except EOFError:
            proc.join(1.0)
            raise RlsimError(f"data-parallel rank {r} exited (exit code {proc.exitcode})") from None
        if kind == "error":
            raise RlsimError(f"data-parallel rank {r} failed: {payload.splitlines()[0]}\n{payload}")
        return payload

    def _helper_error(self) -> str | None:
        """A helper's error report, if one is waiting (after rank 0's own collective failed)."""
        for r, conn in enumerate(self._conns, start=1):
            try:
                if conn.poll(1.0):
                    kind, payload = conn.recv()
                    if kind == "error":
                        return f"data-parallel rank {r} failed: {payload.splitlines()[0]}"
            except (EOFError, OSError):
                continue
        return None

    def _dead(self) -> str | None:
        for r, p in enumerate(self._procs, start=1):
            if not p.is_alive():
                return f"data-parallel rank {r} exited (exit code {p.exitcode})"
        return None

    def _call(self, fn, per_helper: list[tuple]):
        """Send each helper its message, run `fn` here, collect the helpers' replies. On any failure the
        helpers are stopped (this object is closed) and the cause is raised."""
        if self._closed:
            raise RlsimError("DataParallel is closed")
        try:
            for conn, msg in zip(self._conns, per_helper):
                conn.send(msg)
            mine = fn()
            return mine, [self._recv(r) for r in range(1, self.world)]
        except BaseException as e:
            self._failed = True  # helpers may be blocked in a collective: close stops them at once
            err = None
            if isinstance(e, Exception) and not isinstance(e, RlsimError):
                err = self._helper_error() or self._dead()
            self.close()
            if err:
                raise RlsimError(err) from e
            raise

    def warmup(self, samples: list[Sample]) -> float:
        """`Trainer.warmup` on every rank at once (compilation with --compile; no weights change). Returns
        rank 0's seconds."""
        if self.world == 1:
            return self.trainer.warmup(samples)
        mine, _ = self._call(lambda: self.trainer.warmup(samples), [("warmup", samples)] * (self.world - 1))
        return mine

    def update(self, samples: list[Sample], lr: float) -> tuple[UpdateStats, list[dict], list[dict]]:
        """One RL step on `samples` (group order, B = P x G) over the N ranks: rank r trains
        samples[r*B/N:(r+1)*B/N]. Returns (stats of the whole batch, one compute row per rank, one all-reduce
        row per rank). Stats: loss, grad norms, TIS sums, num_tokens and response_tokens of the whole batch;
        t_forward/t_backward/t_optimizer are rank 0's (each rank's are in its row); extra["allreduce_s"] is
        rank 0's all-reduce time."""
        N, B = self.world, len(samples)
        if B % N:
            raise RlsimError(f"batch of {B} samples is not divisible by --train-gpus {N}")
        k = B // N
        shards = [samples[r * k:(r + 1) * k] for r in range(N)]
        self._hook.reset()
        if N == 1:
            st = self.trainer.update(samples, lr, dp=self._hook)
            rank_rows, ar_rows = [self._hook.rank_row(st, samples)], [self._hook.allreduce_row()]
        else:
            st, replies = self._call(lambda: self.trainer.update(shards[0], lr, dp=self._hook),
                                     [("update", shards[r], lr) for r in range(1, N)])
            rank_rows = [self._hook.rank_row(st, shards[0])] + [rr for rr, _ in replies]
            ar_rows = [self._hook.allreduce_row()] + [ar for _, ar in replies]
        st.num_tokens = sum(r["num_tokens"] for r in rank_rows)
        st.response_tokens = sum(len(s.response_ids) for s in samples)
        st.extra["allreduce_s"] = ar_rows[0]["duration"]
        return st, rank_rows, ar_rows

    def close(self) -> None:
        """Stop the helper ranks and drop the process group; idempotent, never waits on a dead helper."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(("close",))
            except (OSError, ValueError):  # helper gone
                pass
        _shutdown(self._pg)
        deadline = time.monotonic() + (0.5 if self._failed else _JOIN_S)
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        self._pg = self._store = None
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
