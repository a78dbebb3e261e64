"""The measured-profile file: op timings, cast fits and all-reduce fits of one machine.

One JSON file per machine. Top level: `format`, `version`, `machine` (CPU model and ISA
flags, or GPU name and capability), `versions` (torch, qsync-opt), `created`/`updated` (UTC),
`sections` and `allreduce`. A section holds what was measured under one environment (a
group's `env`, e.g. ONEDNN_MAX_CPU_ISA, changes which kernels run), thread count, and number
of ranks busy on the machine at once (colocate.py; `ranks=N` in its key when N > 1):

  ops:       op signature -> {fwd_ms, bwd_ms}    (signature: kind, shapes, FLOPs, precision)
  casts:     "src->dst" -> {a_ms_per_elem, b_ms} (a·n + b)
  optimizer: "adamw|<params digest>" -> ms       (one optimizer.step() + the loss)
  steps:     same key -> {precision: ms}          (one whole training step, every selectable
                                                   op at that precision; step_profile.py)
  dispatch:  shape class -> {impl, at, candidates} (the implementation that won the race at that
                                                   class's first op, and what each candidate
                                                   measured; measured_dispatch.py)
  allreduce: "gloo/<ranks>" -> {alpha_ms, beta_ms_per_byte}
             "ddp/<ranks>|<digest>" -> {fp32_ms}   (one whole fp32 DDP step, every rank at once;
                                                   allreduce_profile.ddp_key)

Signatures depend only on an OpNode's shapes and FLOPs, so models that share shapes share
entries. A file that is not valid JSON, misses a field, has another format/version, or was
measured on another machine raises ProfileError naming the file: it is never used silently.

Imports no torch: `qsync-opt profile`'s parent process reads, merges and writes profiles while its
measuring processes run, and asks torch about a GPU only where one can be present
(hardware.machine.cuda_possible).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.hardware.machine import cpu_description, cuda_possible, profile_dir
from qsync_opt.io import atomic_write_text
from qsync_opt.kernels.dispatch import KERNELS
from qsync_opt.models.graph import OpGraph, OpNode

FORMAT = "qsync-opt-profile"
VERSION = 3
#: What each older version lacks, for the message that refuses it.
_OLD = {1: "written before whole training steps were measured (the 'steps' the cost model needs)",
        2: "written before implementations were raced (its int8/int4 times are of the ruled dispatch, not the "
           "measured one the runtime now runs)"}


class ProfileError(SpecError):
    """A profile file that cannot be used: corrupt, truncated, foreign or of another format."""


def machine_description() -> dict:
    """What identifies this machine's kernels: CPU model + ISA flags (and the GPU when present)."""
    desc = {"kind": "cpu", **cpu_description()}
    if not cuda_possible():  # no GPU driver here: torch would say no CUDA too, after a second of importing
        return desc
    import torch  # import cost: torch, only where a GPU may be present

    if torch.cuda.is_available():
        desc.update(kind="cuda", gpu=torch.cuda.get_device_name(0),
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    return desc


def library_versions() -> dict:
    import sys
    from importlib.metadata import PackageNotFoundError, version

    torch = sys.modules.get("torch")
    try:  # the installed distribution's version is torch.__version__; read without importing torch
        out = {"torch": str(torch.__version__) if torch is not None else version("torch")}
    except PackageNotFoundError:
        import torch

        out = {"torch": str(torch.__version__)}
    try:
        out["qsync-opt"] = version("qsync-opt")
    except PackageNotFoundError:
        pass
    return out


#: The spec's `runtime` settings that change what a quantized op executes, at their defaults (training/spec.py's
#: RuntimeSpec). Times measured under other values belong to a section of their own (`runtime_tag`).
RUNTIME_DEFAULTS = {"kernels": "auto", "backward_precision": "bf16", "weight_granularity": "per_tensor",
                    "rounding": "nearest"}


def runtime_tag(runtime) -> str:
    """'' when `runtime` (a RuntimeSpec) is at RUNTIME_DEFAULTS, else its other settings, e.g.
    'backward_precision=fp8': an op's time under backward_precision fp8 is not its time under bf16."""
    return ",".join(f"{k}={getattr(runtime, k)}" for k, d in RUNTIME_DEFAULTS.items() if getattr(runtime, k) != d)


def section_key(env: dict[str, str], threads: int, ranks: int = 1, runtime: str = "") -> str:
    """Name of the section measured under `env` with `threads` threads, beside `ranks` − 1 other
    ranks busy on this machine (colocate.py: what a rank costs depends on who shares its cores),
    with the runtime settings `runtime` (runtime_tag)."""
    parts = [f"{k}={v}" for k, v in sorted(env.items())]
    return ",".join([f"threads={threads}", *parts, *([f"ranks={ranks}"] if ranks > 1 else []),
                     *([runtime] if runtime else [])])


def op_signature(node: OpNode, precision: str) -> str:
    """Key of one op's timing: everything about the op that decides its kernels."""
    ins = ";".join("x".join(map(str, s)) for s in node.input_shapes)
    out = "x".join(map(str, node.output_shape))
    w = "x".join(map(str, node.weight_shape)) if node.weight_shape else "-"
    src = "|src" if node.depth == 0 else ""  # reads the model input: no input gradient
    return f"{node.kind}|in={ins}|out={out}|w={w}|p={node.param_count}|f={node.fwd_flops}{src}|{precision}"


def step_key(optimizer: str, graph: OpGraph) -> str:
    """Key of one optimizer step + loss: the optimizer, the parameters and the batch."""
    holders = [n.param_count for n in graph.nodes if n.param_count]
    digest = hashlib.sha256(json.dumps(holders).encode()).hexdigest()[:10]
    out = "x".join(map(str, graph.nodes[-1].output_shape)) if graph.nodes else "-"
    return f"{optimizer}|params={sum(holders)}:{digest}|b={graph.batch_size}|out={out}"


@dataclass
class Section:
    env: dict[str, str]
    threads: int
    ops: dict[str, dict[str, float]] = field(default_factory=dict)
    casts: dict[str, dict[str, float]] = field(default_factory=dict)
    optimizer: dict[str, float] = field(default_factory=dict)
    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    dispatch: dict[str, dict] = field(default_factory=dict)


@dataclass
class Profile:
    machine: dict
    versions: dict
    created: str
    sections: dict[str, Section] = field(default_factory=dict)
    allreduce: dict[str, dict[str, float]] = field(default_factory=dict)
    path: str | None = None

    @classmethod
    def new(cls) -> "Profile":
        return cls(machine_description(), library_versions(), _now())

    def section(self, env: dict[str, str], threads: int, ranks: int = 1, runtime: str = "") -> Section:
        key = section_key(env, threads, ranks, runtime)
        if key not in self.sections:
            self.sections[key] = Section(dict(env), threads)
        return self.sections[key]

    def find_section(self, env: dict[str, str], threads: int, ranks: int = 1, runtime: str = "") -> Section | None:
        return self.sections.get(section_key(env, threads, ranks, runtime))

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "machine": self.machine, "versions": self.versions,
            "created": self.created, "updated": _now(),
            "sections": {k: {"env": s.env, "threads": s.threads, "ops": s.ops, "casts": s.casts,
                             "optimizer": s.optimizer, "steps": s.steps, "dispatch": s.dispatch}
                         for k, s in self.sections.items()},
            "allreduce": self.allreduce,
        }

    def save(self, path: "str | Path") -> Path:
        """Write atomically: a reader (or an interrupted run) never sees half a file."""
        self.path = str(path)
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _need(d, key, kind, where, path):
    if not isinstance(d, dict) or key not in d or not isinstance(d[key], kind):
        raise ProfileError(
            f"profile {path}: field {where}{key!r} is missing or not a {kind.__name__}; the file is "
            "truncated or not a qsync-opt profile — delete it and run `qsync-opt profile` again"
        )
    return d[key]


