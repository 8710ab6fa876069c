"""The `wikipedia_search` tool: offline BM25 over vital-article summaries, or the live MediaWiki API."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from agentflow.errors import ToolError
from agentflow.tools._http import USER_AGENT, request_json
from agentflow.tools.base import Tool, ToolContext, ToolExample, ToolResult, ToolSettings, register_tool, trim_text
from agentflow.wiki_index import WikiHit, WikiIndex, get_index


class WikipediaInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, description="Names or key words to look up, e.g. 'Georges Seurat'.")
    top_k: int = Field(3, ge=1, le=10, description="How many articles to return.")


class WikipediaSettings(ToolSettings):
    backend: Literal["offline", "mediawiki"] = Field(
        "offline", description="'offline': BM25 over the bundled summaries; 'mediawiki': the live API.")
    data_path: str | None = Field(None, description="Summaries JSON for the offline backend; default: bundled.")
    max_chars: int = Field(500, ge=50, description="Characters kept of each article's extract.")
    api_url: str = Field("https://en.wikipedia.org/w/api.php", description="MediaWiki api.php endpoint.")
    timeout_s: float = Field(10.0, gt=0, description="Timeout of one MediaWiki request.")
    user_agent: str = Field(USER_AGENT, description="User-Agent sent to MediaWiki (add contact details).")


@register_tool
class WikipediaSearchTool(Tool):
    name = "wikipedia_search"
    description = ("Searches Wikipedia and returns the best-matching articles with a short summary of each. "
                   "Use it for facts about people, places, works, events and concepts.")
    input_model = WikipediaInput
    output_description = "Up to top_k articles: title and the start of the article's summary."
    limitations = ("Keyword search over article summaries (offline: about 10,000 vital articles), "
                   "so details and recent events may be missing.")
    best_practices = ("Name the person, place or thing (e.g. 'Georges Seurat'); a short question containing the "
                      "name also works, the search weighs rare words most.")
    examples = (ToolExample(question="In which year was the painter Georges Seurat born?",
                            sub_goal="Find the birth year of Georges Seurat",
                            input={"query": "In which year was Georges Seurat born?"}),
                ToolExample(question="Which river flows through Vienna?", sub_goal="Look up Vienna",
                            input={"query": "Which river flows through Vienna?"}))
    settings_model = WikipediaSettings

    settings: WikipediaSettings

    async def check(self) -> None:
        """Offline: load (or build, once) the index now, so the first question does not pay for it."""
        if self.settings.backend == "offline":
            await self._index()

    async def _index(self) -> WikiIndex:
        path = Path(self.settings.data_path) if self.settings.data_path else None
        return await asyncio.to_thread(get_index, path)

    async def run(self, args: WikipediaInput, ctx: ToolContext) -> ToolResult:
        if self.settings.backend == "offline":
            index = await self._index()
            hits = await asyncio.to_thread(index.search, args.query, args.top_k)
        else:
            hits = await self._mediawiki(args.query, args.top_k, min(self.settings.timeout_s, ctx.timeout_s))
        rows = [{"title": h.title, "extract": trim_text(h.extract, self.settings.max_chars), "score": round(h.score, 3),
                 "url": "https://en.wikipedia.org/wiki/" + quote(h.title.replace(" ", "_"))} for h in hits]
        data = {"backend": self.settings.backend, "query": args.query, "hits": rows}
        if not rows:
            return ToolResult(output=f"No Wikipedia article matched {args.query!r}; try other key words.", data=data)
        output = "\n".join(f"{i}. {row['title']}: {row['extract']}" for i, row in enumerate(rows, 1))
        return ToolResult(output=output, data=data)

    async def _mediawiki(self, query: str, top_k: int, timeout_s: float) -> list[WikiHit]:
        """One request: a search generator with intro extracts of the pages it finds."""
        params = {
            "action": "query", "format": "json", "formatversion": "2", "generator": "search",
            "gsrsearch": query, "gsrlimit": str(top_k), "gsrnamespace": "0", "prop": "extracts",
            "exintro": "1", "explaintext": "1", "exlimit": str(top_k), "redirects": "1",
        }
        body = await request_json("GET", self.settings.api_url, service="the MediaWiki API", timeout_s=timeout_s,
                                  params=params, headers={"User-Agent": self.settings.user_agent})
        if not isinstance(body, dict):
            raise ToolError("the MediaWiki API returned an unexpected JSON value")
        if "error" in body:
            error: Any = body["error"]
            info = error.get("info", error) if isinstance(error, dict) else error
            raise ToolError(f"the MediaWiki API refused the search: {info}")
        pages = (body.get("query") or {}).get("pages", [])
        if not isinstance(pages, list) or not all(isinstance(p, dict) for p in pages):
            raise ToolError("the MediaWiki API returned pages in an unexpected shape")
        pages = sorted((p for p in pages if p.get("title") and not p.get("missing")),
                       key=lambda p: p.get("index", 0))
        # The API ranks but does not score: a rank-based score keeps the output shape of the offline backend.
        return [WikiHit(str(p["title"]), str(p.get("extract") or ""), 1.0 / (rank + 1))
                for rank, p in enumerate(pages[:top_k])]
