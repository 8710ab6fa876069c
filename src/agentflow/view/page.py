"""The page shell, shared by the server and the export: index.html with its import map, style and boot script.

The JavaScript modules import each other by bare names (`af/dom.js`). The import map says where those are:
`/static/js/` when served, `data:` URLs when everything must live in one file. The same modules run either way.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

STATIC = Path(str(resources.files("agentflow.view") / "static"))
BOOT = 'import "af/app.js";'


def static_files() -> dict[str, Path]:
    """URL path under /static/ -> file, for every shipped asset (the server serves nothing else)."""
    return {path.relative_to(STATIC).as_posix(): path for path in STATIC.rglob("*")
            if path.is_file() and path.suffix in (".js", ".css", ".svg")}


def js_modules() -> dict[str, str]:
    """Bare module name (af/x.js) -> source."""
    return {f"af/{path.name}": path.read_text(encoding="utf-8") for path in sorted((STATIC / "js").glob("*.js"))}


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _script_json(value: object) -> str:
    """JSON safe inside a <script> element: no '<' can close it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


@dataclass(frozen=True)
class Page:
    html: str
    csp: str


def render(*, exported: dict[str, str] | None = None, title: str = "agentflow view") -> Page:
    """The page served at / (exported is None), or the self-contained page with every route's answer inlined."""
    template = (STATIC / "index.html").read_text(encoding="utf-8")
    if exported is None:
        importmap = _script_json({"imports": {"af/": "/static/js/"}})
        # every module fetched at once, not level by level as the imports are discovered
        preload = "".join(f'<link rel="modulepreload" href="/static/js/{name.removeprefix("af/")}">'
                          for name in js_modules())
        style = '<link rel="stylesheet" href="/static/style.css">' + preload
        data = ""
        csp = (f"default-src 'none'; script-src 'self' {csp_hash(importmap)} {csp_hash(BOOT)}; style-src 'self'; "
               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
               "frame-ancestors 'none'")
    else:
        imports = {name: "data:text/javascript;base64," + base64.b64encode(source.encode()).decode()
                   for name, source in js_modules().items()}
        importmap = _script_json({"imports": imports})
        css = (STATIC / "style.css").read_text(encoding="utf-8")
        style = f"<style>{css}</style>"
        data = f'<script type="application/json" id="af-data">{_script_json(exported)}</script>'
        # data: is needed for the modules; nothing on the page is ever parsed as HTML, so no script can be added
        csp = (f"default-src 'none'; script-src {csp_hash(importmap)} {csp_hash(BOOT)} data:; "
               f"style-src {csp_hash(css)}; img-src data:; base-uri 'none'; form-action 'none'")
    meta = f'<meta http-equiv="Content-Security-Policy" content="{csp}">' if exported is not None else ""
    html = (template.replace("{{title}}", title.replace("&", "&amp;").replace("<", "&lt;"))
            .replace("{{csp}}", meta)
            .replace("{{importmap}}", f'<script type="importmap">{importmap}</script>')
            .replace("{{style}}", style).replace("{{data}}", data)
            .replace("{{boot}}", f'<script type="module">{BOOT}</script>'))
    return Page(html=html, csp=csp)
