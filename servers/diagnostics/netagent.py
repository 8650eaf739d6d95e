"""Network probes across nodes: one agent per node, both ends of every probe on the pair's own nodes
(run_network_probes with backend slurm). Run as a file by torchrun, one rank per node, as a Slurm job:

    torchrun ... netagent.py --plan JOB/agent-plan.json --out JOB/agent-results.json

The plan (written by netrun.py into the job's folder) holds the probes (each NIC's address, namespace and host),
the probe settings and the concurrency; the key (``agent.key`` beside it, mode 0600, 32 random bytes made for this
job) never travels in argv or on the wire. Every agent:

1. serves the NICs of its host that some probe targets: a UDP echo socket and, with throughput asked for, a TCP
   listener, each bound to that NIC's address (in its namespace) on a port the kernel picks, for this job only;
2. tells the others its ports (torch.distributed gloo, over torchrun's store), then runs the probes whose source
   NIC is on its host, in the same batches as netprobe.run_probes (NIC-disjoint rounds with throughput, at most
   ``concurrency`` probes at once over all agents, a barrier after each batch);
3. stops serving, and rank 0 writes every probe's result, in plan order, to ``--out``.

The responders listen off loopback, so they trust nothing unauthenticated: a datagram is echoed only when its
header's tag checks (HMAC-SHA256 under the job's key, netprobe.mac), and at most once per (probe, sequence), so a
captured datagram replayed gets nothing back; a TCP stream is counted only after a signed header announcing at most
netprobe.MAX_BANDWIDTH_BYTES, from at most netprobe.MAX_CONCURRENCY connections at once, each for at most the
throughput timeout. Nothing listens after the agent's probes are done or its deadline has passed.

Plain module, standard library (torch.distributed only in main); no MCP imports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by torchrun: the package's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from servers.diagnostics import netprobe
from servers.diagnostics.netprobe import Endpoint, ProbeResult, ProbeSettings, ProbeSpec

KEY_FILE = "agent.key"
PLAN_FILE = "agent-plan.json"
RESULTS_FILE = "agent-results.json"
KEY_BYTES = 32
STREAM_HEAD = struct.Struct("!QQ")  # probe id, bytes to come
STREAM_REPLY = struct.Struct("!Qd")  # bytes received, first-to-last chunk (s)
HEAD_WAIT_S = 2.0  # a connection must send its signed header within this


class Responder:
    """The far ends of this host's probes: per NIC a UDP echo socket and (tcp) a TCP listener, served by one thread
    until stop() or the deadline. ``ports``: {nic: [udp, tcp or None]}; ``errors``: {nic: why it is not served}."""

    def __init__(
        self, key: bytes, settings: ProbeSettings, ends: Mapping[str, Endpoint], *, tcp: bool, deadline: float
    ) -> None:
        self.key, self.settings, self.deadline = key, settings, deadline
        self.ports: dict[str, list[int | None]] = {}
        self.errors: dict[str, str] = {}
        self._udp: list[socket.socket] = []
        self._tcp: list[socket.socket] = []
        self._stop = threading.Event()
        self._streams = threading.BoundedSemaphore(netprobe.MAX_CONCURRENCY)
        self._seen: set[tuple[int, int]] = set()
        self.echoed = self.refused = 0
        for nic, end in ends.items():
            try:
                udp = netprobe.bound_socket(end, socket.SOCK_DGRAM, 0)
            except netprobe.ProbeError as exc:
                self.errors[nic] = f"the responder of {nic} cannot listen: {exc}"
                continue
            udp.setblocking(False)
            self._udp.append(udp)
            port: int | None = None
            if tcp:
                try:
                    listener = netprobe.bound_socket(end, socket.SOCK_STREAM, 0)
                except netprobe.ProbeError as exc:
                    self.errors[nic] = f"the responder of {nic} cannot listen for throughput: {exc}"
                else:
                    listener.listen(netprobe.MAX_CONCURRENCY)
                    listener.setblocking(False)
                    self._tcp.append(listener)
                    port = listener.getsockname()[1]
            self.ports[nic] = [udp.getsockname()[1], port]
        self._thread = threading.Thread(target=self._serve, name="netagent-responder", daemon=True)

    def __enter__(self) -> Responder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        for sock in self._udp + self._tcp:
            sock.close()

    def _serve(self) -> None:
        socks = self._udp + self._tcp
        tcp = set(self._tcp)
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            readable, _, _ = select.select(socks, [], [], 0.2)
            for sock in readable:
                if sock in tcp:
                    self._accept(sock)
                else:
                    self._echo(sock)

    def _echo(self, sock: socket.socket) -> None:
        try:
            data, peer = sock.recvfrom(netprobe.MAX_SIZE)
        except OSError:
            return
        if not netprobe.verified(self.key, data, netprobe.HEADER.size):
            self.refused += 1
            return
        pid, seq, _ = netprobe.HEADER.unpack_from(data)
        if seq >= netprobe.MAX_COUNT or (pid, seq) in self._seen:
            self.refused += 1
            return
        self._seen.add((pid, seq))
        self.echoed += 1
        with contextlib.suppress(OSError):
            sock.sendto(data, peer)

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        if not self._streams.acquire(blocking=False):  # at most MAX_CONCURRENCY streams at once
            conn.close()
            return
        threading.Thread(target=self._stream, args=(conn,), name="netagent-stream", daemon=True).start()

    def _stream(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.setblocking(True)
                head = _read_exactly(conn, STREAM_HEAD.size + netprobe.MAC_SIZE, time.monotonic() + HEAD_WAIT_S)
                if head is None or not netprobe.verified(self.key, head, STREAM_HEAD.size):
                    self.refused += 1
                    return
                _, nbytes = STREAM_HEAD.unpack_from(head)
                if not 0 < nbytes <= netprobe.MAX_BANDWIDTH_BYTES:
                    self.refused += 1
                    return
                stop_at = min(self.deadline, time.monotonic() + self.settings.bandwidth_timeout_s)
                got, first, last = netprobe.receive_stream(conn, nbytes, stop_at)
                with contextlib.suppress(OSError):
                    conn.settimeout(1.0)
                    conn.sendall(STREAM_REPLY.pack(got, last - first))
        finally:
            self._streams.release()


def _read_exactly(conn: socket.socket, n: int, stop_at: float) -> bytes | None:
    data = b""
    while len(data) < n:
        left = stop_at - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def probe_remote(
    spec: ProbeSpec, ports: Sequence[int | None], settings: ProbeSettings, key: bytes, probe_id: int
) -> ProbeResult:
    """One probe from this host's source NIC to a far agent's responder at ``ports`` ([udp, tcp or None])."""
    pid = netprobe.PROBE_MAGIC | probe_id
    udp_port, tcp_port = ports
    try:
        with netprobe.bound_socket(spec.src, socket.SOCK_DGRAM, spec.tos) as client:
            assert udp_port is not None
            rtts = netprobe.echo_loop(client, (spec.dst.address, udp_port), settings, pid, key=key)
        bandwidth = None
        if settings.bandwidth_bytes and rtts:  # a path that echoed nothing is not timed
            bandwidth = 0.0
            if tcp_port is not None:
                with netprobe.bound_socket(spec.src, socket.SOCK_STREAM, spec.tos) as stream:
                    stop_at = time.monotonic() + settings.bandwidth_timeout_s
                    head = netprobe.signed(key, STREAM_HEAD.pack(pid, settings.bandwidth_bytes))
                    netprobe.send_stream(stream, (spec.dst.address, tcp_port), settings.bandwidth_bytes, stop_at, head)
                    with contextlib.suppress(OSError):
                        stream.shutdown(socket.SHUT_WR)
                    reply = _read_exactly(stream, STREAM_REPLY.size, stop_at + 2.0)
                if reply is not None:
                    got, span = STREAM_REPLY.unpack(reply)
                    bandwidth = netprobe.stream_rate(got, 0.0, span, settings)
    except netprobe.ProbeError as exc:
        return netprobe.not_run(spec, str(exc))
    return netprobe.measured(spec, rtts, settings.count, bandwidth)


# ---- the plan ------------------------------------------------------------------------------------------------------


def plan_probes(plan: Mapping[str, Any]) -> tuple[list[ProbeSpec], list[str], list[str]]:
    """The plan's probes, and each probe's source and destination host."""
    specs, src_hosts, dst_hosts = [], [], []
    for p in plan["probes"]:
        specs.append(ProbeSpec(
            p["src_nic"], p["dst_nic"], Endpoint(p["src"]["address"], p["src"].get("netns")),
            Endpoint(p["dst"]["address"], p["dst"].get("netns")), tos=int(p.get("tos") or 0), spine=p.get("spine"),
        ))  # fmt: skip
        src_hosts.append(p["src_host"])
        dst_hosts.append(p["dst_host"])
    return specs, src_hosts, dst_hosts


def batches(specs: Sequence[ProbeSpec], settings: ProbeSettings, concurrency: int) -> list[list[int]]:
    """netprobe.run_probes' batches: NIC-disjoint rounds with throughput, then at most concurrency at once."""
    groups = netprobe.disjoint_rounds(specs) if settings.bandwidth_bytes else [list(range(len(specs)))]
    return [g[i : i + concurrency] for g in groups for i in range(0, len(g), concurrency)]


