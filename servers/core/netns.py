"""A private network namespace for jobs whose processes talk to each other only on this machine.

torchrun's rendezvous and every torch.distributed process group keep their state in a TCPStore. Its server
listens on all interfaces whatever address it is given, has no authentication, and torchrun's dynamic
rendezvous unpickles what it reads from it: anyone who reaches the port can run code as the job's user. A
single-node job needs no network beyond loopback, so it runs in a network namespace of its own that has only
a loopback interface: its listening sockets exist in that namespace alone, unreachable from the host's
interfaces (its loopback included) and from other machines.

`python -m servers.core.netns -- ARGV...` (see `isolated_argv`) enters a new network namespace (as root
directly; otherwise inside a new user namespace that maps the caller's own uid and gid, so files and devices
are reached with the same identity), brings its loopback interface up and execs ARGV. Linux only; where the
kernel refuses (no unprivileged user namespaces, a seccomp profile), `probe()` says why, and the caller
refuses to run or runs in the host's network only when the person chose that (LLM_INFRA_MCP_JOB_NETWORK=host).
"""

import ctypes
import errno
import fcntl
import functools
import os
import socket
import struct
import sys
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
# Variables that make NCCL and gloo use the only interface the namespace has (unless the job chose its own).
LOOPBACK_ENV = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


class IsolationError(OSError):
    """The network namespace could not be made; the message says why."""


def _libc() -> ctypes.CDLL:
    """The C library: the process's own symbols (libc is linked into Python on Linux), else the library found by
    name (ctypes.util.find_library runs ldconfig: slower, so only when needed)."""
    own = ctypes.CDLL(None, use_errno=True)
    if hasattr(own, "unshare"):
        return own
    from ctypes.util import find_library

    return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def enter() -> None:
    """Move this process into a new network namespace with loopback up. Raises IsolationError."""
    if not sys.platform.startswith("linux"):
        raise IsolationError(errno.ENOSYS, f"network namespaces are a Linux feature; this is {sys.platform}")
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWNET | CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        if uid == 0 and code == errno.EPERM:  # root without CAP_SYS_ADMIN (a container): try a user namespace
            if libc.unshare(CLONE_NEWNET | CLONE_NEWUSER) != 0:
                code = ctypes.get_errno()
                raise IsolationError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET) failed: {os.strerror(code)}")
        else:
            what = "CLONE_NEWNET" if uid == 0 else "CLONE_NEWUSER|CLONE_NEWNET"
            hint = (
                " (unprivileged user namespaces may be disabled: sysctl kernel.unprivileged_userns_clone or "
                "user.max_user_namespaces)"
                if uid != 0
                else ""
            )
            raise IsolationError(code, f"unshare({what}) failed: {os.strerror(code)}{hint}")
        flags = CLONE_NEWNET | CLONE_NEWUSER
    if flags & CLONE_NEWUSER:
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        except OSError as exc:
            raise IsolationError(
                exc.errno or errno.EPERM, f"mapping the user into its namespace failed: {exc}"
            ) from exc
    try:
        _loopback_up()
    except OSError as exc:
        raise IsolationError(exc.errno or errno.EPERM, f"bringing loopback up in the namespace failed: {exc}") from exc


def isolated_argv(argv: list[str]) -> list[str]:
    """ARGV run in a private network namespace (by this module as a launcher)."""
    from servers.core.procs import child_command

    return [*child_command("servers.core.netns", site=False), "--", *argv]


@dataclass(frozen=True)
class Probe:
    available: bool
    detail: str


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    """Whether this machine lets a job have its own network namespace: tried once per process, for real."""
    if not sys.platform.startswith("linux"):
        return Probe(False, f"network namespaces are a Linux feature; this is {sys.platform}")
    import subprocess

    from servers.core.procs import child_command

    argv = child_command("servers.core.netns", "--probe", site=False)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe(False, f"the namespace probe did not run: {exc}")
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return Probe(False, message)
    interfaces = done.stdout.strip()
    if interfaces != "lo":
        return Probe(False, f"the new namespace has interfaces {interfaces!r}, expected only 'lo'")
    return Probe(True, "a private network namespace with only loopback (unshare)")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        try:
            enter()
        except IsolationError as exc:
            print(f"netns: {exc.strerror}", file=sys.stderr)
            return 3
        print(",".join(name for _, name in socket.if_nameindex()))
        return 0
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m servers.core.netns -- ARGV...", file=sys.stderr)
        return 2
    try:
        enter()
    except IsolationError as exc:
        print(f"netns: cannot isolate the job's network: {exc.strerror}", file=sys.stderr)
        return 3
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"netns: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
