"""The Flow-GRPO update on a tiny random model: masked log-probs (forced tokens carry no gradient, a fresh
sample has ratio 1), several updates per batch (the clip acts on the later ones), the paper's weights."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import replace

import pytest
import torch

from agentflow.config import TransformersEngineConfig
from agentflow.engines.base import SamplingParams
from agentflow.engines.hf import TransformersEngine
from agentflow.planner import planner_schema
from agentflow.train.config import TrainConfig
from agentflow.train.logprobs import (
    SharedPrefix,
    action_choices,
    action_index,
    action_positions,
    action_tokens,
    pack_rows,
    plain_lm_head,
    response_logprobs,
)
from agentflow.train.losses import kl_k3
from agentflow.train.rollout import TurnRow
from agentflow.train.update import PolicyUpdater, UpdateBatch, bonus_probes, mini_batch_groups
from tests.engines.test_constrained import SCHEMA, byte_tokenizer
from tests.engines.test_hf import ask, tiny_model


@pytest.fixture
def engine() -> TransformersEngine:
    torch.set_num_threads(1)
    tokenizer = byte_tokenizer()
    return TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=16, seed=0),
                              model=tiny_model(tokenizer), tokenizer=tokenizer)


TOOL_LAST = {**SCHEMA, "properties": {"sub_goal": SCHEMA["properties"]["sub_goal"],
                                      "tool_name": SCHEMA["properties"]["tool_name"]},
             "required": ["sub_goal", "tool_name"]}
"""SCHEMA with the tool named last, as `planner_schema(..., tool_last=True)` orders a planner's reply."""


def sample_rows(engine: TransformersEngine, n: int, *, temperature: float = 1.0,
                schema: dict = SCHEMA, max_tokens: int = 40, questions: list[str] | None = None) -> list[TurnRow]:
    """`n` replies, one to each of `questions` (default: n different ones)."""
    questions = questions or [f"question {i}" for i in range(n)]

    async def run():
        sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        return await asyncio.gather(*(engine.generate(ask(q), sampling, json_schema=schema) for q in questions))

    replies = asyncio.run(run())
    return [TurnRow(i, r.prompt_token_ids, r.token_ids, r.logprobs, schema=schema) for i, r in enumerate(replies)]


def updater(engine: TransformersEngine, ref_model: torch.nn.Module | None = None, **overrides) -> PolicyUpdater:
    model = engine.model.requires_grad_(True)
    config = TrainConfig.from_dict({"kl_coef": 0.0, "micro_batch_rows": 4, **overrides})
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)
    return PolicyUpdater(config, model=model, optimizer=optimizer, policy=engine,
                         pad_id=engine.tokenizer.pad_token_id, ref_model=ref_model, chunked_head=plain_lm_head(model))


def perturbed(model: torch.nn.Module, scale: float = 0.05) -> torch.nn.Module:
    """A frozen copy of `model` with noise on every weight: a KL reference the policy is not at."""
    ref = copy.deepcopy(model).requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for weight in ref.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator) * scale)
    return ref


def replayed(engine: TransformersEngine, update: PolicyUpdater, rows: list[TurnRow]):
    """`rows` packed with the grammar masks their sampling applied (replayed by `update`)."""
    update.replay_masks(rows)
    return pack_rows(rows, pad_id=engine.tokenizer.pad_token_id, allowed=[r.allowed for r in rows],
                     vocab_size=update.vocab_size)


@pytest.mark.parametrize("chunked", [True, False])
def test_fresh_sample_has_ratio_one_and_forced_tokens_no_gradient(engine: TransformersEngine, chunked: bool) -> None:
    """Regression: log-probs of the unmasked model were trained, so grammar-forced tokens (about half of a
    planner reply) moved probability as if the model had chosen them."""
    rows = sample_rows(engine, 3)
    packed = replayed(engine, updater(engine), rows)
    logprobs, _, _ = response_logprobs(engine.model, packed, temperature=1.0, chunked_head=chunked)
    mask = packed.response_mask.bool()
    assert torch.allclose(logprobs[mask], packed.old_logprobs[mask], atol=1e-5)  # ratio exp(0) = 1
    forced = mask & (packed.allowed.sum(-1) == 1)
    assert forced.sum() > 10 and (mask & ~forced).sum() > 0
    assert (logprobs[forced] == 0).all()
    engine.model.zero_grad()
    logprobs[forced].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in engine.model.parameters())


def test_chunked_head_matches_the_models_own_forward_in_value_and_gradient(engine: TransformersEngine) -> None:
    rows = sample_rows(engine, 5)
    packed = replayed(engine, updater(engine), rows)
    weight = engine.model.model.layers[0].mlp.up_proj.weight
    results = []
    for chunked in (False, True):
        engine.model.zero_grad()
        logprobs, entropy, _ = response_logprobs(engine.model, packed, temperature=0.7, with_entropy=True,
                                              chunked_head=chunked)
        (logprobs * torch.linspace(-1, 1, logprobs.shape[1])).sum().backward()
        results.append((logprobs.detach(), entropy, weight.grad.clone()))
    (a, ea, ga), (b, eb, gb) = results
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(ea, eb, atol=1e-4) and torch.allclose(ga, gb, atol=1e-5)


