"""The verl shim against the installed verl (skipped where verl is not installed; runs in a `[verl]` env).

The agent loop is instantiated exactly as verl's worker does it (hydra, from our registration file), reads
a dataset row produced by verl's own `RLHFDataset` from our parquet, tokenises through verl's chat-template
path, and talks to a fake rollout server; the frozen roles sit behind a real HTTP OpenAI-compatible server.
Then verl's own v1 advantage code runs on the outputs and must give our registry's numbers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl.experimental.agent_loop", reason="verl is not installed (pip install '.[verl]')")
pytest.importorskip("transfer_queue", reason="verl's v1 trainer needs TransferQueue (the [verl] extra)")

import hydra  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

import agentflow.verl.plugin  # noqa: E402, F401
from agentflow.verl import agent_loop as shim  # noqa: E402
from agentflow.verl.config import ESTIMATORS, agent_loop_config_path  # noqa: E402
from agentflow.verl.data import write_parquet  # noqa: E402
from agentflow.verl.launch import build_verl_config  # noqa: E402
from tests.conftest import role_of  # noqa: E402
from tests.servers import Answer, chat_json, fake_openai_server  # noqa: E402
from tests.verl.fakes import FakeRolloutServer, TokenOutput, plan, tiny_hf_tokenizer  # noqa: E402
from tests.verl.helpers import question, registry_advantages, verl_config  # noqa: E402

CONTINUE = json.dumps({"analysis": "more", "conclusion": "CONTINUE"})
STOP = json.dumps({"analysis": "done", "conclusion": "STOP"})


def frozen_step(request: dict[str, Any]) -> Answer:
    """The frozen OpenAI-compatible server: echo arguments, STOP once a sub-goal says so, answer by memory."""
    messages = request["messages"]
    role, text = role_of(messages), messages[-1]["content"]
    if role == "executor":
        content = json.dumps({"query": "x"})
    elif role == "verifier":
        content = STOP if "STOP" in text else CONTINUE
    else:
        content = "<answer>Paris</answer>" if "right" in text else "<answer>Rome</answer>"
    return Answer(body=json.dumps(chat_json(content)).encode())


@pytest.fixture
def frozen_url():
    with fake_openai_server(frozen_step) as server:
        yield server.base_url


def build(tmp_path: Path, frozen_url: str, **overrides: Any):
    """Our config -> verl's full config, the dataset row kwargs, the tokenizer."""
    cfg = verl_config(tmp_path, **overrides)
    raw = cfg.model_dump(mode="json")
    raw["flow"]["engines"]["frozen"]["base_url"] = frozen_url
    raw["flow"]["tools"] = {"echo_tool": {}}
    cfg = type(cfg).model_validate(raw)
    train_file = write_parquet([question()], tmp_path / "train.parquet")
    config = build_verl_config(cfg, train_file=train_file, eval_file=train_file)
    tokenizer = tiny_hf_tokenizer()
    dataset = RLHFDataset(data_files=[str(train_file)], tokenizer=tokenizer, config=config.data)
    return cfg, config, tokenizer, dataset[0]


def instantiate(config, tokenizer, server) -> Any:
    """As verl's AgentLoopWorker._run_agent_loop builds an agent loop from the registration file."""
    registration = next(c for c in OmegaConf.load(agent_loop_config_path()) if c.name == "agentflow")
    return hydra.utils.instantiate(
        config=registration, trainer_config=DictConfigWrap(config=config), server_manager=server,
        tokenizer=tokenizer, processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))


@pytest.fixture(autouse=True)
def echo_tool_registered(monkeypatch):
    """The flow built inside the agent loop creates tools by name: register the test's echo tool."""
    from agentflow.tools import base
    from tests.conftest import EchoTool

    class EchoToolRegistered(EchoTool):
        name = "echo_tool"

    monkeypatch.setitem(base._REGISTRY, "echo_tool", EchoToolRegistered)
    shim._RUNNERS.clear()
    yield
    shim._RUNNERS.clear()


def token_server(tokenizer, plans: dict[str, list[str]] | None = None) -> FakeRolloutServer:
    """Replies with the tokenizer's ids of a plan, then EOS; plans per session (in request order)."""
    server = FakeRolloutServer()
    sessions: dict[str, int] = {}

    def reply(request):
        if plans is None:
            text = plan(sub_goal="rightSTOP")
        else:
            session = sessions.setdefault(request.request_id, len(sessions))
            n = sum(1 for r in server.requests if r.request_id == request.request_id)
            sub_goal = list(plans.values())[session][n - 1]
            if sub_goal == "down":
                return RuntimeError("replica lost")
            if sub_goal == "empty":
                return TokenOutput(token_ids=[], log_probs=[], extra_fields={"min_global_steps": 7})
            text = plan(sub_goal=sub_goal)
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids),
                           extra_fields={"global_steps": 7, "min_global_steps": 7, "max_global_steps": 7})

    server.reply = reply
    return server


