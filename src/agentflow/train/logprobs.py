"""Log-probs of response tokens under a causal LM, for training rows of different lengths.

Rows are left-padded so every response ends at the last position, with position ids from the attention mask
(padding does not shift positions). The decoder runs over all positions; the LM head only over the last
`longest response + 1` (prompts, most of the tokens, never pay for the vocabulary-wide softmax), and in
chunks of rows under activation checkpointing: backward recomputes a chunk's logits instead of keeping the
(rows, tokens, vocabulary) float32 tensor of the whole micro-batch alive, so the update's peak memory is that
of one chunk's logits, not of all rows.

The prompt tokens every row of an update begins with (the planner's system message) can run through the decoder
once (`SharedPrefix`): each micro-batch then reads their keys and values from a cache instead of computing them
again per row, and their gradient flows back through the one prefix pass. Same log-probs and gradient up to
float rounding; ~20 % fewer tokens per update in the mixed-task flow.

Rows of a JSON-schema-constrained reply carry the masks decoding applied (`allowed`): the log-prob is then
that of the masked distribution the token was drawn from (a forced token has log-prob 0 and no gradient).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:  # keeps this module free of the flow's imports (benchmarks load it alone)
    from agentflow.train.rollout import TurnRow

log = logging.getLogger(__name__)

#: Logit elements (rows x tokens x vocabulary) materialised at once by the LM head: 64 MiB of float32.
LOGITS_CHUNK_ELEMENTS = 1 << 24


@dataclass
class PackedRows:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    """(N, R) right-aligned response tokens (left-padded with 0)."""
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    allowed: torch.Tensor | None = None
    """(N, R, V) booleans: the tokens each response token could have been drawn from; None: all."""
    token_weights: torch.Tensor | None = None
    """(N, R) importance weights of each response token's policy gradient (TIS); None: all 1."""
    action_sets: list[tuple[int, int, list[int] | None, list[list[int]] | None]] | None = None
    """(row, response position, tokens, choices) of rows with `TurnRow.action_tokens` or `.action_choices`: the
    position's log-prob is the total of `tokens`' probabilities, not the drawn token's (None: the drawn
    token's), and its entropy that of the distribution over `choices` (None: over the tokens); None: no such
    row."""
    prefix: int = 0
    """Prompt tokens left out of `input_ids` (every row's first `prefix`, read from a `SharedPrefix`)."""

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum())


def pack_rows(rows: Sequence[TurnRow], *, pad_id: int, device: torch.device | str = "cpu",
              allowed: Sequence[torch.Tensor | None] | None = None, vocab_size: int | None = None,
              prefix: int = 0) -> PackedRows:
    """Left-pad `rows` into tensors; `allowed[i]` is row i's (len(response), V) mask or None (unconstrained).
    `prefix`: leave out every row's first `prefix` prompt tokens (a `SharedPrefix` holds them); positions count
    them."""
    lengths = [len(r.prompt_ids) - prefix + len(r.response_ids) for r in rows]
    width = max(lengths)
    resp_width = max(len(r.response_ids) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, resp_width), dtype=torch.long)
    response_mask = torch.zeros((n, resp_width), dtype=torch.float32)
    old = torch.zeros((n, resp_width), dtype=torch.float32)
    weights = torch.ones((n, resp_width), dtype=torch.float32) if any(
        r.tis_weights is not None for r in rows) else None
    masks = None
    if allowed is not None and any(a is not None for a in allowed):
        if vocab_size is None:
            raise ValueError("pack_rows needs vocab_size with allowed-token masks")
        masks = torch.ones((n, resp_width, vocab_size), dtype=torch.bool)
    for i, row in enumerate(rows):
        seq = row.prompt_ids[prefix:] + row.response_ids
        input_ids[i, width - len(seq):] = torch.tensor(seq)
        attention[i, width - len(seq):] = 1
        k = len(row.response_ids)
        response[i, resp_width - k:] = torch.tensor(row.response_ids)
        response_mask[i, resp_width - k:] = 1.0
        old[i, resp_width - k:] = torch.tensor(row.old_logprobs)
        if weights is not None and row.tis_weights is not None:
            weights[i, resp_width - k:] = torch.tensor(row.tis_weights)
        if masks is not None and allowed is not None and allowed[i] is not None:
            mask = allowed[i]
            if mask.shape != (k, vocab_size):
                raise ValueError(f"row {i}: allowed-token mask {tuple(mask.shape)} != ({k}, {vocab_size})")
            masks[i, resp_width - k:] = mask
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0) + prefix
    action_sets = [(i, resp_width - len(row.response_ids) + row.action, row.action_tokens, row.action_choices)
                   for i, row in enumerate(rows)
                   if (row.action_tokens or row.action_choices) and row.action is not None and row.action >= 0]
    return PackedRows(input_ids.to(device), attention.to(device), position_ids.to(device), response.to(device),
                      response_mask.to(device), old.to(device), None if masks is None else masks.to(device),
                      None if weights is None else weights.to(device), action_sets or None, prefix)


