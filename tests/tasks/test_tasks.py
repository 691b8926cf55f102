"""The three tasks, make_task, and the Python rewards (pure Python, fast)."""

import json
import re

import numpy as np
import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks import (ArithmeticTask, CombinedReward, CountdownTask, GSM8KTask, Problem, Task,
                              correctness_reward, format_reward, length_penalty, make_task, safe_eval, task_reward)
from jaxrl_hier.tasks.base import SPLITS, distinct_problems, split_of


def _keys(problems):
    return {p.prompt for p in problems}


# ----------------------------------------------------------------------------- arithmetic


def test_arithmetic_deterministic_disjoint_and_knobs():
    task = make_task("arithmetic", operators="+-", digits=1, steps=1)  # 200 distinct expressions
    assert isinstance(task, Task)
    train = task.problems("train", 400, seed=0)
    assert train == task.problems("train", 400, seed=0)
    assert train != task.problems("train", 400, seed=1)
    test = task.problems("test", 100, seed=0) + task.problems("test", 100, seed=1)
    assert _keys(train) and _keys(test) and not _keys(train) & _keys(test)
    assert all(re.fullmatch(r"\d[+-]\d=", p.prompt) for p in train)
    assert all(p.meta["task"] == "arithmetic" and p.meta["split"] == "train" for p in train)
    assert any(p.answer.startswith("-") for p in train)  # negative answers occur


def _assert_pairwise_disjoint(draw):
    """Every split non-empty, its problems tagged with it, and no two splits sharing a prompt."""
    assert SPLITS == ("train", "validation", "test")
    keys = {split: set() for split in SPLITS}
    for split in SPLITS:
        problems = draw(split)
        assert problems and all(p.meta["split"] == split for p in problems)
        keys[split] = _keys(problems)
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not keys[a] & keys[b], (a, b)


@pytest.mark.parametrize("task", [ArithmeticTask(operators="+-", digits=1, steps=2),  # 4,000 expressions
                                  CountdownTask(count=3, max_value=6, max_target=30)])
def test_procedural_splits_pairwise_disjoint(task):
    # several seeds and enough draws to cover most of each split of the small spaces
    _assert_pairwise_disjoint(lambda split: [p for seed in range(3) for p in task.problems(split, 1500, seed)])


def test_validation_leaves_test_as_it_was_and_comes_out_of_train():
    """Seed 0's draws before the validation split existed (old train / test): test is the same, and
    train is the same stream less the problems that became validation ones."""
    task = make_task("arithmetic", operators="+-", digits=1, steps=2)
    assert [p.prompt for p in task.problems("test", 6, 0)] == ["7+1+6=", "1+2-2=", "4+4-0=", "5-8+5=", "2+6-3=", "9+1-4="]
    old_train = ["7+2+1=", "4-4-6=", "8-4-2=", "4+7+4=", "2+5+3=", "1-2+3="]
    assert [p.prompt for p in task.problems("train", 5, 0)] == old_train[1:]
    assert "7+2+1=" in _keys(task.problems("validation", 4000, 0))
    countdown = CountdownTask()
    assert [p.prompt for p in countdown.problems("test", 3, 0)] == \
        ["make 20 from 2 3 11 15:", "make 33 from 5 2 18 12:", "make 76 from 3 16 10 18:"]


@pytest.mark.parametrize("kwargs", [{"validation_fraction": 0.0}, {"validation_fraction": True},
                                    {"test_fraction": 0.5, "validation_fraction": 0.5}])
def test_bad_validation_fraction(kwargs):
    for name in ("arithmetic", "countdown"):
        with pytest.raises(ConfigError, match=r"validation_fraction (must be|got \d)"):
            make_task(name, **kwargs)


def test_distinct_problems_are_the_stream_without_repeats():
    task = ArithmeticTask(operators="+", digits=1, steps=1)  # 100 expressions, about 10 of them test
    stream = task.problems("test", 40, 0)
    assert len(_keys(stream)) < 40  # drawn with replacement, the stream repeats
    first = list(dict.fromkeys(p.prompt for p in stream))
    few = distinct_problems(task, "test", 3, 0)
    assert [p.prompt for p in few] == first[:3]  # the start of the old draw, repeats dropped
    # more asked than the split holds: every test expression, each once
    every = {f"{a}+{b}=" for a in range(10) for b in range(10)
             if split_of(f"arithmetic:{a}+{b}", task.test_fraction, task.validation_fraction) == "test"}
    many = distinct_problems(task, "test", 500, 0)
    assert len(many) == len(_keys(many)) == len(every) < 500 and _keys(many) == every


