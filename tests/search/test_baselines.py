"""The PGTS baselines against hand-computed answers: `majority_answer`, self-consistency and best-of-N
on hand-written solutions, UCT selection, backup and the completion leaf on a hand-made tree, and
`mcts` end to end on an env whose every generated step (score, final) is a hand-written table."""

import dataclasses
import math
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.search.baselines import (backup, best_of_n, majority_answer, mcts, most_visited_leaf, select_path,
                                         self_consistency, uct_score)
from jaxrl_hier.search.env import SearchEnv
from jaxrl_hier.tasks.arithmetic import ArithmeticTask
from jaxrl_hier.tasks.base import Problem


# ----------------------------------------------------------------------------- voting and best-of-N


def test_majority_answer_counts_canonical_answers_and_breaks_ties_by_first_seen():
    assert majority_answer(["#### 3", "#### 5", "1+4=5\n#### 5"]) == "5"
    # 7 and 4 have two votes each: the one seen first wins, whichever it is
    assert majority_answer(["#### 7", "#### 4", "#### 4", "#### 7"]) == "7"
    assert majority_answer(["#### 4", "#### 7", "#### 7", "#### 4"]) == "4"
    # votes are counted on canonical numbers: 05, 5.0 and 5 are one answer (3 votes against 2)
    assert majority_answer(["#### 2", "#### 05", "#### 2", "#### 5.0", "#### 5"]) == "5"
    # texts without a well-formed answer line do not vote: no "####", or no number after it
    assert majority_answer(["5", "#### x", "#### -2", "#### ?"]) == "-2"
    assert majority_answer(["5", "#### x"]) is None
    assert majority_answer([]) is None


TASK = ArithmeticTask(operators="+-", digits=1, steps=1)
PROBLEMS = [Problem("1+2=", "3", "#### 3"), Problem("5-1=", "4", "#### 4")]
# two problems, 4 sampled solutions each, their token counts and reward-model scores
TEXTS = [["1+2=3\n#### 3", "#### 4", "#### 4", "1+2=3"],
         ["5-1=", "#### 4", "#### x", "#### 5"]]
LENGTHS = np.array([[5, 7, 2, 9], [4, 6, 8, 1]])
SCORES = np.array([[0.1, 0.9, 0.5, 0.95], [0.2, 0.7, 0.1, 0.9]])


@pytest.mark.parametrize("n, accuracy, tokens", [
    # n=1: problem 0 votes 3 (right); problem 1 has no answer (wrong). Tokens (5 + 4) / 2
    (1, 0.5, 4.5),
    # n=2: 3 and 4 tie, 3 seen first (right); problem 1: 4 alone (right). Tokens (5+7 + 4+6) / 2
    (2, 1.0, 11.0),
    # n=4: 4 beats 3 two to one (wrong); problem 1: 4 and 5 tie, 4 first ("#### x" has no vote; right).
    # Tokens (5+7+2+9 + 4+6+8+1) / 2
    (4, 0.5, 21.0),
])
def test_self_consistency_votes_over_the_first_n(n, accuracy, tokens):
    row = self_consistency(TASK, PROBLEMS, TEXTS, LENGTHS, n)
    assert row == {"method": f"self-consistency@{n}", "accuracy": accuracy, "tokens": tokens, "problems": 2, "n": n}


@pytest.mark.parametrize("n, accuracy", [
    # n=1: "#### 3" (right); "5-1=" has no answer (wrong)
    (1, 0.5),
    # n=2: scores 0.1 < 0.9 pick "#### 4" (wrong); 0.2 < 0.7 pick "#### 4" (right)
    (2, 0.5),
    # n=4: 0.95 picks "1+2=3", no answer line (wrong); 0.9 picks "#### 5" (wrong)
    (4, 0.0),
])
def test_best_of_n_takes_the_highest_scored_of_the_first_n(n, accuracy):
    row = best_of_n(TASK, PROBLEMS, TEXTS, LENGTHS, SCORES, n)
    tokens = LENGTHS[:, :n].sum() / 2  # every sampled solution counts, not only the picked one
    assert row == {"method": f"best-of-{n} (RM)", "accuracy": accuracy, "tokens": tokens, "problems": 2, "n": n}


# ----------------------------------------------------------------------------- UCT on a hand-made tree

#        0            visits [10, 6, 3, 4, 1, 2]
#      /   \          value  [5, 3.6, 1.5, 2.0, 0.9, 1.0]
#     1     2         (max_children 2: nodes 0 and 1 are fully expanded, node 2 is not)
#    / \    |
#   3   4   5
TREE = SimpleNamespace(parent=np.array([-1, 0, 0, 1, 1, 2]), depth=np.array([0, 1, 1, 2, 2, 2]),
                       final=np.zeros(6, bool), children=np.array([2, 2, 1, 0, 0, 0]), num_nodes=6)
