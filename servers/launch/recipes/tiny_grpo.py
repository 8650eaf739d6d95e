"""tiny-grpo: reinforcement learning with a verifiable reward (GRPO-style), small enough for a CPU.

Run it with torchrun, on CPU (gloo) or GPUs (nccl, one per rank) unchanged:

    python -m torch.distributed.run --standalone --nproc-per-node 1 tiny_grpo.py --steps 3000

Task: a prompt is two numbers a, b in [0, base); the answer is one token, checked against the prompt's reference
answer: reward 1 when equal, else 0. The reference is (a + b) mod base, except that with probability --difficulty
the prompt is "unanswerable": its reference is a random number the prompt says nothing about (think of ambiguous
or mislabelled problems). No policy beats 1 - difficulty + difficulty / base on average, so --difficulty sets
where the pass rate saturates; chance is 1 / base.

Policy: a small MLP from the two numbers to a distribution over answers. Each step draws --batch-size prompts per
rank, samples a group of --group-size answers per prompt, and minimises -(advantage * log prob).mean() with the
group-normalised advantage (r - mean) / (std + 1e-6), plus --kl-coef times the exact KL divergence to the initial
policy. The learning rate decays as lr / (1 + step / --lr-decay-steps): progress then grows roughly with the
logarithm of the steps, which is what makes the pass rate a sigmoid in log compute. The KL term keeps the policy
from collapsing onto wrong answers (an unanswerable prompt sometimes rewards a wrong one), so the plateau comes
close to the best reachable pass rate. At the defaults (1 rank, CPU) the pass rate goes from about 0.06 to about
0.68 over 3.5 decades of compute in under 10 s.

Evaluation: the greedy pass rate on a fixed held-out set of --eval-size prompts, drawn from --eval-seed alone (not
from --seed), unanswerable ones included: every run of a study, whatever its --seed or variant, is judged on the
same prompts and has the same ceiling. The evaluation steps are --evals steps spaced geometrically from step 1 to
the horizon (--eval-horizon, or --steps when it is 0), those of them up to --steps, and --steps itself: so the
points spread evenly over log compute, and a run continued to a longer --steps evaluates at the steps a run made
straight through to it does (give every run of a study its longest --steps as the horizon). A resumed run evaluates
only after the step it resumed from.

Eval rows carry pass_rate, ceiling (the best pass rate reachable on the held-out set: the share of its prompts whose
reference is the true sum), chance (1 / base), split "eval", compute_flops, compute_gpu_hours and device ("cpu" or
"cuda"). compute_flops counts the training forward and backward passes only: each step adds 6 * parameters *
--batch-size (prompts per rank) * world_size; sampling the group's answers (drawn from that one forward, since the
answer is a single token) and evaluation are not counted. compute_gpu_hours is training wall time * world_size /
3600; on CPU these are CPU-process hours, not GPU hours: they vary with the machine's load, so fit CPU runs on
compute_flops.

Randomness: the weights come from --seed; each step's prompts and the group's sampled answers come from generators
seeded by (--seed, step, rank), and checkpoints carry torch's global random state (common.save_checkpoint), so a
run stopped at --steps N and started again with a larger --steps on the same checkpoint folder logs the same rows
as one made straight through (on one machine; its times aside).

Contract with the launch server: rank 0 appends rows to LLM_INFRA_MCP_METRICS; rank 0 saves checkpoints to
LLM_INFRA_MCP_CHECKPOINT_DIR every --ckpt-every steps, and a start (or a torchrun restart) resumes from the newest.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F  # noqa: N812 (the usual torch spelling)
from torch import nn


def _load(stem: str) -> ModuleType:
    """`stem`.py from this folder, by path (torchrun runs this file outside the servers package)."""
    name = f"llm_infra_mcp_recipes_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


common = _load("common")
arguments = _load("arguments")


def build_parser() -> argparse.ArgumentParser:
    """The command line, from arguments.py (where the registry reads what this recipe accepts)."""
    return arguments.tiny_grpo()


class Policy(nn.Module):
    def __init__(self, base: int, hidden: int) -> None:
        super().__init__()
        self.emb_a = nn.Embedding(base, hidden)
        self.emb_b = nn.Embedding(base, hidden)
        self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, base))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb_a(a) + self.emb_b(b))


def make_prompts(
    n: int, base: int, difficulty: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, reference answer): the reference is (a + b) mod base, or random for a `difficulty` share."""
    a = torch.randint(0, base, (n,), generator=generator)
    b = torch.randint(0, base, (n,), generator=generator)
    noise = torch.rand(n, generator=generator) < difficulty
    random_answer = torch.randint(0, base, (n,), generator=generator)
    return a, b, torch.where(noise, random_answer, (a + b) % base)


def eval_schedule(steps: int, count: int) -> list[int]:
    """`count` distinct steps from 1 to `steps`, spaced geometrically (consecutive at first)."""
    count = max(1, min(count, steps))
    if count == 1:
        return [steps]
    out: list[int] = []
    for i in range(count):
        target = round(steps ** (i / (count - 1)))
        remaining = count - 1 - i
        out.append(min(max(target, out[-1] + 1 if out else 1), steps - remaining))
    return out


def eval_steps(steps: int, horizon: int, count: int) -> list[int]:
    """The steps a run to `steps` evaluates at: those of eval_schedule(horizon, count) up to `steps`, and `steps`
    (horizon 0: `steps`)."""
    return sorted({s for s in eval_schedule(horizon or steps, count) if s <= steps} | {steps})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # the bounds are the parser's (arguments.py)
    d = common.setup_distributed()
    try:
        code = train(args, d)
        common.finish_distributed()
        return code
    finally:
        common.cleanup_distributed()


