"""The experiment loop's report (servers/loop/report.py) for issue 25's adaptive study: the ladder as a picture
(ladder_figure / ladder_chart) and as tables, the design, the stops, the end, the compute spent; the overlap chart's
marks and legend; one rounding for every probability; a skipped overlap; hostile variant names escaped.

Every study here is synthetic (a dict shaped as study.json's), so these tests run no job and need no server."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from servers.loop import report
from servers.loop.report import (
    blocks,
    ladder_chart,
    ladder_figure,
    md_text,
    overlap_figure,
    render_html,
    render_markdown,
    write_report,
)
from tests.conftest import headless_dom

TARGET = 1.6e10
RUNGS = [4e9, 8e9, TARGET]
LEADER, LOSER, THIRD, TIED = "lr=0.005", "lr=0.0005", "lr=0.002,group-size=8", "group-size=4"


def forecast(value: float, low: float, high: float, points: int, max_compute: float) -> dict[str, Any]:
    return {
        "fit_id": f"fit-{value:.3f}",
        "value": value,
        "ci_low": low,
        "ci_high": high,
        "pi_low": low - 0.02,
        "pi_high": high + 0.02,
        "points": points,
        "max_compute": max_compute,
    }


def chain(variant: str, seed: int, top: float, last_compute: float) -> dict[str, Any]:
    """A rising eval curve from 1e9 to last_compute (8 points per rung), resumed once per rung reached."""
    computes = [c for c in (1e9 * 2 ** (i / 4) for i in range(40)) if c <= last_compute * 1.0001]
    rows = [
        {"step": 10 * i, "split": "eval", "compute_flops": c, "pass_rate": top * c / (c + 3e9)}
        for i, c in enumerate(computes)
    ]
    rounds = [i + 1 for i, c in enumerate(RUNGS) if c <= last_compute * 1.0001]
    segments = [
        {
            "round": r,
            "job_id": f"training_{variant}-s{seed}-r{r}-0123456789abcdef",
            "steps": 100 * r,
            "resumed_from": None if r == 1 else f"training_{variant}-s{seed}-r{r - 1}-0123456789abcdef",
            "state": "SUCCEEDED",
        }
        for r in rounds
    ]
    return {"variant": variant, "seed": seed, "segments": segments, "rows": rows}


def study(**scaling_extra: Any) -> dict[str, Any]:
    """A finished adaptive study of four variants x two seeds: LOSER stopped after round 1, THIRD (below the leader)
    and TIED (tied with it) after round 2, LEADER run to the target; an exhaustive reference for two of them; the
    overlap skipped on CPU."""
    variants = [LEADER, LOSER, THIRD, TIED]
    scaling: dict[str, Any] = {
        "recipe": "tiny-grpo",
        "unit": "FLOPs",
        "mode": "adaptive",
        "design": {
            "unit": "FLOPs",
            "compute_key": "compute_flops",
            "rungs": RUNGS,
            "target": TARGET,
            "steps": {v: [100, 200, 400] for v in variants},
            "pilot": {v: {"c_mid": 3e9, "fit_id": f"pilot-{i}", "rate": 4e7} for i, v in enumerate(variants)},
            "rule": "the first rung reaches twice the pilot's C_mid, each next one doubles it.",
            "ceiling": 0.703,
            "ceiling_note": "the best pass rate reachable on the held-out set (recipe's own measure).",
            "compute_counts": "6 x parameters x prompts, training only.",
            "stop_rule": "stop a variant when its CI's top at the target is below the leader's CI's bottom.",
            "level": 0.95,
            "metric": "pass_rate",
            "metric_label": "eval pass rate",
        },
        "ladder": [
            {
                "round": 1,
                "compute": RUNGS[0],
                "active": variants,
                "forecasts": {
                    LEADER: forecast(0.66, 0.62, 0.70, 16, RUNGS[0]),
                    LOSER: forecast(0.41, 0.35, 0.47, 16, RUNGS[0]),
                    THIRD: forecast(0.60, 0.55, 0.66, 16, RUNGS[0]),
                    TIED: forecast(0.65, 0.60, 0.70, 16, RUNGS[0]),
                },
                "leader": LEADER,
                "p_leader_higher": {LOSER: 0.99876, THIRD: 0.8149, TIED: 0.6},
                "stopped": [LOSER],
                "tied": [],
                "continued": [LEADER, THIRD, TIED],
                "note": "lr=0.0005's forecast CI lies below the leader's.",
            },
            {
                "round": 2,
                "compute": RUNGS[1],
                "active": [LEADER, THIRD, TIED],
                "forecasts": {
                    LEADER: forecast(0.67, 0.65, 0.69, 24, RUNGS[1]),
                    THIRD: forecast(0.58, 0.55, 0.61, 24, RUNGS[1]),
                    TIED: forecast(0.668, 0.655, 0.685, 24, RUNGS[1]),
                },
                "leader": LEADER,
                "p_leader_higher": {THIRD: 0.996, TIED: 0.5449},
                "stopped": [THIRD],
                "tied": [TIED],
                "continued": [LEADER],
                "note": "",
            },
        ],
        "stops": {
            LOSER: {
                "round": 1,
                "compute": RUNGS[0],
                "forecast": forecast(0.41, 0.35, 0.47, 16, RUNGS[0]),
                "leader": LEADER,
                "reason": "upper bound 0.47 below the leader's lower bound 0.62",
            },
            THIRD: {
                "round": 2,
                "compute": RUNGS[1],
                "forecast": forecast(0.58, 0.55, 0.61, 24, RUNGS[1]),
                "leader": LEADER,
                "reason": "upper bound 0.61 below the leader's lower bound 0.65",
                "kind": "below",
            },
            TIED: {
                "round": 2,
                "compute": RUNGS[1],
                "forecast": forecast(0.668, 0.655, 0.685, 24, RUNGS[1]),
                "leader": LEADER,
                "reason": "both intervals within 0.03 of each other",
                "kind": "tied",
            },
        },
        "forecast_checks": [
            {
                "variant": LEADER,
                "round": 1,
                "forecast": 0.66,
                "measured": 0.585,
                "error": 0.075,
                "inside_ci": False,
                "inside_pi": None,
            }
        ],
        "end": {"why": "one_leader", "text": "lr=0.005 leads every other variant at the 0.95 level."},
        "chains": [
            chain(LEADER, 0, 0.70, TARGET),
            chain(LEADER, 1, 0.69, TARGET),
            chain(LOSER, 0, 0.45, RUNGS[0]),
            chain(LOSER, 1, 0.44, RUNGS[0]),
            chain(THIRD, 0, 0.60, RUNGS[1]),
            chain(THIRD, 1, 0.59, RUNGS[1]),
            chain(TIED, 0, 0.66, RUNGS[1]),
            chain(TIED, 1, 0.65, RUNGS[1]),
        ],
        "spent": {
            "compute": 5.6e10,
            "unit": "FLOPs",
            "exhaustive_equivalent": 9.6e10,
            "share": 0.58333,
            "budget": None,
        },
        "reference": {LEADER: {"compute": TARGET, "value": 0.676}, LOSER: {"compute": TARGET, "value": 0.43}},
        "decision": {"kind": "forecast", "variant": LEADER, "text": "Scale lr=0.005: forecast 0.67 at target."},
    }
    scaling.update(scaling_extra)
    return {
        "study": "adaptive-test",
        "config": {"backend": "local"},
        "server": {"name": "llm-infra-mcp", "version": "0"},
        "overlap": {"skipped": "no GPU here: on CPU (gloo) the timings check plumbing, not performance (--overlap)"},
        "scaling": scaling,
        "errors": [],
        "jobs": [],
    }


def legend_texts(fig: Any) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


# ---- the ladder's picture ------------------------------------------------------------------------------------------


def test_ladder_figure_draws_each_kind_of_mark_and_names_only_those() -> None:
    import matplotlib.pyplot as plt

    fig = ladder_figure(study()["scaling"])
    try:
        (ax,) = fig.axes
        labels = legend_texts(fig)
        kinds = [report.LADDER_LABELS[k] for k in ("runs", "rungs", "stop", "forecast", "ceiling", "reference")]
        assert labels == [*kinds, LEADER, LOSER, THIRD, TIED]
        assert ax.get_xscale() == "log"
        assert ax.get_xlabel() == "compute per run (FLOPs)" and ax.get_ylabel() == "eval pass rate"
        assert fig.get_size_inches()[0] * fig.dpi == 800
        lines = ax.get_lines()
        # the rungs: three vertical lines at their compute
        verticals = sorted(x[0] for ln in lines if len(x := list(ln.get_xdata())) == 2 and x[0] == x[1])
        assert verticals == pytest.approx(RUNGS)
        # the ceiling: one dashed horizontal line at 0.703
        dashed = [ln for ln in lines if ln.get_linestyle() == "--"]
        assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [0.703, 0.703]
        # six chains, each a thin line with small markers
        chains = [ln for ln in lines if ln.get_marker() == "o" and len(ln.get_xdata()) > 2]
        assert len(chains) == 8 and all(ln.get_linewidth() < 1 for ln in chains)
        # a cross per stopped variant at its stop's compute and the mean of its seeds' last values there
        crosses = sorted((ln.get_xdata()[0], ln.get_ydata()[0]) for ln in lines if ln.get_marker() == "x")
        assert [x for x, _ in crosses] == [RUNGS[0], RUNGS[1], RUNGS[1]]
        loser_last = [c["rows"][-1]["pass_rate"] for c in study()["scaling"]["chains"] if c["variant"] == LOSER]
        assert crosses[0][1] == pytest.approx(sum(loser_last) / 2)  # the mean of its two seeds' last values
        # hollow circles at the target for the two references, each at its variant's offset
        hollow = [ln for ln in lines if ln.get_marker() == "o" and ln.get_markerfacecolor() == "none"]
        assert sorted(ln.get_ydata()[0] for ln in hollow) == [0.43, 0.676]
        diamonds = [ln for ln in lines if ln.get_marker() == "D"]
        xs = [ln.get_xdata()[0] for ln in (*diamonds, *hollow)]
        assert all(TARGET * 0.85 < x < TARGET * 1.15 for x in xs)
        assert len({round(ln.get_xdata()[0]) for ln in diamonds}) == 3  # the three forecasts do not overlap
        loser_x = next(ln.get_xdata()[0] for ln in hollow if ln.get_ydata()[0] == 0.43)
        assert any(ln.get_xdata()[0] == loser_x and ln.get_ydata()[0] == 0.41 for ln in diamonds)
    finally:
        plt.close(fig)


def test_ladder_legend_leaves_out_what_is_not_drawn() -> None:
    import matplotlib.pyplot as plt

    data = study(stops={}, reference={})
    data["scaling"]["design"]["ceiling"] = None
    data["scaling"]["chains"] = [c for c in data["scaling"]["chains"] if c["variant"] not in (THIRD, TIED)]
    for v in (THIRD, TIED):
        data["scaling"]["design"]["steps"].pop(v)
        data["scaling"]["design"]["pilot"].pop(v)
    data["scaling"]["ladder"] = data["scaling"]["ladder"][:1]
    data["scaling"]["ladder"][0]["active"] = [LEADER, LOSER]
    fig = ladder_figure(data["scaling"])
    try:
        assert legend_texts(fig) == [report.LADDER_LABELS["runs"], report.LADDER_LABELS["rungs"], LEADER, LOSER]
        assert not [ln for ln in fig.axes[0].get_lines() if ln.get_marker() in ("x", "D") or ln.get_linestyle() == "--"]
    finally:
        plt.close(fig)
    # a variant named only in the design (nothing drawn in its colour) has no legend entry
    data["scaling"]["design"]["steps"]["lr=9"] = [1, 2, 3]
    fig = ladder_figure(data["scaling"])
    try:
        assert "lr=9" not in legend_texts(fig)
    finally:
        plt.close(fig)


def test_ladder_chart_is_a_png_800_px_wide_and_refuses_nothing_to_draw() -> None:
    png = ladder_chart(study()["scaling"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (800, 560)
    with pytest.raises(ValueError, match="needs eval rows"):
        ladder_chart({"design": {}, "chains": []})


def test_ladder_chart_draws_hostile_names_as_text() -> None:
    """A '$' would start matplotlib's mathtext (a malformed one fails the drawing): shown as itself instead."""
    import matplotlib.pyplot as plt

    data = study()
    evil = "lr=$\\frac{1}{$"
    rename(data, LOSER, evil)
    fig = ladder_figure(data["scaling"])
    try:
        assert "lr=\\$\\frac{1}{\\$" in legend_texts(fig)
        fig.canvas.draw()  # raises if any text were parsed as mathtext
    finally:
        plt.close(fig)


