"""Network probes measured on real sockets: latency and loss (UDP echo) and throughput (one TCP stream) between two
NIC addresses, both ends opened by this process. Plain module, standard library only (no MCP imports).

An endpoint is an address, and optionally the network namespace it lives in (a name under /run/netns, as made by
``ip netns add``). A socket belongs to the namespace it was created in for its whole life, so one process can hold
sockets in many namespaces: each is created in a short-lived thread that first joins the namespace with setns(2)
(only that thread moves; it needs CAP_SYS_ADMIN, so root) and then hands the socket back.

Both ends of every probe are this process's own sockets: the responder is bound to the destination address in its
namespace before anything is sent, so a probe can only ever send to an address that exists on this machine and to a
socket this module opened (binding fails otherwise, and the probe is reported as not run, with the reason). Nothing
listens longer than its probe.

Latency and loss: ``count`` UDP datagrams of ``size`` bytes, ``interval_s`` apart, each echoed by the responder; the
latency is the lower quartile of the round-trip times in microseconds of those that came back (latency_of), the loss
rate the share that did not come back within ``timeout_s`` of the last send. Throughput (``bandwidth_bytes`` > 0):
one TCP connection sends that many bytes; the receiver's time from the first byte to the last gives Gbit/s (bounded
by ``bandwidth_timeout_s``; what arrived by then counts; a connection that cannot be made gives 0; a path that echoed
nothing is not timed).

Routes: when a probe is pinned to a spine the caller gives the IP TOS byte that the fabric routes to that spine by
(policy routing, ``ip rule ... tos``); both directions carry it, so request and echo cross the same spine. Unpinned
probes carry TOS 0 and follow ECMP.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import hmac
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
MAX_COUNT = 1000
MAX_SIZE = 8192
MAX_BANDWIDTH_BYTES = 64 * 2**20
MAX_CONCURRENCY = 64
HEADER = struct.Struct("!QQd")  # magic+probe id, sequence, send time
PROBE_MAGIC = 0x4C494D << 40  # in a probe id: a datagram of these probes
MAC_SIZE = 16  # the tag of a datagram or stream of an agent's probe (netagent.py)


class ProbeError(Exception):
    """A probe could not be set up (a namespace or an address that is not there): what was tried, and why."""


@dataclass(frozen=True)
class Endpoint:
    address: str
    netns: str | None = None


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: its two NICs (names, as the topology has them), their endpoints, and the route pin."""

    src_nic: str
    dst_nic: str
    src: Endpoint
    dst: Endpoint
    tos: int = 0
    spine: str | None = None


@dataclass(frozen=True)
class ProbeSettings:
    count: int = 20
    size: int = 64
    interval_s: float = 0.002
    timeout_s: float = 0.5
    bandwidth_bytes: int = 0
    bandwidth_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"count: {self.count}; accepted: 1 to {MAX_COUNT}")
        if not HEADER.size <= self.size <= MAX_SIZE:
            raise ValueError(f"size: {self.size}; accepted: {HEADER.size} to {MAX_SIZE} bytes")
        if not 0 <= self.interval_s <= 1:
            raise ValueError(f"interval_s: {self.interval_s}; accepted: 0 to 1")
        if not 0.01 <= self.timeout_s <= 30:
            raise ValueError(f"timeout_s: {self.timeout_s}; accepted: 0.01 to 30")
        if not 0 <= self.bandwidth_bytes <= MAX_BANDWIDTH_BYTES:
            raise ValueError(f"bandwidth_bytes: {self.bandwidth_bytes}; accepted: 0 to {MAX_BANDWIDTH_BYTES}")
        if not 0.1 <= self.bandwidth_timeout_s <= 120:
            raise ValueError(f"bandwidth_timeout_s: {self.bandwidth_timeout_s}; accepted: 0.1 to 120")


