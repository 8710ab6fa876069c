"""Training any module: one LoRA adapter per trained role over one base (`train_roles`), on a tiny random policy
saved as a checkpoint (fast), plus one real-model test with two adapters (slow)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
import torch

from agentflow.config import FlowConfig, TransformersEngineConfig
from agentflow.engines.hf import BASE_ADAPTER, AdapterView, TransformersEngine, load_policy
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError
from agentflow.flow import Flow
from agentflow.train.advantages import role_advantages
from agentflow.train.config import TrainConfig
from agentflow.train.rollout import TurnRow
from agentflow.train.trainer import Trainer
from agentflow.train.update import PolicyUpdater, UpdateBatch
from tests.train import test_trainer_resume as tiny
from tests.train.test_engine_rollout import RecordingEngine


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama of the resume tests, saved where `model:` loads it (the trainer adds adapters)."""
    folder = tmp_path_factory.mktemp("tiny_base")
    engine = tiny.policy()
    engine.model.save_pretrained(str(folder))
    engine.tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(autouse=True)
def restore_threads() -> object:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def helper() -> ScriptedEngine:
    """The generator only (the executor is trained here): right or wrong by what it reads, so groups differ."""

    def reply(messages):
        text = messages[-1]["content"]
        right = hashlib.sha256(text.encode()).digest()[0] % 2  # (a sum of characters: the steps repeat the query)
        word = text.split("Question: ")[-1].split("\n")[0].split()[-1].rstrip("?")
        return f"<answer>{word if right else 'no'}</answer>"

    return ScriptedEngine(reply)


def config(tmp_path: Path, base: Path, run: str, steps: int, **extra) -> TrainConfig:
    raw = tiny.config(tmp_path, run, steps).model_dump()
    raw["flow"]["engines"]["policy"] = {"kind": "transformers", "device": "cpu", "model": str(base)}
    # the random policy's strings end only where a schema bounds them: short sub-goals end the planner's
    # reply; the executor's query never ends in 16 tokens, and the flow falls back to the sub-goal as query
    raw["flow"]["roles"]["planner"]["sampling"]["max_tokens"] = 100
    raw["flow"]["limits"]["plan_chars"] = 8
    raw["flow"]["roles"]["executor"] = {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 16}}
    raw["flow"]["tools"] = {"wikipedia_search": {}}
    raw.update({"lora": {"enabled": True, "rank": 4, "alpha": 8}, "train_roles": ["planner", "executor"],
                "learning_rate": 5e-2, **extra})
    return TrainConfig.from_dict(raw)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def lora_b(weights: dict[str, torch.Tensor], adapter: str) -> list[torch.Tensor]:
    return [v for k, v in weights.items() if "lora_B" in k and f".{adapter}." in k]


def test_two_roles_learn_into_their_own_adapters_and_export_apart(tmp_path: Path, base: Path) -> None:
    cfg = config(tmp_path, base, "two", 2)
    Trainer(cfg, engines={"helper": helper()}).run()
    run = tmp_path / "two"
    steps = [m for m in metrics(run) if "seconds/rollout" in m]
    assert steps and all("executor/rows" in m and "rows" in m for m in steps)
    assert any(m["executor/rows"] > 0 for m in steps) and any(m["rows"] > 0 for m in steps)
    assert all(m["executor/lr"] == m["lr"] for m in steps)
    records = [json.loads(line) for line in (run / "rollouts" / "step-000001.jsonl").read_text().splitlines()]
    # every trajectory's executor calls are its executor rows; both roles got the trajectory's advantage
    for record in records:
        calls = [t["executor"] for t in record["trajectory"]["turns"] if t.get("executor")]
        assert len(record["role_advantages"]["executor"]) == len(calls)
        assert set(record["role_advantages"]["executor"]) <= set(record["role_advantages"]["planner"])
    weights = torch.load(run / "checkpoints" / "step-000002" / "trainable.pt", weights_only=True)
    assert lora_b(weights, "default") and lora_b(weights, "executor")
    assert any(v.abs().sum() > 0 for v in lora_b(weights, "default"))   # LoRA B starts at 0: both moved
    assert any(v.abs().sum() > 0 for v in lora_b(weights, "executor"))
    assert (run / "checkpoints" / "step-000002" / "optimizer-executor.pt").is_file()
    # the held-out records keep each turn's call as the executor wrote it and what it returned (its own measure)
    [held_out] = [json.loads(line) for line in (run / "eval" / "step-2.jsonl").read_text().splitlines()]
    [call] = held_out["calls"]
    assert set(call) == {"arguments", "output", "error"} and set(call["arguments"]) == {"query"}
    assert call["output"] and len(call["output"]) <= 300
    # each role's adapter loads alone over the base, with the weights it was trained to
    for role, adapter, folder in (("planner", "default", run / "final"), ("executor", "executor",
                                                                          run / "final" / "executor")):
        model, _ = load_policy(TransformersEngineConfig(model=str(base), adapter=str(folder / "adapter")))
        loaded = {k.replace(".default.", f".{adapter}."): v for k, v in model.named_parameters() if "lora_B" in k}
        trained = {k: v for k, v in weights.items() if "lora_B" in k and f".{adapter}." in k}
        assert loaded.keys() == trained.keys(), role
        assert all(torch.equal(loaded[k].detach(), trained[k]) for k in trained), role
        assert (folder / "model" / "config.json").is_file()


