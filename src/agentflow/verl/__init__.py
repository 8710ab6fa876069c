"""Flow-GRPO on verl: the same flow and rewards as `agentflow train`, with verl's distributed trainer.

Layout (verl is imported lazily, only by the modules that need it):
- `config`: `VerlTrainConfig` (our training config plus a `verl:` section) and its mapping onto verl's keys.
- `data`: our question files -> the parquet rows verl's dataloader reads, and back.
- `engine`: `RolloutServerEngine`, the planner's engine: token-in/token-out calls to verl's rollout servers.
- `rows`: a scored trajectory -> one training row per planner turn (masks, rewards, length limits).
- `runner`: runs one trajectory of the flow for verl and returns its rows (no verl import).
- `agent_loop`: the thin verl shim, `AgentflowAgentLoop` (registered as "agentflow").
- `plugin`: registrations verl loads in every process (agent loop, advantage estimator).
- `launch`: `print_config(path)` and `launch(path)` for `agentflow train --backend verl`.
- `convert`: a verl checkpoint -> a Hugging Face directory `agentflow solve` / `eval` load.
"""

VERL_REQUIREMENTS = (
    "verl==0.9.1",
    "hydra-core>=1.3",
    "TransferQueue>=0.1.10",
    "pyzmq>=25",
    "msgspec>=0.18",
    "cachetools>=5",
    "fastapi>=0.110",
    "uvicorn>=0.29",
    "pyarrow>=19",
)
"""The `[verl]` extra: verl itself plus what its agent loop and v1 trainer import but verl's base install
lacks (measured on verl 0.9.1). `hydra-core>=1.3` is verl's own need, stated so that pip fails loudly instead of
backtracking to hydra-core 0.11 when another pin (antlr4 4.13 via math-verify's extra) conflicts with it.
Rollout backends (vLLM, SGLang) are installed per GPU node, see docs/verl.md."""
