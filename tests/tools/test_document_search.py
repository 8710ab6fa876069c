"""`document_search`: BM25 over a collection a config names, offered under a name of the config's own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentflow.bundled import PACKAGE_DATA, resolve_data_path
from agentflow.config import FlowConfig
from agentflow.errors import ConfigError, UnknownToolError
from agentflow.planner import match_tool
from agentflow.tools.base import ToolContext, create_tool

DOCS = [{"title": "Ada Quill", "extract": "Phone extension 4821. Engineer in the design team."},
        {"title": "Tomas Brell", "extract": "Phone extension 3307. Lawyer in the legal team."},
        {"title": "Orlo teapot", "extract": "Price 37 euros. A red teapot."}]


@pytest.fixture
def collection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "staff.json"
    path.write_text(json.dumps(DOCS))
    return path


def run(tool, **arguments) -> str:
    async def go() -> str:
        await tool.check()
        return (await tool.run(tool.parse_input(arguments), ToolContext(timeout_s=10))).output
    return asyncio.run(go())


def test_a_search_finds_the_named_document_first_and_max_hits_caps_what_a_call_asks(collection: Path) -> None:
    tool = create_tool("document_search", {"data_path": str(collection)})
    output = run(tool, query="Which extension reaches Tomas Brell?", top_k=3)
    assert output.splitlines()[0] == "1. Tomas Brell: Phone extension 3307. Lawyer in the legal team."
    assert len(output.splitlines()) == 2  # "extension" also matches Ada Quill; the teapot shares no word
    capped = create_tool("document_search", {"data_path": str(collection), "max_hits": 1})
    assert run(capped, query="Which extension reaches Tomas Brell?", top_k=3).count("\n") == 0
    assert run(capped, query="zebra") == "No document matched 'zebra'; try other key words."


def test_one_tool_under_two_names_each_with_its_own_menu_line(collection: Path, tmp_path: Path) -> None:
    shop = tmp_path / "shop.json"
    shop.write_text(json.dumps(DOCS[2:]))
    config = FlowConfig.model_validate({"tools": {
        "staff_directory": {"tool": "document_search", "data_path": str(collection), "description": "Colleagues."},
        "product_catalog": {"tool": "document_search", "data_path": str(shop), "description": "Products."}}})
    tools = {name: create_tool(name, settings) for name, settings in config.tools.items()}
    assert {name: (t.name, t.description, t.card()["name"]) for name, t in tools.items()} == {
        "staff_directory": ("staff_directory", "Colleagues.", "staff_directory"),
        "product_catalog": ("product_catalog", "Products.", "product_catalog")}
    assert match_tool("product_catalog", list(tools)) == "product_catalog"
    assert run(tools["product_catalog"], query="Tomas Brell").startswith("No document matched")
    assert "Phone extension 3307" in run(tools["staff_directory"], query="Tomas Brell")
    # the class's own name and description are untouched
    plain = create_tool("document_search", {"data_path": str(collection)})
    assert (plain.name, plain.description) != ("staff_directory", "Colleagues.")


def test_a_collection_that_is_missing_or_unnamed_or_a_bad_alias_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs `data_path`"):
        asyncio.run(create_tool("kb", {"tool": "document_search"}).check())
    with pytest.raises(ConfigError, match="no document collection at"):
        asyncio.run(create_tool("kb", {"tool": "document_search", "data_path": str(tmp_path / "no.json")}).check())
    with pytest.raises(UnknownToolError, match="unknown tool 'grep'"):
        create_tool("kb", {"tool": "grep"})
    with pytest.raises(ConfigError, match="SERVER.TOOL"):
        create_tool("kb.docs", {"tool": "document_search"})
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"extract\": \"no title\"}]")
    with pytest.raises(ConfigError, match="no documents with a title"):
        asyncio.run(create_tool("kb", {"tool": "document_search", "data_path": str(bad)}).check())


def test_bundled_names_a_file_shipped_with_the_package() -> None:
    path = resolve_data_path("bundled:tasks/mixed_kb/collections/staff_directory.json")
    assert path == PACKAGE_DATA / "tasks" / "mixed_kb" / "collections" / "staff_directory.json" and path.is_file()
    assert resolve_data_path("~/x.json") == Path.home() / "x.json"
