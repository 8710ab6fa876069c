"""One JSON-over-HTTP call with typed errors, shared by the HTTP-backed tools."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agentflow.errors import ToolError, ToolTimeoutError

USER_AGENT = f"agentflow/0.1 httpx/{httpx.__version__}"
"""Default User-Agent; services such as Wikimedia ask for contact details, which a setting can add."""


async def request_json(
    method: str,
    url: str,
    *,
    service: str,
    timeout_s: float,
    params: dict[str, Any] | None = None,
    json_body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """Send one request and return the decoded JSON body.

    Raises ToolTimeoutError when the service does not answer in time and ToolError for everything else that
    goes wrong (unreachable, HTTP status >= 400, a body that is not JSON), naming `service` in the message.
    A client per call keeps the tool usable from any event loop; the handshake cost is small next to a search.
    """
    all_headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), headers=all_headers,
                                     follow_redirects=True) as client:
            response = await client.request(method, url, params=params, json=json_body)
    except httpx.TimeoutException:
        raise ToolTimeoutError(f"{service} did not answer within {timeout_s:g}s") from None
    except httpx.HTTPError as err:
        raise ToolError(f"could not reach {service} at {url}: {type(err).__name__}: {err}") from None
    if response.status_code >= 400:
        detail = response.text.strip().replace("\n", " ")[:200]
        raise ToolError(f"{service} answered HTTP {response.status_code}" + (f": {detail}" if detail else ""))
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ToolError(f"{service} returned a body that is not JSON: {response.text[:120]!r}") from None