@dataclass
class ProbeResult:
    src_nic: str
    dst_nic: str
    latency_us: float | None
    loss_rate: float
    bandwidth_gbps: float | None = None
    spine: str | None = None
    sent: int = 0
    received: int = 0
    error: str | None = None  # the probe did not run (set-up failed): the row is not a measurement

    def row(self) -> dict[str, Any]:
        """The row localize_network_fault reads."""
        out: dict[str, Any] = {
            "src_nic": self.src_nic, "dst_nic": self.dst_nic, "latency_us": self.latency_us,
            "loss_rate": self.loss_rate,
        }  # fmt: skip
        if self.bandwidth_gbps is not None:
            out["bandwidth_gbps"] = self.bandwidth_gbps
        if self.spine is not None:
            out["spine"] = self.spine
        return out


# ---- namespaces --------------------------------------------------------------------------------------------------


_libc: Any = None


def _setns(name: str) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if not name or "/" in name or name in (".", ".."):
        raise ProbeError(f"netns {name!r}: not a namespace name")
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ProbeError(f"netns {name}: {path} cannot be opened ({exc.strerror})") from None
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            hint = " (joining a network namespace needs root: CAP_SYS_ADMIN)" if err == errno.EPERM else ""
            raise ProbeError(f"netns {name}: setns failed: {os.strerror(err)}{hint}")
    finally:
        os.close(fd)


def in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """fn() run in a thread that has joined the network namespace netns (None: this one); its result or error."""
    if netns is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            _setns(netns)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def bound_socket(end: Endpoint, kind: int, tos: int) -> socket.socket:
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, kind)
        try:
            if tos:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            sock.bind((end.address, 0))
        except OSError as exc:
            sock.close()
            where = f" in netns {end.netns}" if end.netns else ""
            raise ProbeError(
                f"{end.address}{where}: cannot bind ({exc.strerror}); is the address on this machine?"
            ) from None
        return sock

    return in_netns(end.netns, make)


# ---- one probe ---------------------------------------------------------------------------------------------------


def _sockets(spec: ProbeSpec, kind: int) -> tuple[socket.socket, socket.socket]:
    """The probe's two sockets, the destination's first (bound before anything is sent), then the source's."""
    far = bound_socket(spec.dst, kind, spec.tos)
    try:
        return far, bound_socket(spec.src, kind, spec.tos)
    except BaseException:
        far.close()
        raise


def mac(key: bytes, data: bytes) -> bytes:
    """The authentication tag of a probe's header under the job's key (HMAC-SHA256, first MAC_SIZE bytes)."""
    return hmac.new(key, data, hashlib.sha256).digest()[:MAC_SIZE]


def signed(key: bytes | None, data: bytes) -> bytes:
    return data if key is None else data + mac(key, data)


def verified(key: bytes | None, data: bytes, size: int) -> bool:
    """Whether data starts with a header of `size` bytes and (with a key) its tag."""
    if key is None:
        return len(data) >= size
    return len(data) >= size + MAC_SIZE and hmac.compare_digest(mac(key, data[:size]), data[size : size + MAC_SIZE])


def echo_loop(
    client: socket.socket,
    target: tuple[str, int],
    s: ProbeSettings,
    probe_id: int,
    *,
    key: bytes | None = None,
    responder: socket.socket | None = None,
) -> list[float]:
    """The round-trip times (us) of ``s.count`` datagrams sent from client to target, ``s.interval_s`` apart, of
    those echoed within ``s.timeout_s`` of the last send. With a key every datagram carries its tag and only echoes
    whose tag checks count. With a responder (this process's own far end) its datagrams are echoed here too, to
    this probe's client only."""
    client.setblocking(False)
    source = client.getsockname()
    head = HEADER.size + (MAC_SIZE if key is not None else 0)
    pad = b"\0" * max(0, s.size - head)
    socks = [client] if responder is None else [responder, client]
    rtts: list[float] = []
    seen: set[int] = set()
    sent = 0
    start = time.monotonic()
    deadline = start + s.count * s.interval_s + s.timeout_s
    while True:
        now = time.monotonic()
        if sent < s.count and now >= start + sent * s.interval_s:
            with contextlib.suppress(OSError):  # unreachable, no route, a full buffer: the datagram is lost
                client.sendto(signed(key, HEADER.pack(probe_id, sent, time.perf_counter())) + pad, target)
            sent += 1
            continue
        if now >= deadline or len(seen) >= s.count:
            break
        wait = deadline - now if sent >= s.count else max(0.0, start + sent * s.interval_s - now)
        readable, _, _ = select.select(socks, [], [], wait)
        for sock in readable:
            try:
                data, peer = sock.recvfrom(MAX_SIZE)
            except OSError:  # an ICMP error queued on the socket: nothing came back
                continue
            if sock is responder:
                if peer == source:  # echoes go to this probe's own client only: never a reflector
                    with contextlib.suppress(OSError):
                        sock.sendto(data, peer)
            elif verified(key, data, HEADER.size):
                pid, seq, then = HEADER.unpack_from(data)
                if pid == probe_id and seq < s.count and seq not in seen:
                    seen.add(seq)
                    rtts.append((time.perf_counter() - then) * 1e6)
    return rtts


