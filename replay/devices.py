"""Named device profiles and the roofline rule that moves a fitted model to other hardware.

`rescale(models, device, gpus)` returns a copy of a `FittedModels` whose costs are those of `gpus`
devices of the named profile, and one note per term it moved:

- memory-bound terms (an engine step's weight reads, KV reads, an update's fixed cost) move by the
  memory-bandwidth ratio (and the device count where data parallel); from a CPU source only the part of an
  engine step that weight reads explain moves, the rest is host overhead;
- compute-bound terms (decode and prefill per token, training per token) move by the dense FLOP/s ratio and
  the device count;
- the weight sync moves by the interconnect ratio; host-side terms stay;
- engine limits: `max_num_seqs` with the device count, `kv_cache_tokens` with memory and device count.

The tensor-parallel degree (`config.tp`, default 1) is kept. What was recorded (`models.recorded`) is
not touched: it is what the source hardware measured. Term by term, with the reasons: docs/importing.md,
"The roofline rule".
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rlsim.replay.cost import EngineStepCost
from rlsim.replay.device_data import DEVICES, UPDATE_FLOOR_S
from rlsim.replay.device_speed import DeviceRatios
from rlsim.replay.measured_hosts import HOSTS
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels, Replicates
from rlsim.replay.robust import AffineModel, PiecewiseLinear


@dataclass(frozen=True)
class DeviceProfile:
    """One device: one GPU, or one CPU host."""

    key: str = field(metadata={"help": "the name to pass (--device)"})
    name: str = field(metadata={"help": "the product name"})
    mem_bandwidth_gbs: float = field(metadata={"help": "peak memory bandwidth, GB/s"})
    flops_tflops: float = field(metadata={"help": "dense bf16 tensor FLOP/s in TFLOP/s (CPU: measured fp32 matmul)"})
    memory_gb: float = field(metadata={"help": "device memory, GB"})
    interconnect_gbs: float = field(metadata={"help": "device-to-device bandwidth, GB/s (NVLink, Infinity Fabric, "
                                                      "PCIe)"})
    kind: str = field(metadata={"help": "gpu | cpu"})
    aliases: tuple[str, ...] = field(default=(), metadata={"help": "other names it is found by"})
    source: str = field(default="", metadata={"help": "where the numbers come from"})
    update_floor_s: float = field(default=0.0, metadata={
        "help": "the least a rescaled optimizer update's fixed cost may fall to, seconds: kernel launches of the "
                "forward and backward passes, the optimizer step and a gradient collective do not shrink with "
                "bandwidth (0: no floor)"})
    processor: str = field(default="", metadata={"help": "a CPU host's processor as the host names it ('' for a GPU)"})
    stand_in: str = field(default="", metadata={
        "help": "for a CPU host with no measured figures: the sentence saying whose figures stand in for its own "
                "('' when the figures are its own)"})

    @property
    def short_name(self) -> str:
        """A CPU host's vendor and model ('Intel Xeon'), else the product name."""
        return host_name(self.processor) or self.name

    def to_dict(self) -> dict[str, Any]:
        host = {"cpu_name": self.processor} if self.processor else {}
        if self.key == "recorded":  # its figures are placeholders (every ratio to itself is 1): none is written
            return {"device_name": self.name, "device": "cpu" if self.kind == "cpu" else "cuda", **host,
                    "profile_source": self.source}
        # an unmeasured host is found again by its processor (`host_profile`), not by a key --device knows
        key = {} if self.stand_in else {"profile": self.key}
        return {**key, "device_name": self.name, "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
                "flops_tflops": self.flops_tflops, "memory_gb": self.memory_gb,
                "interconnect_gbs": self.interconnect_gbs, "device": "cpu" if self.kind == "cpu" else "cuda", **host,
                "profile_source": self.source}


