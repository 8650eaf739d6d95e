"""The collective bandwidth probe: run by torchrun on every node of a probe (check_collective_bandwidth), as a file.

    torchrun ... bandwidth_probe.py --op all_reduce --sizes 1048576,4194304 --dtype fp32 --warmup 5 --iters 20

Every rank times the collective over the sizes (servers.overlap.collectives: the same buffers, exact check and
slowest-rank median as benchmark_collective); rank 0 gathers the times, and writes into the job folder (the parent
of $LLM_INFRA_MCP_METRICS) `bandwidth.json` (the rows, the hosts, the devices) and `bandwidth.txt` (the same in
nccl-tests' layout, with a device line per rank, which parse_nccl_tests reads and judges). NCCL with one GPU per
local rank where CUDA is there, gloo on CPU otherwise.
"""

import argparse
import json
import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file by torchrun: the package's root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bandwidth_probe.py")
    parser.add_argument("--op", default="all_reduce", choices=["all_reduce", "all_gather", "reduce_scatter"])
    parser.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from servers.overlap.collectives import collective_rank, format_table, plan_size, table_rows
    from servers.overlap.distributed import RankInfo

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    plans = [plan_size(args.op, s, args.dtype, world) for s in sizes]
    info = RankInfo(rank=rank, world_size=world, backend=backend, device=f"cuda:{local}" if cuda else "cpu")
    spec = {"warmup": args.warmup, "iters": args.iters, "check": True}
    mine = collective_rank(info, args.op, args.dtype, plans, spec)
    if cuda:
        props = torch.cuda.get_device_properties(local)  # PCI domain, bus and device as numbers
        bus = f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:"
        bus += f"{getattr(props, 'pci_device_id', 0):02x}.0"
        device = {"device": local, "bus_id": bus, "name": torch.cuda.get_device_name(local)}
    else:
        device = {"device": local, "bus_id": "cpu", "name": "cpu"}
    me = {"rank": rank, "host": socket.gethostname(), "node": os.environ.get("SLURMD_NODENAME"), "pid": os.getpid()}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rows": mine, "who": {**me, **device}})
    if rank == 0:
        rows = table_rows(args.op, args.dtype, plans, [g["rows"] for g in gathered])
        who = [g["who"] for g in gathered]
        avg = sum(r["busbw"] for r in rows) / len(rows)
        lines = [
            f"# Collective test starting: {args.op}_perf (llm-infra-mcp bandwidth probe, torch {torch.__version__})",
            f"# nThread 1 nGpus 1 minBytes {min(sizes)} maxBytes {max(sizes)} warmup iters: {args.warmup} "
            f"iters: {args.iters} validation: 1",
            "#",
            "# Using devices",
            *(
                f"#  Rank {w['rank']:2d} Group  0 Pid {w['pid']:6d} on {w['node'] or w['host']} device "
                f"{w['device']:2d} [{w['bus_id']}] {w['name']}"
                for w in who
            ),
            format_table(rows, avg, f"# {args.op} on {world} ranks, backend {backend}"),
        ]
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        folder = Path(os.environ.get("LLM_INFRA_MCP_METRICS", "./metrics.jsonl")).parent
        (folder / "bandwidth.txt").write_text(text)
        record = {"op": args.op, "dtype": args.dtype, "backend": backend, "world_size": world, "rows": rows}
        (folder / "bandwidth.json").write_text(json.dumps({**record, "ranks": who}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
