"""tiny-grpo for an adaptive study (issue 25): a run stopped and continued to a longer --steps is the run made
straight through (same rows, same evaluation steps), every run of a study is judged on the same held-out set (same
ceiling), and a bad argument value is refused by the recipe's parser, in the registry's bounds and at plan time."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servers.launch import metrics
from servers.launch.recipes import RECIPES, check_recipe_args, recipe_path
from servers.launch.recipes.arguments import ArgumentsError, check_args, tiny_grpo
from tests.conftest import load_recipe

# The fields of a row that the run decides (times and per-rank timings vary with the machine's load).
DETERMINED = ("step", "split", "loss", "lr", "grad_norm", "reward", "pass_rate", "compute_flops", "ceiling", "chance")
SMALL = ["--eval-size", "256", "--log-every", "20", "--ckpt-every", "50"]


def _run(tmp_path: Path, name: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    """tiny-grpo as one process (no WORLD_SIZE: no process group), metrics and checkpoints under `name`; its rows
    and stdout."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "LLM_INFRA_MCP_METRICS": str(tmp_path / f"{name}.jsonl"),
        "LLM_INFRA_MCP_CHECKPOINT_DIR": str(tmp_path / f"{name}-ckpt"),
    }
    cmd = [sys.executable, str(recipe_path("tiny-grpo")), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rows, skipped = metrics.read_metrics(env["LLM_INFRA_MCP_METRICS"])
    assert skipped == 0
    return rows, proc.stdout


def _determined(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(r.get(k) for k in DETERMINED) for r in rows]


# ------------------------------------------------------------------------------------------------ exact resume


@pytest.mark.timeout(300)
def test_a_run_stopped_and_continued_logs_the_rows_of_the_run_made_straight_through(tmp_path: Path) -> None:
    # --log-every 25 divides 150: the first part's last train row is one the straight run logs too.
    horizon = ["--eval-horizon", "300", "--evals", "12", *SMALL, "--log-every", "25"]
    straight, _ = _run(tmp_path, "straight", "--steps", "300", *horizon)
    first, _ = _run(tmp_path, "adaptive", "--steps", "150", *horizon)
    both, out = _run(tmp_path, "adaptive", "--steps", "300", *horizon)
    assert "resumed from step 150" in out
    second = both[len(first) :]
    assert second and all(r["step"] > 150 for r in second)  # nothing repeated after the resume

    schedule = load_recipe("tiny-grpo").eval_schedule(300, 12)
    assert 150 not in schedule
    assert [r["step"] for r in straight if r["split"] == "eval"] == schedule
    assert [r["step"] for r in first if r["split"] == "eval"] == [s for s in schedule if s <= 150] + [150]
    # The continued run is the straight one, row for row, plus the evaluation its first part ended with.
    extra = [r for r in _determined(both) if r[0] == 150 and r[1] == "eval"]
    assert len(extra) == 1
    assert [r for r in _determined(both) if r not in extra] == _determined(straight)
    assert len([r for r in straight if r["split"] == "train"]) == 12
    assert all(r["loss"] is not None and r["reward"] is not None for r in straight if r["split"] == "train")


@pytest.mark.timeout(120)
def test_a_checkpoint_carries_torchs_random_state_and_a_resume_restores_it(tmp_path: Path) -> None:
    import torch

    common = load_recipe("tiny-grpo").common
    d = common.Dist(0, 0, 1, torch.device("cpu"), None, 0)
    torch.manual_seed(5)
    torch.rand(3)
    path = common.save_checkpoint(tmp_path, 7, {"x": torch.ones(2)}, d)
    assert path is not None and path.name == "step_00000007.pt"
    expected = torch.rand(4)
    torch.manual_seed(99)  # another state, as a fresh process seeding its model would leave
    state = common.load_latest_checkpoint(tmp_path, d.device)
    assert state is not None and int(state["step"]) == 7
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(99)
    common.load_latest_checkpoint(tmp_path, d.device, restore_rng=False)
    assert not torch.equal(torch.rand(4), expected)


# ------------------------------------------------------------------------------------------------ evaluation


def test_eval_horizon_schedules() -> None:
    grpo = load_recipe("tiny-grpo")
    full = grpo.eval_schedule(400, 10)
    assert grpo.eval_steps(400, 0, 10) == full == grpo.eval_steps(400, 400, 10)
    assert grpo.eval_steps(100, 400, 10) == [s for s in full if s <= 100] + [100]
    assert grpo.eval_steps(200, 400, 10) == [s for s in full if s <= 200] + [200]
    assert grpo.eval_steps(full[6], 400, 10) == full[:7]  # --steps on the schedule: not twice
    assert grpo.eval_steps(100, 0, 10) == grpo.eval_schedule(100, 10)  # no horizon: --steps is one
    assert grpo.eval_steps(500, 400, 10) == [*full, 500]  # past the horizon: its schedule, then --steps


@pytest.mark.timeout(240)
def test_every_training_seed_is_judged_on_the_same_held_out_set(tmp_path: Path) -> None:
    common_args = ["--steps", "30", "--evals", "3", *SMALL]
    ceilings = {}
    for seed in ("0", "1"):
        rows, out = _run(tmp_path, f"seed{seed}", "--seed", seed, *common_args)
        evals = [r for r in rows if r["split"] == "eval"]
        assert [r["step"] for r in evals] == [1, 5, 30]
        assert {r["chance"] for r in evals} == {1 / 16}
        assert len({r["ceiling"] for r in evals}) == 1
        ceilings[seed] = evals[0]["ceiling"]
        assert f"best reachable on the held-out set {ceilings[seed]:.3f}" in out
        losses = [r["loss"] for r in rows if r["split"] == "train"]
        ceilings[f"loss{seed}"] = losses[0]
    assert ceilings["0"] == ceilings["1"]
    assert ceilings["loss0"] != ceilings["loss1"]  # the seeds did train differently
    assert 0.6 < ceilings["0"] < 0.8  # 1 - 0.3 + 0.3 / 16 = 0.72 on average
    other, _ = _run(tmp_path, "eval-seed", "--eval-seed", "3", *common_args)
    assert next(r for r in other if r["split"] == "eval")["ceiling"] != ceilings["0"]


# ------------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "-1"], "argument --lr: must be > 0, got -1"),
        (["--lr", "0"], "argument --lr: must be > 0, got 0"),
        (["--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
        (["--lr=nan"], "argument --lr: must be a finite number, got nan"),
        (["--difficulty", "1.5"], "argument --difficulty: must be in [0, 1], got 1.5"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--steps", "2.5"], "argument --steps: invalid int value: '2.5'"),
        (["--group-size", "1"], "argument --group-size: must be >= 2, got 1"),
        (["--base", "1"], "argument --base: must be >= 2, got 1"),
        (["--kl-coef", "-0.1"], "argument --kl-coef: must be >= 0, got -0.1"),
        (["--lr-decay-steps", "0"], "argument --lr-decay-steps: must be > 0, got 0"),
        (["--seed", "-1"], "argument --seed: must be in [0, 2147483647], got -1"),
        (["--eval-horizon", "-5"], "argument --eval-horizon: must be >= 0, got -5"),
        (["--eval-seed", "x"], "argument --eval-seed: invalid int value: 'x'"),
        (["--eval-size", "0"], "argument --eval-size: must be >= 1, got 0"),
        (["--ckpt-every", "-1"], "argument --ckpt-every: must be >= 0, got -1"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--help"], "-h/--help prints the usage and exits"),
    ],
)
def test_the_parser_refuses_a_bad_value_saying_what_is_accepted(argv: list[str], message: str) -> None:
    with pytest.raises(ArgumentsError) as caught:
        check_args(tiny_grpo, argv)
    assert str(caught.value).startswith(message)


def test_the_parser_accepts_values_on_the_bounds() -> None:
    args = check_args(tiny_grpo, ["--difficulty", "0", "--kl-coef", "0", "--group-size", "2", "--seed", "0"])
    assert (args.difficulty, args.kl_coef, args.group_size) == (0.0, 0.0, 2)
    assert check_args(tiny_grpo, ["--difficulty=1", "--eval-horizon", "0"]).difficulty == 1.0
    assert isinstance(check_args(tiny_grpo, ["--steps", "7"]).steps, int)


def test_the_script_refuses_a_bad_value_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    parser: argparse.ArgumentParser = load_recipe("tiny-grpo").build_parser()
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--lr", "-1"])
    assert caught.value.code == 2
    assert "argument --lr: must be > 0, got -1" in capsys.readouterr().err


def test_the_registry_lists_each_arguments_bounds() -> None:
    grpo = {a.name: a for a in RECIPES["tiny-grpo"].arguments}
    assert (grpo["--lr"].type, grpo["--lr"].exclusive_minimum, grpo["--lr"].minimum) == ("float", 0, None)
    assert (grpo["--difficulty"].minimum, grpo["--difficulty"].maximum) == (0, 1)
    assert (grpo["--group-size"].type, grpo["--group-size"].minimum) == ("int", 2)
    assert grpo["--base"].minimum == 2 and grpo["--steps"].minimum == 1 and grpo["--kl-coef"].minimum == 0
    assert grpo["--lr-decay-steps"].exclusive_minimum == 0
    assert (grpo["--eval-horizon"].minimum, grpo["--eval-horizon"].default) == (0, 0)
    assert (grpo["--eval-seed"].minimum, grpo["--eval-seed"].maximum) == (0, 2**31 - 1)
    gpt = {a.name: a for a in RECIPES["tiny-gpt"].arguments}
    assert gpt["--lr"].exclusive_minimum == 0 and gpt["--heads"].minimum == 1 and gpt["--ckpt-every"].minimum == 0
    trl = RECIPES["trl-grpo"].arguments
    assert all(a.minimum is None and a.maximum is None and a.exclusive_minimum is None for a in trl)
    assert {a.type for a in trl} == {"int", "float", "str"}


def test_check_recipe_args_raises_value_error_naming_the_argument() -> None:
    check_recipe_args("tiny-grpo", ["--lr", "0.05", "--eval-horizon", "800"])
    with pytest.raises(ValueError, match=r"argument --lr: must be > 0, got -1"):
        check_recipe_args("tiny-grpo", ["--lr", "-1"])
    with pytest.raises(ValueError, match=r"argument --steps: invalid int value"):
        check_recipe_args("tiny-gpt", ["--steps", "many"])
    with pytest.raises(ValueError, match="bundled recipes"):
        check_recipe_args("huge-grpo", [])


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_plan_training_job_refuses_bad_recipe_args_naming_the_argument(suite_client: Any) -> None:
    from tests.helpers import call_error, call_ok

    for args, message in [
        (["--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
        (["--lr=-1"], "argument --lr: must be > 0, got -1"),
        (["--lr", "-1"], "argument --lr: must be > 0, got -1"),
        (["--difficulty", "2"], "argument --difficulty: must be in [0, 1], got 2"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    ]:
        text = await call_error(suite_client, "plan_training_job", {"spec": {"recipe": "tiny-grpo", "args": args}})
        assert message in text, text
    text = await call_error(suite_client, "plan_training_job", {"spec": {"recipe": "tiny-gpt", "args": ["--lr", "0"]}})
    assert "argument --lr: must be > 0, got 0" in text
    plan = await call_ok(
        suite_client,
        "plan_training_job",
        {"spec": {"recipe": "tiny-grpo", "args": ["--steps", "50", "--eval-horizon", "400", "--eval-seed", "1"]}},
    )
    assert plan["argv"][-6:] == ["--steps", "50", "--eval-horizon", "400", "--eval-seed", "1"]