# a processor name's parts that are not its vendor and model: trademark signs, the clock after '@', a core count,
# the words CPU and Processor ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "AMD EPYC 7B13 64-Core Processor")
_NOT_MODEL = re.compile(r"@.*$|\((?:r|tm|c)\)|[\u00ae\u2122]|\b\d+[- ]core\b|\b(?:cpu|processor)\b", re.I)


def host_name(cpu_name: str | None) -> str:
    """A processor's vendor and model from the name its host gives it (`/proc/cpuinfo` model name, a trace's
    `hardware.cpu_name`); '' for none: 'Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz' -> 'Intel Xeon Platinum
    8375C'."""
    return " ".join(_NOT_MODEL.sub(" ", str(cpu_name or "")).split())


def host_identity(cpu_name: str | None) -> str:
    """The key `rlsim.replay.measured_hosts.HOSTS` is indexed by: `host_name` in lower case."""
    return host_name(cpu_name).lower()


def _host_key(identity: str) -> str:
    return "cpu-" + (re.sub(r"[^a-z0-9]+", "-", identity).strip("-") or "unnamed")


def _measured_host(identity: str, entry: tuple) -> DeviceProfile:
    name, _cores, bw, fl, mem, src = entry
    return DeviceProfile(_host_key(identity), f"{name} (host CPU; measured)", bw, fl, mem, bw, "cpu",
                         (identity,), src, UPDATE_FLOOR_S.get("cpu", 0.0), processor=name)


HOST_PROFILES: dict[str, DeviceProfile] = {
    p.key: p for p in (_measured_host(identity, entry) for identity, entry in HOSTS.items())}
PROFILES: dict[str, DeviceProfile] = {
    **{key: DeviceProfile(key, name, bw, fl, mem, ic, kind, aliases, src, UPDATE_FLOOR_S.get(kind, 0.0))
       for key, (name, bw, fl, mem, ic, kind, aliases, src) in DEVICES.items()},
    **HOST_PROFILES,
}


def _measured(identity: str) -> DeviceProfile | None:
    return next((p for p in HOST_PROFILES.values() if identity and p.aliases[0] == identity), None)


def host_profile(hardware: dict[str, Any] | None) -> DeviceProfile | None:
    """The CPU host a trace's `hardware` metadata names (its `cpu_name`, else `device_name`): its measured profile when
    `rlsim.replay.measured_hosts` holds that processor (`host_identity`); else an unmeasured host's, named after its
    processor (or 'an unnamed CPU'), whose figures are the measured hosts' median, or one's own memory bandwidth where
    the trace records it; its `stand_in` says whose stand in and how to measure it. None when no host is measured."""
    hw = hardware or {}
    proc = str(hw.get("cpu_name") or hw.get("device_name") or "")
    ident = host_identity(proc)
    own = _measured(ident)
    hosts = list(HOST_PROFILES.values())
    if own is not None or not hosts:
        return own
    whose = (f"the measured {hosts[0].processor} host's" if len(hosts) == 1 else
             f"the median of the measured hosts' ({', '.join(p.processor for p in hosts)})")
    med = {f: float(np.median([getattr(p, f) for p in hosts]))
           for f in ("mem_bandwidth_gbs", "flops_tflops", "memory_gb")}
    bw = hw.get("mem_bandwidth_gbs")
    own_bw = isinstance(bw, (int, float)) and not isinstance(bw, bool) and math.isfinite(bw) and bw > 0
    figures = "FLOP/s and memory" if own_bw else "memory bandwidth, FLOP/s and memory"
    bw = float(bw) if own_bw else med["mem_bandwidth_gbs"]
    label = host_name(proc) or "an unnamed CPU"
    host = f"the CPU host {label}" if host_name(proc) else "the trace's CPU host, unnamed in its hardware metadata,"
    stand_in = (f"{host} has no measured figures (rlsim.replay.measured_hosts): {whose} {figures} stand in "
                "for its own, so the ratios also carry however much the two CPUs differ; measure it on that host with "
                "python -m bench.device_profile --write")
    source = f"not measured: {whose} {figures} stand in"
    source += "; its bandwidth from the trace's metadata" if own_bw else ""
    return DeviceProfile(_host_key(ident), f"{label} (host CPU; not measured: {whose} figures stand in)", bw,
                         med["flops_tflops"], med["memory_gb"], bw, "cpu", (ident,) if ident else (), source,
                         UPDATE_FLOOR_S.get("cpu", 0.0), processor=proc.strip(), stand_in=stand_in)


