"""Turn-based text environments: the two-turn answer/hint/answer episode and guess-the-number."""

import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks import ArithmeticTask
from jaxrl_hier.tasks.base import Problem
from jaxrl_hier.tasks.text_games import (ACTOR, GUIDANCE, GuessNumberEnv, TwoTurnEnv, optimal_guess_turns,
                                         rule_hint)


@pytest.fixture(scope="module")
def two_turn():
    return TwoTurnEnv(ArithmeticTask(operators="+-", digits=1, steps=2))


def test_two_turn_episode_states_rewards_and_speakers(two_turn):
    env = two_turn
    assert [env.speaker(t) for t in range(env.max_turns)] == [ACTOR, GUIDANCE, ACTOR]
    ep = env.reset("train", 1, 0)[0]
    p = ep.problem
    assert env.observation(ep) == p.prompt
    ep, r, done = env.step(ep, "#### 99")
    assert (r, done) == (0.0, False) and env.observation(ep) == p.prompt + "99:"
    ep, r, done = env.step(ep, "lower\nx")
    assert (r, done) == (0.0, False) and env.observation(ep) == p.prompt + "99:lower x\n"
    ep, r, done = env.step(ep, f"#### {p.answer}")
    assert (r, done, ep.done) == (1.0, True, True)
    summary = env.summarize([ep])
    assert summary["turn1_accuracy"] == 0.0 and summary["turn2_accuracy"] == 1.0 and summary["accuracy_gain"] == 1.0
    # an answer too long (or absent) enters the state as "?": the state length stays bounded
    ep2 = env.step(env.reset("train", 1, 1)[0], "#### 1234567")[0]
    assert env.observation(ep2).endswith("=?:")
    assert len(env.observation(ep)) <= env.max_state_chars(len(p.prompt), len("lower x"))


def test_shaped_rewards_give_each_later_turn_what_it_added():
    """shaped: turn 1 earns its own correctness, the last turn the change; the episode's return (the
    sum, and ep.reward) is turn 2's correctness either way."""
    import dataclasses

    import numpy as np

    from jaxrl_hier.llm_rl.guided import returns_to_go

    env = dataclasses.replace(TwoTurnEnv(ArithmeticTask(operators="+-", digits=1, steps=2)), shaped=True)
    answer = env.reset("train", 1, 0)[0].problem.answer
    wrong = str(int(answer) + 1)
    for first, second in ((answer, answer), (answer, wrong), (wrong, answer), (wrong, wrong)):
        ep = env.reset("train", 1, 0)[0]
        rewards = []
        for utterance in (f"#### {first}", "right", f"#### {second}"):
            ep, r, _ = env.step(ep, utterance)
            rewards.append(r)
        c1, c2 = float(first == answer), float(second == answer)
        assert rewards == [c1, 0.0, c2 - c1] and sum(rewards) == ep.reward == c2
        turns = [{"reward": np.array([r], np.float32), "done": np.array([d], np.float32),
                  "valid": np.ones(1, np.float32)} for r, d in zip(rewards, (0.0, 0.0, 1.0))]
        assert [float(g[0]) for g in returns_to_go(turns, 1.0)] == [c2, c2 - c1, c2 - c1]


def test_rule_hints(two_turn):
    p = two_turn.task.make_problem([5, 3, 1], ["+", "-"])  # 5+3-1 = 7
    assert rule_hint(two_turn.task, p, "#### 9") == "lower"
    assert rule_hint(two_turn.task, p, "#### -2") == "higher"
    assert rule_hint(two_turn.task, p, "#### 7") == "right"
    assert rule_hint(two_turn.task, p, "seven") == "none"


def test_step_hints_give_the_first_worked_step_unless_right():
    env = TwoTurnEnv(ArithmeticTask(operators="+-*", digits=1, steps=2), hint_kind="step")
    p = env.task.make_problem([5, 3, 2], ["+", "*"])  # 5+3*2 = 11: the multiplication goes first
    assert env.rule_hint(p, "#### 16") == "5+6" and env.rule_hint(p, "eleven") == "5+6"
    q = env.task.make_problem([2, 8, 2], ["-", "+"])
    assert env.rule_hint(q, "#### 3") == "-6+2"
    assert env.rule_hint(p, "#### 11") == "right"
    hints = [q for q in env.sft_problems("train", 60, 3) if q.meta.get("kind") == "hint"]
    assert {q.target for q in hints} - {"right"}  # some worked steps among the targets
    for q in hints:
        assert env.sft_well_formed(q, q.target) and env.sft_well_formed(q, "8-4=4")
        assert not env.sft_well_formed(q, "#### 3") and not env.sft_well_formed(q, "")
    with pytest.raises(ConfigError, match="hint_kind must be one of"):
        TwoTurnEnv(env.task, hint_kind="digits")


