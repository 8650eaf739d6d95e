"""The bundled backends' factories and detection (their BackendInfo's `factory` and `detect`, declared in
servers/engines/builtin.py). A factory takes the backend's stored config; a detection takes the server's Settings and
starts nothing. A backend's own module is imported only when it is built or detected."""

import importlib.util
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from servers.core.settings import Settings
from servers.engines.backend import BackendStatus

if TYPE_CHECKING:
    from servers.launch.kubernetes import KubernetesBackend
    from servers.launch.local import LocalBackend
    from servers.launch.ray_backend import RayBackend
    from servers.launch.skypilot import SkyPilotBackend
    from servers.launch.slurm import SlurmBackend


# ---- factories: a backend from its stored config ---------------------------------------------------------------------
def make_local(config: Mapping[str, Any]) -> "LocalBackend":
    """The local backend runs its jobs in the job engine given in the config ("engine", "kind")."""
    from servers.launch.local import LocalBackend

    return LocalBackend(config["engine"], kind=config.get("kind", "training"))


def make_slurm(config: Mapping[str, Any]) -> "SlurmBackend":
    from servers.launch.slurm import SlurmBackend

    return SlurmBackend(job_root=config.get("job_root") or None)


def make_ray(config: Mapping[str, Any]) -> "RayBackend":
    from servers.launch.ray_backend import RayBackend

    return RayBackend(address=config.get("address") or None, id_prefix=config.get("id_prefix") or "llm-infra-mcp")


def make_kubernetes(config: Mapping[str, Any]) -> "KubernetesBackend":
    from servers.launch.kubernetes import KubernetesBackend

    return KubernetesBackend(kubeconfig=config.get("kubeconfig") or None)


def make_skypilot(config: Mapping[str, Any]) -> "SkyPilotBackend":
    from servers.launch.skypilot import SkyPilotBackend

    return SkyPilotBackend()


# ---- detection: what this machine offers -----------------------------------------------------------------------------


def detect_local(settings: Settings | None = None) -> BackendStatus:
    from servers.launch.local import LocalBackend

    found, detail = LocalBackend().available()
    return BackendStatus(
        name="local",
        detected=found,
        detail=detail,
        launch_supported=found,
        launch_note=None if found else "install torch to launch locally",
    )


def detect_slurm(settings: Settings | None = None) -> BackendStatus:
    commands = ["sbatch", "squeue", "scancel", "scontrol"]
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        return BackendStatus(
            name="slurm",
            detected=False,
            detail=f"{', '.join(missing)} not found on PATH",
            launch_supported=False,
            launch_note="install the Slurm client commands and point SLURM_CONF at the cluster",
        )
    from servers.launch.slurm import SlurmBackend

    found, detail = SlurmBackend().available()
    return BackendStatus(
        name="slurm",
        detected=found,
        detail=detail,
        launch_supported=found,
        launch_note=None if found else "the Slurm controller does not answer (sinfo); check SLURM_CONF",
    )


def detect_kubernetes(settings: Settings | None = None) -> BackendStatus:
    """Kubernetes: the client, the kubeconfig (KUBECONFIG or ~/.kube/config, read only), and a pre-flight of its
    cluster: the API answers, the TrainJob / PyTorchJob APIs are served, the runtime and the namespace exist."""
    if importlib.util.find_spec("kubernetes") is None:
        return BackendStatus(
            name="kubernetes",
            detected=False,
            detail="the kubernetes Python client is not installed (pip install 'llm-infra-mcp[kubernetes]')",
            launch_supported=False,
            launch_note="install the kubernetes extra and point KUBECONFIG at a cluster with Kubeflow Trainer",
        )
    from servers.launch.kubernetes import KubernetesBackend

    found, detail = KubernetesBackend(connect_timeout_s=3.0, request_timeout_s=10.0).available()
    return BackendStatus(
        name="kubernetes",
        detected=found,
        detail=detail,
        launch_supported=found,
        launch_note=None if found else "the kubeconfig's cluster must answer and serve TrainJob or PyTorchJob",
    )


def detect_skypilot(settings: Settings | None = None) -> BackendStatus:
    from servers.launch.skypilot import SkyPilotBackend

    found, detail = SkyPilotBackend().available()
    return BackendStatus(
        name="skypilot",
        detected=found,
        detail=detail,
        launch_supported=found,
        launch_note=None
        if found
        else "install skypilot (pip install 'llm-infra-mcp[skypilot]') and configure an API server (sky api login) "
        "or cloud credentials (sky check)",
    )


def detect_ray(settings: Settings | None = None) -> BackendStatus:
    """Ray: the package, and the Jobs API at the settings' ray_address (LLM_INFRA_MCP_RAY_ADDRESS, else
    RAY_ADDRESS) answering."""
    if importlib.util.find_spec("ray") is None:
        return BackendStatus(
            name="ray",
            detected=False,
            detail="ray is not installed (pip install 'llm-infra-mcp[ray]')",
            launch_supported=False,
            launch_note="install the ray extra and point LLM_INFRA_MCP_RAY_ADDRESS at a cluster",
        )
    from servers.launch.ray_backend import RayBackend

    found, detail = RayBackend(address=(settings.ray_address if settings is not None else None) or None).available()
    return BackendStatus(
        name="ray",
        detected=found,
        detail=detail,
        launch_supported=found,
        launch_note=None if found else "set LLM_INFRA_MCP_RAY_ADDRESS to a reachable Ray Jobs API",
    )


def detect_all(settings: Settings | None = None) -> list[BackendStatus]:
    """Every registered backend's detection, in the registry's order."""
    from servers.engines import registry

    settings = settings if settings is not None else Settings()
    return [registry.get(name).detect_status(settings) for name in registry.names()]
