"""The experiment loop (examples/experiment_loop.py, servers/loop): its decisions as plain functions, and the loop end
to end in --quick mode in a subprocess against the real suite over stdio (a fresh state directory each), with a
rerun that must start no job, the HTML report opened in a real browser, and a study whose jobs fail or are killed.
"""

import html
import itertools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import pytest

from servers.loop import study as loop_study
from servers.loop.report import blocks, md_text, render_html, render_markdown
from tests.conftest import REPO_ROOT, headless_dom

LOOP = REPO_ROOT / "examples" / "experiment_loop.py"


# ---- the decisions, on results shaped as the tools return them ---------------------------------------------------


def test_parse_variant() -> None:
    v = loop_study.parse_variant("lr=0.005,group-size=8")
    assert v.name == "lr=0.005,group-size=8"
    assert v.args == ("--lr", "0.005", "--group-size", "8")
    assert loop_study.parse_variant("--lr=0.02").args == ("--lr", "0.02")
    for bad in ("", "lr", "lr=", "=3", "lr=1 2", "l r=3"):
        with pytest.raises(loop_study.StudyError, match="variant"):
            loop_study.parse_variant(bad)


def test_check_variants_against_the_recipe_arguments() -> None:
    arguments = [{"name": n} for n in loop_study.LOOP_FLAGS] + [
        {"name": "--lr", "type": "float", "exclusive_minimum": 0.0},
        {"name": "--group-size", "type": "int", "minimum": 2},
        {"name": "--difficulty", "type": "float", "minimum": 0.0, "maximum": 1.0},
        {"name": "--tag", "type": "str"},
    ]
    assert loop_study.check_variants([loop_study.parse_variant("lr=0.1,group-size=4,tag=x")], arguments) == []
    problems = loop_study.check_variants(
        [loop_study.parse_variant("bogus=1"), loop_study.parse_variant("steps=5")], arguments
    )
    assert any("no --bogus argument" in p for p in problems)
    assert any("--steps is set by the loop" in p for p in problems)
    assert loop_study.check_variants([], [{"name": "--lr"}])  # a recipe without the loop's flags
    # values refused before anything starts, from the types and bounds list_recipes gives
    for text, why in (
        ("lr=abc", "--lr abc: not a number"),
        ("lr=-1", "--lr -1: must be > 0"),
        ("lr=0", "--lr 0: must be > 0"),
        ("lr=nan", "not a finite number"),
        ("group-size=2.5", "--group-size 2.5: not an integer"),
        ("group-size=1", "must be >= 2"),
        ("difficulty=1.5", "must be <= 1"),
    ):
        problems = loop_study.check_variants([loop_study.parse_variant(text)], arguments)
        assert len(problems) == 1 and why in problems[0], (text, problems)


def test_the_ladder_starts_where_the_curves_rise() -> None:
    rates = {"a": 1e7, "b": 1e7, "c": 2e7}
    design = loop_study.design_ladder(
        rates, {"a": 1e9, "b": 2e9, "c": 9e9}, {"a": 4e9, "b": 4e9, "c": 8e9}, unit="flops", compute_key="k", rungs=3
    )
    # c's midpoint lies beyond its pilot: the latest one seen is b's
    assert design.rungs == pytest.approx([4e9, 8e9, 16e9]) and design.target == pytest.approx(16e9)
    assert design.steps == {"a": [400, 800, 1600], "b": [400, 800, 1600], "c": [200, 400, 800]}
    assert design.horizon == {"a": 1600, "b": 1600, "c": 800}
    assert "b: C_mid 2e+09" in design.rule and "c: midpoint beyond the pilot" in design.rule
    # a first rung below the fewest steps is raised to them
    low = loop_study.design_ladder(
        {"a": 1e7, "b": 1e7}, {"a": 1e8, "b": None}, {"a": 4e9, "b": 4e9}, unit="flops", compute_key="k", rungs=2
    )
    assert low.steps["a"][0] == loop_study.MIN_STEPS and "raised" in low.rule
    none = loop_study.design_ladder(
        {"a": 1e7, "b": 1e7}, {"a": None, "b": None}, {"a": 4e9, "b": 4e9}, unit="flops", compute_key="k", rungs=1
    )
    assert none.rungs == [pytest.approx(8e9)] and "no midpoint" in none.rule
    assert loop_study.round_cost([1.0, 2.0, 4.0], 0, 3) == 3.0 and loop_study.round_cost([1.0, 2.0, 4.0], 2, 2) == 4.0


