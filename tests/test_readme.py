"""The README's two set-up commands are what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_commands_verbatim():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)
    install, tests = blocks[0].strip(), blocks[1].strip()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install in ci and tests in ci
    assert ci.index(install) < ci.index(tests)
    assert "torch==2.13.0" in install and install.index("torch==") < install.index("pip install -e")
