"""The bundled backends: one BackendInfo each. Their modules (servers/launch/*) are named by "module:attribute"
references, imported on first use: this layer imports no server package (the factories, taking a backend's stored
config, live beside the detection in servers/launch/backends.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from servers.engines.registry import BackendInfo, register


def _slurm_config(settings: Any) -> dict[str, Any]:
    return {"job_root": str(settings.home / "slurm-jobs")}


def _ray_config(settings: Any) -> dict[str, Any]:
    # A Ray submission id comes from the job's idempotency key, so that a retried submit finds its job. Two servers
    # (two state directories) sharing one Ray cluster would then find each other's jobs by the same key: the id's
    # prefix names this state directory.
    home = hashlib.sha256(str(Path(settings.home).resolve()).encode()).hexdigest()[:8]
    return {"address": settings.ray_address, "id_prefix": f"llm-infra-mcp-{home}"}


register(
    BackendInfo(
        name="local",
        summary="torchrun on this machine, run by the job engine",
        factory="servers.launch.backends:make_local",
        options="servers.launch.local:LocalOptions",
        detect="servers.launch.backends:detect_local",
        poll_s=0.5,
        capabilities=frozenset({"in_engine", "local_job_folder"}),
    )
)
register(
    BackendInfo(
        name="slurm",
        summary="sbatch on a Slurm cluster",
        factory="servers.launch.backends:make_slurm",
        config=_slurm_config,
        options="servers.launch.slurm:SlurmOptions",
        detect="servers.launch.backends:detect_slurm",
        poll_s=1.0,  # slurmctld is shared by every user of the cluster: at most once a second per job
        capabilities=frozenset({"multi_node", "arrays", "node_pinning", "local_job_folder"}),
    )
)
register(
    BackendInfo(
        name="ray",
        summary="a Ray cluster's Jobs API",
        factory="servers.launch.backends:make_ray",
        config=_ray_config,
        options=None,  # the Ray backend takes no options of its own
        plan_model="servers.launch.ray_backend:RayPlan",
        detect="servers.launch.backends:detect_ray",
        poll_s=0.25,  # one cheap HTTP GET
        capabilities=frozenset({"local_job_folder"}),
    )
)
register(
    BackendInfo(
        name="kubernetes",
        summary="a Kubeflow TrainJob or PyTorchJob",
        factory="servers.launch.backends:make_kubernetes",
        options="servers.launch.kubernetes:KubernetesOptions",
        plan_model="servers.launch.kubernetes:KubernetesPlan",
        plan_warnings="servers.launch.kubernetes:plan_warnings",
        detect="servers.launch.backends:detect_kubernetes",
        poll_s=2.0,
        capabilities=frozenset({"multi_node", "cluster_nodes", "images", "log_sync"}),
    )
)
register(
    BackendInfo(
        name="skypilot",
        summary="a SkyPilot managed job",
        factory="servers.launch.backends:make_skypilot",
        options="servers.launch.skypilot:SkyPilotOptions",
        detect="servers.launch.backends:detect_skypilot",
        poll_s=10.0,  # each status is a request to the API server, which asks its controller
        grace_s=6 * 3600.0,  # provisioning and spot recovery
        capabilities=frozenset({"multi_node", "cluster_nodes", "images"}),
    )
)