VISITS = np.array([10.0, 6, 3, 4, 1, 2])
VALUE = np.array([5.0, 3.6, 1.5, 2.0, 0.9, 1.0])


def test_uct_score_is_mean_value_plus_exploration():
    # node 1 under the root: 3.6 / 6 + sqrt(ln 10 / 6) = 0.6 + 0.619487 = 1.219487
    assert uct_score(3.6, 6, 10, 1.0) == pytest.approx(1.219487, abs=1e-6)
    # node 2: 1.5 / 3 + sqrt(ln 10 / 3) = 0.5 + 0.876087 = 1.376087; with c = 0.5: 0.5 + 0.438044
    assert uct_score(1.5, 3, 10, 1.0) == pytest.approx(1.376087, abs=1e-6)
    assert uct_score(1.5, 3, 10, 0.5) == pytest.approx(0.938044, abs=1e-6)
    # a parent visited once: ln 1 = 0, no exploration term
    assert uct_score(0.7, 1, 1, 1.0) == pytest.approx(0.7)


def test_selection_descends_by_uct_while_nodes_are_full():
    kw = {"max_depth": 3, "max_children": 2}
    # c = 1: node 2 (1.376) beats node 1 (1.219), and has room for a child: the path stops there
    assert select_path(TREE, VISITS, VALUE, c=1.0, **kw) == [0, 2]
    # c = 0 (mean value only): node 1 (0.6 > 0.5) is full, so on to node 4 (0.9 > 0.5), a leaf with room
    assert select_path(TREE, VISITS, VALUE, c=0.0, **kw) == [0, 1, 4]
    # c = 0.2: root: node 1 0.6 + 0.2 * 0.619 = 0.724 > node 2 0.5 + 0.2 * 0.876 = 0.675; under node 1
    # (N 6): node 3 0.5 + 0.2 sqrt(ln 6 / 4) = 0.634 < node 4 0.9 + 0.2 sqrt(ln 6) = 1.168
    assert select_path(TREE, VISITS, VALUE, c=0.2, **kw) == [0, 1, 4]
    # a final node or one at max_depth is a leaf, full or not
    final_1 = SimpleNamespace(**{**vars(TREE), "final": np.array([0, 1, 0, 0, 0, 0], bool)})
    assert select_path(final_1, VISITS, VALUE, c=0.0, **kw) == [0, 1]
    assert select_path(TREE, VISITS, VALUE, c=0.0, max_depth=1, max_children=2) == [0, 1]
    # equal scores: the oldest child
    assert select_path(TREE, np.array([4.0, 2, 2, 1, 1, 1]), np.ones(6), c=1.0, **kw) == [0, 1, 3]


def test_backup_adds_a_visit_and_the_value_along_the_path():
    visits, value = np.zeros(6), np.zeros(6)
    backup(visits, value, [0, 1, 4], 0.7)
    backup(visits, value, [0, 2], 0.2)
    backup(visits, value, [0, 1, 4], 0.5)
    np.testing.assert_array_equal(visits, [3, 2, 1, 0, 2, 0])
    np.testing.assert_allclose(value, [1.4, 1.2, 0.2, 0.0, 1.2, 0.0])


def test_completion_leaf_follows_the_most_visited_children():
    # root: node 1 (6 visits) over node 2 (3); under node 1: node 3 (4) over node 4 (1)
    assert most_visited_leaf(TREE, VISITS, VALUE) == 3
    # equal visits: the higher summed value (node 2: 4.0 > 3.6), then its only child
    assert most_visited_leaf(TREE, np.array([10.0, 6, 6, 4, 1, 2]), np.array([5.0, 3.6, 4.0, 2, 0.9, 1])) == 5


# ----------------------------------------------------------------------------- MCTS end to end


@dataclasses.dataclass(frozen=True, eq=False)
class TableEnv(SearchEnv):
    """A search env whose steps are written by hand: the k-th child generated under node i of
    problem p scores `params["score"][p, i, k]` and is final where `params["final"][p, i, k]`; every
    step is 2 tokens; the answer at node i of problem p is right where `params["right"][p, i]`."""

    def generate_child(self, key, state, parent, params):
        new, at = state.num_nodes, (state.problem, parent, state.children[parent])
        return state.replace(parent=state.parent.at[new].set(parent),
                             depth=state.depth.at[new].set(state.depth[parent] + 1),
                             children=state.children.at[parent].add(1),
                             score=state.score.at[new].set(params["score"][at]),
                             final=state.final.at[new].set(params["final"][at]), num_nodes=new + 1, current=new,
                             tokens_used=state.tokens_used + 2)

    def is_correct(self, state, node, params):
        return params["right"][state.problem, node]


