"""A hand-written JSON-RPC server over stdio that misbehaves on purpose, one way per mode:

    exit-at-start   writes to stderr and exits before answering anything
    slow-start      waits 2 s before reading anything, then behaves
    hang            reads requests and never answers
    die-mid-call    answers the start-up, exits when a tool is called
    garbage         answers the start-up, then writes a line that is not JSON-RPC instead of the call's result
    bad-result      answers tools/call with valid JSON-RPC whose result is not a CallToolResult
    bad-schema      lists a tool whose input schema is invalid, next to a good one
"""

from __future__ import annotations

import json
import sys
import time

GOOD_TOOL = {"name": "ping", "description": "Answers pong.",
             "inputSchema": {"type": "object", "properties": {"note": {"type": "string"}}}}
BAD_TOOL = {"name": "broken", "description": "Its schema is invalid.",
            "inputSchema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}}


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict, mode: str) -> None:
    method, rid = request.get("method"), request.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": f"raw-{mode}", "version": "0"}}})
    elif method == "tools/list":
        tools = [GOOD_TOOL, BAD_TOOL] if mode == "bad-schema" else [GOOD_TOOL]
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})
    elif method == "tools/call":
        if mode == "die-mid-call":
            sys.stderr.write("segfault in ping\n")
            sys.exit(4)
        if mode == "garbage":
            sys.stdout.write("this is not JSON-RPC {\n")
            sys.stdout.flush()
        elif mode == "bad-result":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": "pong, but not a list"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "pong"}]}})
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})


def main() -> None:
    mode = sys.argv[1]
    if mode == "exit-at-start":
        sys.stderr.write("fatal: the database file is locked\n")
        sys.exit(3)
    if mode == "slow-start":
        time.sleep(2)
    for line in sys.stdin:
        if mode != "hang" and line.strip():
            answer(json.loads(line), mode)


if __name__ == "__main__":
    main()
