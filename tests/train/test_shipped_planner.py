"""The adapters shipped with the package load over the bundled model and do what their numbers say: the planner
(trained by benchmarks/learning_cpu.sh) looks the number up first, then computes; the executor (trained by
train_executor.yaml) writes the program that computes the answer from what the look-up found."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentflow.bundled import BUNDLED_ADAPTERS, resolve_adapter
from agentflow.config import FlowConfig, LlamaCppEngineConfig
from agentflow.errors import ModelNotFoundError
from agentflow.flow import Flow

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "agentflow" / "configs"


def test_bundled_adapters_resolve_and_unknown_names_list_the_shipped_ones() -> None:
    assert resolve_adapter("bundled:lookup_compute") == BUNDLED_ADAPTERS / "lookup_compute"
    about = json.loads((BUNDLED_ADAPTERS / "lookup_compute" / "about.json").read_text())
    assert about["trained_accuracy"] > about["frozen_accuracy"] and about["held_out_questions"] >= 200
    with pytest.raises(ModelNotFoundError, match="bundled:lookup_compute"):
        resolve_adapter("bundled:nope")


@pytest.mark.slow
def test_the_shipped_planner_looks_up_then_computes_where_the_frozen_one_does_not() -> None:
    from agentflow.train.config import DataSettings
    from agentflow.train.data import default_paths, load_questions

    questions = load_questions(default_paths("lookup_compute")[1], DataSettings())[:4]

    def tools(config: str) -> list[list[str]]:
        async def run() -> list[list[str]]:
            async with Flow.from_config(FlowConfig.from_yaml(CONFIGS / config)) as flow:
                trajectories = await asyncio.gather(*(flow.asolve(q.question) for q in questions))
            return [[turn.tool for turn in t.turns] for t in trajectories]

        return asyncio.run(run())

    assert tools("flow_lookup_compute_trained.yaml") == [["wikipedia_search", "python"]] * 4
    assert tools("flow_lookup_compute.yaml") != [["wikipedia_search", "python"]] * 4


def test_the_shipped_executor_carries_its_measured_numbers() -> None:
    about = json.loads((BUNDLED_ADAPTERS / "lookup_compute_executor" / "about.json").read_text())
    assert about["role"] == "executor" and about["held_out_questions"] >= 200
    assert about["trained_measure"] >= about["frozen_measure"] + 0.2
    assert about["trained_accuracy"] > about["frozen_accuracy"]


@pytest.mark.slow
def test_the_shipped_executor_writes_programs_that_print_the_answer_where_the_frozen_one_does_not() -> None:
    """flow_executor_trained.yaml (the executor trained by train_executor.yaml) against flow_executor.yaml (the
    same flow, executor frozen) on held-out questions: the trained executor's programs print the gold answer."""
    from agentflow.train.config import DataSettings
    from agentflow.train.data import default_paths, load_questions

    questions = load_questions(default_paths("lookup_compute")[1], DataSettings())[:6]

    def printed(config: str) -> list[bool]:
        """Per question: whether its python call printed the gold answer."""
        async def run() -> list[bool]:
            async with Flow.from_config(FlowConfig.from_yaml(CONFIGS / config)) as flow:
                trajectories = await asyncio.gather(*(flow.asolve(q.question) for q in questions))
            return [any(turn.tool == "python" and turn.tool_call is not None
                        and turn.tool_call.output.strip() == str(q.answer) for turn in t.turns)
                    for q, t in zip(questions, trajectories, strict=True)]

        return asyncio.run(run())

    trained, frozen = printed("flow_executor_trained.yaml"), printed("flow_executor.yaml")
    assert sum(trained) >= 5, trained
    assert sum(trained) >= sum(frozen) + 2, (trained, frozen)


def test_a_saved_adapter_becomes_the_llama_cpp_lora_file_the_trainer_writes_from_the_loaded_model(
        tmp_path: Path) -> None:
    """`adapter_lora_gguf` (what a llama.cpp engine with `adapter:` loads) reads the saved adapter without
    loading the model, and writes the tensors `write_lora_gguf` writes from the model it trains."""
    import gguf
    import numpy as np

    from agentflow.bundled import bundled_model_path
    from agentflow.config import TransformersEngineConfig
    from agentflow.engines.hf import load_policy
    from agentflow.train.export import adapter_lora_gguf, write_lora_gguf

    template = bundled_model_path()
    saved = adapter_lora_gguf(resolve_adapter("bundled:lookup_compute"), template=template, root=tmp_path)
    assert adapter_lora_gguf(resolve_adapter("bundled:lookup_compute"), template=template, root=tmp_path) == saved
    model, _ = load_policy(TransformersEngineConfig(adapter="bundled:lookup_compute"))
    write_lora_gguf(model, template=template, out=tmp_path / "from_model.gguf")

    def tensors(path: Path) -> dict[str, np.ndarray]:
        return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}

    ours, reference = tensors(saved), tensors(tmp_path / "from_model.gguf")
    assert ours.keys() == reference.keys() and len(ours) == 2 * 7 * 30
    # the shipped adapter is float16 on disk, the loaded model's float32 holds the same values
    assert all(np.allclose(ours[name], reference[name], atol=1e-6) for name in ours)


@pytest.mark.slow
def test_llama_cpp_with_the_shipped_adapter_writes_what_transformers_with_it_writes() -> None:
    from agentflow.config import TransformersEngineConfig
    from agentflow.engines.base import SamplingParams
    from agentflow.engines.hf import TransformersEngine
    from agentflow.engines.llamacpp import LlamaCppEngine

    prompts = [[{"role": "user", "content": "What is the atomic number of antimony multiplied by 15? Which tool "
                                            "first?"}],
               [{"role": "user", "content": "Name a tool to compute 4821 * 37."}]]
    sampling = SamplingParams(temperature=0.0, max_tokens=16)

    def texts(engine) -> list[str]:
        async def run() -> list[str]:
            try:
                return [(await engine.generate(p, sampling)).text for p in prompts]
            finally:
                await engine.aclose()

        return asyncio.run(run())

    adapted = LlamaCppEngine(LlamaCppEngineConfig(adapter="bundled:lookup_compute", n_threads=1))
    assert adapted.describe()["adapter"] == "bundled:lookup_compute"
    with_adapter = texts(adapted)
    assert with_adapter == texts(TransformersEngine(TransformersEngineConfig(adapter="bundled:lookup_compute")))
    assert with_adapter != texts(LlamaCppEngine(LlamaCppEngineConfig(n_threads=1)))
