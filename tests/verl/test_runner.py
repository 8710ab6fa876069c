"""The agent loop's logic (no verl needed): our flow with the planner on a fake rollout server.

Checks the rows verl will receive, their masks and rewards, the advantages our estimators give them, and
the three ways a trajectory ends badly: early (fewer rows), failing (excluded and counted), too long
(turn dropped; a trajectory left without rows keeps its reward through a placeholder row).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentflow.errors import EngineUnavailableError
from agentflow.verl.engine import RolloutServerEngine
from tests.conftest import role_engine, role_of
from tests.verl.fakes import EOS, ByteTokenizer, FakeRolloutServer, Request, TokenOutput, logprob_of, plan
from tests.verl.helpers import make_runner, question, registry_advantages, verl_config

CONTINUE = json.dumps({"analysis": "more", "conclusion": "CONTINUE"})
STOP = json.dumps({"analysis": "done", "conclusion": "STOP"})
ARGS = json.dumps({"query": "x"})


def frozen(*, stop_after: str = "step2", answer: str = "Paris"):
    """Executor writes echo arguments; verifier stops once `stop_after` is in memory; generator answers."""

    def reply(messages):
        role = role_of(messages)
        text = messages[-1]["content"]
        if role == "executor":
            return ARGS
        if role == "verifier":
            return STOP if stop_after in text else CONTINUE
        if role == "generator":
            return f"<answer>{answer}</answer>"
        return "ok"

    return role_engine(executor=[reply], verifier=[reply], generator=[reply])


def numbered_plans(request: Request, server: FakeRolloutServer) -> str:
    """Turn n of a trajectory plans sub-goal 'step<n>' (n counted per request id, i.e. per trajectory)."""
    n = sum(1 for r in server.requests if r.request_id == request.request_id)
    return plan(sub_goal=f"step{n}")


async def run_one(runner, server, *, request_id="traj-1", temperature=1.0, q=None):
    return await runner.run(q or question(), server=server, request_id=request_id,
                            verl_sampling={"temperature": temperature, "top_p": 1.0, "top_k": -1,
                                           "repetition_penalty": 1.0, "logprobs": True},
                            tags={"uid": "u1", "session_id": 0})


async def test_each_planner_turn_is_a_row_with_the_servers_tokens(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path)
    server = FakeRolloutServer()
    server.reply = lambda request: numbered_plans(request, server)
    runner = make_runner(cfg, frozen(stop_after="step2"))
    result = await run_one(runner, server)

    assert result.excluded is None and result.score is not None and result.score.value == 1.0
    assert [t.verdict for t in result.trajectory.turns] == ["CONTINUE", "STOP"]
    rows = result.rows.rows
    assert [row.turn for row in rows] == [1, 2]
    tokenizer = ByteTokenizer()
    for row, request, turn in zip(rows, server.requests, result.trajectory.turns, strict=True):
        # the chat template was applied once, to exactly the messages the planner saw; the server got those ids
        assert row.prompt_ids == request.prompt_ids == tokenizer.apply(turn.planner.messages)
        # response ids and log-probs are the server's, not a re-tokenisation of the decoded text
        expected = list(plan(sub_goal=f"step{turn.index}").encode()) + [EOS]
        assert row.response_ids == expected
        assert row.response_logprobs == [logprob_of(i, t) for i, t in enumerate(expected)]
        assert row.response_mask == [1] * len(expected)
        assert turn.planner.completion.text == plan(sub_goal=f"step{turn.index}")
    assert result.context.min_global_steps == result.context.max_global_steps == 3
    assert runner.stats.scored == 1


async def test_sampling_sent_is_the_planners_and_verls_knobs_pass_through(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, limits={"max_turns": 1}, planner={"max_tokens": 40, "stop": ["\n\n"]})
    server = FakeRolloutServer()
    runner = make_runner(cfg, frozen())
    train = await run_one(runner, server, temperature=1.0)
    evaluation = await run_one(runner, server, request_id="traj-2", temperature=0.0)

    sent = [r.sampling_params for r in server.requests]
    assert sent[0] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                       "logprobs": True, "max_tokens": 40, "stop": ["\n\n"]}
    assert sent[1]["temperature"] == 0.0
    # what each trajectory records is what its planner calls sent
    assert train.trajectory.turns[0].planner.sampling.temperature == 1.0
    assert evaluation.trajectory.turns[0].planner.sampling.temperature == 0.0
    assert evaluation.trajectory.roles["planner"]["sampling"]["temperature"] == 0.0
    assert {r.request_id for r in server.requests} == {"traj-1", "traj-2"}


async def test_trajectory_that_ends_early_has_fewer_rows(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, limits={"max_turns": 3})
    server = FakeRolloutServer()
    server.reply = lambda request: numbered_plans(request, server)
    result = await run_one(make_runner(cfg, frozen(stop_after="step1")), server)
    assert len(result.trajectory.turns) == 1 and result.trajectory.stop_reason == "verifier_stop"
    assert [row.turn for row in result.rows.rows] == [1]


async def test_wrong_answer_is_scored_zero_on_every_row(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path)
    server = FakeRolloutServer()
    server.reply = lambda request: numbered_plans(request, server)
    result = await run_one(make_runner(cfg, frozen(stop_after="step3", answer="Rome")), server)
    assert result.score.value == 0.0 and not result.score.correct
    assert len(result.rows.rows) == 3 and all(row.trainable for row in result.rows.rows)


async def test_tool_call_cost_reaches_the_reward_verl_receives(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, tool_call_cost=0.25)
    server = FakeRolloutServer()
    server.reply = lambda request: numbered_plans(request, server)
    result = await run_one(make_runner(cfg, frozen(stop_after="step3")), server)
    assert len(result.trajectory.turns) == 3
    assert result.score.correct and result.score.value == 0.5


@pytest.mark.parametrize("failure", ["frozen_engine_down", "server_error", "server_aborted", "no_logprobs"])
async def test_infrastructure_failure_excludes_the_trajectory_and_counts_it(tmp_path: Path, failure: str) -> None:
    cfg = verl_config(tmp_path)
    server = FakeRolloutServer()
    engine = frozen()
    if failure == "frozen_engine_down":
        engine = role_engine(executor=[ARGS], verifier=[EngineUnavailableError("connection refused")])
    elif failure == "server_error":
        server.reply = lambda request: RuntimeError("ray actor died")
    elif failure == "server_aborted":
        server.reply = lambda request: TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted")
    else:
        server.reply = lambda request: TokenOutput(token_ids=[65, EOS], log_probs=None)
    runner = make_runner(cfg, engine)
    result = await run_one(runner, server)

    assert result.excluded is not None and result.score is None and result.rows is None
    assert result.trajectory.infrastructure_failure is not None
    assert sum(runner.stats.excluded.values()) == 1 and runner.stats.scored == 0


async def test_over_long_prompt_drops_that_turn_only(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, verl={"max_prompt_length": 450}, micro_batch_tokens=4096)
    server = FakeRolloutServer()
    # turn 2's prompt grows past the limit through memory: a long sub-goal in turn 1
    server.reply = lambda request: plan(sub_goal="x" * 400 if len(server.requests) == 1 else "step2")
    runner = make_runner(cfg, frozen(stop_after="step2"))
    result = await run_one(runner, server)

    lengths = [len(r.prompt_ids) for r in server.requests]
    assert lengths[0] <= 450 < lengths[1], lengths
    assert [row.turn for row in result.rows.rows] == [1]
    assert result.rows.dropped == {"prompt_too_long": 1}
    assert runner.stats.dropped_rows["prompt_too_long"] == 1
    assert result.score.value == 1.0


async def test_trajectory_without_a_trainable_turn_keeps_its_reward_in_a_masked_row(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, verl={"max_prompt_length": 100}, micro_batch_tokens=4096,
                      limits={"max_turns": 1})
    server = FakeRolloutServer()
    runner = make_runner(cfg, frozen())
    result = await run_one(runner, server)

    assert len(server.requests[0].prompt_ids) > 100
    assert result.rows.placeholder and runner.stats.placeholders == 1
    row = result.rows.rows[0]
    assert row.response_mask == [0] and row.response_ids == [EOS] and row.response_logprobs == [0.0]
    assert len(row.prompt_ids) <= 100
    assert result.score.value == 1.0


async def test_response_at_the_length_limit_is_kept_and_marked_length(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, limits={"max_turns": 1}, planner={"max_tokens": 16})
    server = FakeRolloutServer()
    result = await run_one(make_runner(cfg, frozen()), server)

    completion = result.trajectory.turns[0].planner.completion
    assert completion.finish_reason == "length" and len(completion.token_ids) == 16
    row = result.rows.rows[0]
    assert len(row.response_ids) == 16 and row.response_mask == [1] * 16
    # a truncated plan names no tool: the turn is recorded as invalid, and still trained on
    assert not result.trajectory.turns[0].tool_valid


async def test_group_advantages_are_per_trajectory_and_copied_to_turns(tmp_path: Path) -> None:
    """G=4 rollouts of one question: 2 right (2 and 1 turns), 1 wrong (3 turns), 1 excluded."""
    cfg = verl_config(tmp_path)
    server = FakeRolloutServer()
    plans = {"t0": ["a", "rightSTOP"], "t1": ["rightSTOP"], "t2": ["a", "b", "c"], "t3": ["down"]}

    def reply(request: Request):
        n = sum(1 for r in server.requests if r.request_id == request.request_id)
        sub_goal = plans[request.request_id][n - 1]
        return RuntimeError("gone") if sub_goal == "down" else plan(sub_goal=sub_goal)

    server.reply = reply

    def frozen_reply(messages):
        role, text = role_of(messages), messages[-1]["content"]
        if role == "executor":
            return ARGS
        if role == "verifier":
            return STOP if "STOP" in text else CONTINUE
        return "<answer>Paris</answer>" if "right" in text else "<answer>Rome</answer>"

    runner = make_runner(cfg, role_engine(executor=[frozen_reply], verifier=[frozen_reply],
                                          generator=[frozen_reply]))
    results = await asyncio.gather(*(run_one(runner, server, request_id=t) for t in plans))
    assert [r.score.value if r.score else None for r in results] == [1.0, 1.0, 0.0, None]
    assert [len(r.rows.rows) if r.rows else 0 for r in results] == [2, 1, 3, 0]

    adv = registry_advantages(results, "grpo_trajectory")
    # rewards (1, 1, 0): mean 2/3, Bessel std sqrt(1/3); one value per trajectory on every one of its rows
    right, wrong = (1 - 2 / 3) / (1 / 3) ** 0.5, (0 - 2 / 3) / (1 / 3) ** 0.5
    assert adv[0] == pytest.approx([right, right], abs=1e-5)
    assert adv[1] == pytest.approx([right], abs=1e-5)
    assert adv[2] == pytest.approx([wrong] * 3, abs=1e-5)
    assert adv[3] == []
    # the original code's variant weighs rows: rewards per row (1,1,1,0,0,0): mean 1/2
    turn_rows = registry_advantages(results, "grpo_turn_rows")
    assert turn_rows[0][0] > 0 > turn_rows[2][0]
    assert turn_rows[0][0] == pytest.approx(0.5 / (0.3) ** 0.5, abs=1e-5)
    assert runner.stats.scored == 3 and sum(runner.stats.excluded.values()) == 1


async def test_concurrent_trajectories_keep_their_own_server_binding_and_respect_the_gate(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, rollout_concurrency=2, limits={"max_turns": 1})
    server = FakeRolloutServer(delay_s=0.02)
    runner = make_runner(cfg, frozen())
    results = await asyncio.gather(*(run_one(runner, server, request_id=f"r{i}") for i in range(6)))
    assert server.max_in_flight <= 2
    for i, result in enumerate(results):
        assert result.rows.rows[0].prompt_ids == next(r.prompt_ids for r in server.requests if r.request_id == f"r{i}")


async def test_engine_outside_a_rollout_is_a_config_error() -> None:
    from agentflow.engines.base import SamplingParams
    from agentflow.errors import ConfigError

    tokenizer = ByteTokenizer()
    engine = RolloutServerEngine(tokenize=tokenizer.apply, decode=tokenizer.decode, model_name="m",
                                 response_length=8)
    with pytest.raises(ConfigError, match="outside a verl rollout"):
        await engine.generate([{"role": "user", "content": "hi"}], SamplingParams())


async def test_summary_of_every_trajectory_is_logged(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, limits={"max_turns": 1})
    server = FakeRolloutServer()
    runner = make_runner(cfg, frozen())
    await run_one(runner, server)
    server.reply = lambda request: RuntimeError("down")
    await run_one(runner, server, request_id="traj-2")

    files = list((Path(cfg.output_dir) / "trajectories").glob("*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [(x["id"], x["reward"], x["excluded"], x["rows"]) for x in lines] == [
        ("q1", 1.0, None, 1), ("q1", None, "engine_server_error", 0)]
    assert lines[0]["uid"] == "u1" and "trajectory" not in lines[0]
