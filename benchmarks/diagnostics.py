"""Kernel-log scan: throughput and memory of servers.diagnostics.kmsg.scan_file on a generated 1 GiB log.

What is generated (once per run, into a temporary directory or --path; deleted afterwards unless --keep): a kernel
log of --size-mb MiB with [uptime] prefixes, mostly ordinary kernel lines of ~20 shapes (audit, netdev, mlx5, ext4,
nvme, OOM, hung task, non-NCCL segfaults...), with a few thousand GPU lines of every shape the scanner knows spread
through it (Xid with and without "PCI:", pid=<unknown> and no pid/name, NVLink5 149, Xid 154, Xid 45 bursts, NVSwitch
SXid with their Severity/Data lines, NCCL segfaults, one- and three-line fallen-off-the-bus, GPU-at-PCI maps,
rate-limit notices) and three reboots. It is written from pre-built 1 MiB blocks whose uptime seconds are filled in
with one bytes.replace per block, so generation runs at disk speed. A second log of a tenth of the size (at least
32 MiB) is generated the same way for the memory comparison, with as many GPU lines as the big one (ten times as
dense), so that the two differ in size only: the event list (capped at max_events, 5,000) is the one thing whose
memory grows with the number of GPU lines, and it is held equal here.

What is measured:
- scan throughput: scan_file on the big log in this process, tracemalloc off, best of --repeat (MiB/s, MiB = 2^20 B);
- the same for ``grep -c 'NVRM: Xid'`` (LC_ALL=C, a subprocess, timed the same way) and the ratio of the two;
- peak memory: each log is scanned in a fresh child process; after the import the child resets its peak-RSS mark
  (/proc/self/clear_refs; where that is not possible, getrusage ru_maxrss is used as is), so its VmHWM after the
  scan is the peak during the scan; that peak and its growth over the RSS at the start are compared between the small
  and the big log.

Pass criteria: throughput >= 100 MiB/s, and at least half of grep's; the big log's peak RSS is within max(16 MiB,
10%) of the small log's (memory independent of size); the scan's exact counts (``counts``) equal what was generated
(and its Xid-line count equals grep's), and so do its summary rows whenever the result lists them all.
tests/test_diag_kmsg.py runs the count check (count_check) in CI on a small dense log with a lowered result budget,
the condition that dropped 43% of the Xid lines from the 1 GiB log's summary before counts were exact.

Run from the repository root: python benchmarks/diagnostics.py [--size-mb 1024] [--repeat 3] [--path FILE] [--keep]
"""

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics.kmsg import KernelLogScan, scan_file

ROOT = Path(__file__).resolve().parents[1]

MIN_MIB_S = 100.0
MIN_VS_GREP = 0.5
MEMORY_SLACK_MIB = 16.0
MEMORY_SLACK_FRACTION = 0.10
BLOCK_BYTES = 1 << 20
TEMPLATES = 8
SPECIAL_GROUPS_PER_BLOCK = 3
REBOOTS = 3
PLACEHOLDER = b"@@@@@@"

GPUS = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]
SWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]