def test_clip_engages_on_the_updates_after_the_first(engine: TransformersEngine) -> None:
    """Regression: one optimiser step per rollout batch meant the ratio was always 1 and the clip never acted.
    Two mini-batches x three epochs: six steps, the first at ratio 1, later ones clipped."""
    rows = sample_rows(engine, 8)  # one trajectory per row; question q0 holds rows 0-3, q1 rows 4-7
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0] * 4),
                        row_group=["q0"] * 4 + ["q1"] * 4, trajectories={"q0": 4, "q1": 4})
    update = updater(engine, learning_rate=0.5, ppo_epochs=3, ppo_mini_batch_size=1, max_grad_norm=100.0)
    metrics = update.grpo(batch, temperature=1.0, step=1)
    assert metrics["optimizer_steps"] == 6
    assert metrics["clip_fraction_last_epoch"] > 0  # (forced tokens never move: their ratio stays 1)
    one_step = updater(engine, learning_rate=0.5).grpo(
        UpdateBatch(rows=sample_rows(engine, 4), advantages=torch.tensor([1.0, -1.0, 1.0, -1.0]),
                    row_group=["q0"] * 4, trajectories={"q0": 4}), temperature=1.0, step=1)
    assert one_step["optimizer_steps"] == 1 and one_step["clip_fraction"] == 0.0


def test_mini_batches_hold_whole_questions_in_a_seeded_order() -> None:
    groups = [f"q{i}" for i in range(5)]
    split = mini_batch_groups(groups, 2, seed="0/1/0")
    assert sorted(g for chunk in split for g in chunk) == groups and [len(c) for c in split] == [2, 2, 1]
    assert split == mini_batch_groups(groups, 2, seed="0/1/0")
    (whole,) = mini_batch_groups(groups, None, seed="x")
    assert sorted(whole) == groups


def test_a_step_whose_rollouts_were_all_excluded_updates_nothing(engine: TransformersEngine) -> None:
    assert mini_batch_groups([], 2, seed="s") == [] and mini_batch_groups([], None, seed="s") == []
    metrics = updater(engine).grpo(UpdateBatch(rows=[], advantages=torch.tensor([]), row_group=[], trajectories={}),
                                   temperature=1.0, step=1)
    assert metrics["optimizer_steps"] == 0 and metrics["rows"] == 0


@pytest.mark.parametrize("mini_batch", [1, None])
def test_kl_to_the_reference_with_mini_batches_of_unequal_rows(engine: TransformersEngine, mini_batch) -> None:
    """Regression: reference log-probs were padded per micro-batch of the whole batch and stacked under the
    mini-batches' grouping ("stack expects each tensor to be equal size")."""
    from peft import LoraConfig, get_peft_model

    engine._model = get_peft_model(engine.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    rows = [TurnRow(r.trajectory, r.prompt_ids, r.response_ids[:k], r.old_logprobs[:k], schema=SCHEMA)
            for r, k in zip(sample_rows(engine, 6), (9, 30, 12, 25, 7, 18), strict=True)]  # replies cut short
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0]),
                        row_group=["q0", "q0", "q1", "q1", "q2", "q2"], trajectories={"q0": 2, "q1": 2, "q2": 2})
    update = updater(engine, kl_coef=0.1, ppo_mini_batch_size=mini_batch, micro_batch_rows=2)
    reference = update.ref_logprobs(rows, 1.0)
    assert [len(t) for t in reference] == [len(r.response_ids) for r in rows]
    metrics = update.grpo(batch, temperature=1.0, step=1)
    assert metrics["optimizer_steps"] == (3 if mini_batch else 1)
    assert metrics["kl_ref"] >= 0.0 and torch.isfinite(torch.tensor(metrics["loss"]))


def test_update_weighs_rows_over_the_whole_mini_batch_before_dropping_zero_advantages(engine, monkeypatch) -> None:
    """The weights of the rows that carry a gradient are those they have among all rows of their mini-batch
    (a question without signal still counts in B), with G_q the question's scored trajectories: q0 kept
    3 (one excluded), q1 2, q2 (no signal) 2."""
    rows = sample_rows(engine, 7)
    update = updater(engine)
    captured: list[torch.Tensor] = []
    step = update._optimizer_step

    def spy(kept_rows, advantages, weights, *args):
        captured.append(weights.clone())
        return step(kept_rows, advantages, weights, *args)

    monkeypatch.setattr(update, "_optimizer_step", spy)
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -0.5, -0.5, 1.0, -1.0, 0.0, 0.0]),
                        row_group=["q0"] * 3 + ["q1"] * 2 + ["q2"] * 2, trajectories={"q0": 3, "q1": 2, "q2": 2})
    update.grpo(batch, temperature=1.0, step=1)
    (weights,) = captured
    lengths = torch.tensor([len(r.response_ids) for r in rows[:5]], dtype=torch.float32)
    expected = 1.0 / (3 * torch.tensor([3.0, 3, 3, 2, 2]) * lengths)  # B = 3 questions, one turn each
    assert torch.allclose(weights, expected)


def _action_entropy(engine: TransformersEngine, update: PolicyUpdater, rows: list[TurnRow]) -> float:
    packed = replayed(engine, update, rows)
    with torch.no_grad():
        _, entropy, _ = response_logprobs(engine.model, packed, with_entropy=True)
    return float(entropy[action_positions(packed)].mean())


def test_each_rows_action_is_its_first_free_token(engine: TransformersEngine) -> None:
    rows = sample_rows(engine, 4)
    packed = replayed(engine, updater(engine), rows)
    actions = action_positions(packed)
    assert actions.sum(dim=1).tolist() == [1, 1, 1, 1]
    chosen = packed.response_ids[actions].tolist()
    assert {engine.tokenizer.decode([t]) for t in chosen} <= {"p", "w"}  # the tool: python or wikipedia_search
    before = packed.response_mask.bool() & (actions.long().cumsum(dim=1) == 0)
    assert (packed.allowed[before].sum(-1) == 1).all()  # every token before it forced: `{"tool_name":"`
    assert torch.equal(action_positions(packed, [r.action for r in rows]), actions)  # the tool found by its key
    unconstrained = pack_rows(rows[:1], pad_id=engine.tokenizer.pad_token_id)
    first = unconstrained.response_mask.bool() & (unconstrained.response_mask.cumsum(dim=1) == 1)
    assert torch.equal(action_positions(unconstrained), first)


