"""A fault-injection testbed on one machine: a rail-optimised two-tier fabric of network namespaces, and real faults
injected into it. Plain module (no MCP imports); needs root and iproute2 (``ip``, ``tc``).

Layout (defaults: 8 nodes x 2 rails, 2 leaves per rail, 2 spines):
- a node is a namespace with one NIC per rail (``r0``, ``r1``: veths), each NIC on its rail's leaf for the node's
  group (nodes are split evenly over a rail's leaves); source-based policy routing sends what a NIC's address sends
  out of that NIC;
- a leaf is a namespace with a bridge for its nodes (the leaf's subnet, its gateway address) and one routed uplink
  (a veth, a /30) to every spine; traffic to another leaf is spread over the spines by ECMP (a multipath route,
  hashed on the five-tuple: fib_multipath_hash_policy 1), unless its IP TOS byte pins a spine (``ip rule tos``: the
  pin a probe of plan_network_probes' ``via_spine`` uses);
- a spine is a namespace routing every leaf's subnet over its link to that leaf.
Every node port is rate-capped (an htb class, both directions: ``nic_mbit``, default 400 Mbit/s) as a line rate, so
a clean probe's throughput is the fabric's and not this machine's CPU's. Addresses are in 198.18.0.0/15 (RFC
2544's range for benchmarking): rail r's leaves hold 198.(18+r).k.0/24, the leaf-spine links 198.19.(128+L).(4s)/30.
A socket bound to no address leaves over rail 0 for rail 0's addresses (each rail's /16 is routed over it). Nothing
is connected to the host's namespace: no traffic leaves the testbed.

Faults, all done by the kernel: ``nic_down`` (the NIC's link down), ``node_down`` (every NIC of the node down),
``uplink_down`` (a leaf-spine link down), ``nic_slow`` / ``link_slow`` (htb at ``rate_mbit`` on both ends),
``spine_slow`` (htb on every port of the spine). A rate cap also makes real loss and queueing delay for traffic
above the rate; this kernel has no netem, so no fault adds delay or random loss to light traffic.

``Testbed.build()`` writes nothing outside its namespaces; ``topology()`` and ``endpoints()`` give what
plan_network_probes, run_network_probes and localize_network_fault read. ``close()`` removes every namespace it made
(a namespace's removal takes its veths with it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servers.diagnostics.netmodels import link_name

FaultKind = Literal["nic_down", "node_down", "uplink_down", "nic_slow", "link_slow", "spine_slow"]
FAULT_KINDS: tuple[FaultKind, ...] = ("nic_down", "node_down", "uplink_down", "nic_slow", "link_slow", "spine_slow")
# What the localizer should name for each fault kind: (component kind, symptom family).
FAULT_COMPONENT: dict[str, str] = {
    "nic_down": "nic", "node_down": "node", "uplink_down": "leaf_spine_link", "nic_slow": "nic",
    "link_slow": "leaf_spine_link", "spine_slow": "spine",
}  # fmt: skip
MAX_NODES = 64
MAX_RAILS = 4
MAX_SPINES = 8
TOS_STEP = 4  # spine s is pinned by TOS 4 * (s + 1)


class TestbedError(Exception):
    """The testbed could not be built or changed: the command, and what it printed."""

    __test__ = False


def available() -> str | None:
    """None when a testbed can be built here, else why not."""
    if os.geteuid() != 0:
        return "the testbed needs root (it makes network namespaces and veths)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian: iproute2)"
    return None


@dataclass(frozen=True)
class _Port:
    netns: str
    dev: str


@dataclass
class Fault:
    kind: FaultKind
    target: str  # the component's name as the topology names it
    rate_mbit: float | None = None
    down: list[_Port] = field(default_factory=list)  # ports set down, brought up by clear()
    slowed: list[tuple[_Port, float | None]] = field(default_factory=list)  # ports rate-limited, and their old rate


class Testbed:
    """The fabric; build() makes it, close() removes it (also as a context manager)."""

    __test__ = False  # not a pytest class

    def __init__(
        self, nodes: int = 8, rails: int = 2, leaves_per_rail: int = 2, spines: int = 2, *, nic_mbit: float = 400,
        prefix: str | None = None,
    ) -> None:  # fmt: skip
        if not 2 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes: {nodes}; accepted: 2 to {MAX_NODES}")
        if not 1 <= rails <= MAX_RAILS:
            raise ValueError(f"rails: {rails}; accepted: 1 to {MAX_RAILS}")
        if not 1 <= leaves_per_rail <= nodes or nodes % leaves_per_rail:
            raise ValueError(f"leaves_per_rail: {leaves_per_rail}; accepted: a divisor of nodes ({nodes})")
        if not 1 <= spines <= MAX_SPINES:
            raise ValueError(f"spines: {spines}; accepted: 1 to {MAX_SPINES}")
        if not 1 <= nic_mbit <= 10_000:
            raise ValueError(f"nic_mbit: {nic_mbit}; accepted: 1 to 10000")
        self.nodes, self.rails, self.leaves_per_rail, self.spines = nodes, rails, leaves_per_rail, spines
        self.nic_mbit = nic_mbit
        self.prefix = prefix or f"tb{secrets.token_hex(3)}"
        self.made: list[str] = []
        self.faults: list[Fault] = []

    # ---- names -------------------------------------------------------------------------------------------------

    def node_name(self, i: int) -> str:
        return f"node{i}"

    def nic_name(self, i: int, r: int) -> str:
        return f"node{i}-r{r}"

    def leaf_index(self, i: int, r: int) -> int:
        return r * self.leaves_per_rail + i // (self.nodes // self.leaves_per_rail)

    def leaf_name(self, leaf: int) -> str:
        return f"leaf{leaf // self.leaves_per_rail}-{leaf % self.leaves_per_rail}"

    def spine_name(self, s: int) -> str:
        return f"spine{s}"

    def ns(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def nic_address(self, i: int, r: int) -> str:
        return f"198.{18 + r}.{self.leaf_index(i, r) % self.leaves_per_rail}.{10 + i}"

    def _gateway(self, leaf: int) -> str:
        return f"198.{18 + leaf // self.leaves_per_rail}.{leaf % self.leaves_per_rail}.1"

    def _subnet(self, leaf: int) -> str:
        return f"198.{18 + leaf // self.leaves_per_rail}.{leaf % self.leaves_per_rail}.0/24"

    def _link_address(self, leaf: int, s: int, spine_side: bool) -> str:
        return f"198.19.{128 + leaf}.{4 * s + (2 if spine_side else 1)}"

    # ---- what the tools read -----------------------------------------------------------------------------------

    def topology(self) -> dict[str, Any]:
        nodes = [
            {"name": self.node_name(i), "nics": [
                {"name": self.nic_name(i, r), "rail": r, "leaf": self.leaf_name(self.leaf_index(i, r))}
                for r in range(self.rails)
            ]}
            for i in range(self.nodes)
        ]  # fmt: skip
        spines = [self.spine_name(s) for s in range(self.spines)]
        switches = [
            {"name": self.leaf_name(leaf), "tier": "leaf", "uplinks": spines}
            for leaf in range(self.rails * self.leaves_per_rail)
        ]
        switches += [{"name": name, "tier": "spine", "uplinks": []} for name in spines]
        return {"nodes": nodes, "switches": switches}

    def endpoints(self) -> dict[str, Any]:
        """Where each NIC's address lives and the TOS byte that pins each spine (run_network_probes' endpoints)."""
        return {
            "nics": {
                self.nic_name(i, r): {"address": self.nic_address(i, r), "netns": self.ns(f"n{i}")}
                for i in range(self.nodes)
                for r in range(self.rails)
            },
            "spines": {self.spine_name(s): {"tos": TOS_STEP * (s + 1)} for s in range(self.spines)},
        }

    def write(self, folder: Path) -> tuple[Path, Path]:
        """topology.json and endpoints.json in folder."""
        folder.mkdir(parents=True, exist_ok=True)
        topo, ends = folder / "topology.json", folder / "endpoints.json"
        topo.write_text(json.dumps(self.topology(), indent=1))
        ends.write_text(json.dumps(self.endpoints(), indent=1))
        return topo, ends

    # ---- building ----------------------------------------------------------------------------------------------

    def _run(self, *argv: str) -> None:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:400]
            raise TestbedError(f"{' '.join(argv)}: exit {done.returncode}: {said}")

    def _netns(self, what: str, *, router: bool) -> str:
        name = self.ns(what)
        self._run("ip", "netns", "add", name)
        self.made.append(name)
        self._run("ip", "-n", name, "link", "set", "lo", "up")
        settings = ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]
        if router:
            settings += ["net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1"]
        self._run("ip", "netns", "exec", name, "sysctl", "-q", "-w", *settings)
        return name

    def _rate(self, port: _Port, mbit: float | None) -> None:
        """The port's egress capped at mbit (None: no cap)."""
        if mbit is None:
            subprocess.run(["tc", "-n", port.netns, "qdisc", "del", "dev", port.dev, "root"], capture_output=True,
                           timeout=30, check=False)  # fmt: skip
            return
        burst = max(16_000, int(mbit * 1e6 / 8 / 250))  # 4 ms of the rate (a 250 Hz tick), at least 16 kB
        # htb with one default class (this kernel has no tc classifiers, and none is needed): a tbf root under a
        # training job's TCP streams stalled now and then (packets left queued, never sent; 1 job in ~10)
        shown = subprocess.run(["tc", "-n", port.netns, "qdisc", "show", "dev", port.dev, "root"],
                               capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if "htb 1:" not in shown.stdout:  # htb cannot be changed in place: made once, then its class is
            self._run("tc", "-n", port.netns, "qdisc", "replace", "dev", port.dev, "root", "handle", "1:", "htb",
                      "default", "1")  # fmt: skip
        self._run("tc", "-n", port.netns, "class", "replace", "dev", port.dev, "parent", "1:", "classid", "1:1",
                  "htb", "rate", f"{mbit:g}mbit", "ceil", f"{mbit:g}mbit", "burst", str(burst), "cburst",
                  str(burst))  # fmt: skip

    def nic_ports(self, i: int, r: int) -> tuple[_Port, _Port]:
        return _Port(self.ns(f"n{i}"), f"r{r}"), _Port(self.ns(f"l{self.leaf_index(i, r)}"), f"p{i}")

    def link_ports(self, leaf: int, s: int) -> tuple[_Port, _Port]:
        return _Port(self.ns(f"l{leaf}"), f"u{s}"), _Port(self.ns(f"s{s}"), f"d{leaf}")

    def build(self) -> Testbed:
        why = available()
        if why:
            raise TestbedError(why)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        leaves = self.rails * self.leaves_per_rail
        for s in range(self.spines):
            self._netns(f"s{s}", router=True)
        for leaf in range(leaves):
            ns = self._netns(f"l{leaf}", router=True)
            self._run("ip", "-n", ns, "link", "add", "name", "br0", "type", "bridge", "stp_state", "0")
            self._run("ip", "-n", ns, "addr", "add", f"{self._gateway(leaf)}/24", "dev", "br0")
            self._run("ip", "-n", ns, "link", "set", "br0", "up")
            for s in range(self.spines):
                up, down = self.link_ports(leaf, s)
                self._run("ip", "-n", up.netns, "link", "add", "name", up.dev, "type", "veth", "peer", "name",
                          down.dev, "netns", down.netns)  # fmt: skip
                self._run("ip", "-n", up.netns, "addr", "add", f"{self._link_address(leaf, s, False)}/30", "dev",
                          up.dev)  # fmt: skip
                self._run("ip", "-n", down.netns, "addr", "add", f"{self._link_address(leaf, s, True)}/30", "dev",
                          down.dev)  # fmt: skip
                self._run("ip", "-n", up.netns, "link", "set", up.dev, "up")
                self._run("ip", "-n", down.netns, "link", "set", down.dev, "up")
                # pinned: TOS 4(s+1) goes through spine s only
                self._run("ip", "-n", ns, "rule", "add", "tos", str(TOS_STEP * (s + 1)), "lookup", str(100 + s))
        for i in range(self.nodes):
            ns = self._netns(f"n{i}", router=False)
            for r in range(self.rails):
                nic, port = self.nic_ports(i, r)
                self._run("ip", "-n", ns, "link", "add", "name", nic.dev, "type", "veth", "peer", "name", port.dev,
                          "netns", port.netns)  # fmt: skip
                self._run("ip", "-n", port.netns, "link", "set", port.dev, "master", "br0")
                self._run("ip", "-n", port.netns, "link", "set", port.dev, "up")
                self._run("ip", "-n", ns, "addr", "add", f"{self.nic_address(i, r)}/24", "dev", nic.dev)
                self._run("ip", "-n", ns, "link", "set", nic.dev, "up")
                self._run("ip", "-n", ns, "rule", "add", "from", self.nic_address(i, r), "lookup", str(10 + r))
                self._rate(nic, self.nic_mbit)
                self._rate(port, self.nic_mbit)
        self._routes()

    def _batch(self, netns: str, commands: list[str]) -> None:
        """Commands of `ip -batch` run in one namespace (one process for all)."""
        if not commands:
            return
        done = subprocess.run(["ip", "-n", netns, "-batch", "-"], input="\n".join(commands) + "\n",
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:400]
            raise TestbedError(f"ip -n {netns} -batch: exit {done.returncode}: {said}")

    def _routes(self) -> None:
        """Every static route, (re)made: a link set down takes the routes through it with it, so clearing a fault
        makes them again (`route replace`: idempotent). Links that are down keep their routes out."""
        down = {port for fault in self.faults for port in fault.down}
        for leaf in range(self.rails * self.leaves_per_rail):
            ns = self.ns(f"l{leaf}")
            live = [s for s in range(self.spines) if _Port(ns, f"u{s}") not in down]
            hops = " ".join(f"nexthop via {self._link_address(leaf, s, True)} dev u{s}" for s in live)
            commands = [f"route replace 198.18.0.0/15 {hops}"] if live else []
            for s in live:
                commands += [
                    f"route replace {self._subnet(leaf)} dev br0 table {100 + s}",
                    f"route replace 198.18.0.0/15 via {self._link_address(leaf, s, True)} table {100 + s}",
                ]
            self._batch(ns, commands)
        for s in range(self.spines):
            self._batch(self.ns(f"s{s}"), [
                f"route replace {self._subnet(leaf)} via {self._link_address(leaf, s, False)}"
                for leaf in range(self.rails * self.leaves_per_rail)
            ])  # fmt: skip
        for i in range(self.nodes):
            commands = []
            for r in range(self.rails):
                if _Port(self.ns(f"n{i}"), f"r{r}") in down:
                    continue
                leaf = self.leaf_index(i, r)
                commands += [
                    f"route replace {self._subnet(leaf)} dev r{r} src {self.nic_address(i, r)} table {10 + r}",
                    f"route replace default via {self._gateway(leaf)} dev r{r} table {10 + r}",
                    # a socket that binds no address (a training job's) reaches rail r's other nodes over rail r
                    f"route replace 198.{18 + r}.0.0/16 via {self._gateway(leaf)} dev r{r} "
                    f"src {self.nic_address(i, r)}",
                ]
            self._batch(self.ns(f"n{i}"), commands)

    def close(self) -> None:
        """Every namespace this testbed made, removed (and with them their veths); faults need no undoing."""
        self.faults.clear()
        while self.made:
            name = self.made.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)

    def __enter__(self) -> Testbed:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- faults ------------------------------------------------------------------------------------------------

    def _nic(self, name: str) -> tuple[int, int]:
        for i in range(self.nodes):
            for r in range(self.rails):
                if self.nic_name(i, r) == name:
                    return i, r
        raise ValueError(f"nic {name!r}: not in this testbed (node0-r0 .. node{self.nodes - 1}-r{self.rails - 1})")

    def _link(self, name: str) -> tuple[int, int]:
        for leaf in range(self.rails * self.leaves_per_rail):
            for s in range(self.spines):
                if link_name(self.leaf_name(leaf), self.spine_name(s)) == name:
                    return leaf, s
        raise ValueError(f"link {name!r}: not in this testbed (LEAF~SPINE, e.g. {link_name('leaf0-0', 'spine0')})")

    def inject(self, kind: str, target: str, rate_mbit: float | None = None) -> Fault:
        """Inject one fault; clear(fault) or clear_all() undoes it."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r}; accepted: {', '.join(FAULT_KINDS)}")
        slow = kind.endswith("_slow")
        if slow and not (rate_mbit and 0 < rate_mbit <= 10_000):
            raise ValueError(f"{kind} needs rate_mbit (0 < rate <= 10000)")
        fault = Fault(kind, target, rate_mbit if slow else None)  # type: ignore[arg-type]
        ports, base = self._fault_ports(kind, target)
        for port in ports:
            if slow:
                self._rate(port, rate_mbit)
                fault.slowed.append((port, base))
            else:
                self._run("ip", "-n", port.netns, "link", "set", port.dev, "down")
                fault.down.append(port)
        self.faults.append(fault)
        return fault

    def _fault_ports(self, kind: str, target: str) -> tuple[list[_Port], float | None]:
        """The ports a fault of this kind on target changes, and their rate before (None: uncapped)."""
        if kind in ("nic_down", "nic_slow"):
            nic, port = self.nic_ports(*self._nic(target))
            return ([nic] if kind == "nic_down" else [nic, port]), self.nic_mbit
        if kind == "node_down":
            i = next((i for i in range(self.nodes) if self.node_name(i) == target), None)
            if i is None:
                raise ValueError(f"node {target!r}: not in this testbed (node0 .. node{self.nodes - 1})")
            return [self.nic_ports(i, r)[0] for r in range(self.rails)], self.nic_mbit
        if kind in ("uplink_down", "link_slow"):
            up, down = self.link_ports(*self._link(target))
            return ([up] if kind == "uplink_down" else [up, down]), None
        s = next((s for s in range(self.spines) if self.spine_name(s) == target), None)
        if s is None:
            raise ValueError(f"spine {target!r}: not in this testbed (spine0 .. spine{self.spines - 1})")
        return [self.link_ports(leaf, s)[1] for leaf in range(self.rails * self.leaves_per_rail)], None

    def _undo(self, fault: Fault) -> None:
        """The fault's ports back as they were; the routes and links are left to _mend."""
        for port in fault.down:
            self._run("ip", "-n", port.netns, "link", "set", port.dev, "up")
        for port, rate in fault.slowed:
            self._rate(port, rate)
        if fault in self.faults:
            self.faults.remove(fault)

    def _mend(self, up: list[_Port]) -> None:
        """After ports were brought up: the routes through them made again, and the links ready."""
        self._routes()
        if up:
            self._wait_up(up)

    def clear(self, fault: Fault) -> None:
        self._undo(fault)
        if fault.down:
            self._mend(fault.down)

    def _wait_up(self, ports: list[_Port], timeout_s: float = 5.0) -> None:
        """Until every port brought up has its carrier (LOWER_UP) and answers on its link: a veth set up again
        takes some milliseconds, and a probe sent before then is lost (not a fault of the fabric)."""
        deadline = time.monotonic() + timeout_s
        for port in ports:
            while True:
                shown = subprocess.run(["ip", "-n", port.netns, "link", "show", "dev", port.dev], capture_output=True,
                                       text=True, timeout=30, check=False).stdout  # fmt: skip
                if "LOWER_UP" in shown or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        for netns in self.made:  # neighbour entries that failed while the link was down: resolved afresh
            subprocess.run(["ip", "-n", netns, "neigh", "flush", "all"], capture_output=True, timeout=30, check=False)

    def clear_all(self) -> None:
        up = [port for fault in self.faults for port in fault.down]
        for fault in list(self.faults):
            self._undo(fault)
        self._mend(up)

    def reset(self) -> None:
        """Every port up at its line rate and every route made again, whatever was injected (by this process or
        another: the command line's `clear`)."""
        self.faults.clear()
        up: list[_Port] = []
        for leaf in range(self.rails * self.leaves_per_rail):
            for s in range(self.spines):
                for port in self.link_ports(leaf, s):
                    self._run("ip", "-n", port.netns, "link", "set", port.dev, "up")
                    self._rate(port, None)
                    up.append(port)
        for i in range(self.nodes):
            for r in range(self.rails):
                for port in self.nic_ports(i, r):
                    self._run("ip", "-n", port.netns, "link", "set", port.dev, "up")
                    self._rate(port, self.nic_mbit)
                    up.append(port)
        self._mend(up)

    def state(self) -> dict[str, Any]:
        """What attach() needs to find this testbed again from another process."""
        return {
            "prefix": self.prefix, "nodes": self.nodes, "rails": self.rails, "leaves_per_rail": self.leaves_per_rail,
            "spines": self.spines, "nic_mbit": self.nic_mbit, "namespaces": list(self.made),
        }  # fmt: skip

    @classmethod
    def attach(cls, state: dict[str, Any]) -> Testbed:
        """The testbed another process built (its state()), to inject into, reset or close."""
        bed = cls(state["nodes"], state["rails"], state["leaves_per_rail"], state["spines"],
                  nic_mbit=state["nic_mbit"], prefix=state["prefix"])  # fmt: skip
        bed.made = [str(n) for n in state["namespaces"] if str(n).startswith(f"{bed.prefix}-")]
        return bed
