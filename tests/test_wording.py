"""Words a reader can follow: no phrase in the README, the docs, the package, the benchmark scripts
or the configs that names something the reader cannot look up.

Flagged (case-insensitive, see PATTERNS): the word "session"; an issue reference ("issue 30",
"issue #30", "(issue 28)"); a machine named only as "this CPU", "this GPU", "this machine" or
"this project's CPU"; internal targets ("the 1.5x target", "the 10-minute goal"); GPU "leases".
A figure names its processor or GPU instead ("a 2-core AMD EPYC", "one H200"); a comment says why
in terms of the code. Every offending file:line is printed. `python tests/test_wording.py` lists
them all.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Tracked files checked: these prefixes (the top-level `configs` is a link to jaxrl_hier/configs).
SCOPE = ("README.md", "docs/", "jaxrl_hier/", "benchmarks/device/")
SCOPE_PATTERNS = (re.compile(r"benchmarks/(?!results/)([^/]+/)?[^/]+\.(py|md)"),)  # scripts and indexes, not the results

PATTERNS = {
    "the word 'session'": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "an unnamed machine": re.compile(
        r"\bthis (cpu|gpu|machine|session)\b(?!-)|\bthis project's (\S+ )?(cpu|gpu|vm|machine|leases?)\b", re.IGNORECASE),
    "an internal target": re.compile(
        r"\b1\.5 ?x (\w+ )?(target|goal)\b|\bthe \d+-minute (goal|target|budget)\b|\b(project's|gpu) target\b",
        re.IGNORECASE),
    "a GPU lease": re.compile(
        r"\bleases\b|\blease's\b|\b(a|an|one|the|each|this|short|earlier|later|second|\d+-minute) lease\b"
        r"|\blent (gpu|machine)\b", re.IGNORECASE),
}

# Technical compounds that may contain a flagged word (an API name such as `requests.Session`),
# removed from a line before it is checked. Exact strings; none is needed today.
ALLOWED: tuple[str, ...] = ()


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = []
    for name in out.decode().split("\0"):
        if not name or (ROOT / name).is_symlink() or not (ROOT / name).is_file():
            continue
        if name.startswith(SCOPE) or any(p.fullmatch(name) for p in SCOPE_PATTERNS):
            files.append(name)
    return files


def offenders(files: list[str]) -> list[str]:
    """'path:line: what: the line' for every flagged phrase in the text files among `files`."""
    found = []
    for name in files:
        data = (ROOT / name).read_bytes()
        if b"\0" in data:
            continue  # binary
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            checked = line
            for allowed in ALLOWED:
                checked = checked.replace(allowed, "")
            for what, pattern in PATTERNS.items():
                if pattern.search(checked):
                    found.append(f"{name}:{number}: {what}: {line.strip()[:160]}")
    return found


def test_patterns_flag_the_phrases_they_mean():
    flagged = ["in this session", "Sessions", "a session-less run", "(issue 28)", "issue #30", "issue 31's diagnosis",
               "on this CPU", "this machine", "this GPU's memory", "this project's 2-core CPU", "the 1.5x target",
               "the 10-minute goal", "sized to a short lease", "GPU leases", "on a lent GPU"]
    kept = ["ClientSession", "Craftax_Baselines#11", "tissue 3", "the target critic", "learn lease least",
            "this CPU-bound loop", "the suite's 20-minute budget", "on a 2-core AMD EPYC"]

    def hit(text):
        return any(p.search(text) for p in PATTERNS.values())

    assert [t for t in flagged if not hit(t)] == []
    assert [t for t in kept if hit(t)] == []


def test_no_unreadable_wording():
    files = tracked_files()
    assert files, "no file in scope: is this the repository root?"
    found = offenders(files)
    print("\n".join(found))
    assert not found, (f"{len(found)} phrase(s) a reader cannot follow (see the module docstring):\n"
                       + "\n".join(found))


if __name__ == "__main__":
    all_found = offenders(tracked_files())
    print("\n".join(all_found))
    counts: dict[str, int] = {}
    for entry in all_found:
        top = entry.split(":", 1)[0]
        top = top if "/" not in top else top.split("/", 1)[0] + "/"
        counts[top] = counts.get(top, 0) + 1
    print(f"{len(all_found)} in all:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