def test_a_resumed_two_role_run_matches_the_uninterrupted_one(tmp_path: Path, base: Path) -> None:
    Trainer(config(tmp_path, base, "whole", 3), engines={"helper": helper()}).run()
    Trainer(config(tmp_path, base, "cut", 2), engines={"helper": helper()}).run()
    Trainer(config(tmp_path, base, "cut", 3), engines={"helper": helper()}).run(resume=True)
    assert tiny.drawn(tmp_path / "cut", 3) == tiny.drawn(tmp_path / "whole", 3)
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "step-000003" / "trainable.pt", weights_only=True)
    cut = torch.load(tmp_path / "cut" / "checkpoints" / "step-000003" / "trainable.pt", weights_only=True)
    assert whole.keys() == cut.keys() and all(torch.allclose(whole[k], cut[k], atol=1e-6) for k in whole)
    for role in ("", "-executor"):
        a = torch.load(tmp_path / "whole" / "checkpoints" / "step-000003" / f"optimizer{role}.pt", weights_only=False)
        b = torch.load(tmp_path / "cut" / "checkpoints" / "step-000003" / f"optimizer{role}.pt", weights_only=False)
        assert [s["step"] for s in a["state"].values()] == [s["step"] for s in b["state"].values()]


def two_adapter_model(base: Path) -> tuple[torch.nn.Module, TransformersEngine]:
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_policy(TransformersEngineConfig(model=str(base)), trainable=True)

    def lora() -> LoraConfig:
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    model = get_peft_model(model, lora(), adapter_name="default")
    model.add_adapter("executor", lora())
    model.eval()
    return model, TransformersEngine(TransformersEngineConfig(device="cpu"), model=model, tokenizer=tokenizer)


def test_a_roles_rows_move_only_its_own_adapter(tmp_path: Path, base: Path) -> None:
    model, engine = two_adapter_model(base)
    cfg = config(tmp_path, base, "unused", 1)
    ids = engine.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    rows = [TurnRow(0, ids, ids[:4], [-1.0] * 4, role="executor"), TurnRow(1, ids, ids[2:6], [-1.0] * 4,
                                                                           role="executor")]
    batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0]), row_group=["q", "q"],
                        trajectories={"q": 2})
    before = {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}
    named = dict(model.named_parameters())
    optimizer = torch.optim.AdamW([named[k] for k in before if ".executor." in k], lr=1e-2)
    updater = PolicyUpdater(cfg, model=model, optimizer=optimizer, policy=engine, pad_id=0, ref_model=None,
                            chunked_head=False, adapter="executor")
    result = updater.grpo(batch, temperature=1.0, step=1)
    assert result["optimizer_steps"] == 1.0
    moved = {k for k, v in model.named_parameters() if k in before and not torch.equal(v.detach(), before[k])}
    assert moved and all(".executor." in k for k in moved)
    assert not any(v.grad is not None and v.grad.abs().sum() > 0 for k, v in named.items() if ".default." in k)


