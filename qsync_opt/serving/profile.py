"""Measured per-layer costs of a serving pipeline's devices that are present here.

For each device group of a serving job whose device runs on this machine (a CPU group always, as the
training profiler counts it; a GPU group when a CUDA device of its name is present), the runtime's own
model (`lm.Stage`, weight-only quantised linears dequantised per call) is timed in a subprocess that
carries the group's `env` (ONEDNN_MAX_CPU_ISA changes which kernels run) and thread count:

- one decoder layer's prefill: a micro-batch of m prompts of `prompt_len` tokens, from position 0;
- one decoder layer's decode step: a micro-batch of m sequences, one token at the planner's mean decode
  context round(prompt_len + gen_tokens / 2), its KV cache filled up to that position;
- the embedding lookup (and BLOOM's embedding norm) plus the final norm and LM head of the last position,
  per phase (shown by `qsync-opt profile`; the planner uses the stage fit below);
- whole stage calls at 16 bits, as `lm.Stage` runs them inside the pipeline: 1 and 2 layers at the first
  position (with the embedding), the last (with the final norm, LM head and greedy pick) and the middle
  (the 1-layer middle stage is the layer entry itself); `fit_stage` fits each position a fixed term per call
  (embedding / head, rotary positions, the call's Python) plus one per-layer term, and the planner prices a
  stage as its position's fixed term (`fixed_*_ms`) plus its layers' entries less the middle stage's fixed
  term (a layer entry is a 1-layer middle stage call, so it holds that call's fixed cost once);

at every bit-width in `serving.bits` and every micro-batch size the planner tries (prefill and decode
sizes together, both phases). Decoder layers are identical in shape, so each distinct (layer shape,
bits, m, phase, length) is measured once, whatever the layer count: the table is keyed by the layer's
shape, not the model's depth. Each entry is the median of repeated calls, repeated until adding calls
moves the median by at most STABLE (between FLOOR and CAP calls, or BUDGET_MS of timed calls), each after
IDLE_S of sleep, as a stage's call follows its wait for input in the pipeline. The groups
that `profile_job` measures together run at the same time, one process each (the training profiler's
co-location: the pipeline's stages share this machine's cores), so each is timed beside the others' load.

The table lives in this machine's profile folder (the training profiler's: $QSYNC_OPT_PROFILE_DIR, else
$QSYNC_OPT_CACHE, else ~/.cache/qsync_opt/profiles), one file per machine (CPU model and ISA flags),
tables keyed by device, env, threads, family, layer shape, dtype, quantisation group, torch version and the idle
time before each timed call:
a change of any of them misses the cache rather than reusing foreign figures.

`serving.costs`: 'roofline' never reads it; 'auto' uses a group's table when the cache holds every entry
the planner needs, else that group stays on the roofline (and the plan says why); 'measured' profiles
present groups on first use and refuses a group whose device is not here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.hardware.machine import cuda_possible
from qsync_opt.io import entry_lock
from qsync_opt.llm import costs as C
from qsync_opt.serving import link
from qsync_opt.serving.instance import micro_batch_sizes
from qsync_opt.serving.spec import ServingJob
from qsync_opt.serving.profile_file import (  # noqa: F401 (re-exported: the file's names, as before)
    FORMAT, VERSION, ServingProfile, cache_dir, default_path, load, machine_description, torch_version)
from qsync_opt.serving.profile_measure import IDLE_S, PROFILE_LAYERS, measure, stable_median_ms  # noqa: F401 (re-exported)
from qsync_opt.serving.weights import family_config, require_transformers
from qsync_opt.spec.yaml_loader import loads_code

POSITIONS = ("first", "mid", "last")
"""Pipeline positions a stage call is measured at: with the embedding, neither, with the LM head."""
STAGE_DEPTHS = (1, 2)
"""Layers per measured stage call (the fit's points per position)."""


# --------------------------------------------------------------------------------------- where, which keys


def present(device) -> bool:
    """Whether `device` (a DeviceSpec) runs on this machine: a CPU always (as the training profiler counts
    it), a GPU when a CUDA device whose name contains the device's family name (e.g. 'T4', 'H200') is here."""
    if device.kind == "cpu":
        return True
    if not cuda_possible():
        return False  # no GPU driver: no CUDA device, and planning need not import torch to learn it
    import torch  # import cost: torch (only for a spec with a GPU group and costs other than roofline)

    if not torch.cuda.is_available():
        return False
    return device.name.lower().split("-")[0] in torch.cuda.get_device_name(0).lower().replace(" ", "")


def group_threads(group) -> str:
    """The torch thread count a group's stage runs with: its env's OMP_NUM_THREADS, else 'default' (what a
    fresh process of this machine has)."""
    return group.env.get("OMP_NUM_THREADS", "default")


def sizes(job: ServingJob) -> list[int]:
    """Micro-batch sizes measured, in both phases: every size the planner tries in either phase (its
    diagnosis prices decode at a prefill size too)."""
    s = job.serving
    return sorted(set(micro_batch_sizes(s, "prefill")) | set(micro_batch_sizes(s, "decode")))


def decode_context(job: ServingJob) -> int:
    s = job.serving
    return int(round(s.prompt_len + s.gen_tokens / 2))


def entry_key(part: str, phase: str, m: int, length: int, bits: int = 16) -> str:
    """'layer|bits=4|m=2|prefill|s=32', 'layer|bits=4|m=2|decode|ctx=40', 'head|m=2|prefill|s=32', 'head|m=2|decode'.

    `length` is the prompt length (prefill) or the context the decoded token attends to (decode)."""
    where = f"s={length}" if phase == "prefill" else f"ctx={length}"
    if part == "head":
        return f"head|m={m}|prefill|{where}" if phase == "prefill" else f"head|m={m}|decode"
    return f"layer|bits={bits}|m={m}|{phase}|{where}"


def stage_key(pos: str, n: int, phase: str, m: int, length: int) -> str:
    """A whole stage call of `n` 16-bit layers at pipeline position `pos`: 'stage|pos=first|n=2|m=4|decode|ctx=56'.
    The 1-layer middle stage is the 16-bit layer entry (the same call)."""
    if pos == "mid" and n == 1:
        return entry_key("layer", phase, m, length, 16)
    where = f"s={length}" if phase == "prefill" else f"ctx={length}"
    return f"stage|pos={pos}|n={n}|m={m}|{phase}|{where}"


def wanted(job: ServingJob) -> list[str]:
    """Every entry the planner needs of one present device: layers at each bit, m and phase, the head, and
    whole stage calls at each position and depth."""
    s, ctx = job.serving, decode_context(job)
    out = []
    for m in sizes(job):
        for b in s.bits:
            out += [entry_key("layer", "prefill", m, s.prompt_len, b), entry_key("layer", "decode", m, ctx, b)]
        out += [entry_key("head", "prefill", m, s.prompt_len), entry_key("head", "decode", m, ctx)]
        for phase, length in (("prefill", s.prompt_len), ("decode", ctx)):
            out += [k for pos in POSITIONS for n in STAGE_DEPTHS
                    if (k := stage_key(pos, n, phase, m, length)) not in out]
    return out


def compute_dtype(job: ServingJob, device) -> str:
    d = job.serving.runtime.dtype
    return ("float32" if device.kind == "cpu" else "float16") if d == "auto" else d


def layer_config(job: ServingJob) -> dict:
    """transformers config fields of the model built to profile: the spec's shape with PROFILE_LAYERS layers."""
    s = job.serving
    cfg = family_config(s.model, s.runtime.family)
    cfg["n_layer" if s.runtime.family == "bloom" else "num_hidden_layers"] = PROFILE_LAYERS
    return cfg


def table_key(job: ServingJob, group) -> str:
    """One table per device, env, threads, family, layer shape (depth excluded), dtype, group size, torch."""
    s, dev = job.serving, group.device_spec
    shape = {k: v for k, v in layer_config(job).items() if k not in ("n_layer", "num_hidden_layers")}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:10]
    where = dev.name
    if dev.kind != "cpu":
        import torch  # import cost: torch (a GPU group: its table names the GPU this machine has)

        where += f"@{torch.cuda.get_device_name(0)}"
    env = ",".join(f"{k}={v}" for k, v in sorted(group.env.items()))
    return (f"{where}|env={env}|threads={group_threads(group)}|{s.runtime.family}:{digest}|"
            f"{compute_dtype(job, dev)}|group={s.runtime.group_size}|torch={torch_version()}|idle_ms={IDLE_S * 1e3:g}")


