"""The `kind: rollout` job: RL post-training rollouts on a hybrid fleet (Laminar, arXiv 2510.12633).

A trainer group consumes finished trajectories and publishes weight versions; rollout worker
groups generate them, each at a weight bit-width the serving cost model prices. Response
lengths are long-tailed (lognormal by median and p99, or observed lengths from a file).
The policy says how generation and training overlap and how weights reach the rollouts;
repack says whether long-tail trajectories are consolidated onto few workers.

`load_rollout_spec(source)` accepts a path, a YAML string or a dict; every error names the
field path, the value and what would be accepted (spec_errors.format_errors).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from qsync_opt.llm.config import BitWidth, TransformerConfig
from qsync_opt.spec.base import SpecModel as _Model
from qsync_opt.hardware.cluster import INTERCONNECTS, Cluster, Interconnect
from qsync_opt.spec.load import read_document, validate

POLICIES = ("sync", "one-step-off", "stale", "partial-rollout", "trajectory-async")
STREAMING = ("stale", "partial-rollout", "trajectory-async")
Z99 = 2.3263478740408408
"""Standard-normal 99th percentile: p99 = median · exp(σ · Z99) for a lognormal."""
MAX_TRAJECTORIES = 10_000_000
"""Most trajectories a plan may draw, (steps + η + 2) × batch: the simulator holds each one's lengths and
simulates it token chunk by token chunk (laminar's example draws 217,088)."""
MAX_ROLLOUT_DEVICES = 100_000
"""Most rollout devices a plan may simulate, each one a worker of the event loop."""


def _phi(x: float) -> float:
    """The standard normal's CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


class LengthDist(_Model):
    """Token lengths: a lognormal by median and p99, or a file of observed lengths (one integer per
    line or whitespace-separated), sampled with replacement."""

    median: float | None = Field(default=None, gt=0)
    """Median length in tokens."""
    p99: float | None = Field(default=None, gt=0)
    """99th-percentile length in tokens (Laminar's math workloads: about 10x the median)."""
    file: str | None = None
    """A text file of observed lengths (positive integers); relative paths are read from the working directory."""

    @model_validator(mode="after")
    def _one_source(self) -> LengthDist:
        if self.file is not None:
            if self.median is not None or self.p99 is not None:
                raise ValueError("give either file or median (+ p99), not both")
            self.observed()  # read now, so a bad file fails at load time with the field named
            return self
        if self.median is None:
            raise ValueError("give median (and p99) in tokens, or file: a file of observed lengths")
        if self.p99 is not None and self.p99 < self.median:
            raise ValueError(f"p99 {self.p99} is below the median {self.median}; p99 must be ≥ median")
        return self

    def observed(self) -> list[int]:
        path = Path(self.file)
        if not path.exists():
            raise ValueError(f"lengths file {self.file!r} does not exist")
        out = []
        for i, tok in enumerate(path.read_text().split()):
            try:
                v = float(tok)
            except ValueError:
                raise ValueError(f"lengths file {self.file!r}: entry {i + 1} is {tok!r}, not a number; "
                                 "write one positive integer token count per line") from None
            if not math.isfinite(v) or v < 1 or v != int(v):
                raise ValueError(f"lengths file {self.file!r}: entry {i + 1} is {tok!r}; lengths must be "
                                 "positive integers (tokens)")
            out.append(int(v))
        if not out:
            raise ValueError(f"lengths file {self.file!r} holds no lengths")
        return out

    @property
    def sigma(self) -> float:
        """Lognormal σ (0 when no p99: every length is the median)."""
        if self.file is not None or self.p99 is None:
            return 0.0
        return math.log(self.p99 / self.median) / Z99

    def cut_frac(self, cap: int) -> float:
        """The share of lengths above `cap`: the simulator and the real run end them at `cap` tokens."""
        if self.file is not None:
            xs = self.observed()
            return sum(x > cap for x in xs) / len(xs)
        if self.sigma == 0:
            return 1.0 if round(self.median) > cap else 0.0
        return 0.5 * math.erfc(math.log(cap / self.median) / self.sigma / math.sqrt(2))

    def mean(self, cap: int) -> float:
        """Mean length of what the simulator draws (rollout.sim_workload.sample_lengths): D = clip(rint(X), 1, cap).

        A file: the mean of its lengths cut at `cap`. A lognormal X (μ = ln median, σ): the closed form of
        E[clip(X, 1, c)] = E[min(X, c)] + E[(1 − X)⁺], with
        E[min(X, c)] = e^{μ+σ²/2}·Φ((ln c − μ − σ²)/σ) + c·(1 − Φ((ln c − μ)/σ)) and
        E[(1 − X)⁺] = Φ(−μ/σ) − e^{μ+σ²/2}·Φ((−μ − σ²)/σ).
        The draw rounds to whole tokens: E[D] = 1 + Σ_{k=1}^{c−1} P(X > k + ½) is the midpoint rule of
        1 + ∫_1^c P(X > t) dt, which this form is, so they differ by at most about pdf(mode)/12 =
        e^{σ²/2} / (12 · median · σ · √(2π)) tokens (`rounding_gap`): under 10⁻³ tokens for a median of 100.
        Not min(cap, the lognormal's mean), which overstates every capped mean (by 0.2-1.6% at p99/median = 10).
        """
        if self.file is not None:
            xs = [min(x, cap) for x in self.observed()]
            return sum(xs) / len(xs)
        if cap < 1:
            raise ValueError(f"cap {cap} must be ≥ 1 token")
        if self.sigma == 0:
            return float(min(max(round(self.median), 1), cap))
        mu, s = math.log(self.median), self.sigma
        full = math.exp(mu + s * s / 2)
        capped = full * _phi((math.log(cap) - mu - s * s) / s) + cap * _phi(-(math.log(cap) - mu) / s)
        below_one = _phi(-mu / s) - full * _phi((-mu - s * s) / s)
        return capped + below_one

    def rounding_gap(self) -> float:
        """How far, in tokens, `mean(cap)` may lie from the mean of the simulator's whole-token draw at most (about):
        the midpoint rule's error, pdf(mode)/12 (0 for a file or a fixed length, which `mean` counts exactly)."""
        if self.file is not None or self.sigma == 0:
            return 0.0
        s = self.sigma
        return math.exp(s * s / 2) / (12 * self.median * s * math.sqrt(2 * math.pi))


class Workload(_Model):
    """What one trainer step consumes: prompts_per_step prompts, group_size responses each (GRPO's n)."""

    prompts_per_step: int = Field(ge=1)
    """Prompts per trainer step."""
    group_size: int = Field(default=8, ge=1)
    """Responses sampled per prompt (GRPO's n); a step trains on prompts_per_step × group_size trajectories."""
    prompt_len: int | LengthDist = 512
    """Prompt tokens: a number, or a distribution like the response's."""
    response: LengthDist
    """Response lengths: {median, p99} or {file}."""
    max_len: int = Field(default=16384, ge=1)
    """Longest response (tokens); longer draws are cut here."""

    @field_validator("prompt_len")
    @classmethod
    def _positive(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("must be ≥ 1 token")
        return v

    @property
    def batch(self) -> int:
        return self.prompts_per_step * self.group_size

    def max_prompt(self) -> int:
        p = self.prompt_len
        if isinstance(p, int):
            return p
        if p.file is not None:
            return max(p.observed())
        return int(math.ceil(p.median * math.exp(p.sigma * 3.09)))  # p99.9


class Policy(_Model):
    """How generation and training overlap and how weights reach the rollouts."""

    kind: Literal["sync", "one-step-off", "stale", "partial-rollout", "trajectory-async"] = "trajectory-async"
    """sync: generate a batch, train, broadcast. one-step-off: generate batch k+1 while training batch k.
    stale: stream with bounded staleness; each weight sync drains every in-flight trajectory, then a
    global broadcast. partial-rollout: stream; a sync interrupts in-flight trajectories, broadcasts, and
    resumes them by re-prefill. trajectory-async (Laminar): stream; each rollout pulls new weights from
    its relay when its own trajectories are done, no global stall."""
    eta: int | None = Field(default=None, ge=1)
    """Staleness bound η (streaming policies): at most (η + version + 1)·batch trajectories admitted
    (AReaL's rule); default 1. Not allowed for sync / one-step-off (their staleness is 0 / 1)."""

    @model_validator(mode="after")
    def _eta_only_streaming(self) -> Policy:
        if self.eta is not None and self.kind not in STREAMING:
            fixed = 0 if self.kind == "sync" else 1
            raise ValueError(f"eta: policy {self.kind!r} has a fixed staleness of {fixed} and takes no staleness "
                             f"bound; remove eta, or use kind: stale (or partial-rollout, trajectory-async) with eta")
        return self

    @property
    def staleness_bound(self) -> int:
        return {"sync": 0, "one-step-off": 1}.get(self.kind, self.eta or 1)


class Repack(_Model):
    """Consolidation of long-tail trajectories (trajectory-async only) onto few rollouts."""

    method: Literal["none", "best-fit", "program"] = "none"
    """none; best-fit (Laminar's heuristic); program (the integer program, best-fit as warm start)."""
    kv_threshold: float = Field(default=0.9, gt=0, le=1)
    """Fraction of a worker's KV capacity a repack may fill (0 < threshold ≤ 1)."""
    batch_cap: int = Field(default=64, ge=1, le=4096)
    """Most trajectories a worker decodes together (also the admission cap); at most 4096 (vLLM's
    max_num_seqs is 256 by default: a decode step is priced at every batch size up to the cap)."""
    choose_cap: bool = False
    """true: the planner chooses batch_cap (at most the one given) by simulating candidates around the staleness
    rule's room per rollout, and plans and runs at it (rollout.admission); false: batch_cap as given."""
    interval_s: float = Field(default=2.0, gt=0)
    """Seconds between repack ticks (simulated time)."""
    decision_s: float = Field(default=0.05, ge=0)
    """Modelled latency of one repack decision charged to the moved trajectories (the simulator stays
    deterministic; the solver's measured wall time is reported beside it)."""


class WorkerGroup(_Model):
    """Rollout workers: a cluster group, each device one rollout at one weight bit-width."""

    group: str
    """A cluster.groups name."""
    bits: BitWidth = 16
    """Weight bit-width of the policy on these workers (2/3/4 GPTQ-style, 8, 16)."""
    batch_cap: int | None = Field(default=None, ge=1, le=4096)
    """Most trajectories one of these workers decodes together (and admits), at most rollout.repack.batch_cap;
    default: that cap. A slower kind held to a smaller batch leaves the rule's room to the quicker one
    (rollout.admission). The simulator applies it; the real run here has one kind of actor and keeps
    rollout.repack.batch_cap."""


class SolverSettings(_Model):
    backend: Literal["highs", "cbc", "scip", "cpsat"] = "highs"
    """Exact backend for the repack program."""
    time_limit_s: float = Field(default=0.05, gt=0)
    """Wall-clock bound of one repack decision; the best-fit start is kept if the solver finds nothing better."""


class RolloutSection(_Model):
    trainer: str
    """The cluster group that trains (bf16 forward + backward + optimizer)."""
    workers: list[WorkerGroup] = Field(min_length=1)
    """Rollout worker groups with their bit-widths."""
    model: TransformerConfig
    """The policy model: {preset: llama-2-7b} and/or shape fields."""
    workload: Workload
    policy: Policy = Field(default_factory=Policy)
    repack: Repack = Field(default_factory=Repack)
    solver: SolverSettings = Field(default_factory=SolverSettings)
    steps: int = Field(default=200, ge=1)
    """Trainer steps to simulate."""
    trainer_step_s: float | None = Field(default=None, gt=0)
    """Measured seconds per trainer step; default: 6·params·tokens over the trainer group's bf16 rate."""
    trainer_micro_batches: int = Field(default=1, ge=1)
    """Micro-batches the trainer computes a step over under the streaming policies (stale, partial-rollout,
    trajectory-async): forward and backward of each micro-batch as soon as its trajectories have finished, gradients
    accumulated, the optimizer step after the last (verl fully_async's streamed mini-batches). The gradient is the
    whole batch's; a step waits only for its last micro-batch once the batch is in. 1: a step starts once the whole
    batch has finished. The barrier policies (sync, one-step-off) train a round at once. At most the batch."""
    relay_link: str | Interconnect = "pcie4"
    """Link from a node's relay to its rollouts (pull); the cluster interconnect carries the broadcast."""
    memory_fraction: float = Field(default=0.9, gt=0, le=1)
    """Usable fraction of a rollout device's memory (vLLM's gpu_memory_utilization)."""
    runtime_overhead_gb: float = Field(default=1.9, ge=0)
    seed: int = 0

    @field_validator("relay_link")
    @classmethod
    def _known_link(cls, v):
        if isinstance(v, str) and v not in INTERCONNECTS:
            raise ValueError(f"unknown interconnect preset {v!r}; presets: {', '.join(INTERCONNECTS)}")
        return v

    @property
    def relay(self) -> Interconnect:
        if isinstance(self.relay_link, Interconnect):
            return self.relay_link
        bw, lat = INTERCONNECTS[self.relay_link]
        return Interconnect(bandwidth_gbs=bw, latency_us=lat)


class RolloutJob(_Model):
    """An RL rollout job: cluster, trainer, rollout workers, policy model, workload and policy."""

    kind: Literal["rollout"] = "rollout"
    name: str = "rollout"
    cluster: Cluster
    rollout: RolloutSection

    @property
    def rollout_devices(self) -> int:
        """Devices of the rollout worker groups: one rollout worker (a Ray actor in the real run) each."""
        groups = {w.group for w in self.rollout.workers}
        return sum(g.count for g in self.cluster.groups if g.name in groups)

    @model_validator(mode="after")
    def _groups_and_fit(self) -> RolloutJob:
        names = [g.name for g in self.cluster.groups]
        r = self.rollout
        if r.trainer not in names:
            raise ValueError(f"rollout.trainer: {r.trainer!r} is not a cluster group; groups: {names}")
        seen = set()
        for i, w in enumerate(r.workers):
            if w.group not in names:
                raise ValueError(f"rollout.workers.{i}.group: {w.group!r} is not a cluster group; groups: {names}")
            if w.group == r.trainer:
                raise ValueError(f"rollout.workers.{i}.group: {w.group!r} is the trainer group; rollouts run on "
                                 "other devices (disaggregated)")
            if w.group in seen:
                raise ValueError(f"rollout.workers.{i}.group: {w.group!r} is listed twice")
            if w.batch_cap is not None and w.batch_cap > r.repack.batch_cap:
                raise ValueError(f"rollout.workers.{i}.batch_cap: {w.batch_cap} is above rollout.repack.batch_cap "
                                 f"{r.repack.batch_cap}, the most any worker decodes together; lower it or raise "
                                 "that cap")
            seen.add(w.group)
        if r.policy.kind != "trajectory-async" and r.repack.method != "none":
            raise ValueError(f"rollout.repack.method: {r.repack.method!r} needs policy kind trajectory-async "
                             f"(repack frees rollouts to pull new weights); got policy {r.policy.kind!r}")
        if r.trainer_micro_batches > r.workload.batch:
            raise ValueError(f"rollout.trainer_micro_batches: {r.trainer_micro_batches} is more than the batch "
                             f"(rollout.workload.prompts_per_step x group_size = {r.workload.batch}); each micro-batch "
                             f"holds at least one trajectory: use at most {r.workload.batch}")
        drawn = (r.steps + (r.policy.eta or 1) + 2) * r.workload.batch
        if drawn > MAX_TRAJECTORIES:
            raise ValueError(f"(rollout.steps + rollout.policy.eta + 2) x rollout.workload.prompts_per_step x "
                             f"rollout.workload.group_size = {drawn:,} trajectories to simulate, more than "
                             f"{MAX_TRAJECTORIES:,}; lower one of them")
        if self.rollout_devices > MAX_ROLLOUT_DEVICES:
            counts = [f"cluster.groups.{i}.count" for i, g in enumerate(self.cluster.groups)
                      if g.name in {w.group for w in r.workers}]
            raise ValueError(f"{' + '.join(counts)} = {self.rollout_devices:,} rollout devices, more than the "
                             f"{MAX_ROLLOUT_DEVICES:,} a plan simulates (each is a worker of the event loop); lower it")
        ctx = self.rollout.workload.max_prompt() + r.workload.max_len
        if ctx > r.model.get("max_positions"):
            raise ValueError(f"rollout.workload.max_len: prompt + max_len = {ctx} exceeds the model's "
                             f"max_positions {r.model.get('max_positions')}; lower max_len or raise max_positions")
        # the fit check prices memory with the LLM cost model; import cost: that model, not needed to read a spec
        from qsync_opt.rollout.costs import worker_costs

        for i, w in enumerate(r.workers):
            c = worker_costs(self, w)
            if c.kv_capacity_tokens < ctx:
                raise ValueError(
                    f"rollout.workers.{i}.bits: the model at {w.bits} bits on {c.device} leaves KV room for "
                    f"{max(0, int(c.kv_capacity_tokens))} tokens, less than one trajectory of {ctx} "
                    f"(prompt + max_len); use fewer bits, a bigger device, or a smaller model")
        return self


def load_rollout_spec(source: str | Path | dict | RolloutJob) -> RolloutJob:
    """Parse and validate a rollout job from a path, a YAML string or a dict; SpecError names the field
    (the spec core's reader and validator, as every kind's loader uses)."""
    if isinstance(source, RolloutJob):
        return source
    data, text, origin = read_document(source)
    return validate(RolloutJob, data, text, origin)
