"""What verl must know about agentflow in every process: our agent loop and our advantage estimator.

verl imports this module on `import verl` when it is named in `VERL_USE_EXTERNAL_MODULES` (the launcher
sets it for every Ray worker) or declared as a `verl.plugins` entry point of the package.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

import agentflow.verl.agent_loop  # noqa: F401  (registers the "agentflow" agent loop)
from agentflow.train.advantages import get_advantage
from agentflow.verl.config import ESTIMATORS, VERL_GRPO_EPS

TURN_ROWS_ESTIMATOR = ESTIMATORS["grpo_turn_rows"]["algorithm.adv_estimator"]


@register_adv_est(TURN_ROWS_ESTIMATOR)
def grpo_turn_rows_for_verl(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                            index: np.ndarray, config: Any = None, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The original code's credit assignment, computed by our registry's `grpo_turn_rows`.

    verl calls this with every row of the batch and the question uid of each. Each trajectory's reward is on
    all its rows; the registry function normalises over the trainable rows of each question. Rows with no
    trainable token (our placeholders, verl's batch padding) take no part and get advantage 0.
    """
    rewards = token_level_rewards.sum(dim=-1)
    trainable = (response_mask.sum(dim=-1) > 0).nonzero().flatten()
    advantages = torch.zeros_like(rewards)
    if trainable.numel():
        rows = trainable.tolist()
        advantages[trainable] = get_advantage("grpo_turn_rows")(
            rewards=rewards[trainable].float(), group_ids=[str(index[i]) for i in rows],
            trajectory_ids=[f"row{i}" for i in rows], row_trajectory=torch.arange(len(rows)),
            eps=VERL_GRPO_EPS).to(rewards.dtype)
    scores = advantages.unsqueeze(-1) * response_mask
    return scores, scores
