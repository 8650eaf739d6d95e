"""Issue 21, defect 1: what `llm-infra-mcp approve` shows is escaped and complete.

The attack: an agent plans a Kubernetes job (image evil.example/miner:latest, 64 nodes x 8 GPUs, 36,000 s: 5,120
GPU-hours) whose last argument carries terminal escapes (clear the screen, home the cursor, a fake plan text, a
scroll region, a cursor move). Printed raw, the person's terminal shows the fake plan ("tiny_gpt ... 0.167") above
the real prompt; `y` approves the real job. Each test below performs it and reads what the person would see.
"""

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from servers.cli import approve
from servers.core.db import connect
from servers.core.display import quoted, quoted_list, visible
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from servers.engines.admission import Approvals
from tests.conftest import CHILD_ENV
from tests.fixtures.k8s import goldens
from tests.helpers import call_ok, create_test_suite

ESC = "\x1b"
FAKE_PLAN = "Plan 0123456789abcdef:\n  recipe: tiny_gpt\n  gpus: 1\n  estimated_gpu_hours: 0.167\n"
PAYLOAD = f"--x{ESC}[2J{ESC}[H{FAKE_PLAN}{ESC}[12;13r{ESC}[12;1H"
# A script in the image (a bundled recipe's arguments are checked against its parser at plan time, which refuses
# this payload before any approval is asked: the attack goes through a script, whose arguments nobody can check).
ATTACK = {
    "script": "train.py",  # written into the test's root by the fixture below
    "backend": "kubernetes",
    "options": {"image": "evil.example/miner:latest"},
    "nnodes": 64,
    "nproc_per_node": 8,
    "gpus_per_node": 8,
    "max_wall_s": 36000,
    "env": {"JOB_NOTE": f"x{ESC}]0;title\x07\u202egpj.exe"},
    "args": ["--steps", "3", PAYLOAD],
}
# Characters a terminal acts on or hides rather than shows, by class (the brief's list).
HOSTILE_CHARS = (
    [chr(c) for c in range(0x20)]  # C0, ESC among them
    + ["\x7f"]  # DEL
    + [chr(c) for c in range(0x80, 0xA0)]  # C1, NEL (U+0085) and CSI (U+009B) among them
    + [chr(c) for c in range(0x202A, 0x202F)]  # bidi embeddings and overrides
    + [chr(c) for c in range(0x2066, 0x206A)]  # bidi isolates
    + ["\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\ufeff", "\u061c"]  # zero-width, marks
    + ["\u2028", "\u2029"]  # line and paragraph separators
)


def shown_badly(text: str) -> list[str]:
    """The characters of `text` (lines split at '\\n') that a terminal would act on or hide."""
    return sorted(
        {
            f"U+{ord(ch):04X}"
            for line in text.split("\n")
            for ch in line
            if not ch.isprintable() or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")
        }
    )


def assert_complete(text: str) -> None:
    """Every field that decides what runs and what it costs, in the fixed layout."""
    assert shown_badly(text) == [], shown_badly(text)
    for expected in (
        "backend: kubernetes",
        'image: "evil.example/miner:latest"',
        "nnodes: 64",
        "gpus_per_node: 8",
        "total_gpus: 512",
        "max_wall_s: 36,000 s (10.0 h)",
        "estimated_gpu_hours: 5,120.0",
        "estimated_node_hours: 640.0",
        "env names: JOB_NOTE",
        'JOB_NOTE="x\\x1b]0;title\\x07\\u202egpj.exe"',
        "pip_packages: (none)",
        "workdir: (none)",
        'namespace: "ml"',
        '"torchrun"',
        'train.py"',
        '"--x\\x1b[2J\\x1b[HPlan 0123456789abcdef:\\n  recipe: tiny_gpt\\n',  # the payload, one quoted line
    ):
        assert expected in text, (expected, text)


@pytest.fixture(autouse=True)
def attack_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack's script, inside the allowed root (tmp_path)."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    monkeypatch.setitem(ATTACK, "script", str(script))


@pytest.fixture
def k8s_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("KUBECONFIG", str(goldens.KUBECONFIG))  # plans offline: the kubeconfig of the goldens
    monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(home))  # what `approve` reads


