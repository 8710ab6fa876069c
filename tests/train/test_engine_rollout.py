"""Rollouts through llama.cpp with the trainer's adapter (`train/engine_rollout.py`) and the update's side of
it (`PolicyUpdater.engine_rows`: recomputed old log-probs, the gap, truncated importance sampling).

The real-model tests run the bundled SmolLM2 in both engines; the trainer-level tests use the tiny random
policy of `test_trainer_resume.py` and a stand-in for the llama.cpp engine that records every sync."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentflow.config import LlamaCppEngineConfig, TransformersEngineConfig
from agentflow.engines.base import Completion, Engine, SamplingParams
from agentflow.engines.hf import TransformersEngine
from agentflow.errors import EngineUnavailableError
from agentflow.train.config import TrainConfig
from agentflow.train.engine_rollout import LlamaCppPolicyEngine, StalePolicyError
from agentflow.train.rollout import TurnRow
from agentflow.train.trainer import Trainer
from agentflow.train.update import PolicyUpdater, UpdateBatch, unmask_disagreeing_rows
from tests.train import test_trainer_resume as tiny

SCHEMA = {"type": "object", "properties": {"tool_name": {"enum": ["python", "wikipedia_search", "answer"]},
                                           "sub_goal": {"type": "string", "maxLength": 40}},
          "required": ["tool_name", "sub_goal"], "additionalProperties": False}
QUESTIONS = ["What is 4821 * 37?", "What is the atomic number of neon?", "Who wrote Hamlet?",
             "What is the square root of 1764?"]


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Pick the tool for the question. Reply in JSON."},
            {"role": "user", "content": question}]


# -- the real model in both engines ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The bundled model with a random LoRA adapter (as after some training), in transformers and llama.cpp."""
    from peft import LoraConfig, get_peft_model

    from agentflow.bundled import bundled_model_path
    from agentflow.engines.hf import load_policy
    from agentflow.train.export import converted_gguf

    torch.manual_seed(0)
    model, tokenizer = load_policy(TransformersEngineConfig(), trainable=True)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                 "o_proj", "up_proj"],
                                             task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.01)
    model.eval()
    trainer_engine = TransformersEngine(TransformersEngineConfig(max_batch_size=8), model=model, tokenizer=tokenizer)
    engine = LlamaCppPolicyEngine(
        LlamaCppEngineConfig(model_path=str(converted_gguf(bundled_model_path(), "f16")), n_parallel=4,
                             n_threads=1, n_ctx=4096),
        trainer_engine=trainer_engine, work_dir=tmp_path_factory.mktemp("rollout_engine"))
    engine.sync(model, 1)
    yield model, trainer_engine, engine
    asyncio.run(engine.aclose())


def generate_all(engine: Engine, sampling: SamplingParams, schema: dict[str, Any] | None = SCHEMA
                 ) -> list[Completion]:
    async def run() -> list[Completion]:
        return list(await asyncio.gather(*(engine.generate(messages(q), sampling, json_schema=schema)
                                           for q in QUESTIONS)))

    return asyncio.run(run())


@pytest.mark.slow
def test_the_same_adapter_gives_the_same_greedy_replies_in_both_engines(real: Any) -> None:
    _, trainer_engine, engine = real
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    for schema in (SCHEMA, None):
        ours = [c.text for c in generate_all(engine, greedy, schema)]
        theirs = [c.text for c in generate_all(trainer_engine, greedy, schema)]
        assert ours == theirs