def recorded_profile(hardware: dict[str, Any] | None) -> DeviceProfile:
    """A stand-in for a trace's device that matches no datasheet (e.g. an Ascend 910B): more or fewer of the same device
    need only the device count, so every ratio between it and itself is 1 and its figures are placeholders."""
    hw = hardware or {}
    kind = "cpu" if str(hw.get("device") or "").lower() == "cpu" else "gpu"
    name = str(hw.get("device_name") or hw.get("device") or "the recorded device")
    return DeviceProfile("recorded", name, 1.0, 1.0, 1.0, 1.0, kind,
                         source="the trace's own device (no datasheet needed)",
                         update_floor_s=UPDATE_FLOOR_S.get(kind, 0.0))


def _norm(s: str) -> str:
    return re.sub(r"[\s_\-]+", " ", str(s).strip().lower())


def known_names() -> str:
    return ", ".join(PROFILES)


def get_profile(name: str) -> DeviceProfile:
    """The profile named `name` (its key or an alias, case and separators ignored)."""
    want = _norm(name)
    for p in PROFILES.values():
        if want == _norm(p.key) or want in {_norm(a) for a in p.aliases}:
            return p
    raise RlsimError(f"unknown device {name!r}; known devices: {known_names()}")


def profile_by_name(device_name: str | None) -> DeviceProfile | None:
    """The measured CPU host whose processor the name is (`host_identity`), else the GPU profile whose key or alias is
    the longest found in the name (None: neither)."""
    host = _measured(host_identity(device_name))
    if host is not None:
        return host
    name = _norm(device_name or "")
    best, best_len = None, 0
    if name:
        for p in PROFILES.values():
            if p.kind == "cpu":  # a host is its processor, not any name containing a word of it
                continue
            for a in (p.key, *p.aliases):
                a = _norm(a)
                if a and a in name and len(a) > best_len:
                    best, best_len = p, len(a)
    return best


def profile_for_hardware(hardware: dict[str, Any] | None) -> DeviceProfile | None:
    """The profile a trace's `hardware` metadata names: its `profile` key; for a CPU trace its host (`host_profile`:
    measured, or named unmeasured); else the longest key or alias found in `device_name`; None if none fits."""
    hw = hardware or {}
    if hw.get("profile"):
        return get_profile(hw["profile"])
    if str(hw.get("device") or "").lower() == "cpu":
        return host_profile(hw)
    return profile_by_name(hw.get("device_name"))


def _source(models: FittedModels, source_profile, source_gpus: int | None) -> tuple[DeviceProfile, int]:
    hw = models.config.get("hardware") or {}
    if source_profile is None:
        prof = profile_for_hardware(hw) if hw else None
        if prof is None:
            raise RlsimError("the trace does not say which hardware recorded it: import it with --device NAME "
                             f"(known devices: {known_names()}) or pass the source profile")
    elif isinstance(source_profile, DeviceProfile):
        prof = source_profile
    elif isinstance(source_profile, dict):  # a trace's `hardware` metadata
        prof = profile_for_hardware(source_profile)
        if prof is None and not (source_profile.get("device_name") or source_profile.get("device")):
            raise RlsimError("the trace does not say which hardware recorded it: import it with --device NAME "
                             f"(known devices: {known_names()}) or pass the source profile")
        if prof is None:
            raise RlsimError(f"no device profile matches the trace's hardware {source_profile.get('device_name')!r}; "
                             f"known devices: {known_names()}")
        hw = source_profile
    else:
        prof = get_profile(str(source_profile))
    n = source_gpus if source_gpus is not None else hw.get("device_count") or hw.get("gpus") or 1
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise RlsimError(f"the source device count must be a positive integer, got {n!r}")
    return prof, n


