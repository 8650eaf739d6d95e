"""tiny-gpt: a small decoder-only transformer trained on a generated, seeded text corpus (character level).

Run it with torchrun, on CPU (gloo) or GPUs (nccl, one per rank) unchanged:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tiny_gpt.py --steps 200

The corpus is sentences from a small grammar ("the quick cat sees a red box .") drawn with a fixed seed, so every run
sees the same text; the loss falls from about log(vocabulary) towards the grammar's entropy. Each rank draws its
own batches (seeded by step and rank) and DistributedDataParallel averages gradients when WORLD_SIZE > 1.

Contract with the launch server: rank 0 appends rows to LLM_INFRA_MCP_METRICS (loss, lr, grad_norm, tokens,
tokens_per_s, mfu, and every rank's work and step time as rank_work_s / rank_step_s; a final held-out loss with
split "eval"); --slow-rank / --slow-factor / --slow-from-step make one rank a straggler on purpose; every
--ckpt-every steps rank 0 saves a checkpoint to LLM_INFRA_MCP_CHECKPOINT_DIR, and a start (or a torchrun
restart) resumes from the newest one. MFU is
6 * parameters * tokens/s per GPU over the GPU catalog's dense bf16 peak (bf16 autocast on GPU); on CPU it is
logged as null.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import sys
import time
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
    return arguments.tiny_gpt()


# ------------------------------------------------------------------------------------------------ data

SUBJECTS = ["cat", "dog", "bird", "fox", "child", "robot", "farmer", "teacher"]
ADJECTIVES = ["red", "quick", "small", "old", "happy", "green", "lazy", "bright"]
VERBS = ["sees", "likes", "finds", "moves", "takes", "builds", "paints", "holds"]
OBJECTS = ["box", "ball", "tree", "house", "river", "stone", "book", "cup"]
PLACES = ["near the hill", "in the park", "at home", "by the sea"]


def make_corpus(seed: int, sentences: int = 6000) -> str:
    """Sentences of a small grammar, drawn with `seed`: the same text on every rank and every run."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = ["the", rng.choice(ADJECTIVES), rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(["a", "the"])]
        if rng.random() < 0.5:
            words.append(rng.choice(ADJECTIVES))
        words.append(rng.choice(OBJECTS))
        if rng.random() < 0.3:
            words.append(rng.choice(PLACES))
        out.append(" ".join(words) + " .")
    return "\n".join(out) + "\n"


class Corpus:
    def __init__(self, seed: int) -> None:
        text = make_corpus(seed)
        self.vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(self.vocab)}
        data = torch.tensor([index[c] for c in text], dtype=torch.long)
        cut = int(len(data) * 0.9)
        self.train, self.heldout = data[:cut], data[cut:]

    def batch(self, split: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(split) - seq_len - 1, (batch_size,), generator=g)
        x = torch.stack([split[s : s + seq_len] for s in starts.tolist()])
        y = torch.stack([split[s + 1 : s + seq_len + 1] for s in starts.tolist()])
        return x, y


# ------------------------------------------------------------------------------------------------ model


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lr_at(step: int, total: int, peak: float) -> float:
    warmup = max(1, min(20, total // 10))
    if step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ------------------------------------------------------------------------------------------------ training


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.d_model % args.heads:
        raise SystemExit(f"--heads {args.heads} must divide --d-model {args.d_model}")
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
    corpus = Corpus(args.seed)
    model = TinyGPT(len(corpus.vocab), args.d_model, args.layers, args.heads, args.seq_len).to(d.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    start_step, tokens, offset = 0, 0, 0.0
    state = common.load_latest_checkpoint(ckpt_dir, d.device)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_step, tokens, offset = int(state["step"]), int(state["tokens"]), float(state["elapsed_s"])
    timer = common.Timer(offset)
    if start_step >= args.steps:
        if d.is_main:
            print(f"[tiny-gpt] the checkpoint is at step {start_step}, --steps is {args.steps}: nothing to do")
        metrics.close()
        return 0

    use_cuda = d.device.type == "cuda"
    peak = None
    if use_cuda:
        found = common.gpu_peak_tflops(torch.cuda.get_device_name(d.device), "bf16")
        peak = found[1] if found else None
    if d.is_main:
        where = f"{d.world_size} rank(s) on {d.device.type}" + (f" ({d.backend})" if d.backend else "")
        print(f"[tiny-gpt] {params:,} parameters, vocabulary {len(corpus.vocab)}, {where}", flush=True)
        if state is not None:
            print(f"[tiny-gpt] resumed from step {start_step} (restart {d.restart_count})", flush=True)
        if not use_cuda:
            print("[tiny-gpt] mfu: n/a on CPU (logged as null)", flush=True)
        elif peak is None:
            print("[tiny-gpt] mfu: this GPU is not in the catalog (logged as null)", flush=True)

    ddp: nn.Module = model
    if d.world_size > 1:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[d.device.index] if use_cuda else None)

    def save(step: int) -> None:
        common.save_checkpoint(
            ckpt_dir,
            step,
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "tokens": tokens,
                "elapsed_s": timer.elapsed(),
            },
            d,
        )

    tokens_per_step = args.batch_size * args.seq_len * d.world_size
    window_start, window_tokens = time.perf_counter(), 0
    loss_value = float("nan")
    times = common.StepTimes(d, args.slow_rank, args.slow_factor, args.slow_from_step)
    for step in range(start_step + 1, args.steps + 1):
        times.start()
        lr = lr_at(step, args.steps, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        batch_seed = (args.seed * 1_000_003 + step) * 4099 + d.rank  # a different batch per rank and step
        x, y = corpus.batch(corpus.train, args.batch_size, args.seq_len, seed=batch_seed)
        x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_cuda):
            logits = ddp(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        times.work_done(step)  # before backward, where DDP's all-reduce makes the ranks wait for each other
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.end()
        tokens += tokens_per_step
        window_tokens += tokens_per_step

        if step % args.log_every == 0 or step == args.steps:
            loss_value, gn = common.all_reduce_mean([loss.item(), float(grad_norm)], d)
            now = time.perf_counter()
            tps = window_tokens / max(now - window_start, 1e-9)
            window_start, window_tokens = now, 0
            mfu = 6.0 * params * tps / d.world_size / (peak * 1e12) if peak else None
            metrics.log(
                step,
                loss=loss_value,
                lr=lr,
                grad_norm=gn,
                tokens=tokens,
                tokens_per_s=tps,
                mfu=mfu,
                split="train",
                **times.report(),
            )
            if d.is_main:
                shown = f"{100 * mfu:.2f}%" if mfu is not None else "n/a"
                print(f"step {step:5d}  loss {loss_value:.4f}  lr {lr:.2e}  {tps:,.0f} tok/s  mfu {shown}", flush=True)
        if args.ckpt_every > 0 and step % args.ckpt_every == 0 and step != args.steps:
            save(step)

    if start_step < args.steps:
        save(args.steps)
    # Held-out loss at the end (same on every rank: the same seeded batches).
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_cuda):
        x, y = corpus.batch(corpus.heldout, 64, args.seq_len, seed=args.seed + 17)
        logits = model(x.to(d.device))
        eval_loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.to(d.device).view(-1)).item()
    metrics.log(args.steps, loss=eval_loss, tokens=tokens, split="eval")
    if d.is_main:
        print(
            f"[tiny-gpt] done: step {args.steps}, train loss {loss_value:.4f}, held-out loss {eval_loss:.4f}, "
            f"{timer.elapsed():.1f} s of training",
            flush=True,
        )
    metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
