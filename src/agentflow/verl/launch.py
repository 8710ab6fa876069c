"""`agentflow train --backend verl`: build verl's configuration from ours, print it, or run verl's trainer.

    from agentflow.verl.launch import print_config, launch
    print_config("train_verl.yaml")     # no GPU needed; the full verl config when verl is installed
    launch("train_verl.yaml")           # verl's PPO trainer (v1) with our flow as the agent loop

The verl config is verl's own `ppo_trainer` (from the installed package), then `verl.overrides` from our
file, then every mapped setting (`agentflow.verl.config.verl_overrides`), then our whole config under the
key `agentflow`, which travels to every agent-loop worker with the rest of the config.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

from agentflow.errors import ConfigError
from agentflow.train.data import BatchSampler, held_out_questions, training_questions
from agentflow.verl.config import PLUGIN_MODULE, VerlTrainConfig, agentflow_section, verl_overrides

log = logging.getLogger(__name__)


def load_config(path: str | Path | None, **overrides: Any) -> VerlTrainConfig:
    """Our config file (the training format plus `verl:`); raises ConfigError naming what is wrong."""
    if path is None:
        return VerlTrainConfig.from_dict({k: v for k, v in overrides.items() if v is not None})
    return VerlTrainConfig.from_yaml(path, **overrides)


def data_files(cfg: VerlTrainConfig) -> tuple[Path, Path]:
    """Where the launcher writes verl's parquet copies of the training and held-out questions."""
    data_dir = Path(cfg.output_dir).absolute() / "data"
    return data_dir / "train.parquet", data_dir / "heldout.parquet"


def prepare_data(cfg: VerlTrainConfig) -> tuple[Path, Path]:
    """Convert our question files into verl's parquet layout (the same files `agentflow train` reads)."""
    from agentflow.verl.data import write_parquet

    train = training_questions(cfg.data)
    held_out = held_out_questions(cfg.data)
    BatchSampler(train, batch_size=cfg.batch_size, seed=cfg.seed)  # raises when batch_size exceeds the data
    train_file, eval_file = data_files(cfg)
    return write_parquet(train, train_file), write_parquet(held_out, eval_file)


def _verl_config_dir() -> Path:
    try:
        import verl
    except ImportError:
        raise ConfigError("the verl backend needs verl: pip install 'agentflow[verl]' (see docs/verl.md)") from None
    return Path(verl.__file__).parent / "trainer" / "config"


def build_verl_config(cfg: VerlTrainConfig, *, train_file: Path, eval_file: Path, resume: bool = False) -> Any:
    """verl's full configuration (an OmegaConf DictConfig) for our config. Needs verl installed."""
    config_dir = _verl_config_dir()
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=list(cfg.verl.overrides))
    except Exception as err:  # Hydra's override grammar and unknown keys
        raise ConfigError(f"verl.overrides: {err}") from None
    with open_dict(config):
        mapped = verl_overrides(cfg, train_files=str(train_file), val_files=str(eval_file), resume=resume)
        for key, value in mapped.items():
            OmegaConf.update(config, key, value, merge=False, force_add=True)
        config.agentflow = agentflow_section(cfg)
    return config


def render_config(path: str | Path | None, *, resume: bool = False, **overrides: Any) -> str:
    """The configuration a run would use, as YAML: verl's full config when verl is installed, otherwise
    the settings we map (verl's own defaults fill in the rest at launch)."""
    cfg = load_config(path, **overrides)
    train_file, eval_file = data_files(cfg)
    try:
        config = build_verl_config(cfg, train_file=train_file, eval_file=eval_file, resume=resume)
    except ConfigError as err:
        if "needs verl" not in str(err):
            raise
        mapped = verl_overrides(cfg, train_files=str(train_file), val_files=str(eval_file), resume=resume)
        return ("# verl is not installed: these are the settings agentflow maps onto verl's ppo_trainer config;\n"
                "# install the extra (pip install 'agentflow[verl]') to print verl's full configuration.\n"
                + yaml.safe_dump(_nest(mapped), sort_keys=False)
                + yaml.safe_dump({"agentflow": agentflow_section(cfg)}, sort_keys=False))
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(config)


def print_config(path: str | Path | None, *, console: Any = None, resume: bool = False, **overrides: Any) -> str:
    """Print `render_config(path)` (with rich when a console is given) and return the text."""
    text = render_config(path, resume=resume, **overrides)
    if console is not None:
        from rich.syntax import Syntax

        console.print(Syntax(text, "yaml", word_wrap=True))
    else:
        import sys

        sys.stdout.write(text)
    return text


def launch(path: str | Path | None, *, resume: bool = False, **overrides: Any) -> None:
    """Write the data files and run verl's PPO trainer (v1) with our agent loop; blocks until it ends.

    Connects to a running Ray cluster when RAY_ADDRESS is set (multi-node), else starts a local one.
    `resume` continues from the newest checkpoint under the run directory.
    """
    cfg = load_config(path, **overrides)
    train_file, eval_file = prepare_data(cfg)
    config = build_verl_config(cfg, train_file=train_file, eval_file=eval_file, resume=resume)
    out = Path(cfg.output_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    from omegaconf import OmegaConf

    (out / "verl_config.yaml").write_text(OmegaConf.to_yaml(config))
    os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", PLUGIN_MODULE)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    import agentflow.verl.plugin  # noqa: F401  (our estimator and agent loop in the driver too)

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    log.info("launching verl: %d node(s) x %d GPU(s), config written to %s", cfg.verl.nnodes,
             cfg.verl.n_gpus_per_node, out / "verl_config.yaml")
    run_ppo(config, task_runner_class=TaskRunnerV1)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1} -> {'a': {'b': 1}} for printing."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