def forecast(value: float, low: float, high: float, fit_id: str = "f") -> dict[str, Any]:
    return {"fit_id": fit_id, "value": value, "ci_low": low, "ci_high": high}


def test_a_round_stops_the_variants_that_cannot_beat_the_leader_by_the_margin() -> None:
    call = loop_study.judge_round(
        {
            "lead": forecast(0.67, 0.665, 0.68),
            "below": forecast(0.40, 0.30, 0.65),  # upper bound under the leader's lower bound
            "tie": forecast(0.665, 0.662, 0.675),  # within 0.02 of the leader either way
            "futile": forecast(0.50, 0.30, 0.678),  # may be far worse, cannot be better by 0.02
            "open": forecast(0.60, 0.50, 0.70),  # could still beat it by more than the margin
            "unfit": None,
        },
        margin=0.02,
    )
    assert call.leader == "lead" and call.stopped == ["below"] and call.tied == ["tie"] and call.futile == ["futile"]
    assert call.continued == ["lead", "open", "unfit"] and call.end is None
    assert "0.650 is below lead's lower bound 0.665" in call.note and "unfit: no forecast" in call.note
    assert "futile stops: its upper bound 0.678 is within the margin 0.02" in call.note
    # the leader alone goes on: the study ends
    done = loop_study.judge_round({"lead": forecast(0.67, 0.66, 0.68), "b": forecast(0.5, 0.4, 0.6)}, margin=0.02)
    assert done.end == "one_leader" and done.continued == ["lead"]
    # overlapping, wider than the margin: both go on; with margin 0 only a variant clearly below stops
    both = loop_study.judge_round({"a": forecast(0.67, 0.6, 0.7), "b": forecast(0.66, 0.62, 0.69)}, margin=0.02)
    assert both.stopped == both.tied == both.futile == [] and both.end is None
    strict = loop_study.judge_round({"a": forecast(0.67, 0.66, 0.68), "b": forecast(0.66, 0.65, 0.665)}, margin=0)
    assert strict.continued == ["a", "b"]
    assert loop_study.judge_round({"a": None, "b": None}, 0.02).leader is None
    # the leader is the surest variant (highest lower bound), not the highest point estimate with a wide interval
    sure = loop_study.judge_round({"wide": forecast(0.70, 0.60, 0.70), "sure": forecast(0.69, 0.685, 0.70)}, 0.02)
    assert sure.leader == "sure" and sure.futile == ["wide"] and sure.end == "one_leader"


def test_the_forecast_decision_quotes_each_stop() -> None:
    ladder = [
        {
            "round": 1,
            "forecasts": {
                "a": forecast(0.67, 0.66, 0.68, "f1"),
                "b": forecast(0.4, 0.3, 0.6, "f2"),
                "c": forecast(0.6, 0.5, 0.7, "f3"),
            },
            "p_leader_higher": {"b": 0.999, "c": 0.91},
        },
        {
            "round": 2,
            "forecasts": {"a": forecast(0.671, 0.665, 0.675, "f4"), "c": forecast(0.668, 0.66, 0.678, "f5")},
            "p_leader_higher": {"c": 0.62},
        },
    ]
    stops = {
        "b": {"round": 1, "kind": "below", "forecast": ladder[0]["forecasts"]["b"], "leader": "a"},
        "c": {"round": 2, "kind": "tied", "forecast": ladder[1]["forecasts"]["c"], "leader": "a"},
        "d": {"round": 1, "kind": "futile", "forecast": forecast(0.5, 0.3, 0.67, "f6"), "leader": "a"},
    }
    d = loop_study.decide_forecast("a", ladder, stops, 0.95, "flops", 1.6e10, 0.02)
    assert d.kind == "forecast" and d.variant == "a" and d.fit_id == "f4"
    assert d.quoted["ties"] == ["c"] and d.quoted["probabilities"] == {"b": 0.999, "c": 0.62, "d": None}
    assert "unable to beat the leader by the margin 0.02" in d.text and "d after round 1" in d.text
    assert "0.671 [0.665, 0.675]" in d.text and "P(a higher) = 1.00" in d.text and "P(a higher) = 0.62" in d.text
    assert loop_study.acceptable(asdict(d)) == frozenset({"a", "c"})
    # a variant whose curve could not be fitted at the target is left out of the decision, and the text says so
    left = loop_study.decide_forecast("a", ladder, stops, 0.95, "flops", 1.6e10, 0.02, unfitted=["e"])
    assert left.quoted["left_out"] == ["e"] and "Left out: e, whose curve could not be fitted" in left.text
    assert loop_study.acceptable(None) == frozenset() and loop_study.acceptable({"variant": None}) == frozenset()


