"""Plots: the one matplotlib set-up (`pyplot`), the one atomic PNG write (`save_figure`), and curves
over metrics records described as panels of series (`plot_curves`), which every run's curve uses.

    plot_curves(records, "curve.png", x="step", panels=[
        Panel("GRPO step", series=(Series("reward", "mean reward"),
                                   Series("eval/accuracy", "held-out accuracy", style="o-", color="black")))])

A series draws the records that hold its key (evaluation rows come every few steps), so sparse and
dense metrics share a panel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from jaxrl_hier.io import atomic_writer


def pyplot():
    """`matplotlib.pyplot` with the non-interactive Agg backend selected: every plot of the package and
    its benchmarks starts here. Imported on call, so importing jaxrl_hier never imports matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> None:
    """Write a matplotlib figure as a PNG through one atomic write, and close it."""
    plt = pyplot()
    try:
        with atomic_writer(path, "wb") as f:
            fig.savefig(f, format="png", dpi=dpi)
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class Series:
    key: str  # the record field drawn against the panel's x
    label: str
    style: str = "-"  # matplotlib format: "-" a line, "o-" marked points (evaluations)
    color: str | None = None
    alpha: float = 1.0


@dataclass(frozen=True)
class Panel:
    xlabel: str
    series: tuple[Series, ...]
    ylabel: str = ""
    title: str = ""
    legend: bool = True


def plot_curves(records: Iterable[dict], path: str | Path, panels: Sequence[Panel], *, x: str,
                size: tuple[float, float] = (7, 4), legend_fontsize: float | None = None, dpi: int = 110) -> None:
    """One row of panels, each series its key against `x` over the records that hold both, as a PNG."""
    plt = pyplot()
    records = list(records)
    fig, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for s in panel.series:
            pts = [(r[x], r[s.key]) for r in records if r.get(s.key) is not None and r.get(x) is not None]
            if pts:
                ax.plot(*zip(*pts), s.style, label=s.label, color=s.color, alpha=s.alpha)
        ax.set(xlabel=panel.xlabel, ylabel=panel.ylabel, title=panel.title)
        ax.grid(alpha=0.3)
        if panel.legend and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=legend_fontsize)
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)


def plot_learning_curve(records: Iterable[dict], path: str | Path, title: str = "") -> None:
    """Episode return and length against env steps (PPO runs)."""
    plot_curves(records, path, x="env_steps", size=(10, 3.5), dpi=100, panels=[
        Panel("env steps", (Series("episode_return", "return"),), "mean episode return", title, legend=False),
        Panel("env steps", (Series("episode_length", "length"),), "mean episode length", legend=False)])


__all__ = ["Panel", "Series", "plot_curves", "plot_learning_curve", "pyplot", "save_figure"]