def _latency(spec: ProbeSpec, s: ProbeSettings, probe_id: int) -> tuple[list[float], int]:
    responder, client = _sockets(spec, socket.SOCK_DGRAM)
    with responder, client:
        responder.setblocking(False)
        return echo_loop(client, responder.getsockname(), s, probe_id, responder=responder), s.count


def receive_stream(conn: socket.socket, nbytes: int, stop_at: float) -> tuple[int, float, float]:
    """Up to nbytes read from conn until stop_at (monotonic): (bytes, first chunk's and last chunk's
    perf_counter)."""
    got, first, last = 0, 0.0, 0.0
    while got < nbytes:
        left = stop_at - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(1 << 16)
        except OSError:
            break
        if not chunk:
            break
        if not got:
            first = time.perf_counter()
        got += len(chunk)
        last = time.perf_counter()
    return got, first, last


def send_stream(client: socket.socket, target: tuple[str, int], nbytes: int, stop_at: float, head: bytes = b"") -> None:
    """Connect to target and send head, then nbytes (until stop_at); errors end it (the receiver counts)."""
    with contextlib.suppress(OSError):
        client.settimeout(min(1.0, max(0.01, stop_at - time.monotonic())))  # a live path answers a SYN at once
        client.connect(target)
        client.settimeout(max(0.01, stop_at - time.monotonic()))
        if head:
            client.sendall(head)
        block = b"\0" * (1 << 16)
        left = nbytes
        while left > 0 and time.monotonic() < stop_at:
            left -= client.send(block[: min(left, len(block))])


def stream_rate(got: int, first: float, last: float, s: ProbeSettings) -> float:
    """Gbit/s of a received stream: the bytes after the first chunk over the first-to-last span; a stream cut by
    the timeout: what arrived over the whole window."""
    if got == 0:
        return 0.0
    # The first chunk's bytes arrived before the clock started: time the rest (at least one chunk's worth).
    span = last - first
    if got < s.bandwidth_bytes:
        span = s.bandwidth_timeout_s
    return max(0.0, got * 8 / max(span, 1e-6) / 1e9)


def _bandwidth(spec: ProbeSpec, s: ProbeSettings) -> float:
    listener, client = _sockets(spec, socket.SOCK_STREAM)
    got: dict[str, tuple[int, float, float]] = {}
    stop_at = time.monotonic() + s.bandwidth_timeout_s

    def receive() -> None:
        while True:  # only this probe's own client is read: anyone else who connects is closed
            listener.settimeout(max(0.01, stop_at - time.monotonic()))
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            if peer == source:
                break
            conn.close()
        with conn:
            got["stream"] = receive_stream(conn, s.bandwidth_bytes, stop_at)

    source = client.getsockname()
    with listener, client:
        listener.listen(1)
        reader = threading.Thread(target=receive, name="netprobe-recv", daemon=True)
        reader.start()
        send_stream(client, listener.getsockname(), s.bandwidth_bytes, stop_at)
        reader.join(max(0.0, stop_at - time.monotonic()) + 1.0)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
    return stream_rate(*got.get("stream", (0, 0.0, 0.0)), s)


def run_probe(spec: ProbeSpec, settings: ProbeSettings, probe_id: int = 0) -> ProbeResult:
    """One probe, measured; set-up errors become a result with ``error`` (nothing measured)."""
    try:
        rtts, sent = _latency(spec, settings, PROBE_MAGIC | probe_id)
        # A path that echoed nothing is not timed for throughput (its connection would only wait out the timeout).
        bandwidth = _bandwidth(spec, settings) if settings.bandwidth_bytes and rtts else None
    except ProbeError as exc:
        return not_run(spec, str(exc))
    return measured(spec, rtts, sent, bandwidth)


