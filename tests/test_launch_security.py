"""The launch server's defences, each tried as the attack that found it (issue 9): torchrun's rendezvous store is
unreachable from the host, a job given no GPUs sees none, the agent cannot approve its own costly launch, default
roots never cover '/' or the home directory, scripts never come from a Python installation, GPUs are admitted in
one transaction, the environment is an allow-list, the script runs apart from the engine's files, and logs are
capped and kept once."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mcp import Client

from servers.cli import claude_config, refuse_broad_roots
from servers.core.errors import InputError, QuotaError
from servers.core.jobs import JobEngine, JobKind
from servers.core.jobstore import JobState
from servers.core.mcp_layer import App
from servers.core.netns import probe
from servers.core.settings import Settings
from servers.launch.envpolicy import check_env, env_refusal
from servers.launch.local import ENTRY, LocalBackend
from servers.launch.training import TrainingJobSpec
from tests.conftest import CHILD_ENV
from tests.helpers import call_error as error
from tests.helpers import call_ok as ok
from tests.helpers import create_test_suite, finish_job

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "launch"
needs_netns = pytest.mark.skipif(not probe().available, reason=f"no network namespaces here: {probe().detail}")


def copy_fixture(tmp_path: Path, name: str) -> Path:
    target = tmp_path / "scripts" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / name, target)
    return target


@pytest.fixture
def pretend_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs as far as planning and admission go (the scripts still run on CPU)."""
    import servers.core.machine as machine

    monkeypatch.setattr(machine, "gpus_present", lambda: 2)


async def finish(client: Client, job_id: str, limit_s: float = 120) -> dict:
    return await finish_job(client, job_id, limit_s)