def _x(f: float) -> str:
    return f"x{f:.4g}"


def rescale(models: FittedModels, device: str | DeviceProfile, gpus: int, *,
            source_profile: str | DeviceProfile | dict[str, Any] | None = None,
            source_gpus: int | None = None) -> tuple[FittedModels, list[str]]:
    """`models` moved to `gpus` devices of profile `device` by the roofline rule (module doc).

    source_profile: the hardware that recorded the trace: None (from `models.config["hardware"]`, which
    imported traces carry), a profile name, a DeviceProfile, or a trace's `hardware` metadata dict (whose
    `device_count` gives the source count). source_gpus overrides the source device count.
    Returns (the rescaled models, notes naming each term that moved and by what factor)."""
    dst = device if isinstance(device, DeviceProfile) else get_profile(device)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0:
        raise RlsimError(f"--gpus must be a positive integer, got {gpus!r}")
    src, n_src = _source(models, dst if dst.key == "recorded" else source_profile, source_gpus)
    bw = src.mem_bandwidth_gbs / dst.mem_bandwidth_gbs
    fl = src.flops_tflops / dst.flops_tflops
    ic = src.interconnect_gbs / dst.interconnect_gbs
    g = n_src / gpus
    memr = dst.memory_gb / src.memory_gb
    tp = int(models.config.get("tp") or 1)
    same = src.key == dst.key
    why_bw = "same device" if same else f"memory bandwidth {src.mem_bandwidth_gbs:g} -> {dst.mem_bandwidth_gbs:g} GB/s"
    why_fl = "same device" if same else f"dense FLOP/s {src.flops_tflops:g} -> {dst.flops_tflops:g} TFLOP/s"
    why_g = f"devices {n_src} -> {gpus}"
    moved = f"{n_src} x {src.name} to {gpus} x {dst.name}" if not same else f"{n_src} to {gpus} x {src.short_name}"
    notes = [f"rescaled from {moved} by the roofline rule (docs/importing.md)"]

    gm = models.gen
    weights = math.inf  # seconds of an engine step that weight reads explain: all of it, but from a CPU source
    if src.kind == "cpu" and models.sync_bytes and models.sync_bytes > 0:
        # a CPU engine step is mostly host work (Python scheduling); only reading the weights is memory-bound
        weights = models.sync_bytes / (tp * src.mem_bandwidth_gbs * 1e9)
        w = min(gm.c_step, weights)
        host = gm.c_step - w
        c_step = w * bw + host
        notes.append(f"gen c_step {gm.c_step * 1e3:.4g} -> {c_step * 1e3:.4g} ms: its weight-read part "
                     f"{w * 1e3:.4g} ms (model bytes {models.sync_bytes:.4g} / tp {tp} / source bandwidth) {_x(bw)} "
                     f"({why_bw}), the rest {host * 1e3:.4g} ms is the CPU engine's host overhead and stays")
    else:
        c_step = gm.c_step * bw
        notes.append(f"gen c_step (per engine step) {gm.c_step * 1e3:.4g} -> {c_step * 1e3:.4g} ms {_x(bw)} ({why_bw})")
    # a change of the per-sequence slope at a knee is per-token compute like c_seq; the knees' positions are kept
    gen = replace(gm.scaled(seq=fl * g, ctx=bw * g, prefill=fl * g), c_step=c_step)
    knees = " and its changes at the knees (whose positions are kept)" if gm.hinges else ""
    notes.append(f"gen c_seq (per sequence per step){knees} and c_prefill (per prompt token) {_x(fl * g)} ({why_fl}, "
                 f"{why_g})")
    notes.append(f"gen c_ctx (per context token per step, KV reads) {_x(bw * g)} ({why_bw}, {why_g})")

    update, prep = _train(models.update, fl * g, bw * g, dst.update_floor_s), _train(models.prep, fl * g, bw * g, 0.0)
    notes.append("training per token (update and prep slopes, or the update's interpolated forward + backward) "
                 f"{_x(fl * g)} ({why_fl}, {why_g}); their fixed per-update costs (optimizer step over sharded states) "
                 f"{_x(bw * g)} ({why_bw}, {why_g})")
    if _fixed(update) > _fixed(models.update) * bw * g * (1 + 1e-9):
        notes.append(f"the update's fixed cost held at the {dst.key} profile's floor {dst.update_floor_s * 1e3:.3g} ms "
                     f"(the roofline rule gives {_fixed(models.update) * bw * g * 1e3:.3g} ms; kernel launches, "
                     "optimizer step and gradient collective do not shrink with bandwidth)")
    sync = replace(models.sync, intercept=models.sync.intercept * ic, slope=models.sync.slope * ic)
    notes.append(f"weight sync {_x(ic)} (interconnect {src.interconnect_gbs:g} -> {dst.interconnect_gbs:g} GB/s)")
    notes.append("unchanged (host side): the generation round overhead, rewards and advantages, the rest of the step")

    engine = dict(models.engine)
    if engine.get("max_num_seqs"):
        engine["max_num_seqs"] = max(int(round(engine["max_num_seqs"] / g)), 1)
    if engine.get("kv_cache_tokens"):
        engine["kv_cache_tokens"] = max(int(round(engine["kv_cache_tokens"] * memr / g)), 1)
    notes.append(f"engine max_num_seqs {_x(1 / g)} ({why_g}), kv_cache_tokens {_x(memr / g)} "
                 f"(memory {src.memory_gb:g} -> {dst.memory_gb:g} GB, {why_g})")

    config = dict(models.config)
    config["hardware"] = {**dst.to_dict(), "device_count": gpus, "tp": tp}
    config["rescaled_from"] = {**src.to_dict(), "device_count": n_src}
    warning = (f"costs scaled from {n_src} to {gpus} of the recorded device by the device count (roofline rule, "
               "docs/importing.md): an extrapolation, not a measurement at that count" if same else
               f"costs rescaled from {n_src} x {src.key} to {gpus} x {dst.key} by datasheet ratios (roofline rule, "
               "docs/importing.md): an extrapolation, not a measurement on that hardware"
               + "".join(f"; {p.stand_in}" for p in (src, dst) if p.stand_in))
    reps = _replicates(models.replicates, models.update, update, weights, bw, fl * g, bw * g)
    out = replace(models, gen=gen, update=update, prep=prep, sync=sync, engine=engine, config=config, replicates=reps,
                  warnings=tuple(models.warnings) + (warning,))
    return out, notes


