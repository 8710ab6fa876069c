"""The `document_search` tool: offline BM25 over a collection of documents a config names.

A collection is a JSON file in the format of the offline Wikipedia summaries: a list (or a mapping) of objects
with a `title` and an `extract`. It is indexed once (cached like the Wikipedia index, rebuilt when the file
changes). A config offers one collection per tool name (`tool: document_search`), so a flow can have a staff
directory and a product catalogue as two tools, each described by what it holds.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from agentflow.bundled import resolve_data_path
from agentflow.errors import ConfigError
from agentflow.tools.base import Tool, ToolContext, ToolExample, ToolResult, ToolSettings, register_tool, trim_text
from agentflow.wiki_index import WikiIndex, get_index


class DocumentSearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, description="Names or key words to look up, e.g. 'Ada Quill'.")
    top_k: int = Field(3, ge=1, le=10, description="How many documents to return.")


class DocumentSearchSettings(ToolSettings):
    data_path: str | None = Field(
        None, description="JSON file of the documents: a list (or mapping) of objects with `title` and `extract`. "
        "`bundled:REL` names a file shipped under agentflow/data/.")
    max_chars: int = Field(300, ge=20, description="Characters kept of each document's extract.")
    max_hits: int = Field(10, ge=1, le=10, description="Documents returned at most, whatever `top_k` a call asks "
                          "for: 1 shows a small generator the best match alone, not its neighbours' numbers.")


@register_tool
class DocumentSearchTool(Tool):
    name = "document_search"
    description = "Searches a collection of documents (set by the config) and returns the best matches."
    input_model = DocumentSearchInput
    output_description = "Up to top_k documents: title and the start of the text."
    limitations = "Keyword search: only what the collection's documents say."
    best_practices = "Name the person or thing asked about; a short question containing the name also works."
    examples = (ToolExample(question="What is the phone extension of Ada Quill?", sub_goal="Find Ada Quill",
                            input={"query": "What is the phone extension of Ada Quill?"}),)
    fallback_field = "query"
    settings_model = DocumentSearchSettings

    settings: DocumentSearchSettings

    async def check(self) -> None:
        await self._index()

    async def _index(self) -> WikiIndex:
        if not self.settings.data_path:
            raise ConfigError(f"tool {self.name!r} (document_search) needs `data_path`: the JSON file of the "
                              "documents to search")
        path = resolve_data_path(self.settings.data_path)
        if not path.is_file():
            raise ConfigError(f"tool {self.name!r}: no document collection at {path}")
        return await asyncio.to_thread(get_index, path)

    async def run(self, args: DocumentSearchInput, ctx: ToolContext) -> ToolResult:
        index = await self._index()
        hits = await asyncio.to_thread(index.search, args.query, min(args.top_k, self.settings.max_hits))
        rows = [{"title": h.title, "extract": trim_text(h.extract, self.settings.max_chars), "score": round(h.score, 3)}
                for h in hits]
        data = {"collection": self.settings.data_path, "query": args.query, "hits": rows}
        if not rows:
            return ToolResult(output=f"No document matched {args.query!r}; try other key words.", data=data)
        return ToolResult(output="\n".join(f"{i}. {row['title']}: {row['extract']}" for i, row in enumerate(rows, 1)),
                          data=data)