# ---- the overlap picture -----------------------------------------------------------------------------------------


def overlap_rows() -> list[dict[str, Any]]:
    pred = {"t_sequential_ms": 2.0, "t_overlap_ms": 1.5, "speedup": 1.33}
    return [
        {
            "layer": "attn.qkv",
            "predicted": pred,
            "measured": {"t_sequential_ms": 3.0, "best_t_ms": 2.5, "best": "chunked-2", "fastest": None},
        },
        {
            "layer": "mlp.up",
            "predicted": pred,
            "measured": {
                "t_sequential_ms": 3.0,
                "best_t_ms": None,
                "best": None,
                "fastest": {"name": "async", "t_ms": 2.0, "valid": False},
            },
        },
    ]


def test_overlap_chart_draws_best_valid_and_invalid_fastest_as_different_marks() -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    fig = overlap_figure(overlap_rows(), "H100-SXM", "cpu")
    try:
        left, right = fig.axes
        bars = [(to_hex(p.get_facecolor()), p.get_hatch()) for p in right.patches]
        assert bars == [("#9aa5b1", None), ("#9aa5b1", None), ("#d62728", None), ("#ffffff", "xx")]
        handles = right.get_legend().legend_handles
        legend = {h.get_label(): (to_hex(h.get_facecolor()), h.get_hatch()) for h in handles}
        assert legend == {
            "sequential": ("#9aa5b1", None),
            "best valid overlapped": ("#d62728", None),
            "fastest row, invalid (no gain claimed)": ("#ffffff", "xx"),
        }
        assert [t.get_text() for t in left.get_legend().get_texts()] == ["sequential", "overlapped (best chunks)"]
    finally:
        plt.close(fig)
    # every row invalid (as on CPU): the legend has no "best valid" entry, since none is drawn
    rows = [r for r in overlap_rows() if r["layer"] == "mlp.up"]
    fig = overlap_figure(rows, "H100-SXM", "cpu")
    try:
        assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == [
            "sequential",
            "fastest row, invalid (no gain claimed)",
        ]
    finally:
        plt.close(fig)


