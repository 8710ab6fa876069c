"""Advantage estimators on hand-computed numbers.

Batch: question q1 has trajectory a (reward 1, 2 turns) and b (reward 0, 1 turn); q2 has c (1, 1 turn) and
d (1, 3 turns) — all equal, so no signal. Rows in order: a a b c d d d.
"""

import math

import pytest
import torch

from agentflow.train.advantages import ADVANTAGE_ESTIMATORS, get_advantage, no_signal_groups

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
GROUPS = ["q1", "q1", "q2", "q2"]
TRAJS = ["a", "b", "c", "d"]
ROWS = torch.tensor([0, 0, 1, 2, 3, 3, 3])


def run(name: str, rewards=REWARDS, groups=GROUPS, trajs=TRAJS, rows=ROWS) -> list[float]:
    return get_advantage(name)(rewards=rewards, group_ids=groups, trajectory_ids=trajs, row_trajectory=rows,
                               eps=0.0).tolist()


def test_registry_has_the_four_estimators():
    assert {"grpo_trajectory", "grpo_turn_rows", "no_std", "batch_trajectory"} <= set(ADVANTAGE_ESTIMATORS)


def test_grpo_trajectory_normalises_over_trajectories_and_copies_to_turns():
    # q1: mean 0.5, Bessel std sqrt(0.5) -> +-0.5 / 0.70711 = +-0.70711
    s = 0.5 / math.sqrt(0.5)
    assert run("grpo_trajectory") == pytest.approx([s, s, -s, 0, 0, 0, 0], abs=1e-6)


def test_grpo_turn_rows_normalises_over_turn_rows():
    # q1 rows [1, 1, 0]: mean 2/3, Bessel std sqrt((1/9 + 1/9 + 4/9) / 2) = 0.57735
    std = math.sqrt((2 / 3) / 2)
    expected = [(1 / 3) / std, (1 / 3) / std, (-2 / 3) / std, 0, 0, 0, 0]
    assert run("grpo_turn_rows") == pytest.approx(expected, abs=1e-6)
    assert expected[0] == pytest.approx(0.57735, abs=1e-5)


def test_no_std_subtracts_the_group_mean_only():
    assert run("no_std") == pytest.approx([0.5, 0.5, -0.5, 0, 0, 0, 0], abs=1e-6)


def test_batch_trajectory_normalises_over_the_batch_so_a_silent_group_keeps_its_signal():
    # all four trajectories: mean 0.75, Bessel std sqrt((3 x 0.0625 + 0.5625) / 3) = 0.5; q2 (both right) is
    # silent under the group estimators but sits above the batch's mean here
    assert run("batch_trajectory") == pytest.approx([0.5, 0.5, -1.5, 0.5, 0.5, 0.5, 0.5], abs=1e-6)
    assert run("grpo_trajectory")[3:] == [0, 0, 0, 0]
    # a group that got everything wrong, beside one that got everything right: pushed down, not ignored
    both = run("batch_trajectory", torch.tensor([0.0, 0.0, 1.0, 1.0]), rows=torch.arange(4))
    assert both == pytest.approx([-0.866025, -0.866025, 0.866025, 0.866025], abs=1e-6)
    assert sum(both) == pytest.approx(0.0, abs=1e-6)


def test_batch_trajectory_is_zero_when_every_trajectory_got_the_same_reward():
    assert run("batch_trajectory", torch.tensor([1.0, 1.0, 1.0, 1.0])) == [0.0] * 7


def test_eps_enters_the_denominator():
    out = get_advantage("grpo_trajectory")(rewards=REWARDS, group_ids=GROUPS, trajectory_ids=TRAJS,
                                           row_trajectory=ROWS, eps=0.5)
    assert out[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.5), abs=1e-6)


@pytest.mark.parametrize("name", ["grpo_trajectory", "grpo_turn_rows", "no_std", "batch_trajectory"])
def test_group_of_one_has_zero_advantage(name):
    assert run(name, torch.tensor([1.0]), ["q"], ["t"], torch.tensor([0, 0])) == [0.0, 0.0]


def test_non_finite_reward_names_the_trajectory_and_question():
    with pytest.raises(ValueError, match=r"trajectory 'b' \(question 'q1'\)"):
        run("grpo_trajectory", torch.tensor([1.0, float("nan"), 1.0, 1.0]))


def test_duplicate_trajectory_id_is_named():
    with pytest.raises(ValueError, match="'a' appears more than once"):
        run("no_std", trajs=["a", "a", "c", "d"])


def test_row_index_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="outside 0..3"):
        run("grpo_turn_rows", rows=torch.tensor([0, 4]))


def test_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="4 rewards but 3 group ids"):
        run("grpo_trajectory", groups=["q1", "q1", "q2"])


def test_unknown_estimator_lists_known_ones():
    with pytest.raises(ValueError, match="grpo_trajectory"):
        get_advantage("nope")


def test_no_signal_groups_counts_groups_with_equal_rewards():
    assert no_signal_groups(REWARDS, GROUPS) == 1
    assert no_signal_groups(torch.tensor([0.0, 0.0, 0.0]), ["x", "x", "y"]) == 2
