#!/usr/bin/env python3
"""The fault-injection testbed from the command line (servers/diagnostics/testbed.py), as root:

python scripts/fault-testbed.py up DIR [--nodes 8 --rails 2 --leaves-per-rail 2 --spines 2 --nic-mbit 400]
    builds it; writes DIR/topology.json, DIR/endpoints.json (for plan_network_probes, run_network_probes and
    localize_network_fault) and DIR/testbed.json (what the other commands need)
python scripts/fault-testbed.py fault DIR KIND TARGET [--rate-mbit 40]
    KIND: nic_down, node_down, uplink_down, nic_slow, link_slow, spine_slow; TARGET: node3-r1, node5,
    leaf1-1~spine0, spine1 (names as topology.json has them)
python scripts/fault-testbed.py clear DIR      every port up at its line rate, every route made again
python scripts/fault-testbed.py down DIR       every namespace removed
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics.testbed import FAULT_KINDS, Testbed, TestbedError


def main() -> int:
    parser = argparse.ArgumentParser(description="the fault-injection testbed of network namespaces")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("dir", type=Path)
    up.add_argument("--nodes", type=int, default=8)
    up.add_argument("--rails", type=int, default=2)
    up.add_argument("--leaves-per-rail", type=int, default=2)
    up.add_argument("--spines", type=int, default=2)
    up.add_argument("--nic-mbit", type=float, default=400)
    fault = sub.add_parser("fault")
    fault.add_argument("dir", type=Path)
    fault.add_argument("kind", choices=FAULT_KINDS)
    fault.add_argument("target")
    fault.add_argument("--rate-mbit", type=float, default=40.0)
    for name in ("clear", "down"):
        sub.add_parser(name).add_argument("dir", type=Path)
    args = parser.parse_args()
    state_file = args.dir / "testbed.json"
    try:
        if args.command == "up":
            bed = Testbed(args.nodes, args.rails, args.leaves_per_rail, args.spines, nic_mbit=args.nic_mbit).build()
            topology, endpoints = bed.write(args.dir)
            state_file.write_text(json.dumps(bed.state(), indent=1))
            print(f"up: {len(bed.made)} namespaces ({bed.prefix}-*); {topology}, {endpoints}")
            return 0
        if not state_file.is_file():
            print(f"{state_file}: not there (run `up {args.dir}` first)", file=sys.stderr)
            return 2
        bed = Testbed.attach(json.loads(state_file.read_text()))
        if args.command == "fault":
            slow = args.kind.endswith("_slow")
            bed.inject(args.kind, args.target, args.rate_mbit if slow else None)
            print(f"injected {args.kind} on {args.target}" + (f" at {args.rate_mbit:g} Mbit/s" if slow else ""))
        elif args.command == "clear":
            bed.reset()
            print("cleared: every port up at its line rate, every route made again")
        else:
            bed.close()
            state_file.unlink()
            print("down: every namespace removed")
        return 0
    except (TestbedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
