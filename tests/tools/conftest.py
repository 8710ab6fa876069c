"""Fixtures of the tool tests."""

from tests.tools.fake_http import http_server

__all__ = ["http_server"]
