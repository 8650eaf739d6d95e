"""One registry of run readers, and how a run source (a path inside the allowed roots, or a URI) finds its reader.

A reader is one module declaring one ``ReaderInfo``; its code is named by "module:attr" strings, imported when
first used (servers/core/refs.py), so that the registry costs nothing at start-up and a reader's heavy package
(tensorboard, mlflow, wandb) is imported only when a run of that kind is read.

- ``detect(target) -> bool``: cheap (a directory listing, a file's first bytes, a URI's scheme); never raises for
  a source of another kind.
- ``read(target, keys, cap) -> RunData``: the run's series, only `keys` (source keys) when given, at most `cap`
  points kept per key (series.py); RunError with a clear message for a source it cannot read.

Detection asks the readers in registration order; the first that claims the source reads it. An explicit reader
name skips detection. A source no reader claims gets an error naming every accepted kind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servers.core.errors import InputError
from servers.core.paths import resolve_inside_roots
from servers.core.refs import resolve
from servers.runs.series import DEFAULT_CAP, RunData, RunError

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Target:
    """A run source as given (`text`) and what it is: a path resolved inside the allowed roots, or a URI whose
    host the reader checks against `hosts` (check_host) before it connects."""

    text: str
    path: Path | None = None
    uri: str | None = None
    hosts: tuple[str, ...] = DEFAULT_HOSTS

    def check_host(self) -> str:
        """The URI's host, if it is one of the allowed hosts; RunError naming them otherwise."""
        host = (urlsplit(self.uri or "").hostname or "").lower()
        if host not in {h.lower().strip("[]") for h in self.hosts}:
            allowed = ", ".join(self.hosts) or "none"
            raise RunError(
                f"run source {self.text!r}: host {host or '(none)'!r} is not an allowed tracking host; allowed: "
                f"{allowed} (setting LLM_INFRA_MCP_TRACKING_HOSTS)"
            )
        return host


@dataclass(frozen=True)
class ReaderInfo:
    """A run reader: its name, what it reads (one line, for errors and listings), the Python package it needs
    (None: the standard library), and its detect and read functions (callables or "module:attr" references)."""

    name: str
    accepts: str
    detect: Callable[[Target], bool] | str
    read: Callable[..., RunData] | str
    package: str | None = None


_READERS: dict[str, ReaderInfo] = {}


def register(info: ReaderInfo, *, replace: bool = False) -> ReaderInfo:
    if info.name in _READERS and not replace:
        raise ValueError(f"a run reader named {info.name!r} is already registered")
    _READERS[info.name] = info
    return info


def unregister(name: str) -> None:
    _READERS.pop(name, None)


def names() -> list[str]:
    _load_builtin()
    return list(_READERS)


def get(name: str) -> ReaderInfo:
    _load_builtin()
    info = _READERS.get(name)
    if info is None:
        raise InputError(f"unknown run reader {name!r}; readers: {', '.join(_READERS)}")
    return info


def accepted() -> str:
    """Every accepted kind of run source, for an error message."""
    _load_builtin()
    return "; ".join(f"{r.name}: {r.accepts}" for r in _READERS.values())


def _load_builtin() -> None:
    if not _READERS:
        resolve("servers.runs.builtin:register_all")()


def is_uri(text: str) -> bool:
    scheme = urlsplit(text).scheme
    return len(scheme) > 1 and "://" in text  # "C:\\x" is a path; "http://h", "file:///x" are URIs


def target(text: str, *, roots: Iterable[Path], hosts: Iterable[str] = DEFAULT_HOSTS) -> Target:
    """The Target for `text`: a URI kept as it is (its reader checks the host), a file:// or sqlite:// URI or a
    path resolved inside the roots (InputError outside them; the text, query included, is kept)."""
    hosts = tuple(hosts)
    if is_uri(text):
        parts = urlsplit(text)
        if parts.scheme not in ("file", "sqlite"):
            return Target(text, uri=text, hosts=hosts)
        # sqlite:///rel.db is relative and sqlite:////abs.db absolute (SQLAlchemy's form, which MLflow uses)
        text_path = parts.path[1:] if parts.scheme == "sqlite" else parts.path
    else:
        text_path = text
    path = resolve_inside_roots(os.path.expanduser(text_path), roots, what="run source")
    if not path.exists():
        raise InputError(f"run source {text!r} does not exist (resolved to {path})")
    return Target(text, path=path, hosts=hosts)


def detect(where: Target) -> ReaderInfo:
    """The first reader that claims `where`; InputError naming every accepted kind when none does."""
    _load_builtin()
    for info in _READERS.values():
        try:
            if resolve(info.detect)(where):
                return info
        except (OSError, RunError):
            continue
    raise InputError(f"no run reader recognises {where.text!r}; accepted sources: {accepted()}")


def read_run(
    where: Target, *, keys: Iterable[str] | None = None, reader: str | None = None, cap: int = DEFAULT_CAP
) -> RunData:
    """Read the run at `where` (with `reader`, else the detected one); RunError becomes InputError."""
    info = get(reader) if reader is not None else detect(where)
    read: Any = resolve(info.read)
    try:
        return read(where, set(keys) if keys is not None else None, cap)
    except ModuleNotFoundError as exc:
        package = info.package or exc.name
        raise InputError(
            f"reading a {info.name} run needs the Python package {package!r}, which is not installed here: "
            f"pip install 'llm-infra-mcp[runs]' (or {package})"
        ) from None
    except RunError as exc:
        raise InputError(str(exc)) from None
