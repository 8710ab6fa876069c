"""The planner prefix: only planner prompts get it, the prefix is prompt (not trained), the reply text has it."""

from agentflow.engines.base import Completion, SamplingParams
from agentflow.engines.hf import TransformersEngine
from agentflow.planner import PLANNER_SYSTEM
from agentflow.train.policy import PrefixedPlannerEngine, PrefixingTokenizer

PLANNER = [{"role": "system", "content": PLANNER_SYSTEM}, {"role": "user", "content": "Question: q"}]
OTHER = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "x"}]


class FakeTokenizer:
    pad_token_id = 0
    eos_token_id = 2
    padding_side = "right"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "|".join(m["content"] for m in messages) + ("<assistant>" if add_generation_prompt else "")


def test_prefix_follows_the_generation_prompt_of_planner_calls_only():
    tok = PrefixingTokenizer(FakeTokenizer(), '{"tool_name": "')
    assert tok.apply_chat_template(PLANNER, tokenize=False, add_generation_prompt=True).endswith(
        '<assistant>{"tool_name": "')
    assert tok.apply_chat_template(OTHER, tokenize=False, add_generation_prompt=True).endswith("<assistant>")
    assert not tok.apply_chat_template(PLANNER, tokenize=False).endswith('"')
    tok.padding_side = "left"  # settings reach the wrapped tokenizer
    assert tok.raw.padding_side == "left" and tok.pad_token_id == 0


async def test_planner_reply_text_starts_with_the_prefix_and_ids_are_the_sampled_ones(monkeypatch):
    async def sampled(self, messages, sampling, *, json_schema=None, adapter=None):
        return Completion(text='python", "sub_goal": "x"}', prompt_token_ids=[1, 2], token_ids=[5, 6],
                          logprobs=[-0.1, -0.2])

    monkeypatch.setattr(TransformersEngine, "generate", sampled)
    engine = PrefixedPlannerEngine(model=object(), tokenizer=FakeTokenizer(), prefix='{"tool_name": "')
    reply = await engine.generate(PLANNER, SamplingParams())
    assert reply.text == '{"tool_name": "python", "sub_goal": "x"}'
    assert reply.token_ids == [5, 6] and reply.logprobs == [-0.1, -0.2]
    other = await engine.generate(OTHER, SamplingParams())
    assert other.text.startswith("python")


def test_the_prefix_replaces_schema_decoding() -> None:
    # A JSON grammar begins at "{", which the prefix has already written: a schema on this engine would make
    # every planner call fail (and the replayed masks would not match what was sampled).
    engine = PrefixedPlannerEngine(model=object(), tokenizer=FakeTokenizer(), prefix='{"tool_name": "')
    assert engine.supports_json_schema is False
