"""`agentflow eval`: benchmarks, the resumable runner, results, comparison and the optional LLM judge.

Scorers live in `agentflow.scoring` (shared with training rewards). The CLI sub-app is `agentflow.eval.cli:eval_app`.
"""