def test_each_role_samples_through_its_own_adapter(base: Path) -> None:
    from agentflow.engines.base import SamplingParams

    model, engine = two_adapter_model(base)
    ask = [{"role": "user", "content": "say something"}]
    sampling = SamplingParams(temperature=0.0, max_tokens=12)

    async def replies() -> dict[str, list[int]]:
        out = {}
        for adapter in ("default", "executor", BASE_ADAPTER):
            completion = await AdapterView(engine, adapter).generate(ask, sampling)
            out[adapter] = completion.token_ids
        with model.disable_adapter():
            out["disabled"] = (await engine.generate(ask, sampling)).token_ids
        await engine.aclose()
        return out

    out = asyncio.run(replies())
    assert out["default"] != out["executor"]          # random adapters: each role's own weights answer
    assert out[BASE_ADAPTER] == out["disabled"]        # a frozen role on the policy engine sees the base


def test_role_advantages_per_role_and_shared() -> None:
    """One group of two trajectories, rewards 1 and 0; the planner has 1 and 3 turns, the executor 1 and 1.
    grpo_turn_rows normalises over rows, so the scope changes the numbers; grpo_trajectory does not."""
    kwargs = {"rewards": torch.tensor([1.0, 0.0]), "group_ids": ["q", "q"], "trajectory_ids": ["q#0", "q#1"],
              "eps": 0.0, "row_trajectory": {"planner": torch.tensor([0, 1, 1, 1]), "executor": torch.tensor([0, 1])}}
    per_role = role_advantages("grpo_turn_rows", scope="per_role", **kwargs)
    shared = role_advantages("grpo_turn_rows", scope="shared", **kwargs)
    # planner rows alone: values [1, 0, 0, 0]: mean 0.25, std 0.5 -> [1.5, -0.5, -0.5, -0.5]
    assert per_role["planner"].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert per_role["executor"].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)
    # all six rows: [1, 0, 0, 0, 1, 0]: mean 1/3, std sqrt(4/15)
    z = (2 / 3) / (4 / 15) ** 0.5
    assert shared["planner"].tolist() == pytest.approx([z, -z / 2, -z / 2, -z / 2], abs=1e-4)
    assert shared["executor"].tolist() == pytest.approx([z, -z / 2], abs=1e-4)
    same = [role_advantages("grpo_trajectory", scope=s, **kwargs) for s in ("per_role", "shared")]
    assert all(torch.equal(same[0][r], same[1][r]) for r in ("planner", "executor"))


def test_the_config_refuses_what_it_cannot_train(tmp_path: Path, base: Path) -> None:
    good = config(tmp_path, base, "r", 1).model_dump()

    def refused(match: str, **change) -> None:
        raw = json.loads(json.dumps(good))
        for key, value in change.items():
            raw[key] = value
        with pytest.raises(ConfigError, match=match):
            TrainConfig.from_dict(raw)

    flow = json.loads(json.dumps(good["flow"]))
    flow["roles"]["executor"]["engine"] = "helper"
    refused("every trained role must be on one engine", flow=flow)
    refused("needs lora.enabled", lora={"enabled": False})
    refused("which train_roles does not train", role_optim={"verifier": {"learning_rate": 1e-3}})
    refused("each trained role once", train_roles=["planner", "planner"])
    cfg = TrainConfig.from_dict({**good, "role_optim": {"executor": {"learning_rate": 1e-3, "max_grad_norm": 0.5}}})
    assert cfg.role_learning_rate("executor") == 1e-3 and cfg.role_learning_rate("planner") == 5e-2
    assert cfg.role_max_grad_norm("executor") == 0.5 and cfg.role_max_grad_norm("planner") == cfg.max_grad_norm
    # the trained roles sample in rollouts and are greedy in evaluation
    assert cfg.rollout_flow_config().roles.executor.sampling.temperature == 1.0
    assert cfg.eval_flow_config().roles.executor.sampling.temperature == 0.0
    own = TrainConfig.from_dict({**good, "role_optim": {"executor": {"temperature": 0.6}}})
    rollout = own.rollout_flow_config().roles
    assert (rollout.executor.sampling.temperature, rollout.planner.sampling.temperature) == (0.6, 1.0)
    assert own.eval_flow_config().roles.executor.sampling.temperature == 0.0


