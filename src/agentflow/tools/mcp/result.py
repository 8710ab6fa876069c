"""An MCP call result as a flow tool result: text for memory, structured content and a summary of every
content block (images, audio, resources by type and size) for the trajectory."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mcp import types

from agentflow.errors import ToolError
from agentflow.tools.base import ToolResult


def _decoded_size(data: str) -> int:
    """Bytes of a base64 payload (without decoding more than needed to check it)."""
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return len(data)


def _kilobytes(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} kB"


def _block(block: Any) -> tuple[str, dict[str, Any]]:
    """(text shown in memory, record kept in the trajectory) for one content block."""
    if isinstance(block, types.TextContent):
        return block.text, {"type": "text", "chars": len(block.text)}
    if isinstance(block, types.ImageContent | types.AudioContent):
        size = _decoded_size(block.data)
        return (f"[{block.type}: {block.mimeType}, {_kilobytes(size)}]",
                {"type": block.type, "mime_type": block.mimeType, "bytes": size})
    if isinstance(block, types.ResourceLink):
        return (f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]",
                {"type": "resource_link", "uri": str(block.uri), "name": block.name, "mime_type": block.mimeType})
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return (f"[resource {resource.uri}]\n{resource.text}",
                    {"type": "resource", "uri": str(resource.uri), "mime_type": resource.mimeType,
                     "chars": len(resource.text)})
        size = _decoded_size(resource.blob)
        return (f"[resource {resource.uri}: {resource.mimeType or 'binary'}, {_kilobytes(size)}]",
                {"type": "resource", "uri": str(resource.uri), "mime_type": resource.mimeType, "bytes": size})
    kind = str(getattr(block, "type", type(block).__name__))
    return f"[{kind} content]", {"type": kind}


def convert_result(result: types.CallToolResult, *, server: str, tool: str, max_chars: int) -> ToolResult:
    """The flow's ToolResult for a successful call; ToolError with the server's text when it flags isError."""
    texts, blocks = [], []
    for block in result.content:
        text, record = _block(block)
        texts.append(text)
        blocks.append(record)
    output = "\n".join(t for t in texts if t)
    if result.isError:
        raise ToolError(f"MCP tool {server}.{tool} reported an error: {output[:max_chars] or '(no message)'}")
    if not output and result.structuredContent is not None:
        output = json.dumps(result.structuredContent, ensure_ascii=False)
    if not output:
        output = "(the tool returned no content)"
    truncated = len(output) > max_chars
    data: dict[str, Any] = {"server": server, "tool": tool, "content": blocks}
    if result.structuredContent is not None:
        structured = json.dumps(result.structuredContent, ensure_ascii=False)
        if len(structured) <= max_chars:
            data["structured"] = result.structuredContent
        else:
            data["structured_chars"] = len(structured)
            truncated = True
    return ToolResult(output=output[:max_chars], data=data, truncated=truncated)
