"""`agentflow train --help` documents the config; `agentflow train plot DIR` writes a PNG."""

import json

import typer
from typer.testing import CliRunner

from agentflow.train.cli import train_app

app = typer.Typer()
app.add_typer(train_app, name="train")


@app.command()
def other() -> None:  # a second command, so that `train` is a subcommand as in the real CLI
    pass


runner = CliRunner()


def test_help_lists_the_options_and_config_fields():
    result = runner.invoke(app, ["train", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for text in ("--config", "--max-steps", "--resume", "--algorithm", "plot", "group_size", "clip_high",
                 "kl_estimator", "lora.rank"):
        assert text in result.output


def test_plot_writes_curves(tmp_path):
    rows = [{"step": s, "reward_mean": s / 10, "kl_ref": 0.01 * s, "seconds/step": 3.0} for s in range(1, 5)]
    rows.append({"step": 4, "eval/accuracy_all": 0.3})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["train", "plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_of_a_directory_without_metrics_fails_cleanly(tmp_path):
    result = runner.invoke(app, ["train", "plot", str(tmp_path)])
    assert result.exit_code == 2
    assert "no metrics.jsonl" in result.output


def test_bad_config_is_reported_not_raised(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("group_size: 1\n")
    result = runner.invoke(app, ["train", "--config", str(path)])
    assert result.exit_code == 2
    assert "group_size" in result.output


def test_help_gives_one_default_for_data():
    """Regression (issue 19): `data` said "default: the shipped tool_use task" while data.task defaults to
    lookup_compute."""
    result = runner.invoke(app, ["train", "--help"], terminal_width=300)
    text = " ".join(result.output.split())
    assert "tool_use task" not in text and "default: lookup_compute" in text


def test_unknown_config_key_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("eval_sise: 3\nlora:\n  rnk: 4\n")
    result = runner.invoke(app, ["train", "--config", str(path)])
    text = " ".join(result.output.split())                             # rich wraps the one line at 80 columns
    assert result.exit_code == 2 and text.count("error:") == 1, result.output
    assert "unknown key eval_sise (did you mean eval_size?)" in text and "validation error" not in text
    assert "unknown key lora.rnk (did you mean lora.rank?)" in text and "https://" not in text


def test_eval_size_is_a_flag_and_refused_where_it_would_be_ignored(tmp_path):
    result = runner.invoke(app, ["train", "--help"], terminal_width=200)
    assert "--eval-size" in result.output
    path = tmp_path / "c.yaml"
    path.write_text("eval_size: 0\n")
    result = runner.invoke(app, ["train", "--config", str(path), "--eval-size", "3", "--max-steps", "0",
                                 "--algorithm", "bogus"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "algorithm:" in text and "greater than or equal" not in text  # flag won
    result = runner.invoke(app, ["train", "--backend", "verl", "--eval-size", "3"])
    assert result.exit_code == 2 and "--eval-size goes with --backend local" in result.output


def test_seed_is_a_flag_and_refused_where_it_would_be_ignored(monkeypatch):
    import agentflow.train.trainer as trainer_module

    seen = []

    class Recording:
        def __init__(self, cfg, **kwargs):
            seen.append(cfg)

        def run(self, resume=False):
            return {}

    monkeypatch.setattr(trainer_module, "Trainer", Recording)
    result = runner.invoke(app, ["train", "--config", "src/agentflow/configs/train_mixed.yaml", "--seed", "7"])
    assert result.exit_code == 0, result.output
    assert seen[0].seed == 7
    result = runner.invoke(app, ["train", "--backend", "verl", "--seed", "3"])
    assert result.exit_code == 2 and "--seed goes with --backend local" in result.output