# ---- the report ----------------------------------------------------------------------------------------------------


def test_report_shows_the_design_the_ladder_the_end_the_spend_and_the_picture(tmp_path: Path) -> None:
    data = study()
    images = {"ladder.png": ladder_chart(data["scaling"])}
    paths = write_report(tmp_path, data, images)
    md, page = paths["report.md"].read_text(), paths["report.html"].read_text()
    assert (tmp_path / "ladder.png").read_bytes() == images["ladder.png"]
    assert "![the ladder: each run" in md and "(ladder.png)" in md
    assert page.count("<img ") == 1 and "data:image/png;base64," in page
    for text in (md, page):
        assert "eval pass rate" in text
        assert "Ceiling: 0.703 eval pass rate: the best pass rate reachable" in text
        assert "What compute counts: 6 x parameters x prompts, training only." in text
        assert "Rungs (compute per run at each round, FLOPs): 4e+09, 8e+09, 1.6e+10" in text
        assert "One variant leads at the study" in text
        assert "a share of 0.58 (58%)" in text
        assert "Scale lr=0.005: forecast 0.67 at target." in text
    # round 1's table: one row per active variant, forecast [CI], P(leader higher), action
    assert "| lr=0.005 | 0.660 \\[0.620, 0.700\\] | \\[0.600, 0.720\\] | 16 | - | leader |" in md
    assert "| lr=0.0005 | 0.410 \\[0.350, 0.470\\] | \\[0.330, 0.490\\] | 16 | 1.00 | stopped |" in md
    assert "| lr=0.002,group-size=8 | 0.600 \\[0.550, 0.660\\] | \\[0.530, 0.680\\] | 16 | 0.81 | continued |" in md
    assert (
        "| group-size=4 | 0.668 \\[0.655, 0.685\\] | \\[0.635, 0.705\\] | 24 | 0.54 | stopped, tied with the leader |"
        in md
    )
    assert '<td class="w">lr=0.002,group-size=8</td><td>0.580 [0.550, 0.610]</td>' in page
    # the stops, with what the exhaustive run reached
    assert "| lr=0.0005 | 1 | 4e+09 | 0.410 \\[0.350, 0.470\\] | lr=0.005 |" in md
    assert "0.430 at 1.6e+10 FLOPs |" in md
    assert (
        "| group-size=4 | 2 | 8e+09 | 0.668 \\[0.655, 0.685\\] | lr=0.005 | tied with the leader: both intervals" in md
    )
    # each forecast against what was measured at the target
    assert "| lr=0.005 | 1 | 0.660 | 0.585 | +0.075 | no | - |" in md
    # the chains: each segment's job and what it resumed from
    assert "| training_lr=0.005-s1-r3-0123456789abcdef | 300 | training_lr=0.005-s1-r2-0123456789abcdef |" in md
    # study.json: the data as given
    assert json.loads(paths["study.json"].read_text())["scaling"]["stops"][LOSER]["round"] == 1


