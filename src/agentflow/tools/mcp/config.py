"""Settings of one MCP server: how to reach it (stdio command or streamable-HTTP URL) and which tools to take."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from agentflow.errors import ConfigError

SERVER_NAME_PATTERN = r"^[A-Za-z0-9_-]+$"
"""Server names prefix their tools' flow names (`time.get_current_time`), so they hold no dot."""

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _McpServerBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include: list[str] | None = Field(
        None, description="Tools to take, by the server's own names; default: all. A name the server does not "
        "offer is a configuration error.")
    exclude: list[str] = Field(default_factory=list, description="Tools to leave out, by the server's own names.")
    max_concurrency: int = Field(4, ge=1, description="Calls in flight at once on this server; the rest wait "
                                 "(inside the tool timeout).")
    startup_timeout_s: float = Field(30.0, gt=0, description="Seconds to start the server and list its tools.")
    max_output_chars: int = Field(20_000, ge=100, description="Characters of a result kept in the trajectory; "
                                  "longer text is cut and the call marked truncated.")


class McpStdioServerConfig(_McpServerBase):
    """A server the flow starts as a subprocess and talks to over stdin/stdout."""

    command: str = Field(..., min_length=1, description="Executable, e.g. 'mcp-server-time' or 'uvx'.")
    args: list[str] = Field(default_factory=list, description="Its arguments.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables added to the few the server inherits (HOME, "
        "PATH, SHELL, TERM, USER, LOGNAME); '${NAME}' in a value is replaced by this process's variable NAME.")
    cwd: str | None = Field(None, description="Working directory of the server; default: the current one.")

    @property
    def transport(self) -> str:
        return "stdio"

    def resolved_env(self) -> dict[str, str]:
        return {key: expand_env(value, f"env {key}") for key, value in self.env.items()}


class McpHttpServerConfig(_McpServerBase):
    """A running server reached over streamable HTTP."""

    url: str = Field(..., description="Endpoint, e.g. 'http://127.0.0.1:8000/mcp'.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="HTTP headers sent with every request (e.g. Authorization); "
        "'${NAME}' in a value is replaced by this process's environment variable NAME.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        return url

    @property
    def transport(self) -> str:
        return "http"

    def resolved_headers(self) -> dict[str, str]:
        return {key: expand_env(value, f"header {key}") for key, value in self.headers.items()}


def _transport_tag(raw: Any) -> str | None:
    if isinstance(raw, BaseModel):
        return "http" if isinstance(raw, McpHttpServerConfig) else "stdio"
    if not isinstance(raw, dict) or ("url" in raw) == ("command" in raw):
        return None
    return "http" if "url" in raw else "stdio"


McpServerConfig = Annotated[
    Annotated[McpStdioServerConfig, Tag("stdio")] | Annotated[McpHttpServerConfig, Tag("http")],
    Discriminator(_transport_tag, custom_error_type="mcp_transport",
                  custom_error_message="an MCP server needs either 'command' (stdio) or 'url' (streamable HTTP)"),
]


def expand_env(value: str, what: str) -> str:
    """Replace each '${NAME}' by the environment variable NAME; ConfigError naming it when it is not set."""

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(f"{what} refers to environment variable {name}, which is not set")
        return os.environ[name]

    return _ENV_REFERENCE.sub(lookup, value)
