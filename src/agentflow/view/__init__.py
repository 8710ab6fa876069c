"""`agentflow view`: trajectories, eval runs, comparisons and training runs in the browser.

A small stdlib HTTP server (`server.py`) answers JSON (`api.py`) read from the run directories (`sources.py`,
`eval_run.py`, `train_run.py`); the page is plain HTML, CSS and JavaScript modules shipped in `static/`, with
no build step. `export.py` puts the same page and every JSON answer into one HTML file that needs no server.
"""