def test_a_reply_that_names_its_tool_last_has_the_tool_as_its_action(engine: TransformersEngine) -> None:
    """Under the paper's order (sub-goal, then tool) the first free token is the sub-goal's: the action, what
    the exploration floor and the action-entropy metric are about, is found by the tool's key instead."""
    rows = sample_rows(engine, 4, schema=TOOL_LAST, max_tokens=96)  # the sub-goal's 12 characters: up to 36 bytes
    packed = replayed(engine, updater(engine), rows)
    actions = action_positions(packed, [r.action for r in rows])
    assert actions.sum(dim=1).tolist() == [1, 1, 1, 1]
    assert {engine.tokenizer.decode([t]) for t in packed.response_ids[actions].tolist()} <= {"p", "w"}
    for row in rows:
        assert engine.tokenizer.decode(row.response_ids[:row.action]).endswith('", "tool_name": "')
    assert not (actions & action_positions(packed)).any()  # the first free token is the sub-goal's


def test_a_reply_cut_before_its_tool_has_no_action(engine: TransformersEngine) -> None:
    decode, encode = engine.tokenizer.decode, engine.tokenizer.encode
    assert action_index(encode('{"sub_goal": "abc", "tool_name": "py'), TOOL_LAST, decode) == 34
    assert action_index(encode('{"sub_goal": "abcdefghij'), TOOL_LAST, decode) == -1
    assert action_index(encode('{"tool_name": "python"}'), SCHEMA, decode) == 15
    assert action_index(encode('{"a": 1}'), {"properties": {"a": {"type": "integer"}}}, decode) is None
    row = TurnRow(0, encode("q"), encode('{"sub_goal": "abcdefghij'), [0.0] * 24, action=-1)
    packed = pack_rows([row], pad_id=engine.tokenizer.pad_token_id)
    assert not action_positions(packed, [row.action]).any()


def test_the_action_entropy_bonus_keeps_the_tool_choice_open(engine: TransformersEngine) -> None:
    """The same rows and advantages, one SGD step each from the same weights: with the bonus the entropy of
    the tool choice ends higher than without, and the metric is logged either way."""
    rows = sample_rows(engine, 8)
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0] * 4), row_group=["q0"] * 8,
                        trajectories={"q0": 8})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    after = {}
    for coef in (0.0, 0.1):
        engine.model.load_state_dict(start)
        update = updater(engine, learning_rate=0.01, action_entropy_coef=coef)
        update.replay_masks(rows)
        before = _action_entropy(engine, update, rows)
        metrics = update.grpo(batch, temperature=1.0, step=1)
        assert metrics["action_entropy"] == pytest.approx(before, rel=1e-4)
        after[coef] = _action_entropy(engine, update, rows)
    assert after[0.1] > after[0.0] + 0.01


def test_action_loss_share_one_trains_the_tool_token_alone(engine: TransformersEngine) -> None:
    """With the whole reply's weight on its action, one update's gradient is that of the action tokens'
    log-probs alone, each row weighted as the paper weighs the reply (1/(B G) here): the sub-goal's tokens
    add nothing. Without the option they would (checked, so the comparison can fail)."""
    rows = sample_rows(engine, 4)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batch = UpdateBatch(rows=rows, advantages=advantages, row_group=["q0"] * 4, trajectories={"q0": 4})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def expected_step() -> dict[str, torch.Tensor]:
        engine.model.load_state_dict(start)
        engine.model.zero_grad()
        packed = replayed(engine, updater(engine), rows)
        logprobs, _, _ = response_logprobs(engine.model, packed, temperature=1.0)
        action = action_positions(packed, [r.action for r in rows])
        (-(advantages[:, None] * logprobs * action).sum() / 4).backward()
        return {n: -0.01 * p.grad for n, p in engine.model.named_parameters() if p.grad is not None}

    def update_step(**options) -> dict[str, torch.Tensor]:
        engine.model.load_state_dict(start)
        updater(engine, learning_rate=0.01, max_grad_norm=1e9, **options).grpo(batch, temperature=1.0, step=1)
        after = dict(engine.model.named_parameters())
        return {n: after[n].detach() - start[n] for n in want}

    want = expected_step()
    assert any(g.abs().max() > 1e-6 for g in want.values())
    got = update_step(action_loss_share=1.0)
    for name, delta in want.items():
        assert torch.allclose(got[name], delta, atol=1e-6), name
    paper = update_step()
    assert any(not torch.allclose(paper[n], want[n], atol=1e-6) for n in want)


def test_the_kl_term_weighs_the_tokens_as_the_policy_term_does(engine: TransformersEngine) -> None:
    """With the whole weight on the action, the KL term too is the action's alone: with every advantage 0 the step
    is that of kl_coef x k3 at the action tokens, each row weighted as the paper weighs the reply (1/(B G) here).
    The KL over every token, the paper's 1/|a| (as it was, which held the sub-goal text and barely the tool),
    is another step (checked, so the comparison can fail)."""
    rows = sample_rows(engine, 4)
    batch = UpdateBatch(rows=rows, advantages=torch.zeros(4), row_group=["q0"] * 4, trajectories={"q0": 4})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    reference = perturbed(engine.model)

    def expected_step(only_action: bool) -> dict[str, torch.Tensor]:
        engine.model.load_state_dict(start)
        engine.model.zero_grad()
        packed = replayed(engine, updater(engine), rows)
        logprobs, _, _ = response_logprobs(engine.model, packed, temperature=1.0)
        with torch.no_grad():
            ref, _, _ = response_logprobs(reference, packed, temperature=1.0)
        mask = packed.response_mask.float()
        tokens = action_positions(packed, [r.action for r in rows]) if only_action else \
            mask / mask.sum(dim=1, keepdim=True)
        (0.5 * (kl_k3(logprobs, ref) * tokens * mask).sum() / 4).backward()
        return {n: -0.01 * p.grad for n, p in engine.model.named_parameters() if p.grad is not None}

    want = expected_step(only_action=True)
    every_token = expected_step(only_action=False)
    engine.model.load_state_dict(start)
    metrics = updater(engine, ref_model=reference, learning_rate=0.01, max_grad_norm=1e9, action_loss_share=1.0,
                      kl_coef=0.5).grpo(batch, temperature=1.0, step=1)
    got = {n: p.detach() - start[n] for n, p in engine.model.named_parameters()}
    assert metrics["kl_ref"] > 1e-3 and any(g.abs().max() > 1e-6 for g in want.values())
    for name, delta in want.items():
        assert torch.allclose(got[name], delta, atol=1e-6), name
    assert any(not torch.allclose(every_token[n], want[n], atol=1e-6) for n in want)