class AdapterRecorder(RecordingEngine):
    """The stand-in llama.cpp rollout engine of `test_engine_rollout.py` for a two-role run: samples through the
    adapter each request names, and records which role's call named which."""

    model_name = "recorder"

    def __init__(self, trainer_engine: TransformersEngine, adapters: list[str]) -> None:
        super().__init__(trainer_engine, syncs=[])
        self.adapters = adapters
        self.calls: list[tuple[str, str]] = []

    async def generate(self, messages, sampling, *, json_schema=None, adapter=None):
        assert self.weights_version == self.trainer_engine.weights_version, "a rollout on stale weights"
        assert adapter in self.adapters or adapter == BASE_ADAPTER
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        self.calls.append((system[:40], adapter))
        return await self.trainer_engine.generate(messages, sampling, json_schema=json_schema, adapter=adapter)


def test_a_two_role_run_rolls_out_through_the_inference_engine_one_adapter_per_role(
        tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentflow.planner import PLANNER_SYSTEM

    engines: list[AdapterRecorder] = []

    def recorder(self: Trainer, policy: TransformersEngine) -> AdapterRecorder:
        engines.append(AdapterRecorder(policy, ["default", "executor"]))
        return engines[-1]

    monkeypatch.setattr(Trainer, "_llamacpp_policy", recorder)
    cfg = config(tmp_path, base, "engine", 2, rollout_engine={"kind": "llamacpp"})
    Trainer(cfg, engines={"helper": helper()}).run()
    calls = engines[0].calls
    planner = {adapter for system, adapter in calls if system == PLANNER_SYSTEM[:40]}
    others = {adapter for system, adapter in calls if system != PLANNER_SYSTEM[:40]}
    assert planner == {"default"} and others == {"executor"}  # every call went through its role's adapter
    steps = [m for m in metrics(tmp_path / "engine") if "seconds/rollout" in m]
    assert all(m["rows"] > 0 and m["executor/rows"] > 0 for m in steps)
    # each role's engine rows were recomputed by the trainer (its own gap metrics)
    assert all("logprob_gap/mean" in m and "executor/logprob_gap/mean" in m for m in steps)


def test_a_frozen_role_on_the_planners_engine_samples_the_base_model(
        tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planner trained alone, executor on the same engine: one rollout engine serves both, the planner through
    its adapter and the executor through none (frozen means frozen); only planner rows are trained."""
    from agentflow.planner import PLANNER_SYSTEM

    engines: list[AdapterRecorder] = []

    def recorder(self: Trainer, policy: TransformersEngine) -> AdapterRecorder:
        engines.append(AdapterRecorder(policy, ["default"]))
        return engines[-1]

    monkeypatch.setattr(Trainer, "_llamacpp_policy", recorder)
    cfg = config(tmp_path, base, "shared", 2, rollout_engine={"kind": "llamacpp"}, train_roles=["planner"])
    assert cfg.frozen_policy_roles == ["executor"] and cfg.role_adapters and not cfg.adapter_roles
    Trainer(cfg, engines={"helper": helper()}).run()
    calls = engines[0].calls
    planner = {adapter for system, adapter in calls if system == PLANNER_SYSTEM[:40]}
    others = {adapter for system, adapter in calls if system != PLANNER_SYSTEM[:40]}
    assert planner == {"default"} and others == {BASE_ADAPTER}
    steps = [m for m in metrics(tmp_path / "shared") if "seconds/rollout" in m]
    assert all(m["rows"] > 0 and "executor/rows" not in m for m in steps)
    # without LoRA the executor would run on the trained weights: refused
    raw = cfg.model_dump()
    raw["lora"] = {"enabled": False}
    with pytest.raises(ConfigError, match="would run on the trained weights"):
        TrainConfig.from_dict(raw)


def test_eval_runs_a_trained_executor_beside_a_frozen_planner(tmp_path: Path, base: Path) -> None:
    Trainer(config(tmp_path, base, "trained", 1), engines={"helper": helper()}).run()
    adapter = tmp_path / "trained" / "final" / "executor" / "adapter"
    flow_config = FlowConfig.model_validate({
        "engines": {"planner": {"kind": "transformers", "device": "cpu", "model": str(base)},
                    "executor": {"kind": "transformers", "device": "cpu", "model": str(base),
                                 "adapter": str(adapter)},
                    "helper": {"kind": "llamacpp"}},
        "roles": {"planner": {"engine": "planner", "sampling": {"max_tokens": 40}},
                  "executor": {"engine": "executor", "sampling": {"max_tokens": 24}},
                  "verifier": {"engine": "helper"}, "generator": {"engine": "helper"}, "tools": {"engine": "helper"}},
        "tools": {"wikipedia_search": {}}, "limits": {"max_turns": 1}, "query_analysis": False, "verify": False})
    flow = Flow.from_config(flow_config, engines={"helper": helper()})
    trajectory = asyncio.run(flow.asolve("Repeat the word w1?"))
    asyncio.run(flow.aclose())
    assert trajectory.roles["executor"]["adapter"] == str(adapter)
    assert trajectory.roles["planner"]["adapter"] is None
    assert trajectory.infrastructure_failure is None


@pytest.mark.slow
def test_the_bundled_model_trains_planner_and_executor_adapters(tmp_path: Path) -> None:
    """The real 135M model with two adapters: the planner and the executor both sample through their own
    adapter in the live flow (python tool: the executor writes the program), and one step moves both."""
    data = tmp_path / "q.jsonl"
    gold = {f"What is {a} * {b}?": str(a * b) for a, b in [(4821, 37), (913, 58), (77, 1234), (605, 49)]}
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": a, "reward": "cover_em"}) + "\n"
                            for i, (q, a) in enumerate(gold.items())))
    cfg = TrainConfig.from_dict({
        "flow": {
            "engines": {"policy": {"kind": "transformers", "device": "cpu"}, "helper": {"kind": "llamacpp"}},
            "roles": {"planner": {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 48}},
                      "executor": {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 40}},
                      "verifier": {"engine": "helper"}, "generator": {"engine": "helper"},
                      "tools": {"engine": "helper"}},
            "tools": {"python": {}}, "limits": {"max_turns": 1, "plan_chars": 30}, "query_analysis": False,
            "verify": False},
        "data": {"train_path": str(data), "eval_path": str(data)}, "train_roles": ["planner", "executor"],
        "lora": {"rank": 4, "alpha": 8}, "batch_size": 2, "group_size": 6, "max_steps": 1, "learning_rate": 1e-3,
        "kl_coef": 0.0, "save_every": 1, "eval_at_start": False, "eval_every": 0, "eval_size": 1,
        "export_gguf": False, "torch_threads": 2, "output_dir": str(tmp_path / "run")})

    def generator(messages):  # right or wrong by a hash of the sampled steps it reads: groups carry signal
        text = messages[-1]["content"]
        right = gold[text.split("Question: ")[1].split("\n")[0]]
        return f"<answer>{right if hashlib.sha256(text.encode()).digest()[0] % 2 else 'no'}</answer>"

    Trainer(cfg, engines={"helper": ScriptedEngine(generator)}).run()
    run = tmp_path / "run"
    step = next(m for m in metrics(run) if "seconds/rollout" in m)
    assert step["rows"] > 0 and step["executor/rows"] > 0
    record = json.loads((run / "rollouts" / "step-000001.jsonl").read_text().splitlines()[0])
    roles = record["trajectory"]["roles"]
    assert roles["planner"]["adapter_name"] == "default" and roles["executor"]["adapter_name"] == "executor"
    assert roles["generator"]["engine_name"] == "helper"
    weights = torch.load(run / "checkpoints" / "step-000001" / "trainable.pt", weights_only=True)
    assert step["no_signal_share"] < 1.0   # two groups of six: all twelve of one parity has chance 1 in 1024
    assert any(v.abs().sum() > 0 for v in lora_b(weights, "default"))
    assert any(v.abs().sum() > 0 for v in lora_b(weights, "executor"))
    assert (run / "final" / "executor" / "adapter" / "adapter_config.json").is_file()
