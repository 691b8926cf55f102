"""GSM8K-format word problems from local JSONL files (nothing is downloaded).

Each non-blank line is a JSON object {"question": str, "answer": str} whose answer ends with the
answer line "#### <number>", as in GSM8K:

    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\\n#### 7"}

The problem's prompt is the question plus a newline; the SFT target is the worked solution with
GSM8K's calculator annotations "<<...>>" removed (when `worked`), then "#### <answer>"; the
annotations' expressions are kept in `meta["calls"]` (the calculator tool's warm-start,
`tasks.tool_use`). Splits:
with `test_path`, test comes from `test_path` and train from `path` (minus any question also in the
test file), less the validation slice: the questions whose hash falls below `validation_fraction`.
Without it, one file is split by a hash of each question (`base.split_of`: `test_fraction` of
it to test, the next `validation_fraction` to validation, the rest to train).
Any bad file (missing, not UTF-8, a line that is not a JSON object, a missing or non-string
field, an answer without a numeric "####" line) raises ConfigError naming the file and line.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path


from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.answers import MARKER, answers_equal, extract_answer
from jaxrl_hier.tasks.base import SPLITS, Problem, check_fractions, check_split_args, split_of, split_rng

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def load_gsm8k_jsonl(path: str | Path, worked: bool = True) -> list[Problem]:
    """Parse one GSM8K-format JSONL file into problems (meta: file, line, question)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"gsm8k file not found: {path}. Pass path=... (and optionally test_path=...) "
                          "pointing to JSONL files of {\"question\": ..., \"answer\": \"... #### 42\"}.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ConfigError(f"gsm8k file {path} is not UTF-8 text: {err}.") from None
    problems = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object.") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected a JSON object with 'question' and 'answer', "
                              f"got {type(record).__name__}.")
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise ConfigError(f"{where}: field '{key}' is missing or not a non-empty string.")
        solution, _, _ = record["answer"].partition(MARKER)
        answer = extract_answer(record["answer"])
        if answer is None:
            raise ConfigError(f"{where}: the answer has no '{MARKER} <number>' line.")
        calls = [a[2:-2].partition("=")[0].strip() for a in _CALCULATOR.findall(solution)]
        solution = _CALCULATOR.sub("", solution).strip()
        lines_out = ([solution] if worked and solution else []) + [f"{MARKER} {answer}"]
        question = record["question"].strip()
        problems.append(Problem(prompt=question + "\n", answer=answer, target="\n".join(lines_out),
                                meta={"file": str(path), "line": lineno, "question": question,
                                      "calls": [c for c in calls if c]}))  # the annotations' computations
    if not problems:
        raise ConfigError(f"gsm8k file {path} holds no problems.")
    return problems


@dataclasses.dataclass(frozen=True)
class GSM8KTask:
    """Word problems from `path` (and `test_path`), loaded and checked when the task is made."""

    path: str
    test_path: str | None = None
    test_fraction: float = 0.1
    validation_fraction: float = 0.1
    worked: bool = True
    name: str = "gsm8k"
    answer_checkable_on_device = True
    _pools: dict = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for key in ("path", "test_path"):
            value = getattr(self, key)
            if not (isinstance(value, (str, Path)) or (key == "test_path" and value is None)):
                raise ConfigError(f"gsm8k: {key} must be a file path, got {value!r}.")
        check_fractions("gsm8k", self.test_fraction, self.validation_fraction)
        if not isinstance(self.worked, bool):
            raise ConfigError(f"gsm8k: worked must be true or false, got {self.worked!r}.")
        main = load_gsm8k_jsonl(self.path, self.worked)
        if self.test_path is not None:
            test = load_gsm8k_jsonl(self.test_path, self.worked)
            held_out = {p.meta["question"] for p in test}
            # the test file is the test split; validation is a hashed slice of the rest (test share 0)
            splits = {id(p): split_of(p.meta["question"], 0.0, self.validation_fraction) for p in main
                      if p.meta["question"] not in held_out}
            splits.update({id(p): "test" for p in test})
            main = [p for p in main if id(p) in splits] + test
        else:
            splits = {id(p): split_of(p.meta["question"], self.test_fraction, self.validation_fraction) for p in main}
        pools = {split: [dataclasses.replace(p, meta={**p.meta, "task": self.name, "split": split})
                         for p in main if splits[id(p)] == split] for split in SPLITS}
        object.__setattr__(self, "_pools", pools)

    def size(self, split: str) -> int:
        """How many distinct problems `split` holds."""
        check_split_args(split, 0, 0)
        return len(self._pools[split])

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """n problems of `split` in a seeded order: a random permutation of the split, and for
        n larger than the split, further independent permutations appended (epochs)."""
        check_split_args(split, n, seed)
        pool = self._pools[split]
        if not pool and n:
            raise ConfigError(f"gsm8k: the {split} split of {self.path} is empty; give test_path=... or "
                              "more problems (or change test_fraction or validation_fraction).")
        rng = split_rng(seed, split, self.name)
        order: list[int] = []
        while len(order) < n:
            epoch = list(range(len(pool)))
            rng.shuffle(epoch)
            order.extend(epoch)
        return [pool[i] for i in order[:n]]

    def is_well_formed(self, problem: Problem, completion: str) -> bool:
        """An answer line "#### <number>" is present."""
        return extract_answer(completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """The answer line's number equals the reference answer exactly (as decimals)."""
        return answers_equal(extract_answer(completion), problem.answer)