@pytest.mark.slow
def test_the_engines_log_probs_match_the_trainers_recomputation(real: Any) -> None:
    """Documented tolerance (docs/training.md): F16 base + F32 adapter vs the float32 trainer, raw log-probs
    of the same ids within 0.02 nats on average and 0.25 at most."""
    from agentflow.train.logprobs import pack_rows, response_logprobs

    model, trainer_engine, engine = real
    completions = generate_all(engine, SamplingParams(temperature=1.0, max_tokens=48))
    rows = []
    for c in completions:
        assert c.prompt_token_ids and c.token_ids and c.logprobs
        json.loads(c.text)  # the grammar held: valid JSON, in the layout the trainer's masks replay
        allowed = trainer_engine.allowed_tokens(SCHEMA, c.token_ids)
        assert all(bool(allowed[i, t]) for i, t in enumerate(c.token_ids))
        rows.append(TurnRow(0, c.prompt_token_ids, c.token_ids, c.logprobs, allowed=allowed))
    packed = pack_rows(rows, pad_id=trainer_engine.tokenizer.pad_token_id, allowed=[r.allowed for r in rows],
                       vocab_size=model.get_output_embeddings().weight.shape[0])
    with torch.no_grad():
        _, _, raw = response_logprobs(model, packed, with_raw=True)
    assert raw is not None
    gaps = []
    for j, row in enumerate(rows):
        delta = raw[j, raw.shape[1] - len(row.response_ids):] - torch.tensor(row.old_logprobs)
        gaps.append(delta[~torch.isnan(delta)].abs())
    gap = torch.cat(gaps)
    assert gap.numel() > 40
    assert float(gap.mean()) < 0.02 and float(gap.max()) < 0.25


@pytest.mark.slow
def test_an_adapter_trained_one_step_changes_what_the_engine_samples(real: Any, tmp_path: Path) -> None:
    model, trainer_engine, engine = real
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    before = [c.text for c in generate_all(engine, greedy)]
    target = '{"tool_name": "answer", "sub_goal": "done"}'
    tokenizer = trainer_engine.tokenizer
    saved = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.02)
    model.train()
    loss = torch.zeros(())
    for question in QUESTIONS:  # one optimiser step: raise the likelihood of one reply to every question
        prompt = engine.prompt_ids(messages(question))
        reply = tokenizer(target, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + reply])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
        loss = loss - torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(reply)[:, None]).sum()
    loss.backward()
    optimizer.step()
    model.eval()
    try:
        assert [c.text for c in generate_all(engine, greedy)] == before  # not synced yet: the old adapter
        report = engine.sync(model, 2)
        assert report["sync/bytes"] > 0 and report["sync/seconds"] > 0
        after = [c.text for c in generate_all(engine, greedy)]
        assert after != before
        assert sum('"answer"' in text for text in after) > sum('"answer"' in text for text in before)
    finally:
        with torch.no_grad():
            for name, value in model.state_dict().items():
                if name in saved:
                    value.copy_(saved[name])
        engine.sync(model, 3)