async def plan_attack(settings: Settings, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's side: plan_training_job records the plan as waiting for the person."""
    app = App(settings, owner="test", child_env=CHILD_ENV)
    async with Client(create_test_suite(app), mode="legacy") as client:
        plan = await call_ok(client, "plan_training_job", {"spec": spec or ATTACK})
    assert plan["needs_confirmation"] and plan["estimated_gpu_hours"] == pytest.approx(5120)
    assert plan["estimated_node_hours"] == pytest.approx(640)
    return plan


def test_visible_escapes_every_character_a_terminal_acts_on() -> None:
    for ch in HOSTILE_CHARS:
        shown = visible(f"a{ch}b")
        assert shown.startswith("a\\") and shown.endswith("b") and ch not in shown, (hex(ord(ch)), shown)
        assert shown_badly(shown) == []
    assert visible("\x1b[2J") == "\\x1b[2J" and visible("\u202e") == "\\u202e" and visible("\x85") == "\\x85"
    assert visible("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert visible("\\x1b") == "\\\\x1b"  # a typed backslash cannot pass for an escape
    assert visible("\ud800") == "\\ud800" and visible("\U000e0001") == "\\U000e0001"  # a surrogate, a tag
    for text in ("plain text", "é 中文 😀", "--lr=3e-4", "$(PET_NNODES)"):
        assert visible(text) == text
    assert quoted('a "b"') == '"a \\"b\\""'
    assert quoted_list(["torchrun", "a b", ESC]) == '["torchrun", "a b", "\\x1b"]'


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_approve_in_process_shows_the_attack_escaped_and_the_real_cost(settings: Settings, k8s_env: None) -> None:
    plan = await plan_attack(settings)
    out = io.StringIO()
    assert approve(plan["plan_id"], yes=False, tty=io.StringIO("n\n"), out=out) == 1
    text = out.getvalue()
    assert ESC not in text and "\u202e" not in text
    assert_complete(text)
    # The fixed layout puts the cost last, and the prompt repeats it: the last line the person reads is ours.
    prompt = next(line for line in text.splitlines() if line.startswith("Approve "))
    assert "5,120.0 GPU-hours" in prompt and "640.0 node-hours" in prompt and "kubernetes" in prompt
    assert '"evil.example/miner:latest"' in prompt and "64 node(s) x 8 GPU(s) = 512 GPU(s)" in prompt
    assert text.index("estimated_gpu_hours") > text.index("--x\\x1b[2J")  # after the command, nearest the prompt
    assert Approvals(settings).get(plan["plan_id"])["approved_at"] is None  # "n": nothing approved

    out = io.StringIO()
    assert approve(plan["plan_id"], yes=False, tty=io.StringIO("y\n"), out=out) == 0
    assert "approved:" in out.getvalue() and shown_badly(out.getvalue()) == []
    assert Approvals(settings).get(plan["plan_id"])["approved_at"] is not None

    listed = io.StringIO()
    assert approve("", yes=False, out=listed) == 0
    assert plan["plan_id"] in listed.getvalue() and shown_badly(listed.getvalue()) == []
    assert "5,120.0 GPU-hours" in listed.getvalue() and "on kubernetes" in listed.getvalue()


def cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, **CHILD_ENV, "LLM_INFRA_MCP_HOME": str(home), "KUBECONFIG": str(goldens.KUBECONFIG)}


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_approve_as_a_subprocess_with_piped_stdin(settings: Settings, k8s_env: None) -> None:
    plan = await plan_attack(settings)
    argv = [sys.executable, "-m", "servers.cli", "approve", plan["plan_id"]]
    # stdin is not the terminal: a "y" piped in (by an agent) approves nothing, and what is shown is still escaped.
    piped = subprocess.run(
        argv,
        input="y\n",
        capture_output=True,
        text=True,
        env=cli_env(settings.home),
        timeout=60,
        start_new_session=True,  # no controlling terminal
    )
    assert piped.returncode == 2 and "no terminal" in piped.stdout, piped.stdout + piped.stderr
    assert ESC not in piped.stdout and ESC not in piped.stderr
    assert_complete(piped.stdout)
    assert Approvals(settings).get(plan["plan_id"])["approved_at"] is None
    listed = subprocess.run(argv[:-1], capture_output=True, text=True, env=cli_env(settings.home), timeout=60)
    assert plan["plan_id"] in listed.stdout and shown_badly(listed.stdout) == []

    yes = subprocess.run([*argv, "--yes"], capture_output=True, text=True, env=cli_env(settings.home), timeout=60)
    assert yes.returncode == 0 and "approving (--yes): up to 5,120.0 GPU-hours" in yes.stdout, yes.stdout
    assert_complete(yes.stdout)


def read_until(fd: int, marker: bytes, limit_s: float) -> bytes:
    got = b""
    deadline = time.monotonic() + limit_s
    while marker not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
    return got


@pytest.fixture
def terminal_child() -> Iterator[dict[str, Any]]:
    child: dict[str, Any] = {}
    yield child
    if child.get("pid"):
        with_exit = os.waitpid(child["pid"], os.WNOHANG)
        if with_exit == (0, 0):
            os.kill(child["pid"], 9)
            os.waitpid(child["pid"], 0)
        os.close(child["fd"])


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_approve_in_a_real_terminal(settings: Settings, k8s_env: None, terminal_child: dict[str, Any]) -> None:
    """The person's view: the CLI on a pseudo-terminal of its own (its /dev/tty), answering `y` at its prompt."""
    plan = await plan_attack(settings)
    argv = [sys.executable, "-m", "servers.cli", "approve", plan["plan_id"]]
    env = cli_env(settings.home)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.execve(sys.executable, argv, env)
    terminal_child.update(pid=pid, fd=fd)
    before = read_until(fd, b"[y/N] ", 60)
    os.write(fd, b"y\n")
    after = read_until(fd, b"within a day", 60)
    _, status = os.waitpid(pid, 0)
    terminal_child.clear()
    os.close(fd)
    screen = (before + after).decode().replace("\r\n", "\n")  # the terminal's own line ends
    assert os.waitstatus_to_exitcode(status) == 0, screen
    assert ESC.encode() not in before + after and shown_badly(screen) == [], shown_badly(screen)
    assert_complete(screen)
    assert "approved:" in screen and Approvals(settings).get(plan["plan_id"])["approved_at"] is not None


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_the_elicitation_message_is_escaped_and_complete(settings: Settings, k8s_env: None) -> None:
    from servers.launch.server import job_launch, make_plan
    from servers.launch.training import TrainingJobSpec

    app = App(settings, owner="test", child_env=CHILD_ENV)
    made = make_plan(app, TrainingJobSpec.model_validate(ATTACK), present=0, in_use=0)
    message = job_launch(made).message
    assert shown_badly(message) == [] and ESC not in message
    for expected in ("on kubernetes", "evil.example/miner:latest", "64 node(s)", "512 in all", "5,120 GPU-hours"):
        assert expected in message, (expected, message)
    assert "JOB_NOTE" in message and '"--x\\x1b[2J' in message


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_sweep_is_shown_complete_with_every_runs_args_escaped(settings: Settings, k8s_env: None) -> None:
    app = App(settings, owner="test", child_env=CHILD_ENV)
    base = {k: v for k, v in ATTACK.items() if k != "args"} | {"gpus_per_node": 4, "nproc_per_node": 4}
    async with Client(create_test_suite(app), mode="legacy") as client:
        swept = await call_ok(client, "plan_sweep", {"spec": base, "variants": [["--a"], [f"--b{ESC}[2J{ESC}[H"]]})
    assert swept["needs_confirmation"]
    out = io.StringIO()
    assert approve(swept["plan_id"], yes=False, tty=io.StringIO("\n"), out=out) == 1
    text = out.getvalue()
    assert shown_badly(text) == [] and "a sweep of 2 runs on kubernetes" in text
    assert 'run 1: ["--b\\x1b[2J\\x1b[H"]' in text
    assert "estimated_gpu_hours: 5,120.0 (all runs)" in text and "nnodes: 64" in text and "gpus_per_node: 4" in text
    assert 'image: "evil.example/miner:latest"' in text and "total_gpus: 512 (all runs at once)" in text


def test_a_summary_of_an_older_layout_is_shown_escaped(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(settings.home))
    old = {"recipe": "tiny-gpt", "command": f"torchrun {PAYLOAD}", f"k{ESC}[2J": "v", "estimated_gpu_hours": 2.0}
    Approvals(settings).request("00112233445566aa", old)
    out = io.StringIO()
    assert approve("00112233445566aa", yes=False, tty=io.StringIO("n\n"), out=out) == 1
    text = out.getvalue()
    assert shown_badly(text) == [] and ESC not in text and "older version" in text
    assert "up to 2.0 GPU-hours" in text and "k\\x1b[2J" in text
    listed = io.StringIO()
    approve("", yes=False, out=listed)
    assert "00112233445566aa  tiny-gpt  up to 2.0 GPU-hours" in listed.getvalue()
    # a broken record: said so, nothing approved
    Approvals(settings).request("00112233445566bb", {})
    with connect(settings.db_path) as conn:
        conn.execute("UPDATE launch_approvals SET summary = ? WHERE plan_id = ?", (json.dumps([1]), "00112233445566bb"))
    out = io.StringIO()
    assert approve("00112233445566bb", yes=True, out=out) == 2 and "cannot be read" in out.getvalue()
