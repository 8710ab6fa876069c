"""The clipped surrogate and KL estimators on hand-computed numbers."""

import math

import pytest
import torch

from agentflow.train.losses import action_credit, clipped_surrogate_loss, kl_k1, kl_k2, kl_k3, row_weights

# Row 0: advantage +1, token ratios 1.5 and 0.5.
# Row 1: advantage -1, one token of ratio 1.5 (the second is padding).
OLD = torch.log(torch.tensor([[0.4, 0.4], [0.4, 0.4]]))
NEW = torch.log(torch.tensor([[0.6, 0.2], [0.6, 0.9]]))
MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0])


def loss(**kw):
    args = dict(logprobs=NEW, old_logprobs=OLD, advantages=ADV, mask=MASK, clip_low=0.2, clip_high=0.28,
                aggregation="token_mean")
    args.update(kw)
    return clipped_surrogate_loss(**args)


def test_token_mean_clips_high_for_positive_and_keeps_pessimistic_for_negative():
    # row 0: -min(1.5, 1.28) = -1.28 ; -min(0.5, 0.8) = -0.5 ; row 1: -min(-1.5, -1.28) = 1.5
    out = loss()
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 1.5) / 3, abs=1e-5)
    assert out.metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert out.metrics["tokens"] == 3


def test_seq_mean_token_mean_averages_rows_first():
    out = loss(aggregation="seq_mean_token_mean")
    assert out.loss.item() == pytest.approx(((-1.28 - 0.5) / 2 + 1.5) / 2, abs=1e-5)


def test_negative_advantage_clips_low():
    # ratio 0.5 with A = -1: -min(-0.5, -0.8) = 0.8
    out = clipped_surrogate_loss(logprobs=NEW[:1, 1:], old_logprobs=OLD[:1, 1:],
                                 advantages=torch.tensor([-1.0]), mask=MASK[:1, 1:], clip_low=0.2,
                                 clip_high=0.28, row_trajectory=torch.tensor([0]))
    assert out.loss.item() == pytest.approx(0.8, abs=1e-5)
    assert out.metrics["clip_fraction"] == 1.0


def test_kl_estimators_on_hand_numbers():
    p, q = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert kl_k1(p, q).item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_k2(p, q).item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)
    assert kl_k3(p, q).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert kl_k3(p, p).item() == 0.0


def test_kl_penalty_is_added_per_token():
    ref = NEW - math.log(2)  # ref = p / 2 at every token: k3 = 1/2 + log 2 - 1
    base = loss().loss.item()
    out = loss(ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3")
    assert out.loss.item() == pytest.approx(base + 0.1 * (math.log(2) - 0.5), abs=1e-5)
    assert out.metrics["kl_ref"] == pytest.approx(math.log(2) - 0.5, abs=1e-5)


def test_gradient_at_ratio_one_is_minus_advantage_over_tokens():
    logprobs = OLD.clone().requires_grad_(True)
    loss(logprobs=logprobs).loss.backward()
    assert logprobs.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3, 0.0], abs=1e-6)


def test_trajectory_turn_token_mean_is_the_papers_normalisation():
    """1/G sum_i 1/T_i sum_t 1/|a_it| sum_tokens: trajectory 0 has two turns (rows 0, 1), trajectory 1 one
    (row 2). Per-token loss is -A at ratio 1, so each row contributes -A_row."""
    logprobs = torch.zeros(3, 3)
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    advantages = torch.tensor([1.0, 1.0, -1.0])
    out = clipped_surrogate_loss(logprobs=logprobs, old_logprobs=logprobs, advantages=advantages, mask=mask,
                                 row_trajectory=torch.tensor([0, 0, 1]))
    assert out.loss.item() == pytest.approx((0.5 * (-1 - 1) + 1) / 2)
    weights = row_weights("trajectory_turn_token_mean", response_lengths=mask.sum(1),
                          row_trajectory=torch.tensor([0, 0, 1]))
    assert weights.tolist() == pytest.approx([1 / (2 * 2 * 3), 1 / (2 * 2 * 1), 1 / (2 * 1 * 2)])


def test_each_aggregation_weighs_a_trajectory_as_documented():
    """A long trajectory (3 turns of 4 tokens) against a short one (1 turn of 1 token), same advantage: the
    share of the long one in the loss is 1/2 (paper), 12/13 (token_mean), 3/4 (seq_mean_token_mean)."""
    lengths = torch.tensor([4, 4, 4, 1])
    trajectory = torch.tensor([0, 0, 0, 1])

    def share(aggregation):
        w = row_weights(aggregation, response_lengths=lengths, row_trajectory=trajectory) * lengths
        return (w[:3].sum() / w.sum()).item()

    assert share("trajectory_turn_token_mean") == pytest.approx(1 / 2)
    assert share("token_mean") == pytest.approx(12 / 13)
    assert share("seq_mean_token_mean") == pytest.approx(3 / 4)


