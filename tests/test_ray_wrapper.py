"""The Ray job's entrypoint wrapper (servers/launch/ray_wrapper.py) without Ray: written into a job folder the way
submit writes it (with torchrun.py beside it), run as a script by an interpreter that sees no site-packages (as on a
Ray node without llm-infra-mcp) and no script folder on sys.path (python -P), around a fake torchrun that writes
per-rank files over two attempts. Checked: the rank logs (torchrun.py's one mirror: restart marker, whole lines, one
copy kept), the cap shared with the command's own output (cut marker, .cut records, the exit record's logs_cut),
files reached through links never copied, and the exit record."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servers.launch import torchrun
from servers.launch.ray_backend import EXIT_RECORD, WRAPPER_FILES, write_wrapper

HERE = Path(__file__).resolve().parents[1] / "servers" / "launch"

FAKE_TORCHRUN = """
import os, sys, time
log_dir, lines, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for attempt in (0, 1):
    for rank in (0, 1):
        folder = os.path.join(log_dir, "run_x1", f"attempt_{attempt}", str(rank))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "stdout.log"), "a") as f:
            for i in range(lines):
                f.write(f"attempt {attempt} rank {rank} line {i}\\n")
            if big and attempt == 0 and rank == 0:
                f.write(("x" * 1023 + "\\n") * big)
        with open(os.path.join(folder, "stderr.log"), "a") as f:
            f.write(f"err attempt {attempt} rank {rank}\\n")
    print(f"torchrun: attempt {attempt} ran", flush=True)
    time.sleep(0.7)  # the wrapper's mirror sees the attempt while the command runs
sys.exit(1)
"""


def run_wrapper(
    tmp_path: Path, *, lines: int = 5, big: int = 0, log_cap: int = 0, setup: object = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    job = tmp_path / "job"
    job.mkdir()
    wrapper = write_wrapper(job)
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    rank_logs = job / torchrun.LOG_DIR_NAME
    if callable(setup):
        setup(job, rank_logs)
    # -S: no site-packages (this package is not installed on the node); -P: no script folder on sys.path either.
    argv = [sys.executable, "-S", "-P", str(wrapper), "--job-dir", str(job), "--cwd", str(job / "run")]
    argv += ["--log-cap", str(log_cap), "--output", "torchrun", "--rank-logs", str(rank_logs)]
    argv += ["--", sys.executable, "-S", str(fake), str(rank_logs), str(lines), str(big)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    return done, job


def test_the_shipped_files_are_standard_library_only() -> None:
    """What runs on the Ray node imports, at module level, the standard library and the wrapper's sibling only."""
    assert set(WRAPPER_FILES.values()) == {"ray_wrapper.py", "torchrun.py"}
    for source in WRAPPER_FILES.values():
        tree = ast.parse((HERE / source).read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add((node.module or "").split(".")[0])
        assert names - set(sys.stdlib_module_names) <= {"torchrun"}, source


@pytest.mark.timeout(90)
def test_wrapper_mirrors_rank_logs_and_records_the_exit(tmp_path: Path) -> None:
    def plant_link(job: Path, rank_logs: Path) -> None:
        # A rank folder of a third rank whose stdout.log is a link to a file outside: never followed.
        (tmp_path / "secret.txt").write_text("SECRET outside the job\n")
        folder = rank_logs / "run_x1" / "attempt_0" / "2"
        folder.mkdir(parents=True)
        (folder / "stdout.log").symlink_to(tmp_path / "secret.txt")

    done, job = run_wrapper(tmp_path, big=2048, setup=plant_link)
    assert done.returncode == 1, done.stderr
    logs = job / "logs"
    rank0 = (logs / "rank0.log").read_text()
    # Attempt 0 then the restart marker then attempt 1, whole lines, stdout and stderr both.
    first, marker, second = rank0.partition("----- torchrun restart 1 (attempt_1) -----\n")
    assert marker and "attempt 0 rank 0 line 4\n" in first and "err attempt 0 rank 0\n" in first
    assert "attempt 1 rank 0 line 0\n" in second and "attempt 0" not in second
    assert first.count("x" * 1023 + "\n") == 2048
    assert "attempt 1 rank 1 line 4\n" in (logs / "rank1.log").read_text()
    assert "SECRET" not in (logs / "rank2.log").read_text()
    assert "torchrun: attempt 1 ran" in (logs / "torchrun.log").read_text() and "attempt 1 ran" in done.stdout
    record = json.loads((job / EXIT_RECORD).read_text())
    assert record["exit_code"] == 1 and record["signal"] is None and record["timed_out"] is False
    assert record["attempts"] == 2 and record["logs_cut"] == [] and record["log_bytes_dropped"] == 0
    assert record["cwd"] == str(job / "run")

    # One copy kept: the copied bytes of rank 0's big file were released, its last TAIL bytes kept.
    source = job / torchrun.LOG_DIR_NAME / "run_x1" / "attempt_0" / "0" / "stdout.log"
    probe = tmp_path / "probe"
    probe.write_bytes(b"\0" * (1 << 20))
    if not torchrun.punch_hole(probe, 0, 1 << 19):
        return  # this file system cannot punch holes: both copies stay, as the mirror says
    size = source.stat().st_size
    assert size > 2 << 20 and source.stat().st_blocks * 512 < size // 4
    assert source.read_bytes()[-torchrun.TAIL :].endswith(b"x" * 1023 + b"\n")


@pytest.mark.timeout(90)
def test_wrapper_caps_the_logs_together(tmp_path: Path) -> None:
    cap = 4096
    done, job = run_wrapper(tmp_path, lines=120, log_cap=cap)
    assert done.returncode == 1, done.stderr
    logs = job / "logs"
    record = json.loads((job / EXIT_RECORD).read_text())
    cut = record["logs_cut"]
    assert cut and set(cut) <= {"rank0", "rank1", "torchrun"} and record["log_bytes_dropped"] > 0
    note = "log cut here: the job's logs reached 4096 bytes (LLM_INFRA_MCP_MAX_LOG_BYTES_PER_JOB)"
    sizes = {p.stem: p.stat().st_size for p in logs.glob("*.log")}
    notes = 0
    for process in cut:
        text = (logs / f"{process}.log").read_text()
        assert note in text and text.count("log cut here") == 1
        notes += len(text) - text.index("\n----- llm-infra-mcp: log cut here")
        cut_record = json.loads((logs / f"{process}.cut").read_text())
        assert cut_record == {"cut_at_bytes": sizes[process], "cap_bytes": cap}
    assert sum(sizes.values()) - notes <= cap
    assert sorted(p.stem for p in logs.glob("*.cut")) == cut
    for process in set(sizes) - set(cut):
        assert "log cut here" not in (logs / f"{process}.log").read_text()


@pytest.mark.timeout(60)
def test_wrapper_runs_nothing_once_cancelled(tmp_path: Path) -> None:
    def cancel(job: Path, _rank_logs: Path) -> None:
        (job / "ray_cancel.json").write_text("{}")

    done, job = run_wrapper(tmp_path, setup=cancel)
    assert done.returncode == 125, done.stderr
    assert not (job / torchrun.LOG_DIR_NAME / "run_x1").exists()
    record = json.loads((job / EXIT_RECORD).read_text())
    assert record["cancelled_before_start"] is True and record["attempts"] == 0
    assert "cancelled before it started" in (job / "logs" / "torchrun.log").read_text()
