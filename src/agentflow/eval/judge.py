"""Optional LLM judge for free-form answers, reported beside the rule-based score and never replacing it.

The judge is any Engine with a named model (recorded with every verdict). Verdicts are cached in SQLite by
(model, prompt, judge version): re-running an evaluation, or comparing two runs, asks the judge only about
answers it has not seen, and a changed prompt (a new JUDGE_VERSION) never reuses old verdicts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentflow.config import EngineConfig
from agentflow.engines.base import Engine, Message, SamplingParams
from agentflow.errors import ConfigError, EngineError, validation_message

log = logging.getLogger(__name__)

JUDGE_VERSION = "1"
"""Bump when the prompt or the verdict parsing changes: cached verdicts of other versions are not reused."""

JUDGE_SYSTEM = (
    "You grade answers to questions. You are given a question, the accepted reference answer(s) and a "
    "response. The response is correct if it states the same final answer as a reference answer (same entity, "
    "number or option, allowing different wording, formatting or units that mean the same). It is incorrect if "
    "it gives a different answer, several conflicting answers, or no answer. Reply with one word: CORRECT or "
    "INCORRECT."
)

_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b", re.IGNORECASE)


class JudgeConfig(BaseModel):
    """The `--judge-config` file: which engine judges, and where verdicts are cached."""

    model_config = ConfigDict(extra="forbid")

    engine: EngineConfig = Field(..., description="Engine of the judge; its model name is pinned and recorded.")
    cache: str | None = Field(None, description="SQLite file of cached verdicts; default: <cache dir>/judge.sqlite.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=8))

    @classmethod
    def from_yaml(cls, path: str | Path) -> JudgeConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"judge config file not found: {path}")
        try:
            return cls.model_validate(yaml.safe_load(path.read_text()) or {})
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: {err}") from None
        except ValidationError as err:
            raise ConfigError(f"{path}: {validation_message(err, cls)}") from None


class JudgeVerdict(BaseModel):
    """One verdict. `correct` is None when the judge failed or its reply could not be read."""

    correct: bool | None
    model: str
    version: str = JUDGE_VERSION
    raw: str = ""
    cached: bool = False
    error: str | None = None


class VerdictCache:
    """SQLite store of verdicts keyed by a hash of (model, prompt, judge version)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, model TEXT, version TEXT, "
                         "prompt TEXT, raw TEXT, correct INTEGER, created TEXT)")
        self._db.commit()

    @staticmethod
    def key(model: str, messages: list[Message], version: str) -> str:
        blob = json.dumps([model, messages, version], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> tuple[str, bool | None] | None:
        with self._lock:
            row = self._db.execute("SELECT raw, correct FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return row[0], None if row[1] is None else bool(row[1])

    def put(self, key: str, *, model: str, version: str, messages: list[Message], raw: str,
            correct: bool | None) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (key, model, version, json.dumps(messages, ensure_ascii=False), raw,
                              None if correct is None else int(correct),
                              datetime.now(timezone.utc).isoformat(timespec="seconds")))
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def parse_verdict(text: str) -> bool | None:
    """CORRECT → True, INCORRECT → False (the first such word wins), anything else → None."""
    match = _VERDICT.search(text or "")
    if match is None:
        return None
    return match.group(1).upper() == "CORRECT"


def judge_messages(question: str, prediction: str, gold: Any) -> list[Message]:
    """The judge's prompt. Part of the cache key: changing it needs a new JUDGE_VERSION."""
    if isinstance(gold, dict) and "options" in gold:
        options = gold["options"]
        right = gold.get("answer")
        references = f"{right}. {options[right]}" if isinstance(options, dict) and right in options else str(gold)
    elif isinstance(gold, list):
        references = " | ".join(str(g) for g in gold)
    else:
        references = str(gold)
    user = f"Question:\n{question}\n\nReference answer(s): {references}\n\nResponse:\n{prediction}\n\nVerdict:"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


class LLMJudge:
    """Asks an engine whether a response matches the reference; caches every verdict on disk."""

    def __init__(self, engine: Engine, *, cache: VerdictCache, sampling: SamplingParams | None = None,
                 model: str | None = None) -> None:
        self.engine = engine
        self.model = model or engine.model_name
        if not self.model:
            raise ConfigError("the judge engine has no model name; a judge must name (pin) its model")
        self.cache = cache
        self.sampling = sampling or SamplingParams(temperature=0.0, max_tokens=8)

    @classmethod
    def from_config(cls, config: JudgeConfig) -> LLMJudge:
        from agentflow.bundled import cache_dir
        from agentflow.engines import build_engine

        cache_path = Path(config.cache) if config.cache else cache_dir() / "judge.sqlite"
        return cls(build_engine(config.engine), cache=VerdictCache(cache_path), sampling=config.sampling)

    def describe(self) -> dict[str, Any]:
        """Recorded in config.json and part of the run's fingerprint."""
        return {"model": self.model, "version": JUDGE_VERSION, "engine": self.engine.describe(),
                "sampling": self.sampling.model_dump()}

    async def judge(self, question: str, prediction: str, gold: Any) -> JudgeVerdict:
        """The verdict on one response; engine failures give correct=None with the error, never an exception."""
        if not prediction.strip():
            return JudgeVerdict(correct=False, model=self.model, raw="", error=None)
        messages = judge_messages(question, prediction, gold)
        key = VerdictCache.key(self.model, messages, JUDGE_VERSION)
        hit = self.cache.get(key)
        if hit is not None:
            return JudgeVerdict(correct=hit[1], model=self.model, raw=hit[0], cached=True)
        try:
            completion = await self.engine.generate(messages, self.sampling)
        except EngineError as err:
            log.warning("judge call failed (%s): %s", err.kind, err)
            return JudgeVerdict(correct=None, model=self.model, error=f"{err.kind}: {err}")
        correct = parse_verdict(completion.text)
        self.cache.put(key, model=self.model, version=JUDGE_VERSION, messages=messages, raw=completion.text,
                       correct=correct)
        return JudgeVerdict(correct=correct, model=self.model, raw=completion.text)

    async def aclose(self) -> None:
        await self.engine.aclose()
        self.cache.close()
