"""The experiment loop (examples/experiment_loop.py, servers/loop): its decisions as plain functions, and the loop end
to end in --quick mode in a subprocess against the real suite over stdio (a fresh state directory each), with a
rerun that must start no job, the HTML report opened in a real browser, and a study whose jobs fail or are killed.
"""

import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from servers.loop import study as loop_study
from servers.loop.report import blocks, md_text, render_html, render_markdown
from tests.conftest import REPO_ROOT, skip_unless_present

LOOP = REPO_ROOT / "examples" / "experiment_loop.py"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


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
    arguments = [{"name": n} for n in ("--steps", "--seed", "--evals", "--lr", "--group-size")]
    assert loop_study.check_variants([loop_study.parse_variant("lr=0.1")], arguments) == []
    problems = loop_study.check_variants(
        [loop_study.parse_variant("bogus=1"), loop_study.parse_variant("steps=5")], arguments
    )
    assert any("no --bogus argument" in p for p in problems)
    assert any("--steps is set by the loop" in p for p in problems)
    assert loop_study.check_variants([], [{"name": "--lr"}])  # a recipe without the loop's flags


def test_split_budget_reserves_a_doubling_follow_up() -> None:
    plan = loop_study.split_budget(1.2e11, "flops", {"a": 1e7, "b": 2e7}, seeds=2, followup=True)
    assert plan.runs == 4
    assert plan.reserve == pytest.approx(1.2e11 * 2 / 6)
    assert plan.per_run == pytest.approx((1.2e11 - plan.reserve) / 4)
    assert plan.steps == {"a": int(plan.per_run / 1e7), "b": int(plan.per_run / 2e7)}
    # the follow-up run of either variant has twice the compute of one of its round-1 runs
    for name, rate in plan.per_step.items():
        assert plan.followup_steps[name] * rate == pytest.approx(2 * plan.steps[name] * rate, rel=1e-3)
    whole = loop_study.split_budget(1.2e11, "flops", {"a": 1e7, "b": 2e7}, seeds=2, followup=False)
    assert whole.reserve == 0 and whole.followup_steps == {}
    with pytest.raises(loop_study.StudyError, match="at least 200 steps"):
        loop_study.split_budget(1e9, "flops", {"a": 1e7, "b": 1e7}, seeds=2, followup=True)


def test_held_out_split_and_errors() -> None:
    rows = [
        {"step": s, "split": "eval", "pass_rate": 0.1 * i, "compute_flops": float(s) * 10}
        for i, s in enumerate([1, 2, 4, 8, 16, 32, 64, 100], start=1)
    ]
    rows.append({"step": 50, "split": "train", "compute_flops": 500.0, "loss": 1.0})  # no pass rate: not a point
    points = loop_study.curve_points(rows, "compute_flops")
    assert len(points) == 8 and points == sorted(points, key=lambda p: p["compute"])
    split, _, held = loop_study.held_out(points)
    assert split == 500.0
    assert [p["compute"] for p in held] == [640.0, 1000.0]
    predicted = [{"value": 0.75, "pi_low": 0.6, "pi_high": 0.8}, {"value": 0.70, "pi_low": 0.6, "pi_high": 0.78}]
    table = loop_study.error_rows(held, predicted)
    assert [r["error"] for r in table] == pytest.approx([0.75 - 0.7, 0.70 - 0.8])
    assert [r["inside_pi"] for r in table] == [True, False]
    summary = loop_study.error_summary(table)
    assert summary["mean_abs_error"] == pytest.approx(0.075) and summary["max_abs_error"] == pytest.approx(0.1)
    assert summary["inside_pi"] == 1 and summary["judged"] == 2
    with pytest.raises(ValueError):
        loop_study.error_rows(held, predicted[:1])
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


def test_followup_needed() -> None:
    plan = loop_study.split_budget(1.2e11, "flops", {"a": 1e7, "b": 1e7}, seeds=2, followup=True)
    check = {"models": [{"model": "scalerl", "mean_abs_error": 0.05}, {"model": "power_law", "mean_abs_error": 0.01}]}
    needed, why = loop_study.followup_needed(check, 0.02, plan, "a")
    assert needed and "0.0500 > 0.02" in why
    needed, why = loop_study.followup_needed(check, 0.1, plan, "a")
    assert not needed and "within the threshold" in why
    assert not loop_study.followup_needed(None, 0.02, plan, "a")[0]
    assert not loop_study.followup_needed(check, 0.02, None, "a")[0]
    assert not loop_study.followup_needed(check, 0.02, plan, None)[0]


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
    for name in ("report.md", "report.html", "study.json", "fit_heldout.png", "fit_full.png", "overlap.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    printed = quick_study.first.stdout
    assert str((out / "report.html").resolve()) in printed
    study = quick_study.study
    assert study["node"]["verdict"].startswith("No GPU here") or study["node"]["gpu_count"] > 0
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    decision = study["scaling"]["decision"]
    assert md_text(decision["text"]) in md and html.escape(decision["text"]) in page
    # self-contained: every picture inline, nothing fetched from elsewhere
    sources = re.findall(r'<img[^>]*src="([^"]*)"', page)
    assert len(sources) >= 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)
    assert study["errors"] == [], study["errors"]


