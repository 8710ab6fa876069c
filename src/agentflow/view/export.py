"""`agentflow view ... --export report.html`: the page and the answer of every route in one HTML file.

Each answer is stored gzip'd and base64'd under its route and unpacked by the page when first shown
(DecompressionStream), so an export holding every trajectory of a run stays a fraction of the files' size.
"""

from __future__ import annotations

import base64
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

from agentflow.view.api import ViewApp, dumps
from agentflow.view.page import render


@dataclass(frozen=True)
class ExportStats:
    path: Path
    routes: int
    json_bytes: int
    file_bytes: int


def write_export(app: ViewApp, out: Path) -> ExportStats:
    bundle: dict[str, str] = {}
    raw = 0
    for route in app.routes():
        text = dumps(app.get(route)).encode()
        raw += len(text)
        bundle[route] = base64.b64encode(gzip.compress(text, compresslevel=6, mtime=0)).decode()
    names = ", ".join(sorted({s.kind for s in app.sources}))
    html = render(exported=bundle, title=f"agentflow view · {names}").html
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return ExportStats(path=out, routes=len(bundle), json_bytes=raw, file_bytes=out.stat().st_size)