async def test_agent_loop_returns_one_verl_output_per_planner_turn(tmp_path: Path, frozen_url: str) -> None:
    cfg, config, tokenizer, row = build(tmp_path, frozen_url)
    server = token_server(tokenizer, {"s0": ["a", "rightSTOP"]})
    loop = instantiate(config, tokenizer, server)
    outputs = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                              "logprobs": True}, **row, uid="u1", session_id=0, global_steps=7)

    assert len(outputs) == 2 and all(isinstance(o, AgentLoopOutput) for o in outputs)
    for output, request in zip(outputs, server.requests, strict=True):
        assert output.prompt_ids == request.prompt_ids
        # the prompt ids are verl's chat template applied to the planner's messages, once
        assert tokenizer.decode(output.prompt_ids).startswith("<|im_start|>system\nYou are the planner")
        assert output.response_ids[-1] == tokenizer.eos_token_id
        assert output.response_mask == [1] * len(output.response_ids)
        assert output.response_logprobs == [-0.5] * len(output.response_ids)
        assert output.reward_score == 1.0 and output.num_turns == 2
        assert output.extra_fields["reward_extra_info"] == {"acc": 1.0, "planner_turns": 2}
        assert output.extra_fields["min_global_steps"] == 7
        # what verl's v1 worker stores: rm_scores carry the reward on the last response token
        stored = output.as_dict()
        assert stored["rm_scores"][-1] == 1.0 and stored["rm_scores"][:-1].abs().sum() == 0
        assert torch.equal(stored["rollout_log_probs"], torch.tensor(output.response_logprobs))
    assert [o.extra_fields["agentflow_turn"] for o in outputs] == [1, 2]


async def test_failed_trajectory_returns_no_output(tmp_path: Path, frozen_url: str) -> None:
    cfg, config, tokenizer, row = build(tmp_path, frozen_url)
    server = token_server(tokenizer, {"s0": ["down"]})
    loop = instantiate(config, tokenizer, server)
    outputs = await loop.run({"temperature": 1.0}, **row, uid="u1", session_id=0, global_steps=1)
    assert outputs == []
    assert sum(loop.runner.stats.excluded.values()) == 1


def verl_batch(sessions: list[list[AgentLoopOutput]], uid: str) -> tuple[DataProto, list[str]]:
    """What verl's v1 `_compute_advantage` reads from TransferQueue, padded: one row per output."""
    fields, keys = [], []
    for session, outputs in enumerate(sessions):
        for index, output in enumerate(outputs):
            fields.append(output.as_dict())
            keys.append(f"{uid}_{session}_{index}")
    width = max(len(f["responses"]) for f in fields)

    def pad(name: str) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(f[name], (0, width - len(f[name]))) for f in fields])

    data = DataProto.from_dict(tensors={"response_mask": pad("response_mask"), "token_level_scores": pad("rm_scores"),
                                        "token_level_rewards": pad("rm_scores")},
                               non_tensors={"uid": np.array([uid] * len(fields), dtype=object)})
    return data, keys


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
async def test_verls_advantages_equal_our_registrys(tmp_path: Path, frozen_url: str, estimator: str) -> None:
    """G=5 sessions of one question: 2 right, 1 wrong, 1 failed (excluded), 1 wrong without a trainable turn
    (three empty replies: one masked placeholder row). verl's own v1 advantage code on our outputs gives, on
    every trainable row, the advantage our estimator registry gives (the single-machine numbers)."""
    cfg, config, tokenizer, row = build(tmp_path, frozen_url, advantage=estimator)
    plans = {"s0": ["a", "rightSTOP"], "s1": ["rightSTOP"], "s2": ["a", "b", "c"], "s3": ["down"],
             "s4": ["empty", "empty", "empty"]}
    server = token_server(tokenizer, plans)

    async def session(index: int):
        loop = instantiate(config, tokenizer, server)
        outputs = await loop.run({"temperature": 1.0}, **row, uid="u1", session_id=index, global_steps=1)
        return loop, outputs

    runs = [await session(i) for i in range(len(plans))]  # sequential: the fake server numbers sessions
    sessions = [outputs for _, outputs in runs if outputs]
    assert [len(o) for o in sessions] == [2, 1, 3, 1]
    assert sessions[3][0].response_mask == [0] and sessions[3][0].reward_score == 0.0

    data, keys = verl_batch(sessions, "u1")
    mapped = ESTIMATORS[estimator]
    result = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=mapped["algorithm.adv_estimator"],
        num_repeat=cfg.group_size, norm_adv_by_std_in_grpo=mapped["algorithm.norm_adv_by_std_in_grpo"],
        config=config.algorithm)
    advantages = result.batch["advantages"]
    mask = data.batch["response_mask"]
    # one advantage per row, on exactly its response tokens
    per_row = [advantages[i][mask[i].bool()] for i in range(len(keys)) if mask[i].any()]
    assert all(torch.allclose(v, v[0].expand_as(v)) for v in per_row)
    assert torch.all(advantages[~mask.bool()] == 0)
    got = [v[0].item() for v in per_row]
    assert min(got) < 0 < max(got)

    results = runner_results(runs)
    expected = [value for values in registry_advantages(results, estimator) for value in values]
    assert got == pytest.approx(expected, abs=1e-4)


