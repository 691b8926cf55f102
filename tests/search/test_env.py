"""The PGTS search env: masks in every corner, tree bookkeeping after each action, prefix assembly,
rewards and episode ends, on a tiny random generator (one compiled step shared by the tests)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm_rl.data import encode_prompts
from jaxrl_hier.llm_rl.model_setup import tiny_qwen2_config
from jaxrl_hier.llm import LanguageModel
from jaxrl_hier.search.env import SearchEnv, render_tree
from jaxrl_hier.tasks import build_char_tokenizer
from jaxrl_hier.tasks.jax_rewards import answer_token_spec, encode_answers

S, D, N = 6, 3, 6  # step tokens, max depth, max nodes


def length_score(rm_params, ids, mask, prompt_tokens):
    """A stand-in reward model whose score is known by hand: tokens on the path / 100."""
    return mask.sum(-1).astype(jnp.float32) / 100.0


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    hf = tiny_qwen2_config(len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    lm = LanguageModel.random(hf, jax.random.key(0), tokenizer=tok)
    env = SearchEnv(lm, length_score, prompt_length=6, max_nodes=N, max_depth=D, max_children=2, step_tokens=S,
                    token_budget=100, delimiter_id=tok.convert_tokens_to_ids("\n"), eos_id=2, pad_id=0,
                    final_ids=(tok.convert_tokens_to_ids("#"),))
    prompts = encode_prompts(tok, ["1+2=", "3-1="], 6)
    params = env.make_params(lm.params, None, prompts.ids, prompts.mask, encode_answers(tok, ["3", "2"], 3),
                             answer_token_spec(tok))
    step = jax.jit(env.step)
    return tok, env, params, step


def put(env, state, node, parent, text, tok):
    """Write node `node` by hand (a step with the given text) under `parent`."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    row = np.zeros(env.step_tokens, np.int32)
    row[:len(ids)] = ids
    return state.replace(tokens=state.tokens.at[node].set(row), length=state.length.at[node].set(len(ids)),
                         parent=state.parent.at[node].set(parent), depth=state.depth.at[node].set(state.depth[parent] + 1),
                         children=state.children.at[parent].add(1),
                         final=state.final.at[node].set("#" in text),
                         num_nodes=jnp.maximum(state.num_nodes, node + 1))


def mask_of(env, state):
    m = np.asarray(env.action_mask(state))
    return {"expand": m[0], "branch": m[1], "backtrack": [int(k) for k in range(1, D + 1) if m[k + 1]],
            "terminate": m[-1]}


def test_masks_in_every_corner(setup):
    tok, env, params, _ = setup
    _, s = env.reset_to(0)
    # root: only Expand
    assert mask_of(env, s) == {"expand": True, "branch": False, "backtrack": [], "terminate": False}
    s = put(env, s, 1, 0, "1+2=3\n", tok).replace(current=1)
    assert mask_of(env, s) == {"expand": True, "branch": True, "backtrack": [1], "terminate": False}
    s = put(env, s, 2, 1, "3+0=3\n", tok)
    s = put(env, s, 3, 2, "3-0=3\n", tok).replace(current=3)
    # depth limit: no Expand; every backtrack up to the depth
    assert mask_of(env, s) == {"expand": False, "branch": True, "backtrack": [1, 2, 3], "terminate": False}
    s = put(env, s, 4, 2, "3*1=3\n", tok).replace(current=4)
    # no sibling left: node 2 already has max_children = 2 children
    assert mask_of(env, s) == {"expand": False, "branch": False, "backtrack": [1, 2, 3], "terminate": False}
    # a final node: Terminate, and no Expand below the answer
    s2 = put(env, s.replace(current=1), 5, 1, "#### 3", tok).replace(current=5)
    assert mask_of(env, s2) == {"expand": False, "branch": False, "backtrack": [1, 2], "terminate": True}
    # full tree (6 nodes): neither Expand nor Branch anywhere
    s3 = s2.replace(current=1)
    assert mask_of(env, s3) == {"expand": False, "branch": False, "backtrack": [1], "terminate": False}
    # the root with all its children used and the tree not full: nothing but Terminate is left
    _, r = env.reset_to(0)
    r = put(env, put(env, r, 1, 0, "1\n", tok), 2, 0, "2\n", tok)
    assert mask_of(env, r) == {"expand": False, "branch": False, "backtrack": [], "terminate": True}


