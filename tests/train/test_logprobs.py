"""Packed, left-padded log-probs equal per-row unpadded ones; micro-batches respect both caps."""

import pytest
import torch

from agentflow.train.logprobs import micro_batches, pack_rows, response_logprobs
from agentflow.train.rollout import TurnRow


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def reference(model, row, temperature):
    ids = torch.tensor([row.prompt_ids + row.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    p = len(row.prompt_ids)
    return [logp[p - 1 + t, tok].item() for t, tok in enumerate(row.response_ids)]


def test_packed_rows_match_unpadded_forward(tiny_model):
    rows = [TurnRow(0, [1, 2, 3, 4, 5], [6, 7], [0.0, 0.0]), TurnRow(0, [8, 9], [10, 11, 12, 13], [0.0] * 4)]
    packed = pack_rows(rows, pad_id=0)
    with torch.no_grad():
        logprobs, entropy, _ = response_logprobs(tiny_model, packed, temperature=0.7, with_entropy=True)
    assert packed.response_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert logprobs[0, 2:].tolist() == pytest.approx(reference(tiny_model, rows[0], 0.7), abs=1e-5)
    assert logprobs[1].tolist() == pytest.approx(reference(tiny_model, rows[1], 0.7), abs=1e-5)
    assert logprobs[0, :2].tolist() == [0.0, 0.0]
    assert entropy is not None and (entropy[packed.response_mask.bool()] > 0).all()


def test_micro_batches_respect_row_and_token_caps():
    rows = [TurnRow(0, [1] * n, [2] * 4, [0.0] * 4) for n in (10, 2, 30, 5, 6)]
    batches = micro_batches(rows, max_rows=2, max_tokens=30)
    assert sorted(i for b in batches for i in b) == list(range(5))
    for batch in batches:
        longest = max(len(rows[i].prompt_ids) + len(rows[i].response_ids) for i in batch)
        assert len(batch) <= 2 and (len(batch) == 1 or longest * len(batch) <= 30)
