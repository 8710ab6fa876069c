"""`agentflow train plot DIR`: the curves of a run, from DIR/metrics.jsonl, as one PNG."""

from __future__ import annotations

import re
from pathlib import Path

from agentflow.train.metrics import read_metrics

_TURN_TOOL = re.compile(r"tool/turn(\d+)/")

PANELS = [
    ("reward_mean", "rollout reward"),
    ("eval/accuracy_all", "held-out accuracy"),
    ("tool_choice_accuracy", "right tool (rollouts)"),
    ("no_signal_share", "groups without signal"),
    ("excluded_share", "trajectories excluded (infrastructure)"),
    ("kl_ref", "KL to reference"),
    ("entropy", "entropy"),
    ("clip_fraction", "clip fraction"),
    ("grad_norm", "grad norm"),
    ("seconds/step", "seconds per step"),
]


def panels_of(records: list[dict]) -> list[tuple[str, str]]:
    """(metric, title) of each panel with data; a metric ending in "/" is a family drawn as one line each (the
    tool picked at each planner turn)."""
    panels = [(key, title) for key, title in PANELS if any(key in r for r in records)]
    turns = sorted({int(m.group(1)) for r in records for k in r if (m := _TURN_TOOL.match(k))})
    return panels + [(f"tool/turn{turn}/", f"tool picked at turn {turn} (rollouts)") for turn in turns]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    panels = panels_of(records)
    if not panels:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl has none of the plotted metrics")
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        # a key ending in "/" is a family: one line per member, absent steps count as 0 (not picked)
        members = sorted({k for r in records for k in r if k.startswith(key)}) if key.endswith("/") else [key]
        for member in members:
            steps = [r for r in records if any(k.startswith(key) for k in r)] if key.endswith("/") else \
                [r for r in records if isinstance(r.get(member), int | float)]
            xs, ys = [r["step"] for r in steps], [r.get(member, 0.0) for r in steps]
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=member.removeprefix(key))
        if key.endswith("/"):
            ax.legend(fontsize=7)
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = out or run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