def probabilities(text: str) -> list[str]:
    """The numbers in the report that are probabilities or shares: every P(...) cell, and each 'share of'."""
    found = re.findall(r"a share of (\S+)", text)
    for table in re.findall(r"(\|[^\n]*P\([^\n]*\|\n\|[-|]+\|\n(?:\|[^\n]*\|\n)+)", text):
        lines = table.splitlines()
        cells = [re.split(r"(?<!\\)\|", line)[1:-1] for line in lines]
        for col, header in enumerate(cells[0]):
            if "P(" in header:
                found += [row[col].strip() for row in cells[2:]]
    return found


def test_every_probability_and_share_has_two_decimals(tmp_path: Path) -> None:
    data = study()
    data["scaling"]["rounds"] = [
        {
            "round": 1,
            "variants": {},
            "variant_of_fit": {"f1": LEADER, "f2": LOSER},
            "comparison": {
                "verdict": "v",
                "pairs": [
                    {
                        "first": "f1",
                        "second": "f2",
                        "p_first_higher_asymptote": 0.98765,
                        "p_first_more_efficient": 0.5,
                        "crossings": [],
                    }
                ],
            },
        }
    ]
    md = render_markdown(blocks(data, {}))
    found = probabilities(md)
    # round 1: three P cells and the leader's "-", round 2: two and "-", the comparison: two, the share
    expected = ["-", "1.00", "0.81", "0.60", "-", "1.00", "0.54", "0.99", "0.50", "0.58"]
    assert sorted(found) == sorted(expected)
    assert all(p == "-" or re.fullmatch(r"[01]\.\d\d", p) for p in found)
    assert report.prob(0.98765) == "0.99" and report.prob(1) == "1.00"
    assert report.percent(0.58333) == "58%" and report.prob(None) == "-" and report.prob(True) == "-"


