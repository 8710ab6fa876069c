"""Keep library chatter (transformers' deprecation and generation-flag notices, progress bars) out of the
commands' output.

`agentflow solve`, `eval`, `train` and `tool run` print steps, progress and answers; a transformers notice such as
"`is_gradient_checkpointing` is deprecated" or "generation flags are not valid ... top_k" in the middle of them
says nothing about the run. `--verbose` keeps them.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# libraries whose FutureWarning / DeprecationWarning notices are about their own next versions, not our runs
_NOISY = r"(transformers|peft|accelerate|torch)(\.|$)"


def quiet_libraries(verbose: bool = False) -> None:
    """Silence library notices below errors, unless `verbose`. Safe to call more than once."""
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # "Writing model shards" bars of save_pretrained
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=_NOISY)
    if "transformers" in sys.modules:  # already imported: its verbosity was read, set it directly
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
