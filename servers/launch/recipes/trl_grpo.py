"""trl-grpo: TRL's own GRPOTrainer on a tiny causal LM with random weights, small enough for a CPU.

Run it with torchrun (or plain python), on CPU or GPUs unchanged:

    python -m torch.distributed.run --standalone --nproc-per-node 1 trl_grpo.py --steps 8

Nothing is downloaded: the model is a LlamaForCausalLM built from a LlamaConfig (--layers blocks of width
--hidden-size, random weights from --seed) and the tokenizer a word-level vocabulary built here (the letters, the
word "repeat", ":", and [PAD] / [EOS] / [UNK]) wrapped in transformers' PreTrainedTokenizerFast.

Task ("repeat the letter"): a prompt is "repeat X :" for a letter X drawn from --letters letters with --seed; the
reward of a completion (verifiable, in [0, 1]) is the share of its --max-completion-length token slots that are
the letter X. A random policy scores below 1 / (letters + 5), one over the vocabulary's size; the best scores 1.

Training: GRPOConfig built from the flags (report_to tensorboard, logging_steps 1, max_steps --steps, use_cpu when
no GPU is present, the seed) plus any --grpo-arg FIELD=VALUE (VALUE read as JSON, else as text). The config is
built before the model is: an unknown field or an invalid combination fails with TRL's own error, and `--check`
stops right there (the launch server plans with it). Fields the recipe sets itself (output_dir, report_to,
logging_steps, max_steps, seed, use_cpu, ...) and the hub's are refused in --grpo-arg.

Where the run goes (the contract with the launch server): TRL's output_dir is --output-dir, else the folder
"trl" in LLM_INFRA_MCP_CHECKPOINT_DIR (the job's checkpoints/, so the job's run source is checkpoints/trl), else
./trl-grpo; HF_HOME defaults to .hf-home in it. It holds trainer_state.json (log_history:
one entry per step), the saved model (config.json, model.safetensors), checkpoint-N/ every --save-every steps and
TensorBoard event files under runs/. Rank 0 also appends each logged step to LLM_INFRA_MCP_METRICS (reward, loss,
kl, completions/mean_length, ...) so that the job's progress shows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


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


arguments = _load("arguments")

# GRPOConfig fields the recipe sets from its own flags: not settable with --grpo-arg.
FLAG_FIELDS = {
    "max_steps": "--steps",
    "per_device_train_batch_size": "--prompts-per-step x --num-generations",
    "num_generations": "--num-generations",
    "max_completion_length": "--max-completion-length",
    "learning_rate": "--lr",
    "beta": "--beta",
    "seed": "--seed",
    "data_seed": "--seed",
    "save_steps": "--save-every",
    "save_strategy": "--save-every",
}
# Fields the recipe fixes (where the run goes, how it is logged) or that reach outside the job (files read at
# config time, the hub, a vLLM server).
FIXED_FIELDS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "report_to",
        "logging_steps",
        "logging_strategy",
        "use_cpu",
        "disable_tqdm",
        "push_to_hub",
        "use_vllm",
        "vllm_mode",
        "trust_remote_code",
        "model_init_kwargs",
        "deepspeed",
        "fsdp",
        "resume_from_checkpoint",
    }
)
REFUSED_SUFFIXES = ("_dir", "_path", "_file", "_url", "_config", "_host", "_port", "_token")
REFUSED_PREFIXES = ("hub_", "push_", "vllm_")
SPECIAL = ("[PAD]", "[EOS]", "[UNK]")
CHECK_TIMEOUT_S = 120.0


def build_parser() -> argparse.ArgumentParser:
    """The command line, from arguments.py (where the registry reads what this recipe accepts)."""
    return arguments.trl_grpo()


def extra_fields(items: list[str] | None) -> dict[str, Any]:
    """--grpo-arg FIELD=VALUE items as GRPOConfig keyword arguments (VALUE as JSON when it parses, else text);
    ValueError for a malformed item, a field the recipe sets itself, or one that reaches outside the job."""
    fields: dict[str, Any] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"--grpo-arg {item!r}: expected FIELD=VALUE with FIELD a GRPOConfig field name")
        if name in FLAG_FIELDS:
            raise ValueError(f"--grpo-arg {name}: the recipe sets it from {FLAG_FIELDS[name]}; give that flag")
        if name in FIXED_FIELDS:
            raise ValueError(
                f"--grpo-arg {name}: refused, the recipe fixes it (where the run goes and how it is logged) or it "
                "reaches outside the job"
            )
        if name.endswith(REFUSED_SUFFIXES) or name.startswith(REFUSED_PREFIXES):
            raise ValueError(
                f"--grpo-arg {name}: fields naming files, hosts or services are refused (names ending "
                f"{', '.join(REFUSED_SUFFIXES)} or starting {', '.join(REFUSED_PREFIXES)})"
            )
        try:
            fields[name] = json.loads(raw)
        except ValueError:
            fields[name] = raw
    return fields


def output_dir(arg: str | None) -> Path:
    """--output-dir, else trl/ in LLM_INFRA_MCP_CHECKPOINT_DIR (the job's checkpoints folder, which a sandboxed job
    may write), else ./trl-grpo."""
    if arg:
        return Path(arg)
    checkpoints = os.environ.get("LLM_INFRA_MCP_CHECKPOINT_DIR")
    return Path(checkpoints) / "trl" if checkpoints else Path("trl-grpo")


def grpo_config(args: argparse.Namespace, out: Path, cpu: bool) -> Any:
    """TRL's GRPOConfig from the flags: TypeError/ValueError from TRL itself for an unknown or invalid field."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        report_to=["tensorboard"],
        logging_steps=1,
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr,
        beta=args.beta,
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=cpu,
        save_strategy="steps" if args.save_every > 0 else "no",
        save_steps=max(1, args.save_every),
        disable_tqdm=True,
        **extra_fields(args.grpo_arg),
    )


