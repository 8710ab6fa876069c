"""`python -m agentflow.train.tasks`: regenerate the shipped task files."""

from agentflow.train.tasks import main

main()