def local_pipeline(job: ServingJob) -> bool:
    """Every stage runs on this machine's CPU: its hops are gloo messages between local processes (serving/link.py)."""
    return all(g.device_spec.kind == "cpu" for g in job.cluster.groups)


def stage_threads(job: ServingJob) -> list[int]:
    """Threads of each stage process `run` starts (serve.stage_envs: a group's OMP_NUM_THREADS, else this
    machine's CPU count over the stages), one stage per device."""
    devices = [g for g in job.cluster.groups for _ in range(g.count)]
    share = max(1, (os.cpu_count() or 1) // max(1, len(devices)))
    out = []
    for g in devices:
        t = g.env.get("OMP_NUM_THREADS", "")
        out.append(int(t) if t.isdigit() and int(t) > 0 else share)
    return out


def serial_pipeline(job: ServingJob) -> bool:
    """Whether the planner prices micro-batches as not overlapping (program.ServingInstance.serial): a local CPU
    pipeline (measured costs) whose stage threads fill this machine's cores, so no core is left for a message
    that arrives while its receiver computes."""
    if job.serving.costs == "roofline" or not local_pipeline(job):
        return False
    return sum(stage_threads(job)) >= (os.cpu_count() or 1)


LINK_TABLE = "link|cpu-gloo"


def link_key() -> str:
    return f"{LINK_TABLE}|torch={torch_version()}"


def hop_bytes(job: ServingJob) -> dict[tuple[str, int], int]:
    """(phase, micro-batch) -> bytes of the hidden states one hop carries (float32 on CPU, as the runtime sends)."""
    s, h = job.serving, job.serving.model.get("hidden")
    return {**{("prefill", m): m * s.prompt_len * h * 4 for m in sizes(job)},
            **{("decode", m): m * h * 4 for m in sizes(job)}}


def measured_hops(job: ServingJob, path: "str | Path | None" = None) -> dict[tuple[str, int], float] | None:
    """(phase, micro-batch) -> one measured hop in ms, when the pipeline is local and the cache holds every size."""
    if job.serving.costs == "roofline" or not local_pipeline(job):
        return None
    path = Path(path) if path is not None else default_path()
    entries = load(path).entries(link_key()) if path.exists() else {}
    want = hop_bytes(job)
    if not all(link.entry(n) in entries for n in want.values()):
        return None
    return {k: entries[link.entry(n)] for k, n in want.items()}


def profile_link(job: ServingJob, path: "str | Path", log: Callable[[str], None],
                 measure_link: Callable[[list[int]], dict[str, float]] | None = None) -> None:
    """Measure the hop sizes the cache lacks (local CPU pipelines only); caller holds the profile's lock."""
    if not local_pipeline(job):
        return
    prof = load(path)
    have = prof.entries(link_key())
    missing = sorted({n for n in hop_bytes(job).values() if link.entry(n) not in have})
    if not missing:
        return
    log(f"measuring the stage-to-stage hop (gloo between two local processes): {len(missing)} message sizes")
    got = (measure_link or link.measure)(missing)
    prof.tables.setdefault(link_key(), {"shape": {}, "entries": {}})["entries"].update(got)
    prof.save(path)


# --------------------------------------------------------------------------------------- what the planner reads


@dataclass(frozen=True)
class GroupCosts:
    """Measured costs of one device group, as `instance.build` reads them."""

    prefill: Mapping[tuple[int, int], float]
    """(bits, micro-batch) -> one layer's prefill of one micro-batch, ms."""
    decode: Mapping[tuple[int, int], float]
    """(bits, micro-batch) -> one layer's decode step of one micro-batch at the mean context, ms."""
    head: Mapping[tuple[str, int], float]
    """(phase, micro-batch) -> embedding + LM head of one micro-batch, ms."""
    source: str = "given table"
    """Where the figures come from (the profile file)."""
    fixed: Mapping[tuple[str, str, int], float] | None = None
    """(position, phase, micro-batch) -> a stage call's fixed time at that position ('first', 'mid', 'last',
    'only' for a one-stage pipeline), ms, from `fit_stage`; `prefill` / `decode` are then the fitted per-layer
    terms. None (a table without stage entries): stage 0 carries `head`, the others nothing."""


def fit_stage(points: Mapping[tuple[str, int], float]) -> tuple[dict[str, float], float]:
    """Least squares of t(pos, n) = F[pos] + n·a over measured stage calls {(pos, layers): ms}: one per-layer
    slope a shared by every position, one fixed term per position (each position needs two depths). Returns
    ({pos: F}, a); F is clamped at 0 (a negative fixed cost is noise, not a saving)."""
    by_pos: dict[str, list[tuple[int, float]]] = {}
    for (pos, n), t in points.items():
        by_pos.setdefault(pos, []).append((n, t))
    if not by_pos or any(len({n for n, _ in v}) < 2 for v in by_pos.values()):
        raise ValueError("fit_stage: every position needs stage calls of at least two depths")
    mean = {p: (sum(n for n, _ in v) / len(v), sum(t for _, t in v) / len(v)) for p, v in by_pos.items()}
    num = sum((n - mean[p][0]) * (t - mean[p][1]) for p, v in by_pos.items() for n, t in v)
    den = sum((n - mean[p][0]) ** 2 for p, v in by_pos.items() for n, _ in v)
    a = num / den
    return {p: max(0.0, tb - a * nb) for p, (nb, tb) in mean.items()}, a


def group_costs(job: ServingJob, entries: Mapping[str, float], source: str = "given table") -> GroupCosts:
    """A table's entries as GroupCosts (every entry `wanted(job)` lists must be there). With stage entries
    (tables measured by this release), per (phase, micro-batch): `fit_stage` gives each position's fixed term,
    and a layer at b bits costs its layer entry less the middle position's fixed term (at least 1% of the entry)."""
    s, ctx = job.serving, decode_context(job)
    ms = sizes(job)
    length = {"prefill": s.prompt_len, "decode": ctx}
    layer = {(ph, b, m): entries[entry_key("layer", ph, m, length[ph], b)]
             for ph in ("prefill", "decode") for b in s.bits for m in ms}
    fixed = None
    if all(stage_key(p, n, ph, m, length[ph]) in entries
           for p in POSITIONS for n in STAGE_DEPTHS for ph in length for m in ms):
        fixed = {}
        for ph in length:
            for m in ms:
                f, _ = fit_stage({(p, n): entries[stage_key(p, n, ph, m, length[ph])]
                                  for p in POSITIONS for n in STAGE_DEPTHS})
                f["only"] = max(0.0, f["first"] + f["last"] - f["mid"])
                fixed.update({(p, ph, m): v for p, v in f.items()})
                for b in s.bits:
                    layer[(ph, b, m)] = max(0.01 * layer[(ph, b, m)], layer[(ph, b, m)] - f["mid"])
    return GroupCosts(
        prefill={(b, m): layer[("prefill", b, m)] for b in s.bits for m in ms},
        decode={(b, m): layer[("decode", b, m)] for b in s.bits for m in ms},
        head={**{("prefill", m): entries[entry_key("head", "prefill", m, s.prompt_len)] for m in ms},
              **{("decode", m): entries[entry_key("head", "decode", m, ctx)] for m in ms}},
        source=source,
        fixed=fixed,
    )


Runner = Callable[[dict], dict]
"""request -> {entry key: ms}: how one group's entries are measured (default: a subprocess with its env)."""


def measured_costs(job: ServingJob, *, path: "str | Path | None" = None, runner: Runner | None = None,
                   log: Callable[[str], None] | None = None) -> tuple[dict[str, GroupCosts], list[str]]:
    """(group name -> GroupCosts, notes) under `serving.costs` (module docstring); groups left out stay
    on the roofline, and a note says why."""
    s = job.serving
    if s.costs == "roofline":
        return {}, []
    path = Path(path) if path is not None else default_path()
    out, notes = {}, []
    groups = job.cluster.groups
    here = [g for g in groups if present(g.device_spec)]
    away = [g for g in groups if g not in here]
    if s.costs == "measured" and away:
        i = groups.index(away[0])
        raise SpecError(f"serving.costs: measured, but cluster.groups.{i} ({away[0].name}, device "
                        f"{away[0].device_spec.name}) is not on this machine, so its costs cannot be measured; "
                        "use costs: auto (its stages keep the roofline) or plan where it runs")
    if away:
        notes.append("costs of " + ", ".join(f"{g.name} ({g.device_spec.name})" for g in away)
                     + ": roofline (device not on this machine)")
    if not here:
        return out, notes
    if s.costs == "measured":
        profile_job(job, path=path, runner=runner, log=log)
    prof = load(path)
    need = wanted(job)
    for g in here:
        entries = prof.entries(table_key(job, g))
        missing = [k for k in need if k not in entries]
        if missing:
            notes.append(f"costs of {g.name}: roofline (no measured table for it in {path}: {len(missing)} of "
                         f"{len(need)} entries missing; `qsync-opt profile SPEC` measures them)")
            continue
        out[g.name] = group_costs(job, entries, str(path))
    return out, notes


# --------------------------------------------------------------------------------------- measuring


def profile_job(job: ServingJob, *, path: "str | Path | None" = None, groups: list[str] | None = None,
                runner: Runner | None = None, log: Callable[[str], None] | None = None,
                measure_link: Callable[[list[int]], dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    """Measure what the cache lacks for every present group (or those named in `groups`), and, for a pipeline
    all on this machine's CPU, the stage-to-stage hop; returns table key -> its entries. One profiling run per
    file at a time (io.entry_lock). A caller that gives its own `runner` (a test) measures the hop only with
    its own `measure_link`."""
    log = log or (lambda m: print(m, file=sys.stderr))
    path = Path(path) if path is not None else default_path()
    cl = job.cluster.groups
    for i, g in enumerate(cl):
        bad = [k for k in g.env if loads_code(k)]
        if bad:
            raise SpecError(f"cluster.groups.{i}.env.{bad[0]}: this env key makes the profiler load code chosen by "
                            "the spec; remove it (a serving profile runs only the runtime's own model)")
    if groups is not None:
        unknown = [n for n in groups if n not in {g.name for g in cl}]
        if unknown:
            raise SpecError(f"profile --groups: {unknown[0]!r} is not in cluster.groups ({', '.join(g.name for g in cl)})")
    todo = [g for g in cl if (groups is None or g.name in groups) and present(g.device_spec)]
    if runner is None:  # the measuring processes build the model: say what to install here, not in their traceback
        require_transformers("serving.costs (measuring builds the model)")
    if not todo:
        raise SpecError("profile: no group of cluster.groups runs on this machine's device; nothing to measure")
    fits_to_profile(job, todo)
    runner = runner or run_subprocess
    need = wanted(job)
    if Path(path).is_dir():
        load(path)  # refuses it, naming the folder: before the lock, which would sit beside the folder
    with entry_lock(path, on_wait=lambda: log(f"waiting: another process is profiling into {path}")):
        prof = load(path)
        jobs: dict[str, tuple[object, list[str]]] = {}  # table key -> (group, missing entries)
        for g in todo:
            key = table_key(job, g)
            if key in jobs or key in {table_key(job, h) for h in todo[:todo.index(g)]}:
                continue  # two groups on the same device, env and threads: one table
            missing = [k for k in need if k not in prof.entries(key)]
            if not missing:
                log(f"{g.name}: all {len(need)} entries cached ({key})")
                continue
            log(f"profiling {g.name} (device {g.device_spec.name}, env {g.env or '{}'}, threads "
                f"{group_threads(g)}): {len(missing)} entries")
            jobs[key] = (g, missing)
        # the groups are measured at the same time, one process each, as the pipeline's stages run; a caller's
        # own runner (a test's, in this process) measures them one after another
        workers = max(1, len(jobs)) if runner is run_subprocess else 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {key: pool.submit(runner, request(job, g, missing)) for key, (g, missing) in jobs.items()}
            got = {key: f.result() for key, f in futures.items()}
        for key, (g, missing) in jobs.items():
            table = prof.tables.setdefault(key, {"shape": layer_config(job), "entries": {}})
            table["entries"].update({k: float(got[key][k]) for k in missing})
        if jobs:
            prof.save(path)
        if runner is run_subprocess or measure_link is not None:
            profile_link(job, path, log, measure_link)
        return {k: prof.entries(k) for k in {table_key(job, g) for g in todo}}


def fits_to_profile(job: ServingJob, groups) -> None:
    """SpecError naming serving.model when the model built to profile (PROFILE_LAYERS layers, fp32 weights
    and embeddings, the KV cache of the largest micro-batch) cannot fit a group's device memory."""
    s = job.serving
    cfg, m, ctx = s.model, max(sizes(job)), s.prompt_len + s.gen_tokens
    attn, ffn = C.linear_params(cfg)
    need = 4 * (PROFILE_LAYERS * (attn + ffn) + 2 * cfg.get("vocab") * cfg.get("hidden"))
    need += 2 * m * ctx * cfg.get("kv_heads") * cfg.head_dim * 4
    for g in groups:
        have = g.device_spec.memory_bytes
        if need > have:
            raise SpecError(f"serving.model: the {PROFILE_LAYERS}-layer model built to measure costs on {g.name} "
                            f"needs {need / 1e9:.3g} GB, more than its device's {have / 1e9:.3g} GB; use a smaller "
                            "model or serving.costs: roofline")


def request(job: ServingJob, group, keys: list[str]) -> dict:
    """What one group's measuring process needs (JSON): the model to build, how to run it, which entries."""
    s, dev = job.serving, group.device_spec
    return {"family": s.runtime.family, "config": layer_config(job), "dtype": compute_dtype(job, dev),
            "group_size": s.runtime.group_size, "device": "cpu" if dev.kind == "cpu" else "cuda",
            "env": dict(group.env), "threads": group_threads(group), "keys": list(keys)}


def run_subprocess(req: dict) -> dict[str, float]:
    """`req` measured by `python -m qsync_opt.serving.profile_measure` in a fresh process carrying the group's env
    (oneDNN reads its ISA cap once, at its first kernel) and thread count."""
    import tempfile

    env = {**os.environ, **req["env"]}
    if req["threads"] != "default":
        env["OMP_NUM_THREADS"] = str(req["threads"])
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="qsync-serving-profile-") as d:
        (Path(d) / "request.json").write_text(json.dumps(req))
        r = subprocess.run([sys.executable, "-m", "qsync_opt.serving.profile_measure", d], env=env,
                           capture_output=True, text=True)
        if r.returncode:
            raise SpecError(f"serving profile: measuring env {req['env'] or '{}'} failed (exit {r.returncode}): "
                            f"{r.stderr.strip()[-1500:]}")
        return json.loads((Path(d) / "result.json").read_text())