def test_prefix_assembly(setup):
    tok, env, params, _ = setup
    _, s = env.reset_to(1)  # prompt "3-1="
    s = put(env, s, 1, 0, "3-1=2\n", tok)
    s = put(env, s, 2, 0, "9\n", tok)  # a sibling: not on the path
    s = put(env, s, 3, 1, "#### 2", tok)
    assert np.asarray(env.path_nodes(s, 3)).tolist() == [1, 3, -1]
    ids, mask = env.prefix(s, 3, params)
    assert ids.shape == (env.prefix_length,)
    real = np.asarray(ids)[np.asarray(mask) > 0].tolist()
    assert real == [1] + tok("3-1=3-1=2\n#### 2", add_special_tokens=False)["input_ids"]
    n_pad = env.prefix_length - len(real)
    assert np.all(np.asarray(mask)[:n_pad] == 0) and np.all(np.asarray(mask)[n_pad:] == 1)  # left-padded
    steps, steps_mask = env.path_tokens(s, 2)
    assert tok.decode(np.asarray(steps)[np.asarray(steps_mask) > 0].tolist()) == "9\n"
    assert bool(env.is_correct(s, 3, params)) and not bool(env.is_correct(s, 2, params))


def test_bookkeeping_after_each_action(setup):
    tok, env, params, step = setup
    _, s = env.reset_to(0)
    key = jax.random.key(1)
    # Expand at the root
    obs, s1, r, term, trunc, _ = step(key, s, jnp.int32(0), params)
    assert int(s1.num_nodes) == 2 and int(s1.current) == 1 and int(s1.parent[1]) == 0 and int(s1.depth[1]) == 1
    assert int(s1.children[0]) == 1 and 1 <= int(s1.length[1]) <= S and int(s1.tokens_used) == int(s1.length[1])
    expected_score = (len(tok("1+2=", add_special_tokens=False)["input_ids"]) + 1 + int(s1.length[1])) / 100
    assert float(s1.score[1]) == pytest.approx(expected_score)
    assert float(r) == pytest.approx(expected_score - 0.0 - 0.1)  # score change minus the expand cost
    assert not bool(term) and not bool(trunc) and bool(obs["obs"]["valid"][1]) and not bool(obs["obs"]["valid"][2])
    assert float(jnp.abs(s1.hidden[1]).sum()) > 0 and bool(obs["obs"]["nodes"][1, 2])  # hidden set, node 1 current
    # Branch: a sibling of node 1 (another child of the root)
    _, s2, r2, *_ = step(jax.random.key(2), s1, jnp.int32(1), params)
    assert int(s2.num_nodes) == 3 and int(s2.current) == 2 and int(s2.parent[2]) == 0 and int(s2.children[0]) == 2
    assert int(s2.tokens_used) == int(s1.length[1]) + int(s2.length[2])
    assert float(r2) == pytest.approx(float(s2.score[2]) - float(s1.score[1]) - 0.2)
    # Expand below node 2, then Backtrack(2) to the root
    _, s3, *_ = step(jax.random.key(3), s2, jnp.int32(0), params)
    assert int(s3.parent[3]) == 2 and int(s3.depth[3]) == 2 and int(s3.current) == 3
    if not bool(s3.final[3]):
        _, s4, r4, term4, *_ = step(key, s3, jnp.int32(1 + 2), params)  # action 3 = Backtrack(2)
        assert int(s4.current) == 0 and int(s4.num_nodes) == 4 and not bool(term4)
        assert float(r4) == pytest.approx(0.0 - float(s3.score[3]) - 0.5)
        assert np.array_equal(np.asarray(s4.tokens), np.asarray(s3.tokens))  # nothing generated