def test_forecasts_are_checked_against_what_the_runs_reached() -> None:
    rows = [{"compute_flops": c, "pass_rate": v} for c, v in ((1e9, 0.2), (8e9, 0.6), (16e9, 0.66))]
    assert loop_study.measured_at(rows, "compute_flops", 16e9) == 0.66
    assert loop_study.measured_at(rows[:2], "compute_flops", 16e9) is None
    ladder = [
        {
            "round": 1,
            "at_target": False,
            "forecasts": {
                "a": {**forecast(0.7, 0.65, 0.72), "pi_low": 0.6, "pi_high": 0.8},
                "b": forecast(0.5, 0.4, 0.6),
            },
        },
        {"round": 2, "at_target": True, "forecasts": {"a": forecast(0.66, 0.65, 0.67)}},
    ]
    checks = loop_study.forecast_checks(ladder, {"a": 0.66})
    assert checks == [
        {
            "variant": "a",
            "round": 1,
            "forecast": 0.7,
            "measured": 0.66,
            "error": pytest.approx(0.04),
            "inside_ci": True,
            "inside_pi": True,
        }
    ]


def test_curve_points_and_the_pilots_rate() -> None:
    rows = [
        {"step": s, "split": "eval", "pass_rate": 0.1 * i, "compute_flops": float(s) * 10}
        for i, s in enumerate([1, 2, 4, 8, 16, 32, 64, 100], start=1)
    ]
    rows.append({"step": 50, "split": "train", "compute_flops": 500.0, "loss": 1.0})  # no pass rate: not a point
    points = loop_study.curve_points(rows, "compute_flops")
    assert len(points) == 8 and points == sorted(points, key=lambda p: p["compute"])
    assert loop_study.per_step_rate(rows, "compute_flops") == pytest.approx(10.0)


def comparison(best: str, pairs: list[tuple[str, str, float, float]], efficient: str) -> dict[str, Any]:
    fits = {
        "f1": {"fit_id": "f1", "label": "x", "asymptote": 0.70, "asymptote_ci": [0.68, 0.72], "c_mid": 2e9, "b": 1.2},
        "f2": {"fit_id": "f2", "label": "y", "asymptote": 0.60, "asymptote_ci": [0.58, 0.62], "c_mid": 1e9, "b": 1.1},
    }
    return {
        "compute_unit": "flops",
        "fits": list(fits.values()),
        "pairs": [
            {"first": a, "second": b, "p_first_higher_asymptote": pa, "p_first_more_efficient": pe}
            for a, b, pa, pe in pairs
        ],
        "best_asymptote": best,
        "most_efficient": efficient,
        "verdict": "...",
    }


