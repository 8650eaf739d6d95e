"""Launch templates for RL frameworks that bring their own entry point: verl (python -m verl.trainer.main_ppo,
hydra overrides) and OpenRLHF (python -m openrlhf.cli.train_ppo_ray, a Ray driver). Plain module, no MCP.

A template renders the command a user of the framework would write, with its logger pointed into the job folder
so the suite reads the run without configuration (the job's spec declares it: servers/runs/jobs.py), and the
job's GPUs set from the spec (nnodes x gpus_per_node), so the plan's GPU count and cost bound are the framework's.
The user's args are checked against the framework's own definitions before anything runs:
- verl: composed with the installed verl's shipped ppo_trainer config (hydra's compose API); an unknown key, a
  value of another type than the shipped default's, or a malformed override is refused, naming it.
- OpenRLHF (it does not install without CUDA): its driver's argparse flags, recorded from its source with the
  release and commit (recipes/openrlhf_flags.txt); an unknown flag is refused naming the nearest accepted ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers.core.errors import InputError, json_kind
from servers.engines.backend import JOB_DIR_PLACEHOLDER
from servers.runs.jobs import run_source

FLAGS_FILE = Path(__file__).resolve().parent / "recipes" / "openrlhf_flags.txt"
MAX_ARGS = 256  # the spec's own bound on args; the validators never see more


@dataclass(frozen=True)
class Rendered:
    """What a template makes of a spec: the module python runs and its arguments, the variables the logger
    needs, the run the job declares, and what was validated."""

    module: str
    args: list[str]
    env: dict[str, str]
    run_source: dict[str, str]
    validated: str
    notes: list[str] = field(default_factory=list)
    gpus_per_node: int = 0

    def ranks(self, gpus_present: int, *, remote: bool) -> tuple[int, int, list[str]]:
        """(processes per node, GPUs per node, warnings) for the plan: one driver; the framework's workers hold the
        GPUs. A job on this machine may not ask for more GPUs than it has."""
        if not remote and self.gpus_per_node > gpus_present:
            raise InputError(f"the job asks for {self.gpus_per_node} GPU(s) but this machine has {gpus_present}")
        return 1, self.gpus_per_node, []


@dataclass(frozen=True)
class Framework:
    name: str  # the recipe name a spec gives
    framework: str
    module: str
    backends: tuple[str, ...]  # where it runs
    multi_node: tuple[str, ...]  # where nnodes > 1 runs
    refusals: dict[str, str]  # backend -> why not there
    description: str
    metrics: tuple[str, ...]
    render: Callable[[list[str], int, int], Rendered]  # (args, nnodes, gpus_per_node)


# ---- verl -------------------------------------------------------------------------------------------------------
VERL_MODULE = "verl.trainer.main_ppo"
VERL_LOG = "metrics.jsonl"  # in the job folder: writable in the local sandbox, and its "step" gives progress
# Set from the spec: a user's override of these is refused, naming the spec field.
VERL_RESERVED = {
    "trainer.nnodes": "nnodes",
    "trainer.n_gpus_per_node": "gpus_per_node",
    "trainer.logger": "the template (['console','file']: the file logger is what the suite reads)",
}
# GRPO as verl's examples run it (examples/grpo_trainer/*.sh): a user's own override replaces each.
VERL_DEFAULTS = (("algorithm.adv_estimator", "grpo"), ("actor_rollout_ref.rollout.n", "5"))
_HYDRA_LOCK = threading.Lock()  # hydra's GlobalHydra is process-wide: one compose at a time


def verl_config_dir() -> Path | None:
    """The installed verl's shipped config folder (found without importing verl, which takes seconds), or None."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return folder if (folder / "ppo_trainer.yaml").is_file() else None


