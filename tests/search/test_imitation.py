"""Imitation warm-start of the PGTS policy: the demonstration collector records exactly the rule's
searches (replayed by hand, observations included) in one tree per search rather than one
observation per action, and behaviour cloning fits a GPS policy that then searches as the rule
does. A tiny random generator with greedy first children and swap siblings makes every step
key-independent, so the replay needs no keys."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.networks import GPSActorCritic
from jaxrl_hier.search.baselines import make_runner, make_search_runner
from jaxrl_hier.search.imitation import behaviour_cloning, demo_observation, make_demo_collector, threshold_rule

from tests.search import test_env

N, setup = test_env.N, test_env.setup  # the env fixture, a module-level name so pytest finds it

RULE = (jnp.float32(0.15), jnp.int32(1))  # length_score is tokens / 100: the first steps score below 0.15
STEPS = N + 2  # more actions than a search can take: the rows after its end are invalid


@pytest.fixture(scope="module")
def demos(setup):
    _, env, params, _ = setup
    env = dataclasses.replace(env, greedy_first_child=True, sibling="swap")
    collect = make_demo_collector(env, threshold_rule(env), STEPS)
    return env, params, jax.device_get(collect(RULE, params, jnp.arange(2), jax.random.key(0)))


def test_demonstrations_are_the_rules_searches(demos):
    env, params, d = demos
    act = threshold_rule(env)
    step = jax.jit(env.step)
    assert d.action.shape == d.valid.shape == d.returns.shape == (2, STEPS)
    for p in range(2):
        obs, state = env.reset_to(p)
        rewards, actions = [], []
        tree = jax.tree.map(lambda x: x[p], d.tree)
        while not bool(state.done):
            # the observation, rebuilt from the final tree and the three numbers kept for the action
            t = len(actions)
            rebuilt = demo_observation(env, tree, d.num_nodes[p, t], d.current[p, t], d.tokens_used[p, t])
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), rebuilt, obs)
            actions.append(int(act(RULE, obs, state, None)))
            obs, state, reward, *_ = step(jax.random.key(99), state, actions[-1], params)
            rewards.append(float(reward))
        n = len(actions)
        np.testing.assert_array_equal(d.valid[p], np.arange(STEPS) < n)
        np.testing.assert_array_equal(d.action[p, :n], actions)
        np.testing.assert_allclose(d.returns[p, :n], np.cumsum(rewards[::-1])[::-1], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(d.returns[p, n:], 0.0)
        assert bool(d.correct[p]) == bool(state.correct) and int(d.tokens[p]) == int(state.tokens_used)
        np.testing.assert_array_equal(tree.parent, state.parent)
    # the rule branched where the score was low, and the searches hold more than one path
    assert (d.action[d.valid] == 1).any() and (d.action[d.valid] == 0).any()


@pytest.fixture(scope="module")
def policy(demos):
    """A GPS policy and its initial params, shared by the tests (one init program, compiled once:
    run op by op, flax's init compiles each of its hundred-odd ops on its own)."""
    env, _, _ = demos
    net = GPSActorCritic(env.num_actions, hidden_size=32, num_layers=1, prior=2.0)
    return net, jax.jit(net.init)(jax.random.key(1), env.reset_to(0)[0])["params"]


def test_behaviour_cloning_makes_a_policy_that_searches_like_the_rule(demos, policy):
    env, params, d = demos
    net, init = policy
    cloned, history = behaviour_cloning(env, net, init, d, steps=150, batch_size=16, learning_rate=3e-3, seed=0)
    assert history[-1]["accuracy"] == 1.0 and history[-1]["nll"] < 0.1 * history[0]["nll"]
    assert history[-1]["value_loss"] < history[0]["value_loss"]
    rule_states, _ = make_runner(env, threshold_rule(env), STEPS)(RULE, params, jnp.arange(2), jax.random.key(0))
    search = make_search_runner(env, net, STEPS)  # one program for the untrained and the cloned params
    untrained, _ = search({"params": init}, params, jnp.arange(2), jax.random.key(0))
    states, _ = search({"params": cloned}, params, jnp.arange(2), jax.random.key(0))
    for name in ("num_nodes", "tokens_used", "current", "parent"):
        np.testing.assert_array_equal(np.asarray(getattr(states, name)), np.asarray(getattr(rule_states, name)))
    # the prior alone (Expand until the end) searches differently: the clone learned the branches
    assert not np.array_equal(np.asarray(untrained.parent), np.asarray(rule_states.parent))


def test_behaviour_cloning_refuses_demonstrations_it_cannot_learn(demos, policy):
    env, _, d = demos
    net, init = policy
    with pytest.raises(ValueError, match="no valid action"):
        behaviour_cloning(env, net, init, d._replace(valid=np.zeros_like(d.valid)), steps=1, batch_size=4,
                          learning_rate=1e-3)
    # Terminate at the root (before any step) is masked: a demonstration of it cannot be learned
    bad = d.action.copy()
    bad[0, 0] = env.terminate_action
    with pytest.raises(ValueError, match="1 demonstrated actions are masked"):
        behaviour_cloning(env, net, init, d._replace(action=bad), steps=1, batch_size=4, learning_rate=1e-3)


def test_demonstrations_hold_one_tree_per_search_not_one_observation_per_action(demos):
    """Memory: a search's demonstration is its final tree and a few numbers per action. Storing each
    action's observation (every node's hidden state) cost T x max_nodes x hidden floats a search:
    [512, 73, 12, 128] floats, 245 MB at the defaults, then copied by behaviour cloning."""
    env, _, d = demos
    obs, one_tree = env.reset_to(0)
    for leaf, ref in zip(jax.tree.leaves(d.tree), jax.tree.leaves(one_tree)):
        assert leaf.shape == (2,) + ref.shape
    for name in ("num_nodes", "current", "tokens_used", "action", "valid", "returns"):
        assert getattr(d, name).shape == (2, STEPS)  # one number per action
    nbytes = lambda tree: sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    # per search: the tree and 21 bytes an action (4 int32, a bool, a float32), against T observations
    assert nbytes(d) / 2 == nbytes(one_tree) + 21 * STEPS < 0.5 * STEPS * nbytes(obs)
