"""The study's report: DIR/report.md (pictures beside it as PNG files), a self-contained DIR/report.html (the same
content, pictures inline as data: URIs, no external resource), and DIR/study.json (the study's data and every call
the loop made). Both reports are rendered from one list of blocks, so they say the same thing.

Every number shown is read from study.json's data, which holds the tools' results; nothing is computed here but
formatting.
"""

from __future__ import annotations

import base64
import html
import io
import json
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


# ---- the overlap picture (matplotlib, Agg) ----------------------------------------------------------------------


def overlap_chart(rows: list[dict[str, Any]], predicted_for: str, measured_on: str) -> bytes:
    """Two panels of bars per layer: predict_overlap's sequential and overlapped times on the catalog GPU, and
    tune_overlap's measured sequential time and best valid overlapped time here (hatched: the fastest row, which
    failed the validity checks, so no gain is claimed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    layers = [r["layer"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    try:
        x = list(range(len(layers)))
        w = 0.38
        pred_seq = [(r["predicted"] or {}).get("t_sequential_ms") or 0.0 for r in rows]
        pred_ovl = [(r["predicted"] or {}).get("t_overlap_ms") or 0.0 for r in rows]
        left.bar([i - w / 2 for i in x], pred_seq, w, color="#9aa5b1", label="sequential")
        left.bar([i + w / 2 for i in x], pred_ovl, w, color="#1f77b4", label="overlapped (best chunks)")
        for i, r in enumerate(rows):
            s = (r["predicted"] or {}).get("speedup")
            if isinstance(s, int | float):
                left.annotate(f"{s:.2f}x", (i + w / 2, pred_ovl[i]), ha="center", va="bottom", fontsize=8)
        left.set_title(f"predicted: {predicted_for} (predict_overlap)", fontsize=10)
        left.set_ylabel("time per layer (ms)")
        left.set_xticks(x, layers, rotation=15, fontsize=8)
        left.legend(fontsize=8)

        meas_seq, meas_best, hatched = [], [], []
        for r in rows:
            m = r["measured"] or {}
            meas_seq.append(m.get("t_sequential_ms") or 0.0)
            if isinstance(m.get("best_t_ms"), int | float):
                meas_best.append(m["best_t_ms"])
                hatched.append(False)
            elif m.get("fastest"):
                meas_best.append(m["fastest"]["t_ms"])
                hatched.append(not m["fastest"]["valid"])
            else:
                meas_best.append(0.0)
                hatched.append(False)
        right.bar([i - w / 2 for i in x], meas_seq, w, color="#9aa5b1", label="sequential")
        bars = right.bar([i + w / 2 for i in x], meas_best, w, color="#d62728", label="best valid overlapped")
        for bar, h in zip(bars, hatched, strict=True):
            if h:
                bar.set_hatch("//")
                bar.set_facecolor("white")
                bar.set_edgecolor("#d62728")
        handles, _ = right.get_legend_handles_labels()
        if any(hatched):
            handles.append(Patch(facecolor="white", edgecolor="#d62728", hatch="//", label="fastest row, invalid"))
        right.legend(handles=handles, fontsize=8)
        right.set_title(f"measured: {measured_on} (tune_overlap)", fontsize=10)
        right.set_ylabel("time per layer (ms)")
        right.set_xticks(x, layers, rotation=15, fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


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
    """2. The overlap study: predicted against measured per layer."""
    # 2. overlap
    overlap = data.get("overlap")
    if overlap is not None:
        add(("h", 2, f"2. Overlap: {overlap.get('preset')} at TP={overlap.get('tp')}"))
        measured = overlap.get("measured") or {}
        notes = [overlap.get("measure_note")]
        notes += [f"tune_overlap: {n}" for n in (measured.get("note"), measured.get("backend_decision")) if n]
        notes = [n.rstrip(".") + "." for n in notes if n]
        if notes:
            add(("p", " ".join(notes)))
        rows = overlap.get("rows") or []
        if rows:
            table = []
            for r in rows:
                p, m = r.get("predicted") or {}, r.get("measured") or {}
                best = m.get("best") or "none valid"
                if not m.get("best") and m.get("fastest"):
                    best += f" (fastest: {m['fastest']['name']} {ms(m['fastest']['t_ms'])} ms, invalid)"
                table.append(
                    [
                        r["layer"],
                        str(r.get("pattern")),
                        str(p.get("shape", "-")),
                        ms(p.get("t_sequential_ms")),
                        ms(p.get("t_overlap_ms")),
                        "-" if p.get("speedup") is None else f"{p['speedup']:.2f}x",
                        str(m.get("shape", "-")),
                        ms(m.get("t_sequential_ms")),
                        best,
                        "-" if m.get("gain") is None else f"{100 * m['gain']:+.1f}%",
                        str(m.get("verdict", "-")),
                    ]
                )
            gpu = overlap.get("predicted_for")
            add(
                (
                    "table",
                    [
                        "layer",
                        "pattern",
                        f"predicted shape ({gpu})",
                        "T_seq ms",
                        "T_overlap ms",
                        "speedup",
                        "measured shape",
                        "T_seq ms",
                        "best valid",
                        "gain",
                        "verdict (tune_overlap)",
                    ],
                    table,
                )
            )
        if "overlap.png" in images:
            add(("img", "overlap.png", "overlap: predicted vs measured per layer"))
        if overlap.get("table"):
            add(("pre", overlap["table"]))


def _runs(data: dict[str, Any], images: dict[str, bytes], add: Callable[[Block], None]) -> None:
    """3. The RL scaling study: its budget and its runs."""
    scaling = data.get("scaling") or {}
    unit = scaling.get("unit", "")
    # 3. RL scaling
    add(("h", 2, f"3. RL scaling study ({scaling.get('recipe', 'tiny-grpo')})"))
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
    held = [h for h in scaling.get("held_out") or [] if h.get("rows")]
    add(("h", 3, "Held-out check: fit the first half of compute, predict the second"))
    if "fit_heldout.png" in images:
        add(("img", "fit_heldout.png", "first-half fits with bootstrap bands and the held-out points"))
        add(
            (
                "p",
                "Each variant's seeds pooled, fitted on compute up to half the largest (plot_scaling_fit: filled "
                "points fitted, hollow points held out, the shaded region extrapolated, bands from the bootstrap).",
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
                        f3(p.get("p_first_higher_asymptote")),
                        f3(p.get("p_first_more_efficient")),
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

    add(("h", 2, "What the loop would run next"))
    add(("p", (scaling.get("next") or {}).get("text") or "Nothing: the study did not get far enough (see the errors)."))

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
    for section in (_header, _node, _overlap, _runs, _held_out, _rounds, _tail):
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


CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1180px; margin: 2em auto; padding: 0 1em;
       color: #1d2329; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .86em; }
th, td { border: 1px solid #d0d7de; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f5f7; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .8em; }
img { max-width: 100%; border: 1px solid #d0d7de; }
"""


def render_html(content: list[Block], images: dict[str, bytes], title: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
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
            head = "".join(f"<th>{e(h)}</th>" for h in block[1])
            body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in block[2])
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
