"""Rollouts through the real Flow with scripted engines: scoring, exclusion of infrastructure failures,
training rows taken from the recorded completions, and the step metrics."""

import json

import pytest

from agentflow.config import FlowConfig
from agentflow.engines.base import Completion, Engine, SamplingParams
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import EngineContextOverflowError, EngineUnavailableError
from agentflow.flow import Flow
from agentflow.train.data import Question
from agentflow.train.rollout import expected_tool, menu_position_metrics, run_rollouts, score_trajectory
from agentflow.trajectory import Trajectory, Turn


class TokenEngine(Engine):
    """A policy stand-in that records token ids and log-probs, as the transformers engine does."""

    model_name = "tokens"

    def __init__(self, reply: str) -> None:
        self.reply = reply

    async def generate(self, messages, sampling: SamplingParams, *, json_schema=None) -> Completion:
        ids = list(range(len(self.reply.split())))
        return Completion(text=self.reply, prompt_token_ids=[1, 2, 3], token_ids=ids, prompt_tokens=3,
                          cached_prompt_tokens=1, logprobs=[-0.5] * len(ids))


PLAN = json.dumps({"context": "", "sub_goal": "look it up", "tool_name": "base_generator"})


def flow(generator_reply, policy=None):
    config = FlowConfig.from_dict({
        "engines": {"policy": {"kind": "transformers"}, "helper": {"kind": "llamacpp"}},
        "roles": {"planner": {"engine": "policy"}, "executor": {"engine": "helper"},
                  "verifier": {"engine": "helper"}, "generator": {"engine": "helper"},
                  "tools": {"engine": "helper"}},
        "tools": {"base_generator": {}}, "limits": {"max_turns": 2}, "query_analysis": False})

    def helper(messages):
        system = messages[0]["content"]
        if "final answer" in system:
            return generator_reply(messages)
        if "check whether" in system:
            return '{"analysis": "ok", "conclusion": "STOP"}'
        return '{"prompt": "hello"}'

    return Flow.from_config(config, engines={"policy": policy or TokenEngine(PLAN),
                                             "helper": ScriptedEngine(helper)})


QUESTIONS = [Question("q1", "Capital of France?", "Paris", "exact_match", {"tool": "base_generator"}),
             Question("q2", "Two plus two?", "4", "exact_match", {"tool": "python"})]


async def test_group_rollouts_are_scored_and_turned_into_rows():
    answers = iter(["<answer>Paris</answer>", "<answer>Lyon</answer>"] * 10)
    batch = await run_rollouts(flow(lambda m: next(answers)), QUESTIONS, group_size=2, concurrency=4)
    assert len(batch.rollouts) == 4 and not batch.excluded
    assert sorted(batch.trajectory_ids()) == ["q1#0", "q1#1", "q2#0", "q2#1"]
    rows, row_traj = batch.rows()
    assert len(rows) == 4 and row_traj.tolist() == [0, 1, 2, 3]
    assert rows[0].prompt_ids == [1, 2, 3] and rows[0].old_logprobs == [-0.5] * len(rows[0].response_ids)
    metrics = batch.metrics()
    assert metrics["turns_per_trajectory"] == 1.0
    assert metrics["tool/base_generator"] == 1.0
    assert metrics["tool_choice_accuracy"] == 0.5
    assert metrics["tool/turn1/base_generator"] == 1.0 and metrics["excluded_share"] == 0.0
    assert 0 <= metrics["accuracy"] <= 1 and batch.rewards().shape == (4,)
    # prompt tokens read per role; cached ones where the engine says (the scripted helper does not)
    assert metrics["rollout/prompt_tokens/planner"] == 12 and metrics["rollout/cached_prompt_tokens/planner"] == 4
    assert metrics["rollout/prompt_tokens/generator"] > 0 and "rollout/cached_prompt_tokens/generator" not in metrics
    assert metrics["rollout/prompt_tokens"] == sum(v for k, v in metrics.items()
                                                   if k.startswith("rollout/prompt_tokens/"))
    assert metrics["rollout/cached_prompt_tokens"] == 4


async def test_a_group_shares_its_menus_as_its_variants_say():
    """group_shares_menu: with `variants` each trajectory has the variant of its index in the group, the one its
    menu order is drawn from (tests/test_flow.py); without, each its index."""
    def reply(messages):
        return "<answer>Paris</answer>"

    shared = await run_rollouts(flow(reply), QUESTIONS, group_size=3, concurrency=6, variants=[5, 5, 6])
    own = await run_rollouts(flow(reply), QUESTIONS, group_size=3, concurrency=6)
    assert sorted((r.question.id, r.index, r.trajectory.variant) for r in shared.rollouts) == [
        (q.id, i, v) for q in sorted(QUESTIONS, key=lambda q: q.id) for i, v in enumerate([5, 5, 6])]
    assert sorted(r.trajectory.variant for r in own.rollouts) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="2 variants for groups of 3"):
        await run_rollouts(flow(reply), QUESTIONS, group_size=3, concurrency=6, variants=[5, 6])