def _ordinary_line(rng: random.Random) -> str:
    """One ordinary kernel message (no trigger word), without its prefix."""
    pid = rng.randint(300, 4_000_000)
    hexid = f"{rng.getrandbits(28):07x}"
    choice = rng.randrange(20)
    if choice == 0:
        return (
            f"audit: type=1400 audit({rng.randint(1_700_000_000, 1_760_000_000)}.{rng.randint(100, 999)}:"
            f'{rng.randint(1, 99999)}): apparmor="DENIED" operation="open" profile="snap.lxd.daemon" '
            f'name="/proc/{pid}/status" pid={pid} comm="python3" requested_mask="r" denied_mask="r" fsuid=0 ouid=0'
        )
    if choice == 1:
        return f"eth{rng.randrange(8)}: renamed from veth{hexid}"
    if choice == 2:
        return f"IPv6: ADDRCONF(NETDEV_CHANGE): cali{hexid}a1b: link becomes ready"
    if choice == 3:
        state = rng.choice(["forwarding", "blocking", "disabled"])
        return f"docker0: port {rng.randint(1, 64)}(veth{hexid}) entered {state} state"
    if choice == 4:
        return (
            f"mlx5_core 0000:{rng.choice(['0c', '0d', '8a', '8b'])}:00.0: "
            f"mlx5_fw_tracer_handle_traces:{rng.randint(700, 800)}:"
            f"(pid {pid}): FW tracer: event {rng.randint(0, 255)} ts {rng.getrandbits(40)} lost"
        )
    if choice == 5:
        return f"EXT4-fs (nvme{rng.randrange(4)}n1p1): mounted filesystem with ordered data mode. Quota mode: none."
    if choice == 6:
        return (
            f"perf: interrupt took too long ({rng.randint(2501, 9000)} > 2500), lowering "
            f"kernel.perf_event_max_sample_rate to {rng.randint(20000, 79000)}"
        )
    if choice == 7:
        io = f"I/O {rng.randint(0, 1023)} QID {rng.randint(1, 64)}"
        return f"nvme nvme{rng.randrange(4)}: {io} timeout, completion polled"
    if choice == 8:
        return f"TCP: request_sock_TCP: Possible SYN flooding on port {rng.randint(1024, 65535)}. Sending cookies."
    if choice == 9:
        return f"INFO: task python3:{pid} blocked for more than {rng.choice([120, 241, 362])} seconds."
    if choice == 10:
        return (
            f"Out of memory: Killed process {pid} (python3) total-vm:{rng.randint(10**6, 10**8)}kB, "
            f"anon-rss:{rng.randint(10**5, 10**7)}kB, file-rss:0kB, shmem-rss:0kB, UID:0 "
            f"pgtables:{rng.randint(1, 99999)}kB"
        )
    if choice == 11:
        return f"kauditd_printk_skb: {rng.randint(1, 200)} callbacks suppressed"
    if choice == 12:
        return f"nfs: server nfs{rng.randint(1, 9):02d} not responding, still trying"
    if choice == 13:
        address = ".".join(str(rng.randrange(256)) for _ in range(3))
        return f"IPVS: rr: TCP 10.{address}:80 - no destination available"
    if choice == 14:
        return f"cgroup: fork rejected by pids controller in /kubepods.slice/kubepods-pod{hexid}.slice"
    if choice == 15:
        return "overlayfs: upper fs does not support RENAME_WHITEOUT."
    if choice == 16:
        return (
            f"python3[{pid}]: segfault at {rng.getrandbits(16):x} ip 00007f{rng.getrandbits(36):09x} sp "
            f"00007ffd{rng.getrandbits(32):08x} error 4 in libc.so.6[7f{rng.getrandbits(32):08x}+195000]"
        )
    if choice == 17:
        where = f"mlx5_ib_event:{rng.randint(3000, 3100)}: port {rng.randint(1, 2)}"
        return f"infiniband mlx5_{rng.randrange(8)}: {where} state changed"
    if choice == 18:
        return (
            f"xfs filesystem being remounted at /var/lib/kubelet/pods/{hexid}-0000/volumes supports timestamps to 2038"
        )
    return f"hrtimer: interrupt took {rng.randint(10000, 9_000_000)} ns"


def _block_template(rng: random.Random) -> bytes:
    """About 1 MiB of ordinary lines within one second of uptime; PLACEHOLDER stands for the seconds."""
    lines: list[str] = []
    size = 0
    micro = 0
    while size < BLOCK_BYTES:
        micro += rng.randint(1, 90)
        line = f"[@@@@@@.{min(micro, 998_999):06d}] {_ordinary_line(rng)}\n"
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


