"""MkDocs hook: the configuration reference, generated from the config dataclasses at build time.

A page asks for one table with a line

    <!-- config: jaxrl_hier/algorithms/ppo_config.py PPOConfig -->

and this hook replaces it with a table of the class's keys (its fields), their defaults and the
comments written beside or above them in the source, followed by the checks the class makes at load
(the messages of the `ConfigError`s its methods raise). The source is read with `ast`, not imported,
so the site builds without JAX. A marker naming a file or class that does not exist fails the build.
"""

from __future__ import annotations

import ast
import re
import tokenize
from io import StringIO
from pathlib import Path

MARKER = re.compile(r"<!--\s*config:\s*(\S+)\s+(\w+)\s*-->")
ROOT = Path(__file__).resolve().parents[2]


class ConfigReferenceError(RuntimeError):
    pass


def _comments(source: str) -> dict[int, tuple[str, bool, int]]:
    """line number -> (comment text, whether the comment is the line's only content, its column)."""
    out: dict[int, tuple[str, bool, int]] = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            alone = lines[row - 1][:col].strip() == ""
            out[row] = (tok.string.lstrip("#").strip(), alone, col)
    return out


_OPEN_ENDINGS = {"a", "an", "and", "as", "by", "for", "in", "is", "its", "of", "or", "that", "the", "to", "which", "with"}


def _unfinished(text: str) -> bool:
    """A comment that stops mid-sentence goes on in the comment line below it."""
    words = text.split()
    return bool(words) and (text.endswith(",") or words[-1].lower() in _OPEN_ENDINGS)


def _default(node: ast.expr | None, source: str) -> str:
    if node is None:
        return "required"
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return ast.get_source_segment(source, kw.value) or ""
            if kw.arg == "default_factory":
                text = ast.get_source_segment(source, kw.value) or ""
                return text[len("lambda:"):].strip() if text.startswith("lambda:") else f"{text}()"
    return ast.get_source_segment(source, node) or ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _checks(cls: ast.ClassDef) -> list[str]:
    """The messages of every `raise ConfigError(...)` in the class's methods, as source text."""
    found: list[str] = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
            if name == "ConfigError" and node.exc.args:
                arg = node.exc.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    text = arg.value
                else:
                    text = ast.unparse(arg)
                    if text.startswith(("f'", 'f"')):
                        text = text[2:-1]
                text = re.sub(r"\s+", " ", text)
                if text not in found:
                    found.append(text)
    return found


def config_table(path: str, class_name: str) -> str:
    file = ROOT / path
    if not file.is_file():
        raise ConfigReferenceError(f"config reference: no file {path}")
    source = file.read_text()
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise ConfigReferenceError(f"config reference: no class {class_name} in {path}")
    comments = _comments(source)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    section = ""
    consumed: set[int] = set()
    count = 0
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if name.isupper() or name.startswith("_"):
            continue
        # the comment block just above the field (a "# ---- name" line starts a group instead)
        above: list[str] = []
        row = node.lineno - 1
        new_section = ""
        while row in comments and comments[row][1] and row not in consumed:
            text = comments[row][0]
            if text.startswith("----"):
                new_section = " ".join([text.strip("- ").strip(), *above])
                above = []
                break
            above.insert(0, text)
            row -= 1
        beside = comments.get(node.lineno, ("", False, 0))
        # a comment that continues on the next lines, under the field
        below: list[str] = []
        row = (node.end_lineno or node.lineno) + 1
        while (beside[0] and not beside[1] and row in comments and comments[row][1]
               and (comments[row][2] > node.col_offset or _unfinished(below[-1] if below else beside[0]))):
            nxt = comments[row][0]
            if nxt.startswith("----"):
                break
            below.append(nxt)
            consumed.add(row)
            row += 1
        if not beside[1]:
            text = " ".join([*above, beside[0], *below]).strip()
        else:
            text = " ".join(above).strip()
        if new_section and new_section != section:
            section = new_section
            rows.append(f"| **{_cell(section)}** | | | |")
        annotation = ast.get_source_segment(source, node.annotation) or ""
        rows.append(f"| `{name}` | `{_cell(annotation)}` | `{_cell(_default(node.value, source))}` | {_cell(text)} |")
        count += 1
    if count == 0:
        raise ConfigReferenceError(f"config reference: {class_name} in {path} has no fields")
    doc = ast.get_docstring(cls)
    parts = [f"`{class_name}` (`{path}`, {count} keys)."]
    if doc:
        parts.append(" ".join(doc.split()))
    out = [" ".join(parts), "", *rows]
    checks = _checks(cls)
    if checks:
        out += ["", f"Checked when a `{class_name}` is loaded (each stops the run with `error: ...` and exit code 2):", ""]
        out += [f"- {_cell(c)}" for c in checks]
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page=None, config=None, files=None, **kwargs) -> str:  # noqa: ARG001
    return MARKER.sub(lambda m: config_table(m.group(1), m.group(2)), markdown)
