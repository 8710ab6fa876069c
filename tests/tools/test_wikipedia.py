"""`wikipedia_search`: the offline BM25 index (bundled corpus and its cache) and the MediaWiki backend."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentflow.bundled import wiki_summaries_path
from agentflow.errors import ConfigError, ModelNotFoundError, ToolError, ToolInputError, ToolTimeoutError
from agentflow.tools.base import ToolContext, create_tool
from agentflow.wiki_index import WikiIndex, get_index
from tests.tools.fake_http import FakeServer, Reply, Request


@pytest.fixture(scope="module")
def bundled_corpus() -> Path:
    try:
        return wiki_summaries_path()
    except ModelNotFoundError as err:
        pytest.skip(str(err))


async def _search(query: str, top_k: int = 3, **settings: object) -> tuple[str, dict]:
    tool = create_tool("wikipedia_search", settings)
    result = await tool.run(tool.parse_input({"query": query, "top_k": top_k}), ToolContext())
    return result.output, result.data


# --- offline backend over the bundled corpus -------------------------------------------------------------


@pytest.mark.parametrize(("query", "title", "fact"), [
    ("Who painted A Sunday Afternoon on the Island of La Grande Jatte",
     "A Sunday Afternoon on the Island of La Grande Jatte", "Georges Seurat"),
    ("Who wrote Pride and Prejudice", "Pride and Prejudice", "Jane Austen"),
    ("speed of light in vacuum", "Speed of light", "electromagnetic"),
])
async def test_offline_search_finds_the_article_that_answers(bundled_corpus: Path, query: str, title: str,
                                                            fact: str) -> None:
    output, data = await _search(query)
    first = data["hits"][0]
    assert first["title"] == title
    assert fact in first["extract"]
    assert output.startswith(f"1. {title}: ")
    assert data["backend"] == "offline" and len(data["hits"]) <= 3
    assert [h["score"] for h in data["hits"]] == sorted((h["score"] for h in data["hits"]), reverse=True)


async def test_offline_seurat_article_comes_up_for_his_name(bundled_corpus: Path) -> None:
    _, data = await _search("Georges Seurat", top_k=5)
    titles = [h["title"] for h in data["hits"]]
    assert titles[0] == "Georges Seurat"
    assert "A Sunday Afternoon on the Island of La Grande Jatte" in titles


async def test_offline_extract_is_trimmed(bundled_corpus: Path) -> None:
    _, data = await _search("Albert Einstein relativity", top_k=1, max_chars=80)
    extract = data["hits"][0]["extract"]
    assert len(extract) <= 82 and extract.endswith("…")


async def test_offline_stop_words_only_gives_no_results(bundled_corpus: Path) -> None:
    output, data = await _search("the of and")
    assert data["hits"] == [] and "No Wikipedia article matched" in output


def test_index_covers_the_whole_corpus(bundled_corpus: Path) -> None:
    assert len(get_index()) == len(json.loads(bundled_corpus.read_text()))


@pytest.mark.parametrize("arguments", [{"query": ""}, {"query": "x", "top_k": 0}, {"query": "x", "top_k": 11}])
def test_input_limits(arguments: dict) -> None:
    with pytest.raises(ToolInputError):
        create_tool("wikipedia_search").parse_input(arguments)


# --- the index cache, on a small corpus ------------------------------------------------------------------


def _corpus(path: Path, extra: int = 0) -> Path:
    articles = {
        "Georges Seurat": {"title": "Georges Seurat", "extract": "Georges Seurat was a French painter of pointillism."},
        "Mount Everest": {"title": "Mount Everest", "extract": "Mount Everest is the highest mountain on Earth."},
        "Jupiter": {"title": "Jupiter", "extract": "Jupiter is the largest planet in the Solar System."},
    }
    for i in range(extra):
        articles[f"Filler {i}"] = {"title": f"Filler {i}", "extract": "Nothing relevant here."}
    path.write_text(json.dumps(articles))
    return path


def test_index_is_built_once_then_loaded(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "summaries.json")
    first = WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    second = WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    assert first.built and not second.built
    assert [h.title for h in second.search("highest mountain", 2)][0] == "Mount Everest"
    assert len(list((tmp_path / "cache" / "wiki-bm25").iterdir())) == 1


def test_changed_corpus_gets_a_new_index(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "summaries.json")
    WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    _corpus(data, extra=2)
    os.utime(data, ns=(1, 1))  # a different mtime and size: a different cache key
    again = WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    assert again.built and len(again) == 5


def test_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "summaries.json")
    WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    [folder] = list((tmp_path / "cache" / "wiki-bm25").iterdir())
    (folder / "params.index.json").write_text("{not json")
    again = WikiIndex.load_or_build(data, cache_root=tmp_path / "cache")
    assert again.built
    assert again.search("largest planet", 1)[0].title == "Jupiter"


def test_missing_or_bad_corpus_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        WikiIndex.load_or_build(tmp_path / "absent.json", cache_root=tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(ConfigError):
        WikiIndex.load_or_build(bad, cache_root=tmp_path)


async def test_tool_check_loads_the_configured_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path / "cache"))
    data = _corpus(tmp_path / "summaries.json")
    tool = create_tool("wikipedia_search", {"data_path": str(data)})
    await tool.check()
    output, hits = await _search("pointillism painter", data_path=str(data))
    assert hits["hits"][0]["title"] == "Georges Seurat"
    missing = create_tool("wikipedia_search", {"data_path": str(tmp_path / "nope.json")})
    with pytest.raises(ConfigError):
        await missing.check()


# --- MediaWiki backend against a real HTTP server on 127.0.0.1 -------------------------------------------


def _mediawiki_pages(request: Request) -> Reply:
    return Reply(body={"batchcomplete": True, "query": {"pages": [
        {"pageid": 2, "ns": 0, "title": "Georges Seurat", "index": 2, "extract": "Georges Seurat was a painter."},
        {"pageid": 1, "ns": 0, "title": "A Sunday Afternoon on the Island of La Grande Jatte", "index": 1,
         "extract": "A painting by Georges Seurat, 1884 to 1886."},
    ]}})


async def test_mediawiki_backend_sends_one_search_and_ranks_by_index(http_server: FakeServer) -> None:
    http_server.reply = _mediawiki_pages
    output, data = await _search("La Grande Jatte painter", top_k=2, backend="mediawiki",
                                 api_url=f"{http_server.url}/w/api.php", user_agent="agentflow-test/1 (me@example.org)")
    assert [h["title"] for h in data["hits"]] == ["A Sunday Afternoon on the Island of La Grande Jatte",
                                                  "Georges Seurat"]
    assert output.startswith("1. A Sunday Afternoon")
    [request] = http_server.requests
    assert request.path == "/w/api.php"
    assert request.query["generator"] == ["search"] and request.query["gsrsearch"] == ["La Grande Jatte painter"]
    assert request.query["gsrlimit"] == ["2"] and request.query["prop"] == ["extracts"]
    assert request.query["explaintext"] == ["1"] and request.query["format"] == ["json"]
    assert request.headers["User-Agent"] == "agentflow-test/1 (me@example.org)"


async def test_mediawiki_no_results(http_server: FakeServer) -> None:
    http_server.reply = lambda r: Reply(body={"batchcomplete": True})
    output, data = await _search("zzzz", backend="mediawiki", api_url=http_server.url)
    assert data["hits"] == [] and "No Wikipedia article matched" in output


@pytest.mark.parametrize(("reply", "error", "match"), [
    (Reply(status=500, body={"oops": 1}), ToolError, "HTTP 500"),
    (Reply(raw=b"<html>not json"), ToolError, "not JSON"),
    (Reply(body={"error": {"code": "badvalue", "info": "Unrecognized value"}}), ToolError, "Unrecognized value"),
    (Reply(body={"query": {"pages": {"1": "old format"}}}), ToolError, "unexpected shape"),
    (Reply(body=[1, 2]), ToolError, "unexpected JSON"),
    (Reply(body={}, delay_s=1.5), ToolTimeoutError, "did not answer"),
])
async def test_mediawiki_failures_are_typed(http_server: FakeServer, reply: Reply, error: type[Exception],
                                            match: str) -> None:
    http_server.reply = lambda r: reply
    with pytest.raises(error, match=match):
        await _search("x", backend="mediawiki", api_url=http_server.url, timeout_s=0.3)


async def test_mediawiki_unreachable(http_server: FakeServer) -> None:
    url = http_server.url
    tool = create_tool("wikipedia_search", {"backend": "mediawiki", "api_url": url.rsplit(":", 1)[0] + ":1"})
    with pytest.raises(ToolError, match="could not reach"):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext())
