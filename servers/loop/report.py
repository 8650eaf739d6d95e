"""The study's report: DIR/report.md (pictures beside it as PNG files), a self-contained DIR/report.html (the same
content, pictures inline as data: URIs, no external resource), and DIR/study.json (the study's data and every call
the loop made). Both reports are rendered from one list of blocks, so they say the same thing.

Every number shown is read from study.json's data, which holds the tools' results; nothing is computed here but
formatting, and, for the ladder's picture, where to draw a stop (the mean of a variant's seeds' last measured
values, said in its caption). Every probability and share is written by one helper (prob: 2 decimals).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Block = tuple[Any, ...]


# ---- formatting --------------------------------------------------------------------------------------------------


def f3(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.3f}"


def g3(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.3g}"


def f4(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.4f}"


def prob(x: Any) -> str:
    """Every probability and share in the report: 2 decimals ("-" for none)."""
    return "-" if not isinstance(x, int | float) or isinstance(x, bool) else f"{x:.2f}"


def percent(x: Any) -> str:
    """A share as a percentage, from prob's rounding (so that both say the same)."""
    return "-" if prob(x) == "-" else f"{100 * float(prob(x)):.0f}%"


def ms(x: Any) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.4g}"


def when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts)) if isinstance(ts, int | float) else "-"


def interval(low: Any, high: Any, fmt: Any = f3) -> str:
    return "-" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def param(fit: dict[str, Any] | None, name: str, fmt: Any = f3, with_ci: bool = True) -> str:
    p = ((fit or {}).get("parameters") or {}).get(name)
    if not p:
        return "-"
    text = fmt(p.get("value"))
    if p.get("fixed"):
        return text + " (fixed)"
    if with_ci and p.get("ci_low") is not None:
        text += " " + interval(p.get("ci_low"), p.get("ci_high"), fmt)
    return text


# ---- the pictures (matplotlib, Agg) ------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart_text(text: Any, limit: int = 48) -> str:
    """A value from the study's data as matplotlib text that shows exactly it: on one line, at most `limit`
    characters (an ellipsis past them), and every '$' escaped, so that no mathtext is parsed (a malformed one
    would fail the drawing)."""
    text = re.sub(r"\s+", " ", MD_CONTROL.sub(" ", str(text))).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return text.replace("$", r"\$")


def _render(fig: Any) -> bytes:
    plt = _pyplot()
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _measured_mark(m: dict[str, Any]) -> tuple[float, str]:
    """The measured panel's second bar of a layer: (height, kind), kind "best" (tune_overlap's best valid, correct
    overlapped row), "fastest" (no such row: the fastest timed row, which is not claimed) or "none" (nothing timed)."""
    if isinstance(m.get("best_t_ms"), int | float):
        return float(m["best_t_ms"]), "best"
    fastest = m.get("fastest") or {}
    if isinstance(fastest.get("t_ms"), int | float):
        return float(fastest["t_ms"]), "fastest"
    return 0.0, "none"


OVERLAP_MARKS = {
    "sequential": {"facecolor": "#9aa5b1", "edgecolor": "#9aa5b1", "hatch": None},
    "overlapped": {"facecolor": "#1f77b4", "edgecolor": "#1f77b4", "hatch": None},
    "best": {"facecolor": "#d62728", "edgecolor": "#d62728", "hatch": None},
    "fastest": {"facecolor": "white", "edgecolor": "#ff7f0e", "hatch": "xx"},
}
OVERLAP_LABELS = {
    "sequential": "sequential",
    "overlapped": "overlapped (best chunks)",
    "best": "best valid overlapped",
    "fastest": "fastest row, invalid (no gain claimed)",
}