def test_decide_follows_the_bootstrap_probabilities() -> None:
    names = {"f1": "lr=0.02", "f2": "lr=0.005"}
    clear = comparison("f1", [("f1", "f2", 0.99, 0.01)], "f2")
    d = loop_study.decide(clear, comparison("f1", [("f2", "f1", 0.01, 0.99)], "f2"), names, 0.95)
    assert d.kind == "asymptote" and d.variant == "lr=0.02" and d.fit_id == "f1"
    assert d.quoted["A"] == 0.70 and d.quoted["probabilities"] == {"lr=0.005": 0.99}
    assert "A=0.700 [0.680, 0.720]" in d.text and "C_mid=2e+09 flops" in d.text and "0.99" in d.text

    tie = comparison("f1", [("f1", "f2", 0.6, 0.02)], "f2")
    efficient = comparison("f1", [("f2", "f1", 0.4, 0.98)], "f2")
    d = loop_study.decide(tie, efficient, names, 0.95)
    assert d.kind == "efficiency" and d.variant == "lr=0.005" and d.quoted["probabilities"] == {"lr=0.02": 0.98}
    assert "C_mid=1e+09 flops" in d.text

    # efficiency is not enough when the other asymptote is clearly higher
    lower = comparison("f1", [("f1", "f2", 0.9, 0.02)], "f2")
    d = loop_study.decide(lower, comparison("f1", [("f2", "f1", 0.01, 0.99)], "f2"), names, 0.95)
    assert d.kind == "none" and d.variant is None and d.leading_variant == "lr=0.02"

    d = loop_study.decide(tie, None, names, 0.95)
    assert d.kind == "none" and "0.60" in d.text
    with pytest.raises(ValueError, match="best asymptote's fit first"):
        loop_study.decide(comparison("f1", [("f2", "f1", 0.1, 0.9)], "f2"), None, names, 0.95)


def test_node_verdict_says_no_gpu_plainly() -> None:
    health = {"available": False, "reason": "no usable NVIDIA driver on this host", "gpu_count": 0, "gpus": []}
    text = loop_study.node_verdict(health, None, "dmesg: Operation not permitted")
    assert text.startswith("No GPU here: no usable NVIDIA driver on this host.")
    assert "Kernel log not read: dmesg: Operation not permitted" in text
    kernel = {
        "matched_lines": 3,
        "lines_read": 100,
        "summary_rows": 1,
        "summary": [{"kind": "xid", "code": 79, "count": 2, "severity": "critical", "action": "drain the node"}],
    }
    assert "xid 79 x2 (critical): drain the node" in loop_study.node_verdict(health, kernel, None)


def test_node_verdict_names_the_gpus_from_one_health_result() -> None:
    finding = {"severity": "critical", "what": "Row remapping failed", "action": "Drain the GPU and replace it"}
    health = {
        "available": True,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "gpu_count": 2,
        "node_status": "unhealthy",
        "counts": {"healthy": 1, "unhealthy": 1},
        "gpus": [
            {"gpu": {"index": 0, "name": "NVIDIA H100 80GB HBM3"}, "status": "healthy", "findings": []},
            {"gpu": {"index": 1, "name": "NVIDIA H100 80GB HBM3"}, "status": "unhealthy", "findings": [finding]},
        ],
    }
    text = loop_study.node_verdict(health, None, None)
    assert text.startswith("2 GPU(s) (NVIDIA H100 80GB HBM3), driver 550.54.15, CUDA 12.4.")
    assert "Health: node unhealthy (1 healthy, 1 unhealthy)." in text
    assert "GPU 1: critical: Row remapping failed; Drain the GPU and replace it." in text
    assert "The GPUs could not be read" in loop_study.node_verdict(None, None, None)


def test_ledger_belongs_to_one_study(tmp_path: Path) -> None:
    from servers.loop.runner import Ledger

    ledger = Ledger(tmp_path / "ledger.json", "a")
    ledger.put("overlap", {"layers": [1]}, "overlap_tune-1")
    again = Ledger(tmp_path / "ledger.json", "a")
    assert again.get("overlap", {"layers": [1]}) == "overlap_tune-1"
    assert again.get("overlap", {"layers": [2]}) is None  # asked differently: not the same job
    with pytest.raises(loop_study.StudyError, match="holds the study 'a'"):
        Ledger(tmp_path / "ledger.json", "b")


