"""`agentflow train plot DIR`: the curves of a run, from DIR/metrics.jsonl, as one PNG."""

from __future__ import annotations

import re
from pathlib import Path

from agentflow.train.metrics import read_metrics

_TURN_TOOL = re.compile(r"tool/turn(\d+)/")
_TURN_POSITION = re.compile(r"menu_position/turn(\d+)/")

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


ROLE_METRICS = {"kl_ref", "entropy", "clip_fraction", "grad_norm", "rows"}
"""Metrics each trained role has of its own (`ROLE/entropy`, ...; the planner's unprefixed): one line per role."""
OTHER_ROLES = ("executor", "verifier", "generator")


def roles_of(records: list[dict]) -> list[str]:
    """The trained roles other than the planner that a run logged metrics for."""
    return [role for role in OTHER_ROLES if any(k.startswith(f"{role}/") for r in records for k in r)]


def panels_of(records: list[dict]) -> list[tuple[str, str]]:
    """(metric, title) of each panel with data; a metric ending in "/" is a family drawn as one line each (the
    tool picked at each planner turn)."""
    roles = roles_of(records)
    panels = [(key, title) for key, title in PANELS
              if any(key in r or (key in ROLE_METRICS and any(f"{role}/{key}" in r for role in roles))
                     for r in records)]
    if roles:
        panels.insert(1, ("rows", "training rows per role"))
    turns = sorted({int(m.group(1)) for r in records for k in r if (m := _TURN_TOOL.match(k))})
    listed = sorted({int(m.group(1)) for r in records for k in r if (m := _TURN_POSITION.match(k))})
    return panels + [(f"tool/turn{turn}/", f"tool picked at turn {turn} (rollouts)") for turn in turns] \
        + [(f"menu_position/turn{turn}/", f"menu position of the tool picked at turn {turn}") for turn in listed]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    roles = roles_of(records)
    panels = panels_of(records)
    if not panels:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl has none of the plotted metrics")
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        # a key ending in "/" is a family: one line per member, absent steps count as 0 (not picked)
        # a per-role metric: one line per trained role (the planner's key is unprefixed)
        per_role = key in ROLE_METRICS and bool(roles)
        members = sorted({k for r in records for k in r if k.startswith(key)}) if key.endswith("/") else \
            [key, *(f"{role}/{key}" for role in roles)] if per_role else [key]
        for member in members:
            steps = [r for r in records if any(k.startswith(key) for k in r)] if key.endswith("/") else \
                [r for r in records if isinstance(r.get(member), int | float)]
            xs, ys = [r["step"] for r in steps], [r.get(member, 0.0) for r in steps]
            label = ("planner" if member == key else member.split("/")[0]) if per_role else member.removeprefix(key)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=label)
        if key.endswith("/") or per_role:
            ax.legend(fontsize=7)
        if key.endswith("/"):
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