def overlap_figure(rows: list[dict[str, Any]], predicted_for: str, measured_on: str) -> Any:
    """The overlap picture as a matplotlib Figure: two panels of bars per layer, predict_overlap's sequential and
    overlapped times on the catalog GPU, and tune_overlap's measured sequential time and best valid overlapped time
    here (solid red). A layer with no valid row shows its fastest row instead, as a different mark (white, orange
    cross-hatched) that claims no gain. Each legend names only marks that are drawn. The caller closes it."""
    from matplotlib.patches import Patch

    plt = _pyplot()
    layers = [chart_text(r.get("layer"), 24) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    try:
        x = list(range(len(layers)))
        w = 0.38

        def bars(ax: Any, offset: float, heights: list[float], kinds: list[str]) -> set[str]:
            drawn = set()
            for i, (h, kind) in enumerate(zip(heights, kinds, strict=True)):
                if kind == "none" or h <= 0:
                    continue
                style = OVERLAP_MARKS[kind]
                ax.bar(i + offset, h, w, color=style["facecolor"], edgecolor=style["edgecolor"], hatch=style["hatch"])
                drawn.add(kind)
            return drawn

        def legend(ax: Any, drawn: set[str]) -> None:
            handles = [
                Patch(label=OVERLAP_LABELS[k], **{a: v for a, v in OVERLAP_MARKS[k].items() if v is not None})
                for k in OVERLAP_MARKS
                if k in drawn
            ]
            if handles:
                ax.legend(handles=handles, fontsize=8)

        pred = [r.get("predicted") or {} for r in rows]
        pred_seq = [p.get("t_sequential_ms") or 0.0 for p in pred]
        pred_ovl = [p.get("t_overlap_ms") or 0.0 for p in pred]
        drawn = bars(left, -w / 2, pred_seq, ["sequential"] * len(rows))
        drawn |= bars(left, w / 2, pred_ovl, ["overlapped"] * len(rows))
        for i, p in enumerate(pred):
            if isinstance(p.get("speedup"), int | float) and pred_ovl[i] > 0:
                left.annotate(f"{p['speedup']:.2f}x", (i + w / 2, pred_ovl[i]), ha="center", va="bottom", fontsize=8)
        legend(left, drawn)
        left.set_title(f"predicted: {chart_text(predicted_for)} (predict_overlap)", fontsize=10)

        meas = [r.get("measured") or {} for r in rows]
        marks = [_measured_mark(m) for m in meas]
        drawn = bars(right, -w / 2, [m.get("t_sequential_ms") or 0.0 for m in meas], ["sequential"] * len(rows))
        drawn |= bars(right, w / 2, [h for h, _ in marks], [k for _, k in marks])
        legend(right, drawn)
        right.set_title(f"measured: {chart_text(measured_on)} (tune_overlap)", fontsize=10)
        for ax in (left, right):
            ax.set_ylabel("time per layer (ms)")
            ax.set_xticks(x, layers, rotation=15, fontsize=8)
        fig.tight_layout()
        return fig
    except BaseException:  # a figure that fails half-drawn is closed, not left in pyplot's registry
        plt.close(fig)
        raise


def overlap_chart(rows: list[dict[str, Any]], predicted_for: str, measured_on: str) -> bytes:
    """overlap_figure as PNG bytes."""
    return _render(overlap_figure(rows, predicted_for, measured_on))


LADDER_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
LADDER_LABELS = {
    "runs": "a run's eval points (one line per seed)",
    "rungs": "rungs: compute per run at each round",
    "stop": "stopped: its last measured mean",
    "forecast": "its forecast at the target when stopped [CI]",
    "ceiling": "task ceiling (best reachable)",
    "reference": "exhaustive run reached",
}


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def ladder_variants(scaling: dict[str, Any]) -> list[str]:
    """Every variant the ladder names, in the order the study gave them (design's steps, then each round's active
    variants, the chains, the stops, the references)."""
    design = scaling.get("design") or {}
    names: list[str] = [*(design.get("steps") or {})]
    for rung in scaling.get("ladder") or []:
        names += rung.get("active") or []
    names += [c.get("variant") for c in scaling.get("chains") or []]
    names += [*(scaling.get("stops") or {}), *(scaling.get("reference") or {})]
    return [str(n) for n in dict.fromkeys(names) if n is not None]


def chain_points(chain: dict[str, Any], compute_key: str, metric: str) -> list[tuple[float, float]]:
    """A chain's eval points as (compute, metric value), by compute; rows without both numbers left out."""
    points = [
        (float(r[compute_key]), float(r[metric]))
        for r in chain.get("rows") or []
        if r.get("split", "eval") == "eval" and _number(r.get(compute_key)) and _number(r.get(metric))
    ]
    return sorted(points)


def last_measured_mean(scaling: dict[str, Any], variant: str, compute: float) -> float | None:
    """The mean over the variant's seeds of each seed's last eval value at or below `compute` (where its stop is
    drawn); None when no seed has one."""
    design = scaling.get("design") or {}
    key, metric = design.get("compute_key") or "compute_flops", design.get("metric") or "pass_rate"
    last = []
    for chain in scaling.get("chains") or []:
        if str(chain.get("variant")) == variant:
            below = [v for c, v in chain_points(chain, key, metric) if c <= compute * (1 + 1e-9)]
            if below:
                last.append(below[-1])
    return sum(last) / len(last) if last else None


def ladder_figure(scaling: dict[str, Any]) -> Any:
    """The ladder as a matplotlib Figure (800 x 560 px): x the compute per run (log), y the study's metric; one
    colour per variant. Each chain's eval points as a thin line with small markers, the rungs as faint vertical
    lines, each stopped variant's stop as a cross (its compute, the mean of its seeds' last measured values) and its
    forecast at the target at that moment as an error bar (the value with its CI) at the target, offset a little
    per variant; the task's ceiling as a dashed line; what an exhaustive run reached at the target (when given) as
    hollow circles. The legend has one entry per kind of mark drawn and one per variant colour drawn. The caller
    closes it; ValueError when there is nothing to draw."""
    from matplotlib.lines import Line2D

    design = scaling.get("design") or {}
    key, metric = design.get("compute_key") or "compute_flops", design.get("metric") or "pass_rate"
    unit = design.get("unit") or scaling.get("unit") or "compute"
    rungs = [float(c) for c in design.get("rungs") or [] if _number(c) and c > 0]
    target = design.get("target") if _number(design.get("target")) else (rungs[-1] if rungs else None)
    variants = ladder_variants(scaling)
    color = {v: LADDER_COLORS[i % len(LADDER_COLORS)] for i, v in enumerate(variants)}
    chains = [(str(c.get("variant")), chain_points(c, key, metric)) for c in scaling.get("chains") or []]
    chains = [(v, [(c, y) for c, y in pts if c > 0]) for v, pts in chains]
    if not any(pts for _, pts in chains) and not rungs:
        raise ValueError("the ladder needs eval rows in scaling['chains'] or rungs in scaling['design']: none given")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.6), dpi=100, layout="constrained")
    try:
        drawn: dict[str, dict[str, Any]] = {}
        coloured: set[str] = set()  # the variants with a mark in their colour
        for c in rungs:
            ax.axvline(c, color="0.82", lw=0.9, zorder=0)
            drawn["rungs"] = {"color": "0.82", "lw": 0.9}
        for v, pts in chains:
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, color=color[v], lw=0.8, marker="o", ms=2.5, alpha=0.75)
                coloured.add(v)
                drawn["runs"] = {"color": "0.3", "lw": 0.8, "marker": "o", "ms": 2.5}
        coloured |= _ladder_stops(ax, scaling, target, variants, color, drawn)
        ceiling = design.get("ceiling")
        if _number(ceiling):
            ax.axhline(ceiling, color="0.35", lw=1.1, ls="--", zorder=1)
            drawn["ceiling"] = {"color": "0.35", "lw": 1.1, "ls": "--"}
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.05 * (high - low))  # the ceiling and the top error bar off the frame
        if target is not None:
            ax.annotate("target", (target, 1), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(f"compute per run ({chart_text(unit, 24)})")
        ax.set_ylabel(chart_text(design.get("metric_label") or metric))
        ax.grid(True, which="major", alpha=0.25)
        handles = [Line2D([], [], label=LADDER_LABELS[k], **drawn[k]) for k in LADDER_LABELS if k in drawn]
        handles += [Line2D([], [], color=color[v], lw=4, label=chart_text(v)) for v in variants if v in coloured]
        fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
        return fig
    except BaseException:  # a figure that fails half-drawn is closed, not left in pyplot's registry
        plt.close(fig)
        raise


def _ladder_stops(
    ax: Any,
    scaling: dict[str, Any],
    target: float | None,
    variants: list[str],
    color: dict[str, str],
    drawn: dict[str, dict[str, Any]],
) -> set[str]:
    """The stops (crosses), their forecasts at the target (error bars) and the exhaustive references (hollow
    circles), each variant's bar and circle at the same small offset from the target; the variants drawn."""
    coloured = set()
    stops = {str(k): v for k, v in (scaling.get("stops") or {}).items() if isinstance(v, dict)}
    reference = {str(k): v for k, v in (scaling.get("reference") or {}).items() if isinstance(v, dict)}
    at_target = [v for v in variants if v in stops or v in reference]
    offset = {v: 10 ** (0.025 * (i - (len(at_target) - 1) / 2)) for i, v in enumerate(at_target)}
    for v, stop in stops.items():
        if _number(stop.get("compute")) and stop["compute"] > 0:
            mean = last_measured_mean(scaling, v, stop["compute"])
            if mean is not None:
                ax.plot([stop["compute"]], [mean], "x", color=color[v], ms=9, mew=2, zorder=4)
                coloured.add(v)
                drawn["stop"] = {"color": "0.3", "marker": "x", "ls": "none", "ms": 9, "mew": 2}
        f = stop.get("forecast") or {}
        if target is None or not _number(f.get("value")):
            continue
        low = f["ci_low"] if _number(f.get("ci_low")) else f["value"]
        high = f["ci_high"] if _number(f.get("ci_high")) else f["value"]
        yerr = [[max(0.0, f["value"] - low)], [max(0.0, high - f["value"])]]
        ax.errorbar([target * offset[v]], [f["value"]], yerr=yerr, fmt="D", ms=4, color=color[v], capsize=3, zorder=4)
        coloured.add(v)
        drawn["forecast"] = {"color": "0.3", "marker": "D", "ms": 4}
    for v, ref in reference.items():
        if target is not None and _number(ref.get("value")):
            ax.plot([target * offset[v]], [ref["value"]], "o", ms=9, mfc="none", mec=color[v], mew=1.5, zorder=5)
            drawn["reference"] = {"marker": "o", "ls": "none", "ms": 9, "mfc": "none", "mec": "0.3", "mew": 1.5}
            coloured.add(v)
    return coloured


def ladder_chart(scaling: dict[str, Any]) -> bytes:
    """ladder_figure as PNG bytes (800 px wide): the runner puts it in images["ladder.png"]."""
    return _render(ladder_figure(scaling))


# ---- the content -------------------------------------------------------------------------------------------------


def _header(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """The title, how the study ran, and its decision."""
    scaling = data.get("scaling") or {}
    timing = data.get("timing") or {}
    server = data.get("server") or {}
    add(("h", 1, f"Experiment loop: study {data.get('study')}"))
    add(
        (
            "p",
            f"Run {when(timing.get('started_at'))} against {server.get('name', 'the suite')} "
            f"{server.get('version', '')} over stdio, backend {data.get('config', {}).get('backend')}, "
            f"{g3(timing.get('wall_s'))} s in all, {len(data.get('calls') or [])} tool calls (each in study.json). "
            "Every number here is a tool's result; an error is predicted minus measured.",
        )
    )
    if data.get("refused"):
        add(("p", f"The study stopped early: {data['refused']}"))
    decision = scaling.get("decision")
    add(("h", 2, "Decision"))
    add(("p", decision["text"] if decision else "No decision: the RL study has no comparison (see the errors)."))


def _node(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """1. The node check."""
    # 1. node
    node = data.get("node") or {}
    add(("h", 2, "1. Node"))
    add(("p", node.get("verdict") or "The node check did not run."))
    gpus = [g.get("gpu") or {} for g in (node.get("health") or {}).get("gpus") or []]
    if gpus:
        add(
            (
                "table",
                ["GPU", "name", "PCI bus", "memory (MiB)"],
                [
                    [
                        str(g.get("index")),
                        str(g.get("name")),
                        str(g.get("pci_bus_id")),
                        str(g.get("memory_total_mib", "-")),
                    ]
                    for g in gpus
                ],
            )
        )


def _overlap(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """2. The overlap study: predicted against measured per layer, or the one line saying why it was skipped."""
    overlap = data.get("overlap")
    if not isinstance(overlap, dict):
        return
    if overlap.get("skipped"):
        add(("h", 2, "2. Overlap: skipped"))
        add(("p", str(overlap["skipped"])))
        return
    add(("h", 2, f"2. Overlap: {overlap.get('preset')} at TP={overlap.get('tp')}"))
    measured = overlap.get("measured") or {}
    notes = [overlap.get("measure_note")]
    notes += [f"tune_overlap: {n}" for n in (measured.get("note"), measured.get("backend_decision")) if n]
    notes = [n.rstrip(".") + "." for n in notes if n]
    if notes:
        add(("p", " ".join(notes)))
    rows = overlap.get("rows") or []
    gpu = overlap.get("predicted_for")
    if rows:
        headers = [*OVERLAP_HEADERS[:2], f"predicted shape ({gpu})", *OVERLAP_HEADERS[2:]]
        add(("table", headers, _overlap_rows(rows)))
    if "overlap.png" in images:
        add(("img", "overlap.png", "overlap: predicted vs measured per layer"))
    predicted = [r for r in rows if r.get("predicted")]
    if measured.get("prediction_note") and predicted:
        add(
            (
                "p",
                f"The predicted columns above are predict_overlap's, for {gpu} at the preset's full-size shapes "
                f"(the loop calls it per layer). tune_overlap predicts only for the GPU it measured on, so its own "
                f"table below has no prediction: {measured['prediction_note']}",
            )
        )
    if overlap.get("table"):
        add(("pre", overlap["table"]))


OVERLAP_HEADERS = [
    "layer",
    "pattern",
    "T_seq ms",
    "T_overlap ms",
    "speedup",
    "measured shape",
    "T_seq ms",
    "best valid",
    "gain",
    "verdict (tune_overlap)",
]


def _overlap_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    table = []
    for r in rows:
        p, m = r.get("predicted") or {}, r.get("measured") or {}
        best = str(m.get("best") or "none valid")
        fastest = m.get("fastest") or {}
        if not m.get("best") and fastest:
            best += f" (fastest: {fastest.get('name')} {ms(fastest.get('t_ms'))} ms, invalid)"
        table.append(
            [
                str(r.get("layer")),
                str(r.get("pattern")),
                str(p.get("shape", "-")),
                ms(p.get("t_sequential_ms")),
                ms(p.get("t_overlap_ms")),
                "-" if not _number(p.get("speedup")) else f"{p['speedup']:.2f}x",
                str(m.get("shape", "-")),
                ms(m.get("t_sequential_ms")),
                best,
                "-" if not _number(m.get("gain")) else f"{100 * m['gain']:+.1f}%",
                str(m.get("verdict", "-")),
            ]
        )
    return table


def _design(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """3. The RL scaling study's heading, and its design (adaptive or exhaustive): the rungs, the steps per run at
    each, the ceiling, what compute counts, the stop rule."""
    scaling = data.get("scaling") or {}
    add(("h", 2, f"3. RL scaling study ({scaling.get('recipe', 'tiny-grpo')})"))
    design = scaling.get("design")
    if not isinstance(design, dict):
        return
    unit = design.get("unit") or scaling.get("unit", "")
    rungs = design.get("rungs") or []
    mode = scaling.get("mode")
    add(("h", 3, "Design"))
    lines = []
    if mode == "adaptive":
        lines.append(
            "Adaptive study: every variant and seed starts at the first rung; after each round the losing variants "
            "are stopped on their forecasts at the target and the rest continue from their checkpoints."
        )
    elif mode == "exhaustive":
        lines.append("Exhaustive study: every variant and seed runs to the target, none is stopped.")
    if rungs:
        lines.append(
            f"Rungs (compute per run at each round, {unit}): {', '.join(g3(c) for c in rungs)}; the target is "
            f"{g3(design.get('target', rungs[-1]))} {unit}."
        )
    if design.get("rule"):
        lines.append(f"How the rungs were chosen: {design['rule']}")
    if design.get("compute_counts"):
        lines.append(f"What compute counts: {design['compute_counts']}")
    label = design.get("metric_label") or design.get("metric") or "the metric"
    if _number(design.get("ceiling")):
        note = design.get("ceiling_note")
        lines.append(f"Ceiling: {f3(design['ceiling'])} {label}" + (f": {note}" if note else "."))
    elif design.get("ceiling_note"):
        lines.append(f"Ceiling: not measured. {design['ceiling_note']}")
    if design.get("stop_rule"):
        level = f" (intervals at level {prob(design['level'])})" if _number(design.get("level")) else ""
        lines.append(f"Stop rule{level}: {design['stop_rule']}")
    add(("ul", lines))
    steps = design.get("steps") or {}
    pilot = design.get("pilot") or {}
    if steps or pilot:
        rows = []
        for name in dict.fromkeys([*steps, *pilot]):
            p = pilot.get(name) or {}
            per = steps.get(name) or []
            rows.append(
                [
                    str(name),
                    g3(p.get("rate")),
                    g3(p.get("c_mid")),
                    *(str(per[i]) if i < len(per) else "-" for i in range(len(rungs))),
                ]
            )
        add(
            (
                "table",
                [
                    "variant",
                    f"{unit} per step (pilot)",
                    f"C_mid from the pilot ({unit})",
                    *(f"steps per run, round {i + 1} ({g3(c)} {unit})" for i, c in enumerate(rungs)),
                ],
                rows,
            )
        )


def _action(name: str, rung: dict[str, Any]) -> str:
    actions = []
    if name == rung.get("leader"):
        actions.append("leader")
    if name in (rung.get("stopped") or []):
        actions.append("stopped")
    elif name in (rung.get("tied") or []):
        actions.append("stopped, tied with the leader")
    elif name in (rung.get("futile") or []):
        actions.append("stopped, cannot beat the leader by the margin")
    elif name in (rung.get("continued") or []) and name != rung.get("leader"):
        actions.append("continued")
    return ", ".join(actions) or "-"


def _forecast(f: dict[str, Any] | None) -> str:
    if not f or not _number(f.get("value")):
        return "no forecast"
    return f"{f3(f['value'])} {interval(f.get('ci_low'), f.get('ci_high'))}"


def _ladder(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """The ladder: each round's forecasts at the target and what was done with each variant, the stops, how the
    study ended, the compute spent against an exhaustive study, and the picture."""
    scaling = data.get("scaling") or {}
    design = scaling.get("design") or {}
    unit = design.get("unit") or scaling.get("unit", "")
    target = f"{g3(design['target'])} {unit}" if _number(design.get("target")) else "the target"
    for rung in scaling.get("ladder") or []:
        forecasts = rung.get("forecasts") or {}
        p_higher = rung.get("p_leader_higher") or {}
        leader = rung.get("leader")
        add(("h", 3, f"Round {rung.get('round')}: {g3(rung.get('compute'))} {unit} per run"))
        names = [str(n) for n in dict.fromkeys([*(rung.get("active") or []), *forecasts])]
        add(
            (
                "table",
                [
                    "variant",
                    f"forecast at {target} [CI]",
                    "prediction interval",
                    "points fitted",
                    f"P({leader if leader is not None else 'leader'} higher at target)",
                    "action",
                ],
                [
                    [
                        name,
                        _forecast(forecasts.get(name)),
                        interval((forecasts.get(name) or {}).get("pi_low"), (forecasts.get(name) or {}).get("pi_high")),
                        str((forecasts.get(name) or {}).get("points", "-")),
                        "-" if name == leader else prob(p_higher.get(name)),
                        _action(name, rung),
                    ]
                    for name in names
                ],
            )
        )
        if rung.get("note"):
            add(("p", rung["note"]))
    _stops(scaling, unit, add)
    end = scaling.get("end")
    if isinstance(end, dict):
        add(("h", 3, "End"))
        why = END_WHY.get(str(end.get("why")), str(end.get("why")))
        add(("p", f"{why}: {end.get('text') or ''}".rstrip(": ")))
    _spent(scaling, unit, add)
    _forecast_checks(scaling, target, add)
    if "ladder.png" in images:
        add(("img", "ladder.png", "the ladder: each run's eval curve, its stops and their forecasts at the target"))
        add(("p", LADDER_CAPTION))


END_WHY = {
    "one_leader": "One variant leads at the study's level",
    "indistinguishable": "The remaining variants are indistinguishable",
    "budget": "The budget is spent",
    "failed": "The study could not go on",
    "target": "The target was reached",
}
STOP_KIND = {
    "below": "below the leader",
    "tied": "tied with the leader",
    "futile": "cannot beat the leader by the margin",
}
LADDER_CAPTION = (
    "Each line is one run's eval points (one line per seed, one colour per variant); the faint vertical lines are "
    "the rungs. A cross marks where a variant was stopped, at the mean of its seeds' last measured values; the "
    "error bar at the target is its forecast there at that moment, with its CI. A hollow circle is what an "
    "exhaustive run reached at the target; the dashed line is the task's ceiling."
)


def _stops(scaling: dict[str, Any], unit: str, add: Callable[[Block], None]) -> None:
    """One row per stopped variant: when, its forecast at the target then, against whom, why, and what an
    exhaustive run reached at the target where the study has one."""
    stops = {k: v for k, v in (scaling.get("stops") or {}).items() if isinstance(v, dict)}
    if not stops:
        return
    reference = scaling.get("reference") or {}
    with_reference = bool(reference)
    add(("h", 3, "Stops"))
    rows = []
    for name, s in stops.items():
        row = [
            str(name),
            str(s.get("round", "-")),
            g3(s.get("compute")),
            _forecast(s.get("forecast")),
            str(s.get("leader", "-")),
            ": ".join(str(x) for x in (STOP_KIND.get(str(s.get("kind")), s.get("kind")), s.get("reason")) if x) or "-",
        ]
        if with_reference:
            ref = reference.get(name) or {}
            row.append(f"{f3(ref.get('value'))} at {g3(ref.get('compute'))} {unit}" if ref else "-")
        rows.append(row)
    headers = ["variant", "round", f"stopped at ({unit})", "its forecast at the target [CI]", "leader", "reason"]
    add(("table", headers + (["exhaustive run reached"] if with_reference else []), rows))


def _forecast_checks(scaling: dict[str, Any], target: str, add: Callable[[Block], None]) -> None:
    """Each round's forecast at the target against what the variant measured there, for those that reached it."""
    checks = [c for c in scaling.get("forecast_checks") or [] if isinstance(c, dict)]
    if not checks:
        return

    def inside(x: Any) -> str:
        return "-" if x is None else "yes" if x else "no"

    add(("h", 3, f"Forecasts against what was measured at {target}"))
    add(
        (
            "table",
            [
                "variant",
                "forecast made in round",
                "forecast",
                "measured (mean of seeds)",
                "error",
                "inside CI",
                "inside PI",
            ],
            [
                [
                    str(c.get("variant")),
                    str(c.get("round")),
                    f3(c.get("forecast")),
                    f3(c.get("measured")),
                    "-" if not _number(c.get("error")) else f"{c['error']:+.3f}",
                    inside(c.get("inside_ci")),
                    inside(c.get("inside_pi")),
                ]
                for c in checks
            ],
        )
    )


def _spent(scaling: dict[str, Any], unit: str, add: Callable[[Block], None]) -> None:
    spent = scaling.get("spent")
    if not isinstance(spent, dict):
        return
    unit = spent.get("unit") or unit
    text = f"Compute spent: {g3(spent.get('compute'))} {unit}"
    if _number(spent.get("exhaustive_equivalent")):
        text += f", against {g3(spent['exhaustive_equivalent'])} {unit} for every variant and seed run to the target"
    if _number(spent.get("pilot")):
        text += f" (and {g3(spent['pilot'])} {unit} for the pilot)"
    if _number(spent.get("share")):
        text += f": a share of {prob(spent['share'])} ({percent(spent['share'])})"
    if _number(spent.get("budget")):
        text += f"; the budget was {g3(spent['budget'])} {unit}"
    add(("h", 3, "Compute spent"))
    add(("p", text + "."))


def _chains(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """Each chain (one variant and seed, resumed from round to round): its segments' jobs, and where it ended."""
    scaling = data.get("scaling") or {}
    chains = [c for c in scaling.get("chains") or [] if isinstance(c, dict)]
    if not chains:
        return
    design = scaling.get("design") or {}
    key, metric = design.get("compute_key") or "compute_flops", design.get("metric") or "pass_rate"
    unit = design.get("unit") or scaling.get("unit", "")
    label = design.get("metric_label") or metric
    add(("h", 3, "Runs: one chain per variant and seed, resumed from round to round"))
    rows = []
    for c in chains:
        points = chain_points(c, key, metric)
        for i, seg in enumerate(c.get("segments") or []):
            last = i == len(c.get("segments") or []) - 1
            rows.append(
                [
                    str(c.get("variant")),
                    str(c.get("seed")),
                    str(seg.get("round", "-")),
                    str(seg.get("job_id") or "-"),
                    str(seg.get("steps", "-")),
                    str(seg.get("resumed_from") or "-"),
                    str(seg.get("state") or "-"),
                    f"{f3(points[-1][1])} at {g3(points[-1][0])}" if last and points else "",
                ]
            )
    add(
        (
            "table",
            ["variant", "seed", "round", "job", "steps", "resumed from", "state", f"last {label} (at {unit})"],
            rows,
        )
    )


def _runs(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """The budget and the runs of a study with rounds of fresh runs (a pilot, round 1, a follow-up)."""
    scaling = data.get("scaling") or {}
    unit = scaling.get("unit", "")
    budget = scaling.get("budget")
    if budget:
        spent = scaling.get("spent") or {}
        add(
            (
                "p",
                f"Budget {g3(budget['budget'])} {unit}: {budget['rule']}. Spent (the runs' final compute, from their "
                f"metrics, pilot included): {g3(spent.get('compute'))} {unit}.",
            )
        )
        add(
            (
                "table",
                ["variant", f"{unit} per step (pilot)", "steps per run (round 1)", "follow-up steps"],
                [
                    [name, g3(rate), str(budget["steps"].get(name)), str(budget["followup_steps"].get(name, "-"))]
                    for name, rate in budget["per_step"].items()
                ],
            )
        )
    for name in scaling.get("dropped_variants") or []:
        add(("p", f"Variant {name} was left out: its pilot run did not succeed (see the errors)."))
    runs = [*((scaling.get("pilot") or {}).get("runs") or []), *(scaling.get("runs") or [])]
    if runs:
        key = scaling.get("compute_key", "compute_flops")
        table = []
        for r in runs:
            evals = [
                row
                for row in r.get("rows") or []
                if row.get("split") == "eval" and isinstance(row.get("pass_rate"), int | float)
            ]
            last = max(evals, key=lambda row: row.get(key) or 0) if evals else {}
            table.append(
                [
                    str(r.get("round")),
                    r["variant"],
                    str(r["seed"]),
                    str(r.get("job_id", "-")),
                    str(r.get("state", "-")),
                    g3(r.get("elapsed_s")),
                    f3(last.get("pass_rate")),
                    g3(last.get(key)),
                    (r.get("reason") or "") if r.get("state") != "SUCCEEDED" else "",
                ]
            )
        add(("h", 3, "Runs"))
        add(
            (
                "table",
                ["round", "variant", "seed", "job", "state", "s", "final pass rate", f"final {unit}", "reason"],
                table,
            )
        )
        for r in runs:
            if r.get("log_tail"):
                add(("p", f"Log tail of {r['job_id']} ({r['variant']} seed {r['seed']}, {r.get('state')}):"))
                add(("pre", r["log_tail"][-1200:]))


def _held_out(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """The held-out check: the first half of compute fitted, the second predicted."""
    scaling = data.get("scaling") or {}
    unit = scaling.get("unit", "")
    if "held_out" not in scaling and "fit_heldout.png" not in images:
        return  # a study without this check (the adaptive one forecasts at each round instead)
    held = [h for h in scaling.get("held_out") or [] if h.get("rows")]
    add(("h", 3, "Held-out check: fit the first half of compute, predict the second"))
    if "fit_heldout.png" in images:
        add(("img", "fit_heldout.png", "first-half fits with bootstrap bands and the held-out points"))
        add(
            (
                "p",
                "Each variant's seeds pooled, fitted on compute up to half the largest (plot_scaling_fit). Filled "
                "points ('fitted points' in the legend) were fitted; hollow points ('held out' in the legend: "
                "compute beyond the split) were left out of the fit and predicted. The shaded region is "
                "extrapolated; the bands are from the bootstrap.",
            )
        )
    if held:
        add(
            (
                "table",
                [
                    "variant",
                    "seed",
                    "fitted up to",
                    "A",
                    "C_mid",
                    "held-out points",
                    "mean |error|",
                    "max |error|",
                    "inside 95% PI",
                ],
                [
                    [
                        h["variant"],
                        str(h["seed"]),
                        g3(h["split"]),
                        param(h.get("fit"), "A", with_ci=False),
                        param(h.get("fit"), "C_mid", g3, with_ci=False),
                        str(h["summary"]["points"]),
                        f4(h["summary"]["mean_abs_error"]),
                        f4(h["summary"]["max_abs_error"]),
                        "-"
                        if h["summary"].get("inside_pi") is None
                        else f"{h['summary']['inside_pi']}/{h['summary']['judged']}",
                    ]
                    for h in held
                ],
            )
        )
        add(
            (
                "table",
                ["variant", "seed", f"compute ({unit})", "measured", "predicted", "95% prediction interval", "error"],
                [
                    [
                        h["variant"],
                        str(h["seed"]),
                        g3(r["compute"]),
                        f3(r["measured"]),
                        f3(r["predicted"]),
                        interval(r["pi_low"], r["pi_high"]),
                        f"{r['error']:+.4f}",
                    ]
                    for h in held
                    for r in h["rows"]
                ],
            )
        )
    else:
        add(("p", "No held-out predictions (no run had a fit; see the errors)."))


def _rounds(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """Each round: its extrapolation check, its fits on all compute, its comparison, its decision."""
    scaling = data.get("scaling") or {}
    unit = scaling.get("unit", "")
    several = len(scaling.get("rounds") or []) > 1
    for rnd in scaling.get("rounds") or []:
        label = "" if not several else f" (round {rnd['round']})"
        _extrapolation_check(rnd, label, unit, add)
        _full_fits(rnd, label, unit, add)
        _comparison(rnd, label, unit, add)
        if rnd.get("decision") and several:
            add(("p", f"Decision after round {rnd['round']}: {rnd['decision']['text']}"))


def _extrapolation_check(rnd: dict[str, Any], label: str, unit: str, add: Callable[[Block], None]) -> None:
    """check_extrapolation's result per variant, for every law it compared."""
    variants = rnd.get("variants") or {}
    checks = [(name, e["check"]) for name, e in variants.items() if e.get("check")]
    if checks:
        add(("h", 3, f"Extrapolation check{label}: check_extrapolation, seeds pooled"))
        models = list(dict.fromkeys(m["model"] for _, c in checks for m in c.get("models") or []))
        rows = []
        for name, c in checks:
            by = {m["model"]: m for m in c.get("models") or []}
            errors = [f4((by.get(model) or {}).get("mean_abs_error")) for model in models]
            rows.append([name, g3(c.get("split")), str(c.get("held_out_points")), *errors, str(c.get("better_model"))])
        add(
            (
                "table",
                ["variant", "split", "held-out points", *(f"{m} mean |error|" for m in models), "better"],
                rows,
            )
        )
        for name, c in checks:
            add(("p", f"{name}: {c.get('verdict')}"))


def _full_fits(rnd: dict[str, Any], label: str, unit: str, add: Callable[[Block], None]) -> None:
    """The fits on all compute, one row per variant."""
    variants = rnd.get("variants") or {}
    fits = [(name, e["full"]) for name, e in variants.items() if e.get("full")]
    if fits:
        add(("h", 3, f"Fits on all compute{label}"))
        add(
            (
                "table",
                ["variant", "fit", "A", "B", f"C_mid ({unit})", "R0", "rmse", "points", "warnings"],
                [
                    [
                        name,
                        f["fit_id"],
                        param(f, "A"),
                        param(f, "B", g3),
                        param(f, "C_mid", g3),
                        param(f, "R0"),
                        f4(f.get("rmse")),
                        str(f.get("points_used")),
                        " ".join(f.get("warnings") or []) or "-",
                    ]
                    for name, f in fits
                ],
            )
        )


def _comparison(rnd: dict[str, Any], label: str, unit: str, add: Callable[[Block], None]) -> None:
    """compare_scaling_fits' pairs."""
    comparison = rnd.get("comparison")
    if comparison:
        names = rnd.get("variant_of_fit") or {}
        add(("h", 3, f"Comparison{label}: compare_scaling_fits"))
        add(("p", comparison.get("verdict", "")))
        add(
            (
                "table",
                ["first", "second", "P(first has the higher A)", "P(first is more efficient)", "curves cross at"],
                [
                    [
                        names.get(p["first"], p["first"]),
                        names.get(p["second"], p["second"]),
                        prob(p.get("p_first_higher_asymptote")),
                        prob(p.get("p_first_more_efficient")),
                        ", ".join(g3(c) for c in p.get("crossings") or []) or "-",
                    ]
                    for p in comparison.get("pairs") or []
                ],
            )
        )


def _tail(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """The follow-up round, what would run next, the errors, the jobs."""
    scaling = data.get("scaling") or {}
    if "fit_full.png" in images:
        add(("img", "fit_full.png", "fits on all compute"))

    followup = scaling.get("followup")
    if followup:
        add(("h", 3, "Follow-up round"))
        add(("p", ("Run: " if followup.get("needed") else "Not run: ") + followup.get("reason", "")))

    if scaling.get("next") or not scaling.get("decision"):
        add(("h", 2, "What the loop would run next"))
        text = (scaling.get("next") or {}).get("text")
        add(("p", text or "Nothing: the study did not get far enough (see the errors)."))

    add(("h", 2, "Errors and notes"))
    errors = data.get("errors") or []
    add(
        (
            "ul",
            [f"{e['where']}: " + (f"{e['tool']}: " if e.get("tool") else "") + e["message"] for e in errors]
            or ["none"],
        )
    )

    jobs = data.get("jobs") or []
    if jobs:
        add(("h", 2, "Jobs"))
        add(
            (
                "table",
                ["job", "kind", "state", "started", "ended", "s", "reused"],
                [
                    [
                        j["job_id"],
                        str(j.get("kind")),
                        str(j.get("state")),
                        str(j.get("started_at") or "-"),
                        str(j.get("ended_at") or "-"),
                        g3(j.get("elapsed_s")),
                        "yes" if j.get("reused") else "no",
                    ]
                    for j in jobs
                ],
            )
        )


def blocks(data: dict[str, Any], images: dict[str, bytes]) -> list[Block]:
    """The report's content, section by section, as blocks (heading, paragraph, table, image, preformatted)."""
    out: list[Block] = []
    for section in (_header, _node, _overlap, _design, _ladder, _chains, _runs, _held_out, _rounds, _tail):
        section(data, images, out.append)
    return out


# ---- rendering -----------------------------------------------------------------------------------------------------


# Characters that would not show as themselves in report.md: controls (C0, DEL, C1), the Unicode line and
# paragraph separators, and the bidirectional overrides and isolates that reorder what is shown.
MD_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Markdown's inline syntax: links and images ([ ]), emphasis (* ~, and _ unless inside a word), code spans (`),
# headings (#), table cells (|), and the backslash itself.
MD_SPECIAL = re.compile(r"[\\`*~\[\]#|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}  # raw HTML, autolinks, entities, block quotes


def md_text(text: str) -> str:
    """`text` (a value from a job, a tool or the study's configuration) as markdown that shows exactly it and
    nothing more: on one line (a line break, tab or other control becomes a space or a visible \\uXXXX escape),
    every markdown metacharacter backslash-escaped, and & < > as entities, so that no link, image, raw HTML,
    heading or table cell can come from it. The one escape of report.md: every block's text goes through it."""

    def control(m: re.Match[str]) -> str:
        return " " if m.group() in "\t\n\r" else f"\\u{ord(m.group()):04x}"  # its backslash escaped below

    text = MD_CONTROL.sub(control, str(text))
    text = MD_SPECIAL.sub(lambda m: "\\" + m.group(), text)
    return "".join(MD_ENTITIES.get(c, c) for c in text)


def _md_fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`, so that no line of it closes the block."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _md_pre(text: str) -> str:
    """A preformatted block's text: its lines kept, other controls as visible \\uXXXX escapes."""
    return MD_CONTROL.sub(lambda m: m.group() if m.group() in "\n\t" else f"\\u{ord(m.group()):04x}", text)


def render_markdown(content: list[Block]) -> str:
    lines: list[str] = []
    for block in content:
        kind = block[0]
        if kind == "h":
            lines += ["#" * block[1] + " " + md_text(block[2]), ""]
        elif kind == "p":
            lines += [md_text(block[1]), ""]
        elif kind == "pre":
            text = _md_pre(block[1].rstrip("\n"))
            fence = _md_fence(text)
            lines += [fence, text, fence, ""]
        elif kind == "ul":
            lines += [f"- {md_text(item)}" for item in block[1]] + [""]
        elif kind == "img":
            lines += [f"![{md_text(block[2])}]({md_text(block[1])})", ""]
        elif kind == "table":
            headers, rows = block[1], block[2]
            lines.append("| " + " | ".join(md_text(h) for h in headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


# Tables fit the page down to an 800 px window: as wide as the body at most, small type, cells wrapped at spaces,
# and a cell with a long word (class "w": a job id, a shape, a variant's flags) broken anywhere, so that no column
# needs more than its share while short words ("stopped", "leader") stay whole.
CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1180px; margin: 2em auto; padding: 0 1em;
       color: #1d2329; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .8em; table-layout: auto; max-width: 100%; }
th, td { border: 1px solid #d0d7de; padding: .2em .4em; text-align: left; vertical-align: top;
         overflow-wrap: break-word; hyphens: none; }
th.w, td.w { overflow-wrap: anywhere; }
th { background: #f3f5f7; }
p, li { overflow-wrap: anywhere; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .8em; }
img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
"""


LONG_WORD = 12  # a cell with a word longer than this (a job id, a shape) may break it anywhere: class "w"


def _cell(tag: str, text: str) -> str:
    long = any(len(word) > LONG_WORD for word in str(text).split())
    return f'<{tag} class="w">{html.escape(text)}</{tag}>' if long else f"<{tag}>{html.escape(text)}</{tag}>"


def render_html(content: list[Block], images: dict[str, bytes], title: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
    ]
    e = html.escape
    for block in content:
        kind = block[0]
        if kind == "h":
            parts.append(f"<h{block[1]}>{e(block[2])}</h{block[1]}>")
        elif kind == "p":
            parts.append(f"<p>{e(block[1])}</p>")
        elif kind == "pre":
            parts.append(f"<pre>{e(block[1])}</pre>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode(images[block[1]]).decode()
            parts.append(f'<p><img alt="{e(block[2])}" src="data:image/png;base64,{data}"></p>')
        elif kind == "table":
            head = "".join(_cell("th", h) for h in block[1])
            body = "".join("<tr>" + "".join(_cell("td", c) for c in row) + "</tr>" for row in block[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(out: Path, data: dict[str, Any], images: dict[str, bytes]) -> dict[str, Path]:
    """Write study.json, the pictures, report.md and report.html into `out`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    content = blocks(data, images)
    paths = {"study.json": out / "study.json", "report.md": out / "report.md", "report.html": out / "report.html"}
    _write(paths["study.json"], json.dumps(data, indent=1, default=str).encode())
    for name, png in images.items():
        _write(out / name, png)
        paths[name] = out / name
    _write(paths["report.md"], render_markdown(content).encode())
    title = f"Experiment loop: study {data.get('study')}"
    _write(paths["report.html"], render_html(content, images, title).encode())
    return paths
