"""What every server stands on: settings, paths, the job engine, and the MCP conventions.

Modules here import nothing heavy at the top (no torch, scipy, matplotlib), so that a server starts fast.
Only `mcp_layer`, `resources` and `transport` import the MCP SDK; the rest is plain Python.
"""
