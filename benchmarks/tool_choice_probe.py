"""The planner's first tool choice trained directly at its one token: can this LoRA learn a choice that depends
on the question at all, and which objective loses it?

`tool_choice_bandit.py` runs the whole trainer on the first tool choice (about 150 s a step on 2 cores) and learns
the majority's tool. This probe takes 10-20 s a step for `sft` and `exact` (50-190 s for `grpo`, G = 4-8, often
beside another run), so objectives can be told apart in minutes. It keeps the planner's real turn-1 prompt (the flow
config's system prompt, question, tool menu shuffled per rollout, empty memory, step line), the bundled model and
the LoRA of the training config, and reads the policy at one position: after `{"tool_name": "` (what the schema
forces before the choice). An action's probability there is that of every token that starts it ("w", "wiki",
"wikipedia", ... for `wikipedia_search`: the schema lets the reply start with any), renormalised over the actions;
a token that starts several ("p": `python` and `product_catalog`) gives its probability to each in the proportion
of the tokens that continue it into that one, read one token later (a second forward pass).
Four objectives, on the same batches (two questions of each kind, or with `--balance` half whose right first tool
is `python` and half `wikipedia_search`), optionally after `--flatten-steps` (a start with no preference):

- `sft`: cross-entropy on the right tool. Full information: if this fails, the prompt, the LoRA or the step size
  cannot separate the kinds, whatever the reward.
- `exact`: minus the expected reward, p(right tool). The policy gradient without sampling noise.
- `grpo`: G actions sampled per question at the rollout temperature, rewards normalised within the group, the
  action's log-prob only (the trainer's estimator without the rest of the reply). With `--token-action` the
  sample is the token the reply starts with and its log-prob the token's (the trainer's `action_logprob: token`);
  without, the action and its total (`action_logprob: tool`).
- `group_all`: the same G samples, but each action the group chose is scored by its samples' mean reward less
  the group's (with `--advantage batch_trajectory`: the batch's), and the policy's whole distribution over the
  actions is moved by those scores (as `exact` with the group's estimates in place of the true rewards; an
  action no sample chose scores 0).

With `--shared-prompt` (grpo, group_all) a question's G samples come from one prompt (its menu shuffled once a
question a step, as the trainer's `group_shares_menu`), read once: a large G costs one forward pass a question.
With `--menu-orders K` as well, K orders a question, each drawn G / K times, one group of G: a pick made for the
position an action is listed at then wins under one order and loses under another, and cancels in the update.

    python benchmarks/tool_choice_probe.py --objective sft --out runs/probe_sft.json
    python benchmarks/tool_choice_probe.py --objective exact --balance --steps 40 --out runs/probe_exact_bal.json
    python benchmarks/tool_choice_probe.py --steps 0 --describe "python=Calculator: computes arithmetic on numbers." \
        --out runs/probe_prior_short.json

Prints one JSON line per step and per evaluation (greedy, the first `--eval-size` held-out questions, menu in
the evaluation's order) and writes them with the arguments to `--out`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import torch

from agentflow.engines.hf import load_policy
from agentflow.flow import Flow
from agentflow.memory import FlowMemory
from agentflow.planner import planner_messages
from agentflow.tools.base import create_tool
from agentflow.train.advantages import get_advantage, no_signal_groups
from agentflow.train.config import TrainConfig, menu_variants
from agentflow.train.data import default_paths
from agentflow.train.logprobs import values_begun
from agentflow.trajectory import Trajectory

CHOICE_PREFIX = '{"tool_name": "'


class Probe:
    """The policy's distribution over the actions at the planner's first turn."""

    def __init__(self, config: TrainConfig, *, rank: int | None, describe: dict[str, str] | None = None,
                 first_token_only: bool = False) -> None:
        from peft import LoraConfig, get_peft_model

        flow_config = config.rollout_flow_config()
        if flow_config.planner_tool_last:
            raise SystemExit("the probe reads the tool where the reply starts: planner_tool_last is not supported")
        tools = {name: create_tool(name, settings) for name, settings in flow_config.tools.items()}
        self.flow = Flow(flow_config, engines={}, tools=tools)
        self.actions = self.flow.actions()
        unknown = set(describe or {}) - set(self.actions)
        if unknown:
            raise SystemExit(f"--describe names no action of the menu: {sorted(unknown)} (actions: {self.actions})")
        self.describe = describe or {}
        model, self.tokenizer = load_policy(config.policy)
        lora = config.lora
        self.model = get_peft_model(model, LoraConfig(
            r=rank or lora.rank, lora_alpha=lora.alpha * (rank or lora.rank) / lora.rank,
            lora_dropout=lora.dropout, target_modules=lora.targets, task_type="CAUSAL_LM"))
        # 24 prompts of ~400 tokens took 18.8 GB without (killed on a 24 GB machine); it acts in train mode only
        self.model.gradient_checkpointing_enable()
        self.model.enable_input_require_grads()
        self.starts, self.shared = self.action_starts(first_token_only)

    def action_starts(self, first_token_only: bool = False) -> tuple[list[list[int]], dict[int, dict[int, list[int]]]]:
        """Every token the schema lets the reply start each action with ("w", "wiki", "wikipedia" for
        wikipedia_search: the flow samples among all of them, so the action's probability is their total), and
        the tokens that start several actions ("p": `python` and `product_catalog`) with, for each of those
        actions, the tokens that continue it into that action alone ("ython", "roduct", ...).
        `first_token_only`: each action's own first token alone, and none shared."""
        if first_token_only:
            return [[self.tokenizer.encode(name, add_special_tokens=False)[0]] for name in self.actions], {}
        starts: list[list[int]] = [[] for _ in self.actions]
        shared: dict[int, dict[int, list[int]]] = {}
        for token in range(len(self.tokenizer)):
            owners = self.begun(self.tokenizer.decode([token]))
            if len(owners) > 1:
                shared[token] = self.continuations(token, owners)
            elif owners:
                starts[owners[0]].append(token)
        return starts, shared

    def begun(self, text: str) -> list[int]:
        """The indices of the actions a reply whose value starts with `text` can still be."""
        return [self.actions.index(name) for name in values_begun(text, self.actions)]

    def continuations(self, token: int, owners: list[int]) -> dict[int, list[int]]:
        """For each of `owners` (the actions `token` starts), the tokens after `token` that make it that action."""
        text = self.tokenizer.decode([token])
        split: dict[int, list[int]] = {owner: [] for owner in owners}
        for following in range(len(self.tokenizer)):
            piece = self.tokenizer.decode([following])
            begun = self.begun(text + piece) if piece else []
            if len(begun) > 1:
                raise SystemExit(f"{text!r} then {piece!r} still starts several actions of {self.actions}: the "
                                 "probe reads a choice at most two tokens deep")
            if begun:
                split[begun[0]].append(following)
        return split

    def menu(self, question: str, variant: int) -> dict[str, str]:
        """The turn-1 menu the flow shows for (question, variant), in its order."""
        traj = Trajectory(question=question, variant=variant)
        return {name: self.describe.get(name, text) for name, text in self.flow._tool_descriptions(traj, 1).items()}

    def first_listed(self, question: str, variant: int) -> int:
        """The index (in `actions`) of the action the turn-1 menu lists first."""
        return self.actions.index(next(iter(self.menu(question, variant))))

    def prompt(self, question: str, variant: int) -> str:
        limits = self.flow.config.limits
        menu = self.menu(question, variant)
        messages = planner_messages(
            question=question, analysis="", tool_descriptions=menu,
            memory=self.flow._render(FlowMemory(question=question), tool_names=self.flow.config.planner_memory_tools),
            turn=1, max_turns=limits.max_turns)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) \
            + CHOICE_PREFIX

    def logits(self, prompts: list[str], temperature: float = 1.0) -> torch.Tensor:
        """(len(prompts), actions): each action's logit at `temperature`, the log of the total exp(logit /
        temperature) of the tokens that start it (with `first_token_only`: its own first token's), so that a softmax
        gives the probability with which the flow's constrained reply, sampled at that temperature, starts each
        action. Temperature 0: each action's best token's logit (the argmax is the flow's greedy choice)."""
        return self.action_logits(self.next_logits(prompts), temperature)

    def next_logits(self, prompts: list[str]) -> NextLogits:
        """The (len(prompts), vocab) logits of the token after each prompt and, for each `shared` token, those of
        the token after it: the prompts continued with it, one forward pass each, the first of which also gives
        the prompts' own next-token logits (one position earlier: the pass is causal and the padding on the left)."""
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        if not self.shared:
            return NextLogits(self.model(**encoded, logits_to_keep=1).logits[:, -1], {})
        first, after = None, {}
        for token in self.shared:
            column = torch.full((len(prompts), 1), token)
            logits = self.model(
                input_ids=torch.cat([encoded["input_ids"], column], 1), logits_to_keep=1 if after else 2,
                attention_mask=torch.cat([encoded["attention_mask"], torch.ones_like(column)], 1)).logits
            first = logits[:, -2] if first is None else first
            after[token] = logits[:, -1]
        return NextLogits(first, after)

    def action_logits(self, logits: NextLogits, temperature: float = 1.0) -> torch.Tensor:
        """(rows, actions), as `logits` says; a `shared` token's probability goes to its actions in the proportion
        of the tokens that continue it into each (temperature 0: all of it to the greedy continuation's)."""
        columns = [_total(logits.first[:, tokens], temperature) for tokens in self.starts]
        for token, split in self.shared.items():
            owners = list(split)
            after = torch.stack([_total(logits.after[token][:, split[k]], temperature) for k in owners], -1)
            if temperature == 0:
                best = after.argmax(-1)
                for j, k in enumerate(owners):
                    columns[k] = torch.where(best == j, torch.maximum(columns[k], logits.first[:, token]), columns[k])
            else:
                share = logits.first[:, token, None] / temperature + torch.log_softmax(after, -1)
                for j, k in enumerate(owners):
                    columns[k] = torch.logaddexp(columns[k], share[:, j])
        return torch.stack(columns, -1)