@pytest.mark.timeout(400)
def test_quick_study_decision_follows_the_fits_it_quotes(quick_study: QuickStudy) -> None:
    scaling = quick_study.study["scaling"]
    final = scaling["rounds"][-1]
    decision = scaling["decision"]
    assert decision == final["decision"]
    comparison = final["comparison"]
    fits = {f["fit_id"]: f for f in comparison["fits"]}
    full = {name: v["full"] for name, v in final["variants"].items()}
    level = scaling["level"]
    # the comparison is of the variants' fits on all compute, best asymptote first
    assert set(fits) == {f["fit_id"] for f in full.values()}
    assert comparison["fits"][0]["fit_id"] == comparison["highest_fitted_asymptote"]
    assert fits[comparison["highest_fitted_asymptote"]]["asymptote"] == max(f["asymptote"] for f in fits.values())
    quoted = decision["quoted"]
    fit = fits[quoted["fit_id"]]
    variant = final["variant_of_fit"][quoted["fit_id"]]
    assert quoted["A"] == fit["asymptote"] == full[variant]["parameters"]["A"]["value"]
    assert quoted["C_mid"] == fit["c_mid"] == full[variant]["parameters"]["C_mid"]["value"]
    assert f"A={quoted['A']:.3f}" in decision["text"] and f"C_mid={quoted['C_mid']:.3g}" in decision["text"]
    if decision["kind"] == "asymptote":
        pairs = [p for p in comparison["pairs"] if p["first"] == quoted["fit_id"]]
        assert quoted["fit_id"] == comparison["best_asymptote"] and decision["variant"] == variant
        assert all(p["p_first_higher_asymptote"] >= level for p in pairs)
        assert quoted["probabilities_by_fit"] == {p["second"]: p["p_first_higher_asymptote"] for p in pairs}
    elif decision["kind"] == "efficiency":
        other = final["comparison_efficient_first"]
        pairs = [p for p in other["pairs"] if p["first"] == quoted["fit_id"]]
        assert quoted["fit_id"] == comparison["most_efficient"] and decision["variant"] == variant
        assert all(p["p_first_more_efficient"] >= level for p in pairs)
        assert all(p["p_first_higher_asymptote"] >= 1 - level for p in pairs)
        assert quoted["probabilities_by_fit"] == {p["second"]: p["p_first_more_efficient"] for p in pairs}
    else:
        pairs = [p for p in comparison["pairs"] if p["first"] == comparison["highest_fitted_asymptote"]]
        unsure = min(p["p_first_higher_asymptote"] for p in pairs) < level or comparison["best_asymptote"] is None
        assert decision["variant"] is None and unsure
    for value in quoted["probabilities"].values():
        assert f"{value:.2f}" in decision["text"]
    # The follow-up round ran (the quick study's held-out errors are far above its threshold) and the final round's
    # fits include its run: the one study that runs it end to end (the cluster studies leave it out).
    followup = scaling["followup"]
    assert followup["needed"], followup["reason"]
    extra = followup["run"]
    assert extra["round"] == "2" and extra["state"] == "SUCCEEDED", extra
    assert len(scaling["rounds"]) == 2 and extra["job_id"] in final["variants"][extra["variant"]]["runs"]
    assert [s["key"] for s in scaling["sweeps"]] == ["pilot-0", "1-0", "2-0"]


@pytest.mark.timeout(400)
def test_quick_study_numbers_come_from_the_tools(quick_study: QuickStudy) -> None:
    """Every held-out prediction is a value predict_scaling returned, every measurement a row read_job_metrics
    returned; the held-out points are the run's points beyond half its largest compute."""
    study = quick_study.study
    calls = study["calls"]
    predictions = {c["args"]["fit_id"]: c["result"] for c in calls if c["tool"] == "predict_scaling" and c["ok"]}
    metrics: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        if c["tool"] == "read_job_metrics" and c["ok"]:
            metrics.setdefault(c["args"]["job_id"], []).extend(c["result"]["rows"])
    key = study["scaling"]["compute_key"]
    held = study["scaling"]["held_out"]
    assert held and all(h.get("rows") for h in held)
    for h in held:
        returned = predictions[h["fit"]["fit_id"]]["values"]
        assert [r["predicted"] for r in h["rows"]] == [v["value"] for v in returned]
        measured = {
            row[key]: row["pass_rate"] for row in metrics[h["job_id"]] if row.get("split") == "eval" and key in row
        }
        assert all(measured[r["compute"]] == r["measured"] for r in h["rows"])
        assert all(r["compute"] > max(measured) / 2 for r in h["rows"])
        assert len(h["rows"]) == sum(1 for c in measured if c > max(measured) / 2)
    tools = {c["tool"] for c in calls}
    for tool in (
        "gpu_health",
        "predict_overlap",
        "tune_overlap",
        "plan_sweep",
        "submit_sweep",
        "wait_for_job",
        "read_job_metrics",
        "fit_scaling_law",
        "predict_scaling",
        "check_extrapolation",
        "compare_scaling_fits",
        "plot_scaling_fit",
    ):
        assert tool in tools, tool
    assert not any(k in json.dumps(c["args"]) for c in calls for k in ("eyJ",)), "tokens are not recorded"


