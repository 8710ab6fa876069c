"""`web_search`: configuration errors at check(), and each backend against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import pytest

from agentflow.errors import ConfigError, ToolError, ToolTimeoutError
from agentflow.tools.base import ToolContext, ToolResult, create_tool
from tests.tools.fake_http import FakeServer, Reply, Request

KEY = "test-key-123"


async def _search(query: str = "Georges Seurat birth year", **settings: object) -> ToolResult:
    tool = create_tool("web_search", settings)
    await tool.check()
    return await tool.run(tool.parse_input({"query": query}), ToolContext())


@pytest.mark.parametrize(("settings", "match"), [
    ({}, "no backend"),
    ({"backend": "searxng"}, "needs tools.web_search.base_url"),
    ({"backend": "serper"}, "SERPER_API_KEY"),
    ({"backend": "tavily"}, "TAVILY_API_KEY"),
    ({"backend": "tavily", "api_key_env": "MY_TAVILY"}, "MY_TAVILY"),
])
async def test_unconfigured_is_a_clear_config_error(settings: dict, match: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SERPER_API_KEY", "TAVILY_API_KEY", "MY_TAVILY"):
        monkeypatch.delenv(name, raising=False)
    tool = create_tool("web_search", settings)
    with pytest.raises(ConfigError, match=match):
        await tool.check()
    with pytest.raises(ConfigError, match=match):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext())


def test_unknown_backend_is_rejected_by_settings() -> None:
    with pytest.raises(ConfigError):
        create_tool("web_search", {"backend": "bing"})


async def test_searxng(http_server: FakeServer) -> None:
    http_server.reply = lambda r: Reply(body={"query": "q", "answers": ["Seurat was born in 1859."], "results": [
        {"title": "Georges Seurat - Wikipedia", "url": "https://en.wikipedia.org/wiki/Georges_Seurat",
         "content": "Georges Pierre Seurat (2 December 1859 – 29 March 1891) was a French artist."},
        {"title": "Seurat biography", "url": "https://example.org/seurat", "content": "Born in Paris " * 100},
        {"title": "Third", "url": "https://example.org/3", "content": "c"},
    ]})
    result = await _search(backend="searxng", base_url=http_server.url + "/", max_results=2, max_chars=60)
    [request] = http_server.requests
    assert request.method == "GET" and request.path == "/search"
    assert request.query == {"q": ["Georges Seurat birth year"], "format": ["json"]}
    assert result.data["answer"] == "Seurat was born in 1859."
    assert [r["title"] for r in result.data["results"]] == ["Georges Seurat - Wikipedia", "Seurat biography"]
    assert len(result.data["results"][1]["snippet"]) <= 62
    assert result.output.splitlines()[0] == "Answer: Seurat was born in 1859."
    assert result.output.splitlines()[1].startswith("1. Georges Seurat - Wikipedia (https://en.wikipedia.org/")


async def test_serper(http_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    http_server.reply = lambda r: Reply(body={"answerBox": {"answer": "2 December 1859"}, "organic": [
        {"title": "Georges Seurat", "link": "https://en.wikipedia.org/wiki/Georges_Seurat", "snippet": "French."}]})
    result = await _search(backend="serper", base_url=http_server.url, max_results=4)
    [request] = http_server.requests
    assert request.method == "POST" and request.path == "/search"
    assert request.headers["X-API-KEY"] == KEY
    assert request.body == {"q": "Georges Seurat birth year", "num": 4}
    assert result.data["answer"] == "2 December 1859"
    assert result.data["results"][0]["url"] == "https://en.wikipedia.org/wiki/Georges_Seurat"


async def test_tavily(http_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TAVILY", KEY)
    http_server.reply = lambda r: Reply(body={"answer": "1859", "results": [
        {"title": "Seurat", "url": "https://example.org/s", "content": "Born 1859 in Paris.", "score": 0.9}]})
    result = await _search(backend="tavily", base_url=http_server.url, api_key_env="MY_TAVILY")
    [request] = http_server.requests
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    assert request.body["query"] == "Georges Seurat birth year" and request.body["max_results"] == 5
    assert result.output == "Answer: 1859\n1. Seurat (https://example.org/s): Born 1859 in Paris."
    assert KEY not in result.output and KEY not in str(result.data)


async def test_empty_results(http_server: FakeServer) -> None:
    http_server.reply = lambda r: Reply(body={"results": []})
    result = await _search(backend="searxng", base_url=http_server.url)
    assert result.data["results"] == [] and "No web results" in result.output


@pytest.mark.parametrize(("reply", "error", "match"), [
    (Reply(status=500, body={"detail": "boom"}), ToolError, "HTTP 500.*boom"),
    (Reply(status=403, raw=b"Forbidden"), ToolError, "HTTP 403"),
    (Reply(raw=b"{truncated"), ToolError, "not JSON"),
    (Reply(body={"results": "nope"}), ToolError, "without a 'results' list"),
    (Reply(body={}, delay_s=1.5), ToolTimeoutError, "did not answer within 0.3s"),
])
async def test_backend_failures_are_typed(http_server: FakeServer, reply: Reply, error: type[Exception],
                                          match: str) -> None:
    http_server.reply = lambda r: reply
    with pytest.raises(error, match=match):
        await _search(backend="searxng", base_url=http_server.url, timeout_s=0.3)


async def test_context_timeout_caps_the_request(http_server: FakeServer) -> None:
    def slow(request: Request) -> Reply:
        return Reply(body={"results": []}, delay_s=1.5)

    http_server.reply = slow
    tool = create_tool("web_search", {"backend": "searxng", "base_url": http_server.url, "timeout_s": 30})
    with pytest.raises(ToolTimeoutError):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext(timeout_s=0.3))
