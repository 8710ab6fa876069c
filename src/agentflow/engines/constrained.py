"""JSON-schema-constrained decoding for the transformers engine, with llguidance.

Each row of a batched `generate` gets its own llguidance matcher; before every sampling step the row's
scores are masked to the tokens its schema allows next, and the sampled token is fed back to the matcher on
the following step. Once the matcher has completed the JSON value, only an end-of-sequence token remains.

The policy that acts is the masked one: tokens are drawn from q = softmax over the allowed tokens of
logits / T, and q is what the engine reports log-probs of and what a trainer must differentiate. A token the
grammar forces (the only one allowed) has q = 1: log q = 0 whatever the weights, so it carries no gradient;
at a choice such as the tool name, the gradient moves probability only among the names the sampler can emit.
`SchemaConstraints.replay` rebuilds the masks of a finished reply from its token ids, with the same rules as
decoding (`next_token_mask`), so the trainer recomputes exactly the distribution the rollout sampled from.
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

    def matcher(self, schema: dict[str, Any]) -> Any:
        return self._llguidance.LLMatcher(self._tokenizer, self.grammar(schema))

    def processor(self, schema: dict[str, Any], rows: int, prompt_width: int) -> SchemaMask:
        return SchemaMask([self.matcher(schema) for _ in range(rows)], prompt_width, self.eos_ids)

    def replay(self, schema: dict[str, Any], token_ids: list[int]) -> np.ndarray:
        """The (len(token_ids), vocab) boolean masks decoding applied before drawing each of `token_ids`."""
        matcher = self.matcher(schema)
        masks = np.ones((len(token_ids), self.vocab_size), dtype=bool)
        finished = False
        for position, token in enumerate(token_ids):
            if finished:
                break  # everything after an end of sequence or a rejected token was drawn unconstrained
            masks[position] = next_token_mask(matcher, self.vocab_size, self.eos_ids)
            finished = advance(matcher, token, self.eos_ids)
        return masks


def next_token_mask(matcher: Any, vocab_size: int, eos_ids: list[int]) -> np.ndarray:
    """The tokens the schema allows next: those extending valid JSON, or only end-of-sequence once complete."""
    allowed = np.zeros(vocab_size, dtype=bool)
    if matcher.is_stopped():
        allowed[eos_ids] = True
        return allowed
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    width = min(vocab_size, bits.shape[0])
    allowed[:width] = bits[:width].astype(bool)
    return allowed


def advance(matcher: Any, token: int, eos_ids: list[int]) -> bool:
    """Feed the drawn token to the matcher; True when the row is finished (end of sequence, or it left the
    grammar, which cannot happen under the mask and is logged, never hidden)."""
    if token in eos_ids:
        return True
    if matcher.consume_token(token):
        return False
    log.warning("constrained decoding: a row left its grammar (%s); the rest is unconstrained",
                matcher.get_error() or f"token {token} rejected")
    return True


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
                if not self.finished[row]:
                    self.finished[row] = advance(self.matchers[row], token, self.eos_ids)
        allowed = np.ones((len(self.matchers), scores.shape[1]), dtype=bool)
        for row, matcher in enumerate(self.matchers):
            if not self.finished[row]:  # generate pads a finished row; what it would draw does not matter
                allowed[row] = next_token_mask(matcher, scores.shape[1], self.eos_ids)
        mask = torch.from_numpy(allowed).to(scores.device)
        return scores.masked_fill(~mask, float("-inf"))
