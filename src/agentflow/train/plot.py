"""`agentflow train plot DIR`: the curves of a run, from DIR/metrics.jsonl, as one PNG."""

from __future__ import annotations

from pathlib import Path

from agentflow.train.metrics import read_metrics

PANELS = [
    ("reward_mean", "rollout reward"),
    ("eval/accuracy_all", "held-out accuracy"),
    ("tool_choice_accuracy", "right tool (rollouts)"),
    ("no_signal_share", "groups without signal"),
    ("kl_ref", "KL to reference"),
    ("entropy", "entropy"),
    ("clip_fraction", "clip fraction"),
    ("grad_norm", "grad norm"),
    ("seconds/step", "seconds per step"),
]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    panels = [(key, title) for key, title in PANELS if any(key in r for r in records)]
    if not panels:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl has none of the plotted metrics")
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
        xs, ys = zip(*points, strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o" if len(points) < 30 else None)
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