def _token_logprobs(head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor, allowed: torch.Tensor | None,
                    temperature: float, entropy_grad: bool = False,
                    action_sets: Sequence[tuple[int, int, list[int] | None, list[list[int]] | None]] | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-prob of `ids` and entropy (with gradient only if `entropy_grad`) of the (masked, tempered)
    distribution at each position, and the raw log-prob of `ids` (temperature 1, no mask; no grad), what
    another engine reports. `action_sets` (`PackedRows.action_sets`, rows of this chunk): those positions' log-prob
    is that of their tokens together, their entropy that of the choice among their token groups."""
    logits = head(hidden).float()
    with torch.no_grad():
        raw = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if temperature and temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    # token logit - logsumexp: autograd keeps no (rows, tokens, vocab) log-softmax tensor for backward
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - log_norm
    totals = [(row, position, tokens) for row, position, tokens, _ in action_sets or [] if tokens]
    if totals:
        rows, positions = _index(totals, logits.device)
        chosen = torch.stack([torch.logsumexp(logits[row, position, tokens], dim=-1)
                              for row, position, tokens in totals])
        logprobs = logprobs.index_put((rows, positions), chosen - log_norm[rows, positions])
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.softmax(logits, dim=-1)
        # masked logits are -inf where their probability is 0: their term is 0 (a finite stand-in keeps the
        # product's gradient finite)
        weighted = probs * logits.masked_fill(probs == 0, 0.0)
        entropy = log_norm - weighted.sum(-1)
        grouped = [(row, position, choices) for row, position, _, choices in action_sets or [] if choices]
        if grouped:
            rows, positions = _index(grouped, logits.device)
            entropy = entropy.index_put((rows, positions), torch.stack([
                _choice_entropy(logits[row, position], choices) for row, position, choices in grouped]))
    return logprobs, entropy, raw


def _index(entries: Sequence[tuple[Any, ...]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rows, positions) index tensors of `entries` (row, position, ...)."""
    return (torch.tensor([entry[0] for entry in entries], device=device),
            torch.tensor([entry[1] for entry in entries], device=device))


def _choice_entropy(logits: torch.Tensor, choices: list[list[int]]) -> torch.Tensor:
    """Entropy of the choice among `choices` (groups of token ids that together hold every token with
    probability > 0) under the (V,) `logits`: each group's probability is the total of its tokens'."""
    log_p = torch.log_softmax(torch.stack([torch.logsumexp(logits[tokens], dim=-1) for tokens in choices]), dim=-1)
    return -(log_p.exp() * log_p).sum()


def plain_lm_head(model: torch.nn.Module) -> bool:
    """Whether logits == output_embedding(decoder(...)) for this model, checked once on a short input: true
    for Llama, Qwen, Mistral, SmolLM; false for models that scale or soft-cap their logits. Only then may
    `response_logprobs` run the LM head itself, in checkpointed chunks (`chunked_head=True`)."""
    try:
        head, decoder = model.get_output_embeddings(), model.get_decoder()
        device = next(model.parameters()).device
        ids = torch.arange(1, 9, device=device).unsqueeze(0) % max(head.weight.shape[0], 2)
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits.float()
            split = head(decoder(input_ids=ids, use_cache=False).last_hidden_state).float()
        return full.shape == split.shape and torch.allclose(full, split, rtol=1e-3, atol=1e-3)
    except (AttributeError, NotImplementedError, TypeError):
        return False


#: The shortest common prompt start worth a prefix pass of its own (`SharedPrefix.of`).
MIN_SHARED_PREFIX = 16


class SharedPrefix:
    """The prompt tokens that every row of an optimiser step begins with, run through the decoder once.

    `of` runs them (with gradient when it is on) and keeps each layer's keys and values; micro-batches attend to
    detached copies of them (`inputs`) and only add their gradient there; `backward` then sends the total through
    the prefix pass once. The rows' log-probs and the parameters' gradient are those of the whole rows, up to float
    rounding (tested). Under activation checkpointing a recomputed layer would append its keys to the cache a
    second time, so the updater shares no prefix then."""

    def __init__(self, length: int, outputs: list[torch.Tensor], cache_argument: str) -> None:
        self.length = length
        self.outputs = outputs
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in outputs]
        self.cache_argument = cache_argument  # the decoder's name for its cache in this transformers version

    @classmethod
    def of(cls, model: torch.nn.Module, rows: Sequence[TurnRow], *, device: torch.device | str = "cpu",
           minimum: int = MIN_SHARED_PREFIX) -> SharedPrefix | None:
        """The rows' common prompt start (at least `minimum` tokens, and one prompt token left in every row),
        computed; None when it is shorter or there are fewer than two rows."""
        if len(rows) < 2:
            return None
        first, length = rows[0].prompt_ids, min(len(r.prompt_ids) for r in rows) - 1
        for row in rows[1:]:
            length = next((i for i, (a, b) in enumerate(zip(first[:length], row.prompt_ids, strict=False))
                           if a != b), length)
        if length < minimum:
            return None
        return cls.run(model, torch.tensor([first[:length]], device=device))

    @classmethod
    def run(cls, model: torch.nn.Module, ids: torch.Tensor) -> SharedPrefix:
        """The (1, length) prompt start `ids` through the decoder, its keys and values kept."""
        decoder = model.get_decoder()
        out = decoder(input_ids=ids, use_cache=True)
        cache = out["cache"] if "cache" in out else out.past_key_values  # named `cache` since transformers 5
        layers = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else \
            list(zip(cache.key_cache, cache.value_cache, strict=True))
        name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
        return cls(ids.shape[1], [t for pair in layers for t in pair], name)

    def inputs(self, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The forward pass's arguments for rows packed without the prefix (`attention_mask` over the rest): the
        whole attention mask and a fresh cache holding the prefix's keys and values for each row (views)."""
        from transformers import DynamicCache

        rows = attention_mask.shape[0]
        cache = DynamicCache()
        for layer in range(len(self.leaves) // 2):
            keys, values = self.leaves[2 * layer], self.leaves[2 * layer + 1]
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
        ones = torch.ones((rows, self.length), dtype=attention_mask.dtype, device=attention_mask.device)
        return {"attention_mask": torch.cat([ones, attention_mask], dim=1), self.cache_argument: cache}

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the prefix's keys and values through the prefix pass."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves, strict=True)
                 if out.requires_grad and leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self.outputs, self.leaves = [], []


def prefix_sharing_exact(model: torch.nn.Module) -> bool:
    """Whether this model's decoder gives the same hidden states when a prompt start comes from a `SharedPrefix`,
    checked once on a short input (true for Llama, Qwen, Mistral, SmolLM); otherwise no prefix is shared, and
    the reason is logged."""
    try:
        device = next(model.parameters()).device
        vocab = max(model.get_output_embeddings().weight.shape[0], 2)
        ids = (torch.arange(3, 3 + 2 * MIN_SHARED_PREFIX, device=device) % vocab).unsqueeze(0)
        rest = ids[:, MIN_SHARED_PREFIX:]
        positions = torch.arange(MIN_SHARED_PREFIX, ids.shape[1], device=device).unsqueeze(0)
        with torch.no_grad():
            full = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
            prefix = SharedPrefix.run(model, ids[:, :MIN_SHARED_PREFIX])
            split = model.get_decoder()(input_ids=rest, position_ids=positions, use_cache=False,
                                        **prefix.inputs(torch.ones_like(rest))).last_hidden_state[:, -1]
    except (AttributeError, NotImplementedError, TypeError, ValueError, RuntimeError) as err:
        # a model or transformers version without this cache interface: every row is computed whole
        log.info("the update computes every row whole: this model's decoder cannot read a shared prompt start "
                 "from a cache (%s: %s)", type(err).__name__, err)
        return False
    if not torch.allclose(full.float(), split.float(), rtol=1e-3, atol=1e-3):
        log.info("the update computes every row whole: this model's decoder gives other hidden states when a "
                 "prompt start comes from a cache")
        return False
    return True


def response_logprobs(model: torch.nn.Module, packed: PackedRows, *, temperature: float = 1.0,
                      with_entropy: bool = False, with_raw: bool = False, chunked_head: bool = False,
                      entropy_grad: bool = False, prefix: SharedPrefix | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(N, R) log-probs of the response tokens under logits / temperature (masked by `packed.allowed`), their
    entropies (no grad unless `entropy_grad`: an entropy term in the loss) and their raw log-probs
    (temperature 1, no mask, no grad: to compare with what another engine reported), the last two None unless
    asked for.

    The temperature must be the rollout's sampling temperature, so that the ratio compares the same
    distributions the rollout sampled from. `chunked_head` (only where `plain_lm_head(model)`): run the LM
    head in checkpointed chunks of rows; otherwise the model's own forward makes every row's logits at once.
    `prefix`: the rows were packed without the prompt start it holds (`pack_rows(prefix=prefix.length)`).
    """
    resp_width = packed.response_ids.shape[1]
    if packed.prefix != (prefix.length if prefix else 0):
        raise ValueError(f"rows packed without {packed.prefix} prompt tokens, but the shared prefix holds "
                         f"{prefix.length if prefix else 0}")
    inputs = prefix.inputs(packed.attention_mask) if prefix else {"attention_mask": packed.attention_mask}
    if not chunked_head:
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, logits_to_keep=resp_width + 1,
                    use_cache=False, **inputs)
        logprobs, entropy, raw = _token_logprobs(torch.nn.Identity(), out.logits[:, -resp_width - 1:-1, :],
                                                 packed.response_ids, packed.allowed, temperature, entropy_grad,
                                                 packed.action_sets)
        return (logprobs * packed.response_mask, entropy if with_entropy else None,
                raw * packed.response_mask if with_raw else None)
    head = model.get_output_embeddings()
    out = model.get_decoder()(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                              **inputs)
    hidden = out.last_hidden_state[:, -resp_width - 1:-1, :]
    vocab = head.weight.shape[0]
    rows_per_chunk = max(1, LOGITS_CHUNK_ELEMENTS // max(resp_width * vocab, 1))
    parts: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    raws: list[torch.Tensor] = []
    for start in range(0, hidden.shape[0], rows_per_chunk):
        stop = start + rows_per_chunk
        allowed = None if packed.allowed is None else packed.allowed[start:stop]
        sets = [(row - start, *rest) for row, *rest in packed.action_sets or [] if start <= row < stop]
        args: tuple[Any, ...] = (head, hidden[start:stop], packed.response_ids[start:stop], allowed, temperature,
                                 entropy_grad, sets)
        if torch.is_grad_enabled() and hidden.requires_grad:
            logprobs, entropy, raw = checkpoint(_token_logprobs, *args, use_reentrant=False)
        else:
            logprobs, entropy, raw = _token_logprobs(*args)
        parts.append(logprobs)
        entropies.append(entropy)
        raws.append(raw)
    logprobs = torch.cat(parts) * packed.response_mask
    return (logprobs, torch.cat(entropies) if with_entropy else None,
            torch.cat(raws) * packed.response_mask if with_raw else None)


def _action_property(schema: dict[str, Any] | None) -> tuple[str, list[Any]] | None:
    """The schema's first enum-valued property (the planner's `tool_name`) and its values, or None."""
    properties = (schema or {}).get("properties", {})
    return next(((name, list(spec["enum"])) for name, spec in properties.items()
                 if isinstance(spec, dict) and "enum" in spec), None)


def action_index(response_ids: Sequence[int], schema: dict[str, Any] | None,
                 decode: Callable[[list[int]], str]) -> int | None:
    """Where a constrained reply's action is: the index of the first token of the value of its schema's first
    enum-valued property (the planner's `tool_name`), found in the text as the compact JSON layout writes it;
    -1 when the reply never got there (cut); None when the schema has no such property."""
    found = _action_property(schema)
    if found is None:
        return None
    key = found[0]
    opening, text = f'"{key}": "', ""
    for i, token in enumerate(response_ids):  # token by token: the key is ASCII, so no split character hides it
        if text.endswith(opening):
            return i
        text += decode([token])
    return -1


def free_positions(packed: PackedRows) -> torch.Tensor:
    """(N, R) booleans: response positions where more than one token could be drawn (every response position
    of an unconstrained row)."""
    free = packed.response_mask.bool()
    if packed.allowed is not None:
        free = free & (packed.allowed.sum(-1) > 1)
    return free


def action_positions(packed: PackedRows, actions: Sequence[int | None] | None = None,
                     free: torch.Tensor | None = None) -> torch.Tensor:
    """(N, R) booleans: each row's action. `actions[i]`: row i's action index in its response
    (`TurnRow.action`; -1: none); where it is None, the first response position where more than one token could
    be drawn: under the planner's tool-first schema that is the tool (its reply opens with the forced
    `{"tool_name": "`); an unconstrained row's action is its first token. `free`: `free_positions(packed)`,
    if the caller has it already."""
    free = free_positions(packed) if free is None else free
    positions = free & (free.cumsum(dim=1) == 1)
    for i, index in enumerate(actions or []):
        if index is None:
            continue
        positions[i] = False
        if index >= 0:
            length = int(packed.response_mask[i].sum())
            positions[i, positions.shape[1] - length + index] = True
    return positions


def micro_batches(rows: Sequence[TurnRow], *, max_rows: int, max_tokens: int, prefix: int = 0) -> list[list[int]]:
    """Row indices grouped into micro-batches of similar length (less padding), each within both caps; the
    tokens counted leave out the first `prefix` of each row (a `SharedPrefix` holds them)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids) + len(rows[i].response_ids))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = len(rows[i].prompt_ids) - prefix + len(rows[i].response_ids)
        if current and (len(current) >= max_rows or max(longest, length) * (len(current) + 1) > max_tokens):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def action_tokens(response_ids: Sequence[int], action: int, allowed: torch.Tensor, schema: dict[str, Any],
                  decode: Callable[[list[int]], str]) -> list[int] | None:
    """The tokens a constrained reply could have started its action with that start the same value as the one it
    drew (for `python`: "p", "py", "python", whichever the tokenizer has): the tokens `allowed` (the (vocab,)
    mask at `action`, the index `action_index` found) whose text begins that value of the schema's enum and no
    other. The total of their probabilities is the policy's probability of choosing that value. None when the
    reply's text there is no whole value (cut) or its drawn token begins several values (the choice is made
    later)."""
    found = _action_property(schema)
    if found is None:
        return None
    values = [str(v) for v in found[1]]
    text = decode(list(response_ids[action:]))
    chosen = next((v for v in sorted(values, key=len, reverse=True) if text.startswith(v + '"')), None)
    if chosen is None:
        return None

    tokens = [t for t in allowed.nonzero().flatten().tolist() if values_begun(decode([t]), values) == [chosen]]
    return tokens if response_ids[action] in tokens else None


def action_choices(allowed: torch.Tensor, schema: dict[str, Any] | None,
                   decode: Callable[[list[int]], str]) -> list[list[int]] | None:
    """The tokens `allowed` at an action (the (vocab,) mask at `action_index`) grouped by the choice each one
    makes: for each value of the schema's enum, the tokens that begin it and no other (`action_tokens`' sets),
    and every other allowed token (one that begins several values) as a group of its own. The entropy over the
    groups is that of the choice of tool (`action_logprob: tool`), where the entropy over the tokens also
    counts a tool's several spellings. None when the schema has no enum-valued property."""
    found = _action_property(schema)
    if found is None:
        return None
    values = [str(v) for v in found[1]]
    groups: dict[str, list[int]] = {}
    alone: list[list[int]] = []
    for token in allowed.nonzero().flatten().tolist():
        begun = values_begun(decode([token]), values)
        if len(begun) == 1:
            groups.setdefault(begun[0], []).append(token)
        else:
            alone.append([token])
    return list(groups.values()) + alone


def values_begun(piece: str, values: list[str]) -> list[str]:
    """The enum values (of a JSON string) that a reply whose value starts with `piece` can still be."""
    return [v for v in values if piece and (v.startswith(piece) or piece.startswith(v + '"'))]
