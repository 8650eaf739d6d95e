"""One settings object for every server, read from LLM_INFRA_MCP_* environment variables.

Every field has a default that works with nothing set. README.md lists them (a test keeps the list true).
"""

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "LLM_INFRA_MCP_"


def default_home() -> Path:
    """$XDG_STATE_HOME/llm-infra-mcp, else ~/.local/state/llm-infra-mcp."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "llm-infra-mcp"


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
        f"'{os.pathsep}'. Empty means: the current directory and the state directory.",
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
        default=8, ge=0, le=65536, description="GPUs all running training jobs may use together."
    )
    confirm_above_gpu_hours: float = Field(
        default=1.0,
        ge=0,
        description="Training launches estimated above this many GPU-hours need the person's "
        "confirmation (elicitation, or a plan_token when the client cannot elicit).",
    )
    http_host: str = Field(default="127.0.0.1", description="Address the HTTP transport binds.")
    http_port: int = Field(default=8765, ge=1, le=65535, description="Port the HTTP transport binds.")
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
        """The allowed roots, resolved: the configured ones, or the current directory and the state directory."""
        configured = self.allowed_roots or [Path.cwd(), self.home]
        return [Path(p).expanduser().resolve() for p in configured]

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
        else:
            default = str(field.default)
        rows.append((ENV_PREFIX + name.upper(), default, field.description or ""))
    return rows
