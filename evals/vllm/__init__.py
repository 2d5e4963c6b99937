"""The shadow inside vLLM's GPU engine, measured through vLLM's own server (issue 32): the
trial's driver (`python -m evals.vllm.trial`), its phases (follow, cost, peer), its client and
state, the vLLM server it starts (server.py) and its agents from recorded sessions
(`python -m evals.vllm.agents`)."""
