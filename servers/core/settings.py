"""One settings object for every server, read from LLM_INFRA_MCP_* environment variables.

Every field has a default that works with nothing set. README.md lists them (a test keeps the list true).
"""

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from servers.core import ENV_PREFIX


def default_home() -> Path:
    """$XDG_STATE_HOME/llm-infra-mcp, else ~/.local/state/llm-infra-mcp."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "llm-infra-mcp"


_SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/dev", "/proc", "/sys", "/run")


def default_root_ok(folder: Path) -> bool:
    """Whether the current directory may serve as a default root: not '/', not the home directory or one of its
    parents, not a system folder (GUI clients often start servers in '/' or the home directory, and taking that
    as a root would expose every file of the user)."""
    folder = folder.resolve()
    if folder == Path(folder.anchor):
        return False
    home = Path.home().resolve()
    if folder == home or home.is_relative_to(folder):
        return False
    return not any(folder == Path(d) or folder.is_relative_to(d) for d in _SYSTEM_DIRS)


def _resolved(path: Path) -> Path:
    """`path` resolved; as given (absolute) when it cannot be (a symlink loop): resolve_inside_roots skips it."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return Path(path).expanduser().absolute()


class Settings(BaseSettings):
    """Settings shared by all servers. Environment variables: LLM_INFRA_MCP_<FIELD NAME IN CAPITALS>."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, extra="ignore")

    home: Path = Field(
        default_factory=default_home,
        description="State directory: the job database and the job folders (logs, metrics, results).",
    )
    allowed_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders from which file inputs and training scripts may be read, separated by "
        f"'{os.pathsep}'. Empty means: the state directory, and the current directory unless it is '/', the home "
        "directory, one of its parents, or a system folder (GUI clients often start servers in '/').",
    )
    max_concurrent_jobs: int = Field(default=4, ge=1, le=1024, description="Jobs running at once, all kinds together.")
    max_job_wall_s: float = Field(
        default=24 * 3600.0, gt=0, description="Longest wall time any job may ask for, in seconds."
    )
    cancel_grace_s: float = Field(
        default=10.0,
        ge=0.1,
        le=600,
        description="Seconds between SIGTERM and SIGKILL when a job is cancelled or times out.",
    )
    max_gpus_per_job: int = Field(default=8, ge=0, le=4096, description="GPUs one training job may use.")
    max_concurrent_gpus: int = Field(
        default=8,
        ge=0,
        le=65536,
        description="Distinct GPUs of this machine the running training jobs may hold together: a GPU that "
        "share_gpus jobs share counts once, and a job that asks for more is refused, shared or not.",
    )
    confirm_above_gpu_hours: float = Field(
        default=1.0,
        ge=0,
        description="Training launches estimated above this many GPU-hours need the person's "
        "confirmation (elicitation, or a plan_token when the client cannot elicit).",
    )
    confirm_above_node_hours: float = Field(
        default=1.0,
        ge=0,
        description="Cluster launches (slurm, kubernetes, skypilot, ray) that ask for no GPUs need the person's "
        "confirmation above this many node-hours (nodes x wall-time limit): a node held costs what it costs, GPUs "
        "asked for or not. Launches with GPUs are decided on GPU-hours.",
    )
    auto_approve_gpu_hours: float = Field(
        default=0.0,
        ge=0,
        description="For clients that cannot ask the person: launches above the confirmation threshold but at most "
        "this many GPU-hours (and, for cluster nodes without GPUs, node-hours) start with the plan_token alone. "
        "Above it the person runs `llm-infra-mcp approve PLAN_ID`. 0: never.",
    )
    job_network: Literal["isolated", "host"] = Field(
        default="isolated",
        description="Single-node training jobs run in a network namespace of their own with only loopback "
        "(isolated), so torchrun's unauthenticated rendezvous store is reachable from no other machine; 'host' runs "
        "them in the host's network (the store then listens on every interface).",
    )
    job_sandbox: Literal["on", "off"] = Field(
        default="on",
        description="Local training jobs run in a sandbox (mount, PID and user namespaces) in which the state "
        "directory shows only the job's own outputs and this package and Python are read-only, so a job cannot reach "
        "the database, approvals, keys, tool cache, other jobs or the server's processes; where the kernel refuses "
        "namespaces, planning refuses. 'off' runs jobs with the server's full access: only for trusted jobs.",
    )
    max_log_bytes_per_job: int = Field(
        default=256 * 1024 * 1024,
        ge=64 * 1024,
        description="Bytes of logs one job keeps, all its processes together; past it the logs are cut (the job "
        "goes on) and read_job_logs says so.",
    )
    exporter_urls: Annotated[list[str], NoDecode] = Field(
        default=["http://127.0.0.1:9400/metrics", "http://localhost:9400/metrics", "http://[::1]:9400/metrics"],
        description="The only URLs read_dcgm_exporter may fetch, separated by commas or spaces: each entry allows "
        "URLs with exactly its scheme, host and port (80/443 when not written) whose path is its path or lies below "
        "it (http://node-7:9400 allows every path there). Default: dcgm-exporter's port 9400 on loopback. Empty: "
        "none.",
    )

    @field_validator("exporter_urls", "tracking_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        """A list setting given as one string (the environment): its entries separated by commas or spaces."""
        if isinstance(value, str):
            return [part for part in value.replace(",", " ").split() if part]
        return value

    @field_validator("exporter_urls", mode="after")
    @classmethod
    def _check_exporter_urls(cls, value: list[str]) -> list[str]:
        from urllib.parse import urlsplit

        for url in value:
            parts = urlsplit(url)
            try:
                port = parts.port  # raises for a port outside 0-65535
            except ValueError:
                port = -1
            if port is not None and not 1 <= port <= 65535:
                raise ValueError(f"exporter URL {url!r} has a port outside 1-65535")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"exporter URL {url!r} must be an http:// or https:// URL with a host")
            if parts.username is not None or parts.password is not None or "@" in parts.netloc:
                raise ValueError(f"exporter URL {url!r} must not carry a user name or password")
            if parts.query or parts.fragment:
                raise ValueError(f"exporter URL {url!r} must not carry a query or fragment")
        return value

    tracking_hosts: Annotated[list[str], NoDecode] = Field(
        default=["127.0.0.1", "localhost", "::1"],
        description="The only hosts a run source URI (an MLflow tracking server, anything remote) may name, "
        "separated by commas or spaces; a URI on another host is refused before any connection. Default: loopback. "
        "Empty: none.",
    )

    @field_validator("tracking_hosts", mode="after")
    @classmethod
    def _check_tracking_hosts(cls, value: list[str]) -> list[str]:
        import ipaddress
        import re

        hosts = []
        for host in value:
            bare = host.strip().lower()
            if bare.startswith("[") and bare.endswith("]"):
                bare = bare[1:-1]
            try:
                ok = bool(ipaddress.ip_address(bare)) if ":" in bare else bool(re.fullmatch(r"[a-z0-9._-]+", bare))
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(
                    f"tracking host {host!r} is not a host name or IP address; accepted: names like node-7 or "
                    "mlflow.lab, IPv4 or IPv6 addresses, without scheme, port or path"
                )
            hosts.append(bare)
        return list(dict.fromkeys(hosts))

    toolsets: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="The parts the suite serves, separated by commas (scaling, diagnostics, overlap, launch); the job "
        "tools come with any part that starts jobs. Empty: all. Fewer tools, fewer tokens in every conversation.",
    )

    @field_validator("toolsets", mode="before")
    @classmethod
    def _split_toolsets(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().lower() for part in value.replace(",", " ").split() if part.strip()]
        return value

    @field_validator("toolsets", mode="after")
    @classmethod
    def _check_toolsets(cls, value: list[str]) -> list[str]:
        known = ("scaling", "diagnostics", "overlap", "launch")
        unknown = [v for v in value if v not in known]
        if unknown:
            raise ValueError(f"toolsets: {', '.join(unknown)} unknown; accepted: {', '.join(known)}")
        return list(dict.fromkeys(value))

    ray_address: str = Field(
        default="",
        description="The Ray Jobs API address (the head's dashboard, e.g. http://127.0.0.1:8265) for backend 'ray'; "
        "empty: the RAY_ADDRESS environment variable. The cluster's token comes from RAY_AUTH_TOKEN, "
        "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token.",
    )
    http_host: str = Field(default="127.0.0.1", description="Address the HTTP transport binds.")
    http_port: int = Field(default=8765, ge=1, le=65535, description="Port the HTTP transport binds.")
    http_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds an HTTP client has to send a request's whole body; a slower one gets 408.",
    )
    http_token: SecretStr | None = Field(
        default=None,
        description="Bearer token HTTP clients must send. Required when binding any address other than loopback.",
    )

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part.strip()]
        return value

    @field_validator("home", mode="after")
    @classmethod
    def _absolute_home(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    def roots(self) -> list[Path]:
        """The allowed roots, resolved: the configured ones, or by default the state directory and the current
        directory where that is a safe default (see `default_root_ok`)."""
        if self.allowed_roots:
            return [_resolved(p) for p in self.allowed_roots]
        cwd = Path.cwd().resolve()
        return [cwd, self.home] if default_root_ok(cwd) else [self.home]

    @property
    def db_path(self) -> Path:
        return self.home / "state.db"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"


def settings_table() -> list[tuple[str, str, str]]:
    """(environment variable, default, description) for every setting, for README and `llm-infra-mcp settings`."""
    rows = []
    for name, field in Settings.model_fields.items():
        if field.default_factory is default_home:
            default = "$XDG_STATE_HOME/llm-infra-mcp or ~/.local/state/llm-infra-mcp"
        elif name == "allowed_roots":
            default = "current directory and state directory"
        elif field.default is None:
            default = "unset"
        elif isinstance(field.default, list):
            default = ", ".join(str(v) for v in field.default) or "empty"
        else:
            default = str(field.default)
        rows.append((ENV_PREFIX + name.upper(), default, field.description or ""))
    return rows