def test_terminate_reads_the_answer_and_budget_ends(setup):
    tok, env, params, step = setup
    _, s = env.reset_to(0)
    s = put(env, s, 1, 0, "1+2=3\n", tok)
    s = put(env, s, 2, 1, "#### 3", tok).replace(current=2, score=s.score.at[2].set(0.7))
    _, s1, r, term, *_ = step(jax.random.key(0), s, jnp.int32(env.terminate_action), params)
    assert bool(term) and bool(s1.correct) and float(r) == pytest.approx(1.0)
    assert np.asarray(env.achievements(s1)).tolist() == [True]
    wrong = put(env, s, 2, 1, "#### 4", tok).replace(current=2)
    _, _, r, term, *_ = step(jax.random.key(0), wrong, jnp.int32(env.terminate_action), params)
    assert bool(term) and float(r) == pytest.approx(0.0)
    # an invalid action (Expand at a final node) acts as Terminate
    _, s2, _, term, *_ = step(jax.random.key(0), s, jnp.int32(0), params)
    assert bool(term) and int(s2.num_nodes) == 3
    # the tree fills up: the episode ends on the step that used the last node
    _, full = env.reset_to(0)
    for i in range(1, N - 1):
        full = put(env, full, i, 0 if i < 3 else i - 1, "1\n", tok)
    full = full.replace(current=3)  # depth 2, one child: Expand is valid
    _, s3, _, term, *_ = step(jax.random.key(0), full, jnp.int32(0), params)
    assert int(s3.num_nodes) == N and bool(term)
    text = render_tree(env, s3, tok, "1+2=", "3")
    assert "[5]" in text and "nodes: 6" in text


def test_bad_sizes_rejected(setup):
    tok, env, params, _ = setup
    with pytest.raises(ConfigError, match="max_depth"):
        SearchEnv(env.lm, length_score, prompt_length=6, max_depth=0)
    with pytest.raises(ConfigError, match="prompt_length"):
        env.make_params(None, None, np.zeros((2, 5), np.int32), np.zeros((2, 5), np.int32), np.zeros((2, 1)),
                        answer_token_spec(tok))


def test_greedy_first_child_is_the_greedy_step_and_branches_are_sampled(setup):
    import dataclasses

    from jaxrl_hier.llm.sampling import sample_tokens

    tok, env, params, _ = setup
    genv = dataclasses.replace(env, greedy_first_child=True, temperature=2.0)
    step = jax.jit(genv.step)
    _, s0 = genv.reset_to(0)
    ids, mask = genv.prefix(s0, jnp.int32(0), params)
    greedy = sample_tokens(env.lm, params.lm_params, ids[None], mask[None], jax.random.key(0),
                           max_new_tokens=S, eos_ids=(env.delimiter_id, env.eos_id), pad_token_id=0, greedy=True)
    firsts, siblings = set(), set()
    for seed in range(6):  # any key: the first child under the root is the greedy step
        _, s1, *_ = step(jax.random.key(seed), s0, 0, params)  # Expand
        firsts.add(tuple(np.asarray(s1.tokens[1])[:int(s1.length[1])]))
        _, s2, *_ = step(jax.random.key(100 + seed), s1, 1, params)  # Branch: a second child of the root, sampled
        siblings.add(tuple(np.asarray(s2.tokens[2])[:int(s2.length[2])]))
        assert int(s2.parent[2]) == 0 and int(s2.children[0]) == 2
    g = np.asarray(greedy.tokens[0])[np.asarray(greedy.mask[0]) > 0]
    assert firsts == {tuple(g)}
    assert len(siblings) > 1  # sampled at temperature 2 from a random model: not one fixed step


def test_rule_branches_only_where_the_reward_model_doubts(setup):
    """search.imitation.threshold_rule (the imitation teacher and benchmarks/search/pgts_rule_search.py's
    rule), state by state: Expand a trusted step, Branch a doubted one while its parent has room for
    `extra` more children, Terminate on an answer line, and at the depth limit without one (where
    Terminate is closed) Branch, or Backtrack one level when no sibling is left."""
    import sys
    from pathlib import Path

    from jaxrl_hier.search.imitation import threshold_rule

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.search.pgts_rule_search import make_rule_runner

    tok, env, params, _ = setup
    act = threshold_rule(env)
    rule = (jnp.float32(0.5), jnp.int32(1))  # one extra sibling per node

    def choice(state, node, score):
        state = state.replace(current=node, score=state.score.at[node].set(score))
        return int(act(rule, env.observation(state), state, None))

    _, s = env.reset_to(0)
    s = put(env, s, 1, 0, "1+2=3\n", tok)
    assert choice(s, 1, 0.9) == 0 and choice(s, 1, 0.1) == 1  # trusted: Expand; doubted: Branch
    assert choice(put(env, s, 2, 0, "1+2=4\n", tok), 2, 0.1) == 0  # the root has 1 + 1 extra children: Expand
    assert choice(put(env, s, 2, 1, "#### 3", tok), 2, 0.9) == env.terminate_action
    s = put(env, put(env, s, 2, 1, "3+0=3\n", tok), 3, 2, "3-0=3\n", tok)
    assert choice(s, 3, 0.9) == 1  # depth limit, no answer line: a sibling
    assert choice(put(env, s, 4, 2, "3*1=3\n", tok), 3, 0.9) == 2  # ... none left (max_children): Backtrack(1)
    # the compiled runner of the benchmark: above every score each generated step gets one extra
    # sibling, so every search branches at the root (length_score < 1)
    run = make_rule_runner(env)
    always = jax.device_get(run((jnp.float32(2.0), jnp.int32(1)), params, jnp.arange(2), jax.random.key(3))[0])
    assert (always.children[:, 0] == 2).all()