def test_distinct_problems_of_a_finite_pool(tmp_path):
    task = GSM8KTask(path=str(_write(tmp_path / "g.jsonl", [_gsm(i) for i in range(40)])), test_fraction=0.3)
    size = task.size("test")
    assert 3 < size < 40
    assert len(_keys(distinct_problems(task, "test", 3, 0))) == 3
    assert _keys(distinct_problems(task, "test", 100, 0)) == _keys(task.problems("test", size, 0))
    assert len(distinct_problems(task, "test", 100, 0)) == size


def test_arithmetic_worked_target_follows_precedence():
    task = ArithmeticTask(steps=3, digits=2, worked=True)
    assert task.make_problem([5, 3, 4], ["+", "*"]).target == "3*4=12\n5+12=17\n#### 17"
    assert task.make_problem([2, 9, 3], ["-", "+"]).target == "2-9=-7\n-7+3=-4\n#### -4"
    for p in task.problems("train", 50, seed=3):
        lines = p.target.split("\n")
        assert len(lines) == 4 and lines[-1] == f"#### {p.answer}"
        for line in lines[:-1]:  # each step is one true equation
            lhs, rhs = line.rsplit("=", 1)
            assert safe_eval(lhs).value == int(rhs)
        assert safe_eval(p.prompt[:-1]).value == int(p.answer)
        assert task.is_correct(p, p.target)
    assert ArithmeticTask().problems("test", 3, 0)[0].target.startswith("#### ")


def test_arithmetic_is_correct():
    task = ArithmeticTask()
    p = task.make_problem([5, 3, 4], ["+", "*"])
    assert task.is_correct(p, "#### 17") and task.is_correct(p, "blah\n####  17.0 done")
    assert not task.is_correct(p, "#### 32") and not task.is_correct(p, "17")
    assert not task.is_correct(p, "zz##") and task.is_well_formed(p, "#### 32")
    assert not task.is_well_formed(p, "#### seventeen")


@pytest.mark.parametrize("kwargs, match", [
    ({"operators": "+/"}, "operators"), ({"operators": ""}, "operators"), ({"digits": 0}, "digits"),
    ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"), ({"worked": "yes"}, "worked"),
    ({"test_fraction": 1.0}, "test_fraction must be"), ({"digit": 2}, "Did you mean 'digits'"),
])
def test_arithmetic_bad_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_task("arithmetic", **kwargs)


def test_make_task_unknown_name():
    with pytest.raises(ConfigError, match="Did you mean 'countdown'"):
        make_task("countdwn")
    with pytest.raises(ConfigError, match="needs path="):
        make_task("gsm8k")


def test_tiny_problem_space_fails_clearly():
    with pytest.raises(ConfigError, match="too small"):
        ArithmeticTask(operators="+", digits=1, steps=1, test_fraction=0.001).problems("test", 5, 0)


# ----------------------------------------------------------------------------- countdown


def test_countdown_problems_deterministic_disjoint_reachable():
    task = CountdownTask(count=3, max_value=6, max_target=30)
    train = task.problems("train", 300, seed=0)
    assert train == task.problems("train", 300, seed=0)
    test = task.problems("test", 60, seed=0)
    key = lambda p: (tuple(sorted(p.meta["numbers"])), p.meta["target"])  # noqa: E731
    assert not {key(p) for p in train} & {key(p) for p in test}
    for p in train + test:
        expression, answer_line = p.target.split("\n")
        evaluation = safe_eval(expression)
        assert evaluation.value == p.meta["target"] <= 30 and answer_line == f"#### {p.answer}"
        assert sorted(evaluation.numbers) == sorted(p.meta["numbers"])
        assert task.is_correct(p, p.target) and task.is_well_formed(p, p.target)


def test_countdown_judging():
    task = CountdownTask()
    p = task.make_problem([7, 2, 5, 3], 28, "(7-2)*5+3")
    assert p.prompt == "make 28 from 7 2 5 3:"
    assert task.is_correct(p, "(7-2)*5+3\n#### 28")
    assert task.is_correct(p, " 5*(7-2) + 3 \n#### 28 ok")
    assert not task.is_correct(p, "(7-3)*7\n#### 28")                  # 7 used twice
    assert not task.is_correct(p, "7*2*2\n#### 28")                    # 2 used twice
    assert not task.is_correct(p, "28\n#### 28")                       # 28 is not a given number
    assert not task.is_correct(p, "7*5-3\n#### 28") and task.is_well_formed(p, "7*5-3\n#### 28")
    assert not task.is_correct(p, "(7-2)*5+3\n#### 27")                # wrong answer line
    assert not task.is_correct(p, "(7-2)*5+3")                          # no answer line
    for garbage in ["__import__('os').system('x')\n#### 28", "7**2\n#### 49", "x*7\n#### 28", "7/2*4\n#### 14",
                    "(((7)\n#### 7", "", "7.0*4\n#### 28"]:
        assert not task.is_correct(p, garbage) and not task.is_well_formed(p, garbage)


