"""trl-grpo: TRL's own GRPOTrainer on a tiny causal LM with random weights, small enough for a CPU.

Run it with torchrun (or plain python), on CPU or GPUs unchanged:

    python -m torch.distributed.run --standalone --nproc-per-node 1 trl_grpo.py --steps 8

Nothing is downloaded: the model is a LlamaForCausalLM built from a LlamaConfig (--layers blocks of width
--hidden-size, random weights from --seed) and the tokenizer a word-level vocabulary built here (the letters, the
word "repeat", ":", and [PAD] / [EOS] / [UNK]) wrapped in transformers' PreTrainedTokenizerFast.

Task ("repeat the letter"): a prompt is "repeat X :" for a letter X drawn from --letters letters with --seed; the
reward of a completion (verifiable, in [0, 1]) is the share of its --max-completion-length token slots that are
the letter X. A random policy scores about 1 / (letters + 3); the best scores 1.

Training: GRPOConfig built from the flags (report_to tensorboard, logging_steps 1, max_steps --steps, use_cpu when
no GPU is present, the seed) plus any --grpo-arg FIELD=VALUE (VALUE read as JSON, else as text). The config is
built before the model is: an unknown field or an invalid combination fails with TRL's own error, and `--check`
stops right there (the launch server plans with it). Fields the recipe sets itself (output_dir, report_to,
logging_steps, max_steps, seed, use_cpu, ...) and the hub's are refused in --grpo-arg.

Where the run goes (the contract with the launch server): TRL's output_dir is --output-dir, else the folder
"trl" next to LLM_INFRA_MCP_METRICS (the job's folder), else ./trl-grpo. It holds trainer_state.json (log_history:
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

# Set by the recipe from its own flags, or reaching outside the job (the hub): not settable with --grpo-arg.
OWN_FIELDS = frozenset(
    {
        "output_dir",
        "logging_dir",
        "report_to",
        "logging_steps",
        "logging_strategy",
        "max_steps",
        "seed",
        "data_seed",
        "use_cpu",
        "save_strategy",
        "save_steps",
        "per_device_train_batch_size",
        "num_generations",
        "max_completion_length",
        "learning_rate",
        "beta",
        "push_to_hub",
        "hub_model_id",
        "hub_token",
        "hub_strategy",
        "hub_private_repo",
        "hub_always_push",
        "hub_revision",
        "log_completions_hub_repo",
        "use_vllm",
        "vllm_mode",
        "vllm_server_base_url",
        "vllm_server_host",
        "vllm_server_port",
        "trust_remote_code",
        "model_init_kwargs",
    }
)
SPECIAL = ("[PAD]", "[EOS]", "[UNK]")


def build_parser() -> argparse.ArgumentParser:
    """The command line, from arguments.py (where the registry reads what this recipe accepts)."""
    return arguments.trl_grpo()


def extra_fields(items: list[str] | None) -> dict[str, Any]:
    """--grpo-arg FIELD=VALUE items as GRPOConfig keyword arguments (VALUE as JSON when it parses, else text);
    ValueError for a malformed item or a field the recipe sets itself."""
    fields: dict[str, Any] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"--grpo-arg {item!r}: expected FIELD=VALUE with FIELD a GRPOConfig field name")
        if name in OWN_FIELDS:
            raise ValueError(
                f"--grpo-arg {name}: the recipe sets this field itself (from its own flags, or it reaches outside "
                f"the job); refused fields: {', '.join(sorted(OWN_FIELDS))}"
            )
        try:
            fields[name] = json.loads(raw)
        except ValueError:
            fields[name] = raw
    return fields


def output_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    metrics = os.environ.get("LLM_INFRA_MCP_METRICS")
    return Path(metrics).parent / "trl" if metrics else Path("trl-grpo")


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
    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        """Share of the `length` completion slots holding the prompt's letter (the word before ':')."""
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            letter = prompt.split()[1]
            out.append(sum(word == letter for word in completion.split()[:length]) / length)
        return out

    return reward


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    letters = "abcdefghijklmnopqrstuvwxyz"[: args.letters]
    import torch

    out = output_dir(args.output_dir)
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