# ---- 1. the rendezvous store is reachable from no other machine ------------------------------------------------------
def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, read from /proc in the process's own namespace."""
    inodes = set()
    try:
        for fd in (Path("/proc") / str(pid) / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    found = []
    for table in ("tcp", "tcp6"):
        try:
            rows = (Path("/proc") / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                address, port = cols[1].split(":")
                found.append((address, int(port, 16)))
    return found


def _is_loopback_hex(address: str) -> bool:
    if len(address) == 8:  # IPv4, little-endian hex
        return bytes.fromhex(address)[::-1][0] == 127
    return address == "00000000000000000000000001000000"  # ::1


def _job_sockets(engine: JobEngine, job_id: str, limit_s: float = 90) -> tuple[list[int], list[tuple[str, int]]]:
    """The processes of a running training job and its listening sockets, once torchrun's store is up."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        record = engine.get(job_id)
        assert record.state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING), record.reason
        if record.worker_pid:
            pids = _group_pids(record.worker_pid)
            sockets = [s for pid in pids for s in _listening(pid)]
            ranks_up = (
                all(
                    "waiting" in (Path(record.job_dir) / "logs" / f"rank{r}.log").read_text(errors="replace")
                    for r in (0, 1)
                    if (Path(record.job_dir) / "logs" / f"rank{r}.log").exists()
                )
                and (Path(record.job_dir) / "logs" / "rank1.log").exists()
            )
            if sockets and ranks_up:
                return pids, sockets
        time.sleep(0.3)
    raise AssertionError("the job's ranks did not come up")


def _start_waiting_job(tmp_path: Path, network: str) -> tuple[JobEngine, str]:
    settings = Settings(home=tmp_path / "state", cancel_grace_s=2.0, allowed_roots=[tmp_path])
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    engine.register_kind(JobKind("train", ENTRY, "torchrun training", 120))
    spec = {
        "script": str(FIXTURES / "wait_go.py"),
        "args": [],
        "nproc_per_node": 2,
        "env": {"JOB_GO_FILE": str(tmp_path / "never")},
        "gpus": [],
        "network": network,
        "run_id": f"sec-{network}",
    }
    return engine, engine.submit("train", spec, timeout_s=120).id


@needs_netns
@pytest.mark.timeout(180)
def test_a_local_jobs_store_is_unreachable_from_the_host(tmp_path: Path) -> None:
    engine, job_id = _start_waiting_job(tmp_path, "isolated")
    try:
        pids, sockets = _job_sockets(engine, job_id)
        own = os.readlink("/proc/self/ns/net")
        # Every process of the job that listens (torchrun's agent and rendezvous stores, the ranks' stores) lives
        # in a network namespace of its own, whose only interface is its own loopback: none of its listening
        # sockets is in the host's namespace, so none is reachable on any address of this machine.
        listeners = [p for p in pids if _listening(p)]
        assert listeners and all(os.readlink(f"/proc/{p}/ns/net") != own for p in listeners)
        for _, port in sockets:
            # The attack: reach the store on the host's loopback to write a rendezvous pickle. Nothing answers.
            with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
                pass
    finally:
        engine.cancel(job_id)
    assert engine.get(job_id).state is JobState.CANCELLED


@pytest.mark.timeout(180)
def test_with_the_host_network_the_check_sees_the_exposed_store(tmp_path: Path) -> None:
    """The control: in the host's network torchrun's store listens on a non-loopback (wildcard) address, which
    the check above would catch; this is what LLM_INFRA_MCP_JOB_NETWORK=host accepts."""
    engine, job_id = _start_waiting_job(tmp_path, "host")
    try:
        pids, sockets = _job_sockets(engine, job_id)
        assert any(not _is_loopback_hex(address) for address, _ in sockets), sockets
        assert all(os.readlink(f"/proc/{p}/ns/net") == os.readlink("/proc/self/ns/net") for p in pids)
    finally:
        engine.cancel(job_id)


@needs_netns
def test_the_plan_says_where_the_sockets_live(settings: Settings) -> None:
    from servers.launch import training

    plan = training.plan(settings, TrainingJobSpec(recipe="tiny-gpt"), gpus_present=0, gpus_in_use=0)
    assert "private namespace" in plan.network and "'servers.core.sandbox'" in " ".join(plan.argv)
    assert plan.argv[plan.argv.index("--network") + 1] == "isolated"
    host = training.plan(
        settings.model_copy(update={"job_network": "host"}),
        TrainingJobSpec(recipe="tiny-gpt"),
        gpus_present=0,
        gpus_in_use=0,
    )
    assert "every interface" in host.network and any("every interface" in w for w in host.warnings)
    assert host.argv[host.argv.index("--network") + 1] == "host"  # still sandboxed, in the host's network
    unsandboxed = training.plan(
        settings.model_copy(update={"job_sandbox": "off"}),
        TrainingJobSpec(recipe="tiny-gpt"),
        gpus_present=0,
        gpus_in_use=0,
    )
    assert "'servers.core.netns'" in " ".join(unsandboxed.argv)  # the network namespace alone


def test_without_namespaces_an_isolated_plan_is_refused_and_says_what_to_set(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servers.core import netns
    from servers.launch import training

    monkeypatch.setattr(netns, "probe", lambda: netns.Probe(False, "unshare(CLONE_NEWUSER|CLONE_NEWNET) failed: EPERM"))
    unsandboxed = settings.model_copy(update={"job_sandbox": "off"})  # with the sandbox on, its own probe decides
    with pytest.raises(InputError, match="LLM_INFRA_MCP_JOB_NETWORK=host") as caught:
        training.plan(unsandboxed, TrainingJobSpec(recipe="tiny-gpt"), gpus_present=0, gpus_in_use=0)
    assert "EPERM" in str(caught.value)


# ---- 2. no GPUs given, none seen; 11. workdir; 5. the script's files are not the engine's --------------------------
@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_a_job_given_no_gpus_sees_none_and_runs_apart_from_the_engines_files(
    app: App, tmp_path: Path, pretend_gpus: None
) -> None:
    script = copy_fixture(tmp_path, "show_env.py")
    out = tmp_path / "seen.json"
    spec = {"script": str(script), "nproc_per_node": 1, "gpus_per_node": 0, "env": {"JOB_SHOW_ENV_OUT": str(out)}}
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": spec})
        assert plan["gpus"] == 0 and plan["estimated_gpu_hours"] == 0 and plan["env"]["CUDA_VISIBLE_DEVICES"] == ""
        job = await ok(client, "submit_training_job", {"spec": spec, "wait_s": 0})
        done = await finish(client, job["job_id"])
        assert done["state"] == "SUCCEEDED", done["reason"]
        seen = json.loads(out.read_text())
        assert seen["cuda_visible_devices"] == ""
        job_dir = Path(app.engine.get(job["job_id"]).job_dir)
        assert seen["cwd"] == str(job_dir / "run")
        # The files it wrote where it runs are not the engine's: the job's view is intact.
        assert json.loads((job_dir / "run" / "exit.json").read_text()) == {"state": "BOGUS"}
        assert (await ok(client, "list_jobs", {}))["total"] == 1

        workdir = tmp_path / "wd"
        workdir.mkdir()
        spec2 = {**spec, "workdir": str(workdir), "name": "in-workdir"}
        job = await ok(client, "submit_training_job", {"spec": spec2, "wait_s": 0})
        done = await finish(client, job["job_id"])
        assert done["state"] == "SUCCEEDED", done["reason"]
        assert json.loads(out.read_text())["cwd"] == str(workdir)


# ---- 3. the agent cannot approve its own costly launch --------------------------------------------------------------
COSTLY = {"recipe": "tiny-gpt", "args": ["--steps", "3"], "nproc_per_node": 2, "gpus_per_node": 2, "max_wall_s": 3600}


def approve_cli(home: Path, plan_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CHILD_ENV, "LLM_INFRA_MCP_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "servers.cli", "approve", plan_id, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # no controlling terminal: the CLI cannot ask
    )


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_a_plan_token_alone_does_not_approve_a_costly_launch(app: App, pretend_gpus: None) -> None:
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": COSTLY})
        assert plan["needs_confirmation"] and plan["estimated_gpu_hours"] == pytest.approx(2.0)
        text = await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        assert f"llm-infra-mcp approve {plan['plan_id']}" in text and "cannot approve" in text
        assert (await ok(client, "list_jobs", {}))["total"] == 0

        refused = approve_cli(app.settings.home, plan["plan_id"])  # no terminal, no --yes: nothing approved
        assert refused.returncode == 2 and "no terminal" in refused.stdout
        assert "approve" in await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        listed = approve_cli(app.settings.home, "")
        assert plan["plan_id"] in listed.stdout

        approved = approve_cli(app.settings.home, plan["plan_id"], "--yes")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert "tiny-gpt" in approved.stdout and "estimated_gpu_hours: 2.0" in approved.stdout
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        # One approval, one launch: the same token again needs the person again.
        again = await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})
        assert "llm-infra-mcp approve" in again
        await ok(client, "cancel_job", {"job_id": job["job_id"]})
    audit = [json.loads(line) for line in (app.settings.home / "audit.jsonl").read_text().splitlines()]
    confirms = [e for e in audit if e["event"] == "confirm"]
    assert [e["how"] for e in confirms] == ["approved by the person (llm-infra-mcp approve)"]


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_an_auto_approve_ceiling_lets_the_token_through_below_it(settings: Settings, pretend_gpus: None) -> None:
    app = App(settings.model_copy(update={"auto_approve_gpu_hours": 2.5}), owner="test", child_env=CHILD_ENV)
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await ok(client, "plan_training_job", {"spec": COSTLY})
        job = await ok(client, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        await ok(client, "cancel_job", {"job_id": job["job_id"]})
        above = {**COSTLY, "max_wall_s": 3 * 3600}
        plan = await ok(client, "plan_training_job", {"spec": above})
        assert "llm-infra-mcp approve" in await error(client, "submit_training_job", {"plan_token": plan["plan_token"]})


# ---- 4. default roots, scripts from a Python installation, config claude --------------------------------------------
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_started_in_root_the_server_reads_nothing_outside_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_INFRA_MCP_ALLOWED_ROOTS", raising=False)
    monkeypatch.chdir("/")
    settings = Settings(home=tmp_path / "state")
    assert settings.roots() == [settings.home]
    monkeypatch.chdir(Path.home())
    assert settings.roots() == [settings.home]
    app = App(settings, owner="test", child_env=CHILD_ENV)
    secret = "/etc/shadow" if Path("/etc/shadow").exists() else "/etc/passwd"
    async with Client(create_test_suite(app), mode="legacy") as client:
        assert "outside the allowed roots" in await error(client, "scan_kernel_log", {"path": secret})
        spec = {"script": str(Path(json.__file__).with_name("base64.py")), "args": ["-e", secret]}
        assert "outside the allowed roots" in await error(client, "plan_training_job", {"spec": spec})


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_script_from_a_python_installation_is_refused(tmp_path: Path) -> None:
    import base64
    import site

    settings = Settings(home=tmp_path / "state", allowed_roots=[Path("/")])  # even with '/' allowed on purpose
    app = App(settings, owner="test", child_env=CHILD_ENV)
    venv_script = Path(sys.prefix) / "bin" / "x.py"
    candidates = [Path(base64.__file__), *(Path(p) / "pytest" / "__init__.py" for p in site.getsitepackages())]
    async with Client(create_test_suite(app), mode="legacy") as client:
        for script in [c for c in candidates if c.exists()][:2]:
            text = await error(client, "plan_training_job", {"spec": {"script": str(script)}})
            assert "may not come from an installed Python" in text, text
        if venv_script.parent.is_dir() and sys.prefix != sys.base_prefix:
            text = await error(client, "plan_training_job", {"spec": {"script": str(venv_script)}})
            assert "may not come from an installed Python" in text


def test_config_claude_states_the_roots(tmp_path: Path) -> None:
    config = claude_config(["suite"], [tmp_path])
    [entry] = config["mcpServers"].values()
    assert entry["env"]["LLM_INFRA_MCP_ALLOWED_ROOTS"] == str(tmp_path.resolve())
    default = next(iter(claude_config(["suite"])["mcpServers"].values()))
    roots = default["env"]["LLM_INFRA_MCP_ALLOWED_ROOTS"].split(os.pathsep)
    assert len(roots) == 2 and all(r not in ("/", str(Path.home())) for r in roots)
    assert refuse_broad_roots([Path("/")]) and refuse_broad_roots([Path.home()]) and not refuse_broad_roots([tmp_path])


# ---- 6. GPUs admitted in one transaction ---------------------------------------------------------------------------
@pytest.mark.timeout(240)
def test_concurrent_submits_never_share_a_gpu(settings: Settings, tmp_path: Path, pretend_gpus: None) -> None:
    from servers.launch import server as launch
    from servers.launch import training

    app = App(settings.model_copy(update={"max_concurrent_jobs": 8}), owner="test", child_env=CHILD_ENV)
    for kind in launch.JOB_KINDS:
        app.add_job_kind(kind)
    spec = TrainingJobSpec(
        script=str(copy_fixture(tmp_path, "wait_go.py")),
        nproc_per_node=1,
        gpus_per_node=1,
        env={"JOB_GO_FILE": str(tmp_path / "never")},
        max_wall_s=120,
    )
    plan = training.plan(app.settings, spec, gpus_present=2, gpus_in_use=0)
    started: list[str] = []
    refused: list[str] = []
    barrier = threading.Barrier(5)

    def submit() -> None:
        barrier.wait()
        try:
            started.append(launch.start_training(app, plan, spec).id)
        except QuotaError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=submit) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert len(started) == 2 and len(refused) == 3, (started, refused)
        gpus = sorted(g for job_id in started for g in app.engine.get(job_id).spec["gpus"])
        assert gpus == [0, 1]
        assert all("free" in text for text in refused)
    finally:
        for job_id in started:
            app.engine.cancel(job_id)


# ---- 12. the environment is an allow-list ---------------------------------------------------------------------------
REFUSED_ENV = [
    "LD_PRELOAD",
    "LD_PRELOAD\n",
    "GCONV_PATH",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONPYCACHEPREFIX",
    "PYTHONPLATLIBDIR",
    "HOME",
    "BROWSER",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "PET_NO_PYTHON",
    "PET_STANDALONE",
    "PET_RDZV_CONF",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "TORCH_EXTENSIONS_DIR",
    "TORCHELASTIC_RESTART_COUNT",
    "PATH",
    "PYTHONPATH",
    "ld_preload",
]
ALLOWED_ENV = [
    "NCCL_DEBUG",
    "NCCL_ALGO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
    "JOB_LR",
    "CUDA_LAUNCH_BLOCKING",
]


@pytest.mark.parametrize("name", REFUSED_ENV)
def test_environment_outside_the_allow_list_is_refused(name: str) -> None:
    assert env_refusal(name) is not None
    with pytest.raises(InputError, match="accepted: NCCL_"):
        check_env({name: "x"})


def test_environment_on_the_allow_list_is_accepted() -> None:
    check_env({name: "1" for name in ALLOWED_ENV})


# ---- 13. logs capped and kept once ---------------------------------------------------------------------------------
def _disk_bytes(folder: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


@pytest.mark.timeout(240)
def test_rank_output_is_capped_and_kept_once(tmp_path: Path) -> None:
    from servers.core.jobfiles import JobContext, JobFiles
    from servers.launch.local import run_training_job

    def run(name: str, mib: float, cap: int) -> tuple[JobContext, dict]:
        ctx = JobContext(f"train-{name}", "train", JobFiles(tmp_path / name))
        ctx.files.dir.mkdir(parents=True)
        spec = {
            "script": str(FIXTURES / "chatty.py"),
            "args": [],
            "nproc_per_node": 2,
            "env": {"JOB_CHATTY_MIB": str(mib)},
            "gpus": [],
            "network": "host",
            "run_id": name,
            "max_log_bytes": cap,
        }
        return ctx, run_training_job(spec, ctx)

    mib = 1024 * 1024
    ctx, result = run("uncapped", 6, 256 * mib)
    logs = sum(ctx.files.log(f"rank{r}").stat().st_size for r in (0, 1))
    assert logs > 12 * mib and result["logs_cut"] == []
    assert _disk_bytes(ctx.files.dir) < logs * 1.15  # one copy (torchrun's files keep only their last 64 KiB)
    assert "finished after" in ctx.files.log("rank1").read_text()

    ctx, result = run("capped", 6, 2 * mib)
    sizes = [ctx.files.log(f"rank{r}").stat().st_size for r in (0, 1)]
    assert sum(sizes) <= 2 * mib + 2048 and result["logs_cut"] and result["log_bytes_dropped"] > 9 * mib
    assert _disk_bytes(ctx.files.dir) < 3 * mib
    cut = result["logs_cut"][0]
    assert "log cut here" in ctx.files.log(cut).read_text()[-400:]
    assert json.loads(ctx.files.log(cut).with_suffix(".cut").read_text())["cap_bytes"] == 2 * mib
    # read_job_logs says so.
    from servers.core.jobstore import JobRecord
    from servers.core.jobview import read_log_chunk

    record = JobRecord(
        id="train-capped",
        kind="training",
        spec={},
        state=JobState.SUCCEEDED,
        created_at=0,
        timeout_s=60,
        owner="test",
        job_dir=str(ctx.files.dir),
    )
    chunk = read_log_chunk(record, cut, 0, 1024)
    assert chunk.cut_at_bytes == ctx.files.log(cut).stat().st_size
    assert read_log_chunk(record, "torchrun", 0, 1024).cut_at_bytes is None


def test_local_backend_plans_are_the_same_in_server_and_worker(tmp_path: Path) -> None:
    spec = {"script": str(FIXTURES / "echo_args.py"), "args": [], "nproc_per_node": 1, "gpus": [], "run_id": "r"}
    assert LocalBackend().plan(spec, job_dir=tmp_path).cwd == str(tmp_path / "run")


# ---- 1. the same for the benchmarks whose ranks meet through a torch.distributed store -------------------------------
@needs_netns
@pytest.mark.timeout(120)
@pytest.mark.parametrize("network", ["isolated", "host"])
def test_distributed_job_kinds_run_in_a_namespace_of_their_own(tmp_path: Path, network: str) -> None:
    from tests.jobkinds import TEST_KINDS

    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path], job_network=network)
    engine = JobEngine(settings, owner="test", child_env=CHILD_ENV)
    for kind in TEST_KINDS:
        engine.register_kind(kind)
    job_id = engine.submit("test_network", {}).id
    deadline = time.monotonic() + 60
    while not engine.get(job_id).state.terminal and time.monotonic() < deadline:
        time.sleep(0.2)
    record = engine.get(job_id)
    assert record.state is JobState.SUCCEEDED, record.reason
    seen = json.loads((Path(record.job_dir) / "result.json").read_text())
    own = os.readlink("/proc/self/ns/net")
    if network == "isolated":
        assert seen["netns"] != own and seen["interfaces"] == ["lo"]
    else:
        assert seen["netns"] == own


def test_the_overlap_benchmarks_that_start_ranks_are_isolated() -> None:
    from servers.overlap.server import JOB_KINDS

    kinds = {k.name: k.isolated_network for k in JOB_KINDS}
    assert kinds == {
        "gemm_benchmark": False,  # one process, no sockets
        "collective_benchmark": True,
        "overlap_benchmark": True,
        "overlap_tune": True,
    }


RACE_SIGNER = """
import sys
from pathlib import Path
from servers.core.settings import Settings
from servers.launch.training import sign
barrier = Path(sys.argv[2])
while not barrier.exists():
    pass
print(sign(Settings(home=Path(sys.argv[1])), "plan", {"who": sys.argv[3]}))
"""


@pytest.mark.timeout(120)
def test_processes_racing_to_make_the_signing_key_agree_on_one(tmp_path: Path) -> None:
    """A study starts several servers on a fresh state directory at once: each may make the signing key. Eight
    processes released together all sign with the one key that was linked first, so every token verifies in this
    process (CI saw 'plan_token is not valid here' and FileExistsError from the old create-then-write)."""
    from servers.launch.training import key_file, unsign

    home, barrier = tmp_path / "state", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_SIGNER, str(home), str(barrier), str(i)],
            cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    time.sleep(1.0)  # every interpreter is up and spinning on the barrier
    barrier.touch()
    settings = Settings(home=home)
    for i, proc in enumerate(procs):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert unsign(settings, "plan", out.strip(), name="t", remedy="-") == {"who": str(i)}
    key = key_file(settings)
    assert len(key.read_bytes()) == 32 and key.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in home.iterdir() if p.name.startswith(".launch-key-")] == []