@pytest.mark.slow
def test_one_engine_serves_each_roles_adapter_per_request(tmp_path: Path) -> None:
    """Two adapters (planner, executor) over one llama.cpp base, chosen per request, every adapter's requests
    in flight together: the log-probs llama.cpp reports for each reply are those the trainer's model computes
    through the same adapter (the base: every scale 0, the model without adapters), within the documented
    tolerance, and far from those of the other adapter."""
    import contextlib

    from peft import LoraConfig, get_peft_model

    from agentflow.bundled import bundled_model_path
    from agentflow.engines.hf import BASE_ADAPTER, load_policy
    from agentflow.train.export import converted_gguf
    from agentflow.train.logprobs import pack_rows, response_logprobs

    torch.manual_seed(1)
    model, tokenizer = load_policy(TransformersEngineConfig(), trainable=True)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.add_adapter("executor", lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    model.eval()
    trainer_engine = TransformersEngine(TransformersEngineConfig(), model=model, tokenizer=tokenizer)
    engine = LlamaCppPolicyEngine(
        LlamaCppEngineConfig(model_path=str(converted_gguf(bundled_model_path(), "f16")), n_parallel=6,
                             n_threads=1, n_ctx=6144),
        trainer_engine=trainer_engine, work_dir=tmp_path, adapters=["default", "executor"])
    adapters = ["default", "executor", BASE_ADAPTER]

    async def replies() -> list[Completion]:
        return list(await asyncio.gather(*(
            engine.generate(messages(q), SamplingParams(temperature=0.0, max_tokens=32), json_schema=SCHEMA,
                            adapter=a) for a in adapters for q in QUESTIONS)))

    def gap(completions: list[Completion], adapter: str) -> float:
        """Mean |llama.cpp's log-prob - the trainer's through `adapter`| over the replies' tokens."""
        rows = [TurnRow(0, c.prompt_token_ids, c.token_ids, c.logprobs) for c in completions]
        packed = pack_rows(rows, pad_id=tokenizer.pad_token_id)
        context = model.disable_adapter() if adapter == BASE_ADAPTER else contextlib.nullcontext()
        if adapter != BASE_ADAPTER:
            model.set_adapter(adapter)
        with torch.no_grad(), context:
            _, _, raw = response_logprobs(model, packed, with_raw=True)
        assert raw is not None
        deltas = [(raw[j, raw.shape[1] - len(r.response_ids):] - torch.tensor(r.old_logprobs)).abs()
                  for j, r in enumerate(rows)]
        delta = torch.cat(deltas)
        return float(delta[~torch.isnan(delta)].mean())

    try:
        report = engine.sync(model, 1)
        assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["adapter-000001.gguf",
                                                                  "adapter-executor-000001.gguf"]
        assert report["sync/bytes"] > 0
        done = asyncio.run(replies())
        # again, with every slot's cache filled by the first round: each request goes to a slot its own weights
        # filled (or reads its prompt afresh), so the same greedy replies, with log-probs as close
        again = asyncio.run(replies())
        assert [c.token_ids for c in again] == [c.token_ids for c in done]
        for completions_of_round in (done, again):
            by_adapter = {a: completions_of_round[i * len(QUESTIONS):(i + 1) * len(QUESTIONS)]
                          for i, a in enumerate(adapters)}
            texts = {a: [c.text for c in cs] for a, cs in by_adapter.items()}
            assert texts["default"] != texts["executor"] != texts[BASE_ADAPTER]
            for adapter, completions in by_adapter.items():
                own = gap(completions, adapter)
                others = [gap(completions, other) for other in adapters if other != adapter]
                assert own < 0.02, adapter
                assert all(other > 5 * own for other in others), (adapter, own, others)
    finally:
        model.set_adapter("default")
        asyncio.run(engine.aclose())


@pytest.mark.slow
def test_a_failed_sync_leaves_an_engine_that_refuses_to_sample(real: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, trainer_engine, engine = real

    def gone() -> None:
        raise RuntimeError("llama.cpp is gone")

    with monkeypatch.context() as patch:
        patch.setattr(engine, "reload", gone)
        with pytest.raises(RuntimeError, match="gone"):
            engine.sync(model, 4)
    with pytest.raises(StalePolicyError, match="sync of weights version 4 failed"):
        generate_all(engine, SamplingParams(temperature=0.0, max_tokens=8))
    engine.sync(model, 5)
    assert generate_all(engine, SamplingParams(temperature=0.0, max_tokens=8))


# -- the update's side: recomputed old log-probs, the gap, TIS ---------------------------------------------


def updater(tis: bool | None = None, cap: float = 2.0) -> tuple[PolicyUpdater, TransformersEngine]:
    engine = tiny.policy()
    config = TrainConfig.from_dict({"rollout_engine": {"kind": "llamacpp", "tis": tis, "tis_cap": cap},
                                    "kl_coef": 0.0})
    model = engine.model
    return PolicyUpdater(config, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), policy=engine,
                         pad_id=engine.tokenizer.pad_token_id, ref_model=None, chunked_head=False), engine


def engine_row(engine: TransformersEngine, offsets: list[float]) -> TurnRow:
    """A row whose 'engine' log-probs are the trainer's raw ones minus `offsets` (NaN: unknown)."""
    prompt = engine.tokenizer("abc", add_special_tokens=False)["input_ids"]
    response = engine.tokenizer("xyz!"[:len(offsets)], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    raw = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)
    recorded = [math.nan if math.isnan(o) else float(r) - o for r, o in zip(raw.tolist(), offsets, strict=True)]
    return TurnRow(0, prompt, response, list(recorded), engine_logprobs=list(recorded))


def test_engine_rows_get_the_trainers_old_log_probs_and_truncated_weights() -> None:
    update, engine = updater(cap=2.0)
    row = engine_row(engine, [0.1, -0.3, 1.5, math.nan])
    metrics = update.engine_rows([row], temperature=1.0)
    # old log-probs are the trainer's own (ratio 1 at the first update), not the engine's
    assert row.engine_logprobs is not None
    expected = [e + o for e, o in zip(row.engine_logprobs[:3], [0.1, -0.3, 1.5], strict=True)]
    assert row.old_logprobs[:3] == pytest.approx(expected, abs=1e-5)
    assert math.isfinite(row.old_logprobs[3])
    assert row.tis_weights == pytest.approx([math.exp(0.1), math.exp(-0.3), 2.0, 1.0], abs=1e-5)
    assert metrics["logprob_gap/mean"] == pytest.approx((0.1 + 0.3 + 1.5) / 3, abs=1e-5)
    assert metrics["logprob_gap/max"] == pytest.approx(1.5, abs=1e-5)
    assert metrics["logprob_gap/share_over"] == pytest.approx(2 / 3)
    assert metrics["tis/truncated_share"] == pytest.approx(1 / 3)
    assert metrics["logprob_gap/after_tis_mean"] == pytest.approx((1.5 - math.log(2.0)) / 3, abs=1e-5)


def test_without_tis_every_weight_is_one_and_the_gap_stays() -> None:
    update, engine = updater(tis=False)
    row = engine_row(engine, [0.4, -0.4, 0.0])
    metrics = update.engine_rows([row], temperature=1.0)
    assert row.tis_weights == [1.0, 1.0, 1.0]
    assert metrics["logprob_gap/after_tis_mean"] == pytest.approx(metrics["logprob_gap/mean"], abs=1e-6)


def test_a_token_the_trainers_mask_forbids_unmasks_its_row() -> None:
    update, engine = updater()
    rows = [engine_row(engine, [0.0, 0.0]), engine_row(engine, [0.0, 0.0])]
    for row in rows:
        row.allowed = torch.ones((2, engine.model.get_output_embeddings().weight.shape[0]), dtype=torch.bool)
    rows[1].allowed[1, rows[1].response_ids[1]] = False  # the engine's grammar let through what the trainer's did not
    rows[1].action, rows[1].action_tokens, rows[1].action_choices = 0, [rows[1].response_ids[0]], [[1], [2]]
    assert unmask_disagreeing_rows(rows) == 1
    assert rows[0].allowed is not None and rows[1].allowed is None
    assert rows[1].action_tokens is None and rows[1].action_choices is None  # both read the mask
    update.engine_rows(rows, temperature=1.0)
    assert all(math.isfinite(v) for row in rows for v in row.old_logprobs)


def test_a_single_step_update_takes_its_old_log_probs_from_its_own_forward_pass() -> None:
    """ppo_epochs 1, one mini-batch: no separate pass (seconds/old_logprobs absent), the same gap and weights."""
    results = {}
    for epochs in (1, 2):
        update, engine = updater()
        update.config = update.config.model_copy(update={"ppo_epochs": epochs})
        rows = [engine_row(engine, [0.2, -0.1, 3.0]), engine_row(engine, [0.0, 0.3])]
        batch = UpdateBatch(rows=rows, advantages=torch.tensor([1.0, -1.0]), row_group=["q", "q"],
                            trajectories={"q": 2})
        results[epochs] = (update.grpo(batch, temperature=1.0, step=1), [r.tis_weights for r in rows])
    (fused, fused_weights), (separate, separate_weights) = results[1], results[2]
    assert "seconds/old_logprobs" not in fused and "seconds/old_logprobs" in separate
    for key in ("logprob_gap/mean", "logprob_gap/max", "tis/truncated_share", "logprob_gap/after_tis_mean"):
        assert fused[key] == pytest.approx(separate[key], abs=1e-5)
    assert fused["tis/truncated_share"] == pytest.approx(1 / 5)
    assert fused_weights == separate_weights


def test_token_weights_scale_each_tokens_policy_gradient() -> None:
    from agentflow.train.losses import clipped_surrogate_loss

    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    common = {"old_logprobs": torch.tensor([[-1.0, -2.0]]), "advantages": torch.tensor([1.0]),
              "mask": torch.ones((1, 2)), "weights": torch.tensor([1.0])}
    clipped_surrogate_loss(logprobs=logprobs, token_weights=torch.tensor([[0.5, 2.0]]), **common).loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([-0.5, -2.0])


# -- the trainer: a sync before every rollout, and after a resume ------------------------------------------


class RecordingEngine(Engine):
    """Stands in for LlamaCppPolicyEngine: samples with the trainer's engine, but only from synced weights."""

    supports_json_schema = True

    def __init__(self, trainer_engine: TransformersEngine, syncs: list[tuple[int, float]]) -> None:
        self.trainer_engine = trainer_engine
        self.weights_version: int | None = None
        self.stale: str | None = None
        self.syncs = syncs
        self.fingerprint: float | None = None

    def sync(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        self.weights_version = version
        self.fingerprint = weights_fingerprint(model)
        self.syncs.append((version, self.fingerprint))
        return {"sync/seconds": 0.0, "sync/bytes": 1.0}

    async def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        assert self.weights_version == self.trainer_engine.weights_version, "a rollout on stale weights"
        assert self.fingerprint == weights_fingerprint(self.trainer_engine.model)
        return await self.trainer_engine.generate(messages, sampling, json_schema=json_schema)

    def seed_sampling(self, seed: int) -> None:
        self.trainer_engine.seed_sampling(seed)

    def sampling_state(self) -> dict[str, torch.Tensor]:
        return self.trainer_engine.sampling_state()

    def load_sampling_state(self, state: dict[str, torch.Tensor]) -> None:
        self.trainer_engine.load_sampling_state(state)


def weights_fingerprint(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def engine_config(tmp_path: Path, run: str, steps: int) -> TrainConfig:
    raw = tiny.config(tmp_path, run, steps).model_dump()
    raw.update(lora={"enabled": True}, rollout_engine={"kind": "llamacpp"})  # (the given policy trains whole)
    return TrainConfig.from_dict(raw)


def test_the_trainer_syncs_before_each_rollout_and_again_after_a_resume(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[tuple[int, float]] = []
    monkeypatch.setattr(Trainer, "_llamacpp_policy", lambda self, policy: RecordingEngine(policy, syncs))
    Trainer(engine_config(tmp_path, "cut", 2), engines={"policy": tiny.policy(), "helper": tiny.helper()}).run()
    # before step 1 (untrained), before step 2 (one update), before the final evaluation (two updates)
    assert [version for version, _ in syncs] == [0, 1, 2]
    assert len({fingerprint for _, fingerprint in syncs}) == 3
    metrics = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert any("logprob_gap/mean" in m for m in metrics)  # the update measured the engine's gap
    first_run = len(syncs)

    Trainer(engine_config(tmp_path, "cut", 3), engines={"policy": tiny.policy(), "helper": tiny.helper()}
            ).run(resume=True)
    resumed = syncs[first_run:]
    # before its first rollout the resumed run loads the checkpoint's weights (two updates) into the engine;
    # every rollout checked that the engine held the trainer's current weights
    assert resumed and resumed[0][1] == pytest.approx(syncs[first_run - 1][1])


# -- vLLM: the protocol against a fake server ----------------------------------------------------------------


class FakeVLLM:
    """A stand-in for `vllm serve --enable-lora` with runtime LoRA updating: records what it is sent and answers
    as vLLM's OpenAI-compatible API does (token ids as `token_id:N` with `return_tokens_as_token_ids`)."""

    def __init__(self, reply_ids: list[int]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.loaded: set[str] = set()
        self.fail_load = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                fake.requests.append((self.path, {}))
                cards = [{"id": "base-model", "object": "model", "root": "base-model", "parent": None}]
                cards += [{"id": name, "object": "model", "root": "/adapters/" + name, "parent": "base-model"}
                          for name in sorted(fake.loaded)]
                self.reply(200, {"object": "list", "data": cards})

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                self.reply(*fake.answer(self.path, body))

            def reply(self, status: int, answer: Any) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.reply_ids = reply_ids
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/load_lora_adapter":
            if self.fail_load or not (Path(body["lora_path"]) / "adapter_config.json").is_file():
                return 500, {"error": "could not load the adapter"}
            self.loaded.add(body["lora_name"])
            return 200, "Success"
        if path == "/v1/unload_lora_adapter":
            self.loaded.discard(body["lora_name"])
            return 200, "Success"
        if path == "/v1/completions":
            if body["model"] not in self.loaded | {"base-model"}:
                return 404, {"error": f"The model `{body['model']}` does not exist."}
            return 200, {"choices": [{"text": "", "finish_reason": "stop", "logprobs": {
                "tokens": [f"token_id:{i}" for i in self.reply_ids],
                "token_logprobs": [-0.5] * len(self.reply_ids)}}]}
        return 404, {"error": "no route"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_vllm_engine_speaks_vllms_protocol(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from agentflow.train.engine_rollout import VLLMPolicyEngine

    trainer_engine = tiny.policy()
    model = get_peft_model(trainer_engine.model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    reply = trainer_engine.tokenizer('{"tool_name": "python"}', add_special_tokens=False)["input_ids"]
    fake = FakeVLLM(reply)
    engine = VLLMPolicyEngine(base_url=fake.url, trainer_engine=trainer_engine, adapter_dir=tmp_path)
    engine.seed_sampling(3)
    sampling = SamplingParams(temperature=1.0, max_tokens=16)
    try:
        with pytest.raises(StalePolicyError, match="never synced"):
            asyncio.run(engine.generate(messages("q"), sampling))
        report = engine.sync(model, 1)
        assert report["sync/bytes"] > 0
        assert fake.requests[-1][0] == "/v1/load_lora_adapter"
        assert fake.requests[-1][1]["lora_name"] == "agentflow-policy-v1"

        completion = asyncio.run(engine.generate(messages("What is 2 + 2?"), sampling, json_schema=SCHEMA))
        path, body = fake.requests[-1]
        assert path == "/v1/completions" and body["model"] == "agentflow-policy-v1"
        assert body["prompt"] == engine.prompt_ids(messages("What is 2 + 2?"))  # token ids, not text
        assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
        assert isinstance(body["seed"], int) and body["temperature"] == 1.0 and body["top_p"] == 1.0
        assert body["structured_outputs"]["json"]["x-guidance"]["whitespace_flexible"] is False
        assert completion.prompt_token_ids == body["prompt"]
        eos = trainer_engine.tokenizer.eos_token_id
        assert completion.token_ids == reply + [eos]  # vLLM stopped at the end of sequence without returning it
        assert completion.logprobs is not None and completion.logprobs[:-1] == [-0.5] * len(reply)
        assert math.isnan(completion.logprobs[-1])
        assert completion.text == '{"tool_name": "python"}'

        engine.sync(model, 2)  # the next version is loaded, the previous one unloaded
        assert [(p, b["lora_name"]) for p, b in fake.requests[-2:]] == [
            ("/v1/load_lora_adapter", "agentflow-policy-v2"), ("/v1/unload_lora_adapter", "agentflow-policy-v1")]
        asyncio.run(engine.generate(messages("q"), sampling))
        assert fake.requests[-1][1]["model"] == "agentflow-policy-v2"

        fake.fail_load = True  # a failed load: the engine refuses to sample until a sync succeeds
        with pytest.raises(EngineUnavailableError, match="500"):
            engine.sync(model, 3)
        with pytest.raises(StalePolicyError, match="version 3 failed"):
            asyncio.run(engine.generate(messages("q"), sampling))
        fake.fail_load = False
        engine.sync(model, 4)
        assert asyncio.run(engine.generate(messages("q"), sampling)).token_ids
    finally:
        asyncio.run(engine.aclose())
        fake.close()

    import httpx

    gone = VLLMPolicyEngine(base_url=fake.url, trainer_engine=trainer_engine, adapter_dir=tmp_path)
    with pytest.raises(httpx.ConnectError):  # the server is gone
        gone.sync(model, 5)
    with pytest.raises(StalePolicyError):
        asyncio.run(gone.generate(messages("q"), sampling))


def test_the_vllm_engine_serves_one_adapter_per_role_and_the_base(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from agentflow.engines.hf import BASE_ADAPTER
    from agentflow.train.engine_rollout import VLLMPolicyEngine

    trainer_engine = tiny.policy()
    model = get_peft_model(trainer_engine.model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    model.add_adapter("executor", LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    fake = FakeVLLM(trainer_engine.tokenizer("42", add_special_tokens=False)["input_ids"])
    engine = VLLMPolicyEngine(base_url=fake.url, trainer_engine=trainer_engine, adapter_dir=tmp_path,
                              adapters=["default", "executor"])
    sampling = SamplingParams(temperature=1.0, max_tokens=8)
    try:
        engine.sync(model, 1)
        assert fake.loaded == {"agentflow-policy-v1", "agentflow-executor-v1"}
        for adapter in ("default", "executor"):  # each saved alone, in PEFT's plain layout
            assert (tmp_path / engine.served_name(adapter, 1) / "adapter_model.safetensors").is_file()
        for adapter, model_name in (("default", "agentflow-policy-v1"), ("executor", "agentflow-executor-v1"),
                                    (BASE_ADAPTER, "base-model")):
            asyncio.run(engine.generate(messages("q"), sampling, adapter=adapter))
            assert fake.requests[-1][1]["model"] == model_name
        with pytest.raises(ValueError, match="must name one"):
            asyncio.run(engine.generate(messages("q"), sampling))
        engine.sync(model, 2)
        assert fake.loaded == {"agentflow-policy-v2", "agentflow-executor-v2"}  # the previous ones unloaded
        asyncio.run(engine.generate(messages("q"), sampling, adapter="executor"))
        assert fake.requests[-1][1]["model"] == "agentflow-executor-v2"
    finally:
        asyncio.run(engine.aclose())
        fake.close()


def test_the_llamacpp_engine_names_each_requests_adapter(tmp_path: Path) -> None:
    from agentflow.engines.hf import BASE_ADAPTER

    (tmp_path / "base.gguf").write_bytes(b"")  # never loaded: the requests are only built

    def engine(adapters: list[str] | None) -> LlamaCppPolicyEngine:
        return LlamaCppPolicyEngine(LlamaCppEngineConfig(model_path=str(tmp_path / "base.gguf")),
                                    trainer_engine=tiny.policy(), work_dir=tmp_path, adapters=adapters)

    sampling = SamplingParams(temperature=1.0, max_tokens=8)
    planner_only = engine(None)  # the planner's adapter, applied to every request at scale 1
    assert "lora" not in planner_only.completion_body([1, 2], sampling, None)
    with pytest.raises(ValueError, match="planner's adapter only"):
        planner_only.completion_body([1, 2], sampling, None, "executor")
    two = engine(["default", "executor"])
    two.adapter_paths = {"default": tmp_path / "a.gguf", "executor": tmp_path / "b.gguf"}
    assert two.lora_files() == [(tmp_path / "a.gguf", 0.0), (tmp_path / "b.gguf", 0.0)]
    assert two.completion_body([1], sampling, None, "executor")["lora"] == [{"id": 0, "scale": 0.0},
                                                                             {"id": 1, "scale": 1.0}]
    assert two.completion_body([1], sampling, None, "default")["lora"] == [{"id": 0, "scale": 1.0},
                                                                            {"id": 1, "scale": 0.0}]
    assert all(e["scale"] == 0.0 for e in two.completion_body([1], sampling, None, BASE_ADAPTER)["lora"])
    for wrong, match in ((None, "must name one"), ("verifier", "unknown adapter")):
        with pytest.raises(ValueError, match=match):
            two.completion_body([1], sampling, None, wrong)
    # the planner's adapter alone, with frozen roles on the same engine: each request names its weights
    shared = LlamaCppPolicyEngine(LlamaCppEngineConfig(model_path=str(tmp_path / "base.gguf")),
                                  trainer_engine=tiny.policy(), work_dir=tmp_path, base_requests=True)
    shared.adapter_paths = {"default": tmp_path / "a.gguf"}
    assert shared.lora_files() == [(tmp_path / "a.gguf", 0.0)]
    assert shared.completion_body([1], sampling, None, "default")["lora"] == [{"id": 0, "scale": 1.0}]
    assert shared.completion_body([1], sampling, None, BASE_ADAPTER)["lora"] == [{"id": 0, "scale": 0.0}]


def test_a_request_reuses_a_slots_cached_prompt_only_where_the_same_weights_computed_it(tmp_path: Path) -> None:
    """llama.cpp reuses a slot's cached prompt whatever adapter computed it: where requests name their adapter,
    each is sent to a slot (`id_slot`) whose cache its own weights computed, or has its prompt read afresh."""
    from agentflow.engines.hf import BASE_ADAPTER

    (tmp_path / "base.gguf").write_bytes(b"")
    engine = LlamaCppPolicyEngine(LlamaCppEngineConfig(model_path=str(tmp_path / "base.gguf"), n_parallel=3),
                                  trainer_engine=tiny.policy(), work_dir=tmp_path, adapters=["default", "executor"])
    params = type("Params", (), {"cache_ram_mib": 8192})()
    engine._tune_params(params)
    assert params.cache_ram_mib == 0  # no host-memory cache that would move a state between slots
    planner, executor = [1, 2, 3, 4], [1, 2, 9, 9]
    assert engine.take_slot("default", planner) == (0, True)  # an empty cache is safe to "reuse"
    assert engine.take_slot("executor", executor) == (1, True)
    assert engine.take_slot(BASE_ADAPTER, planner) == (2, True)
    for slot in (0, 1, 2):
        engine.release_slot(slot, done=True)
    assert engine.take_slot("executor", [1, 2, 9, 5]) == (1, True)  # its own weights' slot
    assert engine.take_slot("executor", [1, 2, 9, 9]) == (0, False)  # the other slots hold other weights
    assert engine.take_slot(BASE_ADAPTER, [7]) == (2, True)
    for slot in (0, 1, 2):
        engine.release_slot(slot, done=slot != 1)
    assert engine.take_slot("executor", [1, 2, 9, 9, 9]) == (0, True)  # slot 0 now holds executor's prompt
    assert engine.take_slot("executor", [1, 2, 9, 5]) == (1, False)  # slot 1's request did not finish
    for slot in (0, 1):
        engine.release_slot(slot, done=True)
    engine._forget_slots()  # what a reload does: a fresh server caches nothing
    assert engine.take_slot("default", [5]) == (0, True)
    single = LlamaCppPolicyEngine(LlamaCppEngineConfig(model_path=str(tmp_path / "base.gguf")),
                                  trainer_engine=tiny.policy(), work_dir=tmp_path)
    body = single.completion_body([1], SamplingParams(temperature=1.0, max_tokens=8), None)
    assert body["cache_prompt"] and "id_slot" not in body  # the planner alone: one set of weights


def test_a_rollout_engine_that_syncs_adapters_is_refused_without_lora_or_an_address() -> None:
    from agentflow.errors import ConfigError

    with pytest.raises(ConfigError, match="needs lora.enabled"):
        TrainConfig.from_dict({"rollout_engine": {"kind": "llamacpp"}, "lora": {"enabled": False}})
    with pytest.raises(ConfigError, match="needs base_url"):
        TrainConfig.from_dict({"rollout_engine": {"kind": "vllm"}})
    assert TrainConfig.from_dict({"rollout_engine": {"kind": "llamacpp"}}).rollout_engine.tis_enabled
    assert not TrainConfig.from_dict({}).rollout_engine.tis_enabled


def test_the_llamacpp_rollout_engine_reads_the_base_it_is_given(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`rollout_engine.base`: the policy's GGUF re-written as F16 (default) or Q8_0, nothing else."""
    from agentflow.errors import ConfigError
    from agentflow.train import export

    converted: list[str] = []

    def convert(path: Path, file_type: str, **_: Any) -> Path:
        converted.append(file_type)
        out = tmp_path / f"base.{file_type}.gguf"
        out.write_bytes(b"")  # never loaded: the engine loads on its first request
        return out

    monkeypatch.setattr(export, "converted_gguf", convert)
    for base in ("f16", "q8_0"):
        cfg = TrainConfig.from_dict({"rollout_engine": {"kind": "llamacpp", "base": base}})
        engine = Trainer._llamacpp_policy(SimpleNamespace(config=cfg, out_dir=tmp_path), tiny.policy())
        assert engine.config.model_path == str(tmp_path / f"base.{base}.gguf")
    assert converted == ["f16", "q8_0"]
    with pytest.raises(ConfigError, match="base"):
        TrainConfig.from_dict({"rollout_engine": {"kind": "llamacpp", "base": "q4_0"}})
