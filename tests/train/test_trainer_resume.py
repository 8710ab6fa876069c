"""The trainer on a tiny random policy (fast): a seeded run is reproducible when rollouts run one at a time,
and a resumed run draws exactly what the uninterrupted run drew (data order and the policy's sampling stream,
both restored from the checkpoint)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentflow.config import TransformersEngineConfig
from agentflow.engines.hf import TransformersEngine
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError
from agentflow.train.config import TrainConfig
from agentflow.train.trainer import Trainer
from tests.engines.test_constrained import byte_tokenizer


def policy() -> TransformersEngine:
    """A tiny random Llama over a byte tokenizer, long enough a context for the planner's prompt."""
    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)).eval()
    return TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=8), model=model,
                              tokenizer=tokenizer)


def helper() -> ScriptedEngine:
    """Executor and generator; whether the generator answers right depends on the steps it reads."""

    def reply(messages):
        system = messages[0]["content"]
        if "final answer" in system:
            question = re.search(r"Question: (.*)", messages[-1]["content"]).group(1)
            right = sum(map(ord, messages[-1]["content"])) % 2
            return f"<answer>{question.split()[-1].rstrip('?') if right else 'no'}</answer>"
        return '{"query": "x"}'

    return ScriptedEngine(reply)


def config(tmp_path: Path, run: str, steps: int) -> TrainConfig:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Repeat the word w{i}?", "answer": f"w{i}",
                                        "reward": "exact_match"}) + "\n" for i in range(5)))
    return TrainConfig.from_dict({
        "flow": {
            "engines": {"policy": {"kind": "transformers", "device": "cpu"}, "helper": {"kind": "llamacpp"}},
            "roles": {"planner": {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 40}},
                      "executor": {"engine": "helper"}, "verifier": {"engine": "helper"},
                      "generator": {"engine": "helper"}, "tools": {"engine": "helper"}},
            "tools": {"wikipedia_search": {}, "base_generator": {}}, "limits": {"max_turns": 1},
            "query_analysis": False, "verify": False},
        "data": {"train_path": str(data), "eval_path": str(data)}, "lora": {"enabled": False},
        "batch_size": 2, "group_size": 3, "max_steps": steps, "learning_rate": 1e-2, "kl_coef": 0.0,
        "rollout_concurrency": 1, "save_every": 1, "eval_every": 0, "eval_at_start": False, "eval_size": 1,
        "export_gguf": False, "seed": 7, "output_dir": str(tmp_path / run)})


def drawn(run: Path, step: int) -> list[tuple[str, list[str]]]:
    """(question, planner replies) of every trajectory of a step, in the order they ran."""
    lines = (run / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()
    return [(record["group"], record["planner"]) for record in map(json.loads, lines)]


@pytest.fixture(autouse=True)
def one_thread() -> object:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(tmp_path: Path) -> None:
    Trainer(config(tmp_path, "whole", 3), engines={"policy": policy(), "helper": helper()}).run()
    Trainer(config(tmp_path, "again", 3), engines={"policy": policy(), "helper": helper()}).run()
    whole, again = tmp_path / "whole", tmp_path / "again"
    # a seeded run whose rollouts run one at a time is reproducible: the same questions, the same samples
    assert [drawn(whole, s) for s in (1, 2, 3)] == [drawn(again, s) for s in (1, 2, 3)]
    assert len({reply for _, replies in drawn(whole, 2) for reply in replies}) > 1  # samples, not one reply
    assert any(any(record["advantages"]) for record in map(json.loads, (whole / "rollouts" / "step-000001.jsonl")
                                                                   .read_text().splitlines()))  # it learns

    Trainer(config(tmp_path, "cut", 2), engines={"policy": policy(), "helper": helper()}).run()
    resumed = config(tmp_path, "cut", 3)
    Trainer(resumed, engines={"policy": policy(), "helper": helper()}).run(resume=True)
    assert drawn(tmp_path / "cut", 3) == drawn(whole, 3)


def test_a_resumed_run_goes_on_with_the_adapted_entropy_weight(tmp_path: Path) -> None:
    """action_entropy_target: the weight each update used is logged, it moves one step a step (here up: the
    target is above any entropy), and a resumed run continues from the checkpoint's weight, not the config's."""

    def adaptive(run: str, steps: int) -> TrainConfig:
        return config(tmp_path, run, steps).model_copy(update={
            "action_entropy_coef": 0.1, "action_entropy_target": 10.0, "action_entropy_coef_step": 0.02,
            "action_entropy_rows": "all"})

    def weights(run: str) -> list[float]:
        rows = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [round(row["action_entropy_coef"], 6) for row in rows if "action_entropy_coef" in row]

    Trainer(adaptive("whole", 3), engines={"policy": policy(), "helper": helper()}).run()
    assert weights("whole") == [0.1, 0.12, 0.14]
    Trainer(adaptive("cut", 2), engines={"policy": policy(), "helper": helper()}).run()
    Trainer(adaptive("cut", 3), engines={"policy": policy(), "helper": helper()}).run(resume=True)
    assert weights("cut") == weights("whole")


def test_a_run_resumed_after_its_last_step_evaluates_it_once(tmp_path: Path) -> None:
    """Killed during its final evaluation (the last checkpoint is at max_steps, no evaluation file): --resume
    evaluates; resumed again, it does not evaluate twice. The same evaluates a checkpoint with --max-steps N."""
    Trainer(config(tmp_path, "run", 2), engines={"policy": policy(), "helper": helper()}).run()
    run = tmp_path / "run"
    final = run / "eval" / "step-2.jsonl"
    assert final.is_file() and (run / "checkpoints" / "step-000001").is_dir()
    final.unlink()
    Trainer(config(tmp_path, "run", 2), engines={"policy": policy(), "helper": helper()}).run(resume=True)
    assert final.is_file() and not list((run / "eval").glob("*.partial"))
    evaluated = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/accuracy" in row for row in evaluated) == 2  # the first run's and the resumed one's
    Trainer(config(tmp_path, "run", 2), engines={"policy": policy(), "helper": helper()}).run(resume=True)
    evaluated = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/accuracy" in row for row in evaluated) == 2


def test_a_fresh_run_refuses_a_directory_that_holds_a_run(tmp_path: Path) -> None:
    """Started again without --resume (the mistake is one forgotten flag), a run would redraw step 1 over the
    finished run's rollouts and append to its metrics: it stops before writing anything, and says why."""
    Trainer(config(tmp_path, "run", 2), engines={"policy": policy(), "helper": helper()}).run()
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="already holds a run .*step-000002.*--resume"):
        Trainer(config(tmp_path, "run", 3), engines={"policy": policy(), "helper": helper()}).run()
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # a directory holding only another run's metrics (no checkpoint yet) is refused too; an empty one is not
    metrics_only = tmp_path / "metrics_only"
    metrics_only.mkdir()
    (metrics_only / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        Trainer(config(tmp_path, "metrics_only", 1), engines={"policy": policy(), "helper": helper()}).run()
    (tmp_path / "empty").mkdir()
    Trainer(config(tmp_path, "empty", 1), engines={"policy": policy(), "helper": helper()}).run()
    assert (tmp_path / "empty" / "checkpoints" / "step-000001").is_dir()
