"""The guided agent (ArCHer-style): replay buffer, critic targets and Polyak update inside the compiled
step, the advantage, bad input refused before compiling, and one end-to-end CLI run whose --resume
gives the same numbers as the uninterrupted run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml
from kill_windows import assert_kill_windows_replay

from jaxrl_hier.llm_rl.critic import DoubleCritic, critic_step, critic_targets, init_critic_state
from jaxrl_hier.llm_rl.guided import build_critic_encoder
from jaxrl_hier.llm_rl.guided_config import GuidedConfig
from jaxrl_hier.llm_rl.replay import Transitions, init_replay, insert, sample
from jaxrl_hier.tasks import build_char_tokenizer
from jaxrl_hier.train import main

S, N = 6, 4


def transitions(start: int, n: int) -> Transitions:
    """n transitions whose every field holds its row number start + i (to follow them through the buffer)."""
    r = np.arange(start, start + n)
    col = lambda w: np.repeat(r[:, None], w, axis=1).astype(np.int32)  # noqa: E731
    return Transitions(col(S), np.ones((n, S), np.int32), col(N), np.ones((n, N), np.int32), r.astype(np.float32),
                       col(S), np.ones((n, S), np.int32), (r % 2).astype(np.float32), (r % 2).astype(np.int32))


def test_replay_insert_skips_invalid_rows_wraps_and_samples_filled_rows():
    buf = init_replay(5, S, N)
    buf = jax.jit(insert)(buf, transitions(0, 4), jnp.array([1, 0, 1, 1]))  # row 1 (an ended episode) skipped
    assert int(buf.size) == 3 and int(buf.ptr) == 3
    assert buf.data.reward.tolist() == [0.0, 2.0, 3.0, 0.0, 0.0]
    buf = insert(buf, transitions(10, 4), jnp.ones(4))  # 3 + 4 > 5: the oldest two are overwritten
    assert int(buf.size) == 5 and int(buf.ptr) == 2
    assert buf.data.reward.tolist() == [12.0, 13.0, 3.0, 10.0, 11.0]
    assert buf.data.state[3].tolist() == [10] * S and buf.data.role.tolist() == [0, 1, 1, 0, 1]
    # uniform over the filled rows only
    small = insert(init_replay(8, S, N), transitions(0, 3), jnp.ones(3))
    drawn = sample(small, jax.random.key(0), 3000)
    counts = np.bincount(np.asarray(drawn.reward).astype(int), minlength=8)
    assert counts[3:].sum() == 0 and all(900 < c < 1100 for c in counts[:3]), counts
    # rows stay together: every field of a drawn row comes from the same transition
    assert np.all(np.asarray(drawn.action)[:, 0] == np.asarray(drawn.reward))


def test_critic_targets_by_hand():
    y_q1, y_q2, y_v1, y_v2 = critic_targets(
        reward=jnp.array([1.0, 0.0, 0.5]), done=jnp.array([1.0, 0.0, 0.0]), gamma=0.9,
        target_v_next=(jnp.array([2.0, 3.0, 4.0]), jnp.array([5.0, 6.0, 7.0])),
        target_q_pi=(jnp.array([0.1, 0.2, 0.3]), jnp.array([0.4, 0.5, 0.6])))
    np.testing.assert_allclose(y_q1, [1.0, 2.7, 0.5 + 0.9 * 4.0], rtol=1e-6)
    np.testing.assert_allclose(y_q2, [1.0, 5.4, 0.5 + 0.9 * 7.0], rtol=1e-6)
    np.testing.assert_allclose(y_v1, [0.1, 0.2, 0.3]) and np.testing.assert_allclose(y_v2, [0.4, 0.5, 0.6])


@pytest.fixture(scope="module")
def tiny_critic():
    """The critic, and its advantage as one compiled program shared by the tests below at one batch
    shape (run eagerly, every operation would compile on its own, which costs more)."""
    tok = build_char_tokenizer()
    cfg = GuidedConfig(critic_hidden_size=16, critic_intermediate_size=32, critic_mlp_hidden=8)
    critic = DoubleCritic("encoder", encoder=build_critic_encoder(cfg, tok, S + N), mlp_hidden=8)
    return critic, jax.jit(critic.advantage)


@jax.jit
def constant_heads(params, q, v):
    """Heads whose output is a constant: zero hidden layer, output bias = the constant."""
    out = dict(params)
    for name, value in (("q1", q[0]), ("q2", q[1]), ("v1", v[0]), ("v2", v[1])):
        head = jax.tree.map(jnp.zeros_like, params[name])
        head["out"]["bias"] = jnp.full((1,), value, jnp.float32)
        out[name] = head
    return out


def test_advantage_is_min_q_minus_min_v(tiny_critic):
    critic, advantage = tiny_critic
    params = constant_heads(critic.init(jax.random.key(0)), q=(1.0, 2.5), v=(3.0, 0.25))
    tr = transitions(5, 8)
    adv, out = advantage(params, tr.state, tr.state_mask, tr.action, tr.action_mask)
    np.testing.assert_allclose(adv, [1.0 - 0.25] * 8)  # positive: the utterance beats the state's value
    params = constant_heads(params, q=(1.0, 2.5), v=(3.0, 1.5))
    adv, _ = advantage(params, tr.state, tr.state_mask, tr.action, tr.action_mask)
    np.testing.assert_allclose(adv, [1.0 - 1.5] * 8)


def test_critic_step_regresses_and_moves_the_target_by_polyak(tiny_critic):
    critic, advantage = tiny_critic
    tau, gamma = 0.1, 0.9
    opt = optax.adam(1e-2)
    # a target that differs from the parameters, to see the mix (one program, not one per operation)
    state = jax.jit(lambda key: (lambda s: s.replace(target=jax.tree.map(lambda x: x + 0.5, s.target)))(
        init_critic_state(critic, opt, key)))(jax.random.key(1))
    tr = transitions(1, 8)
    pi_a, pi_m = tr.action[::-1], tr.action_mask
    step = jax.jit(lambda s: critic_step(critic, opt, tau, gamma, s, tr, pi_a, pi_m))
    old_target = state.target
    new, metrics = step(state)
    # the target moved towards the *new* parameters inside the same step: tau * new + (1 - tau) * old
    jax.tree.map(lambda t, p, o: np.testing.assert_allclose(t, tau * p + (1 - tau) * o, rtol=1e-5, atol=1e-6),
                 new.target, new.params, old_target)
    assert not np.allclose(new.params["q1"]["out"]["kernel"], state.params["q1"]["out"]["kernel"])
    # the reported loss is that of the parameters before the step, worked out by hand from the heads:
    # Q_i(s, a) towards r + gamma (1 - done) V_target_i(s'), V_i(s) towards Q_target_i(s, a'), MSE summed
    out = advantage(state.params, tr.state, tr.state_mask, tr.action, tr.action_mask)[1]
    v_next = advantage(old_target, tr.next_state, tr.next_mask, tr.action, tr.action_mask)[1]
    q_pi = advantage(old_target, tr.state, tr.state_mask, pi_a, pi_m)[1]
    not_done = 1.0 - tr.done
    targets = (tr.reward + gamma * not_done * np.asarray(v_next.v1),
               tr.reward + gamma * not_done * np.asarray(v_next.v2), np.asarray(q_pi.q1), np.asarray(q_pi.q2))
    loss0 = sum(np.mean((np.asarray(pred, np.float64) - y) ** 2) for pred, y in zip(out, targets))
    assert float(metrics["critic/loss"]) == pytest.approx(float(loss0), rel=1e-5)
    s = new
    for _ in range(30):
        s, m = step(s)
    assert float(m["critic/loss"]) < 0.5 * float(loss0)


TINY = dict(algorithm="guided", task_operators="+", task_steps=1, max_prompt_length=6, max_new_tokens=8,
            model=dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64),
            lora_rank=2, sft=dict(steps=4, batch_size=16, checkpoint_every=2), iterations=4,
            episodes_per_iteration=8, critic_steps=2, actor_steps=2, warmup_iterations=1, critic_batch_size=16,
            replay_capacity=64, critic_hidden_size=16, critic_intermediate_size=32, critic_mlp_hidden=16,
            eval_every=2, eval_episodes=8, checkpoint_every=2, sample_log_count=2, beta=0.05, clip_eps=0.2)


@pytest.fixture(scope="module")
def tiny_agents():
    """A tiny guided agent on one random backbone, whole-batch and at micro-batches of 2 episodes."""
    import dataclasses

    from jaxrl_hier.config import build_dataclass
    from jaxrl_hier.llm_rl.guided import make_env, make_train
    from jaxrl_hier.llm_rl.model_setup import build_policy

    cfg = build_dataclass(GuidedConfig, {k: v for k, v in TINY.items() if k != "algorithm"})
    env = make_env(cfg)
    lm, tok = build_policy(cfg, build_char_tokenizer())
    return (make_train(cfg, env, lm, tok),
            make_train(dataclasses.replace(cfg, actor_micro_batch_size=2), env, lm, tok))


def test_actor_micro_batches_accumulate_the_whole_batch_gradient_in_less_memory(tiny_agents):
    whole, micro = tiny_agents
    # non-zero LoRA B matrices, so that the A matrices get gradients too (one program for the state)
    state = jax.jit(lambda key: (lambda s: s.replace(policy=jax.tree.map(lambda x: x + 0.01, s.policy)))(
        whole.init(key)))(jax.random.key(0))
    _, turns, _ = whole.rollout(state, whole.episodes_for(0), jax.random.key(1))
    bases, batches = whole.bases(), whole.role_batches(turns)

    def compiled(agent):
        """The gradient program, compiled once: run for the numbers, and read for its memory."""
        def fn(state, bases, batches):
            inputs, metrics = agent._policy_inputs(state, bases, batches)
            return agent._policy_grads(state.policy, bases, inputs), metrics
        return jax.jit(fn).lower(state, bases, batches).compile()

    programs = [compiled(a) for a in (whole, micro)]
    ((g_whole, loss_whole, s_whole), metrics), ((g_micro, loss_micro, s_micro), _) = (
        p(state, bases, batches) for p in programs)
    assert float(jnp.abs(optax.tree.norm(g_whole))) > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7), g_whole, g_micro)
    assert float(loss_micro) == pytest.approx(float(loss_whole), rel=1e-5, abs=1e-6)  # a sum that nearly cancels
    for key in ("actor/kl", "guidance/kl", "actor/ratio", "guidance/pg_loss"):
        assert key in s_whole, key
    assert {"actor/v_return_mse", "actor/q_return_mse", "actor/return_var", "actor/advantage_agreement"} <= set(metrics)
    for key in ("actor/kl", "guidance/kl", "actor/ratio", "guidance/pg_loss"):
        assert float(s_micro[key]) == pytest.approx(float(s_whole[key]), rel=1e-4, abs=1e-7), key
    # 4 micro-batches of 2 episodes: the compiled step keeps a quarter of the activations
    temp = [p.memory_analysis().temp_size_in_bytes for p in programs]
    assert temp[1] < 0.7 * temp[0], temp


def test_returns_to_go_by_hand():
    from jaxrl_hier.llm_rl.guided import returns_to_go

    # two episodes, three turns: the first ends at turn 2 (its turn-3 row is invalid), the second at turn 3
    turns = [{"reward": np.array([-1.0, -1.0], np.float32), "done": np.array([0.0, 0.0], np.float32),
              "valid": np.ones(2, np.float32)},
             {"reward": np.array([0.0, -1.0], np.float32), "done": np.array([1.0, 0.0], np.float32),
              "valid": np.ones(2, np.float32)},
             {"reward": np.array([0.0, 2.0], np.float32), "done": np.array([1.0, 1.0], np.float32),
              "valid": np.array([0.0, 1.0], np.float32)}]
    g = returns_to_go(turns, gamma=0.5)
    np.testing.assert_allclose(g[2], [0.0, 2.0])
    np.testing.assert_allclose(g[1], [0.0, -1.0 + 0.5 * 2.0])
    np.testing.assert_allclose(g[0], [-1.0 + 0.5 * 0.0, -1.0 + 0.5 * 0.0])


def test_group_baseline_by_hand_and_grouped_episodes(tiny_agents):
    import dataclasses

    from jaxrl_hier.llm_rl.guided import group_mean, make_train

    # rows of two groups of 3; an ended episode's row (valid 0) is left out of its group's mean
    mean = group_mean(jnp.array([1.0, 0.0, 0.0, 1.0, 5.0, 1.0]), jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0]), 3)
    np.testing.assert_allclose(mean, [1 / 3] * 3 + [1.0] * 3, rtol=1e-6)
    whole = tiny_agents[0]
    grouped = make_train(dataclasses.replace(whole.config, advantage="group", group_size=4), whole.env,
                         whole.roles["actor"].lm, whole.tokenizer)
    eps = grouped.episodes_for(3)
    prompts = [e.problem.prompt for e in eps]
    assert len(eps) == 8 and prompts[:4] == [prompts[0]] * 4 and prompts[4:] == [prompts[4]] * 4
    assert eps[0] is not eps[1]  # each play is its own episode


def test_critic_diagnostics_by_hand():
    """The critic's V against Monte-Carlo returns, and its advantage's agreement with the observed one."""
    from types import SimpleNamespace

    from jaxrl_hier.llm_rl.guided import critic_diagnostics, weighted_corr

    ret = jnp.array([-1.0, -3.0, 0.0, -2.0, 9.0, 4.0])  # the last pair is invalid: left out everywhere
    valid = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    v = jnp.array([-1.0, -2.0, 0.0, -2.0, 0.0, 3.0])
    q = jnp.array([-1.0, -3.0, 1.0, -2.0, 5.0, 0.0])  # advantage q - v: 0, -1, 1, 0
    out = SimpleNamespace(v1=v, v2=v + 1.0, q1=q, q2=q + 2.0)  # min picks v and q
    d = critic_diagnostics(out, ret, valid, group_size=2)
    assert float(d["v_return_mse"]) == pytest.approx(1 / 4)  # one row off by 1
    assert float(d["q_return_mse"]) == pytest.approx(1 / 4)  # q: the third row off by 1
    assert float(d["return_var"]) == pytest.approx(1.25)  # returns -1, -3, 0, -2 around -1.5
    # observed: each return against its pair's mean (-2, -1): 1, -1, 1, -1; against the critic's 0, -1, 1, 0
    assert float(d["advantage_agreement"]) == pytest.approx(float(np.corrcoef([1, -1, 1, -1], [0, -1, 1, 0])[0, 1]))
    assert float(weighted_corr(jnp.arange(4.0), jnp.ones(4), jnp.ones(4))) == 0.0  # a constant: no correlation
    assert float(weighted_corr(jnp.array([1.0, 2, 3, 99]), jnp.array([2.0, 4, 6, -5]), jnp.array([1.0, 1, 1, 0]))) == \
        pytest.approx(1.0)  # the weight-0 row would break the line


def write_config(tmp_path, **overrides):
    path = tmp_path / "guided.yaml"
    path.write_text(yaml.safe_dump({**TINY, **overrides}))
    return path


@pytest.mark.parametrize("override, message", [
    ("tau=0", "tau (the Polyak step"),
    ("critic=lstm", "critic"),
    ("replay_capacity=16", "replay_capacity=16 is smaller"),
    ("warmup_iterations=4", "leaves no actor update"),
    ("max_new_tokens=4", "raise max_new_tokens"),
    ("critic_stpes=3", "Did you mean 'critic_steps'"),
    ("guidance_model_path=/nonexistent", "not a local directory"),
    ("model.path=/nonexistent", "model.path /nonexistent is not a local directory"),
    ("model_heads=4", "is now 'model.heads'"),
    ("actor_micro_batch_size=3", "must divide episodes_per_iteration=8"),
    ("hint_kind=hints", "hint_kind"),
    ("group_size=3", "group_size=3 must divide"),
    ("advantage=group", "set group_size >= 2"),
    ("turn_loop=compiled", "turn_loop: compiled needs an env with a JAX form"),
])
def test_bad_input_exits_2_before_compiling(tmp_path, capsys, override, message):
    out = tmp_path / "run"
    assert main(["--config", str(write_config(tmp_path)), "--output-dir", str(out), "--no-progress", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not out.exists()


def test_reward_shaping_is_refused_outside_the_two_turn_env():
    from jaxrl_hier.config import ConfigError
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig

    with pytest.raises(ConfigError, match="reward_shaping shapes the two_turn"):
        GuidedConfig(env="guess_number", reward_shaping=True).validate()
    GuidedConfig(reward_shaping=True).validate()
    with pytest.raises(ConfigError, match="hint_kind: reduce works out an arithmetic expression"):
        GuidedConfig(task="gsm8k", task_path="x.jsonl", hint_kind="reduce").validate()


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_guided_end_to_end_and_kill_windows(tmp_path, capsys):
    # The run and its resumes compile the same programs once: tests/conftest.py gives the session one
    # persistent XLA compilation cache.
    cfg = write_config(tmp_path)
    full = tmp_path / "full"
    assert main(["--config", str(cfg), "--output-dir", str(full), "--no-progress"]) == 0
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "learning_curve.png", "sft/DONE",
                 "model/model.safetensors", "guidance_model/model.safetensors", "guidance_model/tokenizer.json"):
        assert (full / name).exists(), name
    recs = records(full / "metrics.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2, 3, 4]
    # validation every eval_every=2 iterations, test at the first and the last only
    assert [r["step"] for r in recs if "eval/turn2_accuracy" in r and "eval/turn1_accuracy" in r] == [0, 2, 4]
    assert [r["step"] for r in recs if "test/turn2_accuracy" in r and "test/turn1_accuracy" in r] == [0, 4]
    assert recs[0]["eval/episodes"] == recs[0]["test/episodes"] == 8  # eval_episodes=8 distinct problems each
    assert "actor/pg_loss" not in recs[1] and "actor/pg_loss" in recs[2]  # one critic-only warm-up iteration
    for key in ("critic/q1_loss", "critic/v2_loss", "critic/q_mean", "guidance/kl", "actor/kl", "train/hint_length",
                "time/turn2_guidance", "time/critic", "replay_size"):
        assert key in recs[3], key
    assert recs[1]["replay_size"] == 8 * 3 and recs[4]["replay_size"] == 64  # 96 utterances, 64 rows: full
    assert recs[3]["actor/kl"] > 0  # the adapters left the reference
    sample = records(full / "samples.jsonl")[0]
    assert {"problem", "turn1", "hint", "turn2", "reward"} <= set(sample)

    # a resume that would change what is learned is refused; the kill windows (tests/kill_windows.py):
    # after iteration 4 was logged but before its checkpoint (--resume restores iteration 2 with the
    # critic, target, adapters, optimisers and replay buffer, and replays 3 and 4 to the same
    # numbers), and before the first checkpoint (the agent starts over; the SFT stage is kept)
    assert main(["--resume", "--output-dir", str(full), "--no-progress", "tau=0.5"]) == 2

    def resume():
        capsys.readouterr()
        code = main(["--resume", "--output-dir", str(full), "--no-progress"])
        assert "SFT stage already complete" in capsys.readouterr().err
        return code

    assert_kill_windows_replay(full, resume)