async def test_infrastructure_failures_are_excluded_and_counted():
    calls = {"n": 0}

    def generator(messages):
        calls["n"] += 1
        return EngineUnavailableError("down") if calls["n"] == 1 else "<answer>Paris</answer>"

    batch = await run_rollouts(flow(generator), QUESTIONS[:1], group_size=3, concurrency=1)
    assert len(batch.rollouts) == 2 and len(batch.excluded) == 1
    assert batch.excluded[0].infrastructure.kind == "engine_unavailable"
    assert batch.metrics()["infrastructure_failures"] == 1
    assert batch.metrics()["excluded_share"] == pytest.approx(1 / 3)
    assert batch.rewards().tolist() == [1.0, 1.0]


async def test_failures_the_policy_causes_are_scored_not_excluded():
    """Regression: a context overflow (the flow's own memory grown too long) or a question time-out was
    excluded like an engine outage, so the behaviour that caused it was never penalised."""
    def generator(messages):
        return EngineContextOverflowError("prompt too long")

    batch = await run_rollouts(flow(generator), QUESTIONS[:1], group_size=2, concurrency=2)
    assert len(batch.rollouts) == 2 and not batch.excluded
    assert batch.rewards().tolist() == [0.0, 0.0]
    assert all(any(f.kind == "context_overflow" for f in r.trajectory.failures) for r in batch.rollouts)
    assert batch.metrics()["context_overflows"] == 2


async def test_rows_need_token_ids_from_the_policy_engine():
    batch = await run_rollouts(flow(lambda m: "x", policy=ScriptedEngine([PLAN])), QUESTIONS[:1], group_size=1,
                               concurrency=1)
    with pytest.raises(ValueError, match=r"trajectory 'q1#0' planner call 1: .*no token ids"):
        batch.rows()


class CrashingFlow:
    """A flow with a bug of ours on one question: asolve raises instead of recording a failure."""

    def __init__(self, inner: Flow, crash_on: str) -> None:
        self.inner, self.crash_on = inner, crash_on

    async def asolve(self, question: str, *, variant: int = 0):
        if question == self.crash_on:
            raise RuntimeError("bug in the flow")
        return await self.inner.asolve(question, variant=variant)


async def test_a_crash_of_ours_is_excluded_counted_and_logged_not_raised(caplog):
    crashing = CrashingFlow(flow(lambda m: "<answer>Paris</answer>"), crash_on="Two plus two?")
    with caplog.at_level("ERROR", logger="agentflow.train.rollout"):
        batch = await run_rollouts(crashing, QUESTIONS, group_size=2, concurrency=2)  # type: ignore[arg-type]
    assert [r.trajectory_id for r in batch.rollouts] == ["q1#0", "q1#1"]
    assert [(r.trajectory_id, r.infrastructure.kind) for r in batch.excluded] == [("q2#0", "internal_error"),
                                                                                  ("q2#1", "internal_error")]
    assert batch.excluded[0].trajectory.failures[0].message == "RuntimeError: bug in the flow"
    assert batch.metrics()["infrastructure_failures"] == 2 and batch.rewards().tolist() == [1.0, 1.0]
    assert any(r.exc_info and "crashed" in r.getMessage() for r in caplog.records)


async def test_a_scorer_crash_is_excluded_never_a_reward():
    unparseable_gold = Question("q3", "One plus one?", "two", "math")  # math-verify cannot parse the gold
    batch = await run_rollouts(flow(lambda m: "<answer>2</answer>"), [unparseable_gold, QUESTIONS[0]],
                               group_size=1, concurrency=1)
    assert [r.trajectory_id for r in batch.excluded] == ["q3#0"] and len(batch.rollouts) == 1
    assert batch.excluded[0].trajectory.answer == "2"  # the finished trajectory is kept


def test_the_right_tool_is_per_turn_for_a_sequence_and_the_same_for_a_single_tool() -> None:
    two = Question("q", "Atomic number of zinc times 3?", "90", "cover_em", {"tools": ["wikipedia_search", "python"]})
    assert [expected_tool(two, turn) for turn in (1, 2, 3)] == ["wikipedia_search", "python", None]
    assert expected_tool(QUESTIONS[1], 1) == expected_tool(QUESTIONS[1], 2) == "python"
    assert expected_tool(Question("q", "?", "a", "exact_match"), 1) is None