def not_run(spec: ProbeSpec, why: str) -> ProbeResult:
    """A probe that could not be set up: no measurement, and why."""
    return ProbeResult(spec.src_nic, spec.dst_nic, None, 1.0, spine=spec.spine, error=why[:500])


def measured(spec: ProbeSpec, rtts: Sequence[float], sent: int, bandwidth: float | None) -> ProbeResult:
    """A probe's result from its echoes' round-trip times (of ``sent``) and its throughput (None: not timed)."""
    return ProbeResult(
        spec.src_nic, spec.dst_nic, round(latency_of(rtts), 2) if rtts else None, round(1 - len(rtts) / sent, 6),
        None if bandwidth is None else round(bandwidth, 6), spec.spine, sent, len(rtts),
    )  # fmt: skip


def latency_of(rtts: Sequence[float]) -> float:
    """The probe's latency from its echoes' round-trip times: their lower quartile. On a shared CPU the scheduler
    adds its jitter to some echoes (the upper tail), while a slow path delays them all; the lower quartile keeps
    the second and drops most of the first."""
    ordered = sorted(rtts)
    return ordered[(len(ordered) - 1) // 4]


def probe_specs(endpoints: Mapping[str, Any], pairs: Iterable[tuple[str, str, str | None]]) -> list[ProbeSpec]:
    """The probes of pairs (src_nic, dst_nic, via_spine) at endpoints ``{"nics": {nic: {"address", "netns"?}},
    "spines": {spine: {"tos"}}}``: a pair pinned to a spine with a TOS carries it and names the spine; a spine
    without one cannot be pinned: its pair goes unpinned (ECMP) and names no spine."""
    nics, spines = endpoints["nics"], endpoints.get("spines") or {}
    out = []
    for src, dst, via in pairs:
        route = spines.get(via) if via else None
        out.append(ProbeSpec(
            src, dst, Endpoint(nics[src]["address"], nics[src].get("netns")),
            Endpoint(nics[dst]["address"], nics[dst].get("netns")),
            tos=int(route["tos"]) if route else 0, spine=via if route else None,
        ))  # fmt: skip
    return out


def disjoint_rounds(specs: Sequence[ProbeSpec]) -> list[list[int]]:
    """The probes' indices in rounds where no two probes of a round share a NIC (greedy, in order): throughput
    probes of one round do not compete for a NIC's rate."""
    rounds: list[tuple[set[str], list[int]]] = []
    for i, spec in enumerate(specs):
        for used, members in rounds:
            if spec.src_nic not in used and spec.dst_nic not in used:
                used.update((spec.src_nic, spec.dst_nic))
                members.append(i)
                break
        else:
            rounds.append(({spec.src_nic, spec.dst_nic}, [i]))
    return [members for _, members in rounds]


def run_probes(
    specs: Sequence[ProbeSpec],
    settings: ProbeSettings,
    *,
    concurrency: int = 8,
    on_done: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> list[ProbeResult]:
    """Every probe, in the order given. Latency probes run ``concurrency`` at a time; with throughput asked for,
    probes run one round of NIC-disjoint probes at a time, at most ``concurrency`` at once, so that no two share a
    NIC (they may still share a leaf-spine link: the caller's plan decides)."""
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency: {concurrency}; accepted: 1 to {MAX_CONCURRENCY}")
    results: list[ProbeResult | None] = [None] * len(specs)
    done = 0
    groups: Iterable[list[int]] = disjoint_rounds(specs) if settings.bandwidth_bytes else [list(range(len(specs)))]
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="netprobe") as pool:
        for group in groups:
            for start in range(0, len(group), concurrency):
                if stop is not None and stop.is_set():
                    raise InterruptedError(f"stopped after {done} of {len(specs)} probes")
                batch = group[start : start + concurrency]
                for i, result in zip(batch, pool.map(lambda i: run_probe(specs[i], settings, i), batch), strict=True):
                    results[i] = result
                    done += 1
                if on_done is not None:
                    on_done(done, len(specs))
    return [r for r in results if r is not None]
