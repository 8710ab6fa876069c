"""Log-probs of response tokens under a causal LM, for training rows of different lengths.

Rows are left-padded so every response ends at the last position; the LM head then runs only on the last
`longest response + 1` positions (`logits_to_keep`), not on the prompts, which are most of the tokens.
Position ids are computed from the attention mask, so padding does not shift positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # keeps this module free of the flow's imports (benchmarks load it alone)
    from agentflow.train.rollout import TurnRow


@dataclass
class PackedRows:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    """(N, R) right-aligned response tokens (left-padded with 0)."""
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum())


def pack_rows(rows: Sequence[TurnRow], *, pad_id: int, device: torch.device | str = "cpu") -> PackedRows:
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    width = max(lengths)
    resp_width = max(len(r.response_ids) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, resp_width), dtype=torch.long)
    response_mask = torch.zeros((n, resp_width), dtype=torch.float32)
    old = torch.zeros((n, resp_width), dtype=torch.float32)
    for i, row in enumerate(rows):
        seq = row.prompt_ids + row.response_ids
        input_ids[i, width - len(seq):] = torch.tensor(seq)
        attention[i, width - len(seq):] = 1
        k = len(row.response_ids)
        response[i, resp_width - k:] = torch.tensor(row.response_ids)
        response_mask[i, resp_width - k:] = 1.0
        old[i, resp_width - k:] = torch.tensor(row.old_logprobs)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return PackedRows(input_ids.to(device), attention.to(device), position_ids.to(device), response.to(device),
                      response_mask.to(device), old.to(device))


def response_logprobs(model: torch.nn.Module, packed: PackedRows, *, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, R) log-probs of the response tokens under logits / temperature, and their entropies (no grad).

    The temperature must be the rollout's sampling temperature, so that the ratio compares the same
    distributions the rollout sampled from.
    """
    resp_width = packed.response_ids.shape[1]
    out = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                position_ids=packed.position_ids, logits_to_keep=resp_width + 1, use_cache=False)
    logits = out.logits[:, -resp_width - 1:-1, :].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    # token logit - logsumexp: autograd keeps no (rows, tokens, vocab) log-softmax tensor for backward
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, packed.response_ids.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs * packed.response_mask, entropy


def micro_batches(rows: Sequence[TurnRow], *, max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices grouped into micro-batches of similar length (less padding), each within both caps."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids) + len(rows[i].response_ids))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = len(rows[i].prompt_ids) + len(rows[i].response_ids)
        if current and (len(current) >= max_rows or max(longest, length) * (len(current) + 1) > max_tokens):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches
