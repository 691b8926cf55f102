"""Metrics sinks (`metrics`) and plots (`plots`)."""

from jaxrl_hier.logging.metrics import MetricsWriter, read_jsonl
from jaxrl_hier.logging.plots import Panel, Series, plot_curves, plot_learning_curve

__all__ = ["MetricsWriter", "Panel", "Series", "plot_curves", "plot_learning_curve", "read_jsonl"]
