"""The `web_search` tool: one HTTP search backend (SearXNG, Serper or Tavily), chosen by settings.

Unconfigured means a ConfigError from `check()` at the start of a flow, naming what is missing, never a tool
that silently disappears.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentflow.errors import ConfigError, ToolError
from agentflow.tools._http import request_json
from agentflow.tools.base import Tool, ToolContext, ToolExample, ToolResult, ToolSettings, register_tool, trim_text

Backend = Literal["searxng", "serper", "tavily"]

_DEFAULT_URL: dict[str, str] = {"serper": "https://google.serper.dev", "tavily": "https://api.tavily.com"}
_DEFAULT_KEY_ENV: dict[str, str] = {"serper": "SERPER_API_KEY", "tavily": "TAVILY_API_KEY"}


class WebSearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, description="What to search the web for.")


class WebSearchSettings(ToolSettings):
    backend: Backend | None = Field(None, description="'searxng' (needs base_url), 'serper' or 'tavily'.")
    base_url: str | None = Field(
        None, description="SearXNG instance root (required for searxng); for serper/tavily overrides the API root.")
    api_key_env: str | None = Field(
        None, description="Environment variable with the API key; default SERPER_API_KEY / TAVILY_API_KEY.")
    max_results: int = Field(5, ge=1, le=20, description="Results returned per search.")
    max_chars: int = Field(300, ge=50, description="Characters kept of each result's snippet.")
    timeout_s: float = Field(15.0, gt=0, description="Timeout of one search request.")


@dataclass(frozen=True)
class _Endpoint:
    backend: str
    url: str
    api_key: str | None


@dataclass(frozen=True)
class _Hit:
    title: str
    url: str
    snippet: str


@register_tool
class WebSearchTool(Tool):
    name = "web_search"
    description = ("Searches the web and returns the top results with title, link and snippet. "
                   "Use it for recent events or facts not in Wikipedia.")
    input_model = WebSearchInput
    output_description = "A direct answer when the engine gives one, then numbered results: title, URL, snippet."
    limitations = "Snippets are short and may be outdated or wrong; needs a configured search backend."
    best_practices = "Use a short keyword query; check important facts in more than one result."
    examples = (ToolExample(question="Which country won the 2022 FIFA World Cup?",
                            sub_goal="Find the winner of the 2022 World Cup",
                            input={"query": "2022 FIFA World Cup final"}),)
    settings_model = WebSearchSettings

    settings: WebSearchSettings

    async def check(self) -> None:
        self._endpoint()

    def _endpoint(self) -> _Endpoint:
        """Resolve backend, URL and key from the settings and the environment, or raise ConfigError."""
        s = self.settings
        if s.backend is None:
            raise ConfigError("web_search has no backend: set tools.web_search.backend to 'searxng' "
                              "(with base_url), 'serper' or 'tavily', or disable the tool")
        if s.backend == "searxng":
            if not s.base_url:
                raise ConfigError("web_search backend 'searxng' needs tools.web_search.base_url "
                                  "(the instance root, e.g. http://localhost:8888)")
            return _Endpoint("searxng", s.base_url.rstrip("/") + "/search", None)
        env = s.api_key_env or _DEFAULT_KEY_ENV[s.backend]
        key = os.environ.get(env, "").strip()
        if not key:
            raise ConfigError(f"web_search backend {s.backend!r} needs an API key in the environment "
                              f"variable {env}, which is not set")
        return _Endpoint(s.backend, (s.base_url or _DEFAULT_URL[s.backend]).rstrip("/") + "/search", key)

    async def run(self, args: WebSearchInput, ctx: ToolContext) -> ToolResult:
        endpoint = self._endpoint()
        timeout = min(self.settings.timeout_s, ctx.timeout_s)
        n = self.settings.max_results
        service = f"the {endpoint.backend} search backend"
        if endpoint.backend == "searxng":
            body = await request_json("GET", endpoint.url, service=service, timeout_s=timeout,
                                      params={"q": args.query, "format": "json"})
            answer, hits = self._parse(body, "results", "url", "content", answers_key="answers")
        elif endpoint.backend == "serper":
            body = await request_json("POST", endpoint.url, service=service, timeout_s=timeout,
                                      json_body={"q": args.query, "num": n},
                                      headers={"X-API-KEY": endpoint.api_key or ""})
            answer, hits = self._parse(body, "organic", "link", "snippet")
            box = body.get("answerBox") if isinstance(body, dict) else None
            if isinstance(box, dict):
                answer = str(box.get("answer") or box.get("snippet") or "") or answer
        else:
            body = await request_json("POST", endpoint.url, service=service, timeout_s=timeout,
                                      json_body={"query": args.query, "max_results": n, "include_answer": True},
                                      headers={"Authorization": f"Bearer {endpoint.api_key}"})
            answer, hits = self._parse(body, "results", "url", "content", answers_key="answer")
        hits = hits[:n]
        data = {"backend": endpoint.backend, "query": args.query, "answer": answer,
                "results": [{"title": h.title, "url": h.url, "snippet": h.snippet} for h in hits]}
        lines = [f"Answer: {answer}"] if answer else []
        lines += [f"{i}. {h.title} ({h.url}): {h.snippet}" for i, h in enumerate(hits, 1)]
        return ToolResult(output="\n".join(lines) or f"No web results for {args.query!r}.", data=data)

    def _parse(self, body: Any, list_key: str, url_key: str, text_key: str,
               answers_key: str | None = None) -> tuple[str, list[_Hit]]:
        """Pull (answer, hits) out of a backend's JSON, raising ToolError when the shape is not the expected one."""
        if not isinstance(body, dict) or not isinstance(body.get(list_key, []), list):
            raise ToolError(f"the search backend returned JSON without a {list_key!r} list")
        hits = [_Hit(str(r.get("title") or ""), str(r.get(url_key) or ""),
                     trim_text(str(r.get(text_key) or ""), self.settings.max_chars))
                for r in body.get(list_key, []) if isinstance(r, dict)]
        raw_answer = body.get(answers_key) if answers_key else None
        if isinstance(raw_answer, list):
            raw_answer = next((a.get("answer", "") if isinstance(a, dict) else a for a in raw_answer), "")
        answer = trim_text(str(raw_answer), self.settings.max_chars) if raw_answer else ""
        return answer, [h for h in hits if h.title or h.snippet]
