"""The calculator tool environment (tasks.tool_use): what counts as a call, what the evaluator appends,
the call limit, the reward, the warm-start's calls and answers (arithmetic, and GSM8K-format files
whose annotations become the calls), and the guided config's checks for env: calculator."""

import json

import pytest

from jaxrl_hier.config import ConfigError, build_dataclass
from jaxrl_hier.llm_rl.guided_config import GuidedConfig
from jaxrl_hier.tasks import make_task
from jaxrl_hier.tasks.tool_use import CalculatorEnv, ToolEpisode, evaluate_call, parse_call

TASK = make_task("arithmetic", operators="+-*", digits=2, steps=2)


@pytest.mark.parametrize("text, expression", [
    ("calc 3*7", "3*7"), ("  calc 12 - 5\n", "12 - 5"), ("calc", None), ("calc ", None), ("calc3*7", None),
    ("#### 21", None), ("calc 1\ncalc 2", None), ("the calc 3", None),
])
def test_parse_call(text, expression):
    assert parse_call(text) == expression


def test_a_game_calls_then_answers_and_the_limit_forces_the_answer():
    env = CalculatorEnv(TASK, max_calls=2)
    problem = TASK.make_problem([34, 64, 46], ["+", "*"])  # 34+64*46 = 2978
    ep = ToolEpisode(problem)
    ep, reward, done = env.step(ep, "calc 64*46")
    assert (reward, done, ep.results) == (0.0, False, ["2944"])
    ep, reward, done = env.step(ep, "calc 34+")
    assert (reward, done, ep.results[-1]) == (0.0, False, "error")  # the evaluator refuses; the turn is spent
    assert env.observation(ep) == "34+64*46=\ncalc 64*46 = 2944\ncalc 34+ = error\n"
    ep, reward, done = env.step(ep, "calc 34+2944")  # no calls left: this is the answer, and it has none
    assert (reward, done, ep.turn) == (0.0, True, 3)
    ep = env.step(env.step(ToolEpisode(problem), "calc 34+64*46")[0], "#### 2978")[0]
    assert (ep.reward, ep.done, ep.turn) == (1.0, True, 2)
    direct = env.step(ToolEpisode(problem), "#### 2978")[0]
    assert (direct.reward, direct.calls) == (1.0, [])
    summary = env.summarize([ep, direct])
    assert summary == {"accuracy": 1.0, "call_rate": 0.5, "calls": 0.5, "call_errors": 0.0, "return": 1.0}
    assert len(env.observation(ep)) <= env.max_state_chars(len(problem.prompt))
    assert evaluate_call("2-9*3") == "-25" and evaluate_call("__import__('os')") == "error"


def test_the_warm_start_calls_the_problems_computations_then_answers():
    env = CalculatorEnv(TASK, max_calls=2, direct_fraction=0.5)
    problems = env.sft_problems("train", 300, 0)
    kinds = [p.meta["kind"] for p in problems]
    assert 0.4 < sum(not p.meta["calls_made"] and k == "answer" for p, k in zip(problems, kinds)) / 300 < 0.65
    for p in problems:
        assert env.sft_correct(p, p.target) and env.sft_well_formed(p, p.target)
        if p.meta["kind"] == "call":
            assert p.target == f"calc {p.meta['expression']}" and not p.meta["calls_made"]
        elif p.meta["calls_made"]:  # answered after the call: its state shows the result
            assert p.prompt.endswith(f"= {p.answer}\n") and p.target == f"#### {p.answer}"
    call = next(p for p in problems if p.meta["kind"] == "call")
    assert env.sft_correct(call, f"calc ({call.meta['expression']})+0")  # the same value counts
    assert not env.sft_correct(call, f"calc ({call.meta['expression']})+1")
    assert not env.sft_well_formed(call, "calc 1+") and env.sft_well_formed(call, "#### 5")


def test_gsm8k_annotations_become_the_warm_starts_calls(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"Ann has {i} boxes of 4 pens and loses 3. How many pens?",
             "answer": f"{i}*4=<<{i}*4={4 * i}>>{4 * i}\n{4 * i}-3=<<{4 * i}-3={4 * i - 3}>>{4 * i - 3}\n#### {4 * i - 3}"}
            for i in range(2, 40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task("gsm8k", path=str(path), test_fraction=0.2, validation_fraction=0.2)
    env = CalculatorEnv(task, max_calls=2, direct_fraction=0.0)
    problems = env.sft_problems("train", 60, 0)
    for p in problems:
        i = (int(p.answer) + 3) // 4
        assert p.meta["calls"] == [f"{i}*4", f"{4 * i}-3"]
        assert p.target in (f"calc {i}*4", f"calc {4 * i}-3", f"#### {4 * i - 3}")
    assert {len(p.meta["calls_made"]) for p in problems} == {0, 1, 2}


def test_guided_config_checks_for_the_calculator():
    def cfg(**kw):
        c = build_dataclass(GuidedConfig, dict(env="calculator", task_operators="+-*", **kw))
        c.validate()
        return c

    assert cfg(tool_max_calls=3).max_turns == 4 and cfg().on_task
    with pytest.raises(ConfigError, match="turn_loop: compiled needs an env with a JAX form"):
        cfg(turn_loop="compiled")
    with pytest.raises(ConfigError, match="tool_direct_fraction must be in"):
        cfg(tool_direct_fraction=1.5)
    with pytest.raises(ConfigError, match="'tool_max_calls' must be an integer >= 1"):
        cfg(tool_max_calls=0)
    with pytest.raises(ConfigError, match="replay_capacity=8 is smaller than one iteration's utterances"):
        cfg(replay_capacity=8, episodes_per_iteration=4, group_size=1)