@pytest.fixture
def merged_engine() -> TransformersEngine:
    """The byte-level engine with "py" and "wi" as tokens too: each tool can start with either of two tokens."""
    torch.set_num_threads(1)
    tokenizer = byte_tokenizer(merges=(("p", "y"), ("w", "i")))
    return TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=16, seed=0),
                              model=tiny_model(tokenizer), tokenizer=tokenizer)


def test_a_tools_log_prob_is_the_total_of_the_tokens_that_start_it(merged_engine: TransformersEngine) -> None:
    """With action_logprob: tool the action's log-prob is log(p("p") + p("py")) for python, under the masked
    distribution it was sampled from; every other position keeps its token's."""
    engine = merged_engine
    rows = sample_rows(engine, 8)
    update = updater(engine, action_logprob="tool")
    packed = replayed(engine, update, rows)
    decode = engine.tokenizer.decode
    starts = {"python": {"p", "py"}, "wikipedia_search": {"w", "wi"}}
    for row in rows:
        tool = decode(row.response_ids[row.action:]).split('"')[0]
        assert {decode([t]) for t in row.action_tokens} == starts[tool]
    token_level = pack_rows(rows, pad_id=engine.tokenizer.pad_token_id, allowed=[r.allowed for r in rows],
                            vocab_size=update.vocab_size)
    assert token_level.action_sets is not None  # rows carry their sets: clear them for the token-level reading
    token_level.action_sets = None
    with torch.no_grad():
        logits = engine.model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                              position_ids=packed.position_ids).logits[:, -packed.response_ids.shape[1] - 1:-1]
        per_token, _, _ = response_logprobs(engine.model, token_level)
        for chunked in (True, False):
            tool_level, _, _ = response_logprobs(engine.model, packed, chunked_head=chunked)
            action = action_positions(packed, [r.action for r in rows])
            assert torch.allclose(tool_level[~action], per_token[~action], atol=1e-5)
            for i, row in enumerate(rows):
                position = int(action[i].nonzero())
                here = logits[i, position].masked_fill(~packed.allowed[i, position], -torch.inf)
                masked = torch.log_softmax(here, -1)
                want = torch.logsumexp(masked[row.action_tokens], -1)
                assert tool_level[i, position] == pytest.approx(float(want), abs=1e-5)
                assert tool_level[i, position] > per_token[i, position] + 1e-3  # the other spelling counts too


def test_action_tokens_leave_a_choice_not_made_at_the_action_to_the_token() -> None:
    """A token that starts two values (the enum's "pandas" and "python" both start with "p") is no choice of
    either: the row keeps the token's log-prob; so does a reply cut inside the value."""
    tokenizer = byte_tokenizer(merges=(("p", "y"),))
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"],
                                       "tool_name": {"type": "string", "enum": ["python", "pandas"]}}}
    encode, decode = tokenizer.encode, tokenizer.decode
    allowed = torch.zeros(len(tokenizer), dtype=torch.bool)
    allowed[encode("p") + encode("py")] = True
    reply = encode('{"tool_name": "') + encode("py") + encode('thon", "sub_goal": ""}')
    assert [decode([t]) for t in action_tokens(reply, 15, allowed, schema, decode)] == ["py"]
    spelt = encode('{"tool_name": "') + encode("p") + encode('ython", "sub_goal": ""}')
    assert action_tokens(spelt, 15, allowed, schema, decode) is None  # "p" starts both
    assert action_tokens(reply[:17], 15, allowed, schema, decode) is None  # cut inside the value


def test_a_tool_level_update_takes_its_old_log_probs_from_its_own_pass(merged_engine: TransformersEngine) -> None:
    """The sampler reported each drawn token's log-prob; the tool-level update's first step must start at ratio
    1 all the same, so its gradient is that of the advantages times the action totals' log-probs. Fed the
    sampler's token log-probs as the old ones, rows would start above 1, their gradient scaled by the ratio."""
    engine = merged_engine
    rows = sample_rows(engine, 6)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    batch = UpdateBatch(rows=rows, advantages=advantages, row_group=["q0"] * 6, trajectories={"q0": 6})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    options = {"action_logprob": "tool", "action_loss_share": 1.0}
    engine.model.zero_grad()
    packed = replayed(engine, updater(engine, **options), rows)
    logprobs, _, _ = response_logprobs(engine.model, packed)
    action = action_positions(packed, [r.action for r in rows])
    (-(advantages[:, None] * logprobs * action).sum() / 6).backward()
    want = {n: -0.01 * p.grad for n, p in engine.model.named_parameters() if p.grad is not None}
    assert any(g.abs().max() > 1e-6 for g in want.values())
    engine.model.load_state_dict(start)
    metrics = updater(engine, learning_rate=0.01, max_grad_norm=1e9, **options).grpo(batch, temperature=1.0, step=1)
    after = dict(engine.model.named_parameters())
    assert metrics["clip_fraction"] == 0.0
    for name, delta in want.items():
        assert torch.allclose(after[name].detach() - start[name], delta, atol=1e-6), name