def run_agent(plan: Mapping[str, Any], key: bytes, rank: int, hosts: Sequence[str], comm: Any) -> dict | None:
    """This agent's part (rank ``rank`` of the agents on ``hosts``, by rank); comm has all_gather(obj) -> list and
    barrier(). Rank 0 returns {"results": every probe's result as a dict, in plan order, "hosts", "echoed": datagrams
    the responders echoed, "refused": datagrams and streams they refused}; the others None."""
    settings = ProbeSettings(**plan["settings"])
    concurrency = int(plan["concurrency"])
    specs, src_hosts, dst_hosts = plan_probes(plan)
    host = hosts[rank]
    owner = hosts.index(host) == rank  # one agent serves a host (two ranks on one host: the first)
    deadline = time.monotonic() + float(plan["deadline_s"])
    ends = {s.dst_nic: s.dst for s, h in zip(specs, dst_hosts, strict=True) if owner and h == host}
    results: dict[int, dict] = {}
    with Responder(key, settings, ends, tcp=settings.bandwidth_bytes > 0, deadline=deadline) as responder:
        served: dict[str, list[int | None]] = {}
        refused: dict[str, str] = {}
        for ports, errors in comm.all_gather((responder.ports, responder.errors)):
            served.update(ports)
            refused.update(errors)
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="netagent") as pool:
            for batch in batches(specs, settings, concurrency):
                mine = [i for i in batch if owner and src_hosts[i] == host]

                def one(i: int) -> ProbeResult:
                    spec = specs[i]
                    if dst_hosts[i] not in hosts:
                        return netprobe.not_run(spec, f"no agent ran on {dst_hosts[i]} (the host of {spec.dst_nic})")
                    if spec.dst_nic not in served:
                        why = refused.get(spec.dst_nic, f"{spec.dst_nic} is not served")
                        return netprobe.not_run(spec, why)
                    if time.monotonic() > deadline:
                        return netprobe.not_run(spec, "the agents' deadline passed before this probe")
                    return probe_remote(spec, served[spec.dst_nic], settings, key, i)

                for i, result in zip(mine, pool.map(one, mine), strict=True):
                    results[i] = asdict(result)
                comm.barrier()
        counts = comm.all_gather({"echoed": responder.echoed, "refused": responder.refused})
    merged: dict[int, dict] = {}
    for part in comm.all_gather(results):
        merged.update(part)
    if rank != 0:
        return None
    for i in [i for i in range(len(specs)) if i not in merged]:  # a source host no agent ran on
        merged[i] = asdict(
            netprobe.not_run(specs[i], f"no agent ran on {src_hosts[i]} (the host of {specs[i].src_nic})")
        )
    return {
        "results": [merged[i] for i in range(len(specs))], "hosts": list(hosts),
        "echoed": sum(c["echoed"] for c in counts), "refused": sum(c["refused"] for c in counts),
    }  # fmt: skip


class _Gloo:
    """all_gather and barrier over torch.distributed (the process group torchrun set up)."""

    def __init__(self, dist: Any, world: int) -> None:
        self.dist, self.world = dist, world

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        self.dist.barrier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netagent.py")
    parser.add_argument("--plan", required=True, help="the plan's JSON file (its key beside it)")
    parser.add_argument("--out", required=True, help="where rank 0 writes the results")
    args = parser.parse_args(argv)
    plan_path = Path(args.plan)
    plan = json.loads(plan_path.read_text())
    key = (plan_path.parent / KEY_FILE).read_bytes()
    if len(key) != KEY_BYTES:
        print(f"netagent: {plan_path.parent / KEY_FILE} is not a key of {KEY_BYTES} bytes", file=sys.stderr)
        return 2

    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=float(plan["deadline_s"]) + 60))
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = _Gloo(dist, world)
    hosts = comm.all_gather(os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    out = run_agent(plan, key, rank, hosts, comm)
    if out is not None:
        target = Path(args.out)
        partial = target.with_name(target.name + ".part")
        partial.write_text(json.dumps(out))
        partial.replace(target)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
