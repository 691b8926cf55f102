"""The PGTS search environment: a tree-search MDP over an LLM's reasoning steps, all in JAX.

One episode searches one problem. The state is a fixed-capacity tree (static shapes throughout):

    node 0            the root: the prompt (no step tokens)
    node i >= 1       one reasoning step (up to `step_tokens` tokens, ending at the step delimiter
                      "\\n" or at EOS), with its parent, depth, mean token log-likelihood under the
                      generator, the generator's hidden state at its last token (the node feature),
                      the reward model's score of the path through it, and whether it holds the
                      answer line ("####", or EOS: a final node)

Actions (`num_actions = max_depth + 3`):

    0            Expand: generate a child of the current node; the child becomes current
    1            Branch: generate a sibling of the current node (another child of its parent)
    2 .. D+1     Backtrack(k), k = a - 1 = 1..D: the k-th ancestor becomes current
    D + 2        Terminate: read the answer off the path to the current node

Masks (`action_mask`, travelling in the observation): Expand needs a free node, depth < max_depth,
a non-final current node and fewer than `max_children` children; Branch needs a non-root current
node, a free node and a parent with fewer than `max_children` children; Backtrack(k) needs
k <= depth; Terminate is allowed at a final node, or when nothing else is (so some action is
always valid). An invalid action (a policy never samples one: its logit is masked) acts as
Terminate.

Generation runs `jaxrl_hier.llm.sampling.sample_tokens` on the prompt plus the steps on the path
to the new node's parent (the prefix is reassembled from the tree each time, left-padded to the
static length `prompt_length + max_depth * step_tokens`). The reward model scores the path
through the new node with `score_fn(rm_params, ids [1, L], mask [1, L], prompt_tokens [1]) -> [1]` in
[0, 1] (`prompt_tokens`: how many of the real tokens are BOS + prompt).

Rewards follow the official PGTS code: every move of the current node is rewarded by the change
of the reward model's score (a potential, so the sum telescopes to the score of the node where
the search stops), minus the action's cost (expand 0.1, branch 0.2, backtrack 0.5, terminate 0 by
default); Terminate adds `correct_reward` when the answer is right. The episode also ends when
the tree is full (`max_nodes`) or `token_budget` tokens were generated: the answer is then read
off the current path as if Terminate had been chosen (without its cost), and the episode counts
as terminated (the budget is part of the MDP, visible in the observation).

The env implements the `jaxrl_hier.envs` protocol, so `jaxrl_hier.algorithms.ppo` trains a policy
on it: observations are `{"obs": {...graph arrays...}, "action_mask": bool[A]}`, and the single
"achievement" `correct` makes PPO log the training accuracy of finished searches.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.envs.base import Environment
from jaxrl_hier.envs.spaces import Box, Discrete
from jaxrl_hier.llm.sampling import sample_tokens
from jaxrl_hier.tasks.jax_rewards import AnswerTokenSpec, answer_rewards

EXPAND, BRANCH = 0, 1
#: node features (besides the hidden state): depth / max_depth, score, is current, is final, is root
NODE_FEATURES = 5
#: edge features of the edge parent -> node: mean token log-prob of the step, its length / step_tokens
EDGE_FEATURES = 2
#: global features: nodes used / max_nodes, tokens used / token_budget
GLOBAL_FEATURES = 2


@struct.dataclass
class SearchParams:
    """Arrays the env reads (traced: the PPO runner carries them). P problems, prompts of length Lp."""

    lm_params: Any  # generator weights
    rm_params: Any  # reward-model weights (whatever `score_fn` takes)
    prompt_ids: jax.Array  # int32 [P, Lp], left-padded (BOS + prompt)
    prompt_mask: jax.Array  # int32 [P, Lp]
    answer_ids: jax.Array  # int32 [P, A], -1 padded (jax_rewards.encode_answers)
    costs: jax.Array  # float32 [4]: expand, branch, backtrack, terminate
    correct_reward: jax.Array  # float32 scalar
    spec: AnswerTokenSpec


@struct.dataclass
class TreeState:
    problem: jax.Array  # int32: index into the problem arrays
    tokens: jax.Array  # int32 [N, S] step tokens (padding after `length`)
    length: jax.Array  # int32 [N]
    parent: jax.Array  # int32 [N], -1 for the root and unused nodes
    depth: jax.Array  # int32 [N]
    logp: jax.Array  # float32 [N] mean token log-prob of the step
    hidden: jax.Array  # float32 [N, H] generator hidden state at the step's last token
    score: jax.Array  # float32 [N] reward-model score of the path through the node
    token_logp: jax.Array  # float32 [N, S] each step token's log-prob under the generator
    runner_up: jax.Array  # int32 [N, S] the generator's second choice at each step token
    margin: jax.Array  # float32 [N, S] its first-minus-second log-prob margin there
    children: jax.Array  # int32 [N]
    final: jax.Array  # bool [N] the step holds the answer line (or EOS)
    num_nodes: jax.Array  # int32
    current: jax.Array  # int32
    tokens_used: jax.Array  # int32 generated so far
    correct: jax.Array  # bool: the search ended with a right answer
    done: jax.Array  # bool


@dataclasses.dataclass(frozen=True, eq=False)
class SearchEnv(Environment):
    """See the module docstring. `lm` is the generator (a jaxrl_hier.llm LanguageModel), `score_fn`
    the reward model, `params` (a `SearchParams`) is built by `make_params`."""

    lm: Any
    score_fn: Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
    prompt_length: int
    max_nodes: int = 16
    max_depth: int = 5
    max_children: int = 3
    step_tokens: int = 10
    token_budget: int = 60
    temperature: float = 1.0
    # a node's first child is the generator's greedy step, its siblings (Branch) are sampled: a search
    # that only expands is then greedy chain-of-thought, and branching is the only way to leave it
    greedy_first_child: bool = False
    # how a node's later children are made: "sample" draws them at `temperature`; "swap" takes the
    # first child's step, replaces its k-th least-confident token (smallest top-2 margin) by the
    # generator's second choice there and continues greedily (the k-th sibling), so siblings differ
    # from the greedy step exactly where the generator nearly chose otherwise
    sibling: str = "sample"
    delimiter_id: int = 0  # the step delimiter ("\n")
    eos_id: int = 2
    pad_id: int = 0
    final_ids: tuple[int, ...] = ()  # tokens that make a step final besides EOS ("#")
    name: str = "PGTS-v0"
    achievement_names: tuple[str, ...] = ("correct",)

    def __post_init__(self):
        for key, low in (("max_nodes", 2), ("max_depth", 1), ("max_children", 1), ("step_tokens", 1),
                         ("token_budget", 1), ("prompt_length", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"search env: {key} must be an integer >= {low}, got {value!r}.")
        if not self.temperature > 0:
            raise ConfigError(f"search env: temperature must be > 0, got {self.temperature}.")
        if self.sibling not in ("sample", "swap"):
            raise ConfigError(f"search env: sibling must be 'sample' or 'swap', got {self.sibling!r}.")
        if self.sibling == "swap" and not self.greedy_first_child:
            raise ConfigError("search env: sibling 'swap' changes the greedy first child's step, so it needs "
                              "greedy_first_child: true.")

    # ------------------------------------------------------------------ sizes
    @property
    def num_actions(self) -> int:
        return self.max_depth + 3

    @property
    def terminate_action(self) -> int:
        return self.max_depth + 2

    @property
    def prefix_length(self) -> int:
        return self.prompt_length + self.max_depth * self.step_tokens

    @property
    def hidden_size(self) -> int:
        return int(self.lm.config.hidden_size)

    @property
    def default_params(self) -> SearchParams:
        raise ConfigError("SearchEnv has no default params: build them with make_params(...).")

    def make_params(self, lm_params: Any, rm_params: Any, prompt_ids: Any, prompt_mask: Any, answer_ids: Any,
                    spec: AnswerTokenSpec, costs: tuple[float, float, float, float] = (0.1, 0.2, 0.5, 0.0),
                    correct_reward: float = 1.0) -> SearchParams:
        prompt_ids, prompt_mask = np.asarray(prompt_ids, np.int32), np.asarray(prompt_mask, np.int32)
        if prompt_ids.shape != prompt_mask.shape or prompt_ids.ndim != 2 or prompt_ids.shape[1] != self.prompt_length:
            raise ConfigError(f"search env: prompts must be [P, prompt_length={self.prompt_length}], got "
                              f"{prompt_ids.shape} and mask {prompt_mask.shape}.")
        if len(costs) != 4:
            raise ConfigError(f"search env: costs must be 4 numbers (expand, branch, backtrack, terminate), got {costs}.")
        return SearchParams(lm_params, rm_params, jnp.asarray(prompt_ids), jnp.asarray(prompt_mask),
                            jnp.asarray(answer_ids, jnp.int32), jnp.asarray(costs, jnp.float32),
                            jnp.float32(correct_reward), spec)

    # ------------------------------------------------------------------ protocol
    def observation_space(self, params: SearchParams) -> dict:
        n = self.max_nodes
        graph = {"hidden": Box(-jnp.inf, jnp.inf, (n, self.hidden_size)),
                 "nodes": Box(-jnp.inf, jnp.inf, (n, NODE_FEATURES)),
                 "edges": Box(-jnp.inf, jnp.inf, (n, EDGE_FEATURES)),
                 "parent": Box(-1, n - 1, (n,), jnp.int32),
                 "valid": Box(0, 1, (n,), jnp.bool_),
                 "globals": Box(0.0, 1.0, (GLOBAL_FEATURES,))}
        return {"obs": graph, "action_mask": Box(0, 1, (self.num_actions,), jnp.bool_)}

    def action_space(self, params: SearchParams) -> Discrete:
        return Discrete(self.num_actions)

    def achievements(self, state: TreeState) -> jax.Array:
        return state.correct[None]

    def reset(self, key: jax.Array, params: SearchParams) -> tuple[dict, TreeState]:
        problem = jax.random.randint(key, (), 0, params.prompt_ids.shape[0])
        return self.reset_to(problem)

    def reset_to(self, problem: jax.Array) -> tuple[dict, TreeState]:
        """The empty tree (root only) for problem index `problem`."""
        n, s = self.max_nodes, self.step_tokens
        state = TreeState(
            problem=jnp.asarray(problem, jnp.int32), tokens=jnp.full((n, s), self.pad_id, jnp.int32),
            length=jnp.zeros(n, jnp.int32), parent=jnp.full(n, -1, jnp.int32), depth=jnp.zeros(n, jnp.int32),
            logp=jnp.zeros(n, jnp.float32), hidden=jnp.zeros((n, self.hidden_size), jnp.float32),
            score=jnp.zeros(n, jnp.float32), token_logp=jnp.zeros((n, s), jnp.float32),
            runner_up=jnp.zeros((n, s), jnp.int32), margin=jnp.zeros((n, s), jnp.float32),
            children=jnp.zeros(n, jnp.int32), final=jnp.zeros(n, bool),
            num_nodes=jnp.int32(1), current=jnp.int32(0), tokens_used=jnp.int32(0), correct=jnp.bool_(False),
            done=jnp.bool_(False))
        return self.observation(state), state

    # ------------------------------------------------------------------ masks and observations
    def action_mask(self, state: TreeState) -> jax.Array:
        """bool [num_actions]: which actions are valid in `state` (module docstring)."""
        cur = state.current
        room = state.num_nodes < self.max_nodes
        depth = state.depth[cur]
        parent = state.parent[cur]
        expand = room & (depth < self.max_depth) & ~state.final[cur] & (state.children[cur] < self.max_children)
        branch = room & (cur != 0) & (state.children[jnp.maximum(parent, 0)] < self.max_children)
        backtrack = jnp.arange(1, self.max_depth + 1) <= depth
        others = jnp.concatenate([jnp.stack([expand, branch]), backtrack])
        terminate = state.final[cur] | ~others.any()
        return jnp.concatenate([others, terminate[None]])

    def observation(self, state: TreeState) -> dict:
        n = self.max_nodes
        valid = jnp.arange(n) < state.num_nodes
        current = jnp.arange(n) == state.current
        nodes = jnp.stack([state.depth / self.max_depth, state.score, current, state.final, jnp.arange(n) == 0],
                          axis=-1).astype(jnp.float32) * valid[:, None]
        edges = jnp.stack([state.logp, state.length / self.step_tokens], axis=-1).astype(jnp.float32) * valid[:, None]
        glob = jnp.stack([state.num_nodes / self.max_nodes,
                          jnp.minimum(state.tokens_used / self.token_budget, 1.0)]).astype(jnp.float32)
        graph = {"hidden": state.hidden * valid[:, None], "nodes": nodes, "edges": edges,
                 "parent": jnp.where(valid, state.parent, -1), "valid": valid, "globals": glob}
        return {"obs": graph, "action_mask": self.action_mask(state)}

    # ------------------------------------------------------------------ paths and prefixes
    def path_nodes(self, state: TreeState, node: jax.Array) -> jax.Array:
        """int32 [max_depth]: entry d - 1 is the node at depth d on the path root -> `node` (-1 past it)."""
        d_max = self.max_depth

        def body(_, carry):
            path, n = carry
            d = state.depth[n]
            path = path.at[jnp.where(d >= 1, d - 1, d_max)].set(n, mode="drop")
            return path, jnp.where(d >= 1, state.parent[n], n)

        return jax.lax.fori_loop(0, d_max, body, (jnp.full(d_max, -1, jnp.int32), jnp.asarray(node, jnp.int32)))[0]

    def path_tokens(self, state: TreeState, node: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The steps on the path to `node`, concatenated: ids and mask [max_depth * step_tokens],
        right-padded (real tokens first)."""
        nodes = self.path_nodes(state, node)
        safe = jnp.maximum(nodes, 0)
        toks = state.tokens[safe].reshape(-1)
        mask = ((jnp.arange(self.step_tokens)[None, :] < state.length[safe][:, None]) & (nodes >= 0)[:, None]).reshape(-1)
        order = jnp.argsort(~mask, stable=True)  # real tokens first, in path order
        return jnp.where(mask[order], toks[order], self.pad_id), mask[order].astype(jnp.int32)

    def prefix(self, state: TreeState, node: jax.Array, params: SearchParams, tail: jax.Array | None = None,
               tail_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """BOS + prompt + the steps on the path to `node` (+ the real `tail` tokens, where `tail_mask`
        is 1): ids and mask [prefix_length], left-padded. A tail fits when `node` is above the depth
        limit: the path then leaves at least one step's worth of padding."""
        steps, steps_mask = self.path_tokens(state, node)
        ids = jnp.concatenate([params.prompt_ids[state.problem], steps] + ([] if tail is None else [tail]))
        mask = jnp.concatenate([params.prompt_mask[state.problem], steps_mask]
                               + ([] if tail is None else [tail_mask.astype(jnp.int32)]))
        order = jnp.argsort(mask, stable=True)[len(mask) - self.prefix_length:]  # padding first, then the tokens
        return jnp.where(mask[order] > 0, ids[order], self.pad_id), mask[order]

    def is_correct(self, state: TreeState, node: jax.Array, params: SearchParams) -> jax.Array:
        """Whether the answer line on the path to `node` equals the problem's answer."""
        ids, mask = self.path_tokens(state, node)
        out = answer_rewards(ids[None], mask[None], params.answer_ids[state.problem][None], params.spec)
        return out["correct"][0] > 0

    # ------------------------------------------------------------------ growing the tree
    def swap_point(self, state: TreeState, parent: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """For the next child of `parent` with `sibling="swap"`: (first child, how many of its tokens
        to keep, the token forced after them; -1 = none). The k-th later child (k >= 1) swaps the
        first child's k-th least-confident token; the first child itself forces nothing."""
        k = state.children[parent]
        nodes = jnp.arange(self.max_nodes)
        first = jnp.argmax((state.parent == parent) & (nodes > 0) & (nodes < state.num_nodes))
        steps = jnp.arange(self.step_tokens)
        order = jnp.argsort(jnp.where(steps < state.length[first], state.margin[first], jnp.inf), stable=True)
        pos = order[jnp.clip(k - 1, 0, jnp.maximum(state.length[first] - 1, 0))]
        swap = (k > 0) & (self.sibling == "swap")
        return first, jnp.where(swap, pos, 0), jnp.where(swap, state.runner_up[first, pos], -1)

    def generate_child(self, key: jax.Array, state: TreeState, parent: jax.Array, params: SearchParams) -> TreeState:
        """Generate one step under `parent`, write it as node `num_nodes` (scored by the reward
        model) and make it current. Callers check that a node is free."""
        s = self.step_tokens
        steps = jnp.arange(s)
        first, keep, forced = self.swap_point(state, parent)
        # the prefix: the path to the parent, then (a swap) the first child's tokens before the swap
        ids, mask = self.prefix(state, parent, params, state.tokens[first], steps < keep)

        # with greedy_first_child the sampler takes the greedy flag as a traced value: one model pass
        # either way (a lax.cond between a greedy and a sampled call runs both under vmap)
        greedy = ((state.children[parent] == 0) | (self.sibling == "swap")) if self.greedy_first_child else False
        out = sample_tokens(self.lm, params.lm_params, ids[None], mask[None], key,
                            max_new_tokens=s, temperature=self.temperature,
                            eos_ids=(self.delimiter_id, self.eos_id), pad_token_id=self.pad_id,
                            return_hidden=True, greedy=greedy, first_tokens=forced[None],
                            return_runner_up=True)
        # the step: the kept tokens, then the generated ones (cut at step_tokens)
        gen = jnp.clip(steps - keep, 0, s - 1)
        kept = steps < keep

        def join(old, new):
            return jnp.where(kept, old, new[0][gen])

        m = jnp.where(kept, 1, out.mask[0][gen] * (steps >= keep))
        toks = jnp.where(m > 0, join(state.tokens[first], out.tokens), self.pad_id)
        token_logp = join(state.token_logp[first], out.logprobs) * m
        length = m.sum()
        last = jnp.maximum(length - 1 - keep, 0)  # the last token is always a generated one
        final = jnp.any((m > 0) & jnp.isin(toks, jnp.asarray((self.eos_id, *self.final_ids), jnp.int32)))
        new = state.num_nodes
        state = state.replace(
            tokens=state.tokens.at[new].set(toks), length=state.length.at[new].set(length),
            parent=state.parent.at[new].set(parent), depth=state.depth.at[new].set(state.depth[parent] + 1),
            logp=state.logp.at[new].set(token_logp.sum() / jnp.maximum(length, 1)),
            token_logp=state.token_logp.at[new].set(token_logp),
            runner_up=state.runner_up.at[new].set(join(state.runner_up[first], out.runner_up)),
            margin=state.margin.at[new].set(join(state.margin[first], out.margin)),
            hidden=state.hidden.at[new].set(out.hidden[0, last].astype(jnp.float32)),
            children=state.children.at[parent].add(1), final=state.final.at[new].set(final),
            num_nodes=new + 1, current=new, tokens_used=state.tokens_used + length - keep)
        path_ids, path_mask = self.prefix(state, new, params)
        prompt_tokens = params.prompt_mask[state.problem].sum()[None]
        score = self.score_fn(params.rm_params, path_ids[None], path_mask[None], prompt_tokens)[0]
        return state.replace(score=state.score.at[new].set(score.astype(jnp.float32)))

    def ancestor(self, state: TreeState, node: jax.Array, k: jax.Array) -> jax.Array:
        """The k-th ancestor of `node` (k <= depth)."""
        return jax.lax.fori_loop(0, self.max_depth,
                                 lambda i, n: jnp.where(i < k, jnp.maximum(state.parent[n], 0), n), node)

    def step(self, key: jax.Array, state: TreeState, action: jax.Array, params: SearchParams):
        action = jnp.asarray(action, jnp.int32)
        valid = self.action_mask(state)[action]
        action = jnp.where(valid, action, self.terminate_action)
        cur = state.current
        old_score = state.score[cur]
        generates = action <= BRANCH
        gen_parent = jnp.where(action == EXPAND, cur, jnp.maximum(state.parent[cur], 0))
        state = jax.lax.cond(generates, lambda s: self.generate_child(key, s, gen_parent, params), lambda s: s, state)
        k = action - 1
        is_backtrack = (action >= 2) & (action < self.terminate_action)
        state = state.replace(current=jnp.where(is_backtrack, self.ancestor(state, cur, k), state.current))
        cost = params.costs[jnp.where(action == EXPAND, 0, jnp.where(action == BRANCH, 1,
                                      jnp.where(is_backtrack, 2, 3)))]
        reward = state.score[state.current] - old_score - cost
        exhausted = (state.num_nodes >= self.max_nodes) | (state.tokens_used >= self.token_budget)
        done = (action == self.terminate_action) | exhausted
        correct = done & self.is_correct(state, state.current, params)
        reward = reward + jnp.where(correct, params.correct_reward, 0.0)
        state = state.replace(correct=correct, done=done)
        info = {"tokens": state.tokens_used, "nodes": state.num_nodes}
        return self.observation(state), state, reward.astype(jnp.float32), done, jnp.bool_(False), info


def render_tree(env: SearchEnv, state: Any, tokenizer: Any, prompt: str = "", answer: str = "") -> str:
    """A text picture of one searched tree (host-side; `state` of one env): every node with its
    step, reward-model score and step log-prob, the path to where the search stopped marked `*`."""
    s = jax.tree.map(np.asarray, state)
    n = int(s.num_nodes)
    on_path = set()
    node = int(s.current)
    while node > 0:
        on_path.add(node)
        node = int(s.parent[node])
    children: dict[int, list[int]] = {}
    for i in range(1, n):
        children.setdefault(int(s.parent[i]), []).append(i)
    lines = [f"problem: {prompt!r}  answer: {answer}  nodes: {n}  tokens: {int(s.tokens_used)}  "
             f"stopped at node {int(s.current)}  correct: {bool(s.correct)}", "* [0] <prompt>"]

    def walk(i: int, indent: int) -> None:
        for c in children.get(i, []):
            text = tokenizer.decode(s.tokens[c, :int(s.length[c])].tolist(), skip_special_tokens=True)
            mark = "*" if c in on_path else " "
            lines.append(f"{mark} {'  ' * indent}[{c}] {text.rstrip()!r}  score={float(s.score[c]):.2f} "
                         f"logp={float(s.logp[c]):.2f}" + ("  (final)" if s.final[c] else ""))
            walk(c, indent + 1)

    walk(0, 1)
    return "\n".join(lines)


__all__ = ["SearchEnv", "SearchParams", "TreeState", "render_tree", "EXPAND", "BRANCH", "NODE_FEATURES",
           "EDGE_FEATURES", "GLOBAL_FEATURES"]