@pytest.mark.timeout(400)
def test_quick_study_rerun_starts_no_job(quick_study: QuickStudy) -> None:
    again = run_loop(quick_study.home, quick_study.out, "--quick")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert job_count(quick_study.home) == quick_study.jobs_after_first
    study = json.loads((quick_study.out / "study.json").read_text())
    assert study["jobs"] and all(j["reused"] for j in study["jobs"])
    sweeps = study["scaling"]["sweeps"]
    assert sweeps and all(s["started"] == 0 for s in sweeps)
    assert "none started again" in again.stdout
    assert study["scaling"]["decision"]["text"] == quick_study.study["scaling"]["decision"]["text"]


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM if (path := shutil.which(name))), None)


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
    browser = find_chromium()
    if browser is None:
        skip_unless_present(
            "chromium is not installed (apt-get install -y chromium): the report's browser check needs it"
        )
    page = (quick_study.out / "report.html").read_text()
    assert "<script" not in page
    copy = tmp_path / "report.html"
    copy.write_text(page.replace("</body>", IMAGE_PROBE + "</body>"))
    args = [browser, "--headless", "--disable-gpu", "--no-first-run", "--virtual-time-budget=10000", "--dump-dom"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    done = subprocess.run(
        [*args, copy.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r'<pre id="image-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, "the probe did not run: " + done.stdout[-2000:]
    seen = json.loads(found.group(1))
    assert len(seen) == page.count("<img ") >= 3
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
            for job in (listed.structured_content or {}).get("details", []):
                if "round:1" in ((job["spec"].get("training_spec") or {}).get("tags") or []):
                    done = await client.call_tool("cancel_job", {"job_id": job["job_id"]})
                    assert not done.is_error, done.content[0].text
                    return job["job_id"], done.structured_content["state"]
            await anyio.sleep(0.1)
    return None, None


@pytest.mark.timeout(400)
def test_failed_and_killed_jobs_are_reported_and_the_study_goes_on(tmp_path: Path) -> None:
    """A third variant (group-size=1: tiny-grpo refuses it and exits with an error) fails its pilot, and one round-1
    run is killed (cancel_job's SIGTERM/SIGKILL) while it runs: both are in the report, with the reason, and left
    out of the fits; the study compares what is left and decides, and no number is shown for the failed runs."""
    home, out = tmp_path / "state", tmp_path / "out"
    args = [
        sys.executable,
        str(LOOP),
        "--out",
        str(out),
        "--quick",
        "--no-overlap",
        "--no-followup",
        "--seeds",
        "2",
        "--budget",
        "6e10",  # 4 runs of ~1.7k steps: each runs long enough (seconds) to be seen RUNNING and killed
        "--name",
        "failing",
        "--variants",
        "lr=0.02",
        "lr=0.005",
        "group-size=1",
    ]
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=loop_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        killed, state = anyio.run(kill_a_round_one_run, home, 240.0)
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
    assert scaling["dropped_variants"] == ["group-size=1"]
    failed_pilot = next(r for r in scaling["pilot"]["runs"] if r["variant"] == "group-size=1")
    assert failed_pilot["state"] == "FAILED" and failed_pilot["job_id"] in errors
    assert "group-size" in (failed_pilot.get("log_tail") or "") + (failed_pilot.get("reason") or "")
    run = next(r for r in scaling["runs"] if r.get("job_id") == killed)
    assert run["state"] == "CANCELLED" and killed in errors and "rows" not in run
    # left out of everything that was fitted
    assert all(h["job_id"] != killed for h in scaling["held_out"])
    for variant in scaling["rounds"][-1]["variants"].values():
        assert killed not in variant["runs"]
    assert scaling["decision"] is not None
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| 1 |") and killed in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "CANCELLED" and cells[6] == "-" and cells[7] == "-", row  # no pass rate, no compute
    assert "group-size=1 was left out" in md and killed in md.split("## Errors and notes")[1]


@pytest.mark.timeout(120)
def test_a_study_that_cannot_run_says_why_and_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "state"
    done = run_loop(home, tmp_path / "out", "--quick", "--variants", "lr=0.02", "bogus=1", timeout=100)
    assert done.returncode == 2
    assert "the recipe has no --bogus argument" in done.stderr
    assert not (home / "state.db").exists() or job_count(home) == 0
    one = run_loop(home, tmp_path / "out2", "--quick", "--variants", "lr=0.02", timeout=100)
    assert one.returncode == 2 and "at least two variants" in one.stderr


# ---- the same study on a cluster engine ----------------------------------------------------------------------------


# The quick study less its overlap step and its follow-up round (one more sweep of the same kind, which the local
# quick study has): round 1 as in the quick study (its budget less the follow-up's reserve, 2 runs of ~1.1k steps).
CLUSTER_STUDY = ("--quick", "--no-overlap", "--no-followup", "--budget", "2e10")


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
