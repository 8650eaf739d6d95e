"""The one registry of launch backends: a backend is one module and one `register(BackendInfo(...))` line.

Every place that needs to know the engines asks here: which names a spec may give, which options each takes, how
often its follower asks the engine, what it can do (capabilities, declared, never found by getattr or isinstance),
how to build it and how to detect it. References to a backend's module are "module:attribute" strings, imported
on first use, so that the registry costs nothing at start-up and a server imports only the engines it uses.

Capabilities (`CAPABILITIES`):
- ``in_engine``: the job engine runs the job itself here (local torchrun): its factory is given the server's job
  engine and job kind ({"engine": ..., "kind": ...}) rather than a stored config; otherwise a worker follows the
  engine's job (launch/remote.py);
- ``multi_node``: nnodes > 1; ``cluster_nodes``: the ranks run on the engine's nodes, never this machine;
- ``images``: a container image runs the job; ``arrays``: a sweep can go as one job array;
- ``node_pinning``: a job can be pinned to named nodes (what the bandwidth probes need);
- ``log_sync``: the ranks' logs live on the engine and are copied into the job folder as the job is followed
  (the backend's ``sync_logs``);
- ``local_job_folder``: the job's folder (its checkpoints among its files) is the job engine's folder on this
  machine's file system, where the job's processes read and write it (local torchrun; Slurm and Ray with a file
  system the nodes share): what a job resuming from another job's checkpoints needs (launch/training.py
  resume_from), since the server copies them there before the job starts.
A capability with methods of its own names the sub-protocol the backend then implements (engines/backend.py):
``log_sync`` -> LogSyncBackend, ``arrays`` -> ArrayBackend.

A backend declared outside servers/ (a test's toy backend, a plugin) is registered by the code that declares it, in
the server's process. The job's worker process (the follower of a job the job engine does not run itself) is another
process, which never ran that code: so the server stores the declaration with the job (`BackendInfo.record()`: the
factory and plan model as "module:attribute" references, the poll interval, grace and capabilities; beside it the
config the server made), and the worker rebuilds the backend from them (`from_record`), importing only the modules
the references name. The job is then
followed as it was declared when it was submitted, whatever is registered in the worker, and a factory must be a
module-level class or function (a reference names it). A record is written by the server into its own state
directory, never taken from a tool's arguments.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servers.core.refs import resolve

CAPABILITIES = frozenset(
    {"in_engine", "multi_node", "cluster_nodes", "images", "arrays", "node_pinning", "log_sync", "local_job_folder"}
)


@dataclass(frozen=True)
class BackendInfo:
    """One engine, declared.

    - ``factory``: a callable (or its "module:attribute") taking the backend's stored config (a JSON-able dict, see
      ``config``) and returning the backend;
    - ``config``: a callable taking the server's Settings and returning that config (no secrets: tokens stay in the
      environment); None: an empty config;
    - ``options``: the backend's own options model (a pydantic model, or its reference), what a spec's ``options``
      is validated against; None: the backend takes none;
    - ``detect``: a callable (or reference) taking the Settings and returning a BackendStatus; None: the backend
      built from its config is asked `available()`;
    - ``plan_model``: the BackendPlan subclass (or its reference) the backend's plans are, what a stored plan is
      read back as; None: BackendPlan;
    - ``plan_warnings``: a callable (or reference) taking the backend's plan and the spec it was made from and
      returning what the launch's plan warns of for this backend alone (e.g. what pods asking for no GPU get);
      None: nothing;
    - ``poll_s``: the slowest a follower asks the engine about one job;
    - ``grace_s``: how long past the job's wall-time limit its follower keeps following (a queue, a provisioning).
    """

    name: str
    summary: str
    factory: Callable[[Mapping[str, Any]], Any] | str
    config: Callable[[Any], dict[str, Any]] | str | None = None
    options: Any = None
    detect: Callable[[Any], Any] | str | None = None
    plan_model: Any = None
    plan_warnings: Callable[[Any, Mapping[str, Any]], list[str]] | str | None = None
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
        if not (self.poll_s > 0 and self.grace_s >= 0):
            raise ValueError(f"backend {self.name!r}: poll_s must be > 0 and grace_s >= 0")

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

    def warnings_for(self, plan: Any, spec: Mapping[str, Any]) -> list[str]:
        """What the launch's plan warns of for this backend alone (``plan_warnings``)."""
        return list(resolve(self.plan_warnings)(plan, spec)) if self.plan_warnings is not None else []

    def load_plan(self, data: Mapping[str, Any]) -> Any:
        """A stored plan read back as the backend's plan model (a BackendPlan)."""
        from servers.engines.backend import BackendPlan

        model = resolve(self.plan_model) if self.plan_model is not None else BackendPlan
        return model.model_validate(dict(data))

    def detect_status(self, settings: Any) -> Any:
        """What list_backends says of this engine here (a BackendStatus); never raises for an engine's failure."""
        from servers.engines.backend import BackendStatus

        if self.detect is not None:
            return resolve(self.detect)(settings)
        try:
            found, detail = self.build(self.config_for(settings)).available()
        except Exception as exc:  # a backend that cannot even be built here is not available
            found, detail = False, f"{type(exc).__name__}: {exc}"[:500]
        return BackendStatus(
            name=self.name,
            detected=found,
            detail=detail,
            launch_supported=found,
            launch_note=None if found else f"the {self.name} backend says it is not usable here",
        )

    def record(self) -> dict[str, Any]:
        """The declaration as JSON, what a job's worker rebuilds the backend from (see the module docstring)."""
        return {
            "name": self.name,
            "summary": self.summary,
            "factory": reference(self.factory),
            "plan_model": reference(self.plan_model) if self.plan_model is not None else None,
            "poll_s": self.poll_s,
            "grace_s": self.grace_s,
            "capabilities": sorted(self.capabilities),
        }


def reference(target: Any) -> str:
    """The "module:attribute" reference of a module-level class or function (or the reference itself)."""
    if isinstance(target, str):
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"{target!r} has no module-level name; accepted: a class or function defined at a module's top level, "
            "or its 'module:attribute' reference"
        )
    return f"{module}:{qualname}"


def from_record(data: Mapping[str, Any]) -> BackendInfo:
    """The BackendInfo a server stored with a job (`BackendInfo.record()`)."""
    try:
        return BackendInfo(
            name=str(data["name"]),
            summary=str(data.get("summary") or ""),
            factory=str(data["factory"]),
            plan_model=str(data["plan_model"]) if data.get("plan_model") else None,
            poll_s=float(data["poll_s"]),
            grace_s=float(data["grace_s"]),
            capabilities=frozenset(str(c) for c in data.get("capabilities") or ()),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a stored backend record lacks {exc}; accepted: what BackendInfo.record() writes") from None


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
