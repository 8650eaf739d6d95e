"""What every server stands on: settings, paths, the job engine, and the MCP conventions.

Modules here import nothing heavy at the top (no torch, scipy, matplotlib), so that a server starts fast.
The MCP side: `mcp_layer` (the app, servers and tool registration), `arguments` (strict tool arguments),
`job_tools` (the shared job tools), `tasks` (jobs as MCP tasks and subscriptions), `assemble`, `resources`,
`transport`; `sdk` is the one module that touches what the SDK does not expose publicly. The rest is plain Python.
"""

# The prefix of every setting's environment variable (settings.py), here so that what a job's worker imports (the
# local training job scrubs these from its environment) need not load the settings machinery (pydantic_settings).
ENV_PREFIX = "LLM_INFRA_MCP_"
