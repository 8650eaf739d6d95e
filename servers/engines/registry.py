"""The one registry of launch backends: a backend is one module and one `register(BackendInfo(...))` line.

Every place that needs to know the engines asks here: which names a spec may give, which options each takes, how
often its follower asks the engine, what it can do (capabilities, declared, never found by getattr or isinstance),
how to build it and how to detect it. References to a backend's module are "module:attribute" strings, imported
on first use, so that the registry costs nothing at start-up and a server imports only the engines it uses.

Capabilities (`CAPABILITIES`):
- ``in_engine``: the job engine runs the job itself here (local torchrun); otherwise a worker follows the engine's
  job (launch/remote.py);
- ``multi_node``: nnodes > 1; ``cluster_nodes``: the ranks run on the engine's nodes, never this machine;
- ``images``: a container image runs the job; ``arrays``: a sweep can go as one job array;
- ``node_pinning``: a job can be pinned to named nodes (what the bandwidth probes need);
- ``log_sync``: the ranks' logs live on the engine and are copied into the job folder as the job is followed
  (the backend's ``sync_logs``).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

CAPABILITIES = frozenset({"in_engine", "multi_node", "cluster_nodes", "images", "arrays", "node_pinning", "log_sync"})


def resolve(reference: str | Any) -> Any:
    """A "module:attribute" reference imported, or the object itself."""
    if not isinstance(reference, str):
        return reference
    module, _, attribute = reference.partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


@dataclass(frozen=True)
class BackendInfo:
    """One engine, declared.

    - ``factory``: a callable (or its "module:attribute") taking the backend's stored config (a JSON-able dict, see
      ``config``) and returning the backend;
    - ``config``: a callable taking the server's Settings and returning that config (no secrets: tokens stay in the
      environment); None: an empty config;
    - ``options``: the backend's own options model (a pydantic model, or its reference), what a spec's ``options``
      is validated against; None: the backend takes none;
    - ``detect``: a callable (or reference) taking the Settings and returning a BackendStatus;
    - ``poll_s``: the slowest a follower asks the engine about one job;
    - ``grace_s``: how long past the job's wall-time limit its follower keeps following (a queue, a provisioning).
    """

    name: str
    summary: str
    factory: Callable[[Mapping[str, Any]], Any] | str
    config: Callable[[Any], dict[str, Any]] | str | None = None
    options: Any = None
    detect: Callable[[Any], Any] | str | None = None
    poll_s: float = 1.0
    grace_s: float = 600.0
    capabilities: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - CAPABILITIES
        if unknown:
            raise ValueError(
                f"backend {self.name!r}: unknown capabilities {sorted(unknown)}; "
                f"known: {', '.join(sorted(CAPABILITIES))}"
            )
        if not self.name.isidentifier() or not self.name.islower():
            raise ValueError(f"backend name {self.name!r}: lower-case letters, digits and '_'")

    def can(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; known: {', '.join(sorted(CAPABILITIES))}")
        return capability in self.capabilities

    def build(self, config: Mapping[str, Any] | None = None) -> Any:
        return resolve(self.factory)(dict(config or {}))

    def config_for(self, settings: Any) -> dict[str, Any]:
        return dict(resolve(self.config)(settings)) if self.config is not None else {}

    def options_model(self) -> Any:
        return resolve(self.options) if self.options is not None else None


_lock = threading.Lock()
_backends: dict[str, BackendInfo] = {}


def register(info: BackendInfo, *, replace: bool = False) -> BackendInfo:
    """Add a backend (a test's toy backend too). A second backend of one name is refused unless `replace`."""
    with _lock:
        if info.name in _backends and not replace and _backends[info.name] != info:
            raise ValueError(f"backend {info.name!r} is registered already")
        _backends[info.name] = info
    return info


def unregister(name: str) -> None:
    with _lock:
        _backends.pop(name, None)


def names() -> tuple[str, ...]:
    _builtin()
    with _lock:
        return tuple(_backends)


def get(name: str) -> BackendInfo:
    """The backend of this name; a ValueError naming the accepted ones otherwise."""
    _builtin()
    with _lock:
        info = _backends.get(name)
    if info is None:
        raise ValueError(f"backend: {name!r} is not a known backend; accepted: {', '.join(names())}")
    return info


def with_capability(capability: str) -> tuple[str, ...]:
    return tuple(n for n in names() if get(n).can(capability))


_loaded = False


def _builtin() -> None:
    """The bundled backends, declared once (servers/engines/builtin.py)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module("servers.engines.builtin")
