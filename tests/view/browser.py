"""A real headless Chromium for the viewer's tests: Debian's `chromium` driven by Playwright, never a browser
that Playwright downloads. Without it the browser tests skip, except under CI, where they must run."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflow.view.api import ViewApp
from agentflow.view.server import ViewServer

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def expect(target: Any) -> Any:
    """Playwright's retrying assertions (imported here, so that this module loads without playwright)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)


def require_chromium() -> None:
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is missing (pip install -e '.[dev]')"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests, but {missing}; .ci/run installs chromium")
        pytest.skip(f"browser tests need Debian's chromium and playwright: {missing}")


@contextlib.contextmanager
def serving(paths: list[Path]) -> Iterator[str]:
    """A viewer server on a free port; yields its URL."""
    server = ViewServer(ViewApp(paths))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()


class Watched:
    """A page whose script errors and console errors are collected (a CSP violation is a console error)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("pageerror", lambda err: self.errors.append(f"page error: {err}"))
        page.on("console", lambda msg: self.errors.append(f"console: {msg.text}") if msg.type == "error" else None)

    def open(self, url: str) -> Any:
        self.page.goto(url)
        return self.ready()

    def ready(self, timeout_s: float = 60.0) -> Any:
        """Wait until the page for the current address is drawn. (Polled from here: Playwright's
        wait_for_function evaluates a string, which the page's Content-Security-Policy forbids.) The limit is
        for a page that never draws: on a busy 2-core machine a healthy first page took more than 15 s."""
        for _ in range(int(timeout_s * 10)):
            state = self.page.evaluate("[document.body.dataset.ready ?? null, location.hash || '#/']")
            if state[0] is not None and state[1].startswith("#" + state[0]):
                return self.page
            self.page.wait_for_timeout(100)
        raise AssertionError(f"{self.page.url} was not drawn in {timeout_s} s: {self.errors}")

    def click(self, selector: str, **options: Any) -> Any:
        self.page.evaluate("delete document.body.dataset.ready")
        self.page.locator(selector, **options).first.click()
        return self.ready()
