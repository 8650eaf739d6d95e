"""The published tool definitions of a server, kept from one start to the next (issue 14: cold start).

Generating the JSON schemas of ~40 tools is most of what building the suite costs (pydantic's schema generation,
~0.3 s on a laptop core). What tools/list publishes depends only on the code: the source files of this package,
the MCP SDK, pydantic, Python, and the LLM_INFRA_MCP_* settings (read here in case a description ever
quotes one). So a build writes what it published to `<state dir>/cache/tools-<digest>.json` and the next start with
the same digest registers its tools from that file; a tool's models are built on its first call. Any change to
any of those inputs changes the digest, so a stale file is never used; a file that cannot be read or written is
ignored (the tools are then built as if there were none) and said in the log.
"""

import hashlib
import json
import logging
import os
import sys
import tempfile
import weakref
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 4  # 4: prompt entries name their file, never a path
_ENTRY_KEYS = {"description", "input", "output", "context", "title", "annotations"}
_caches: "weakref.WeakKeyDictionary[Any, ToolCache]" = weakref.WeakKeyDictionary()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def source_digest() -> str:
    """The package's source files by path, size and modification time, as Python's own bytecode cache counts them,
    as they are now."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            try:
                stat = os.stat(path)
                digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
            except OSError:
                digest.update(f"{path}|?\n".encode())
    return digest.hexdigest()


# The sources as this process found them when it imported this module, which mcp_layer does before any server
# module is imported. A process that lives on while the files change (a test session, an upgrade under a running
# server) keeps this digest, and `save` then writes nothing: what it built may be older code than the files.
_SOURCES_AT_START: str = source_digest()


_DECLARED: dict[str, str] = {}


def declare(key: str, value: str) -> None:
    """Something besides the sources that published definitions depend on (a registry filled at run time, e.g. the
    scaling laws a tool's input enumerates): it enters the digest of every server built from then on."""
    _DECLARED[key] = value


def sources_at_start() -> str:
    return _SOURCES_AT_START


def code_digest() -> str:
    """A digest of everything the published definitions depend on (see the module's docstring): the package's
    sources as this process started with them, the prompt files, the versions and the settings."""
    digest = hashlib.sha256()
    digest.update(f"{FORMAT}|{sys.version}|mcp {_version('mcp')}|pydantic {_version('pydantic')}".encode())
    digest.update(sources_at_start().encode())
    from servers.core.paths import prompts_dir  # the prompt files: what prompts/list shows is kept too

    for path in sorted(prompts_dir().glob("*.md")):
        try:
            stat = path.stat()
            digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}|?\n".encode())
    for key in sorted(k for k in os.environ if k.startswith("LLM_INFRA_MCP_")):
        digest.update(f"{key}={os.environ[key]}\n".encode())
    for key in sorted(_DECLARED):
        digest.update(f"declared {key}={_DECLARED[key]}\n".encode())
    return digest.hexdigest()[:32]


class ToolCache:
    """The definitions read at start (`get`) and those built in this start (`put`, written by `save`)."""

    def __init__(self, folder: Path, digest: str | None = None) -> None:
        self.folder = folder
        self.digest = digest or code_digest()
        self.path = folder / f"tools-{self.digest}.json"
        self.loaded: dict[str, dict[str, Any]] = {}
        self.built: dict[str, dict[str, Any]] = {}
        self.loaded_parts: dict[str, list[str]] = {}
        self.built_parts: dict[str, list[str]] = {}
        self.loaded_prompts: list[dict[str, Any]] | None = None
        self.built_prompts: list[dict[str, Any]] | None = None
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("digest") == self.digest and isinstance(data.get("tools"), dict):
                self.loaded = data["tools"]
                parts = data.get("parts")
                self.loaded_parts = parts if isinstance(parts, dict) else {}
                prompts = data.get("prompts")
                self.loaded_prompts = prompts if isinstance(prompts, list) else None
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("tool cache %s not used: %s", self.path, exc)

    def get(self, name: str) -> dict[str, Any] | None:
        entry = self.loaded.get(name)
        if isinstance(entry, dict) and _ENTRY_KEYS <= set(entry):
            return entry
        return None

    def part(self, name: str) -> dict[str, dict[str, Any]] | None:
        """The entries of every tool a part registered at the last build, if all are here."""
        names = self.loaded_parts.get(name)
        if not isinstance(names, list) or not names:
            return None
        entries = {n: self.get(n) for n in names if isinstance(n, str)}
        if len(entries) != len(names) or any(e is None for e in entries.values()):
            return None
        return entries  # type: ignore[return-value]

    def put_part(self, name: str, tools: list[str]) -> None:
        self.built_parts[name] = tools

    def prompts(self) -> list[dict[str, Any]] | None:
        return self.loaded_prompts

    def put_prompts(self, prompts: list[dict[str, Any]]) -> None:
        self.built_prompts = prompts

    def put(self, name: str, entry: dict[str, Any]) -> None:
        self.built[name] = entry

    def save(self) -> None:
        """Write the definitions of this start (loaded and built) if any was built; remove older files."""
        if not self.built and not self.built_parts and self.built_prompts is None:
            return
        if source_digest() != sources_at_start():
            log.info("tool cache %s not written: the package's files changed since this process started", self.path)
            return
        tools = {**self.loaded, **self.built}
        parts = {**self.loaded_parts, **self.built_parts}
        prompts = self.built_prompts if self.built_prompts is not None else self.loaded_prompts
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tools-", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                data = {"digest": self.digest, "tools": tools, "parts": parts, "prompts": prompts}
                json.dump(data, out, separators=(",", ":"))
            os.replace(tmp, self.path)
            for old in self.folder.glob("tools-*.json"):
                if old != self.path:
                    old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("tool cache %s not written: %s", self.path, exc)


def attach(server: Any, folder: Path) -> ToolCache:
    cache = ToolCache(folder)
    _caches[server] = cache
    return cache


def for_server(server: Any) -> ToolCache | None:
    return _caches.get(server)