class NextLogits(NamedTuple):
    first: torch.Tensor
    """(rows, vocab) logits where the reply's value starts."""
    after: dict[int, torch.Tensor]
    """`Probe.shared` token -> (rows, vocab) logits of the token after it."""


def _total(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(rows,) log of the total exp(logit / temperature) of `logits`' (rows, tokens) columns; temperature 0: the
    largest logit; no column: -inf."""
    if logits.shape[1] == 0:
        return torch.full(logits.shape[:1], float("-inf"), dtype=logits.dtype, device=logits.device)
    return logits.max(-1).values if temperature == 0 else (logits / temperature).logsumexp(-1)


def right_tool(item: dict[str, Any]) -> str:
    return item["tools"][0]


def evaluate(probe: Probe, items: list[dict[str, Any]], at: int | str, temperature: float) -> dict[str, Any]:
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    chose: dict[str, Counter[str]] = defaultdict(Counter)
    probability: dict[str, list[torch.Tensor]] = defaultdict(list)
    p_right: dict[str, list[float]] = defaultdict(list)
    allowed = [token for tokens in probe.starts for token in tokens] + list(probe.shared)
    shares = torch.zeros(len(allowed))
    first_listed = 0
    probe.model.eval()
    with torch.no_grad():
        for start in range(0, len(items), 15):
            chunk = items[start:start + 15]
            logits = probe.next_logits([probe.prompt(q["question"], 0) for q in chunk])
            shares += torch.softmax(logits.first[:, allowed] / temperature, -1).sum(0)
            rows = zip(chunk, probe.action_logits(logits), probe.action_logits(logits, 0.0), strict=True)
            for item, row, greedy in rows:
                kind, gold = item["kind"], probe.actions.index(right_tool(item))
                probability[kind].append(torch.softmax(row, -1))
                p_right[kind].append(float(probability[kind][-1][gold]))
                action = int(greedy.argmax())
                first_listed += action == probe.first_listed(item["question"], 0)
                chose[kind][probe.actions[action]] += 1
                total[kind] += 1
                right[kind] += action == gold
    share_of = dict(zip(allowed, (shares / len(items)).tolist(), strict=True))
    return {"at": at, "accuracy": round(sum(right.values()) / len(items), 4),
            "by_kind": {kind: round(right[kind] / total[kind], 4) for kind in sorted(total)},
            "greedy_first_listed": round(first_listed / len(items), 4),  # the pick is what the menu lists first
            "chose": {kind: dict(chose[kind]) for kind in sorted(chose)},
            "mean_probability": {kind: mean_probability(probe.actions, probability[kind])
                                 for kind in sorted(probability)},
            "share_right_under_0.01": {  # questions on which sampling the right tool is all but impossible
                kind: round(sum(p < 0.01 for p in values) / len(values), 4)
                for kind, values in sorted(p_right.items())},
            # which token a sampled reply starts each action with, at the sampling temperature, over all questions
            "token_shares": {
                **{name: {probe.tokenizer.decode([token]): round(share_of[token], 3) for token in tokens}
                   for name, tokens in zip(probe.actions, probe.starts, strict=True)},
                **{" | ".join(probe.actions[k] for k in split): {probe.tokenizer.decode([token]): round(
                    share_of[token], 3)} for token, split in probe.shared.items()}}}


def mean_probability(actions: list[str], rows: list[torch.Tensor]) -> dict[str, float]:
    """Each action's probability (temperature 1), averaged over the rows."""
    mean = torch.stack(rows).mean(0)
    return {action: round(float(mean[k]), 3) for k, action in enumerate(actions)}


def group_action_estimates(chosen: torch.Tensor, rewards: torch.Tensor, samples: int, actions: int, *,
                           over_batch: bool = False) -> torch.Tensor:
    """(rows, actions): for each group of `samples` rows, the mean reward of the rows that chose each action minus
    the group's mean reward (`over_batch`: the batch's), on every row of the group; 0 for an action the group did
    not choose."""
    estimate = torch.zeros(len(chosen), actions)
    for start in range(0, len(chosen), samples):
        group_rewards, group_chosen = rewards[start:start + samples], chosen[start:start + samples]
        baseline = rewards.mean() if over_batch else group_rewards.mean()
        for action in group_chosen.unique():
            estimate[start:start + samples, action] = group_rewards[group_chosen == action].mean() - baseline
    return estimate


def repeat_rows(logits: NextLogits, times: int) -> NextLogits:
    """`logits` with each row repeated `times` times in place (a question's G samples after it)."""
    return NextLogits(logits.first.repeat_interleave(times, 0),
                      {token: rows.repeat_interleave(times, 0) for token, rows in logits.after.items()})


def menu_text(value: str) -> tuple[str, str]:
    """`--describe ACTION=TEXT` as (action, text)."""
    action, sep, text = value.partition("=")
    if not sep or not action or not text:
        raise argparse.ArgumentTypeError(f"expected ACTION=TEXT, got {value!r}")
    return action, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="src/agentflow/configs/train_mixed.yaml")
    parser.add_argument("--objective", choices=["sft", "exact", "grpo", "group_all"], default="grpo")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--lr", type=float, help="default: the config's learning_rate")
    parser.add_argument("--rank", type=int, help="LoRA rank (alpha scaled with it); default: the config's")
    parser.add_argument("--batch-size", type=int, default=6, help="questions a step")
    parser.add_argument("--group-size", type=int, help="grpo: samples a question; default: the config's")
    parser.add_argument("--temperature", type=float, help="grpo: sampling temperature; default: the config's")
    parser.add_argument("--advantage", help="grpo: the trainer's advantage estimator by name (batch_trajectory: "
                        "over the batch, not the group); default: the config's")
    parser.add_argument("--entropy-coef", type=float, default=0.0,
                        help="minus this times the mean entropy of the action distribution (for grpo at the "
                             "sampling temperature), added to the loss: the trainer's action_entropy_coef, here on "
                             "every question of the batch")
    parser.add_argument("--kl-coef", type=float, default=0.0,
                        help="plus this times KL(policy || frozen model) of the action distribution, exact")
    parser.add_argument("--balance", action="store_true",
                        help="half the batch python-first questions, half wikipedia-first (else two a kind)")
    parser.add_argument("--describe", action="append", default=[], type=menu_text, metavar="ACTION=TEXT",
                        help="the menu's description of ACTION replaced by TEXT (with --steps 0: does the frozen "
                             "planner's choice follow what the menu says a tool is for?)")
    parser.add_argument("--flatten-steps", type=int, default=0,
                        help="before training, this many steps of cross-entropy toward the uniform distribution over "
                             "the actions at the sampling temperature (no reward, no label: a start with no preference "
                             "for the rollouts to sample from), then an evaluation at "
                             "'flattened'; its own AdamW at --flatten-lr, the training's starts fresh")
    parser.add_argument("--flatten-lr", type=float, help="default: the config's learning_rate")
    parser.add_argument("--flatten-temperature", type=float, help="default: the sampling temperature")
    parser.add_argument("--first-token-only", action="store_true",
                        help="read each action at its own first token alone ('wikipedia', 'python', 'answer'), as the "
                             "runs recorded before the default became every token that starts it")
    parser.add_argument("--token-action", action="store_true",
                        help="grpo: sample and train the token the reply starts with ('w', 'p', 'python', ...: "
                             "the trainer's action) rather than the action (the total over its tokens); the reward "
                             "is still the action's")
    parser.add_argument("--shared-prompt", action="store_true",
                        help="grpo, group_all: a question's G samples share one prompt (the menu shuffled once a "
                             "question a step, not once a sample), so its action distribution is read once and G "
                             "costs nothing: the sampling noise of a large group at the price of a small one")
    parser.add_argument("--menu-orders", type=int, default=1, metavar="K",
                        help="with --shared-prompt: K menu orders a question a step, each read once and drawn "
                             "G / K times, the group (and its baseline) still all G: a pick made for the position "
                             "an action is listed at is rewarded under one order and not under another")
    parser.add_argument("--save-adapter", type=Path, metavar="DIR",
                        help="write the LoRA adapter at the end of the run (with --steps 0: the flattened start) "
                             "where a training config's `flow.engines.policy.adapter` can start from it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=90)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="JSON file of the arguments and every line")
    args = parser.parse_args()
    if args.menu_orders < 1 or (args.menu_orders > 1 and not args.shared_prompt):
        parser.error("--menu-orders is 1 or more, and more than 1 only with --shared-prompt")

    config = TrainConfig.from_yaml(args.config)
    lr = args.lr or config.learning_rate
    group = args.group_size or config.group_size
    if group % args.menu_orders:
        parser.error(f"--menu-orders {args.menu_orders} does not divide the group size {group}")
    temperature = args.temperature or config.temperature or 1.0
    advantage = args.advantage or config.advantage
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_path, held_out_path = default_paths(config.data.task)

    def read(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    train, held_out = read(Path(config.data.train_path or train_path)), read(
        Path(config.data.eval_path or held_out_path))[:args.eval_size]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_tool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in train:
        by_kind[item["kind"]].append(item)
        by_tool[right_tool(item)].append(item)
    strata = by_tool if args.balance else by_kind

    probe = Probe(config, rank=args.rank, describe=dict(args.describe), first_token_only=args.first_token_only)
    if args.token_action and probe.shared:
        raise SystemExit("--token-action samples the token a reply starts with, which does not say the action when "
                         f"it starts several ({', '.join(repr(probe.tokenizer.decode([t])) for t in probe.shared)})")
    params = [p for p in probe.model.parameters() if p.requires_grad]
    allowed = [token for tokens in probe.starts for token in tokens]
    owner = torch.tensor([k for k, tokens in enumerate(probe.starts) for _ in tokens])  # each allowed token's action
    optimizer = torch.optim.AdamW(params, lr=lr, betas=config.adam_betas, weight_decay=config.weight_decay)
    lines: list[dict[str, Any]] = []

    arguments = {**vars(args), "out": str(args.out), "save_adapter": args.save_adapter and str(args.save_adapter),
                 "lr": lr, "group_size": group, "temperature": temperature,
                 "advantage": advantage}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def emit(line: dict[str, Any]) -> None:
        """Print the line and rewrite `--out` with it: a stopped run keeps what it measured."""
        lines.append(line)
        print(json.dumps(line), flush=True)
        args.out.write_text(json.dumps({"arguments": arguments, "lines": lines}, indent=1) + "\n")

    emit(evaluate(probe, held_out, 0, temperature))
    started = time.perf_counter()
    if args.flatten_steps:
        flatten_rng = random.Random(args.seed + 1)  # the training batches below stay those of a run without it
        flattener = torch.optim.AdamW(params, lr=args.flatten_lr or config.learning_rate, betas=config.adam_betas,
                                      weight_decay=config.weight_decay)
        for step in range(1, args.flatten_steps + 1):
            batch = [q for name in sorted(by_kind) for q in flatten_rng.sample(by_kind[name], 2)]
            probe.model.train()
            logits = probe.logits([probe.prompt(q["question"], flatten_rng.randrange(1 << 16)) for q in batch],
                                  args.flatten_temperature or temperature)
            loss = -torch.log_softmax(logits, -1).mean()
            flattener.zero_grad()
            loss.backward()
            flattener.step()
            emit({"flatten_step": step, "loss": round(float(loss), 4),
                  "seconds": round(time.perf_counter() - started, 1)})
        emit(evaluate(probe, held_out, "flattened", temperature))
    for step in range(1, args.steps + 1):
        batch = [q for name in sorted(strata) for q in rng.sample(strata[name], args.batch_size // len(strata))]
        samples = group if args.objective in ("grpo", "group_all") else 1
        items = [q for q in batch for _ in range(samples)]
        probe.model.train()  # no dropout (LoRA dropout is the config's, 0 in train_mixed.yaml); checkpointing on
        shared = args.shared_prompt and samples > 1
        orders = args.menu_orders if shared else 1
        # shared: K menu orders a question this step, as the trainer's group_menu_orders, each read once
        variants = menu_variants(step, samples, orders) * len(batch) if shared else \
            [k % samples for k in range(len(items))]
        per_prompt = samples // orders if shared else 1
        prompts = [probe.prompt(q["question"], v) for q, v in zip(items[::per_prompt], variants[::per_prompt],
                                                                   strict=True)]
        tau = temperature if samples > 1 else 1.0  # sampled objectives: the policy the rollouts sample
        next_logits = probe.next_logits(prompts)
        if shared:
            next_logits = repeat_rows(next_logits, per_prompt)
        logits = probe.action_logits(next_logits, tau)
        gold = torch.tensor([probe.actions.index(right_tool(q)) for q in items])
        groups = [str(k // samples) for k in range(len(items))]
        line: dict[str, Any] = {"step": step}
        if args.objective == "sft":
            loss = torch.nn.functional.cross_entropy(logits, gold)
        elif args.objective == "exact":
            loss = -torch.softmax(logits, -1).gather(1, gold[:, None]).mean()
        elif args.objective == "group_all":
            probabilities = torch.softmax(logits, -1)
            with torch.no_grad():
                chosen = torch.multinomial(probabilities, 1)[:, 0]
                rewards = (chosen == gold).float()
                estimate = group_action_estimates(chosen, rewards, samples, len(probe.actions),
                                                  over_batch=advantage == "batch_trajectory")
            loss = -(probabilities * estimate).sum(-1).mean()
            line.update(reward=round(float(rewards.mean()), 4),
                        groups_without_signal=round(no_signal_groups(rewards, groups) / len(batch), 4))
        else:
            if args.token_action:  # the trainer's action: the token the reply starts with, among every allowed one
                logprobs = torch.log_softmax(next_logits.first[:, allowed] / tau, -1)
            else:
                logprobs = torch.log_softmax(logits, -1)
            with torch.no_grad():
                sampled = torch.multinomial(logprobs.exp(), 1)[:, 0]
                chosen = owner[sampled] if args.token_action else sampled
                rewards = (chosen == gold).float()
                listed_first = torch.tensor([probe.first_listed(q["question"], v) for q, v in zip(
                    items, variants, strict=True)])
                advantages = get_advantage(advantage)(  # the trainer's estimator: one row a trajectory
                    rewards=rewards, group_ids=groups, trajectory_ids=[str(k) for k in range(len(items))],
                    row_trajectory=torch.arange(len(items)), eps=config.advantage_eps)
            loss = -(advantages * logprobs.gather(1, sampled[:, None])[:, 0]).mean()
            line.update(reward=round(float(rewards.mean()), 4),
                        first_listed=round(float((chosen == listed_first).float().mean()), 4),
                        groups_without_signal=round(no_signal_groups(rewards, groups) / len(batch), 4))
        if args.entropy_coef:
            entropy = torch.distributions.Categorical(logits=logits).entropy().mean()  # at tau, as the trainer's
            line["action_entropy"] = round(float(entropy.detach()), 4)
            loss = loss - args.entropy_coef * entropy
        if args.kl_coef:
            with torch.no_grad(), probe.model.disable_adapter():
                reference = torch.log_softmax(probe.logits(prompts, tau), -1)
            if shared:
                reference = reference.repeat_interleave(per_prompt, 0)
            current = torch.log_softmax(logits, -1)
            kl = (current.exp() * (current - reference)).sum(-1).mean()
            line["kl"] = round(float(kl.detach()), 4)
            loss = loss + args.kl_coef * kl
        optimizer.zero_grad()
        loss.backward()
        line.update(loss=round(float(loss), 4),
                    grad_norm=round(float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)), 4))
        optimizer.step()
        # at the sampling temperature for sampled objectives (at 1 in runs recorded before --first-token-only)
        p_right = torch.softmax(logits.detach(), -1)[torch.arange(len(items)), gold]
        line["p_right"] = {kind: round(float(p_right[[k for k, q in enumerate(items) if q["kind"] == kind]].mean()), 4)
                           for kind in sorted(by_kind)}
        line["seconds"] = round(time.perf_counter() - started, 1)
        emit(line)
        if step % args.eval_every == 0 or step == args.steps:
            emit(evaluate(probe, held_out, step, temperature))
    if args.save_adapter:
        probe.model.save_pretrained(args.save_adapter)


if __name__ == "__main__":
    main()