def test_countdown_bad_options():
    with pytest.raises(ConfigError, match="count"):
        make_task("countdown", count=1)
    with pytest.raises(ConfigError, match="max_value"):
        make_task("countdown", max_value=0)


# ----------------------------------------------------------------------------- gsm8k


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _gsm(i):
    return {"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n#### {i + 2:,}"}


def test_gsm8k_one_file_split(tmp_path):
    path = _write(tmp_path / "gsm.jsonl", [_gsm(i) for i in range(998, 1058)] + [""])
    task = make_task("gsm8k", path=str(path), test_fraction=0.25, validation_fraction=0.25)
    assert sum(task.size(s) for s in SPLITS) == 60 and task.size("test") > 0 and task.size("validation") > 0
    _assert_pairwise_disjoint(lambda split: task.problems(split, task.size(split), 0))
    train, test = task.problems("train", task.size("train"), 0), task.problems("test", task.size("test"), 0)
    assert len(_keys(train)) == task.size("train")
    # the test split is what it was before validation: the hash's lowest quarter, whatever validation takes
    assert _keys(test) == _keys(make_task("gsm8k", path=str(path), test_fraction=0.25,
                                          validation_fraction=0.5).problems("test", task.size("test"), 0))
    p = next(q for split in SPLITS for q in task.problems(split, task.size(split), 0) if q.meta["line"] == 3)
    assert p.prompt == "Tom has 1000 apples and buys 2. How many?\n" and p.answer == "1002"
    assert p.target == "1000+2=1002\n#### 1002"   # calculator annotation gone, comma normalised
    assert task.is_correct(p, "so 1,002\n#### 1,002") and not task.is_correct(p, "#### 1000")
    epochs = task.problems("train", 2 * task.size("train") + 1, seed=5)
    assert epochs == task.problems("train", len(epochs), seed=5) and len(_keys(epochs)) == task.size("train")
    assert GSM8KTask(path=str(path), worked=False).problems("train", 1, 0)[0].target.startswith("#### ")


def test_gsm8k_two_files_are_disjoint(tmp_path):
    train = _write(tmp_path / "train.jsonl", [_gsm(i) for i in range(10)])
    test = _write(tmp_path / "test.jsonl", [_gsm(i) for i in range(8, 12)])
    task = GSM8KTask(path=str(train), test_path=str(test), validation_fraction=0.3)
    # the test file is the test split; validation is a hashed slice of the other 8
    assert task.size("train") + task.size("validation") == 8 and task.size("test") == 4 and task.size("validation")
    _assert_pairwise_disjoint(lambda split: task.problems(split, task.size(split), 0))
    assert _keys(task.problems("test", 4, 0)) == {f"Tom has {i} apples and buys 2. How many?\n" for i in range(8, 12)}


@pytest.mark.parametrize("lines, line_no, match", [
    ([_gsm(1), "{not json", _gsm(2)], 2, "not valid JSON"),
    ([_gsm(1), _gsm(2), "[1, 2]"], 3, "expected a JSON object"),
    ([_gsm(1), {"question": "q"}], 2, "'answer' is missing"),
    ([{"question": 3, "answer": "#### 1"}], 1, "'question' is missing or not"),
    ([_gsm(1), "", {"question": "q", "answer": "it is 4"}], 3, "no '#### <number>'"),
    ([{"question": "q", "answer": "#### four"}], 1, "no '#### <number>'"),
])
def test_gsm8k_bad_files_name_file_and_line(tmp_path, lines, line_no, match):
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ConfigError, match=match) as err:
        make_task("gsm8k", path=str(path))
    assert f"{path}:{line_no}:" in str(err.value)


def test_gsm8k_missing_or_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        GSM8KTask(path=str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="no problems"):
        GSM8KTask(path=str(tmp_path / "empty.jsonl"))
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        GSM8KTask(path=str(tmp_path / "bin.jsonl"))


# ----------------------------------------------------------------------------- rewards