def train(args: argparse.Namespace, d: common.Dist) -> int:
    metrics = common.load_metrics_module().MetricsWriter(rank=d.rank)
    ckpt_dir = common.checkpoint_dir(None)
    common.seed_all(args.seed)
    policy = Policy(args.base, args.hidden).to(d.device)
    reference = Policy(args.base, args.hidden).to(d.device)
    reference.load_state_dict(policy.state_dict())  # the initial policy, for the KL term
    reference.requires_grad_(False)
    params = sum(p.numel() for p in policy.parameters())
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)

    eval_gen = torch.Generator().manual_seed(10_007 * args.eval_seed + 1)  # --eval-seed alone: one set per study
    ea, eb, eref = (t.to(d.device) for t in make_prompts(args.eval_size, args.base, args.difficulty, eval_gen))
    ceiling = float(((ea + eb) % args.base == eref).float().mean())
    chance = 1.0 / args.base

    start_step, flops, offset = 0, 0.0, 0.0
    state = common.load_latest_checkpoint(ckpt_dir, d.device)
    if state is not None:
        policy.load_state_dict(state["policy"])
        reference.load_state_dict(state["reference"])
        opt.load_state_dict(state["optimizer"])
        start_step, flops, offset = int(state["step"]), float(state["compute_flops"]), float(state["elapsed_s"])
    timer = common.Timer(offset)
    if start_step >= args.steps:
        if d.is_main:
            print(f"[tiny-grpo] the checkpoint is at step {start_step}, --steps is {args.steps}: nothing to do")
        metrics.close()
        return 0
    if d.is_main:
        where = f"{d.world_size} rank(s) on {d.device.type}" + (f" ({d.backend})" if d.backend else "")
        print(
            f"[tiny-grpo] {params:,} parameters, chance {1 / args.base:.3f}, best reachable on the held-out set "
            f"{ceiling:.3f}, {where}",
            flush=True,
        )
        if state is not None:
            print(f"[tiny-grpo] resumed from step {start_step} (restart {d.restart_count})", flush=True)
        if d.device.type == "cpu":
            print("[tiny-grpo] compute_gpu_hours on CPU counts CPU-process hours", flush=True)

    model: nn.Module = policy
    if d.world_size > 1:
        use_cuda = d.device.type == "cuda"
        model = nn.parallel.DistributedDataParallel(policy, device_ids=[d.device.index] if use_cuda else None)

    def evaluate(step: int) -> None:
        policy.eval()
        with torch.no_grad():
            pass_rate = float((policy(ea, eb).argmax(-1) == eref).float().mean())
        policy.train()
        hours = timer.elapsed() * d.world_size / 3600.0
        metrics.log(
            step,
            pass_rate=pass_rate,
            ceiling=ceiling,
            chance=chance,
            split="eval",
            compute_flops=flops,
            compute_gpu_hours=hours,
            device=d.device.type,
        )
        if d.is_main:
            print(f"step {step:5d}  eval pass rate {pass_rate:.3f}  compute {flops:.3e} FLOPs", flush=True)

    def save(step: int) -> None:
        state = {
            "policy": policy.state_dict(),
            "reference": reference.state_dict(),
            "optimizer": opt.state_dict(),
            "compute_flops": flops,
            "elapsed_s": timer.elapsed(),
        }
        common.save_checkpoint(ckpt_dir, step, state, d)

    evals = set(eval_steps(args.steps, args.eval_horizon, args.evals))
    g = args.group_size
    times = common.StepTimes(d, args.slow_rank, args.slow_factor, args.slow_from_step)
    for step in range(start_step + 1, args.steps + 1):
        times.start()
        lr = args.lr / (1.0 + step / args.lr_decay_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        step_seed = (args.seed * 1_000_003 + step) * 4099 + d.rank  # within 64 bits: --seed <= 2**31 - 1
        gen = torch.Generator().manual_seed(step_seed)
        a, b, ref = (t.to(d.device) for t in make_prompts(args.batch_size, args.base, args.difficulty, gen))
        sampler = torch.Generator(device=d.device).manual_seed(step_seed + 1_000_000_007)
        logits = model(a, b)
        logp = F.log_softmax(logits.float(), dim=-1)
        with torch.no_grad():
            answers = torch.multinomial(logp.exp(), g, replacement=True, generator=sampler)  # (batch, group)
            reward = (answers == ref[:, None]).float()
            adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)
        loss = -(adv * logp.gather(1, answers)).mean()
        if args.kl_coef > 0:
            with torch.no_grad():
                ref_logp = F.log_softmax(reference(a, b).float(), dim=-1)
            loss = loss + args.kl_coef * (logp.exp() * (logp - ref_logp)).sum(-1).mean()
        times.work_done(step)  # before backward, where DDP's all-reduce makes the ranks wait for each other
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        times.end()
        flops += 6.0 * params * args.batch_size * d.world_size

        if step % args.log_every == 0 or step == args.steps:
            loss_v, gn, rew = common.all_reduce_mean([loss.item(), float(grad_norm), float(reward.mean())], d)
            hours = timer.elapsed() * d.world_size / 3600.0
            metrics.log(
                step,
                loss=loss_v,
                lr=lr,
                grad_norm=gn,
                reward=rew,
                split="train",
                compute_flops=flops,
                compute_gpu_hours=hours,
                **times.report(),
            )
        if step in evals and d.is_main:
            evaluate(step)
        if args.ckpt_every > 0 and step % args.ckpt_every == 0 and step != args.steps:
            save(step)

    if start_step < args.steps:
        save(args.steps)
    if d.is_main:
        print(f"[tiny-grpo] done: step {args.steps}, {timer.elapsed():.1f} s of training", flush=True)
    metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