def test_action_choices_group_the_allowed_tokens_by_the_tool_they_start() -> None:
    """Every token allowed at the action is in exactly one group: one per tool (its spellings), and a token
    that starts two tools alone."""
    tokenizer = byte_tokenizer(merges=(("p", "y"), ("w", "i")))
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "tool_name": {
        "type": "string", "enum": ["python", "pandas", "wikipedia_search"]}}}
    encode, decode = tokenizer.encode, tokenizer.decode
    allowed = torch.zeros(len(tokenizer), dtype=torch.bool)
    allowed[encode("p") + encode("py") + encode("w") + encode("wi")] = True
    groups = action_choices(allowed, schema, decode)
    assert sorted(sorted(decode([t]) for t in group) for group in groups) == [["p"], ["py"], ["w", "wi"]]
    assert sorted(t for group in groups for t in group) == allowed.nonzero().flatten().tolist()
    assert action_choices(allowed, {"type": "object", "properties": {}}, decode) is None


def _tool_entropy(logits: torch.Tensor, allowed: torch.Tensor, groups: list[list[int]]) -> float:
    probs = torch.softmax(logits.masked_fill(~allowed, -torch.inf), -1)
    totals = torch.stack([probs[group].sum() for group in groups])
    return float(-(totals * totals.log()).sum())


def test_with_the_tool_as_the_action_its_entropy_is_the_tool_choices(merged_engine: TransformersEngine) -> None:
    """With action_logprob: tool the action's entropy is over the tools (each the total of its spellings),
    what the exploration bonus and the action_entropy metric read; the token-level entropy, which also counts
    "p" against "py", is higher."""
    engine = merged_engine
    rows = sample_rows(engine, 6)
    update = updater(engine, action_logprob="tool")
    packed = replayed(engine, update, rows)
    for row in rows:
        assert sorted(sorted(engine.tokenizer.decode([t]) for t in g) for g in row.action_choices) == \
            [["p", "py"], ["w", "wi"]]
    with torch.no_grad():
        logits = engine.model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                              position_ids=packed.position_ids).logits[:, -packed.response_ids.shape[1] - 1:-1]
        action = action_positions(packed, [r.action for r in rows])
        for chunked in (True, False):
            _, entropy, _ = response_logprobs(engine.model, packed, with_entropy=True, chunked_head=chunked)
            for i, row in enumerate(rows):
                position = int(action[i].nonzero())
                want = _tool_entropy(logits[i, position], packed.allowed[i, position], row.action_choices)
                assert float(entropy[i, position]) == pytest.approx(want, abs=1e-5)
        packed.action_sets = None  # the token-level reading
        _, per_token, _ = response_logprobs(engine.model, packed, with_entropy=True)
        assert (per_token[action] > entropy[action] + 1e-3).all()


def test_the_bonus_on_every_row_opens_a_choice_no_group_had_signal_on(merged_engine: TransformersEngine) -> None:
    """A batch whose every group got one reward for all its rollouts trains nothing under the default; with
    action_entropy_rows: all the bonus alone takes a step, and the tool choice's entropy rises."""
    engine = merged_engine
    rows = sample_rows(engine, 8)
    batch = UpdateBatch(rows=rows, advantages=torch.zeros(8), row_group=["q0"] * 4 + ["q1"] * 4,
                        trajectories={"q0": 4, "q1": 4})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    options = {"learning_rate": 0.01, "action_logprob": "tool", "action_loss_share": 1.0, "action_entropy_coef": 0.5}

    def tool_entropy(update: PolicyUpdater) -> float:
        packed = replayed(engine, update, rows)
        with torch.no_grad():
            _, entropy, _ = response_logprobs(engine.model, packed, with_entropy=True)
        return float(entropy[action_positions(packed, [r.action for r in rows])].mean())

    signal = updater(engine, **options)
    assert signal.grpo(batch, temperature=1.0, step=1)["optimizer_steps"] == 0
    assert all(torch.equal(start[k], v) for k, v in engine.model.state_dict().items())
    every = updater(engine, action_entropy_rows="all", **options)
    before = tool_entropy(every)
    metrics = every.grpo(batch, temperature=1.0, step=1)
    assert metrics["optimizer_steps"] == 1
    assert metrics["action_entropy"] == pytest.approx(before, rel=1e-4)
    assert tool_entropy(every) > before + 1e-3