def test_combined_reward_with_nan_rows():
    arith, count = ArithmeticTask(), CountdownTask()
    pa = arith.problems("train", 2, 0)
    pc = count.make_problem([7, 2, 5, 3], 28, "(7-2)*5+3")
    pc = Problem(pc.prompt, pc.answer, pc.target, {**pc.meta, "task": "countdown"})
    problems = [pa[0], pa[1], pc, pc]
    completions = [pa[0].target, "#### 999999", "(7-2)*5+3\n#### 28", "7*5\n#### 35"]
    combined = CombinedReward(
        [correctness_reward(arith), format_reward(arith), correctness_reward(count), format_reward(count, 0.2),
         length_penalty(10, buffer=5, penalty=0.5)],
        [1.0, 1.0, 2.0, 1.0, 1.0], ["a_ok", "a_fmt", "c_ok", "c_fmt", "len"])
    total, per_fn = combined(problems, completions)
    nan = np.nan
    np.testing.assert_array_equal(per_fn["a_ok"], [1, 0, nan, nan])
    np.testing.assert_allclose(per_fn["a_fmt"], [0.1, 0.1, nan, nan])
    np.testing.assert_array_equal(per_fn["c_ok"], [nan, nan, 1, 0])
    np.testing.assert_allclose(per_fn["c_fmt"], [nan, nan, 0.2, 0.2])
    lengths = np.array([len(c) for c in completions])
    np.testing.assert_allclose(per_fn["len"], -0.5 * np.clip((lengths - 5) / 5, 0, 1))
    expected = np.array([1.1, 0.1, 2.2, 0.2]) + per_fn["len"]
    assert total.dtype == np.float32 and total.shape == (4,)
    np.testing.assert_allclose(total, expected, rtol=1e-6)
    recipe = task_reward(count)(problems, completions)
    np.testing.assert_allclose(recipe, [nan, nan, 1.0, 0.1])
    assert task_reward(count)([pc], ["garbage"])[0] == 0.0


def test_combined_reward_bad_input():
    fn = format_reward(ArithmeticTask())
    with pytest.raises(ConfigError, match="one weight"):
        CombinedReward([fn], [1.0, 2.0], ["a"])
    with pytest.raises(ConfigError, match="unique"):
        CombinedReward([fn, fn], [1.0, 1.0], ["a", "a"])
    with pytest.raises(ConfigError, match="finite"):
        CombinedReward([fn], [float("nan")], ["a"])
    with pytest.raises(ValueError, match="completions"):
        CombinedReward([fn], [1.0], ["a"])(ArithmeticTask().problems("train", 2, 0), ["x"])
    with pytest.raises(ValueError, match="shape"):
        CombinedReward([lambda p, c: np.zeros(3)], [1.0], ["a"])(ArithmeticTask().problems("train", 2, 0), ["x", "y"])


def test_length_penalty_shape():
    problems = ArithmeticTask().problems("train", 5, 0)
    texts = ["a" * n for n in (0, 12, 14, 16, 40)]
    np.testing.assert_allclose(length_penalty(16)(problems, texts), [0, 0, -0.5, -1, -1])   # buffer 4
    np.testing.assert_allclose(length_penalty(16, buffer=0, penalty=2)(problems, texts), [0, 0, 0, 0, -2])
    with pytest.raises(ConfigError, match="buffer"):
        length_penalty(4, buffer=5)
    with pytest.raises(ConfigError, match="max_len"):
        length_penalty(0)


def test_task_from_config_reads_each_family_s_keys():
    from jaxrl_hier.llm_rl.config import GRPOConfig
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig
    from jaxrl_hier.search.config import PGTSConfig
    from jaxrl_hier.tasks import task_from_config

    grpo = task_from_config(GRPOConfig(task_operators="*", task_digits=3, task_steps=2, task_worked=True))
    assert (grpo.operators, grpo.digits, grpo.steps, grpo.worked) == ("*", 3, 2, True)
    guided = task_from_config(GuidedConfig(task_digits=2))  # no task_worked key: plain answers
    assert (guided.digits, guided.steps, guided.worked) == (2, 2, False)
    assert task_from_config(PGTSConfig(task_steps=4), worked=True).worked  # PGTS always needs the steps
    assert isinstance(task_from_config(GRPOConfig(task="countdown")), CountdownTask)
    with pytest.raises(ConfigError, match="path must be a file path"):  # GRPOConfig.validate says it first
        task_from_config(GRPOConfig(task="gsm8k"))
