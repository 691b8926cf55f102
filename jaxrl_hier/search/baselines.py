"""Evaluation of PGTS and its baselines on the same held-out problems with the same generator.

Each method returns per-problem correctness and tokens generated (every sampled token counts,
including those of abandoned branches):

- `cot_greedy`: one greedy solution.
- `sample_solutions` + `self_consistency` / `best_of_n`: N sampled solutions at the search
  temperature; majority vote over their answers, or the one the reward model scores highest.
- `mcts`: UCT over the same step actions as the search env (a child is one generated step; the
  reward model's score is the value of a new node), `simulations` expansions per problem, then the
  final node with the highest score answers (a tree without one is first completed from its most
  visited leaf, those tokens counted).
- `run_search`: the trained PGTS policy (greedy over its action distribution) driving the search
  env, one compiled program vmapped over the problems.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_hier.llm.sampling import generate
from jaxrl_hier.llm_rl.data import encode_prompts, fixed_batches, special_ids
from jaxrl_hier.tasks import extract_answer
from jaxrl_hier.tasks.answers import canonical_number
from jaxrl_hier.tasks.jax_rewards import decode_completions


def _batched_generate(lm, params, tokenizer, prompts: Sequence[str], *, prompt_length: int, max_new_tokens: int,
                      temperature: float, key: jax.Array, batch_size: int = 256) -> tuple[list[str], np.ndarray, list]:
    """Completions (texts, token counts, token ids up to EOS) of prompts, one static batch shape."""
    pad, _, eos = special_ids(tokenizer)
    enc = encode_prompts(tokenizer, prompts, prompt_length)
    texts, lengths, ids = [], [], []
    for start, n, (a, m) in fixed_batches(batch_size, enc.ids, enc.mask):
        out = generate(lm, params, a, m, key=jax.random.fold_in(key, start), max_new_tokens=max_new_tokens,
                       temperature=temperature, eos_token_id=eos, pad_token_id=pad, min_bucket=prompt_length)
        tok, msk = np.asarray(out.tokens)[:n], np.asarray(out.mask)[:n]
        texts += decode_completions(tokenizer, tok, msk)
        lengths += msk.sum(-1).tolist()
        ids += [row[mm > 0].tolist() for row, mm in zip(tok, msk)]
    return texts, np.asarray(lengths), ids


def summarize(name: str, correct: Sequence[bool], tokens: Sequence[float], **extra: Any) -> dict:
    return {"method": name, "accuracy": float(np.mean(correct)), "tokens": float(np.mean(tokens)),
            "problems": len(correct), **extra}


def cot_greedy(lm, params, tokenizer, task, problems, *, prompt_length: int, max_new_tokens: int) -> dict:
    texts, lengths, _ = _batched_generate(lm, params, tokenizer, [p.prompt for p in problems],
                                          prompt_length=prompt_length, max_new_tokens=max_new_tokens,
                                          temperature=0.0, key=jax.random.key(0))
    correct = [task.is_correct(p, t) for p, t in zip(problems, texts)]
    return summarize("CoT greedy", correct, lengths, completions=texts)


def sample_solutions(lm, params, tokenizer, problems, n: int, *, prompt_length: int, max_new_tokens: int,
                     temperature: float, seed: int) -> tuple[list[list[str]], np.ndarray, list[list[list[int]]]]:
    """n sampled solutions per problem: texts [P][n], token counts [P, n], ids [P][n]."""
    prompts = [p.prompt for p in problems for _ in range(n)]
    texts, lengths, ids = _batched_generate(lm, params, tokenizer, prompts, prompt_length=prompt_length,
                                            max_new_tokens=max_new_tokens, temperature=temperature,
                                            key=jax.random.key(seed))
    per = lambda xs: [xs[i * n:(i + 1) * n] for i in range(len(problems))]  # noqa: E731
    return per(texts), np.asarray(lengths).reshape(len(problems), n), per(ids)


def majority_answer(texts: Sequence[str]) -> str | None:
    """The most common well-formed answer (ties: the one seen first), None if there is none."""
    answers = [canonical_number(a) for a in (extract_answer(t) for t in texts) if a is not None]
    answers = [a for a in answers if a is not None]
    if not answers:
        return None
    counts = Counter(answers)
    best = max(counts.values())
    return next(a for a in answers if counts[a] == best)


def self_consistency(task, problems, texts: list[list[str]], lengths: np.ndarray, n: int) -> dict:
    correct = []
    for p, ts in zip(problems, texts):
        answer = majority_answer(ts[:n])
        correct.append(answer is not None and task.is_correct(p, f"#### {answer}"))
    return summarize(f"self-consistency@{n}", correct, lengths[:, :n].sum(-1), n=n)


def best_of_n(task, problems, texts: list[list[str]], lengths: np.ndarray, scores: np.ndarray, n: int) -> dict:
    """The solution the reward model scores highest among the first n."""
    pick = np.argmax(scores[:, :n], axis=-1)
    correct = [task.is_correct(p, ts[i]) for p, ts, i in zip(problems, texts, pick)]
    return summarize(f"best-of-{n} (RM)", correct, lengths[:, :n].sum(-1), n=n)


def score_solutions(rm, rm_params, tokenizer, problems, ids: list[list[list[int]]], *, prompt_length: int,
                    step_tokens: int, max_depth: int) -> np.ndarray:
    """Reward-model scores [P, n] of whole sampled solutions (the last prefix of each)."""
    from jaxrl_hier.search.reward_model import build_path_data, score_paths

    pad, _, eos = special_ids(tokenizer)
    n = len(ids[0])
    flat_ids = [x for row in ids for x in row]
    enc = encode_prompts(tokenizer, [p.prompt for p in problems for _ in range(n)], prompt_length)
    data = build_path_data(enc.ids, enc.mask, flat_ids, [False] * len(flat_ids),
                           delimiter_id=tokenizer.convert_tokens_to_ids("\n"), eos_id=eos, pad_id=pad,
                           step_tokens=step_tokens, max_depth=max_depth)
    last = np.r_[data.group[1:] != data.group[:-1], True]
    scores = np.zeros(len(flat_ids), np.float32)
    scores[data.group[last]] = score_paths(rm, rm_params, data.ids[last], data.mask[last], data.prompt_tokens[last])
    return scores.reshape(len(problems), n)


# ----------------------------------------------------------------------------- PGTS policy


def make_runner(env, act, max_steps: int):
    """A jitted `run(act_params, env_params, problem_ids [P], key) -> (final TreeState [P, ...], actions [P])`:
    `act(act_params, obs, state, key) -> action` drives one search per problem until it ends (or
    `max_steps` actions). The PGTS policy is one such `act`; a hand-written rule is another."""

    def one(act_params, env_params, problem, key):
        obs, state = env.reset_to(problem)

        def cond(carry):
            _, state, i, _ = carry
            return (~state.done) & (i < max_steps)

        def body(carry):
            obs, state, i, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            obs, state, *_ = env.step(k_env, state, act(act_params, obs, state, k_act), env_params)
            return obs, state, i + 1, key

        _, state, steps, _ = jax.lax.while_loop(cond, body, (obs, state, jnp.int32(0), key))
        return state, steps

    def run(act_params, env_params, problems, key):
        keys = jax.random.split(key, problems.shape[0])
        return jax.vmap(one, in_axes=(None, None, 0, 0))(act_params, env_params, problems, keys)

    return jax.jit(run)


def make_search_runner(env, network, max_steps: int, greedy: bool = True):
    """`make_runner` with the PGTS policy: `run(net_params, env_params, problem_ids [P], key)`."""

    def act(net_params, obs, state, key):
        pi, _ = network.apply(net_params, obs)
        return jnp.argmax(pi.logits, -1) if greedy else pi.sample(seed=key)

    return make_runner(env, act, max_steps)


def run_search(runner, net_params, env_params, num_problems: int, seed: int = 0) -> tuple[Any, dict]:
    """Final trees of problems 0..num_problems-1 of `env_params` and the PGTS summary row."""
    states, steps = runner(net_params, env_params, jnp.arange(num_problems), jax.random.key(seed))
    states = jax.device_get(states)
    row = summarize("PGTS (policy)", np.asarray(states.correct), np.asarray(states.tokens_used),
                    nodes=float(np.mean(states.num_nodes)), actions=float(np.mean(steps)))
    return states, row


# ----------------------------------------------------------------------------- MCTS
#
# The tree bookkeeping of `mcts` (selection, backup, the leaf a tree without an answer is completed
# from) runs on the host, one search at a time: `tree` is a host TreeState of one search (or anything
# with its parent, depth, final, children and num_nodes), `visits` and `value` float arrays [N].


def tree_children(tree, node: int) -> list[int]:
    """The children of `node`, oldest first."""
    return [k for k in range(1, int(tree.num_nodes)) if tree.parent[k] == node]


def uct_score(value: float, visits: float, parent_visits: float, c: float) -> float:
    """Q + c sqrt(ln N_parent / N_child) of a child with `visits` and summed `value` (the 1e-9 only
    guards the division: `mcts` backs a new child up at once, so its children have visits >= 1)."""
    return value / max(visits, 1e-9) + c * math.sqrt(math.log(max(parent_visits, 1)) / max(visits, 1e-9))


def select_path(tree, visits: np.ndarray, value: np.ndarray, *, c: float, max_depth: int,
                max_children: int) -> list[int]:
    """One simulation's descent: from the root, while the node is fully expanded (max_children),
    not final and above max_depth, to its child of highest `uct_score` (ties: the oldest). Returns
    the path root .. the node where it stopped."""
    path = [0]
    while True:
        node = path[-1]
        if tree.final[node] or tree.depth[node] >= max_depth or tree.children[node] < max_children:
            return path
        path.append(max(tree_children(tree, node),
                        key=lambda k: uct_score(value[k], visits[k], visits[node], c)))


def backup(visits: np.ndarray, value: np.ndarray, path: Sequence[int], v: float) -> None:
    """One visit and the value `v` (the new node's score, or the re-valued leaf's) added to every
    node on `path`, in place."""
    for node in path:
        visits[node] += 1
        value[node] += v


def most_visited_leaf(tree, visits: np.ndarray, value: np.ndarray) -> int:
    """The leaf reached from the root by the most visited child (ties: the higher summed value,
    then the oldest): where a tree without a final node is completed from."""
    node = 0
    while kids := tree_children(tree, node):
        node = max(kids, key=lambda k: (visits[k], value[k]))
    return node


def mcts(env, env_params, num_problems: int, *, simulations: int, c: float, seed: int = 0) -> tuple[Any, dict]:
    """UCT over step actions (see the module docstring); `env` needs max_nodes >= simulations + 1 +
    max_depth (the simulations, then the completion of a tree that holds no answer yet).

    Selection (`select_path`) descends from the root by UCT while the node is fully expanded
    (max_children) and not final; a node with room gets a new generated child (batched over
    problems: one compiled call per simulation), whose reward-model score is the value backed up
    along the path (`backup`). Final nodes and nodes at max_depth are re-valued, not expanded.
    """
    expand = jax.jit(jax.vmap(env.generate_child, in_axes=(0, 0, 0, None)))
    reset = jax.vmap(env.reset_to)
    _, states = reset(jnp.arange(num_problems))
    p_idx = np.arange(num_problems)
    visits = np.zeros((num_problems, env.max_nodes))
    value = np.zeros((num_problems, env.max_nodes))
    key = jax.random.key(seed)
    one = lambda tree, p: jax.tree.map(lambda x: x[p], tree)  # noqa: E731 (one search of a batch)
    for sim in range(simulations):
        host = jax.device_get(states)
        paths = [select_path(one(host, p), visits[p], value[p], c=c, max_depth=env.max_depth,
                             max_children=env.max_children) for p in p_idx]
        leaves = np.array([path[-1] for path in paths], np.int32)
        grow = np.array([not host.final[p, leaves[p]] and host.depth[p, leaves[p]] < env.max_depth for p in p_idx])
        new = jax.device_get(expand(jax.random.split(jax.random.fold_in(key, sim), num_problems), states,
                                    jnp.asarray(leaves), env_params))
        states = jax.tree.map(lambda a, b: jnp.asarray(np.where(grow.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)),
                              new, host)
        for p in p_idx:
            if grow[p]:
                child = int(host.num_nodes[p])
                paths[p].append(child)
                v = float(new.score[p, child])
            else:
                v = float(host.score[p, leaves[p]])
            backup(visits[p], value[p], paths[p], v)
    # The answer: the final node with the highest score. A tree with no final node yet is completed
    # from its most visited leaf by generating steps until one holds an answer (tokens counted).
    host = jax.device_get(states)
    picked = []
    for p in p_idx:
        tree = one(host, p)
        finals = [k for k in range(1, int(tree.num_nodes)) if tree.final[k]]
        picked.append(max(finals, key=lambda k: tree.score[k]) if finals
                      else most_visited_leaf(tree, visits[p], value[p]))
    picked = np.asarray(picked, np.int32)
    for r in range(env.max_depth):
        need = np.array([not host.final[p, picked[p]] and host.depth[p, picked[p]] < env.max_depth
                         and host.num_nodes[p] < env.max_nodes for p in p_idx])
        if not need.any():
            break
        new = jax.device_get(expand(jax.random.split(jax.random.fold_in(key, simulations + r), num_problems), states,
                                    jnp.asarray(picked), env_params))
        picked = np.where(need, np.asarray(host.num_nodes), picked).astype(np.int32)
        host = jax.tree.map(lambda a, b: np.where(need.reshape((-1,) + (1,) * (np.ndim(a) - 1)), a, b), new, host)
        states = jax.tree.map(jnp.asarray, host)
    answers = jax.jit(jax.vmap(env.is_correct, in_axes=(0, 0, None)))(states, jnp.asarray(picked), env_params)
    correct = np.asarray(answers)
    states = states.replace(current=jnp.asarray(picked, jnp.int32), correct=jnp.asarray(correct))
    return jax.device_get(states), summarize(f"MCTS ({simulations} simulations)", correct,
                                             np.asarray(host.tokens_used), simulations=simulations)


__all__ = ["backup", "best_of_n", "cot_greedy", "majority_answer", "make_runner", "make_search_runner", "mcts",
           "most_visited_leaf", "run_search", "sample_solutions", "score_solutions", "select_path", "self_consistency",
           "summarize", "tree_children", "uct_score"]