def test_rows_the_bonus_alone_trains_are_cut_after_their_action_and_shared_openings_computed_once(
        merged_engine: TransformersEngine) -> None:
    """action_entropy_rows: all. A group without signal adds its rows to the update for the bonus alone, which
    reads the logits at the action: each row is cut after its action, and a group's rows that share the prompt
    and the forced opening before the tool are one probe, counted as many times. The step is the one the whole
    rows give, and so is the measured entropy."""
    engine = merged_engine
    rows = sample_rows(engine, 12, questions=["q0"] * 4 + ["q1"] * 4 + [f"q2 {i}" for i in range(4)])
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 1.0, -1.0] + [0.0] * 8),
                        row_group=["q0"] * 4 + ["q1"] * 4 + ["q2"] * 4, trajectories={"q0": 4, "q1": 4, "q2": 4})
    options = {"learning_rate": 0.01, "action_logprob": "tool", "action_loss_share": 1.0,
               "action_entropy_coef": 0.5, "action_entropy_rows": "all"}
    update = updater(engine, **options)
    update.replay_masks(rows)
    probes = bonus_probes(rows[4:])
    openings = Counter((tuple(r.prompt_ids), tuple(r.response_ids[:r.action + 1])) for r in rows[4:])
    assert sorted(p.count for p in probes) == sorted(openings.values())
    assert max(openings.values()) > 1  # some of q1's replies open alike (q2's prompts differ)
    for probe in probes:
        assert len(probe.row.response_ids) == probe.row.allowed.shape[0] == probe.row.action + 1
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def step(advantages: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine.model.load_state_dict(start)
        metrics = updater(engine, **options).grpo(replace(batch, advantages=advantages), temperature=1.0, step=1)
        return {k: v - start[k] for k, v in engine.model.state_dict().items()}, metrics

    probed, probed_metrics = step(batch.advantages)
    # the same rows whole, as rows the policy gradient trains: a negligible advantage sends them down that path
    whole, whole_metrics = step(torch.where(batch.advantages == 0, 1e-30, batch.advantages))
    assert any(v.abs().max() > 1e-4 for v in whole.values())
    for name, delta in whole.items():
        assert torch.allclose(probed[name], delta, atol=1e-6), name
    assert probed_metrics["action_entropy"] == pytest.approx(whole_metrics["action_entropy"], rel=1e-5)


def test_the_adaptive_bonus_weight_rises_under_its_target_and_falls_back_over_it(
        merged_engine: TransformersEngine) -> None:
    """action_entropy_target: each update measures the action's entropy with the weight it has, then moves the
    weight one step towards holding that entropy at the target, never below action_entropy_coef; no actions
    measured, no move."""
    engine = merged_engine
    rows = sample_rows(engine, 8)
    batch = UpdateBatch(rows=rows, advantages=torch.zeros(8), row_group=["q0"] * 4 + ["q1"] * 4,
                        trajectories={"q0": 4, "q1": 4})
    options = {"learning_rate": 1e-4, "action_logprob": "tool", "action_loss_share": 1.0,
               "action_entropy_rows": "all", "action_entropy_coef_step": 0.05}
    under = updater(engine, action_entropy_coef=0.1, action_entropy_target=5.0, **options)  # above ln 3
    first = under.grpo(batch, temperature=1.0, step=1)
    assert first["action_entropy"] < 5.0 and first["action_entropy_coef"] == pytest.approx(0.1)
    assert under.grpo(batch, temperature=1.0, step=2)["action_entropy_coef"] == pytest.approx(0.15)
    assert under.entropy_coef == pytest.approx(0.2)
    held = updater(engine, action_entropy_coef=0.1, action_entropy_target=0.0, **options)
    held.grpo(batch, temperature=1.0, step=1)
    assert held.entropy_coef == pytest.approx(0.1)  # over the target at its start: it stays there
    over = updater(engine, action_entropy_target=0.0, **options)
    over.entropy_coef = 0.06  # as if raised by earlier steps
    over.grpo(batch, temperature=1.0, step=1)
    assert over.entropy_coef == pytest.approx(0.01)
    metrics = over.grpo(batch, temperature=1.0, step=2)
    assert metrics["action_entropy_coef"] == pytest.approx(0.01) and over.entropy_coef == 0.0
    # at weight 0 the silent groups leave the update: nothing is measured, so the weight stays
    metrics = over.grpo(batch, temperature=1.0, step=3)
    assert metrics["optimizer_steps"] == 0 and "action_entropy" not in metrics and over.entropy_coef == 0.0


@pytest.mark.slow
def test_the_bundled_tokenizer_starts_each_tool_several_ways() -> None:
    """Why the tool-level log-prob exists: the bundled planner's reply can start python with "p", "py" or
    "python", wikipedia_search with five tokens."""
    engine = TransformersEngine(TransformersEngineConfig(device="cpu"))
    schema = planner_schema(["wikipedia_search", "python"])
    decode = engine.tokenizer.decode
    for tool, starts in (("python", {"p", "py", "python"}),
                         ("wikipedia_search", {"w", "wi", "wik", "wiki", "wikipedia"})):
        reply = engine.tokenizer.encode(f'{{"tool_name": "{tool}", "sub_goal": "x"', add_special_tokens=False)
        allowed = engine.allowed_tokens(schema, reply)
        action = action_index(reply, schema, decode)
        assert {decode([t]) for t in action_tokens(reply, action, allowed[action], schema, decode)} == starts


@pytest.mark.parametrize("chunked", [True, False])
def test_a_shared_prefix_gives_the_whole_rows_log_probs_and_gradient(engine: TransformersEngine, chunked) -> None:
    """The prompt start every row shares, run once and read from a cache by each row, gives each row's log-probs
    and the parameters' gradient as the whole rows do, rows of different lengths (padded after the prefix)
    included."""
    rows = sample_rows(engine, 5, questions=["question 0", "question 1 is longer", "question 2?",
                                             "question 3 is the longest of all", "question 4"])
    update = updater(engine)
    update.replay_masks(rows)
    results = []
    for shared in (False, True):
        engine.model.zero_grad()
        prefix = SharedPrefix.of(engine.model, rows) if shared else None
        assert (prefix is not None) == shared
        packed = pack_rows(rows, pad_id=engine.tokenizer.pad_token_id, allowed=[r.allowed for r in rows],
                           vocab_size=update.vocab_size, prefix=prefix.length if prefix else 0)
        logprobs, entropy, _ = response_logprobs(engine.model, packed, temperature=0.7, with_entropy=True,
                                                 chunked_head=chunked, entropy_grad=True, prefix=prefix)
        ((logprobs - 0.1 * entropy) * torch.linspace(-1, 1, logprobs.shape[1])).sum().backward()
        if prefix is not None:
            assert packed.input_ids.shape[1] < max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
            prefix.backward()
        results.append((logprobs.detach(), {n: p.grad.clone() for n, p in engine.model.named_parameters()
                                            if p.grad is not None}))
    (whole, whole_grads), (split, split_grads) = results
    assert torch.allclose(whole, split, atol=1e-5)
    assert whole_grads.keys() == split_grads.keys() and len(whole_grads) > 10
    for name, grad in whole_grads.items():
        # float rounding only (the summation order differs); without prefix.backward() the prefix's whole
        # share is missing
        assert (grad - split_grads[name]).norm() <= 1e-5 * grad.norm() + 1e-6, name


def steps_with_and_without_prefix(engine: TransformersEngine, batch: UpdateBatch) -> tuple[
        dict[str, torch.Tensor], dict[str, float], dict[str, torch.Tensor], dict[str, float]]:
    """One step from the same start with `share_prompt_prefix` and without: each step's parameter change and
    metrics."""
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def step(**options) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine.model.load_state_dict(start)
        metrics = updater(engine, learning_rate=0.01, micro_batch_rows=3, **options).grpo(
            batch, temperature=1.0, step=1)
        return {k: v - start[k] for k, v in engine.model.state_dict().items()}, metrics

    return *step(), *step(share_prompt_prefix=False)


def test_an_update_with_a_shared_prefix_takes_the_whole_rows_step(engine: TransformersEngine) -> None:
    """share_prompt_prefix: the rows' common prompt start runs once per optimiser step; the step is the one the
    whole rows give. Under activation checkpointing (a recomputed layer would add the prefix to its cache twice)
    nothing is shared."""
    rows = sample_rows(engine, 8, temperature=1.0)
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.0, 0.0]),
                        row_group=["q0"] * 4 + ["q1"] * 4, trajectories={"q0": 4, "q1": 4})
    shared, shared_metrics, whole, whole_metrics = steps_with_and_without_prefix(engine, batch)
    assert shared_metrics["update/prefix_tokens_saved"] >= 5 * 16 and "update/prefix_tokens_saved" not in whole_metrics
    assert any(v.abs().max() > 1e-4 for v in whole.values())
    for name, delta in whole.items():
        assert torch.allclose(shared[name], delta, atol=1e-6), name
    assert shared_metrics["loss"] == pytest.approx(whole_metrics["loss"], rel=1e-5)
    assert not updater(engine, gradient_checkpointing=True).share_prefix
    assert updater(engine).share_prefix