def _replicates(reps: Replicates | None, update: AffineModel | PiecewiseLinear, moved: AffineModel | PiecewiseLinear,
                weights: float, bw: float, compute: float, memory: float) -> Replicates | None:
    """The bootstrap replicates moved as the point fits were: engine-step rows term by term (c_step's weight-read part,
    at most `weights` seconds, x `bw`, the rest kept; c_seq, c_prefill and each slope change x `compute`; c_ctx x
    `memory`; knees kept); update rows' time coefficients x `compute`, their intercept shifted so that the point fit's
    moves to `moved`'s (a replicate's departure from the point fit moves with the per-token terms)."""
    if reps is None:
        return None
    gen = np.array(reps.gen, float)
    w = np.minimum(gen[:, 0], weights)
    gen[:, 0] = w * bw + (gen[:, 0] - w)
    gen[:, [1, 3]] *= compute
    gen[:, 2] *= memory
    gen[:, 4::2] *= compute
    upd = np.array(reps.update, float)
    upd[:, :2] *= compute
    upd[:, 2::2] *= compute
    upd[:, 0] += moved.array[0] - compute * update.array[0]
    return replace(reps, gen=gen, update=upd)


def per_device(models: FittedModels, gen: float, train: float, note: str) -> FittedModels:
    """`models` on one device measured against the run's: engine-step times (every term, not the knees) x `gen`,
    training (update and prep: per-token and fixed parts) x `train`, their replicates alike; the engine's limits,
    the host side and the sync unchanged. `note` says where the ratios came from (kept in config["one_device"])."""
    reps = models.replicates
    if reps is not None:
        upd = np.array(reps.update, float)
        upd[:, :2] *= train
        upd[:, 2::2] *= train
        reps = replace(reps, gen=EngineStepCost.scale_array(reps.gen, gen), update=upd)
    g = models.gen
    return replace(models, gen=g.scaled(step=gen, seq=gen, ctx=gen, prefill=gen),
                   update=_train(models.update, train, train, 0.0),
                   prep=_train(models.prep, train, train, 0.0), replicates=reps,
                   config={**models.config, "one_device": {"gen": gen, "train": train, "note": note}})