def _numbers(d: dict, where: str, path) -> None:
    for k, v in d.items():
        vals = v.values() if isinstance(v, dict) else [v]
        if not all(isinstance(x, (int, float)) and x == x and x >= 0 for x in vals):
            raise ProfileError(f"profile {path}: {where}[{k!r}] holds {v!r}, not non-negative numbers; "
                               "the file is corrupt — delete it and run `qsync-opt profile` again")


def _dispatch(d, where: str, path) -> dict:
    """The section's measured dispatch (measured_dispatch.py), each entry naming a kernels setting that exists."""
    ok = isinstance(d, dict) and all(isinstance(e, dict) and e.get("impl") in KERNELS and isinstance(e.get("at"), str)
                                     and isinstance(e.get("candidates"), dict) for e in d.values())
    if not ok:
        raise ProfileError(f"profile {path}: {where} is not a map of shape class -> {{impl (one of "
                           f"{', '.join(KERNELS)}), at, candidates}}; the file is corrupt — delete it and run "
                           "`qsync-opt profile` again")
    return d


def load_profile(path: "str | Path", *, check_machine: bool = True) -> Profile:
    """Read and validate a profile; ProfileError naming the file when it cannot be trusted."""
    path = Path(path)
    if path.is_dir():
        raise ProfileError(f"profile {path}: a folder, not a profile file; give a file in it, e.g. {path / 'profile.json'}")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path}: no such file; run `qsync-opt profile SPEC -o {path}`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"profile {path}: not readable JSON ({e}); the file is corrupt or truncated — "
                           "delete it and run `qsync-opt profile` again") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ProfileError(f"profile {path}: not a qsync-opt profile (format {raw.get('format') if isinstance(raw, dict) else None!r}, "
                           f"expected {FORMAT!r})")
    if raw.get("version") != VERSION:
        old = _OLD.get(raw.get("version"))
        raise ProfileError(f"profile {path}: version {raw.get('version')!r}{f' ({old})' if old else ''}, this "
                           f"release reads {VERSION}; delete it and run `qsync-opt profile SPEC` again")
    machine = _need(raw, "machine", dict, "", path)
    sections = {}
    for key, s in _need(raw, "sections", dict, "", path).items():
        where = f"sections[{key!r}]."
        sec = Section(_need(s, "env", dict, where, path), _need(s, "threads", int, where, path),
                      _need(s, "ops", dict, where, path), _need(s, "casts", dict, where, path),
                      _need(s, "optimizer", dict, where, path), _need(s, "steps", dict, where, path))
        for name in ("ops", "casts", "optimizer", "steps"):
            _numbers(getattr(sec, name), where + name, path)
        sec.dispatch = _dispatch(_need(s, "dispatch", dict, where, path), where + "dispatch", path)
        sections[key] = sec
    allreduce = _need(raw, "allreduce", dict, "", path)
    _numbers(allreduce, "allreduce", path)
    prof = Profile(machine, _need(raw, "versions", dict, "", path), _need(raw, "created", str, "", path),
                   sections, allreduce, str(path))
    if check_machine:
        here = machine_description()
        if machine != here:
            raise ProfileError(
                f"profile {path}: measured on another machine ({_describe(machine)}), this is "
                f"{_describe(here)}; its timings do not hold here — profile this machine "
                "(`qsync-opt profile SPEC`) or give the group a profile of its own device"
            )
    return prof


def _describe(m: dict) -> str:
    if m.get("kind") == "cuda":
        return f"{m.get('gpu')} sm {m.get('capability')}"
    return f"{m.get('cpu')!r} with {', '.join(m.get('isa', [])) or 'no listed ISA flags'}"


def cache_dir() -> Path:
    """Where profiles and indicator caches live: $QSYNC_OPT_PROFILE_DIR, else $QSYNC_OPT_CACHE,
    else ~/.cache/qsync_opt/profiles (beside the kernel and data caches)."""
    return profile_dir()


def default_profile_path() -> Path:
    """This machine's own profile file, named by a digest of its description."""
    digest = hashlib.sha256(json.dumps(machine_description(), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / f"profile-{digest}.json"