def test_rows_with_one_prompt_run_it_once_and_take_the_whole_rows_step(engine: TransformersEngine) -> None:
    """group_shares_menu: a group's first-turn rows have one prompt. The update runs each such prompt once for
    its rows (the rows left over share their common start as before), and the step is the whole rows' step."""
    rows = sample_rows(engine, 9, temperature=1.0, questions=["question 0"] * 4 + ["question 1 is longer"] * 4
                       + ["question 2"])
    assert len({tuple(r.prompt_ids) for r in rows}) == 3
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.0]),
                        row_group=["q0"] * 4 + ["q1"] * 4 + ["q2"], trajectories={"q0": 4, "q1": 4, "q2": 1})
    shared, shared_metrics, whole, whole_metrics = steps_with_and_without_prefix(engine, batch)
    # every prompt but its last token, once for the 4 rows of each group
    saved = 3 * (len(rows[0].prompt_ids) - 1) + 3 * (len(rows[4].prompt_ids) - 1)
    assert shared_metrics["update/prefix_tokens_saved"] == saved
    assert any(v.abs().max() > 1e-4 for v in whole.values())
    for name, delta in whole.items():
        assert torch.allclose(shared[name], delta, atol=1e-6), name
    assert shared_metrics["loss"] == pytest.approx(whole_metrics["loss"], rel=1e-5, abs=1e-6)