def device_models(models: FittedModels, r: DeviceRatios) -> FittedModels:
    """One split side's models: `models` (the run's) on one device (`r.gen`, `r.train`). The calibration's
    beside-the-other-side ratios (`r.gen_shared`, `r.train_shared`) are shown in the note, not applied: measured with
    the other side in a thread of the same process, they overstated the measured splits' slowdown (docs/results.md
    section 16)."""
    return per_device(models, r.gen, r.train, r.describe())


def _fixed(m: AffineModel | PiecewiseLinear) -> float:
    """A training model's fixed cost per update (optimizer step and the rest)."""
    return m.offset if isinstance(m, PiecewiseLinear) else m.intercept


def _train(m: AffineModel | PiecewiseLinear, compute: float, memory: float,
           floor: float) -> AffineModel | PiecewiseLinear:
    """A training model with its per-token part x `compute` and its fixed part x `memory`, held at min(itself,
    `floor`) from below (the fixed cost does not shrink past the profile's floor)."""
    fixed = max(_fixed(m) * memory, min(_fixed(m), floor))
    if isinstance(m, PiecewiseLinear):
        return replace(m, values=tuple(v * compute for v in m.values), offset=fixed)
    return replace(m, intercept=fixed, slope=m.slope * compute)


def other_roof(models: FittedModels, device: str | DeviceProfile,
               source_profile: str | DeviceProfile | dict[str, Any] | None = None) -> tuple[FittedModels, float] | None:
    """The far end of the roofline rule's move to `device`: `models` with their per-token compute terms (c_seq, its
    slope changes, c_prefill, training per token) scaled so that `rescale` moves them by the bandwidth gain instead
    of the FLOP/s gain, where the FLOP/s gain is the larger (the lower roof: which roof a term reaches on a new device
    no datasheet states). Returns (those models, the factor k = FLOP/s gain / bandwidth gain), or None where the
    FLOP/s gain is not the larger (moving to that device, the bandwidth roof is already the rule's)."""
    dst = device if isinstance(device, DeviceProfile) else get_profile(device)
    src, _ = _source(models, dst if dst.key == "recorded" else source_profile, 1)
    k = (dst.flops_tflops / src.flops_tflops) / (dst.mem_bandwidth_gbs / src.mem_bandwidth_gbs)
    if not k > 1 + 1e-9:
        return None
    update, prep = _train(models.update, k, 1.0, 0.0), _train(models.prep, k, 1.0, 0.0)
    reps = _replicates(models.replicates, models.update, update, math.inf, 1.0, k, 1.0)
    out = replace(models, gen=models.gen.scaled(seq=k, prefill=k), update=update, prep=prep, replicates=reps,
                  alternative=None)
    return out, float(k)