def runner_results(runs) -> list:
    """Re-derive each session's TrajectoryResult from its outputs (rows, reward) for the registry."""
    from agentflow.scoring.base import Score
    from agentflow.verl.rows import TrajectoryRows, TurnRow
    from agentflow.verl.runner import TrajectoryResult

    results = []
    for _, outputs in runs:
        if not outputs:
            results.append(TrajectoryResult(question=question(), trajectory=None, score=None, rows=None,
                                            excluded="engine_server_error"))
            continue
        rows = [TurnRow(o.extra_fields["agentflow_turn"], o.prompt_ids, o.response_ids, o.response_mask,
                        o.response_logprobs) for o in outputs]
        value = outputs[0].reward_score
        results.append(TrajectoryResult(question=question(), trajectory=None, rows=TrajectoryRows(rows),
                                        score=Score(correct=value == 1.0, value=value)))
    return results


def test_sessions_run_concurrently_on_one_worker_event_loop(tmp_path: Path, frozen_url: str) -> None:
    """verl runs the n sessions of a prompt as concurrent tasks on the worker's loop: bindings stay apart."""
    cfg, config, tokenizer, row = build(tmp_path, frozen_url, limits={"max_turns": 1})
    server = token_server(tokenizer)

    async def main():
        loops = [instantiate(config, tokenizer, server) for _ in range(4)]
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row, uid="u1", session_id=i,
                                               global_steps=1) for i, loop in enumerate(loops)))

    results = asyncio.run(main())
    assert [len(r) for r in results] == [1, 1, 1, 1]
    assert len({r.request_id for r in server.requests}) == 4
    assert len(shim._RUNNERS) == 1  # one runner (flow, tools, engines) per worker process and config


async def test_outputs_pass_verls_transfer_queue_postprocessing(tmp_path: Path, frozen_url: str, monkeypatch) -> None:
    """verl's v1 worker turns each session's outputs into TransferQueue rows `{uid}_{session}_{index}` with
    tags; run that real code (the store itself is captured) on our outputs."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    cfg, config, tokenizer, row = build(tmp_path, frozen_url)
    server = token_server(tokenizer, {"s0": ["a", "rightSTOP"]})
    outputs = await instantiate(config, tokenizer, server).run({"temperature": 1.0}, **row, uid="u9",
                                                              session_id=3, global_steps=5)
    stored: dict[str, Any] = {}

    async def kv_batch_put(*, keys, fields, tags, partition_id):
        stored.update(keys=keys, fields=fields, tags=tags, partition=partition_id)

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.processor = None
    worker.tokenizer = tokenizer
    await worker._agent_loop_postprocess(outputs, False, **row, uid="u9", session_id=3, global_steps=5)

    assert stored["keys"] == ["u9_3_0", "u9_3_1"] and stored["partition"] == "train"
    assert [t["status"] for t in stored["tags"]] == ["success", "success"]
    assert all(t["min_global_steps"] == t["max_global_steps"] == 7 for t in stored["tags"])
    fields = stored["fields"]
    for i, output in enumerate(outputs):
        assert fields["responses"][i].tolist() == output.response_ids
        assert fields["loss_mask"][i].tolist() == output.response_mask
        assert fields["rm_scores"][i].tolist()[-1] == 1.0
        assert fields["input_ids"][i].tolist() == output.prompt_ids + output.response_ids