def test_the_reference_pass_runs_a_shared_prompt_once_and_gives_the_whole_rows_log_probs(
        engine: TransformersEngine) -> None:
    """kl_coef: the reference log-probs are computed as the update computes its own, each group's shared prompt
    once for its rows; they are the whole rows' log-probs, and the prompt tokens not forwarded are reported."""
    rows = sample_rows(engine, 9, temperature=1.0, questions=["question 0"] * 4 + ["question 1 is longer"] * 4
                       + ["question 2"])
    reference = perturbed(engine.model)
    sums: dict[str, float] = {}
    shared = updater(engine, reference, kl_coef=0.1, micro_batch_rows=3).ref_logprobs(rows, 1.0, sums)
    whole = updater(engine, reference, kl_coef=0.1, share_prompt_prefix=False).ref_logprobs(rows, 1.0)
    assert sums["prefix_tokens_saved"] == 3 * (len(rows[0].prompt_ids) - 1) + 3 * (len(rows[4].prompt_ids) - 1)
    assert [t.shape for t in shared] == [(len(r.response_ids),) for r in rows]
    for a, b in zip(shared, whole, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    own = updater(engine, perturbed(engine.model, 0.0), kl_coef=0.1).ref_logprobs(rows, 1.0)
    assert max((a - b).abs().max() for a, b in zip(whole, own, strict=True)) > 1e-3  # the reference was used


def test_the_old_log_prob_pass_runs_a_shared_prompt_once_and_gives_the_whole_rows_values(
        engine: TransformersEngine) -> None:
    """Rows another engine sampled, before several optimiser steps: the trainer's own old log-probs and the TIS
    weights come from one pass that runs each shared prompt once; they are the whole rows' values."""
    sampled = sample_rows(engine, 9, temperature=1.0, questions=["question 0"] * 4 + ["question 1 is longer"] * 4
                          + ["question 2"])
    for row in sampled:  # as if another engine had sampled them, a little off the trainer's log-probs
        row.engine_logprobs = [v - 0.5 * (i % 3) for i, v in enumerate(row.old_logprobs)]

    def recomputed(share: bool) -> list[TurnRow]:
        rows = copy.deepcopy(sampled)
        update = updater(engine, rollout_engine={"kind": "llamacpp"}, micro_batch_rows=3, share_prompt_prefix=share)
        assert update.share_prefix == share
        metrics = update.engine_rows(rows, temperature=1.0)
        assert ("old_logprobs/prefix_tokens_saved" in metrics) == share
        if share:  # every prompt but its last token, once for the 4 rows of each group
            assert metrics["old_logprobs/prefix_tokens_saved"] == 3 * (len(rows[0].prompt_ids) - 1) + 3 * (
                len(rows[4].prompt_ids) - 1)
        return rows

    shared, whole = recomputed(True), recomputed(False)
    assert any(w != 1.0 for row in whole for w in row.tis_weights)
    for a, b in zip(shared, whole, strict=True):
        assert a.old_logprobs == pytest.approx(b.old_logprobs, abs=1e-5)
        assert a.tis_weights == pytest.approx(b.tis_weights, abs=1e-5)


@pytest.mark.parametrize(("action_logprob", "kl_coef"), [("token", 0.0), ("tool", 0.0), ("tool", 0.5)])
def test_rows_cut_after_their_action_take_the_whole_rows_step(engine: TransformersEngine, action_logprob: str,
                                                              kl_coef: float) -> None:
    """With the whole weight on the action (the KL term's too) a reply's tokens after its action carry no gradient,
    so the update cuts each row there, and its reference log-probs: the step, the loss and the action entropy are
    the whole rows' (each row's weight from its whole length), and the tokens cut are counted. Any weight
    elsewhere keeps the rows whole."""
    rows = sample_rows(engine, 8, temperature=1.0)
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]),
                        row_group=["q0"] * 4 + ["q1"] * 4, trajectories={"q0": 4, "q1": 4})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    reference = perturbed(engine.model) if kl_coef else None

    def step(cut: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine.model.load_state_dict(start)
        update = updater(engine, reference, learning_rate=0.01, action_loss_share=1.0, action_logprob=action_logprob,
                         action_entropy_coef=0.1, kl_coef=kl_coef)
        assert update.cut_after_action
        update.cut_after_action = cut
        metrics = update.grpo(batch, temperature=1.0, step=1)
        return {k: v - start[k] for k, v in engine.model.state_dict().items()}, metrics

    cut, cut_metrics = step(True)
    whole, whole_metrics = step(False)
    after_action = sum(len(r.response_ids) - r.action - 1 for r in rows)
    assert all(r.action >= 0 for r in rows) and after_action > 0
    assert cut_metrics["update/response_tokens_cut"] == after_action
    assert "update/response_tokens_cut" not in whole_metrics
    assert any(v.abs().max() > 1e-4 for v in whole.values())
    for name, delta in whole.items():
        assert torch.allclose(cut[name], delta, atol=1e-6), name
    assert cut_metrics["loss"] == pytest.approx(whole_metrics["loss"], rel=1e-5, abs=1e-6)
    assert cut_metrics["action_entropy"] == pytest.approx(whole_metrics["action_entropy"], rel=1e-5)
    if kl_coef:
        assert cut_metrics["kl_ref"] > 1e-3
    assert not updater(engine, action_loss_share=0.9).cut_after_action


@pytest.mark.slow
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_bundled_planner_with_lora_takes_the_same_step_with_a_shared_prefix(kl_coef: float) -> None:
    """The bundled SmolLM2 with a LoRA adapter, on planner prompts of the mixed flow (one system message, several
    questions): the update step with the shared prefix is the whole rows' step; with a KL term too, whose
    reference (the adapter disabled) shares the prefix as well."""
    from peft import LoraConfig, get_peft_model

    from agentflow.engines.hf import load_policy

    torch.manual_seed(0)
    model, tokenizer = load_policy(TransformersEngineConfig(), trainable=True)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             init_lora_weights=False))
    engine = TransformersEngine(TransformersEngineConfig(device="cpu", seed=0), model=model, tokenizer=tokenizer)
    schema = planner_schema(["wikipedia_search", "python"])
    questions = ["What is 4821 * 37?", "What is the atomic number of zinc?", "Who wrote Hamlet?",
                 "What is the atomic number of iron multiplied by 3?"]

    async def run():
        sampling = SamplingParams(temperature=1.0, max_tokens=24)
        return await asyncio.gather(*(engine.generate(
            [{"role": "system", "content": "You are the planner. Reply with JSON: tool_name, sub_goal."},
             {"role": "user", "content": q}], sampling, json_schema=schema) for q in questions))

    rows = [TurnRow(i, r.prompt_token_ids, r.token_ids, r.logprobs, schema=schema)
            for i, r in enumerate(asyncio.run(run()))]
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), row_group=["q0"] * 4,
                        trajectories={"q0": 4})
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def step(**options) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine.model.load_state_dict(start)
        update = updater(engine, learning_rate=0.01, micro_batch_rows=2, kl_coef=kl_coef, **options)
        assert update.share_prefix == options.get("share_prompt_prefix", True)
        metrics = update.grpo(batch, temperature=1.0, step=1)
        return {k: v - start[k] for k, v in engine.model.state_dict().items() if "lora" in k}, metrics

    shared, shared_metrics = step()
    whole, _ = step(share_prompt_prefix=False)
    assert shared_metrics["update/prefix_tokens_saved"] >= 3 * 20
    if kl_coef:
        assert shared_metrics["ref_logprobs/prefix_tokens_saved"] == shared_metrics["update/prefix_tokens_saved"]
        assert shared_metrics["kl_ref"] > 1e-4
    assert any(v.abs().max() > 1e-5 for v in whole.values())
    for name, delta in whole.items():
        assert torch.allclose(shared[name], delta, atol=1e-6, rtol=1e-3), name
