"""Where a training job's own code runs: a mount and PID namespace that keeps it away from the server's state.

A job runs a script the agent chose, as the server's user. Without more, it could write the state database (and
approve its own costly launches), read launch.key, rewrite the tool cache that a later server start trusts, edit
other jobs' folders, write its own exit record, or signal its supervisor. So its processes run in namespaces of
their own (`python -m servers.core.sandbox [options] -- ARGV...`, see `sandbox_argv`):

- **mount**: every `--hide` folder (the state directory) is replaced by an empty read-only tmpfs, in which only the
  `--writable` paths (the job's run folder, torchrun's log folder, checkpoints, metrics.jsonl) are mounted back as
  they are; every `--readonly` folder (this package, the Python installation) is mounted read-only.
- **PID**: the job sees only its own processes, under a small init (pid 1) of this module; its /proc is a new one,
  so no path through another process (/proc/PID/root, /proc/PID/fd) leads outside, and it can signal or trace
  nothing outside. When the command ends, the init ends, and the kernel kills whatever the job left running.
- **network** (`--network isolated`): only a loopback interface (servers/core/netns.py says why).
- **user**: the mounts above are locked by a further user namespace (`unshare(CLONE_NEWUSER)` after they are made),
  so not even a job running as root can unmount or remount them: root stays root for files, but only inside.

As root the first namespaces are made directly; otherwise inside a user namespace that maps the caller's own uid and
gid. Where the kernel refuses any step the command does not run (exit 3, the reason on stderr): `probe()` tries it
once for real, and planning refuses then unless the person turned the sandbox off (LLM_INFRA_MCP_JOB_SANDBOX=off).

Process tree: the launcher (in the caller's PID namespace, so its caller can wait for it and signal it) forwards
SIGTERM, SIGINT, SIGHUP and SIGQUIT to the init, which forwards them to the command; the launcher exits as the
command did (its exit code, or killed by the same signal). If the launcher dies, the init is killed
(PR_SET_PDEATHSIG), and with it the whole namespace.
"""

import contextlib
import ctypes
import errno
import functools
import os
import signal
import stat
import sys
from dataclasses import dataclass

from servers.core.netns import CLONE_NEWNET, CLONE_NEWUSER, IsolationError, Probe, _libc, _loopback_up, _write

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
PR_SET_PDEATHSIG = 1
# statvfs flags -> the mount flags a remount must keep (a user namespace may not drop them: they are locked).
_KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (getattr(os, "ST_RELATIME", 4096), MS_RELATIME),
)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
EXIT_CANNOT_SANDBOX = 3


class SandboxError(IsolationError):
    """The sandbox could not be made; the message says why."""


@dataclass(frozen=True)
class Layout:
    """What the job sees: folders hidden (an empty tmpfs with only `writable` paths inside them mounted back),
    folders read-only, and whether it gets a network of its own."""

    hide: tuple[str, ...] = ()
    readonly: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    network: str = "isolated"  # or "host"

    def args(self) -> list[str]:
        out = ["--network", self.network]
        for flag, paths in (("--hide", self.hide), ("--readonly", self.readonly), ("--writable", self.writable)):
            for path in paths:
                out += [flag, path]
        return out

    @classmethod
    def parse(cls, argv: list[str]) -> tuple["Layout", list[str]]:
        """(the layout, the command) from `--network N --hide P ... -- ARGV...`; ValueError when malformed."""
        lists: dict[str, list[str]] = {"--hide": [], "--readonly": [], "--writable": []}
        network = "isolated"
        i = 0
        while i < len(argv) and argv[i] != "--":
            flag = argv[i]
            if i + 1 >= len(argv):
                raise ValueError(f"{flag} needs a value")
            value = argv[i + 1]
            if flag == "--network":
                if value not in ("isolated", "host"):
                    raise ValueError(f"--network is isolated or host, not {value!r}")
                network = value
            elif flag in lists:
                if not os.path.isabs(value):
                    raise ValueError(f"{flag} takes absolute paths, not {value!r}")
                lists[flag].append(os.path.normpath(value))
            else:
                raise ValueError(f"unknown option {flag!r}")
            i += 2
        command = argv[i + 1 :]
        if not command:
            raise ValueError("no command after --")
        return cls(tuple(lists["--hide"]), tuple(lists["--readonly"]), tuple(lists["--writable"]), network), command