def test_report_renders_the_same_blocks_twice() -> None:
    data = {"study": "t", "scaling": {}, "errors": [{"where": "runs", "tool": None, "message": "a|b <x>"}]}
    content = blocks(data, {})
    md, page = render_markdown(content), render_html(content, {}, "t")
    assert "- runs: a\\|b &lt;x&gt;" in md  # escaped for markdown (md_text)
    assert "<li>runs: a|b &lt;x&gt;</li>" in page
    assert "No decision" in md and "No decision" in page


# ---- the loop end to end -------------------------------------------------------------------------------------------


def loop_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_INFRA_MCP_")}
    env.update(LLM_INFRA_MCP_HOME=str(home), LLM_INFRA_MCP_CANCEL_GRACE_S="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def run_loop(home: Path, out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOOP), "--out", str(out), *args],
        cwd=REPO_ROOT,
        env=loop_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def fit_count(home: Path) -> int:
    import sqlite3

    with sqlite3.connect(home / "state.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM fits").fetchone()[0])


def job_count(home: Path) -> int:
    from servers.core.mcp_layer import App
    from servers.core.settings import Settings

    app = App(Settings(home=home), owner="test")
    return app.engine.list_jobs(limit=1).total


class QuickStudy:
    def __init__(self, home: Path, out: Path, first: subprocess.CompletedProcess[str], jobs_after_first: int) -> None:
        self.home, self.out, self.first, self.jobs_after_first = home, out, first, jobs_after_first
        self.study = json.loads((out / "study.json").read_text())


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory: pytest.TempPathFactory) -> QuickStudy:
    """The README's loop in --quick mode, once for the tests below (a fresh state directory)."""
    base = tmp_path_factory.mktemp("loop")
    home, out = base / "state", base / "out"
    started = time.monotonic()
    done = run_loop(home, out, "--quick")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert time.monotonic() - started < 240, "the --quick study is meant for CI: a few minutes at most"
    return QuickStudy(home, out, done, job_count(home))


@pytest.mark.timeout(400)
def test_quick_study_writes_its_report(quick_study: QuickStudy) -> None:
    out = quick_study.out
    for name in ("report.md", "report.html", "study.json", "ladder.png", "fit_full.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    printed = quick_study.first.stdout
    assert str((out / "report.html").resolve()) in printed
    study = quick_study.study
    assert study["node"]["verdict"].startswith("No GPU here") or study["node"]["gpu_count"] > 0
    if study["node"]["gpu_count"] == 0:  # on CPU the overlap step is skipped, in one line that says why
        assert "Overlap skipped (no GPU here)" in study["overlap"]["skipped"] and not (out / "overlap.png").exists()
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    decision = study["scaling"]["decision"]
    assert md_text(decision["text"]) in md and html.escape(decision["text"]) in page
    # self-contained: every picture inline, nothing fetched from elsewhere
    sources = re.findall(r'<img[^>]*src="([^"]*)"', page)
    assert len(sources) >= 2 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)
    assert study["errors"] == [], study["errors"]


