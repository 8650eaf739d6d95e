"""torchrun.py's one rank-log mirror, in process (no torchrun): the layout it reads, whole lines while the job runs,
the restart marker, the cap shared by every log written through it, links never followed, and slurm.py's node
mirror, which names a local rank's log after its global rank through the same code."""

import json
from pathlib import Path

from servers.launch.slurm import NodeRankMirror
from servers.launch.torchrun import LOG_DIR_NAME, RankLogMirror, attempt_dirs


def rank_file(log_dir: Path, attempt: int, rank: int, stream: str = "stdout.log") -> Path:
    folder = log_dir / "run_ab12" / f"attempt_{attempt}" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / stream


def setup(tmp_path: Path) -> tuple[Path, Path]:
    log_dir = tmp_path / "job" / LOG_DIR_NAME
    logs = tmp_path / "job" / "logs"
    log_dir.mkdir(parents=True)
    logs.mkdir()
    return log_dir, logs


def test_whole_lines_while_running_everything_at_the_end_and_a_marker_per_restart(tmp_path: Path) -> None:
    log_dir, logs = setup(tmp_path)
    mirror = RankLogMirror(log_dir, lambda p: logs / f"{p}.log")
    rank_file(log_dir, 0, 0).write_text("one\ntw")
    rank_file(log_dir, 0, 1, "stderr.log").write_text("")
    mirror.sync()
    assert (logs / "rank0.log").read_text() == "one\n"  # "tw" is still being written
    assert (logs / "rank1.log").read_text() == ""  # a silent rank has its (empty) log
    with rank_file(log_dir, 0, 0).open("a") as f:
        f.write("o\n")
    rank_file(log_dir, 1, 0).write_text("again\nlast")
    mirror.sync(final=True)
    assert (logs / "rank0.log").read_text() == "one\ntwo\n----- torchrun restart 1 (attempt_1) -----\nagain\nlast"
    assert [a for a, _ in attempt_dirs(log_dir)] == [0, 1]
    assert mirror.cut == set() and mirror.dropped == 0


def test_the_cap_holds_every_log_written_through_the_mirror(tmp_path: Path) -> None:
    log_dir, logs = setup(tmp_path)
    mirror = RankLogMirror(log_dir, lambda p: logs / f"{p}.log", cap_bytes=100)
    mirror.write("torchrun", b"x" * 59 + b"\n")  # the command's own output counts too (the Ray wrapper's)
    rank_file(log_dir, 0, 0).write_text("".join(f"line {i:03}\n" for i in range(20)))
    mirror.sync(final=True)
    text = (logs / "rank0.log").read_text()
    kept = text[: text.index("\n----- llm-infra-mcp: log cut here")]
    assert kept == "".join(f"line {i:03}\n" for i in range(4))  # 60 + 4 * 9 bytes: whole lines within 100
    assert mirror.cut == {"rank0"} and mirror.dropped == 20 * 9 - 36
    assert json.loads((logs / "rank0.cut").read_text()) == {"cut_at_bytes": len(text), "cap_bytes": 100}
    mirror.write("rank0", b"more\n")
    assert (logs / "rank0.log").read_text() == text and mirror.dropped == 20 * 9 - 36 + 5


def test_links_below_the_log_folder_are_never_followed(tmp_path: Path) -> None:
    log_dir, logs = setup(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("SECRET\n")
    rank_file(log_dir, 0, 0).symlink_to(secret)
    (log_dir / "run_ab12" / "attempt_1").symlink_to(tmp_path)  # a whole attempt folder as a link
    outside = tmp_path / "elsewhere" / "0"
    outside.mkdir(parents=True)
    (outside / "stdout.log").write_text("SECRET too\n")
    (log_dir / "run_ab12" / "attempt_0" / "1").symlink_to(outside)
    mirror = RankLogMirror(log_dir, lambda p: logs / f"{p}.log")
    mirror.sync(final=True)
    assert [a for a, _ in attempt_dirs(log_dir)] == [0]
    assert (logs / "rank0.log").read_text() == "" and not (logs / "rank1.log").exists()
    assert secret.read_text() == "SECRET\n"  # nothing punched in a file elsewhere


def test_a_node_names_each_local_rank_by_its_global_rank_once_known(tmp_path: Path) -> None:
    log_dir, logs = setup(tmp_path)
    mirror = NodeRankMirror(log_dir, lambda p: logs / f"{p}.log", node=1, nproc=2)
    rank_file(log_dir, 0, 0).write_text("local 0\n")
    rank_file(log_dir, 0, 1).write_text("local 1\n")
    mirror.sync()
    assert list(logs.iterdir()) == []  # the global ranks are not known yet: nothing copied
    mirror.ranks[(0, 0)] = 3
    mirror.sync()
    assert (logs / "rank3.log").read_text() == "local 0\n" and not (logs / "rank2.log").exists()
    mirror.sync(final=True)  # at the end, the unknown one is named from its attempt's other ranks
    assert (logs / "rank4.log").read_text() == "local 1\n"
