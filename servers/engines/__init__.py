"""The engines layer: what launch and diagnostics submit jobs through.

- ``registry``: one BackendInfo per engine (name, factory, options model, detection, poll interval, capabilities).

Plain modules (no MCP). Nothing here imports a server package at import time; a backend's own module is imported
when its BackendInfo is first used.
"""