def test_reduce_hints_work_the_problem_down_to_its_last_operation_whatever_turn_1_said():
    env = TwoTurnEnv(ArithmeticTask(operators="+-*", digits=1, steps=3), hint_kind="reduce")
    p = env.task.make_problem([9, 2, 1, 3], ["-", "+", "-"])  # 9-2+1-3 = 5
    assert {env.rule_hint(p, t) for t in ("#### 5", "#### 4", "five")} == {"7+1-3 8-3"}
    q = env.task.make_problem([2, 3, 4, 5], ["+", "*", "-"])  # multiplication first: 2+12-5, then 14-5
    assert env.rule_hint(q, "#### 9") == "2+12-5 14-5"
    one = TwoTurnEnv(ArithmeticTask(operators="+", digits=1, steps=1), hint_kind="reduce")
    assert one.rule_hint(one.task.make_problem([4, 5], ["+"]), "#### 1") == "4+5"  # nothing to work out
    hints = [h for h in env.sft_problems("train", 60, 3) if h.meta.get("kind") == "hint"]
    assert hints and all(h.target == h.meta["reductions"] and env.sft_well_formed(h, h.target) for h in hints)
    turn2 = [h for h in env.sft_problems("train", 60, 3) if h.meta.get("kind") == "turn2"]
    assert all(h.prompt.endswith(":" + h.meta["reductions"] + "\n") for h in turn2)
    with pytest.raises(ConfigError, match="hint_kind: reduce needs the arithmetic task"):
        rule_hint(env.task, Problem("2+2=", "4", "#### 4", {}), "#### 4", "reduce")


def test_two_turn_warm_start_examples(two_turn):
    probs = two_turn.sft_problems("train", 60, 3)
    kinds = [p.meta.get("kind", "turn1") for p in probs]
    assert kinds.count("turn1") == kinds.count("hint") == kinds.count("turn2") == 20
    wrong = 0
    for p in probs:
        if p.meta.get("kind") == "hint":
            assert p.target in ("lower", "higher", "right")
            assert two_turn.sft_correct(p, p.target) and not two_turn.sft_correct(p, "none")
            assert two_turn.sft_well_formed(p, "none") and not two_turn.sft_well_formed(p, "#### 3")
            wrong += p.target != "right"
        else:  # the target answers the problem, whatever the hint said
            assert two_turn.sft_correct(p, p.target)
    assert 3 <= wrong <= 17  # wrong_fraction 0.5 of 20
    assert probs == two_turn.sft_problems("train", 60, 3)  # deterministic


def test_guess_number_oracle_rewards_and_limit():
    env = GuessNumberEnv(high=16, max_turns=3)
    ep = env.reset("train", 1, 0)[0]
    s = ep.secret
    low = "1" if s != 1 else "2"
    ep, r, done = env.step(ep, low)
    if s == 1:
        assert env.observation(ep) == "guess 1-16:\n2 lower\n"
    else:
        assert env.observation(ep) == "guess 1-16:\n1 higher\n"
    assert (r, done) == (-1.0, False)
    ep, r, done = env.step(ep, "x")
    assert (r, done) == (-1.0, False) and env.observation(ep).endswith("? bad\n")
    ep, r, done = env.step(ep, str(s))
    assert (r, done, ep.success, ep.ret, ep.turn) == (0.0, True, True, -2.0, 3)
    # a miss on the last turn ends the episode unsolved
    ep = env.reset("train", 1, 0)[0]
    for _ in range(3):
        ep, r, done = env.step(ep, "17")
    assert done and not ep.success and ep.ret == -3.0
    assert len(env.observation(ep).splitlines()) == 4 and env.max_state_chars() >= len("guess 1-16:\n" + "16 higher\n" * 2)
    assert env.summarize([ep])["turns_to_success"] == 3.0


def test_guess_number_warm_start_guesses_are_consistent():
    env = GuessNumberEnv(high=16, max_turns=5)
    probs = env.sft_problems("train", 50, 0)
    for p in probs:
        assert env.sft_correct(p, p.target)
        assert len(p.prompt) <= env.max_state_chars()
    assert not env.sft_correct(probs[0], "0") and not env.sft_well_formed(probs[0], "0")
    assert env.sft_well_formed(probs[0], "16") and not env.sft_well_formed(probs[0], "17")
    # bisection: 1 secret in 1 turn, 2 in 2, 4 in 3, 8 in 4, the last one in 5
    assert optimal_guess_turns(15) == pytest.approx(49 / 15) and optimal_guess_turns(16) == pytest.approx(54 / 16)


def test_guess_number_bad_options():
    with pytest.raises(ConfigError, match="high"):
        GuessNumberEnv(high=1)
    with pytest.raises(ConfigError, match="max_turns"):
        GuessNumberEnv(max_turns=0)


def test_guess_number_evaluation_plays_every_secret_once():
    """The evaluation games: distinct secrets in the order the split's draw meets them, every secret
    of 1..high once when as many are asked (greedy play's mean over the uniform prior)."""
    env = GuessNumberEnv(high=16)
    stream = [ep.secret for ep in env.reset("test", 64, 0)]
    assert len(set(stream)) < 64  # the old evaluation's draw: secrets repeat
    assert [ep.secret for ep in env.evaluation_episodes("test", 5, 0)] == list(dict.fromkeys(stream))[:5]
    every = [ep.secret for ep in env.evaluation_episodes("test", 256, 0)]
    assert sorted(every) == list(range(1, 17))
    # no secret is held out: training draws from the same range (the split is a seed stream, documented)
    assert set(ep.secret for ep in env.reset("train", 256, 0)) == set(every)


def test_two_turn_evaluation_episodes_are_distinct_problems(two_turn):
    episodes = two_turn.evaluation_episodes("test", 512, 0)
    prompts = [ep.problem.prompt for ep in episodes]
    assert len(set(prompts)) == len(prompts) == 403  # the whole test split of 1-digit a+b-c problems, once each
    assert all(ep.turn == 0 and not ep.done for ep in episodes)
