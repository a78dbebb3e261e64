"""The pictures of `qsync-opt run`'s report: the precision strip and the training curves.

precision_strip: one row per group in spec order (top to bottom), one cell per selectable
operator in network order, coloured by precision. Up to FQN_AXIS_MAX operators the x axis names
each by its FQN; beyond that it is the operator's depth, with the model's blocks (the FQN's
leading names) marked and labelled. A plan that lowers nothing says so in its title and on the
strip's title. curves: the training loss (left axis, from 0) and the test accuracy (right axis, 0-100%),
with a title, visible markers and one legend below the data.
"""

from __future__ import annotations

from pathlib import Path

from qsync_opt.training.plan import Plan
from qsync_opt.precision import PRECISIONS

COLOURS = {"fp32": "#1f4e79", "tf32": "#2e75b6", "bf16": "#70ad47", "fp16": "#a9d18e", "fp8_e4m3": "#ffc000",
           "fp8_e5m2": "#ffd966", "int8": "#ed7d31", "int4": "#c00000"}
FQN_AXIS_MAX = 64
"""Most operators whose FQNs fit on the strip's axis; larger models get depth and blocks."""


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _runs(fqns: list[str], depth: int) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    for i, f in enumerate(fqns):
        head = ".".join(f.split(".")[:depth])
        if out and out[-1][0] == head:
            out[-1] = (head, out[-1][1], i + 1)
        else:
            out.append((head, i, i + 1))
    return out


def _blocks(fqns: list[str], most: int = 40) -> list[tuple[str, int, int]]:
    """(name, first index, end index) of runs of operators sharing their leading FQN names, at the
    shallowest depth where no block holds more than a quarter of the model (e.g. 'layer3',
    'bert.encoder.layer.7'), with at most `most` blocks."""
    best = _runs(fqns, 1)
    for depth in range(1, 7):
        runs = _runs(fqns, depth)
        if len(runs) > most:
            break
        best = runs
        if max(b - a for _, a, b in runs) <= max(8, len(fqns) // 4):
            break
    return best


def precision_strip(plan: Plan, path: Path, spec_order: list[str] | None = None) -> Path:
    """The plan's precision per operator and group (module docstring); `spec_order` lists the
    groups as the spec does (default: the plan's order, which is the spec's)."""
    plt = _plt()
    groups = [g for g in (spec_order or list(plan.groups)) if g in plan.groups]
    fqns = list(dict.fromkeys(f for g in groups for f in plan.groups[g].precisions))
    n = max(1, len(fqns))
    named = len(fqns) <= FQN_AXIS_MAX
    used = [p for p in PRECISIONS if any(p in plan.groups[g].precisions.values() for g in groups)]
    highest = used[0] if used else "fp32"
    lowered = {g: sum(p != "fp32" for p in plan.groups[g].precisions.values()) for g in groups}
    blocks = [] if named else _blocks(fqns)
    longest = max((len(x) for x in (fqns if named else [b[0] for b in blocks])), default=4)
    width = min(24.0, max(7.0, 0.22 * n + 2.5)) if named else 12.0
    height = 0.45 * len(groups) + 1.4 + 0.075 * longest
    fig, ax = plt.subplots(figsize=(width, height))
    for row, name in enumerate(groups):
        precisions = plan.groups[name].precisions
        for col, f in enumerate(fqns):
            if f in precisions:
                ax.add_patch(plt.Rectangle((col, row + 0.05), 1, 0.9, color=COLOURS[precisions[f]], lw=0))
    ax.set_xlim(0, n)
    ax.set_ylim(len(groups), 0)  # first group of the spec on top
    ax.set_yticks([r + 0.5 for r in range(len(groups))],
                  [f"{g} ({plan.groups[g].device}): {lowered[g]} lowered" for g in groups])
    if named:
        ax.set_xticks([i + 0.5 for i in range(len(fqns))], fqns, rotation=90, fontsize=7)
        ax.set_xlabel("selectable operators (FQN), input to output")
    else:
        for _, a, _b in blocks[1:]:
            ax.axvline(a, color="white", lw=1.2)
        ax.set_xticks([(a + b) / 2 for _, a, b in blocks], [name for name, _, _ in blocks], rotation=90, fontsize=7)
        ax.set_xlabel(f"operator depth, input to output ({len(fqns)} operators; ticks name the blocks)")
    total = sum(lowered.values())
    title = f"{plan.job}: precision per operator and group ({plan.model})"
    if total == 0:
        summary = f"nothing lowered: every operator runs at {highest} in every group"
    else:
        summary = "lowered: " + ", ".join(f"{g} {lowered[g]} of {len(plan.groups[g].precisions)}" for g in groups)
    title += "\n" + summary
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[p]) for p in used], labels=used,
              loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False, fontsize=8, title="precision",
              title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves(steps: list[dict], evals: list[dict], path: Path, title: str = "training") -> Path:
    """Training loss per step and test loss/accuracy per evaluation (module docstring)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    few = len(steps) <= 30
    handles = ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], "-", marker="." if few else None,
                      label="train loss (global batch)", color="#2e75b6")
    losses = [r["loss"] for r in steps] + [e["test_loss"] for e in evals]
    if evals:
        handles += ax.plot([e["step"] for e in evals], [e["test_loss"] for e in evals], "o-", ms=7,
                           label="test loss", color="#ed7d31", zorder=3)
        ax2 = ax.twinx()
        handles += ax2.plot([e["step"] for e in evals], [100 * e["test_accuracy"] for e in evals], "s--", ms=7,
                            color="#548235", label="test accuracy % (right axis)", zorder=3)
        ax2.set_ylim(0, 100)
        ax2.set_ylabel("test accuracy %")
        last = evals[-1]
        ax2.annotate(f"{100 * last['test_accuracy']:.1f}%", (last["step"], 100 * last["test_accuracy"]),
                     textcoords="offset points", xytext=(-6, 8), ha="right", fontsize=8, color="#548235")
    ax.set_ylim(0, 1.1 * max(losses, default=1.0))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(handles=handles, labels=[h.get_label() for h in handles], loc="upper center",
              bbox_to_anchor=(0.5, -0.16), ncol=len(handles), frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