@pytest.mark.timeout(400)
def test_quick_study_stops_on_forecasts_and_decides_from_them(quick_study: QuickStudy) -> None:
    """Each round's stops follow from its forecasts and the rule; every round after the first continues exactly
    the variants the round before kept, from their previous jobs' checkpoints; the decision quotes the forecasts."""
    scaling = quick_study.study["scaling"]
    design, ladder, stops = scaling["design"], scaling["ladder"], scaling["stops"]
    margin, target = design["margin"], design["target"]
    assert (
        design["ceiling"] is not None and 0.5 < design["ceiling"] < 1 and "held-out prompts" in design["ceiling_note"]
    )
    assert "6 x parameters" in design["compute_counts"] and design["rungs"][-1] == target
    assert ladder and [r["round"] for r in ladder] == list(range(1, len(ladder) + 1))
    active = [v["name"] for v in quick_study.study["config"]["variants"]]
    for rnd in ladder:
        assert rnd["active"] == active
        forecasts = {v: f for v, f in rnd["forecasts"].items() if f}
        leader = max(forecasts, key=lambda v: (forecasts[v]["ci_low"], forecasts[v]["value"]))
        assert rnd["leader"] == leader
        floor = forecasts[leader]["ci_low"] + margin + 1e-12
        stopped = {v for v, f in forecasts.items() if v != leader and f["ci_high"] <= floor}
        assert set(rnd["stopped"]) | set(rnd["tied"]) | set(rnd["futile"]) == stopped
        assert all(forecasts[v]["ci_high"] < forecasts[leader]["ci_low"] for v in rnd["stopped"])
        for v in stopped:
            assert stops[v]["round"] == rnd["round"] and stops[v]["forecast"] == forecasts[v]
        active = rnd["continued"]
    chains = scaling["chains"]
    for chain in chains:
        segments = chain["segments"]
        assert [s["round"] for s in segments] == list(range(1, len(segments) + 1))
        for before, after in itertools.pairwise(segments):
            assert after["resumed_from"] == before["job_id"]
            assert abs(after["steps"] - 2 * before["steps"]) <= 1
        steps = [r["step"] for r in chain["rows"]]
        assert steps == sorted(set(steps)), "a continued run evaluates after its resume point only"
        stopped_at = stops.get(chain["variant"], {}).get("round")
        assert len(segments) == (stopped_at or len(ladder))
    decision = scaling["decision"]
    end = scaling["end"]
    if end["why"] == "one_leader":
        assert decision["kind"] == "forecast" and decision["variant"] == ladder[-1]["leader"]
        last = ladder[-1]["forecasts"][decision["variant"]]
        assert decision["quoted"]["forecast"] == last
        assert f"{last['value']:.3f} [{last['ci_low']:.3f}, {last['ci_high']:.3f}]" in decision["text"]
        assert set(decision["quoted"]["probabilities"]) == set(stops)
        for value in decision["quoted"]["probabilities"].values():
            assert value is None or f"{value:.2f}" in decision["text"]
    else:
        assert decision == scaling["rounds"][-1]["decision"]
    spent = scaling["spent"]
    assert spent["share"] == pytest.approx(spent["compute"] / spent["exhaustive_equivalent"])
    assert spent["exhaustive_equivalent"] == pytest.approx(len(chains) * target)


@pytest.mark.timeout(400)
def test_quick_study_numbers_come_from_the_tools(quick_study: QuickStudy) -> None:
    """Every forecast is what predict_scaling returned for its round's fit at the target, every curve point a row
    read_job_metrics returned for the chain's own jobs."""
    study = quick_study.study
    calls = study["calls"]
    target = study["scaling"]["design"]["target"]
    predictions = {
        c["args"]["fit_id"]: c["result"]
        for c in calls
        if c["tool"] == "predict_scaling" and c["ok"] and c["args"]["compute"] == [target]
    }
    metrics: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        if c["tool"] == "read_job_metrics" and c["ok"]:
            metrics.setdefault(c["args"]["job_id"], []).extend(c["result"]["rows"])
    for rnd in study["scaling"]["ladder"]:
        for f in rnd["forecasts"].values():
            returned = predictions[f["fit_id"]]
            assert returned["values"][0]["compute"] == target
            assert {k: returned["values"][0][k] for k in ("value", "ci_low", "ci_high")} == {
                k: f[k] for k in ("value", "ci_low", "ci_high")
            }
    for chain in study["scaling"]["chains"]:
        mine = [r for s in chain["segments"] for r in metrics[s["job_id"]] if r.get("split") == "eval"]
        assert chain["rows"] == mine
    tools = {c["tool"] for c in calls}
    for tool in (
        "gpu_health",
        "list_recipes",
        "plan_training_job",
        "submit_training_job",
        "wait_for_job",
        "read_job_metrics",
        "fit_scaling_law",
        "predict_scaling",
        "compare_scaling_fits",
        "plot_scaling_fit",
    ):
        assert tool in tools, tool
    assert not any(k in json.dumps(c["args"]) for c in calls for k in ("eyJ",)), "tokens are not recorded"