@dataclass
class Expected:
    xid_lines: int = 0  # lines holding "NVRM: Xid" (Xid events, 154 included)
    xid: int = 0
    recovery_action: int = 0
    sxid: int = 0
    nccl_segfault: int = 0
    fallen_off_bus: int = 0
    boots: int = 1
    by_code: dict[int, int] = field(default_factory=dict)


def _special_group(rng: random.Random, sec: int, exp: Expected) -> list[str]:
    """A few GPU lines of one shape, at uptime sec.999xxx (after the block of that second)."""
    gpu = rng.choice(GPUS)
    micro = 999_000 + rng.randint(0, 500)

    def stamp(text: str) -> str:
        nonlocal micro
        micro += 1
        return f"[{sec:6d}.{micro:06d}] {text}\n"

    def xid(code: int, text: str) -> str:
        exp.xid_lines += 1
        exp.by_code[code] = exp.by_code.get(code, 0) + 1
        if code == 154:
            exp.recovery_action += 1
        else:
            exp.xid += 1
        return text

    pid = rng.randint(1000, 4_000_000)
    shape = rng.randrange(13)
    if shape == 0:
        exp.fallen_off_bus += 1  # the one-line message after the Xid 79
        return [
            stamp(f"NVRM: GPU at PCI:{gpu}: GPU-{rng.getrandbits(32):08x}-b600-ac93-3616-{rng.getrandbits(48):012x}"),
            stamp(f"NVRM: GPU Board Serial Number: {rng.randint(10**12, 10**13 - 1)}"),
            stamp(xid(79, f"NVRM: Xid (PCI:{gpu}): 79, pid={pid}, name=python3, GPU has fallen off the bus.")),
            stamp(f"NVRM: GPU {gpu}.0: GPU has fallen off the bus."),
        ]
    if shape == 1:
        return [stamp(xid(13, f"NVRM: Xid ({gpu}): 13, pid={pid}, name=pt_main_thread, Graphics SM Warp Exception"))]
    if shape == 2:
        return [
            stamp(
                xid(
                    31,
                    f"NVRM: Xid (PCI:{gpu}): 31, pid='<unknown>', name=<unknown>, Ch 00000008, intr 00000000. "
                    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_3456a000",
                )
            )
        ]
    if shape == 3:
        return [stamp(xid(63, f"NVRM: Xid (PCI:{gpu}): 63, Row Remapper: New row marked for remapping, reset gpu"))]
    if shape == 4:
        unit = rng.choice(["NETIR_LINK_EVT", "NETIR_BER_EVENT", "NETIR_LINK_DOWN"])
        return [
            stamp(
                xid(
                    149,
                    f"NVRM: Xid (PCI:{gpu}): 149, {unit} {rng.choice(['Fatal', 'Nonfatal'])} XC0 i0 Link "
                    f"{rng.randint(0, 17):02d} (0x{rng.getrandbits(32):08x} 0x00000000 0x00000000 0x00000000)",
                )
            )
        ]
    if shape == 5:
        return [
            stamp(
                xid(
                    154,
                    f"NVRM: Xid (PCI:{gpu}): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
                )
            )
        ]
    if shape == 6:  # a burst of preemptive cleanups
        return [
            stamp(xid(45, f"NVRM: Xid (PCI:{gpu}): 45, pid={pid}, name=python3, Ch 00000010, Preemptive cleanup"))
            for _ in range(rng.randint(5, 40))
        ]
    if shape == 7:
        switch = rng.choice(SWITCHES)
        link = rng.randint(0, 63)
        head = f"nvidia-nvswitch{SWITCHES.index(switch)}: SXid (PCI:{switch}): 20034"
        exp.sxid += 1
        return [
            stamp(f"{head}, Fatal, Link {link} LTSSM Fault Up"),
            stamp(f"{head}, Severity 5 Engine instance {link} Sub-engine instance 00"),
            stamp(f"{head}, Data {{0x50610002, 0x10100030, 0x00000000, 0x10100030}}"),
        ]
    if shape == 8:
        exp.nccl_segfault += 1
        return [
            stamp(
                f"python[{pid}]: segfault at 0 ip 00007f3a1c2b4d10 sp 00007ffd5e6f7a80 error 4 in "
                "libnccl.so.2[7f3a1b000000+1e4b000]"
            ),
            stamp("Code: 48 8b 07 48 85 c0 74 1d 48 8b 40 08 <48> 8b 00 c3 0f 1f 40 00"),
        ]
    if shape == 9:
        exp.fallen_off_bus += 1
        return [
            stamp(f"NVRM: The NVIDIA GPU {gpu}.0 (PCI ID: 10de:2330)"),
            stamp("NVRM: installed in this system has"),
            stamp("NVRM: fallen off the bus and is not responding to commands."),
        ]
    if shape == 10:
        return [stamp(f"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:{gpu} (printing 1 of every 30).")]
    if shape == 11:
        return [
            stamp(
                xid(
                    119,
                    f"NVRM: Xid (PCI:{gpu}): 119, pid={pid}, name=nvidia-smi, Timeout after 6s of waiting for RPC "
                    "response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c).",
                )
            )
        ]
    return [stamp(xid(43, f"NVRM: Xid (PCI:{gpu}): 43, pid=<unknown>, name=<unknown>, Ch 00000010"))]


