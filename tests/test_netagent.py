"""The probe agents of run_network_probes on Slurm (servers/diagnostics/netagent.py), here without Slurm: agents
as threads of this process, each on its own loopback addresses, with a stand-in for torch.distributed; and what a
responder does with what nobody signed. The Slurm run itself is in tests/test_fault_testbed.py."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

import pytest

from servers.diagnostics import netagent, netprobe
from servers.diagnostics.netprobe import Endpoint, ProbeSettings, ProbeSpec

pytestmark = pytest.mark.timeout(60)


class Comm:
    """all_gather and barrier among threads (what torch.distributed gives the agents under torchrun)."""

    def __init__(self, world: int) -> None:
        self.slots: list[Any] = [None] * world
        self.gate = threading.Barrier(world, timeout=30)

    def rank(self, r: int) -> Any:
        comm = self

        class Rank:
            def all_gather(self, obj: Any) -> list[Any]:
                comm.slots[r] = obj
                comm.gate.wait()
                out = list(comm.slots)
                comm.gate.wait()
                return out

            def barrier(self) -> None:
                comm.gate.wait()

        return Rank()


def plan_of(pairs: list[tuple[str, str]], nics: dict[str, tuple[str, str]], **settings: Any) -> dict:
    """A plan as netrun.agent_plan writes it: nics {nic: (address, host)}."""
    probes = [
        {**asdict(ProbeSpec(a, b, Endpoint(nics[a][0]), Endpoint(nics[b][0]))), "src_host": nics[a][1],
         "dst_host": nics[b][1]}
        for a, b in pairs
    ]  # fmt: skip
    return {"probes": probes, "settings": asdict(ProbeSettings(**settings)), "concurrency": 2, "deadline_s": 30}


def run_agents(plan: dict, key: bytes, hosts: list[str]) -> dict:
    comm = Comm(len(hosts))
    out: dict[int, Any] = {}

    def agent(r: int) -> None:
        out[r] = netagent.run_agent(plan, key, r, hosts, comm.rank(r))

    threads = [threading.Thread(target=agent, args=(r,)) for r in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    assert all(r in out for r in range(len(hosts))), "an agent did not finish"
    assert all(out[r] is None for r in range(1, len(hosts)))
    return out[0]


NICS = {"a0": ("127.0.0.21", "h1"), "a1": ("127.0.0.22", "h1"), "b0": ("127.0.0.23", "h2"), "b1": ("127.0.0.24", "h2")}


def test_agents_on_two_hosts_probe_each_others_nics_and_their_own() -> None:
    """Every pair measured by the agent of its source's host against the responder of its destination's: across
    hosts and within one; throughput timed; the responders echoed exactly the datagrams sent."""
    pairs = [("a0", "b0"), ("b0", "a0"), ("a1", "b1"), ("b1", "a1"), ("a0", "a1")]
    plan = plan_of(pairs, NICS, count=10, interval_s=0.001, bandwidth_bytes=1 << 18)
    done = run_agents(plan, secrets.token_bytes(32), ["h1", "h2"])
    rows = done["results"]
    assert [(r["src_nic"], r["dst_nic"]) for r in rows] == pairs
    assert all(r["error"] is None and r["loss_rate"] == 0 and r["received"] == 10 for r in rows), rows
    assert all(r["latency_us"] > 0 and r["bandwidth_gbps"] > 0 for r in rows), rows
    assert done["hosts"] == ["h1", "h2"] and done["echoed"] == 10 * len(pairs) and done["refused"] == 0


def test_a_host_without_an_agent_and_an_address_not_here_are_not_run_and_say_why() -> None:
    nics = {**NICS, "c0": ("127.0.0.25", "h3"), "x0": ("192.0.2.1", "h2")}  # TEST-NET-1: on no machine
    pairs = [("a0", "b0"), ("a0", "c0"), ("c0", "a0"), ("a0", "x0")]
    done = run_agents(plan_of(pairs, nics, count=5), secrets.token_bytes(32), ["h1", "h2"])
    rows = done["results"]
    assert rows[0]["error"] is None and rows[0]["loss_rate"] == 0
    assert "no agent ran on h3" in rows[1]["error"] and "no agent ran on h3" in rows[2]["error"]
    assert "cannot listen" in rows[3]["error"] and "192.0.2.1" in rows[3]["error"]
    assert all(r["latency_us"] is None for r in rows[1:])


def test_a_responder_echoes_only_signed_datagrams_once_and_counts_only_signed_streams() -> None:
    """Off loopback a responder is a listener anyone on the fabric can reach: unsigned, wrongly signed and replayed
    datagrams get nothing back; a stream without a signed header, or announcing more than a probe may send, is
    closed unanswered; a signed one is counted and answered."""
    key = secrets.token_bytes(32)
    settings = ProbeSettings(count=5, bandwidth_bytes=1 << 16, bandwidth_timeout_s=2)
    end = Endpoint("127.0.0.31")
    with netagent.Responder(key, settings, {"n": end}, tcp=True, deadline=time.monotonic() + 30) as responder:
        udp_port, tcp_port = responder.ports["n"]
        assert udp_port and tcp_port
        header = netprobe.HEADER.pack(netprobe.PROBE_MAGIC | 7, 0, 1.0)
        good = netprobe.signed(key, header) + b"\0" * 24
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.32", 0))
            s.settimeout(0.3)
            for datagram in (header + b"\0" * 40, netprobe.signed(secrets.token_bytes(32), header), b"x"):
                s.sendto(datagram, ("127.0.0.31", udp_port))
                with pytest.raises(TimeoutError):
                    s.recvfrom(2048)
            s.sendto(good, ("127.0.0.31", udp_port))
            assert s.recvfrom(2048)[0] == good
            s.sendto(good, ("127.0.0.31", udp_port))  # the same datagram again: a replay
            with pytest.raises(TimeoutError):
                s.recvfrom(2048)

        def stream(head: bytes, body: int) -> bytes:
            """What the responder answers (b"": closed unanswered; a reset is that too, with bytes unread)."""
            with socket.create_connection(("127.0.0.31", tcp_port), timeout=5) as c:
                try:
                    c.sendall(head + b"\0" * body)
                    c.shutdown(socket.SHUT_WR)
                    return c.recv(64)
                except ConnectionResetError:
                    return b""

        unsigned = netagent.STREAM_HEAD.pack(1, 1 << 16)
        assert stream(unsigned + b"\0" * netprobe.MAC_SIZE, 1 << 16) == b""
        assert stream(netprobe.signed(key, netagent.STREAM_HEAD.pack(2, netprobe.MAX_BANDWIDTH_BYTES + 1)), 100) == b""
        reply = stream(netprobe.signed(key, netagent.STREAM_HEAD.pack(3, 1 << 16)), 1 << 16)
        got, span = netagent.STREAM_REPLY.unpack(reply)
        assert got == 1 << 16 and span >= 0
        assert responder.echoed == 1 and responder.refused == 6
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # stopped: nothing listens any more
        s.bind(("127.0.0.31", udp_port))
