"""The agent-driven experiment loop: a stdio MCP client that runs a whole study over the suite and writes a report.

    python examples/experiment_loop.py                 # the default study (about 3 minutes on 2 CPU cores)
    python examples/experiment_loop.py --quick         # CI size (about 1.5 minutes)
    python examples/experiment_loop.py --exhaustive    # every variant straight to the target, for comparison
    python examples/experiment_loop.py --variants lr=0.02 lr=0.005 group-size=8 --seeds 2 --name lr-vs-group

It starts `llm-infra-mcp serve suite` with this interpreter, as Claude Desktop would, and drives it: the node
check (gpu_health, scan_kernel_log), overlap where GPUs are (predict_overlap per layer of a preset next to
tune_overlap's measurement; skipped on CPU unless --overlap), and an adaptive RL scaling study of tiny-grpo
variants: a pilot of each (its compute per step and where its curve rises), then rounds that double the compute
per run; after each, fit_scaling_law and predict_scaling forecast every variant at the target, the variants that
cannot beat the leader by the margin stop, and the rest continue from their checkpoints (resume_from), until only
the leader goes on or the target is reached; compare_scaling_fits quotes the probabilities. The report lands in
studies/NAME/: report.html (self-contained), report.md and study.json. Rerunning a study reuses its finished jobs
and tries a failed run once more.

Exit status: 0 with a decision, 1 when the study could not compare two variants, 2 when it cannot run as asked.
Every option: --help (servers/loop/cli.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout that is not installed

from servers.loop.cli import main

if __name__ == "__main__":
    sys.exit(main())
