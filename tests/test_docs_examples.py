"""Every Python example of the README and of the guide pages runs, at the tiny sizes it is written at.

The ```python blocks of a page run in order in one namespace (a page's later block may use what an
earlier one built, as a reader pasting them in turn would), in a fresh temporary working directory.
A block that must not run here (it needs a GPU, a download or a model directory we do not ship) is
marked with the HTML comment below on the line just above its opening fence; `SKIPPED` lists every
such block by page and its first line, so a new skip is a visible change to this file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_MARKER = "<!-- docs-test: skip -->"
# The guide pages whose examples run (the results and history pages hold no examples).
PAGES = ["README.md", "docs/getting-started.md", "docs/ppo.md", "docs/envs.md", "docs/multi-device.md",
         "docs/skills.md", "docs/llm_models.md", "docs/llm_sampling.md", "docs/tasks.md", "docs/grpo.md",
         "docs/guided.md", "docs/pgts.md", "docs/llm_memory.md"]
# (page, first line of the block): blocks marked with SKIP_MARKER. Keep this list tiny.
SKIPPED: set[tuple[str, str]] = set()

FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def python_blocks(page: str) -> list[tuple[int, str, bool]]:
    """(line number, code, skipped) of each ```python block of `page`."""
    text = (ROOT / page).read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        out.append((line, m.group(1), before == SKIP_MARKER))
    return out


def test_pages_exist_and_skips_are_listed():
    marked = set()
    for page in PAGES:
        assert (ROOT / page).is_file(), page
        for _, code, skipped in python_blocks(page):
            if skipped:
                marked.add((page, code.strip().splitlines()[0]))
    assert marked == SKIPPED, "a block marked to skip must be listed in SKIPPED (and only those)"


def test_every_guide_page_is_listed():
    """A new guide page with Python examples gets tested too."""
    ignored = {"docs/results.md", "docs/history.md", "docs/grpo_benchmark.md", "docs/configuration.md",
               "docs/api.md", "docs/index.md"}
    for path in sorted((ROOT / "docs").glob("*.md")):
        rel = f"docs/{path.name}"
        if rel not in ignored and python_blocks(rel):
            assert rel in PAGES, f"{rel} has Python examples but is not in PAGES"


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Examples may name the shipped configs by their repository path.
    os.symlink(ROOT / "configs", tmp_path / "configs")
    namespace: dict = {"__name__": "__docs_example__"}
    for line, code, skipped in python_blocks(page):
        if skipped:
            continue
        try:
            exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"the example at {page} line {line} failed: {exc!r}") from exc