async def test_a_tool_not_picked_is_recorded_as_zero_every_step():
    """Regression (issue 19): a tool's share was logged only when the tool was picked, so the viewer's line
    stopped where the planner abandoned the tool while `train plot` drew 0."""
    config = FlowConfig.from_dict({
        "engines": {"policy": {"kind": "transformers"}, "helper": {"kind": "llamacpp"}},
        "roles": {"planner": {"engine": "policy"}, "executor": {"engine": "helper"},
                  "verifier": {"engine": "helper"}, "generator": {"engine": "helper"},
                  "tools": {"engine": "helper"}},
        "tools": {"base_generator": {}, "python": {}}, "limits": {"max_turns": 1}, "query_analysis": False,
        "verify": False, "planner_stop": True})
    helper = ScriptedEngine(lambda m: "<answer>Paris</answer>" if "final answer" in m[0]["content"]
                            else '{"prompt": "hello"}')
    batch = await run_rollouts(Flow.from_config(config, engines={"policy": TokenEngine(PLAN), "helper": helper}),
                               QUESTIONS[:1], group_size=2, concurrency=2)
    metrics = batch.metrics()
    assert metrics["tool/base_generator"] == 1.0 and metrics["tool/python"] == 0.0 and metrics["tool/invalid"] == 0
    assert metrics["tool/turn1/base_generator"] == 1.0 and metrics["tool/turn1/python"] == 0.0
    assert metrics["tool/answer"] == 0.0 and metrics["tool/turn1/answer"] == 0.0  # the planner's stop action too
    assert [metrics[f"menu_position/turn1/{k}"] for k in (1, 2, 3)] == [1.0, 0.0, 0.0]  # the menu unshuffled


def test_the_menu_position_of_each_turns_pick_is_counted_among_its_valid_picks() -> None:
    def trajectory(*turns: tuple[str, list[str], bool]) -> Trajectory:
        return Trajectory(question="q", turns=[Turn(index=i, tool=tool, menu=menu, tool_valid=valid)
                                               for i, (tool, menu, valid) in enumerate(turns, 1)])

    abc, cab = ["a", "b", "c"], ["c", "a", "b"]
    metrics = menu_position_metrics([
        trajectory(("a", abc, True), ("b", abc, True)),   # turn 1 first-listed, turn 2 second
        trajectory(("c", cab, True)),                     # first-listed
        trajectory(("b", cab, True)),                     # third
        trajectory(("a", abc, True)),                     # first
        trajectory(("zz", abc, False)),                   # an invalid pick has no position
        trajectory(("a", [], True)),                      # a record without its menu is left out
    ])
    assert metrics == {"menu_position/turn1/1": 0.75, "menu_position/turn1/2": 0.0, "menu_position/turn1/3": 0.25,
                       "menu_position/turn2/1": 0.0, "menu_position/turn2/2": 1.0, "menu_position/turn2/3": 0.0}
    assert menu_position_metrics([trajectory(("a", [], True))]) == {}


@pytest.mark.parametrize(("tools", "answer", "value"), [
    (["python"], "4", 1.0),
    (["python", "wikipedia_search"], "4", 0.75),
    (["python", "nonsense", "answer"], "4", 0.75),   # an invalid tool is a call; the stop action is not
    (["python", "python", "python"], "4", 0.5),
    (["answer"], "4", 1.0),
    (["python", "python"], "5", 0.0),                # a wrong answer stays 0
])
def test_tool_call_cost_takes_off_each_call_after_the_first(tools, answer, value):
    question = Question("q", "Two plus two?", "4", "exact_match", {})
    trajectory = Trajectory(question=question.question, answer=answer,
                            turns=[Turn(index=i, tool=t, tool_valid=t != "nonsense") for i, t in enumerate(tools, 1)])
    score = score_trajectory(question, trajectory, tool_call_cost=0.25)
    assert score.value == value and score.correct == (answer == "4")
    assert score_trajectory(question, trajectory).value == float(answer == "4")


def test_answer_is_a_call_where_the_flow_offers_no_stop():
    """Without `planner_stop` the flow marks a planner's `answer` invalid and runs no stop: a wasted turn."""
    question = Question("q", "Two plus two?", "4", "exact_match", {})
    turns = [Turn(index=1, tool="python", tool_valid=True), Turn(index=2, tool="answer", tool_valid=False)]
    trajectory = Trajectory(question=question.question, answer="4", turns=turns)
    assert score_trajectory(question, trajectory, tool_call_cost=0.25).value == 0.75
