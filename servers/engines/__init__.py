"""The engines layer: what launch and diagnostics submit jobs through.

- ``backend``: the Backend protocol (what the servers call: available, plan, submit, status, cancel), its models, and
  the sub-protocols of capabilities with methods of their own (LogSyncBackend, ArrayBackend);
- ``registry``: one BackendInfo per engine (name, factory, options model, detection, poll interval, capabilities);
  ``builtin`` declares the bundled five;
- ``follow``: following an engine's job until it ends, at its declared poll interval.

Plain modules (no MCP). Nothing here imports a server package at import time; a backend's own module is imported
when its BackendInfo is first used.
"""
