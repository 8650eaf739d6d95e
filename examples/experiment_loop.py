"""The agent-driven experiment loop: a stdio MCP client that runs a whole study over the suite and writes a report.

    python examples/experiment_loop.py                 # the default study (under 10 minutes on 2 CPU cores)
    python examples/experiment_loop.py --quick         # CI size (about a minute)
    python examples/experiment_loop.py --variants lr=0.02 lr=0.005 group-size=8 --seeds 2 --name lr-vs-group

It starts `llm-infra-mcp serve suite` with this interpreter, as Claude Desktop would, and drives it: the node
check (gpu_health, scan_kernel_log), overlap (predict_overlap per layer of a preset next to
tune_overlap's measurement), and an RL scaling study of tiny-grpo variants (a pilot for each variant's compute per
step, the budget split over variants and seeds, plan_sweep and submit_sweep, wait_for_job on the sweep, a
first-half fit of every run predicting its second half, check_extrapolation, compare_scaling_fits, a decision, and
one follow-up round when the extrapolation error is above the threshold). The report lands in studies/NAME/:
report.html (self-contained), report.md and study.json. Rerunning a study reuses its finished jobs.
Exit status: 0 with a decision, 1 when the study could not compare two variants, 2 when it cannot run as asked.
Every option: --help (servers/loop/cli.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout that is not installed

from servers.loop.cli import main

if __name__ == "__main__":
    sys.exit(main())