@pytest.mark.timeout(400)
def test_quick_study_rerun_starts_no_job_and_stores_no_fit_twice(quick_study: QuickStudy) -> None:
    fits_before = fit_count(quick_study.home)
    again = run_loop(quick_study.home, quick_study.out, "--quick")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert job_count(quick_study.home) == quick_study.jobs_after_first
    assert fit_count(quick_study.home) == fits_before
    study = json.loads((quick_study.out / "study.json").read_text())
    assert study["jobs"] and all(j["reused"] for j in study["jobs"])
    assert study["scaling"]["decision"]["text"] == quick_study.study["scaling"]["decision"]["text"]


IMAGE_PROBE = """<script>
window.addEventListener('load', () => {
  const seen = Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight]);
  const out = document.createElement('pre'); out.id = 'image-probe'; out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.timeout(400)
def test_quick_report_images_load_in_a_real_browser(quick_study: QuickStudy, tmp_path: Path) -> None:
    """report.html opened in headless Chromium: every image has loaded (naturalWidth > 0). A probe script is added
    to a copy of the page (the report itself has no script) and reports what the browser sees."""
    page = (quick_study.out / "report.html").read_text()
    assert "<script" not in page
    copy = tmp_path / "report.html"
    copy.write_text(page.replace("</body>", IMAGE_PROBE + "</body>"))
    dom = headless_dom(copy, tmp_path, "--virtual-time-budget=10000", why="the report's browser check needs it")
    found = re.search(r'<pre id="image-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run: " + dom[-2000:]
    seen = json.loads(found.group(1))
    assert len(seen) == page.count("<img ") >= 2
    assert all(complete and width > 0 and height > 0 for complete, width, height in seen), seen


# ---- failures: a variant whose jobs fail, a job killed while it runs ---------------------------------------------


async def kill_a_round_one_run(home: Path, limit_s: float) -> tuple[str | None, str | None]:
    """From a second suite server on the same state directory (as a person's other client would): wait until a
    round-1 training run of the study runs, then cancel_job it. (the job id, the state cancel_job left it in)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(
        command=sys.executable, args=["-m", "servers.cli", "serve", "suite"], env=loop_env(home), cwd=str(REPO_ROOT)
    )
    async with Client(server) as client:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            listed = await client.call_tool(
                "list_jobs", {"kind": "training", "state": "RUNNING", "limit": 10, "detail": True}
            )
            assert not listed.is_error, listed.content[0].text
            for job in (listed.structured_content or {}).get("details", []):
                if "round:1" in ((job["spec"].get("training_spec") or {}).get("tags") or []):
                    done = await client.call_tool("cancel_job", {"job_id": job["job_id"]})
                    assert not done.is_error, done.content[0].text
                    return job["job_id"], done.structured_content["state"]
            await anyio.sleep(0.1)
    return None, None


@pytest.mark.timeout(600)
def test_a_killed_job_is_reported_the_study_goes_on_and_a_rerun_tries_it_again(tmp_path: Path) -> None:
    """One round-1 run is killed (cancel_job's SIGTERM/SIGKILL) while it runs: it is in the report with its reason,
    its chain ends there and nothing of it is fitted; the study decides from what is left. A rerun of the study
    starts nothing that succeeded and tries the killed run once more, under a new key."""
    home, out = tmp_path / "state", tmp_path / "out"
    args = [
        sys.executable,
        str(LOOP),
        "--out",
        str(out),
        "--quick",
        "--no-overlap",
        "--seeds",
        "2",
        "--rungs",
        "2",
        "--name",
        "failing",
        "--variants",
        "lr=0.02",
        "lr=0.005",
    ]
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=loop_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        killed, state = anyio.run(kill_a_round_one_run, home, 360.0)
        assert killed is not None, "no round-1 run was seen running"
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert state == "CANCELLED", f"{killed} ended {state} before it could be killed"
    assert proc.returncode == 0, output[-4000:]
    study = json.loads((out / "study.json").read_text())
    scaling = study["scaling"]
    errors = " ".join(e["message"] for e in study["errors"])
    assert killed in errors and "rerun the study to try it again" in errors
    chain = next(c for c in scaling["chains"] if any(s["job_id"] == killed for s in c["segments"]))
    assert chain["failed"] and chain["segments"][-1]["state"] == "CANCELLED" and chain["rows"] == []
    assert scaling["decision"] is not None
    md = (out / "report.md").read_text()
    assert killed in md and "CANCELLED" in md
    jobs_before = job_count(home)
    again = run_loop(home, out, *args[4:])
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert f"{killed} CANCELLED in an earlier run of the study; trying again" in again.stdout
    study = json.loads((out / "study.json").read_text())
    chain = next(
        c for c in study["scaling"]["chains"] if c["variant"] == chain["variant"] and c["seed"] == chain["seed"]
    )
    retried = chain["segments"][0]
    assert retried["retried"] == killed and retried["state"] == "SUCCEEDED" and retried["job_id"] != killed
    assert not chain.get("failed") and chain["rows"]
    started = job_count(home) - jobs_before
    assert 1 <= started <= 1 + len(study["scaling"]["design"]["rungs"]) - 1  # the retried run (and what follows it)


@pytest.mark.timeout(120)
def test_a_study_that_cannot_run_says_why_and_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "state"
    for variant, why in (
        ("bogus=1", "the recipe has no --bogus argument"),
        ("lr=abc", "--lr abc: not a number"),
        ("lr=-1", "--lr -1: must be > 0"),
        ("group-size=1", "--group-size 1: must be >= 2"),
    ):
        done = run_loop(home, tmp_path / "out", "--quick", "--variants", "lr=0.02", variant, timeout=100)
        assert done.returncode == 2 and why in done.stderr, (variant, done.stderr)
    assert not (home / "state.db").exists() or job_count(home) == 0
    one = run_loop(home, tmp_path / "out2", "--quick", "--variants", "lr=0.02", timeout=100)
    assert one.returncode == 2 and "at least two variants" in one.stderr


# ---- the same study on a cluster engine ----------------------------------------------------------------------------


# Two variants, two rungs: a pilot, a first round, and a second round continued from the first's checkpoints (on
# the cluster: the copy into the new job's folder, then the recipe's resume) when the first does not decide.
CLUSTER_STUDY = ("--quick", "--no-overlap", "--rungs", "2", "--variants", "lr=0.02", "lr=0.005")


def cluster_study(tmp_path: Path, backend: str, extra_env: dict[str, str]) -> dict[str, Any]:
    home, out = tmp_path / "state", tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(LOOP), "--out", str(out), *CLUSTER_STUDY, "--backend", backend],
        cwd=REPO_ROOT,
        env={**loop_env(home), **extra_env},
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    study = json.loads((out / "study.json").read_text())
    assert study["backend"]["name"] == backend and study["errors"] == []
    jobs = study["jobs"]
    assert jobs and all(j["kind"] == "training_remote" and j["state"] == "SUCCEEDED" for j in jobs)
    assert study["scaling"]["decision"] is not None
    for chain in study["scaling"]["chains"]:
        for before, after in itertools.pairwise(chain["segments"]):
            assert after["resumed_from"] == before["job_id"] and after["state"] == "SUCCEEDED"
    return study


@pytest.mark.timeout(400)
def test_quick_study_on_ray(ray_head: Any, tmp_path: Path) -> None:
    """--backend ray: the same study through the Ray Jobs API of a real local head; every run is a Ray job followed
    by a job of the engine here, and the study ends in a decision."""
    cluster_study(tmp_path, "ray", {"LLM_INFRA_MCP_RAY_ADDRESS": ray_head.address, "RAY_AUTH_TOKEN": ray_head.token})


@pytest.mark.timeout(400)
def test_quick_study_on_slurm(slurm_cluster: Path, tmp_path: Path) -> None:
    """--backend slurm: the same study as sbatch jobs on the real two-node test cluster (tests/conftest.py)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    cluster_study(tmp_path, "slurm", {"SLURM_CONF": str(slurm_cluster / "slurm.conf"), "PATH": path})