def build_tokenizer(letters: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL, "repeat", ":", *letters))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]", padding_side="left"
    )


def build_model(args: argparse.Namespace, tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=2 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def letter_reward(length: int) -> Any:
    def repeated_letter(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        """Share of the `length` completion slots holding the prompt's letter (the word before ':')."""
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            letter = prompt.split()[1]
            out.append(sum(word == letter for word in completion.split()[:length]) / length)
        return out

    return repeated_letter


def prompts(count: int, letters: str, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [f"repeat {rng.choice(letters)} :" for _ in range(count)]


def make_callback(metrics: Any) -> Any:
    """A TrainerCallback appending each logged step to the suite's metrics file (the job's progress)."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if state.is_world_process_zero and logs:
                values = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and k not in ("step", "time")}
                metrics.log(state.global_step, split="train", **values)

    return _Callback()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value, low, high in (
        ("--steps", args.steps, 1, 10**6),
        ("--prompts-per-step", args.prompts_per_step, 1, 4096),
        ("--num-generations", args.num_generations, 2, 1024),
        ("--max-completion-length", args.max_completion_length, 1, 48),
        ("--letters", args.letters, 2, 26),
        ("--prompts", args.prompts, 1, 10**6),
        ("--hidden-size", args.hidden_size, 4, 4096),
        ("--layers", args.layers, 1, 64),
        ("--heads", args.heads, 1, 64),
        ("--save-every", args.save_every, 0, 10**6),
    ):
        if not low <= value <= high:
            parser.error(f"{flag} {value}: accepted {low} to {high}")
    if args.hidden_size % args.heads:
        parser.error(f"--heads {args.heads} must divide --hidden-size {args.hidden_size}")
    try:
        extra_fields(args.grpo_arg)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def plan_check(argv: list[str]) -> str:
    """Validate a job's arguments at plan time: this script with --check in a subprocess (TRL's import costs
    seconds and torch; the server imports neither), which parses them and builds TRL's GRPOConfig. The note for the
    plan; ValueError with the script's or TRL's own error when they are refused. Cached per argument list."""
    if any(a == "--output-dir" or a.startswith("--output-dir=") for a in argv):
        raise ValueError(
            "--output-dir: a job's run goes to checkpoints/trl in its folder (the run source its spec declares, "
            "which the run readers follow); the flag is for running the script by hand"
        )
    key = tuple(argv)
    if key not in _CHECKED:
        _CHECKED[key] = _run_check(list(argv))
        while len(_CHECKED) > 64:
            _CHECKED.pop(next(iter(_CHECKED)))
    ok, text = _CHECKED[key]
    if not ok:
        raise ValueError(text)
    return text


_CHECKED: dict[tuple[str, ...], tuple[bool, str]] = {}


def _run_check(argv: list[str]) -> tuple[bool, str]:
    import importlib.util as util
    import subprocess
    import tempfile

    if util.find_spec("trl") is None:
        return True, "arguments not validated against TRL's GRPOConfig: trl is not installed here"
    with tempfile.TemporaryDirectory(prefix="trl-grpo-check-") as home:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "HF_HOME": home,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        }
        try:
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), *argv, "--check"],
                cwd=home,
                env=env,
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return True, f"arguments not validated against TRL's GRPOConfig: the check took over {CHECK_TIMEOUT_S:g} s"
    if done.returncode == 0:
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            version = str(found["trl"])
        except (ValueError, IndexError, KeyError, TypeError):
            version = "?"
        return True, (
            f"arguments validated: parsed by the recipe's own parser and built into TRL {version}'s GRPOConfig "
            "(on CPU), which accepted every field"
        )
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {done.returncode}"
    return False, f"trl-grpo refused its arguments: {last[:600]}"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    letters = "abcdefghijklmnopqrstuvwxyz"[: args.letters]
    out = output_dir(args.output_dir)
    os.environ.setdefault("HF_HOME", str(out / ".hf-home"))  # nothing is downloaded; keep any cache in the job
    import torch

    config = grpo_config(args, out, cpu=not torch.cuda.is_available())
    if args.check:
        import trl

        print(json.dumps({"ok": True, "trl": trl.__version__, "fields": len(config.to_dict())}), flush=True)
        return 0
    from datasets import Dataset
    from trl import GRPOTrainer

    tokenizer = build_tokenizer(letters)
    model = build_model(args, tokenizer)
    initial = out / "initial-model"  # TRL loads the reference policy (beta > 0) from a path: the random weights'
    if trainer_rank() == 0:
        model.save_pretrained(str(initial))
        tokenizer.save_pretrained(str(initial))
    barrier()
    dataset = Dataset.from_dict({"prompt": prompts(args.prompts, letters, args.seed)})
    metrics = _load_metrics()
    trainer = GRPOTrainer(
        model=str(initial),
        reward_funcs=letter_reward(args.max_completion_length),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[make_callback(metrics)],
    )
    if trainer.is_world_process_zero():
        params = sum(p.numel() for p in trainer.model.parameters())
        print(f"[trl-grpo] {params:,} parameters, {len(tokenizer)} tokens, output in {out}", flush=True)
    trainer.train()
    trainer.save_model(str(out))
    trainer.save_state()
    metrics.close()
    if trainer.is_world_process_zero():
        print(f"[trl-grpo] done: step {trainer.state.global_step}", flush=True)
    return 0


def trainer_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def barrier() -> None:
    """Wait for rank 0 to have saved the initial model (torchrun with several ranks)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def _load_metrics() -> Any:
    spec = importlib.util.spec_from_file_location(
        "llm_infra_mcp_metrics", Path(__file__).resolve().parent.parent / "metrics.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MetricsWriter()


if __name__ == "__main__":
    sys.exit(main())
