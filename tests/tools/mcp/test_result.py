"""Call results as the flow records them: text for memory; structured content and every block's type and size."""

from __future__ import annotations

import base64

import pytest
from mcp import types

from agentflow.errors import ToolError
from agentflow.tools.mcp.result import convert_result


def convert(result: types.CallToolResult, max_chars: int = 1000):
    return convert_result(result, server="srv", tool="t", max_chars=max_chars)


def test_text_and_structured_content():
    result = convert(types.CallToolResult(content=[types.TextContent(type="text", text="7")],
                                          structuredContent={"total": 7}))
    assert result.output == "7" and not result.truncated
    assert result.data == {"server": "srv", "tool": "t", "content": [{"type": "text", "chars": 1}],
                           "structured": {"total": 7}}


def test_structured_content_alone_becomes_the_text():
    assert convert(types.CallToolResult(content=[], structuredContent={"a": "é"})).output == '{"a": "é"}'


def test_images_audio_and_resources_are_recorded_by_type_and_size():
    png = base64.b64encode(bytes(3000)).decode()
    result = convert(types.CallToolResult(content=[
        types.ImageContent(type="image", data=png, mimeType="image/png"),
        types.AudioContent(type="audio", data=base64.b64encode(b"abc").decode(), mimeType="audio/wav"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="file:///notes.txt", text="hello", mimeType="text/plain")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///a.bin", blob=base64.b64encode(bytes(10)).decode())),
        types.ResourceLink(type="resource_link", uri="file:///big.csv", name="big.csv"),
    ]))
    assert result.output.splitlines() == [
        "[image: image/png, 2.9 kB]", "[audio: audio/wav, 3 bytes]", "[resource file:///notes.txt]", "hello",
        "[resource file:///a.bin: binary, 10 bytes]", "[resource link: file:///big.csv (big.csv)]"]
    kinds = [(block["type"], block.get("bytes")) for block in result.data["content"]]
    assert kinds == [("image", 3000), ("audio", 3), ("resource", None), ("resource", 10), ("resource_link", None)]


def test_an_error_the_server_flags_is_a_tool_error_with_its_text():
    with pytest.raises(ToolError, match="MCP tool srv.t reported an error: Invalid timezone"):
        convert(types.CallToolResult(content=[types.TextContent(type="text", text="Invalid timezone")],
                                     isError=True))


def test_long_results_are_cut_and_marked():
    result = convert(types.CallToolResult(content=[types.TextContent(type="text", text="x" * 500)],
                                          structuredContent={"rows": ["y" * 600]}), max_chars=200)
    assert len(result.output) == 200 and result.truncated
    assert "structured" not in result.data and result.data["structured_chars"] > 600


def test_no_content_says_so():
    assert convert(types.CallToolResult(content=[])).output == "(the tool returned no content)"