def _parse_overrides(args: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    for arg in args:
        if arg.startswith("-"):
            raise InputError(
                f"args: {arg[:80]!r}: verl's main_ppo takes hydra overrides (key=value, +key=value to add a key, "
                "~key to delete one); flags are not accepted"
            )
    try:
        parsed = OverridesParser.create().parse_overrides(list(args))
    except OverrideParseException as exc:
        first = str(exc).splitlines()[0]
        raise InputError(f"args: {first}; accepted: hydra overrides such as trainer.total_epochs=2") from None
    for override in parsed:
        if override.is_sweep_override():
            raise InputError(
                f"args: {override.input_line!r} is a sweep (several values); one value per key (plan a sweep for "
                "several runs)"
            )
    return parsed


def verl_validate(overrides: list[str], user_keys: list[tuple[str, str]]) -> str:
    """Compose verl's shipped ppo_trainer config with `overrides`; InputError naming what verl's config refuses.
    `user_keys` (key, override text) are the user's changed keys, whose values must keep the shipped type. The
    plan's validation note."""
    folder = verl_config_dir()
    if folder is None:
        return "not validated: verl is not installed here (the overrides go to verl's main_ppo as given)"
    version = importlib.metadata.version("verl")
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        composed = _compose(str(folder), tuple(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).splitlines()[0]
        raise InputError(
            f"args: verl {version}'s ppo_trainer config refuses them: {first} (a key must be one of the shipped "
            "config's; +key=value adds a new one)"
        ) from None
    # Read without resolving: an interpolation (${...}) is neither evaluated (oc.env would read this server's
    # environment into a message) nor type-checked.
    shipped_tree = _shipped(str(folder))
    tree = OmegaConf.to_container(composed, resolve=False)
    for key, text in user_keys:
        before, after = _raw(shipped_tree, key), _raw(tree, key)
        if _kind(before) is not None and _kind(after) is not None and not _compatible(before, after):
            raise InputError(
                f"args: {text[:200]!r}: verl {version}'s shipped {key} is {_kind(before)} ({before!r}); got "
                f"{_kind(after)} ({str(after)[:80]!r})"
            )
    samples, estimator = _raw(tree, "actor_rollout_ref.rollout.n"), _raw(tree, "algorithm.adv_estimator")
    if estimator == "grpo" and isinstance(samples, int) and samples < 2:
        raise InputError(
            f"args: GRPO normalises rewards within a group of responses per prompt: actor_rollout_ref.rollout.n "
            f"must be at least 2, got {samples}"
        )
    return f"validated against verl {version}'s shipped ppo_trainer config (hydra compose of the overrides)"


def _compose(folder: str, overrides: tuple[str, ...]) -> Any:
    """verl's ppo_trainer config in `folder` composed with `overrides` (hydra's errors as they come)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with _HYDRA_LOCK:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=folder, version_base=None):
                return compose(config_name="ppo_trainer", overrides=list(overrides))
        finally:
            GlobalHydra.instance().clear()


@functools.cache
def _shipped(folder: str) -> Any:
    """The shipped config as a plain tree, interpolations unresolved; composed once per process."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(_compose(folder, ()), resolve=False)


def _raw(tree: Any, key: str) -> Any:
    """The value at dotted `key` in a plain config tree; None where there is none or it is an interpolation."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return None if isinstance(tree, str) and "${" in tree else tree


def _kind(value: Any) -> str | None:
    """A scalar's kind in words; None for null, lists and mappings (the shipped default says nothing of the type)."""
    return json_kind(value) if isinstance(value, bool | int | float | str) else None


def _compatible(before: Any, after: Any) -> bool:
    if isinstance(before, bool) or isinstance(after, bool):
        return isinstance(before, bool) and isinstance(after, bool)
    if isinstance(before, float):
        return isinstance(after, int | float)  # 1 for 1.0
    return _kind(before) == _kind(after)  # an integer setting (counts, sizes) takes no fraction


def render_verl(args: list[str], nnodes: int, gpus_per_node: int) -> Rendered:
    """python -m verl.trainer.main_ppo with GRPO's defaults, the user's overrides, the job's nodes and GPUs and
    the file logger (VERL_FILE_LOGGER_PATH: JSON lines {"step", "data"} in the job folder)."""
    parsed = _parse_overrides(args)
    given = {o.key_or_group for o in parsed}
    for key, source in VERL_RESERVED.items():
        if key in given:
            raise InputError(f"args: {key} is set from {source}; give it there, not as an override")
    defaults = [f"{key}={value}" for key, value in VERL_DEFAULTS if key not in given]
    fixed = [
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={gpus_per_node}",
        "trainer.logger=[console,file]",
    ]
    if "trainer.default_local_dir" not in given:
        fixed.append(f"trainer.default_local_dir={JOB_DIR_PLACEHOLDER}/checkpoints")
    overrides = [*defaults, *args, *fixed]
    user = [(o.key_or_group, o.input_line) for o in parsed if not o.is_add() and not o.is_delete()]
    note = verl_validate(overrides, user)
    notes = [
        f"verl starts its workers through Ray ({nnodes} node(s) x {gpus_per_node} GPU(s)); its file logger writes "
        f"{VERL_LOG} in the job folder (opened anew, so a restarted verl begins the file again)",
    ]
    added = [o.input_line for o in parsed if o.is_add()]
    if added:
        notes.append(f"keys added with + are not in verl's shipped config, not validated: {', '.join(added)[:300]}")
    return Rendered(
        module=VERL_MODULE,
        args=overrides,
        env={"VERL_FILE_LOGGER_PATH": f"{JOB_DIR_PLACEHOLDER}/{VERL_LOG}"},
        run_source=run_source("verl", VERL_LOG),
        validated=note,
        notes=notes,
    )


# ---- OpenRLHF ---------------------------------------------------------------------------------------------------
OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"
OPENRLHF_TB = "tensorboard"  # in the job folder; OpenRLHF writes under <dir>/<wandb_run_name>
# Placement the template sets from the spec (every model colocated on the job's GPUs, so the job holds exactly
# nnodes x gpus_per_node): a user's own is refused.
OPENRLHF_RESERVED = (
    "--actor_num_nodes",
    "--actor_num_gpus_per_node",
    "--ref_num_nodes",
    "--ref_num_gpus_per_node",
    "--critic_num_nodes",
    "--critic_num_gpus_per_node",
    "--reward_num_nodes",
    "--reward_num_gpus_per_node",
    "--colocate_all_models",
    "--colocate_actor_ref",
    "--colocate_critic_reward",
    "--vllm_num_engines",
    "--use_tensorboard",
    "--async_train",  # vLLM then leaves the shared GPUs: the job would need more than it holds
)
OPENRLHF_DEFAULTS = (("--advantage_estimator", "group_norm"), ("--n_samples_per_prompt", "8"))
GROUPED = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")


@dataclass(frozen=True)
class Flag:
    name: str
    nargs: str  # "0" (a switch), "1", "2" or "*"
    type: str  # "int", "float", "str" or "-"
    choices: tuple[str, ...]


@functools.cache
def openrlhf_flags() -> tuple[dict[str, Flag], str, str]:
    """(flags by name, OpenRLHF version, commit) as recorded in recipes/openrlhf_flags.txt."""
    flags: dict[str, Flag] = {}
    meta: dict[str, str] = {}
    for line in FLAGS_FILE.read_text().splitlines():
        if line.startswith("# ") and "\t" in line:
            name, _, value = line[2:].partition("\t")
            meta[name] = value.strip()
        elif line and not line.startswith("#"):
            name, nargs, kind, choices = line.split("\t")
            flags[name] = Flag(name, nargs, kind, tuple(choices.split(",")) if choices != "-" else ())
    return flags, meta["version"], meta["commit"]


def _check_value(flag: Flag, value: str) -> None:
    if flag.choices and value not in flag.choices:
        raise InputError(f"args: {flag.name} {value!r}: accepted: {', '.join(flag.choices)}")
    convert = {"int": int, "float": float}.get(flag.type)
    if convert is not None:
        try:
            convert(value)
        except ValueError:
            raise InputError(
                f"args: {flag.name} takes {'an' if flag.type == 'int' else 'a'} {flag.type}, got {value!r}"
            ) from None
    if value.startswith("--"):
        raise InputError(f"args: {flag.name} needs a value, got the flag {value!r}")


def openrlhf_parse(args: list[str]) -> dict[str, list[str]]:
    """The user's flags and their values, checked against OpenRLHF's recorded argparse definitions: unknown flags
    (with the nearest accepted ones), abbreviations, repeated flags, missing, extra or mistyped values."""
    flags, version, _ = openrlhf_flags()
    given: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        item = args[i]
        if not item.startswith("--"):
            raise InputError(
                f"args: {item[:80]!r} follows no flag: OpenRLHF's train_ppo_ray takes --flag [value] pairs only"
            )
        name, eq, inline = item.partition("=")
        flag = flags.get(name)
        if flag is None:
            near = difflib.get_close_matches(name[:100], list(flags), n=3, cutoff=0.6)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise InputError(f"args: {name[:80]!r} is not a flag of OpenRLHF {version}'s train_ppo_ray{hint}")
        if name in given:
            raise InputError(f"args: {name} is given twice")
        if eq:
            values = [inline]
            i += 1
        elif flag.nargs == "*":
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            values, i = list(args[i + 1 : j]), j
        else:
            count = int(flag.nargs)
            values = list(args[i + 1 : i + 1 + count])
            if len(values) < count:
                raise InputError(f"args: {name} takes {count} value(s), got {len(values)}")
            i += 1 + count
        if flag.nargs == "0" and values:
            raise InputError(f"args: {name} is a switch and takes no value")
        if flag.nargs not in ("0", "*") and len(values) != int(flag.nargs):
            raise InputError(f"args: {name} takes {flag.nargs} value(s), got {len(values)}")
        for value in values:
            _check_value(flag, value)
        given[name] = values
    return given


def render_openrlhf(args: list[str], nnodes: int, gpus_per_node: int) -> Rendered:
    """python -m openrlhf.cli.train_ppo_ray with every model colocated on the job's nnodes x gpus_per_node GPUs,
    GRPO's defaults (group_norm, 8 samples per prompt), the user's flags and TensorBoard in the job folder."""
    given = openrlhf_parse(args)
    _, version, commit = openrlhf_flags()
    for name in OPENRLHF_RESERVED:
        if name in given:
            raise InputError(
                f"args: {name} is set by the template (every model colocated on the job's nnodes x gpus_per_node "
                "GPUs, TensorBoard in the job folder); set nnodes and gpus_per_node instead"
            )
    for name, what in (("--pretrain", "the policy model"), ("--prompt_data", "the prompts")):
        if name not in given:
            raise InputError(f"args: OpenRLHF needs {name} ({what}); give it, e.g. [{name!r}, 'PATH OR HUB NAME']")
    if "--remote_rm_url" not in given and "--reward_pretrain" not in given:
        raise InputError("args: OpenRLHF needs a reward: --remote_rm_url (a function or server) or --reward_pretrain")
    estimator = (given.get("--advantage_estimator") or [OPENRLHF_DEFAULTS[0][1]])[0]
    samples = int((given.get("--n_samples_per_prompt") or [OPENRLHF_DEFAULTS[1][1]])[0])
    if estimator in GROUPED and samples < 2:
        raise InputError(f"args: {estimator} compares responses within a group: --n_samples_per_prompt must be >= 2")
    tp = int((given.get("--vllm_tensor_parallel_size") or ["1"])[0])
    total = nnodes * gpus_per_node
    if tp < 1 or total % tp:
        raise InputError(
            f"args: --vllm_tensor_parallel_size {tp} does not divide the job's {total} GPU(s) (colocated vLLM "
            "engines fill them exactly)"
        )
    placement = ["--actor_num_nodes", str(nnodes), "--actor_num_gpus_per_node", str(gpus_per_node)]
    placement += ["--ref_num_nodes", str(nnodes), "--ref_num_gpus_per_node", str(gpus_per_node)]
    if "--critic_pretrain" in given:
        placement += ["--critic_num_nodes", str(nnodes), "--critic_num_gpus_per_node", str(gpus_per_node)]
    if "--reward_pretrain" in given and "--remote_rm_url" not in given:
        placement += ["--reward_num_nodes", str(nnodes), "--reward_num_gpus_per_node", str(gpus_per_node)]
    placement += ["--colocate_all_models", "--vllm_num_engines", str(total // tp)]
    defaults = [part for name, value in OPENRLHF_DEFAULTS if name not in given for part in (name, value)]
    logger = ["--use_tensorboard", f"{JOB_DIR_PLACEHOLDER}/{OPENRLHF_TB}"]
    rendered = [*placement, *defaults, *args, *logger]
    openrlhf_parse(rendered)  # what the template adds obeys the same definitions
    try:
        installed = importlib.metadata.version("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is None:
        here = "it is not installed here (it does not install without CUDA)"
    elif installed == version:
        here = f"the release installed here, {installed}"
    else:
        here = f"the one installed here is {installed}: its flags may differ"
    return Rendered(
        module=OPENRLHF_MODULE,
        args=rendered,
        env={},
        run_source=run_source("tensorboard", OPENRLHF_TB),
        validated=(
            f"validated against OpenRLHF {version}'s train_ppo_ray argparse flags (recorded from its source, "
            f"commit {commit[:12]}; {here})"
        ),
        notes=[
            f"OpenRLHF's driver places actor, reference, reward/critic and {total // tp} vLLM engine(s) on the "
            f"job's {total} GPU(s) (--colocate_all_models); TensorBoard events go to {OPENRLHF_TB}/ in the job folder"
        ],
    )


# ---- the registry -------------------------------------------------------------------------------------------------
VERL_GRPO = Framework(
    name="verl-grpo",
    framework="verl",
    module=VERL_MODULE,
    backends=("local", "ray"),
    multi_node=("ray",),
    refusals={
        "slurm": "verl needs a Ray cluster across the job's nodes, which this backend does not start",
        "kubernetes": "verl needs a Ray cluster across the pods (KubeRay), which this backend does not create",
        "skypilot": "verl needs a Ray cluster on the task's nodes, which this template does not start",
    },
    description=(
        "verl's GRPO: python -m verl.trainer.main_ppo with algorithm.adv_estimator=grpo, rollout.n=5 (args: hydra "
        "overrides, e.g. data.train_files=..., actor_rollout_ref.model.path=...), trainer.nnodes and "
        "trainer.n_gpus_per_node from nnodes and gpus_per_node (GPUs required), the file logger in the job folder "
        "(read by the verl reader). The plan composes the overrides with the installed verl's shipped ppo_trainer "
        "config: unknown keys fail. Backends: local (1 node), ray."
    ),
    metrics=("critic/score/mean", "response_length/mean", "actor/entropy", "actor/kl_loss", "timing_s/step"),
    render=render_verl,
)

OPENRLHF_GRPO = Framework(
    name="openrlhf-grpo",
    framework="openrlhf",
    module=OPENRLHF_MODULE,
    backends=("ray",),
    multi_node=("ray",),
    refusals={
        "local": "OpenRLHF's train_ppo_ray is a Ray driver: it needs a Ray cluster (the ray backend)",
        "slurm": "OpenRLHF's train_ppo_ray is a Ray driver: run it on a Ray cluster (the ray backend)",
        "kubernetes": "OpenRLHF's train_ppo_ray is a Ray driver: run it on a Ray cluster (the ray backend)",
        "skypilot": "OpenRLHF's train_ppo_ray is a Ray driver: run it on a Ray cluster (the ray backend)",
    },
    description=(
        "OpenRLHF's GRPO: python -m openrlhf.cli.train_ppo_ray (a Ray driver) with --advantage_estimator "
        "group_norm, every model and the vLLM engines colocated on nnodes x gpus_per_node GPUs (required), "
        "TensorBoard in the job folder (read by the tensorboard reader). args: its flags (--pretrain, "
        "--prompt_data and a reward are needed), checked against its recorded argparse flags. Backend: ray."
    ),
    metrics=("train/reward", "train/response_length", "train/kl", "train/policy_loss"),
    render=render_openrlhf,
)

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (VERL_GRPO, OPENRLHF_GRPO)}


def for_spec(spec: Any) -> Rendered | None:
    """The rendered template of a training spec (servers/launch/training.py's TrainingJobSpec) whose recipe is a
    framework's, or None for any other recipe or script."""
    if spec.recipe not in FRAMEWORKS:
        return None
    if spec.script is not None:
        raise InputError(f"give exactly one of recipe or script: {spec.recipe} runs the framework's own entry point")
    if spec.max_restarts:
        raise InputError(
            f"max_restarts: {spec.max_restarts}; accepted: 0 for {spec.recipe} (restarts in place are torchrun's; "
            "the framework resumes from its own checkpoints)"
        )
    if spec.nproc_per_node not in (None, 1):
        raise InputError(
            f"nproc_per_node: {spec.nproc_per_node}; accepted: 1 for {spec.recipe} (one driver; the framework "
            "starts a worker per GPU: set gpus_per_node)"
        )
    rendered = render(
        spec.recipe, list(spec.args), backend=spec.backend, nnodes=spec.nnodes, gpus_per_node=spec.gpus_per_node
    )
    return dataclasses.replace(rendered, gpus_per_node=int(spec.gpus_per_node))


def render(name: str, args: list[str], *, backend: str, nnodes: int, gpus_per_node: int | None) -> Rendered:
    """Template `name` for `backend`: InputError where the framework does not run there or the spec lacks GPUs;
    the rendered command otherwise, validated (the framework's own error text where it refuses)."""
    template = FRAMEWORKS[name]
    if backend not in template.backends:
        why = template.refusals.get(backend, "not one it runs on")
        raise InputError(
            f"backend: {template.framework} does not run on the {backend} backend here ({why}); accepted: "
            f"{', '.join(template.backends)}"
        )
    if nnodes > 1 and backend not in template.multi_node:
        raise InputError(
            f"nnodes: {nnodes}; {template.framework} runs on 1 node on the {backend} backend (more nodes: "
            f"{', '.join(template.multi_node)})"
        )
    if not gpus_per_node:
        raise InputError(
            f"gpus_per_node: {template.framework} trains on GPUs; give gpus_per_node (>= 1), the GPUs of each of "
            "the job's nodes"
        )
    if len(args) > MAX_ARGS:
        raise InputError(f"args: at most {MAX_ARGS}")
    return template.render(list(args), nnodes, gpus_per_node)
