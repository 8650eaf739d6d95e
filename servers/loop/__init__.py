"""The experiment loop: an MCP client that drives the suite over stdio through a whole study (node check, overlap
where GPUs are, an adaptive RL scaling study that stops variants on forecasts, a decision) and writes a report a
person reads.

- study.py: the loop's decisions as plain functions over what the tools return (no MCP)
- client.py: the stdio client that starts `llm-infra-mcp serve suite` and records every call
- runner.py: the study, step by step
- report.py: report.md, a self-contained report.html and study.json
- cli.py: the command line (examples/experiment_loop.py)
"""