def test_a_skipped_overlap_renders_one_line_saying_why() -> None:
    data = study()
    md = render_markdown(blocks(data, {}))
    section = md.split("## 2. Overlap: skipped\n\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip() == md_text(data["overlap"]["skipped"])


def test_tune_overlaps_no_prediction_note_is_not_shown_as_if_nothing_was_predicted() -> None:
    note = "no prediction: this ran on CPU (gloo), and the cost model predicts catalog GPUs only; pass predict_for_gpu"
    data = study()
    rows = overlap_rows()
    for r in rows:
        r["predicted"]["shape"] = "4096x12288x4096"
    data["overlap"] = {
        "preset": "llama-8b",
        "tp": 2,
        "predicted_for": "H100-SXM",
        "measured": {"note": "timings on CPU (gloo) check plumbing", "prediction_note": note},
        "rows": rows,
        "table": f"layer ...\nNOTE: {note}",
    }
    md = render_markdown(blocks(data, {}))
    said = md.index(md_text("The predicted columns above are predict_overlap's, for H100-SXM"))
    assert md.index("predicted shape (H100-SXM)") < said < md.index("NOTE: no prediction")
    assert md_text(note) in md[said:]


def rename(data: dict[str, Any], old: str, new: str) -> None:
    """The study's data with the variant `old` named `new` everywhere (keys, lists and values)."""
    text = json.dumps(data).replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    data.clear()
    data.update(json.loads(text))


@pytest.mark.parametrize("evil", ["<script>alert(1)</script>", "a|b", "lr=`x`", "<img src=x onerror=1>|`|"])
def test_a_hostile_variant_name_is_escaped_in_md_and_html(tmp_path: Path, evil: str) -> None:
    data = study()
    rename(data, LOSER, evil)
    assert evil in data["scaling"]["stops"]
    paths = write_report(tmp_path, data, {"ladder.png": ladder_chart(data["scaling"])})
    md, page = paths["report.md"].read_text(), paths["report.html"].read_text()
    assert "<script" not in page and "<img src=x" not in page
    assert html.escape(evil) in page
    assert md_text(evil) in md
    assert "<" not in md and not re.search(r"(?<!\\)`", md)
    # every row of round 1's table keeps its six cells
    round1 = md.split("### Round 1:", 1)[1].split("###", 1)[0]
    rows = [line for line in round1.splitlines() if line.startswith("| ")]
    assert len(rows) == 5 and all(len(re.findall(r"(?<!\\)\|", line)) == 7 for line in rows)


def test_a_study_with_only_some_keys_renders_what_it_has() -> None:
    """Old keys gone, new keys partly there: each block renders what is present and skips what is absent."""
    data = study()
    for key in ("design", "stops", "reference", "spent", "end", "chains"):
        partial = copy.deepcopy(data)
        del partial["scaling"][key]
        md = render_markdown(blocks(partial, {}))
        assert "### Round 1:" in md
    bare = render_markdown(blocks({"study": "s", "scaling": {"ladder": []}}, {}))
    assert "Held-out check" not in bare and "### Design" not in bare and "## 3. RL scaling study" in bare


# ---- the page at 800 px ------------------------------------------------------------------------------------------

WIDTH_PROBE = """<script>
window.addEventListener('load', () => {
  const page = document.scrollingElement.scrollWidth, view = window.innerWidth;
  const tables = Array.from(document.querySelectorAll('table')).map(t => t.getBoundingClientRect().right);
  const out = document.createElement('pre'); out.id = 'width-probe';
  out.textContent = JSON.stringify({page: page, view: view, right: Math.max(0, ...tables)});
  document.body.appendChild(out);
});
</script>"""


def wide_study() -> dict[str, Any]:
    """The study with its widest tables: the overlap's eleven columns with long shapes and verdicts."""
    data = study()
    long_verdict = "no verdict: the measurement failed its validity checks (timing_noise, comm_bandwidth)"
    data["overlap"] = {
        "preset": "llama-70b",
        "tp": 8,
        "predicted_for": "H100-SXM",
        "measured": {},
        "rows": [
            {
                "layer": f"layer{i}.attention.qkv_projection",
                "pattern": "allgather_gemm",
                "predicted": {"shape": "131072x106496x16384", "t_sequential_ms": 12.5, "t_overlap_ms": 9.1},
                "measured": {
                    "shape": "131072x106496x16384",
                    "t_sequential_ms": 3.25,
                    "best": None,
                    "fastest": {"name": "chunked_ring_8", "t_ms": 2.9, "valid": False},
                    "verdict": long_verdict,
                },
            }
            for i in range(3)
        ],
    }
    return data


@pytest.mark.timeout(180)
def test_the_tables_fit_an_800_px_window(tmp_path: Path) -> None:
    """report.html opened in headless Chromium at 800 px: no horizontal scroll, every table inside the window."""
    data = wide_study()
    content = blocks(data, {})
    page = render_html(content, {}, "t").replace("</body>", WIDTH_PROBE + "</body>")
    copy_ = tmp_path / "report.html"
    copy_.write_text(page)
    dom = headless_dom(copy_, tmp_path, "--window-size=800,900", why="the width check needs it")
    found = re.search(r'<pre id="width-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run: " + dom[-2000:]
    seen = json.loads(found.group(1))
    assert seen["view"] <= 800 and seen["page"] <= seen["view"] and seen["right"] <= seen["view"], seen
