"""Runs for the viewer's tests: eval runs made by the real `Flow` and eval runner with scripted engines whose
replies are hostile HTML, and training run directories in the trainer's present and coming formats."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from agentflow.config import FlowConfig
from agentflow.engines.base import Message
from agentflow.eval.runner import EvalSettings, run_eval
from agentflow.flow import Flow
from agentflow.trajectory import Trajectory
from tests.conftest import EchoTool, role_engine

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src="x" onerror="window.__pwned = 2">'
QUESTIONS = [
    {"pid": "1", "question": "What is the capital of France?", "answer": "Paris"},
    {"pid": "2", "question": f"Which tag is this: {SCRIPT}?", "answer": "script"},
    {"pid": "3", "question": "Who wrote Hamlet?", "answer": "Shakespeare"},
]


def hostile_flow(answer: Callable[[str], str]) -> Flow:
    """The real flow; every model reply carries markup that a careless page would run."""

    def generator(messages: list[Message]) -> str:
        return f"thinking {IMG}<answer>{answer(messages[-1]['content'])}</answer>"

    engine = role_engine(
        analysis=[f"The question wants a name. {SCRIPT}"],
        planner=[json.dumps({"tool_name": "echo", "sub_goal": f"look it up {SCRIPT}", "context": "<b>ctx</b>"})],
        executor=[json.dumps({"query": f"hello {IMG} [/x]"})],
        verifier=[json.dumps({"analysis": "enough <i>ok</i>", "conclusion": "STOP"})],
        generator=[generator],
    )
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "limits": {"max_turns": 2}})
    return Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()})


def eval_run(out: Path, answer: Callable[[str], str], *, questions: list[dict[str, Any]] | None = None,
             flow_config: FlowConfig | None = None) -> Path:
    """An eval run directory written by the eval runner around the scripted flow; `flow_config` is the
    configuration recorded in its config.json (default: the bundled one)."""
    bench = out.parent / "quiz.jsonl"
    bench.write_text("".join(json.dumps(q) + "\n" for q in questions or QUESTIONS))
    settings = EvalSettings(benches=[str(bench)], out=out, concurrency=2)
    run_eval(settings, console=Console(file=io.StringIO()), solver=hostile_flow(answer), flow_config=flow_config)
    return out


def trained_flow_config(adapter: str = "runs/demo/final/adapter") -> FlowConfig:
    """The bundled flow with its planner on a transformers engine carrying a LoRA adapter (a trained run)."""
    from agentflow.config import bundled_flow_config

    raw = bundled_flow_config().model_dump(mode="json")
    raw["engines"]["policy"] = {"kind": "transformers", "adapter": adapter}
    raw["roles"]["planner"]["engine"] = "policy"
    return FlowConfig.from_dict(raw)


def right_on_france(question: str) -> str:
    return "Paris" if "France" in question else f"{SCRIPT} no idea"


def right_on_hamlet(question: str) -> str:
    return "Shakespeare" if "Hamlet" in question else f"{SCRIPT} no idea"


def trajectory_dict(question: str, answer: str) -> dict[str, Any]:
    """A small trajectory in the documented format (docs/trajectory.md)."""
    return Trajectory.model_validate({
        "question": question, "answer": answer, "raw_answer": f"<answer>{answer}</answer>",
        "stop_reason": "verifier_stop", "tools": ["python"],
        "turns": [{"index": 1, "sub_goal": "compute it", "tool": "python", "tool_valid": True,
                   "planner": {"role": "planner", "engine": {"engine": "transformers", "model": "m"},
                               "sampling": {"temperature": 1.0}, "messages": [{"role": "user", "content": question}],
                               "completion": {"text": '{"tool_name": "python"}', "prompt_token_ids": [1, 2, 3],
                                              "token_ids": [4, 5], "logprobs": [-0.1, -0.2]}},
                   "tool_call": {"tool": "python", "arguments": {"code": "print(6*7)"}, "output": "42"},
                   "verdict": "STOP", "verdict_parsed": True}],
    }).model_dump(mode="json")


def train_run(out: Path, *, new_format: bool, steps: int = 2) -> Path:
    """A training run directory as `agentflow train --out` writes it (new_format: group, advantages, failure,
    trajectory per rollout line and per-turn tool shares in metrics)."""
    (out / "rollouts").mkdir(parents=True)
    (out / "eval").mkdir()
    (out / "config.json").write_text(json.dumps({"algorithm": "grpo", "batch_size": 2, "group_size": 2,
                                                 "max_steps": steps, "learning_rate": 1e-5, "kl_coef": 0.01}))
    metrics = []
    for step in range(1, steps + 1):
        record: dict[str, Any] = {"step": step, "reward_mean": 0.25 * step, "accuracy": 0.25 * step,
                                  "no_signal_share": 0.5, "kl_ref": 0.01 * step, "entropy": 1.2,
                                  "clip_fraction": 0.0, "approx_kl": 0.001, "grad_norm": 0.5,
                                  "tool/python": 0.75, "tool/wikipedia_search": 0.25,
                                  "seconds/rollout": 10.0, "seconds/update": 5.0, "seconds/step": 15.5,
                                  "loss": float("nan") if step == 1 else 0.1}
        if new_format:
            record.update({"tool/turn1/python": 1.0, "tool/turn2/wikipedia_search": 1.0, "excluded_share": 0.0,
                           "menu_position/turn1/1": 0.75, "menu_position/turn1/2": 0.25})
        metrics.append(record)
        metrics.append({"step": step, "eval/accuracy_all": 0.4 + 0.1 * step, "eval/accuracy/arithmetic": 0.5})
        lines = []
        for group, (question, gold) in enumerate((("What is 6*7?", "42"), (f"Say {SCRIPT}", "x"))):
            for index in range(2):
                answer = gold if index == 0 else f"{IMG} wrong"
                line: dict[str, Any] = {"id": f"q{group}#{index}", "question": question, "gold": gold,
                                        "planner": ['{"tool_name": "python"}', '{"tool_name": "wikipedia_search"}'],
                                        "tools": ["python", "wikipedia_search"], "answer": answer,
                                        "reward": 1.0 if index == 0 else 0.0, "infrastructure": None}
                if new_format:
                    line.update({"group": f"q{group}", "advantages": [0.7071, 0.7071] if index == 0 else [-0.7071,
                                                                                                        -0.7071],
                                 "failure": None, "trajectory": trajectory_dict(question, answer)})
                lines.append(line)
        (out / "rollouts" / f"step-{step:06d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        (out / "eval" / f"step-{step}.jsonl").write_text(json.dumps(
            {"id": "h1", "question": "What is 2+2?", "gold": "4", "answer": "4", "correct": True,
             "tools": ["python"], "infrastructure": None}) + "\n")
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return out
