"""What runs inside the sandbox's child interpreter before the untrusted code.

Standard library only, and no import of `agentflow`: the child may be another interpreter. The launcher puts
this folder's parent on `sys.path`, imports `child.boot`, and takes the entry back off before any user code runs.
"""
