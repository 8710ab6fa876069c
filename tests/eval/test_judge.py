"""The optional LLM judge: pinned model, verdicts cached by (model, prompt, version), failures not fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError, EngineUnavailableError
from agentflow.eval import judge as judge_module
from agentflow.eval.judge import JudgeConfig, LLMJudge, VerdictCache, judge_messages, parse_verdict


@pytest.mark.parametrize(("text", "verdict"), [
    ("CORRECT", True), ("correct.", True), ("INCORRECT", False), ("Incorrect, it is Lima", False),
    ("I think so", None), ("", None),
])
def test_parse_verdict(text: str, verdict: bool | None) -> None:
    assert parse_verdict(text) is verdict


def make_judge(tmp_path: Path, replies: list, model: str = "grader-2024-08-06") -> tuple[LLMJudge, ScriptedEngine]:
    engine = ScriptedEngine(replies, model_name=model)
    return LLMJudge(engine, cache=VerdictCache(tmp_path / "cache.sqlite")), engine


async def test_verdicts_are_cached_on_disk(tmp_path: Path) -> None:
    judge, engine = make_judge(tmp_path, ["CORRECT", "INCORRECT"])
    first = await judge.judge("Capital of France?", "Paris, of course", ["Paris"])
    again = await judge.judge("Capital of France?", "Paris, of course", ["Paris"])
    assert first.correct is True and not first.cached
    assert again.correct is True and again.cached
    assert len(engine.calls) == 1
    # A new process (a new judge on the same file) reuses the verdict too.
    reopened, engine2 = make_judge(tmp_path, ["INCORRECT"])
    assert (await reopened.judge("Capital of France?", "Paris, of course", ["Paris"])).cached
    assert engine2.calls == []


async def test_cache_key_includes_model_and_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judge, _ = make_judge(tmp_path, ["CORRECT"])
    await judge.judge("q", "a", ["a"])
    other_model, engine = make_judge(tmp_path, ["INCORRECT"], model="grader-2025-01-01")
    assert (await other_model.judge("q", "a", ["a"])).correct is False and len(engine.calls) == 1
    monkeypatch.setattr(judge_module, "JUDGE_VERSION", "test-2")
    new_version, engine = make_judge(tmp_path, ["INCORRECT"])
    verdict = await new_version.judge("q", "a", ["a"])
    assert not verdict.cached and len(engine.calls) == 1


async def test_engine_failure_gives_no_verdict_not_an_exception(tmp_path: Path) -> None:
    judge, _ = make_judge(tmp_path, [EngineUnavailableError("down")])
    verdict = await judge.judge("q", "a", ["a"])
    assert verdict.correct is None and "engine_unavailable" in (verdict.error or "")


async def test_empty_answer_is_wrong_without_asking(tmp_path: Path) -> None:
    judge, engine = make_judge(tmp_path, ["CORRECT"])
    assert (await judge.judge("q", "  ", ["a"])).correct is False
    assert engine.calls == []


def test_judge_must_name_its_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model"):
        make_judge(tmp_path, ["CORRECT"], model="")


def test_prompt_shows_the_right_option_for_multiple_choice() -> None:
    messages = judge_messages("q", "C", {"options": {"A": "x", "C": "Colorectal cancer"}, "answer": "C"})
    assert "Reference answer(s): C. Colorectal cancer" in messages[1]["content"]


def test_judge_config_file(tmp_path: Path) -> None:
    path = tmp_path / "judge.yaml"
    path.write_text("engine:\n  kind: openai\n  model: gpt-4o-2024-08-06\n  base_url: http://127.0.0.1:9/v1\n"
                    f"cache: {tmp_path / 'verdicts.sqlite'}\n")
    config = JudgeConfig.from_yaml(path)
    assert config.engine.model == "gpt-4o-2024-08-06"  # type: ignore[union-attr]
    path.write_text("engine: {kind: openai, model: m}\nunknown: 1\n")
    with pytest.raises(ConfigError):
        JudgeConfig.from_yaml(path)
