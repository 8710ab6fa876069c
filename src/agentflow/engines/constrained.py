"""JSON-schema-constrained decoding for the transformers engine, with llguidance.

Each row of a batched `generate` gets its own llguidance matcher; before every sampling step the row's
scores are masked to the tokens its schema allows next, and the sampled token is fed back to the matcher on
the following step. Once the matcher has completed the JSON value, only an end-of-sequence token remains.

The mask only restricts what is drawn. The log-probs the engine reports are those of the unmasked policy
(log softmax of logits / T), which is what a trainer recomputes from the same ids: the importance ratio of
on-policy samples starts at exactly 1, and the gradient raises the model's own probability of the tokens
that earned reward, so the trained model also needs the mask less.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import numpy as np
import torch

from agentflow.errors import EngineBadRequestError

log = logging.getLogger(__name__)

#: One layout, as `json.dumps` writes it: a weak model cannot spend its token budget on whitespace.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class SchemaConstraints:
    """Compiles JSON schemas for one tokenizer (cached) and makes per-batch logits processors."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]) -> None:
        import llguidance
        import llguidance.hf

        self._llguidance = llguidance
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        # about 0.3 s for a 49k vocabulary; n_vocab = the model's logits width (it may exceed the tokenizer's)
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=self.eos_ids[0])
        self._grammars: dict[str, str] = {}
        self._lock = threading.Lock()

    def grammar(self, schema: dict[str, Any]) -> str:
        key = json.dumps(schema, sort_keys=True)
        with self._lock:
            if key not in self._grammars:
                grammar = self._llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)
                failed, messages = self._llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
                if failed:
                    raise EngineBadRequestError(
                        f"JSON schema not usable for constrained decoding: {'; '.join(messages)}")
                self._grammars[key] = grammar
            return self._grammars[key]

    def processor(self, schema: dict[str, Any], rows: int, prompt_width: int) -> SchemaMask:
        grammar = self.grammar(schema)
        matchers = [self._llguidance.LLMatcher(self._tokenizer, grammar) for _ in range(rows)]
        return SchemaMask(matchers, prompt_width, self.eos_ids)


class SchemaMask:
    """A transformers logits processor: row i may only continue as its matcher allows."""

    def __init__(self, matchers: list[Any], prompt_width: int, eos_ids: list[int]) -> None:
        self.matchers = matchers
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.finished = [False] * len(matchers)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] > self.prompt_width:  # feed each row the token sampled at the previous step
            for row, token in enumerate(input_ids[:, -1].tolist()):
                if self.finished[row]:
                    continue
                if token in self.eos_ids:
                    self.finished[row] = True
                elif not self.matchers[row].consume_token(token):  # cannot happen under the mask; never hide it
                    self.finished[row] = True
                    log.warning("constrained decoding: row %d left its grammar (%s); the rest is unconstrained",
                                row, self.matchers[row].get_error() or f"token {token} rejected")
        allowed = np.zeros((len(self.matchers), scores.shape[1]), dtype=bool)
        for row, matcher in enumerate(self.matchers):
            if self.finished[row]:
                allowed[row] = True  # generate pads a finished row; what it would draw does not matter
            elif matcher.is_stopped():
                allowed[row, self.eos_ids] = True
            else:
                bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
                width = min(scores.shape[1], bits.shape[0])
                allowed[row, :width] = bits[:width].astype(bool)
        mask = torch.from_numpy(allowed).to(scores.device)
        return scores.masked_fill(~mask, float("-inf"))
