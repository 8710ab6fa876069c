"""benchmarks/tool_choice_probe.py reads an action's probability as the flow's constrained reply draws it: the total
of the tokens that start it, and for a token that starts several actions ("p": `python` and `product_catalog`) its
share by the token after it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tool_choice_probe.py"
spec = importlib.util.spec_from_file_location("tool_choice_probe", SCRIPT)
assert spec is not None and spec.loader is not None
probe_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_module)

PIECES = ["w", "wiki", "p", "python", "ython", "roduct", "product", "a", "answer", "x", "", "ro"]
ACTIONS = ["wikipedia_search", "python", "product_catalog", "answer"]


class Vocab:
    """A tokenizer's `decode` and length over a list of pieces."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def __len__(self) -> int:
        return len(self.pieces)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def make_probe(actions: list[str] = ACTIONS, pieces: list[str] = PIECES):
    probe = object.__new__(probe_module.Probe)  # the reading alone: no model, no flow
    probe.tokenizer, probe.actions = Vocab(pieces), actions
    probe.starts, probe.shared = probe.action_starts()
    return probe


def test_a_token_that_starts_two_actions_is_split_by_the_token_after_it():
    probe = make_probe()
    assert probe.starts == [[0, 1], [3], [6], [7, 8]]
    assert probe.shared == {2: {1: [4], 2: [5, 11]}}  # "p" then "ython" / "roduct", "ro"


def test_the_action_probabilities_are_those_of_the_two_draws():
    probe = make_probe()
    torch.manual_seed(0)
    first, after = torch.randn(3, len(PIECES)), torch.randn(3, len(PIECES))
    temperature = 0.7
    got = torch.softmax(probe.action_logits(probe_module.NextLogits(first, {2: after}), temperature), -1)

    # the schema allows every token that begins an action where the value starts, then after "p" the tokens
    # that make it one of its two actions: each draw is a softmax over what it allows
    starts = [0, 1, 2, 3, 6, 7, 8]
    p_first = torch.zeros_like(first)
    p_first[:, starts] = torch.softmax(first[:, starts] / temperature, -1)
    p_after = torch.zeros_like(after)
    p_after[:, [4, 5, 11]] = torch.softmax(after[:, [4, 5, 11]] / temperature, -1)
    want = torch.stack([
        p_first[:, 0] + p_first[:, 1],
        p_first[:, 3] + p_first[:, 2] * p_after[:, 4],
        p_first[:, 6] + p_first[:, 2] * (p_after[:, 5] + p_after[:, 11]),
        p_first[:, 7] + p_first[:, 8]], -1)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got.sum(-1), torch.ones(3))


def test_greedy_follows_the_shared_token_to_its_best_continuation():
    probe = make_probe()
    first = torch.zeros(1, len(PIECES))
    first[0, 2] = 5.0  # "p" is the greedy first token
    first[0, 3] = 4.0  # "python" the best token of its own
    after = torch.zeros(1, len(PIECES))
    after[0, 11] = 3.0  # "ro": product_catalog
    greedy = probe.action_logits(probe_module.NextLogits(first, {2: after}), 0.0)
    assert ACTIONS[int(greedy.argmax())] == "product_catalog"
    after[0, 4] = 4.0  # "ython" now the better continuation
    greedy = probe.action_logits(probe_module.NextLogits(first, {2: after}), 0.0)
    assert ACTIONS[int(greedy.argmax())] == "python"


def test_a_choice_three_tokens_deep_is_refused():
    with pytest.raises(SystemExit, match="two tokens deep"):
        make_probe(["python", "pyre"], ["p", "y", "thon", "re"])


class Padder:
    """A tokenizer's batch call over prompts written as space-separated token ids, padded on the left."""

    def __call__(self, prompts, **_):
        rows = [[int(t) for t in prompt.split()] for prompt in prompts]
        width = max(map(len, rows))
        return {"input_ids": torch.tensor([[0] * (width - len(r)) + r for r in rows]),
                "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])}


def test_one_pass_reads_the_next_token_and_the_token_after_a_shared_one():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    probe = make_probe()  # "p" (2) starts two actions
    probe.tokenizer = Padder()
    probe.model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(PIECES), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).eval()
    prompts = ["5 3 9 1", "7 4"]
    got = probe.next_logits(prompts)
    with torch.no_grad():
        for k, prompt in enumerate(prompts):  # each prompt alone, unpadded, one pass a reading
            ids = torch.tensor([[int(t) for t in prompt.split()]])
            assert torch.allclose(got.first[k], probe.model(input_ids=ids).logits[0, -1], atol=1e-5)
            continued = torch.cat([ids, torch.tensor([[2]])], 1)
            assert torch.allclose(got.after[2][k], probe.model(input_ids=continued).logits[0, -1], atol=1e-5)
