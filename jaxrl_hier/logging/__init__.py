"""Metrics sinks and plots."""

from jaxrl_hier.logging.metrics import MetricsWriter, plot_learning_curve, read_jsonl

__all__ = ["MetricsWriter", "plot_learning_curve", "read_jsonl"]