def test_swap_siblings_change_the_greedy_step_where_the_generator_was_least_sure(setup):
    """sibling="swap": the k-th later child of a node keeps the first (greedy) child's tokens before
    that child's k-th smallest top-2 margin, puts the generator's second choice there and continues
    greedily; only the tokens after the kept ones count as generated, and any key gives the same."""
    import dataclasses

    from jaxrl_hier.llm.sampling import sample_tokens

    tok, env, params, _ = setup
    with pytest.raises(ConfigError, match="greedy_first_child"):
        dataclasses.replace(env, sibling="swap")
    with pytest.raises(ConfigError, match="sibling"):
        dataclasses.replace(env, sibling="resample", greedy_first_child=True)
    senv = dataclasses.replace(env, greedy_first_child=True, sibling="swap", max_children=3, temperature=2.0)
    step = jax.jit(senv.step)
    _, s0 = senv.reset_to(0)
    _, s1, *_ = step(jax.random.key(0), s0, 0, params)  # Expand: the greedy step
    _, s2, *_ = step(jax.random.key(1), s1, 1, params)  # Branch: swap at the least-confident token
    _, s3, *_ = step(jax.random.key(2), s2, 1, params)  # Branch again: the second least-confident
    _, s2b, *_ = step(jax.random.key(9), s1, 1, params)
    np.testing.assert_array_equal(np.asarray(s2b.tokens), np.asarray(s2.tokens))
    first = np.asarray(s1.tokens[1])[:int(s1.length[1])]
    margins = np.asarray(s1.margin[1])[:len(first)]
    ranked = np.argsort(margins, kind="stable")
    ids, mask = senv.prefix(s0, jnp.int32(0), params)
    used = int(s1.tokens_used)
    for node, state, pos in ((2, s2, ranked[0]), (3, s3, ranked[1])):
        alt = int(s1.runner_up[1, pos])
        assert alt != first[pos]
        # by hand: the root's prefix + the kept tokens, the runner-up forced, then greedy to the delimiter
        pre = np.concatenate([np.asarray(ids), first[:pos]])[pos:], np.concatenate([np.asarray(mask), np.ones(pos, int)])[pos:]
        cont = sample_tokens(env.lm, params.lm_params, pre[0][None], pre[1][None], jax.random.key(0),
                             max_new_tokens=S - pos, eos_ids=(env.delimiter_id, env.eos_id), pad_token_id=0,
                             greedy=True, first_tokens=jnp.array([alt]))
        gen = np.asarray(cont.tokens[0])[np.asarray(cont.mask[0]) > 0]
        expect = np.concatenate([first[:pos], gen])
        got = np.asarray(state.tokens[node])[:int(state.length[node])]
        np.testing.assert_array_equal(got, expect)
        assert int(state.parent[node]) == 0 and int(state.children[0]) == node
        used += len(gen)
        assert int(state.tokens_used) == used
        np.testing.assert_allclose(float(state.logp[node]),
                                   (np.asarray(s1.token_logp[1])[:pos].sum() + np.asarray(cont.logprobs[0]).sum())
                                   / len(expect), atol=1e-5)


def test_the_reward_model_is_told_where_the_prompt_ends(setup):
    """The env passes each path's number of BOS + prompt tokens (what LikelihoodVerifier skips)."""
    import dataclasses

    tok, env, params, _ = setup
    penv = dataclasses.replace(env, score_fn=lambda rm_params, ids, mask, prompt_tokens: prompt_tokens / 100.0)
    _, s0 = penv.reset_to(1)
    _, s1, *_ = jax.jit(penv.step)(jax.random.key(0), s0, 0, params)
    assert float(s1.score[1]) == pytest.approx((1 + len("3-1=")) / 100.0)