def code_folders() -> tuple[str, ...]:
    """Folders whose files a later server start runs: this package's folder and the Python installation (its
    prefix, the base installation of a virtual environment). A job may read them, never write them."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2]
    found: list[str] = []
    for path in (package, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)):
        with contextlib.suppress(OSError):
            resolved = str(path.resolve())
            if resolved != "/" and resolved not in found:
                found.append(resolved)
    return tuple(found)


def sandbox_argv(argv: list[str], layout: Layout) -> list[str]:
    """ARGV run inside the sandbox (by this module as a launcher)."""
    from servers.core.procs import child_command

    return [*child_command("servers.core.sandbox", site=False), *layout.args(), "--", *argv]


# ---- the syscalls ----------------------------------------------------------------------------------------------------
def _fail(what: str, code: int | None = None) -> SandboxError:
    code = ctypes.get_errno() if code is None else code
    return SandboxError(code, f"{what}: {os.strerror(code)}")


def _unshare(libc: ctypes.CDLL, flags: int, what: str) -> None:
    if libc.unshare(flags) != 0:
        raise _fail(f"unshare({what})")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    if libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)) != 0:
        raise _fail(f"mount {target} ({fstype or 'bind'})")


def _map_ids(proc: str, uid: int, gid: int, *, every_id: bool) -> None:
    """Write the id maps of the user namespace of the process at `proc` (/proc/self, or the init's /proc/1): every id
    to itself (a writer with the privilege to, so root keeps its access to files), else the caller's own uid and gid
    (all an unprivileged writer may map)."""
    try:
        if every_id:
            _write(f"{proc}/uid_map", "0 0 4294967295\n")
            _write(f"{proc}/gid_map", "0 0 4294967295\n")
        else:
            _write(f"{proc}/setgroups", "deny")
            _write(f"{proc}/uid_map", f"{uid} {uid} 1\n")
            _write(f"{proc}/gid_map", f"{gid} {gid} 1\n")
    except OSError as exc:
        raise SandboxError(
            exc.errno or errno.EPERM, f"mapping the user into the job's namespace failed: {exc}"
        ) from exc


def _kept_flags(path: str) -> int:
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEPT_FLAGS if flags & st)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _open_path(path: str) -> int:
    """An O_PATH descriptor of `path` (a folder or a regular file, not a symbolic link)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(exc.errno or errno.ENOENT, f"writable path {path}: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        os.close(fd)
        raise SandboxError(errno.EINVAL, f"writable path {path} is neither a folder nor a regular file")
    return fd


def _make_mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def arrange(libc: ctypes.CDLL, layout: Layout) -> None:
    """Make the mounts of `layout` in this process's (new, private) mount namespace."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
    # Descriptors of the paths to show again, opened before anything hides them (in this namespace: a bind mount's
    # source must be a mount of the caller's own namespace).
    exposed = [(path, _open_path(path)) for path in layout.writable]
    try:
        for folder in layout.readonly:
            if not os.path.isdir(folder) or any(_inside(folder, h) for h in layout.hide):
                continue  # hidden anyway
            _mount(libc, folder, folder, None, MS_BIND | MS_REC, None)
            _mount(libc, None, folder, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _kept_flags(folder), None)
        for folder in layout.hide:
            if not os.path.isdir(folder):
                continue
            _mount(libc, "llm-infra-mcp-hidden", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            inner = [(p, fd) for p, fd in exposed if _inside(p, folder) and p != folder]
            for path, fd in inner:
                _make_mountpoint(path, stat.S_ISDIR(os.fstat(fd).st_mode))
            _mount(libc, None, folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            for path, fd in inner:
                _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND, None)
        for path, fd in exposed:  # a writable path inside a read-only folder (a workdir in the package's folder)
            if any(_inside(path, h) for h in layout.hide):
                continue
            if any(_inside(path, r) for r in layout.readonly):
                _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND, None)
    finally:
        for _, fd in exposed:
            os.close(fd)


def enter(layout: Layout) -> tuple[ctypes.CDLL, bool]:
    """Stage one, in the launcher: new mount, PID (for the children) and, if asked, network namespaces, with the
    layout's mounts. Returns (libc, whether a user namespace was needed). Raises SandboxError."""
    if not sys.platform.startswith("linux"):
        raise SandboxError(errno.ENOSYS, f"the job sandbox needs Linux namespaces; this is {sys.platform}")
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | (CLONE_NEWNET if layout.network == "isolated" else 0)
    in_userns = uid != 0
    if not in_userns and libc.unshare(flags) != 0:
        if ctypes.get_errno() != errno.EPERM:
            raise _fail("unshare(mount, pid, net)")
        in_userns = True  # root without CAP_SYS_ADMIN (a container): through a user namespace
    if in_userns:
        hint = (
            " (unprivileged user namespaces may be disabled: sysctl kernel.unprivileged_userns_clone, "
            "user.max_user_namespaces, or an AppArmor restriction)"
        )
        if libc.unshare(CLONE_NEWUSER) != 0:
            raise SandboxError(ctypes.get_errno(), f"unshare(user): {os.strerror(ctypes.get_errno())}{hint}")
        _map_ids("/proc/self", uid, gid, every_id=False)
        _unshare(libc, flags, "mount, pid, net")
    if layout.network == "isolated":
        try:
            _loopback_up()
        except OSError as exc:
            raise SandboxError(exc.errno or errno.EPERM, f"bringing loopback up failed: {exc}") from exc
    arrange(libc, layout)
    return libc, in_userns


def lock(libc: ctypes.CDLL) -> None:
    """Stage two, in the init: a new /proc for the new PID namespace, then a further user and mount namespace in
    which every mount made so far is locked (cannot be unmounted, nor made writable, even by root). The launcher,
    one user namespace up, writes the new namespace's id maps (`map_init`)."""
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    except SandboxError as exc:
        raise SandboxError(exc.errno, f"{exc.strerror} (a /proc of the job's own processes)") from exc
    _unshare(libc, CLONE_NEWUSER | CLONE_NEWNS, "user, mount: locking the mounts")


def map_init(in_userns: bool, uid: int, gid: int) -> None:
    """From the launcher: the id maps of the init's new user namespace (pid 1 of the /proc the init mounted, which
    the launcher shares until then). As root every id maps to itself; otherwise the caller's own ids."""
    _map_ids("/proc/1", uid, gid, every_id=not in_userns)


# ---- the processes ---------------------------------------------------------------------------------------------------
def _status_code(status: int) -> tuple[int, int]:
    """(exit code, signal) of a wait status."""
    if os.WIFSIGNALED(status):
        return 0, os.WTERMSIG(status)
    return (os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1), 0


def _init(libc: ctypes.CDLL, command: list[str], report: int, go: int) -> None:
    """pid 1 of the job's PID namespace: lock the mounts, start the command, forward signals to it, reap every
    orphan, and end (taking the namespace with it) when the command ends. Never returns."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher gone: the whole namespace goes
        lock(libc)
        os.write(report, b"ready\n")
        if os.read(go, 16) != b"go":
            os._exit(EXIT_CANNOT_SANDBOX)  # the launcher said why
    except SandboxError as exc:
        os.write(2, f"sandbox: cannot isolate the job: {exc.strerror}\n".encode())
        os._exit(EXIT_CANNOT_SANDBOX)
    os.close(go)
    child = os.fork()
    if child == 0:
        os.close(report)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"sandbox: cannot run {command[0]!r}: {exc}\n".encode())
        os._exit(127)

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            code, sig = _status_code(status)
            os.write(report, (f"signal {sig}\n" if sig else f"exit {code}\n").encode())
            os._exit(128 + sig if sig else code)


def run(layout: Layout, command: list[str]) -> int:
    """The launcher: make the sandbox, run `command` in it, return (or die) as it did."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        libc, in_userns = enter(layout)
    except SandboxError as exc:
        print(f"sandbox: cannot isolate the job: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_SANDBOX
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    for sig in FORWARDED:  # until the init runs the command, a signal waits
        signal.signal(sig, signal.SIG_IGN)
    init = os.fork()
    if init == 0:
        os.close(report_r)
        os.close(go_w)
        _init(libc, command, report_w, go_r)
    os.close(report_w)
    os.close(go_r)
    with os.fdopen(report_r, "rb") as reports:
        if reports.readline() == b"ready\n":
            try:
                map_init(in_userns, uid, gid)
                os.write(go_w, b"go")
            except SandboxError as exc:
                print(f"sandbox: cannot isolate the job: {exc.strerror}", file=sys.stderr)
        os.close(go_w)

        def forward(sig: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, sig)

        for sig in FORWARDED:
            signal.signal(sig, forward)
        said = reports.readline().decode(errors="replace").split()
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
    code, sig = _status_code(status)
    if said[:1] == ["signal"] and len(said) > 1 and said[1].isdigit():
        code, sig = 0, int(said[1])
    elif said[:1] == ["exit"] and len(said) > 1 and said[1].isdigit():
        code, sig = int(said[1]), 0
    if sig:  # end as the command ended: by the same signal
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # only if the signal did not end us
    return code


@functools.lru_cache(maxsize=4)
def probe(network: str = "isolated") -> Probe:
    """Whether this machine can sandbox a job (tried once per process, for real: the probe hides a folder, checks
    that it is empty and locked inside, and that its /proc shows only its own processes)."""
    if not sys.platform.startswith("linux"):
        return Probe(False, f"the job sandbox needs Linux namespaces; this is {sys.platform}")
    import subprocess
    import tempfile
    from pathlib import Path

    from servers.core.procs import child_command

    with tempfile.TemporaryDirectory(prefix="llm-infra-mcp-probe-") as tmp:
        hidden, readonly = os.path.join(tmp, "hidden"), os.path.join(tmp, "readonly")
        shown = os.path.join(hidden, "shown")
        os.makedirs(shown)
        os.makedirs(readonly)
        Path(hidden, "secret").write_text("x")
        layout = Layout(hide=(hidden,), readonly=(readonly, *code_folders()), writable=(shown,), network=network)
        argv = sandbox_argv(
            child_command("servers.core.sandbox", "--check", hidden, shown, readonly, site=False), layout
        )
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            return Probe(False, f"the sandbox probe did not run: {exc}")
    if done.returncode != 0 or done.stdout.strip() != "ok":
        lines = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()
        return Probe(False, lines[-1].removeprefix("sandbox: "))
    return Probe(True, "a mount, PID and user namespace hiding the state directory (unshare)")


def _check(hidden: str, shown: str, readonly: str) -> int:
    """Run inside the probe's sandbox: the hidden folder shows only `shown`, which is writable, cannot be unmounted,
    the read-only folder cannot be written, and /proc lists only this namespace's processes."""
    from pathlib import Path

    problems = []
    with contextlib.suppress(OSError):
        Path(readonly, "w").write_text("x")
        problems.append("the read-only folder could be written")
    if sorted(os.listdir(hidden)) != [os.path.basename(shown)]:
        problems.append(f"the hidden folder shows {sorted(os.listdir(hidden))}")
    with contextlib.suppress(OSError):
        Path(shown, "w").write_text("x")
    if not Path(shown, "w").exists():
        problems.append("the writable folder is not writable")
    libc = _libc()
    if libc.umount2(hidden.encode(), 2) == 0:  # MNT_DETACH
        problems.append("the hidden folder could be unmounted")
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    if len(pids) > 8:
        problems.append(f"/proc shows {len(pids)} processes")
    if problems:
        print("sandbox check failed: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("ok")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"] and len(argv) == 4:
        return _check(argv[1], argv[2], argv[3])
    try:
        layout, command = Layout.parse(argv)
    except ValueError as exc:
        print(
            f"sandbox: {exc}; usage: python -m servers.core.sandbox [--network isolated|host] [--hide DIR]... "
            "[--readonly DIR]... [--writable PATH]... -- ARGV...",
            file=sys.stderr,
        )
        return 2
    return run(layout, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
