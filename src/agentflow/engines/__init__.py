"""Language-model engines behind one async interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.engines.base import Completion, Engine, Message, SamplingParams

if TYPE_CHECKING:
    from agentflow.config import EngineConfig


def build_engine(config: EngineConfig) -> Engine:
    """Create the engine a config describes. Backends are imported lazily: torch loads only when needed."""
    from agentflow.config import LlamaCppEngineConfig, OpenAIEngineConfig, TransformersEngineConfig

    if isinstance(config, LlamaCppEngineConfig):
        from agentflow.engines.llamacpp import LlamaCppEngine

        return LlamaCppEngine(config)
    if isinstance(config, OpenAIEngineConfig):
        from agentflow.engines.openai_http import OpenAIEngine

        return OpenAIEngine(config)
    if isinstance(config, TransformersEngineConfig):
        from agentflow.engines.hf import TransformersEngine

        return TransformersEngine(config)
    raise TypeError(f"unknown engine config {type(config).__name__}")


__all__ = ["Completion", "Engine", "Message", "SamplingParams", "build_engine"]
