"""Pictures of fits: PNG bytes from matplotlib's Agg backend (no display needed)."""

import io
import warnings
from types import ModuleType
from typing import Any

import numpy as np

from servers.scaling import laws
from servers.scaling.analysis import curve, excluded_indices, point_params, used_compute_max
from servers.scaling.fitstore import StoredFit

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _figure() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def metric_name(fit: StoredFit) -> str | None:
    """The name of what the fit fitted, where it knows it: the metric key of a run source, else the value (or
    loss) column's name (fit_scaling_law stores it in options["metric"]); None for inline points not named."""
    run = fit.options.get("run")
    if isinstance(run, dict) and run.get("metric_key"):
        return str(run["metric_key"])
    metric = fit.options.get("metric")
    return str(metric) if metric else None


def y_label(fits: list[StoredFit], default: str) -> str:
    """The y axis: the metric's name when every fit names the same one; the names (unnamed ones as `default`)
    when they differ; `default` when none does."""
    names = list(dict.fromkeys(metric_name(f) or default for f in fits))
    return " / ".join(names[:3]) + (f" / +{len(names) - 3} more" if len(names) > 3 else "")


def held_out_indices(fit: StoredFit) -> set[int]:
    """The excluded points beyond the fit's max_compute: held out (the rest of the excluded lie below min_compute)."""
    top = fit.options.get("max_compute")
    if top is None:
        return set()
    return {i for i in excluded_indices(fit) if (c := fit.points[i].compute) is not None and c > top}


def curves_figure(
    fits: list[StoredFit], extrapolate_to: float | None, level: float, width_px: int, height_px: int
) -> Any:
    """The figure of fitted curves (matplotlib, Agg); the caller closes it. Per fit: the points fitted (filled),
    those beyond max_compute (hollow: held out), those below min_compute (x: not fitted), the curve, its bootstrap
    band and its asymptote (dotted); shaded, the compute beyond every fit's data. The legend has one entry per kind
    of mark drawn and none for a kind not drawn; the y axis names the metric where the fits know it."""
    plt = _figure()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    dpi = 100
    fig, ax = plt.subplots(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    try:
        all_compute = [p.compute for f in fits for p in f.points if p.compute]
        used_max = max(used_compute_max(f) for f in fits)
        right = max(max(all_compute), extrapolate_to or 0) * 1.05
        grid = np.geomspace(min(all_compute) * 0.8, right, 400)
        banded = False
        for k, fit in enumerate(fits):
            color = COLORS[k % len(COLORS)]
            name = fit.label or fit.id
            excluded, held = excluded_indices(fit), held_out_indices(fit)
            kinds: dict[str, list[tuple[float, float]]] = {"used": [], "held": [], "below": []}
            for i, p in enumerate(fit.points):
                if p.compute is None or p.value is None:
                    continue
                kind = "held" if i in held else "below" if i in excluded else "used"
                kinds[kind].append((p.compute, p.value))
            if kinds["used"]:
                xs, ys = zip(*kinds["used"], strict=True)
                ax.scatter(xs, ys, s=14, color=color, alpha=0.8, label=f"{name}: fitted points")
            if kinds["held"]:
                xs, ys = zip(*kinds["held"], strict=True)
                top = fit.options.get("max_compute")
                label = f"{name}: held out (compute > {top:g})"
                ax.scatter(xs, ys, s=18, facecolors="none", edgecolors=color, alpha=0.8, label=label)
            if kinds["below"]:
                xs, ys = zip(*kinds["below"], strict=True)
                label = f"{name}: below min_compute, not fitted"
                ax.scatter(xs, ys, s=16, marker="x", color=color, alpha=0.6, label=label)
            params = point_params(fit)
            asymptote = params[laws.get(fit.model).asymptote]
            with np.errstate(all="ignore"):
                fitted = curve(fit.model, params, grid)
            ax.plot(
                grid,
                np.where(np.isfinite(fitted), fitted, np.nan),
                color=color,
                lw=2,
                label=f"{name}: {fit.model} {laws.get(fit.model).asymptote}={asymptote:.3f}",
            )
            if fit.outcome.bootstrap_draws:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns where every draw overflowed
                    draws = np.array([curve(fit.model, d, grid) for d in fit.outcome.bootstrap_draws])
                    draws = np.where(np.isfinite(draws), draws, np.nan)
                    tail = (1 - level) / 2 * 100
                    low, high = np.nanpercentile(draws, [tail, 100 - tail], axis=0)
                shown = np.isfinite(low) & np.isfinite(high)
                if np.any(shown):
                    ax.fill_between(grid, low, high, where=shown, color=color, alpha=0.18, lw=0)
                    banded = True
            ax.axhline(asymptote, color=color, lw=0.8, ls=":")
        handles, labels = ax.get_legend_handles_labels()
        if banded:
            handles.append(Patch(color="0.5", alpha=0.3, lw=0))
            labels.append(f"{level:.0%} bootstrap band (curve's colour)")
        handles.append(Line2D([], [], color="0.4", lw=0.8, ls=":"))
        labels.append("asymptote (dotted, curve's colour)")
        if right > used_max:
            handles.append(ax.axvspan(used_max, right, color="0.85", alpha=0.5, lw=0))
            labels.append("extrapolated")
        ax.set_xscale("log")
        ax.set_xlabel(f"compute ({fits[0].compute_unit})")
        ax.set_ylabel(y_label(fits, "value"))
        ax.set_title("Fitted scaling curves" + (f" ({level:.0%} bootstrap bands)" if banded else ""))
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(handles, labels, fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig
    except BaseException:
        plt.close(fig)
        raise


def plot_curves(
    fits: list[StoredFit], extrapolate_to: float | None, level: float, width_px: int, height_px: int
) -> bytes:
    plt = _figure()
    fig = curves_figure(fits, extrapolate_to, level, width_px, height_px)
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def plot_chinchilla(fit: StoredFit, width_px: int, height_px: int) -> bytes:
    """Loss against training FLOPs (6 N D), points coloured by model size, with the compute-optimal frontier."""
    plt = _figure()
    dpi = 100
    fig, ax = plt.subplots(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    try:
        n = np.array([p.params for p in fit.points], dtype=float)
        d = np.array([p.tokens for p in fit.points], dtype=float)
        loss = np.array([p.loss for p in fit.points], dtype=float)
        flops = 6 * n * d
        points = ax.scatter(flops, loss, c=np.log10(n), cmap="viridis", s=16)
        fig.colorbar(points, ax=ax, label="log10 parameters")
        params = point_params(fit)
        budgets = np.geomspace(flops.min(), flops.max() * 100, 200)
        frontier = [laws.optimal_loss(float(c), params) for c in budgets]
        frontier = [v if np.isfinite(v) else np.nan for v in frontier]
        ax.plot(budgets, frontier, color="#d62728", lw=2, label="compute-optimal loss")
        ax.axhline(params["E"], color="0.4", lw=0.8, ls=":", label=f"E={params['E']:.3f}")
        ax.axvspan(flops.max(), budgets.max(), color="0.85", alpha=0.5, lw=0, label="extrapolated")
        ax.set_xscale("log")
        ax.set_xlabel("training compute (FLOPs, 6ND)")
        ax.set_ylabel(y_label([fit], "loss"))
        ax.set_title(f"Chinchilla fit {fit.label or fit.id}: alpha={params['alpha']:.3f}, beta={params['beta']:.3f}")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)
