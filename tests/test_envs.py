"""Environment protocol, registry, adapters, and the vectorised reset schemes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs import Environment, list_envs, make, make_vec_env, reset_many
from jaxrl_hier.envs.builtin import techtree as tt
from jaxrl_hier.envs.spaces import Box, Discrete


# ---------------------------------------------------------------------------- a hand-checkable env
@struct.dataclass
class WorldState:
    world: jax.Array  # a random id drawn at reset: tells worlds apart
    t: jax.Array
    length: jax.Array


class Countdown(Environment):
    """Episodes of 1-3 steps (drawn at reset), reward 1 per step; odd-length ones truncate."""

    name = "Countdown"

    @property
    def default_params(self):
        return None

    def reset(self, key, params):
        k1, k2 = jax.random.split(key)
        s = WorldState(jax.random.randint(k1, (), 0, 2**30), jnp.int32(0), jax.random.randint(k2, (), 1, 4))
        return self._obs(s), s

    def _obs(self, s):
        return jnp.stack([s.world, s.t]).astype(jnp.int32)

    def step(self, key, s, action, params):
        s = s.replace(t=s.t + 1)
        end = s.t >= s.length
        truncated = end & (s.length % 2 == 1)
        return self._obs(s), s, jnp.float32(1.0), end & ~truncated, truncated, {"steps_left": s.length - s.t}

    def observation_space(self, params):
        return Box(0, 2**30, (2,), jnp.int32)

    def action_space(self, params):
        return Discrete(2)


def run_steps(vec, steps, seed=0):
    step = jax.jit(vec.step)
    obs, vstate = jax.jit(vec.reset)(jax.random.PRNGKey(seed))
    history = []
    key = jax.random.PRNGKey(seed + 1)
    for _ in range(steps):
        key, k = jax.random.split(key)
        prev_obs = obs
        obs, vstate, reward, term, trunc, info = step(k, vstate, jnp.zeros(vec.num_envs, jnp.int32))
        history.append(jax.tree.map(np.asarray, (prev_obs, obs, term, trunc, info)))
    return history


@pytest.mark.parametrize("mode, ratio, pool", [("auto", 16, 0), ("optimistic", 16, 0), ("optimistic", 4, 0),
                                              ("pool", 16, 0), ("pool", 4, 0), ("pool", 2, 64)])
def test_resets_are_fresh_distinct_and_never_continue(mode, ratio, pool):
    # 32 envs with 1-3 step episodes: many more envs finish per step than M = 32 // 16 = 2
    # (the overflow case) and, with ratio 4 (M = 8), sometimes fewer.
    vec = make_vec_env(Countdown(), None, 32, reset_mode=mode, reset_ratio=ratio, pool_size=pool)
    seen = set()
    history = run_steps(vec, 12)
    for prev_obs, obs, term, trunc, info in history:
        seen.update(prev_obs[:, 0].tolist())
        done = term | trunc
        assert done.any()
        # An env that finished starts a fresh episode at t = 0 in a world never seen before ...
        assert (obs[done, 1] == 0).all()
        new_worlds = obs[done, 0]
        assert len(set(new_worlds.tolist())) == len(new_worlds), "one world handed to two envs"
        assert not (set(new_worlds.tolist()) & seen), "a used world was handed out again"
        # ... and an env that did not finish continues its episode.
        np.testing.assert_array_equal(obs[~done, 0], prev_obs[~done, 0])
        np.testing.assert_array_equal(obs[~done, 1], prev_obs[~done, 1] + 1)
        # final_obs is the last obs of the finished episode.
        np.testing.assert_array_equal(info["final_obs"][done, 0], prev_obs[done, 0])
        # The env's own info comes through per env: a finished episode has no steps left.
        assert (info["env"]["steps_left"][done] == 0).all() and (info["env"]["steps_left"][~done] > 0).all()
        slots = info["reset_slot"][info["reset_slot"] >= 0]
        assert len(set(slots.tolist())) == len(slots)


def test_pool_serves_from_slots_and_caps_per_step():
    vec = make_vec_env(Countdown(), None, 32, reset_mode="pool", reset_ratio=4)
    assert vec.resets_per_step == 8 and vec.pool_capacity == 16
    history = run_steps(vec, 6)
    served = [(h[4]["reset_slot"] >= 0).sum() for h in history]
    done = [(h[2] | h[3]).sum() for h in history]
    assert all(s == min(d, 8) for s, d in zip(served, done))


def test_pool_serves_each_world_up_to_world_uses_episodes():
    vec = make_vec_env(Countdown(), None, 32, reset_mode="pool", reset_ratio=1, world_uses=3)
    served: dict[int, int] = {}
    for prev_obs, obs, term, trunc, info in run_steps(vec, 12):
        done = term | trunc
        assert (info["reset_slot"][done] >= 0).all()  # the pool serves every finished env: no full reset
        assert (obs[done, 1] == 0).all()
        new_worlds = obs[done, 0].tolist()
        assert len(set(new_worlds)) == len(new_worlds), "one world handed to two envs on one step"
        for world in new_worlds:
            served[world] = served.get(world, 0) + 1
    assert max(served.values()) == 3, "each world starts up to world_uses episodes, and some start all three"
    # a refill generates the pool's empty slots only: about a third of the worlds one use each would take
    assert len(served) <= sum(served.values()) / 3 + vec.pool_capacity
    with pytest.raises(ConfigError, match="world_uses must be 1, or more with reset_mode 'pool'"):
        make_vec_env(Countdown(), None, 32, reset_mode="optimistic", world_uses=2)


def test_episode_statistics_by_hand():
    vec = make_vec_env(Countdown(), None, 8, reset_mode="pool", reset_ratio=2)
    history = run_steps(vec, 10)
    running = np.zeros(8)
    for prev_obs, obs, term, trunc, info in history:
        running += 1
        done = term | trunc
        np.testing.assert_array_equal(info["returned_episode"], done)
        np.testing.assert_allclose(info["episode_return"][done], running[done])
        np.testing.assert_array_equal(info["episode_length"][done], running[done].astype(int))
        # Countdown truncates odd-length episodes and terminates even ones.
        np.testing.assert_array_equal(trunc[done], running[done] % 2 == 1)
        running[done] = 0


def test_no_reset_mode_keeps_stepping():
    vec = make_vec_env(Countdown(), None, 4, reset_mode="none")
    history = run_steps(vec, 5)
    assert (history[-1][1][:, 1] == 5).all()


def test_bad_reset_mode():
    with pytest.raises(ConfigError, match="unknown reset_mode 'fast'"):
        make_vec_env(Countdown(), None, 4, reset_mode="fast")


# ---------------------------------------------------------------------------- registry and built-ins
def test_registry_names_and_errors():
    names = list_envs()
    for n in ["Craftax-Symbolic-v1", "Craftax-Classic-Symbolic-v1", "Craftax-Pixels-v1",
              "Craftax-Classic-Pixels-v1", "CartPole-v1", "TechTree-v0", "gymnax:CartPole-v1"]:
        assert n in names
    with pytest.raises(ConfigError, match="unknown environment 'Craftax-Symbolc-v1'.*Did you mean 'Craftax-Symbolic-v1'"):
        make("Craftax-Symbolc-v1")
    with pytest.raises(ConfigError, match="unknown gymnax environment 'CartPol-v1'.*Did you mean 'CartPole-v1'"):
        make("gymnax:CartPol-v1")
    with pytest.raises(ConfigError, match="bad parameters for CartPole-v1"):
        make("CartPole-v1", no_such_field=1)


@pytest.mark.parametrize("name", ["CartPole-v1", "TechTree-v0", "gymnax:CartPole-v1"])
def test_protocol(name):
    env, params = make(name)
    obs, state = jax.jit(env.reset)(jax.random.PRNGKey(0), params)
    assert obs.shape == env.observation_space(params).shape
    action = env.action_space(params).sample(jax.random.PRNGKey(1))
    out = jax.jit(env.step)(jax.random.PRNGKey(2), state, action, params)
    assert len(out) == 6
    _, _, reward, terminated, truncated, info = out
    assert reward.dtype == jnp.float32 and terminated.dtype == bool and truncated.dtype == bool


@pytest.mark.parametrize("name", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_cartpole_time_limit_truncates(name):
    env, params = make(name)
    _, state = env.reset(jax.random.PRNGKey(0), params)
    state = state.replace(time=jnp.int32(499))  # one step before the 500-step limit, pole upright
    _, _, _, terminated, truncated, _ = env.step(jax.random.PRNGKey(0), state, 1, params)
    assert bool(truncated) and not bool(terminated)
    state = state.replace(time=jnp.int32(10), theta=jnp.float32(0.5))  # pole fallen: termination
    _, _, _, terminated, truncated, _ = env.step(jax.random.PRNGKey(0), state, 1, params)
    assert bool(terminated) and not bool(truncated)


def test_techtree_scripted_run_unlocks_the_whole_tree():
    env, params = make("TechTree-v0")
    grid = jnp.zeros((7, 7), jnp.int32)
    grid = grid.at[4, 3].set(tt.STONE).at[3, 2].set(tt.TREE).at[3, 4].set(tt.IRON)
    grid = grid.at[5, 3].set(tt.STONE).at[4, 4].set(tt.DIAMOND)
    state = tt.TechTreeState(jnp.array([3, 3], jnp.int32), grid, jnp.zeros(7, jnp.int32),
                             jnp.zeros(8, bool), jnp.int32(0))
    a = {name: i for i, name in enumerate(tt.ACTIONS)}
    script = (["do"] * 5 + ["place_table", "make_wood_pickaxe", "do", "make_stone_pickaxe", "do", "down", "do", "up",
                            "make_iron_pickaxe", "down", "do"])
    step = jax.jit(env.step)
    total = 0.0
    unlocked_order = []
    for name in script:
        before = np.asarray(state.achievements)
        _, state, reward, terminated, truncated, _ = step(jax.random.PRNGKey(0), state, a[name], params)
        total += float(reward)
        unlocked_order += [tt.ACHIEVEMENTS[i] for i in np.flatnonzero(np.asarray(state.achievements) & ~before)]
    assert unlocked_order == list(tt.ACHIEVEMENTS)
    assert total == len(tt.ACHIEVEMENTS)
    assert np.asarray(env.achievements(state)).all()
    # Mining needs the right tool: without pickaxes, `do` next to stone only gathers wood.
    bare = state.replace(inventory=jnp.zeros(7, jnp.int32), grid=grid, pos=jnp.array([3, 3], jnp.int32))
    _, after, *_ = step(jax.random.PRNGKey(0), bare, a["do"], params)
    assert after.inventory.tolist() == [1, 0, 0, 0, 0, 0, 0]


def test_techtree_time_limit_truncates():
    env, params = make("TechTree-v0")
    _, state = env.reset(jax.random.PRNGKey(0), params)
    state = state.replace(timestep=jnp.int32(params.max_steps - 1))
    _, _, _, terminated, truncated, _ = env.step(jax.random.PRNGKey(0), state, 0, params)
    assert bool(truncated) and not bool(terminated)


@pytest.mark.slow
def test_craftax_smoke_and_done_split():
    """One tiny Craftax-Classic program: pooled vec stepping, and the time limit as truncation."""
    env, params = make("Craftax-Classic-Symbolic-v1")
    assert len(env.achievement_names) == 22 and env.achievement_names[0] == "collect_wood"
    vec = make_vec_env(env, params, 4, reset_mode="pool", reset_ratio=4)
    obs, vstate = vec.reset(jax.random.PRNGKey(0))
    assert obs.shape == (4, 1345)

    def rollout(vstate, key):
        # Push env 0 to the time limit so that one episode ends inside this program.
        state = vstate.env_state.replace(timestep=vstate.env_state.timestep.at[0].set(params.max_timesteps - 1))
        out = vec.step(key, vstate.replace(env_state=state), jnp.zeros(4, jnp.int32))
        return out

    obs, vstate, reward, term, trunc, info = jax.jit(rollout)(vstate, jax.random.PRNGKey(1))
    assert bool(trunc[0]) and not bool(term[0])
    assert bool(info["returned_episode"][0]) and int(info["reset_slot"][0]) >= 0
    assert int(vstate.env_state.timestep[0]) == 0  # env 0 got a fresh world
    assert info["achievements"].shape == (4, 22)


@pytest.mark.slow
def test_craftax_classic_fresh_worlds_are_each_keys_own_world():
    """Every fresh Craftax-Classic world, from the batched reset the trainers and evaluations use and
    from a vec env's pool, is the world its key makes alone. A plain vmap of 24 resets on XLA:CPU
    gave world i + 8 the terrain of world i (jax 0.10.2)."""
    env, params = make("Craftax-Classic-Symbolic-v1")
    keys = jax.random.split(jax.random.PRNGKey(3), 24)
    alone = jax.jit(lambda k: env.reset(k, params)[1].map)
    expected = np.stack([np.asarray(alone(k)) for k in keys])
    assert len({m.tobytes() for m in expected}) == 24
    batched = jax.jit(lambda ks: reset_many(env, params, ks)[1].map)(keys)
    np.testing.assert_array_equal(np.asarray(batched), expected)
    # A vec env's pool is filled by the same function, from its own split of the key.
    vec = make_vec_env(env, params, 4, reset_mode="pool", pool_size=24, max_resets_per_step=4)
    _, vstate = jax.jit(vec.reset)(jax.random.PRNGKey(4))
    k_pool = jax.random.split(jax.random.PRNGKey(4))[1]
    pool = np.stack([np.asarray(alone(k)) for k in jax.random.split(k_pool, 24)])
    np.testing.assert_array_equal(np.asarray(vstate.pool_state.map), pool)


def test_techtree_egocentric_view_centres_the_player():
    env, params = make("TechTree-v0")
    grid = jnp.zeros((7, 7), jnp.int32).at[0, 0].set(tt.TREE).at[1, 0].set(tt.STONE)
    state = tt.TechTreeState(jnp.array([0, 0], jnp.int32), grid, jnp.zeros(7, jnp.int32), jnp.zeros(8, bool),
                             jnp.int32(0))
    obs = env._obs(state, params)
    assert obs.shape == env.observation_space(params).shape == (13 * 13 * 7 + 7,)
    view = obs[:-7].reshape(13, 13, 7).argmax(-1)
    assert view[6, 6] == tt.TREE and view[7, 6] == tt.STONE and view[6, 7] == tt.GRASS  # player at the centre
    assert view[5, 6] == len(tt.TILES) and view[6, 5] == len(tt.TILES)  # above and left: off the map
    flat, _ = make("TechTree-v0", egocentric=False)[0].reset(jax.random.key(0), make("TechTree-v0", egocentric=False)[1])
    assert flat.shape == (350,)
