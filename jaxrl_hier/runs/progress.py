"""What a run tells the person watching it: status lines and the progress bar, from process 0 only."""

from __future__ import annotations

import argparse
import sys

from jaxrl_hier.runs.process import is_primary


def log(message: str) -> None:
    """A status line on stderr, from process 0 only."""
    if is_primary():
        print(message, file=sys.stderr)


def progress_bar(args: argparse.Namespace, total: int, initial: int, desc: str):
    """A tqdm bar on process 0 (None with --no-progress or on other processes)."""
    if args.no_progress or not is_primary():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", unit_scale=True, dynamic_ncols=True, desc=desc)
