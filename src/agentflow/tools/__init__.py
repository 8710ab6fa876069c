"""Tools the executor can call. Each module defines one tool."""

from agentflow.tools.base import Tool, ToolContext, ToolResult, ToolSettings, create_tool, register_tool, tool_classes

__all__ = ["Tool", "ToolContext", "ToolResult", "ToolSettings", "create_tool", "register_tool", "tool_classes"]