def _boot_header(rng: random.Random) -> list[str]:
    return [
        "[    0.000000] Linux version 5.15.0-112-generic (buildd@lcy02-amd64-051) (gcc (Ubuntu 11.4.0) 11.4.0) "
        "#122-Ubuntu SMP Thu May 23 07:48:21 UTC 2024\n",
        "[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-112-generic root=UUID=0f1e2d3c ro quiet\n",
        "[    0.000000] KERNEL supported cpus:\n",
        "[    0.000000]   Intel GenuineIntel\n",
        "[    5.391002] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\n",
    ]


def generate(path: Path, size_mib: int, seed: int = 0, groups_per_block: float = SPECIAL_GROUPS_PER_BLOCK) -> Expected:
    """Write the log; groups_per_block special groups follow each 1 MiB block (fractions carry over)."""
    rng = random.Random(seed)
    templates = [_block_template(rng) for _ in range(TEMPLATES)]
    exp = Expected()
    target = size_mib * BLOCK_BYTES
    blocks = max(1, target // len(templates[0]))
    reboot_at = {blocks * (i + 1) // (REBOOTS + 1) for i in range(REBOOTS)} if blocks > REBOOTS else set()
    written = 0
    sec = 10
    credit = 0.0
    with path.open("wb", buffering=8 << 20) as out:
        for line in _boot_header(rng):
            out.write(line.encode())
        index = 0
        while written < target:
            if index in reboot_at:
                exp.boots += 1
                sec = 10
                for line in _boot_header(rng):
                    out.write(line.encode())
            block = templates[index % TEMPLATES].replace(PLACEHOLDER, b"%6d" % sec)
            out.write(block)
            written += len(block)
            specials: list[str] = []
            credit += groups_per_block
            while credit >= 1:
                credit -= 1
                specials.extend(_special_group(rng, sec, exp))
            data = "".join(specials).encode()
            out.write(data)
            written += len(data)
            sec += 1
            index += 1
    return exp


def timed(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    best = float("inf")
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def grep_count(path: Path) -> int:
    done = subprocess.run(
        ["grep", "-c", "NVRM: Xid", str(path)], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}
    )
    return int(done.stdout.strip() or 0)


CHILD = """
import json, re, resource, sys
sys.path.insert(0, sys.argv[2])
from servers.diagnostics.kmsg import scan_file


def status(key):
    try:
        with open("/proc/self/status") as f:
            return int(re.search(key + r":\\s+(\\d+)", f.read()).group(1))
    except (OSError, AttributeError):
        return None


reset = True
try:  # reset the peak-RSS mark to the current RSS (Linux >= 4.0), so the import's peak does not hide the scan's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    reset = False
start = status("VmRSS") if reset else None
if start is None:
    start, reset = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, False
scan = scan_file(sys.argv[1])
peak = status("VmHWM") if reset else None
if peak is None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"start_kib": start, "peak_kib": peak, "listed": len(scan.events), "reset": reset}))
"""


def child_memory(path: Path) -> dict[str, float]:
    """Peak RSS of a fresh process scanning path: its RSS after the import, and the peak during the scan."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(ROOT)], capture_output=True, text=True, check=True
    )
    data = json.loads(done.stdout)
    return {
        "start_mib": data["start_kib"] / 1024,
        "peak_mib": data["peak_kib"] / 1024,
        "listed": data["listed"],
        "reset": data["reset"],
    }


KINDS = ("xid", "recovery_action", "sxid", "nccl_segfault", "fallen_off_bus")


def check_counts(scan: KernelLogScan, exp: Expected, grep_xid: int) -> list[str]:
    """What the scan counted (its exact per-kind ``counts``) against what was generated and grep's Xid lines; and,
    when the result lists every summary row, the rows' counts against the same totals."""
    got = scan.counts
    problems = []
    for kind in KINDS:
        if got.get(kind, 0) != getattr(exp, kind):
            problems.append(f"{kind}: scanned {got.get(kind, 0)}, generated {getattr(exp, kind)}")
    if got.get("xid", 0) + got.get("recovery_action", 0) != grep_xid:
        problems.append(f"Xid lines: scanned {got.get('xid', 0) + got.get('recovery_action', 0)}, grep {grep_xid}")
    if scan.boots != exp.boots:
        problems.append(f"boots: scanned {scan.boots}, generated {exp.boots}")
    if sum(got.values()) != len(scan.events) + scan.events_omitted:
        problems.append(
            f"events: {sum(got.values())} counted, {len(scan.events)} listed + {scan.events_omitted} omitted"
        )
    if not scan.summary_omitted and not scan.summary_truncated:
        rows: dict[str, int] = {}
        for row in scan.summary:
            rows[row.kind] = rows.get(row.kind, 0) + row.count
        if rows != {k: n for k, n in got.items() if n}:
            problems.append(f"summary rows {rows} differ from the counts {got}")
    return problems


def count_check(
    workdir: Path, size_mib: int, groups_per_block: float = SPECIAL_GROUPS_PER_BLOCK, **scan_args: int
) -> tuple[KernelLogScan, list[str]]:
    """Generate a log of size_mib MiB in workdir, scan it (scan_args go to scan_file, e.g. a lowered
    max_result_bytes) and check its counts; the scan and the problems found (none when it passes)."""
    path = workdir / f"kmsg-check-{size_mib}mib.log"
    exp = generate(path, size_mib, groups_per_block=groups_per_block)
    try:
        scan = scan_file(path, **scan_args)  # type: ignore[arg-type]
        return scan, check_counts(scan, exp, grep_count(path))
    finally:
        path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the big log in MiB (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best counts (default 3)")
    parser.add_argument("--path", type=Path, help="write the big log here (the small one next to it)")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="kmsg-bench-")) if args.path is None else args.path.parent
    workdir.mkdir(parents=True, exist_ok=True)
    big = args.path or workdir / f"kmsg-{args.size_mb}mib.log"
    small_mib = max(32, args.size_mb // 10)
    small = big.with_name(big.stem + f".small-{small_mib}mib.log")
    try:
        start = time.perf_counter()
        exp = generate(big, args.size_mb)
        gen_s = time.perf_counter() - start
        # the small log carries as many GPU lines as the big one, so the two differ only in size
        generate(small, small_mib, seed=1, groups_per_block=SPECIAL_GROUPS_PER_BLOCK * args.size_mb / small_mib)
        size = big.stat().st_size
        mib = size / (1 << 20)
        print(f"generated {big} ({mib:.0f} MiB) in {gen_s:.1f} s ({mib / gen_s:.0f} MiB/s)")

        scan_s, scan = timed(lambda: scan_file(big), args.repeat)
        grep_s, grep_xid = timed(lambda: grep_count(big), args.repeat)
        assert isinstance(scan, KernelLogScan) and isinstance(grep_xid, int)
        mem_small = child_memory(small)
        mem_big = child_memory(big)
        problems = check_counts(scan, exp, grep_xid)

        rate = mib / scan_s
        grep_rate = mib / grep_s
        small_size = small.stat().st_size / (1 << 20)
        print()
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, best of {args.repeat}")
        print(
            f"{scan.lines_read:,} lines, {scan.matched_lines:,} matched, {sum(scan.counts.values()):,} events "
            f"({len(scan.events):,} listed), {len(scan.summary)} summary rows, {scan.boots} boots"
        )
        print()
        print(f"| {'measure':<38} | {'log MiB':>8} | {'seconds':>8} | {'MiB/s':>8} | {'vs grep':>8} |")
        print(f"|{'-' * 40}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        print(f"| {'scan_file (kmsg)':<38} | {mib:>8.0f} | {scan_s:>8.2f} | {rate:>8.0f} | {grep_s / scan_s:>7.2f}x |")
        print(f"| {grep_label():<38} | {mib:>8.0f} | {grep_s:>8.2f} | {grep_rate:>8.0f} | {1.0:>7.2f}x |")
        print()
        print(
            f"| {'child process (RSS in MiB)':<38} | {'log MiB':>8} | {'events listed':>13} | {'at start':>8} "
            f"| {'peak':>8} | {'growth':>8} |"
        )
        print(f"|{'-' * 40}|{'-' * 10}|{'-' * 15}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        for label, size_mib, mem in (("small log", small_size, mem_small), ("big log", mib, mem_big)):
            growth = mem["peak_mib"] - mem["start_mib"]
            print(
                f"| {label:<38} | {size_mib:>8.0f} | {mem['listed']:>13,} | {mem['start_mib']:>8.1f} "
                f"| {mem['peak_mib']:>8.1f} | {growth:>8.1f} |"
            )
        if not (mem_small["reset"] and mem_big["reset"]):
            print("(no /proc/self/clear_refs here: the peaks include the import's own peak)")
        print()

        allowed = max(MEMORY_SLACK_MIB, MEMORY_SLACK_FRACTION * mem_small["peak_mib"])
        verdicts = [
            (rate >= MIN_MIB_S, f"throughput {rate:.0f} MiB/s >= {MIN_MIB_S:.0f} MiB/s"),
            (
                grep_s / scan_s >= MIN_VS_GREP,
                f"speed {grep_s / scan_s:.2f}x grep -c's >= {MIN_VS_GREP:.1f}x",
            ),
            (
                mem_big["peak_mib"] - mem_small["peak_mib"] <= allowed,
                f"memory independent of size: peak RSS {mem_small['peak_mib']:.1f} MiB at {small_size:.0f} MiB, "
                f"{mem_big['peak_mib']:.1f} MiB at {mib:.0f} MiB (allowed growth {allowed:.1f} MiB)",
            ),
            (
                not problems,
                "counts match what was generated and grep" + (f": {'; '.join(problems)}" if problems else ""),
            ),
        ]
        for ok, text in verdicts:
            print(f"{'PASS' if ok else 'FAIL'}  {text}")
        return 0 if all(ok for ok, _ in verdicts) else 1
    finally:
        if not args.keep:
            for path in (big, small):
                path.unlink(missing_ok=True)
            if args.path is None:
                shutil.rmtree(workdir, ignore_errors=True)


def grep_label() -> str:
    return "grep -c 'NVRM: Xid' (LC_ALL=C)"


if __name__ == "__main__":
    sys.exit(main())