def table_params(n):
    score, final, right = np.zeros((2, n, 2), np.float32), np.zeros((2, n, 2), bool), np.zeros((2, n), bool)
    # problem 0: root -> 1 (0.6), 2 (0.2); node 1 -> 3 (0.9, final), 4 (0.95, final); node 4 is right
    score[0, 0], score[0, 1], final[0, 1] = (0.6, 0.2), (0.9, 0.95), True
    right[0, 4] = True
    # problem 1: no final node within the simulations. root -> 1 (0.4), 2 (0.5); node 2 -> 3 (0.1), 6 (0.3);
    # node 1 -> 4 (0.7), 5 (0.2); then the completion: node 4 -> 7 (0.8), node 7 -> 8 (0.6, final).
    # Node 8 is wrong; node 4 (where an answer read without completing would come from) is "right".
    score[1, 0], score[1, 2], score[1, 1] = (0.4, 0.5), (0.1, 0.3), (0.7, 0.2)
    score[1, 4, 0], score[1, 7, 0], final[1, 7, 0] = 0.8, 0.6, True
    right[1, 4] = True
    return {"score": jnp.asarray(score), "final": jnp.asarray(final), "right": jnp.asarray(right)}


def test_mcts_on_a_hand_written_tree():
    """Six simulations at c = 1 (max_children 2, max_depth 4), traced by hand. N: visits, W: summed value.

    Problem 0. Sims 0, 1: the root has room: nodes 1 (0.6) and 2 (0.2). Sim 2: root full (N 2);
    node 1: 0.6 + sqrt(ln 2) = 1.433 > node 2: 0.2 + 0.833: node 1 gets node 3 (0.9, final). Sim 3:
    N0 3; node 1 (N 2, W 1.5): 0.75 + sqrt(ln 3 / 2) = 1.491 > node 2: 0.2 + 1.048: node 4 (0.95,
    final). Sim 4: N0 4; node 1 (N 3, W 2.45): 0.817 + 0.680 = 1.497 > 0.2 + 1.177; node 1 is full:
    node 3: 0.9 + sqrt(ln 3) = 1.948 < node 4: 0.95 + 1.048 = 1.998; node 4 is final: re-valued 0.95,
    no new node. Sim 5: N0 5; node 1 (N 4, W 3.4): 0.85 + 0.634 = 1.484 > node 2: 0.2 + 1.269 = 1.469;
    under node 1 (N 4): node 3 (N 1): 0.9 + 1.177 = 2.077 > node 4 (N 2, W 1.9): 0.95 + 0.833:
    node 3 is final, re-valued. 5 nodes, 8 tokens; finals 3 (0.9) and 4 (0.95): the answer is node 4.

    Problem 1. Sims 0, 1: nodes 1 (0.4), 2 (0.5). Sim 2: node 2: 0.5 + 0.833 > node 1: 0.4 + 0.833:
    node 3 (0.1) under node 2. Sim 3: N0 3; node 1: 0.4 + 1.048 = 1.448 > node 2 (N 2, W 0.6): 0.3 +
    0.741: node 4 (0.7) under node 1. Sim 4: N0 4; node 1 (N 2, W 1.1): 0.55 + 0.833 = 1.383 > node 2:
    0.3 + 0.833: node 5 (0.2) under node 1. Sim 5: N0 5; node 1 (N 3, W 1.3): 0.433 + 0.733 = 1.166
    < node 2 (N 2, W 0.6): 0.3 + 0.897 = 1.197 (exploration: the lower mean wins): node 6 (0.3) under
    node 2. No final node: nodes 1 and 2 both have N 3, node 1 the higher W (1.3 > 0.9); under it
    node 4 (N 1, W 0.7) over node 5 (N 1, W 0.2); node 4 is a leaf: completed by node 7 (depth 3, not
    final), then node 8 (final). 9 nodes, 16 tokens; node 8 is wrong.
    """
    n = 6 + 1 + 4  # simulations + 1 + max_depth
    env = TableEnv(lm=SimpleNamespace(config=SimpleNamespace(hidden_size=1)), score_fn=None, prompt_length=1,
                   max_nodes=n, max_depth=4, max_children=2, token_budget=10**9)
    states, row = mcts(env, table_params(n), 2, simulations=6, c=1.0, seed=0)
    assert row == {"method": "MCTS (6 simulations)", "accuracy": 0.5, "tokens": (8 + 16) / 2, "problems": 2,
                   "simulations": 6}
    np.testing.assert_array_equal(states.num_nodes, [5, 9])
    np.testing.assert_array_equal(states.parent[0, :5], [-1, 0, 0, 1, 1])
    np.testing.assert_array_equal(states.parent[1, :9], [-1, 0, 0, 2, 1, 1, 2, 4, 7])
    np.testing.assert_array_equal(states.current, [4, 8])
    np.testing.assert_array_equal(states.correct, [True, False])
    np.testing.assert_array_equal(states.tokens_used, [8, 16])
    assert math.isclose(float(states.score[1, 8]), 0.6, rel_tol=1e-6)
