"""Skills as data: conditions, libraries as DAGs, YAML, the skill env's reward and expert gating,
and the mixture of experts (gather == mask, frozen experts take no gradient)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.envs import make
from jaxrl_hier.envs.builtin import techtree as tt
from jaxrl_hier.skills import Condition, Skill, SkillError, SkillLibrary, load_skills_yaml
from jaxrl_hier.skills.env import SkillEnv, conditions_hold
from jaxrl_hier.skills.generators import make_validator
from jaxrl_hier.skills.library import builtin_library, techtree_library
from jaxrl_hier.skills.moe import (MoEPolicy, init_mlp, mixture_apply_active, mixture_apply_gather, mixture_apply_mask, mlp_apply,
                                   sort_into_blocks, stack_experts)
from jaxrl_hier.skills.trainer import quantities_for


def test_condition_parsing_and_errors():
    c = Condition.parse("inventory.wood >= 3")
    assert (c.quantity, c.op, c.value, str(c)) == ("inventory.wood", ">=", 3.0, "inventory.wood >= 3")
    assert Condition.parse(" floor==1.5").value == 1.5
    with pytest.raises(SkillError, match="not '<quantity> <op> <number>'"):
        Condition.parse("inventory.wood => 3")
    with pytest.raises(SkillError, match="snake_case"):
        Skill("Collect Wood", success=(c,))
    with pytest.raises(SkillError, match="no success condition"):
        Skill("x")


def test_library_dag_checks_and_closure():
    lib = techtree_library()
    assert lib.closure("collect_stone") == ("collect_wood", "place_table", "make_wood_pickaxe")
    order = lib.topological_order()
    for s in lib.skills:
        assert all(order.index(d) < order.index(s.name) for d in s.requires)
    ok = (Condition.parse("inventory.wood >= 1"),)
    with pytest.raises(SkillError, match="cycle: a -> b -> a"):
        SkillLibrary((Skill("a", ("b",), ok), Skill("b", ("a",), ok)))
    with pytest.raises(SkillError, match="unknown skill 'colect_wood'.*Did you mean 'collect_wood'"):
        lib.add(Skill("axe", ("colect_wood",), ok))
    with pytest.raises(SkillError, match="defined twice"):
        lib.add(Skill("collect_wood", (), ok))


def test_builtin_libraries_use_only_quantities_their_envs_have():
    for lib_name, env_name in [("techtree", "TechTree-v0"), ("craftax_classic", "Craftax-Classic-Symbolic-v1"),
                               ("craftax", "Craftax-Symbolic-v1")]:
        env, _ = make(env_name)
        builtin_library(lib_name).check_quantities(quantities_for(env, SkillLibrary()))
    classic = builtin_library("craftax_classic")
    assert set(classic.closure("collect_diamond")) >= {"make_iron_pickaxe", "place_furnace", "collect_coal"}
    assert len(classic) == 22


def test_yaml_skills_and_unknown_quantity(tmp_path):
    path = tmp_path / "skills.yaml"
    path.write_text("skills:\n- name: wood\n  success: [inventory.wood >= 1]\n"
                    "- name: two_wood\n  requires: [wood]\n  success: ['inventory.wood >= 2']\n")
    lib = load_skills_yaml(path)
    assert lib.names == ("wood", "two_wood") and lib["two_wood"].requires == ("wood",)
    env, _ = make("TechTree-v0")
    q = quantities_for(env, lib)
    lib.check_quantities(q)
    path.write_text("- name: gold\n  success: [inventory.gold >= 1]\n")
    with pytest.raises(SkillError, match="unknown quantity 'inventory.gold'.*Known quantities"):
        load_skills_yaml(path).check_quantities(q)
    path.write_text("- name: x\n  succes: [inventory.wood >= 1]\n")
    with pytest.raises(SkillError, match="unknown skill key 'succes'.*Did you mean 'success'"):
        load_skills_yaml(path)
    with pytest.raises(SkillError, match="not found"):
        load_skills_yaml(tmp_path / "missing.yaml")


def test_validator_rejects_unknown_names_cycles_and_duplicates():
    env, _ = make("TechTree-v0")
    lib = techtree_library().subset(["collect_wood", "place_table"])
    validate = make_validator(lib, techtree_library(), tuple(quantities_for(env, lib)), max_experts=4, max_conditions=2)
    skill = validate({"name": "two_wood", "requires": ["collect_wood"], "success": ["inventory.wood >= 2"]})
    assert skill.requires == ("collect_wood",)
    for bad, reason in [({"name": "x", "requires": ["nope"], "success": ["inventory.wood >= 1"]}, "unknown skill"),
                        ({"name": "x", "success": ["inventory.gold >= 1"]}, "unknown quantity"),
                        ({"name": "collect_wood", "success": ["inventory.wood >= 1"]}, "already exists"),
                        ({"name": "x", "requires": ["x"], "success": ["inventory.wood >= 1"]}, "requires itself"),
                        ({"name": "x", "success": ["inventory.wood >= 1", "inventory.stone >= 1",
                                                   "inventory.iron >= 1"]}, "at most 2")]:
        with pytest.raises(ValueError, match=reason):
            validate(bad)


def test_python_predicate_skill_joins_the_quantity_table():
    env, params = make("TechTree-v0")
    corner = Skill("reach_corner", predicate=lambda s: jnp.all(s.pos == 0))
    lib = SkillLibrary((corner,))
    senv = SkillEnv(env, quantities_for(env, lib), max_experts=2, max_conditions=2)
    p = senv.params_for(params, lib, "reach_corner")
    _, state = senv.reset(jax.random.key(0), p)
    grid = jnp.zeros((7, 7), jnp.int32)
    base = tt.TechTreeState(jnp.array([0, 1], jnp.int32), grid, jnp.zeros(7, jnp.int32), jnp.zeros(8, bool), jnp.int32(0))
    _, s1, r, term, trunc, _ = senv.step(jax.random.key(1), state.replace(base=base), jnp.int32(3), p)  # left
    assert bool(s1.success) and float(r) == 1.0 and bool(term) and not bool(trunc)


def test_conditions_hold_by_hand():
    env, _ = make("TechTree-v0")
    senv = SkillEnv(env, quantities_for(env, SkillLibrary()), max_experts=2, max_conditions=3)
    skills = [Skill("a", success=(Condition.parse("inventory.wood >= 2"), Condition.parse("inventory.stone < 1"))),
              Skill("b", success=(Condition.parse("inventory.iron != 0"),)), None]
    cond = senv.conditions(skills)
    q = np.zeros(len(senv.quantity_names), np.float32)
    names = senv.quantity_names
    q[names.index("inventory.wood")] = 2
    assert np.asarray(conditions_hold(jnp.asarray(q), cond)).tolist() == [True, False, True]  # None: no rows
    q[names.index("inventory.stone")] = 1
    q[names.index("inventory.iron")] = 3
    assert np.asarray(conditions_hold(jnp.asarray(q), cond)).tolist() == [False, True, True]


def test_skill_env_gates_experts_and_rewards_success():
    env, params = make("TechTree-v0")
    lib = techtree_library()
    senv = SkillEnv(env, quantities_for(env, lib), max_experts=4, max_conditions=2)
    p = senv.params_for(params, lib, "make_wood_pickaxe")  # plan: collect_wood (holds while wood >= 1), place_table
    assert int(p.skill.plan_len) == 2
    obs, state = senv.reset(jax.random.key(0), p)
    assert int(obs["expert"]) == 0 and obs["obs"].shape == env.observation_space(params).shape

    def holding(*names, wood=0, stone=0):
        ach = jnp.array([n in names for n in tt.ACHIEVEMENTS])
        inv = jnp.zeros(len(tt.ITEMS), jnp.int32).at[tt.WOOD_I].set(wood).at[tt.STONE_I].set(stone)
        return state.replace(base=state.base.replace(achievements=ach, inventory=inv))

    noop = jnp.int32(0)
    o, s, r, term, _, _ = senv.step(jax.random.key(1), holding("collect_wood", wood=1), noop, p)
    assert int(o["expert"]) == 1 and float(r) == 0.0 and not bool(term)  # place_table's expert acts
    assert senv.achievements(s).tolist() == [False, False, False, False, False]  # the skill's own expert has not acted yet
    o, s, r, term, _, _ = senv.step(jax.random.key(1), holding("collect_wood", "place_table", wood=1), noop, p)
    assert int(o["expert"]) == 2 and float(r) == 0.0  # all dependencies met: the new expert (position 2)
    assert senv.achievements(s).tolist() == [False, True, False, False, True]  # reached: this episode counts for the skill
    # The table spent the wood: the pickaxe needs wood directly, so control goes back to collect_wood's
    # expert (conditions are read live); `reached` stays.
    o, s2, *_ = senv.step(jax.random.key(1), s.replace(base=holding("collect_wood", "place_table").base), noop, p)
    assert int(o["expert"]) == 0 and senv.achievements(s2).tolist() == [False, True, False, False, True]
    o, s, r, term, trunc, _ = senv.step(
        jax.random.key(1), holding("collect_wood", "place_table", "make_wood_pickaxe"), noop, p)
    assert float(r) == 1.0 and bool(term) and not bool(trunc) and senv.achievements(s).tolist() == [True, True, False, True, True]

    # Wood gates only while a craft that directly requires it is still to do: collect_stone (plan:
    # collect_wood, place_table, make_wood_pickaxe) acts at once with no wood once the pickaxe is made;
    # make_stone_pickaxe, which spends wood, sends its chain back for some.
    done = ("collect_wood", "place_table", "make_wood_pickaxe")
    stone = senv.params_for(params, lib, "collect_stone")
    o, *_ = senv.step(jax.random.key(1), holding(*done), noop, stone)
    assert int(o["expert"]) == 3
    pick = senv.params_for(params, lib, "make_stone_pickaxe")  # plan: ..., collect_stone at position 3
    for wood, stones, expert in [(0, 1, 0), (1, 0, 3), (1, 1, 4)]:
        o, *_ = senv.step(jax.random.key(1), holding(*done, "collect_stone", wood=wood, stone=stones), noop, pick)
        assert int(o["expert"]) == expert, (wood, stones)


def test_attempt_cap_truncates_only_the_steps_after_the_hand_over():
    env, params = make("TechTree-v0")
    lib = techtree_library()
    senv = SkillEnv(env, quantities_for(env, lib), max_experts=4, max_conditions=2, max_attempt_steps=2)
    p = senv.params_for(params, lib, "place_table")  # plan: collect_wood
    _, s = senv.reset(jax.random.key(0), p)
    noop = jnp.int32(0)
    for _ in range(3):  # collect_wood's expert acts (no wood): not the attempt, never truncated
        _, s, _, _, trunc, _ = senv.step(jax.random.key(1), s, noop, p)
        assert not bool(trunc) and int(s.attempt_steps) == 0
    s = s.replace(base=s.base.replace(inventory=s.base.inventory.at[tt.WOOD_I].set(1)))
    truncs = []
    for _ in range(3):  # the hand-over step, then two steps of place_table's expert: the cap
        _, s, _, term, trunc, _ = senv.step(jax.random.key(1), s, noop, p)
        truncs.append((bool(term), bool(trunc), int(s.attempt_steps)))
    assert truncs == [(False, False, 0), (False, False, 1), (False, True, 2)]


def test_restarts_resume_from_the_state_where_the_skill_was_reached():
    # make_wood_pickaxe (plan: collect_wood, place_table) with restarts always taken (prob -> 1).
    from jaxrl_hier.envs import make_vec_env

    env, params = make("TechTree-v0")
    lib = techtree_library()
    with pytest.raises(SkillError, match="restart_prob"):
        SkillEnv(env, quantities_for(env, lib), max_experts=4, max_conditions=2, restart_prob=1.0)
    senv = SkillEnv(env, quantities_for(env, lib), max_experts=4, max_conditions=2, restart_prob=0.999999)
    p = senv.params_for(params, lib, "make_wood_pickaxe")
    # Jitted: one compile each, where op-by-op dispatch of the env took most of this test's time.
    reset, step, restart = jax.jit(senv.reset), jax.jit(senv.step), jax.jit(senv.restart)
    _, state = reset(jax.random.key(0), p)
    noop = jnp.int32(0)
    assert not bool(restart(jax.random.key(1), state, p)[2])  # no anchor yet
    ach = jnp.array([n in ("collect_wood", "place_table") for n in tt.ACHIEVEMENTS])
    wood = state.base.inventory.at[tt.WOOD_I].set(1)  # collect_wood holds while there is wood
    reached = state.replace(base=state.base.replace(achievements=ach, inventory=wood, timestep=jnp.int32(40)))
    _, s, *_ = step(jax.random.key(1), reached, noop, p)  # the own expert takes control: anchor kept
    assert bool(s.has_anchor) and int(s.anchor.timestep) == 41
    for _ in range(3):  # later steps of the episode do not move the anchor
        _, s, *_ = step(jax.random.key(2), s, jnp.int32(1), p)
    assert int(s.anchor.timestep) == 41 and int(s.base.timestep) == 44
    obs, r, valid, want = restart(jax.random.key(3), s, p)
    assert bool(valid) and bool(want) and int(r.base.timestep) == 41 and int(obs["expert"]) == 2  # own expert
    assert senv.achievements(r).tolist() == [False, True, True, False, False]  # reached, restarted: not the chain's
    root = senv.params_for(params, lib, "collect_wood")
    assert not bool(restart(jax.random.key(3), s, root)[3])  # a root skill never restarts

    # In a vec env: finished envs restart from their anchor, or borrow another env's; with no anchor
    # anywhere they take fresh worlds.
    vec = make_vec_env(senv, p, num_envs=3, reset_ratio=1)
    _, v = jax.jit(vec.reset)(jax.random.key(0))
    vec_step = jax.jit(vec.step)
    envs = jax.tree.map(lambda x: jnp.stack([x, x, x]), s)
    envs = envs.replace(base=envs.base.replace(timestep=jnp.array([99, 99, 50], jnp.int32)),  # 0, 1 end now
                        anchor=envs.anchor.replace(timestep=jnp.array([41, 7, 9], jnp.int32)))
    for has, want_t in [([True, False, False], [41, 41]), ([False, False, False], [0, 0])]:
        v2 = v.replace(env_state=envs.replace(has_anchor=jnp.array(has)))
        obs, v2, *_, info = vec_step(jax.random.key(4), v2, jnp.zeros(3, jnp.int32))
        assert np.asarray(info["returned_episode"]).tolist() == [True, True, False]
        assert np.asarray(v2.env_state.base.timestep).tolist() == want_t + [51]
        assert np.asarray(v2.env_state.restarted)[:2].tolist() == [want_t[0] > 0] * 2

    # Six finished envs, anchors (timesteps 10..15) held by envs 1 and 4 only: those restart from their
    # own, the others borrow one of the two, uniformly, never a state nobody reached.
    vec6 = make_vec_env(senv, p, num_envs=6, reset_ratio=1)
    _, v6 = jax.jit(vec6.reset)(jax.random.key(0))
    six = jax.tree.map(lambda x: jnp.stack([x] * 6), s)
    six = six.replace(base=six.base.replace(timestep=jnp.full(6, 99, jnp.int32)),
                      anchor=six.anchor.replace(timestep=jnp.arange(10, 16, dtype=jnp.int32)),
                      has_anchor=jnp.array([False, True, False, False, True, False]))
    step6 = jax.jit(lambda k: vec6.step(k, v6.replace(env_state=six), jnp.zeros(6, jnp.int32))[1].env_state.base.timestep)
    starts = np.stack([np.asarray(step6(jax.random.key(k))) for k in range(40)])  # each env's restart state
    assert (starts[:, 1] == 11).all() and (starts[:, 4] == 14).all()
    borrowed = starts[:, [0, 2, 3, 5]]
    assert set(np.unique(borrowed)) == {11, 14} and 0.3 < (borrowed == 11).mean() < 0.7


@pytest.mark.parametrize("experts,rows", [(1, 5), (3, 64), (9, 256), (33, 100)])
def test_gather_and_mask_mixtures_are_equal(experts, rows):
    k = jax.random.key(experts)
    bank = stack_experts([init_mlp(jax.random.fold_in(k, i), [12, 16, 16, 5], 1.0) for i in range(experts)])
    x = jax.random.normal(k, (rows, 12))
    for idx in (jax.random.randint(jax.random.fold_in(k, 99), (rows,), 0, experts),
                jnp.zeros(rows, jnp.int32), jnp.full(rows, experts - 1)):
        np.testing.assert_allclose(np.asarray(mixture_apply_gather(bank, x, idx, jnp.tanh)),
                                   np.asarray(mixture_apply_mask(bank, x, idx, jnp.tanh)), atol=2e-6)
        one = mixture_apply_gather(bank, x, idx, jnp.tanh, block_size=1)  # any block size
        np.testing.assert_allclose(np.asarray(one), np.asarray(mixture_apply_mask(bank, x, idx, jnp.tanh)), atol=2e-6)


@pytest.mark.parametrize("experts,rows,block_size", [(1, 5, None), (3, 64, None), (9, 256, 32), (4, 7, 3)])
def test_batched_gather_has_the_loops_values_and_bank_gradient(experts, rows, block_size):
    # Chain fine-tuning trains every expert through the batched blocks: the same function as the block
    # loop and the mask, so the same gradient with respect to every expert (rows of unused experts 0).
    k = jax.random.key(experts + rows)
    bank = stack_experts([init_mlp(jax.random.fold_in(k, i), [12, 16, 16, 5], 1.0) for i in range(experts)])
    x = jax.random.normal(k, (rows, 12))
    idx = jax.random.randint(jax.random.fold_in(k, 7), (rows,), 0, max(1, experts - 1))  # the last one unused

    def grad(mix):
        return jax.value_and_grad(lambda b: jnp.sum(jnp.sin(mix(b, x, idx, jnp.tanh))))(bank)

    batched = grad(lambda *a: mixture_apply_gather(*a, block_size=block_size, batched=True))
    for other in (lambda *a: mixture_apply_gather(*a, block_size=block_size), mixture_apply_mask):
        want = grad(other)
        np.testing.assert_allclose(float(batched[0]), float(want[0]), rtol=1e-5)
        for got, ref in zip(jax.tree.leaves(batched[1]), jax.tree.leaves(want[1])):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-5)
    if experts > 1:
        assert not np.any(np.asarray(batched[1][0]["kernel"][-1]))  # no row routed there, no gradient


def test_blocks_fit_the_worst_routing_and_the_batched_gradient_holds_under_vmap():
    # 256 rows, 8 experts, blocks of 32: seven experts with 33 rows (two blocks each) and one with 25
    # fill all 15 blocks the bound allows; values and bank gradients still those of the mask, per
    # seed under vmap (as chain fine-tuning runs them).
    experts, rows, bs = 8, 256, 32
    idx = jnp.asarray(np.repeat(np.arange(experts), [33] * 7 + [25]), jnp.int32)
    assert sort_into_blocks(idx, experts, bs)[2] == 15
    k = jax.random.key(3)
    banks = jax.vmap(lambda key: stack_experts([init_mlp(jax.random.fold_in(key, i), [12, 16, 5], 1.0)
                                                for i in range(experts)]))(jax.random.split(k, 2))
    x = jax.random.normal(k, (2, rows, 12))
    perm = jax.random.permutation(jax.random.fold_in(k, 1), rows)
    idx = jnp.stack([idx, idx[perm]])

    def grad(mix):
        loss = lambda b, x, i: jnp.sum(jnp.sin(mix(b, x, i, jnp.tanh)))  # noqa: E731
        return jax.vmap(jax.value_and_grad(loss))(banks, x, idx)

    got = grad(lambda *a: mixture_apply_gather(*a, block_size=bs, batched=True))
    want = grad(mixture_apply_mask)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5)


def test_active_rows_mixture_equals_every_row_and_branches_for_real_under_a_named_vmap():
    # The frozen experts run on the rows they act on only (a lax.switch on how many), exactly the
    # mixture over every row there; under the trainer's named vmap the switch stays a real branch.
    rows, experts = 64, 9
    k = jax.random.key(3)
    bank = stack_experts([init_mlp(jax.random.fold_in(k, i), [12, 16, 16, 5], 1.0) for i in range(experts)])
    x = jax.random.normal(k, (rows, 12))
    idx = jax.random.randint(jax.random.fold_in(k, 1), (rows,), 0, experts)
    order = jax.random.permutation(jax.random.fold_in(k, 2), rows)
    actives = jnp.stack([order < n for n in (0, 3, 8, 9, 20, 33, 64)])  # every branch, the edges too

    @jax.jit
    def both(active):
        every = jnp.where(active[:, None], mixture_apply_mask(bank, x, idx, jnp.tanh), 0.0)
        return every, {name: mixture_apply_active(bank, x, jnp.where(active, idx, 99), active, jnp.tanh, mix)
                       for name, mix in (("gather", mixture_apply_gather), ("mask", mixture_apply_mask))}

    for active in actives:
        every, got = both(active)
        for out in got.values():
            np.testing.assert_allclose(np.asarray(out), np.asarray(every), atol=2e-6)

    def instances(axes):
        return jax.vmap(lambda a: mixture_apply_active(bank, x, idx, a, jnp.tanh, mixture_apply_mask, axes),
                        axis_name="seed")

    pair = actives[jnp.array([1, 4])]  # 3 and 20 rows: the fuller one picks the branch for both
    want = np.stack([np.asarray(both(a)[1]["mask"]) for a in pair])
    np.testing.assert_allclose(np.asarray(instances(("seed", "shard"))(pair)), want, atol=2e-6)
    assert "cond[" in str(jax.make_jaxpr(instances(("seed", "shard")))(pair))  # unbound "shard" is skipped
    assert "cond[" not in str(jax.make_jaxpr(instances(()))(pair))  # a batched index: every branch, then select


def test_moe_policy_trains_only_the_new_expert():
    policy = MoEPolicy(num_actions=4, hidden_size=8, num_layers=2, activation="tanh", max_experts=3)
    obs = {"obs": jnp.ones((6, 5)), "expert": jnp.array([0, 1, 2, 2, 0, 1])}
    variables = policy.init(jax.random.key(0), obs)
    assert set(variables["params"]) == {"actor", "critic"}  # one expert: what the optimiser sees
    assert variables["experts"]["actor"][0]["kernel"].shape == (3, 5, 8)

    # Everything below is computed in one jitted program and checked on the host: run op by op, its
    # hundreds of small operations each compiled on their own and took most of this test's time.
    @jax.jit
    def compute(params, bank):
        frozen = jax.tree.map(lambda w: jax.random.normal(jax.random.key(1), w.shape), bank)
        extra = {"actor": frozen, "plan_len": jnp.int32(2)}  # rows 0, 1: dependencies; position 2: new expert

        def loss(params, bank):
            pi, v = policy.apply({"params": params, "experts": {**extra, "actor": bank}}, obs)
            return pi.logits.sum() + v.sum()

        g_params, g_bank = jax.grad(loss, argnums=(0, 1))(params, frozen)
        out = {"g_bank": g_bank, "g_kernel": g_params["actor"][0]["kernel"]}
        cut = {"actor": jax.tree.map(lambda w: w[:2], frozen), "plan_len": jnp.int32(2)}
        expert_1 = mlp_apply(jax.tree.map(lambda w: w[1], frozen), obs["obs"][1:2], jnp.tanh)
        for dispatch in ("gather", "mask"):
            pol = MoEPolicy(4, 8, 2, "tanh", 3, dispatch, greedy_frozen=True)
            sampled, _ = MoEPolicy(4, 8, 2, "tanh", 3, dispatch).apply({"params": params, "experts": cut}, obs)
            pi, _ = pol.apply({"params": params, "experts": extra}, obs)
            pi_cut, _ = pol.apply({"params": params, "experts": cut}, obs)
            out[dispatch] = {"sampled": sampled.logits[1:2], "mode": pi.mode(), "log_prob": pi.log_prob(pi.mode()),
                             "entropy": pi.entropy(), "logits": pi.logits, "cut_logits": pi_cut.logits}
        return out, expert_1

    out, want = compute(variables["params"], variables["experts"]["actor"])
    assert all(float(jnp.abs(g).sum()) == 0.0 for g in jax.tree.leaves(out["g_bank"]))
    assert float(jnp.abs(out["g_kernel"]).sum()) > 0
    # Rows routed to a frozen expert use that expert's weights, exactly (here greedily); the new
    # expert's rows sample. A bank cut to the plan (2 rows, as the trainer passes it) gives the same policy.
    for dispatch in ("gather", "mask"):
        got = out[dispatch]
        np.testing.assert_allclose(np.asarray(got["sampled"]), np.asarray(jax.nn.log_softmax(want)), atol=1e-5)
        assert int(got["mode"][1]) == int(jnp.argmax(want)) and float(got["log_prob"][1]) == 0.0
        assert float(got["entropy"][1]) == 0.0 and float(got["entropy"][2]) > 0.1
        np.testing.assert_allclose(np.asarray(got["cut_logits"]), np.asarray(got["logits"]), atol=1e-5)


def test_acting_variables_lay_the_mask_bank_out_once_and_act_the_same():
    """Under `mask` the rollout acts with the bank's first layers side by side (`acting_variables`,
    computed once per rollout): the same logits as the stacked bank, to the bit, for one-layer and
    deeper experts; `gather`, and a skill without dependencies, keep their variables as they are."""
    obs = {"obs": jax.random.normal(jax.random.key(3), (6, 5)), "expert": jnp.array([0, 1, 2, 2, 0, 1])}
    for layers in (0, 2):
        policy = MoEPolicy(4, 8, layers, "tanh", 3, "mask")
        variables = policy.init(jax.random.key(0), obs)
        bank = jax.tree.map(lambda w: jax.random.normal(jax.random.key(1), w.shape), variables["experts"]["actor"])
        extra = {"experts": {"actor": bank, "plan_len": jnp.int32(2)}}
        acting = policy.acting_variables(extra)
        assert acting["experts"]["first_kernel"].shape == (5, 3 * bank[0]["kernel"].shape[-1])
        logits = jax.jit(lambda e: policy.apply({"params": variables["params"], **e}, obs)[0].logits)
        assert jnp.array_equal(logits(acting), logits(extra))
    gather = MoEPolicy(4, 8, 2, "tanh", 3, "gather")
    assert gather.acting_variables(extra) is extra
    empty = {"experts": {"actor": jax.tree.map(lambda w: w[:0], bank), "plan_len": jnp.int32(0)}}
    assert MoEPolicy(4, 8, 2, "tanh", 3, "mask").acting_variables(empty) is empty


def test_ppo_rollout_acts_with_the_networks_acting_variables():
    """A network's `acting_variables` is what the rollout's steps see (here a shift of every logit
    towards action 1 that the network's own variables do not hold)."""
    from jaxrl_hier.algorithms.ppo import PPOConfig, RunnerState, make_train
    from jaxrl_hier.networks.actor_critic import ActorCriticMLP

    class Biased(ActorCriticMLP):
        def acting_variables(self, extra):
            return {**extra, "bias": {"towards": jnp.array(1)}}

        def __call__(self, obs):
            pi, value = super().__call__(obs)
            if self.has_variable("bias", "towards"):
                towards = self.get_variable("bias", "towards")
                pi = type(pi)(logits=pi.logits + 1e3 * jax.nn.one_hot(towards, pi.logits.shape[-1]))
            return pi, value

    config = PPOConfig(env="CartPole-v1", num_envs=4, num_steps=8, num_minibatches=1, update_epochs=1,
                       hidden_size=8, num_layers=1, total_timesteps=32)
    ppo = make_train(config, network=Biased(num_actions=2, hidden_size=8, num_layers=1))
    runner = jax.tree.map(lambda x: x[0], ppo.init(jax.random.key(0)))  # seed 0
    shards = jax.tree.leaves(runner.obs)[0].shape[0]
    # the rollout of each env shard, vmapped as the update runs it
    rollout = jax.vmap(ppo._rollout, in_axes=(RunnerState(None, 0, 0, None, None, None, None, 0), 0), axis_name="shard")
    traj = jax.jit(rollout)(runner, jnp.arange(shards))[3]
    assert traj.action.size == 32 and bool((traj.action == 1).all())


def test_idle_slot_params_never_succeed():
    # An idle slot whose episodes ended at once would reset every env on every step (costly for Craftax).
    env, _ = make("TechTree-v0")
    senv = SkillEnv(env, quantities_for(env, SkillLibrary()), max_experts=2, max_conditions=2)
    p = senv.default_params
    obs, state = senv.reset(jax.random.key(0), p)
    for t in range(5):
        obs, state, r, term, trunc, _ = senv.step(jax.random.key(t), state, jnp.int32(5), p)
        assert float(r) == 0.0 and not bool(term) and not bool(state.success)
    assert int(obs["expert"]) == 0  # no dependencies: the (unused) new expert's position


def test_planner_proposes_python_predicate_skills_from_the_catalog():
    from jaxrl_hier.skills.generators import ProposalContext, TechTreePlanner

    env, _ = make("TechTree-v0")
    corner = Skill("wood_in_corner", ("collect_wood",), predicate=lambda s: jnp.all(s.pos == 0))
    catalog = SkillLibrary(techtree_library().subset(["collect_wood"]).skills + (corner,))
    have = catalog.subset(["collect_wood"])
    q = tuple(quantities_for(env, catalog))
    assert "predicate.wood_in_corner" in q
    ctx = ProposalContext("wood_in_corner", "TechTree-v0", ({"name": "collect_wood", "requires": [],
                                                             "success": ["achievement.collect_wood == 1"],
                                                             "status": "completed"},), q)
    skill = TechTreePlanner(catalog).propose(ctx, make_validator(have, catalog, q, 4, 2))
    assert skill is corner and skill.predicate is not None


def test_gather_and_mask_mixtures_have_equal_gradients():
    # Equal outputs are not enough: PPO trains through the mixture, so the gradients with respect to
    # the experts' weights and to the inputs must agree too (the gather path scatters and un-sorts).
    k = jax.random.key(7)
    experts, rows = 5, 48
    bank = stack_experts([init_mlp(jax.random.fold_in(k, i), [6, 16, 16, 4], 1.0) for i in range(experts)])
    x = jax.random.normal(k, (rows, 6))
    idx = jax.random.randint(jax.random.fold_in(k, 99), (rows,), 0, experts).at[:3].set(experts - 1)
    weights = jax.random.normal(jax.random.fold_in(k, 5), (rows, 4))  # a loss that weighs every output

    def loss(apply, bank, x):
        return jnp.sum(jnp.tanh(apply(bank, x, idx, jnp.tanh)) * weights)

    # Each gradient jitted: one compile each, where op-by-op dispatch of the gather path's blocks took
    # most of this test's time.
    want = jax.jit(jax.grad(lambda b, x: loss(mixture_apply_mask, b, x), argnums=(0, 1)))(bank, x)
    for block_size in (None, 1, 7):
        gather = lambda b, x, i, a: mixture_apply_gather(b, x, i, a, block_size)  # noqa: E731
        got = jax.jit(jax.grad(lambda b, x: loss(gather, b, x), argnums=(0, 1)))(bank, x)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    # And through the policy, as PPO differentiates it: the update evaluates the new expert alone
    # (frozen rows' log-prob and entropy 0), and its gradient must be that of the whole routed
    # mixture, with each dispatch, as the rollout acts with it.
    import distrax

    obs = {"obs": x, "expert": idx}
    actions = jax.random.randint(jax.random.fold_in(k, 3), (rows,), 0, 4)
    for dispatch in ("gather", "mask"):
        pol = MoEPolicy(4, 16, 2, "tanh", experts - 1, dispatch, greedy_frozen=True)
        variables = jax.jit(pol.init)(jax.random.key(0), obs)
        frozen = {"actor": jax.tree.map(lambda w: w[:-1], bank), "plan_len": jnp.int32(experts - 2)}

        def ppo_like(params, routed):
            pi, v = pol.apply({"params": params, "experts": frozen}, obs)
            mixture = distrax.Categorical(logits=pi.logits) if routed else pi
            return ((mixture.log_prob(actions) * weights[:, 0]).sum() + (v * weights[:, 1]).sum()
                    + mixture.entropy().sum())

        # One jitted program for both losses and their gradients (op by op, each small operation compiled alone).
        both = jax.jit(lambda p: [jax.value_and_grad(ppo_like)(p, routed) for routed in (False, True)])
        (value, got), (routed_value, want) = both(variables["params"])
        assert float(value) != float(routed_value)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert np.isfinite(np.asarray(g)).all()
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_pool_refill_tops_up_every_seed_along_share_axes():
    # K skills in one program: a refill that one seed needs runs for all seeds (a real branch under
    # vmap), so every seed keeps the fresh worlds, and the next refill comes no sooner than for one seed.
    from jaxrl_hier.envs import make_vec_env

    env, params = make("TechTree-v0")
    _, v = make_vec_env(env, params, num_envs=4, reset_ratio=4).reset(jax.random.key(0))  # pool of 2 worlds
    seeds = jax.tree.map(lambda x: jnp.stack([x, x]), v)
    seeds = seeds.replace(pool_left=jnp.array([[0, 0], [1, 0]]))  # seed 0 is short, seed 1 not
    marked = seeds.replace(pool_state=seeds.pool_state.replace(timestep=jnp.full((2, 2), 7, jnp.int32)))
    for share, want_left in [(("seed",), [[1, 1], [1, 1]]), ((), [[1, 1], [1, 0]])]:
        vec = make_vec_env(env, params, num_envs=4, reset_ratio=4, sync_axes=("seed",), share_axes=share)
        out = jax.vmap(lambda s: vec._refill_if_short(jax.random.key(1), s, jnp.int32(1)), axis_name="seed")(marked)
        assert np.asarray(out.pool_left).tolist() == want_left
        fresh = np.asarray(out.pool_state.timestep) == 0  # fresh worlds start at timestep 0
        assert fresh[0].all() and not fresh[1, 0] and bool(fresh[1, 1]) == bool(share)
    with pytest.raises(Exception, match="subset of sync_axes"):
        make_vec_env(env, params, num_envs=4, share_axes=("seed",))


def test_bank_rows_fit_the_longest_plan_in_powers_of_two_or_keep_every_row():
    from jaxrl_hier.skills.trainer import bank_rows

    assert [bank_rows(n, 12) for n in range(13)] == [0, 1, 2, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12]
    assert [bank_rows(n, 12, "max") for n in range(13)] == [0] + [12] * 12  # no routing without a plan