def test_weights_count_every_trajectory_of_the_batch_not_only_the_rows_kept():
    """Regression: the normaliser was taken after rows with zero advantage were dropped, so a batch with one
    informative group out of B was scaled up B times. With the batch's trajectory count the kept row keeps
    the weight it has in the full batch."""
    lengths, trajectory = torch.tensor([2, 2, 2, 2]), torch.tensor([0, 1, 2, 3])
    full = row_weights("trajectory_turn_token_mean", response_lengths=lengths, row_trajectory=trajectory)
    kept = row_weights("trajectory_turn_token_mean", response_lengths=lengths[:1], row_trajectory=trajectory[:1],
                       row_group_size=torch.tensor([4]))
    assert kept.item() == pytest.approx(full[0].item()) == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="row_group_size"):
        row_weights("trajectory_turn_token_mean", response_lengths=lengths[:2], row_trajectory=trajectory[:2],
                    row_group_size=torch.tensor([0, 4]))


def test_after_exclusions_every_question_weighs_the_same_as_in_the_paper():
    """1/B sum_q 1/G_q sum_i ...: question q0 kept 3 of its trajectories (one excluded), q1 all 4; each
    trajectory of q0 weighs 1/(2*3), each of q1 1/(2*4), so both questions weigh 1/2 (not 3/7 and 4/7 as
    with one normaliser over all trajectories)."""
    lengths, trajectory = torch.ones(7), torch.arange(7)
    sizes = torch.tensor([3.0] * 3 + [4.0] * 4)
    weights = row_weights("trajectory_turn_token_mean", response_lengths=lengths, row_trajectory=trajectory,
                          row_group_size=sizes, groups=2)
    assert weights[:3].sum().item() == pytest.approx(0.5) and weights[3:].sum().item() == pytest.approx(0.5)
    assert weights[0].item() == pytest.approx(1 / 6) and weights[3].item() == pytest.approx(1 / 8)


@pytest.mark.parametrize("aggregation", ["trajectory_turn_token_mean", "token_mean", "seq_mean_token_mean"])
def test_micro_batches_sum_to_the_full_batch(aggregation):
    g = torch.Generator().manual_seed(0)
    new, old = -torch.rand(6, 5, generator=g), -torch.rand(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).int()
    mask[:, 0] = 1
    adv = torch.randn(6, generator=g)
    trajectory = torch.tensor([0, 0, 1, 2, 2, 2])
    kw = dict(clip_low=0.2, clip_high=0.3)
    full = clipped_surrogate_loss(logprobs=new, old_logprobs=old, advantages=adv, mask=mask,
                                  aggregation=aggregation, row_trajectory=trajectory, **kw).loss
    weights = row_weights(aggregation, response_lengths=mask.sum(1), row_trajectory=trajectory)
    parts = sum(clipped_surrogate_loss(logprobs=new[i:i + 2], old_logprobs=old[i:i + 2],
                                       advantages=adv[i:i + 2], mask=mask[i:i + 2], weights=weights[i:i + 2],
                                       **kw).loss
                for i in (0, 2, 4))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_entropy_metric_is_masked_mean():
    out = loss(entropy=torch.tensor([[1.0, 2.0], [3.0, 100.0]]))
    assert out.metrics["entropy"] == pytest.approx(2.0)


def test_validation():
    with pytest.raises(ValueError, match="advantages must be"):
        loss(advantages=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        loss(kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        loss(ref_logprobs=NEW, kl_estimator="k9")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        loss(aggregation="sum")


def test_action_credit_gives_the_action_its_share_and_keeps_the_rows_weight():
    # row 0: 6 response tokens (left-padded by one), forced, action, 3 free, forced; row 1: the action is its
    # only free token; row 2: no action
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    action = torch.zeros(3, 7, dtype=torch.bool)
    action[0, 2] = action[1, 5] = True
    free = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    credit = action_credit(mask, action, free, 0.5)
    # 0.5 x 6 on the action, the other 3 on the three free tokens, 0 on the forced ones
    assert credit[0].tolist() == pytest.approx([0, 0, 3.0, 1.0, 1.0, 1.0, 0])
    assert credit[1].tolist() == [0, 0, 0, 0, 0, 3.0, 0] and credit[2].tolist() == [1.0] * 7
    assert float((credit[0] * mask[0]).sum()) == pytest.approx(6.0)
    assert action_credit(mask, action, free, 1.0)[0].tolist() == pytest.approx([0, 0, 6.0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        action_credit(mask, action, free, 1.5)
