"""Pictures of fits: PNG bytes from matplotlib's Agg backend (no display needed)."""

import io
import warnings
from types import ModuleType

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


def plot_curves(
    fits: list[StoredFit], extrapolate_to: float | None, level: float, width_px: int, height_px: int
) -> bytes:
    plt = _figure()
    dpi = 100
    fig, ax = plt.subplots(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    try:
        all_compute = [p.compute for f in fits for p in f.points if p.compute]
        used_max = max(used_compute_max(f) for f in fits)
        right = max(max(all_compute), extrapolate_to or 0) * 1.05
        grid = np.geomspace(min(all_compute) * 0.8, right, 400)
        for k, fit in enumerate(fits):
            color = COLORS[k % len(COLORS)]
            name = fit.label or fit.id
            excluded = excluded_indices(fit)
            used = [(p.compute, p.value) for i, p in enumerate(fit.points) if i not in excluded]
            dropped = [(p.compute, p.value) for i, p in enumerate(fit.points) if i in excluded]
            if used:
                ax.scatter(*zip(*used, strict=True), s=14, color=color, alpha=0.8, label=f"{name}: fitted points")
            if dropped:
                ax.scatter(
                    *zip(*dropped, strict=True),
                    s=18,
                    facecolors="none",
                    edgecolors=color,
                    alpha=0.8,
                    label=f"{name}: excluded points",
                )
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
                ax.fill_between(
                    grid, low, high, where=np.isfinite(low) & np.isfinite(high), color=color, alpha=0.18, lw=0
                )
            ax.axhline(asymptote, color=color, lw=0.8, ls=":")
        if right > used_max:
            ax.axvspan(used_max, right, color="0.85", alpha=0.5, lw=0, label="extrapolated")
        ax.set_xscale("log")
        ax.set_xlabel(f"compute ({fits[0].compute_unit})")
        ax.set_ylabel("value")
        ax.set_title(
            "Fitted scaling curves"
            + (f" ({level:.0%} bootstrap bands)" if any(f.outcome.bootstrap_draws for f in fits) else "")
        )
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right")
        buffer = io.BytesIO()
        fig.tight_layout()
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
        ax.set_ylabel("loss")
        ax.set_title(f"Chinchilla fit {fit.label or fit.id}: alpha={params['alpha']:.3f}, beta={params['beta']:.3f}")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)
