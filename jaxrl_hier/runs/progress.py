"""What a run tells the person watching it: status lines and the progress bar, from process 0 only."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator

from jaxrl_hier.runs.process import is_primary


def log(message: str) -> None:
    """A status line on stderr, from process 0 only."""
    if is_primary():
        print(message, file=sys.stderr)


@contextlib.contextmanager
def progress_bar(args: argparse.Namespace, total: int, initial: int, desc: str) -> Iterator[Any]:
    """`with progress_bar(...) as bar:` a tqdm bar on process 0 (None with --no-progress or on other
    processes), closed when the block ends, by an error too: an open bar would leave its last line
    half-drawn above the traceback and its monitor thread running."""
    if args.no_progress or not is_primary():
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, initial=initial, unit="step", unit_scale=True, dynamic_ncols=True, desc=desc) as bar:
        yield bar
