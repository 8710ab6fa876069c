"""What tells two eval runs' configurations apart: their recorded identities (config.json's `identity`: the
resolved flow config, agent, judge, results format), compared key by key. Used to refuse a reused run directory
and to show a comparison's differences; light to import (the viewer uses it)."""

from __future__ import annotations

from typing import Any

_ABSENT = "<absent>"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value. An empty mapping is a leaf of its own: a tool enabled with no settings
    (`python: {}`) must still show when it is added or removed."""
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        flat = {}
        for index, inner in enumerate(value):
            flat.update(_flatten(inner, f"{prefix}[{index}]"))
        return flat
    return {prefix: value}


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every setting that differs, one line each; a tool, MCP server or engine added or removed is one line."""
    a, b = _flatten(old), _flatten(new)
    lines: list[str] = []
    for section in ("flow.tools", "flow.mcp_servers", "flow.engines"):
        before, after = set(_children(old, section)), set(_children(new, section))
        lines += [f"{section}: removed {name}" for name in sorted(before - after)]
        lines += [f"{section}: added {name}" for name in sorted(after - before)]
        moved = {f"{section}.{name}" for name in before ^ after}
        a = {k: v for k, v in a.items() if not any(k == m or k.startswith(m + ".") for m in moved)}
        b = {k: v for k, v in b.items() if not any(k == m or k.startswith(m + ".") for m in moved)}
    lines += [f"{key}: {a.get(key, _ABSENT)!r} -> {b.get(key, _ABSENT)!r}"
              for key in sorted(set(a) | set(b)) if a.get(key, _ABSENT) != b.get(key, _ABSENT)]
    return lines


def _children(identity: dict[str, Any], dotted: str) -> list[str]:
    node: Any = identity
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return list(node) if isinstance(node, dict) else []
