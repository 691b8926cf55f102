"""The PGTS reward models: score a partial reasoning path in [0, 1].

Two kinds share one interface, `score(params, ids, mask, prompt_tokens) -> [B]` (`prompt_tokens` [B]:
how many of each row's real tokens are BOS + prompt, so a scorer can tell the steps apart):

- `RewardModel`, the paper's phase 1: a classifier trained on the generator's sampled paths.
- `LikelihoodVerifier`: a decoder trained by SFT on the task's worked solutions; a path scores the
  probability of its least likely step token under it (a wrong step is one the verifier would not
  have written). Nothing is trained on labels; the same held-out labelled paths measure it.

The classifier in detail:

Data: the generator samples full solutions of training problems; each is labelled by whether its
final answer is right, and every prefix "prompt + first j steps" (j = 1..number of steps; a step
ends at the delimiter "\\n" or at EOS, exactly as the search env cuts them) becomes one example
with that label. So the score of a partial path estimates the chance that continuing it by
sampling ends right (an outcome-supervised value of the path).

Model: a decoder (`jaxrl_hier.llm` LanguageModel, by default a copy of the generator's weights)
with a one-logit classification head (`jaxrl_hier.llm.heads`) on the last real token, trained with
binary cross-entropy; `score = sigmoid(logit)`. Inputs use the env's prefix layout (BOS + prompt +
steps, left-padded to one static length), so the scores the env asks for match what was trained.

    rm = RewardModel(lm)                        # the backbone's architecture
    params = rm.init(key, backbone_params)
    data = sample_path_data(...); params, log = train_reward_model(rm, params, data, ...)
    metrics = evaluate_reward_model(rm, params, held_out)   # accuracy, AUC, loss (either kind)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_hier.config import ConfigError
from jaxrl_hier.llm.decoder import default_positions
from jaxrl_hier.llm.heads import classification_head_apply, classification_head_init, gather_last
from jaxrl_hier.llm.jit_cache import JitCache


class PathData(NamedTuple):
    """Partial-path examples: ids / mask [M, L] left-padded, label [M] (1.0 = the full path was right),
    group [M] (which sampled solution the prefix came from), steps [M] (how many steps it holds),
    prompt_tokens [M] (how many of its real tokens are BOS + prompt)."""

    ids: np.ndarray
    mask: np.ndarray
    label: np.ndarray
    group: np.ndarray
    steps: np.ndarray
    prompt_tokens: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class RewardModel:
    """A decoder backbone plus a one-logit head; params are {"model": ..., "head": ...}."""

    lm: Any

    def init(self, key: jax.Array, backbone_params: Any) -> dict:
        head = classification_head_init(key, int(self.lm.config.hidden_size), 1)
        return {"model": backbone_params, "head": head}

    def logits(self, params: dict, ids: jax.Array, mask: jax.Array) -> jax.Array:
        """Float32 [B] logits of left-padded [B, L] paths (read at the last real token)."""
        hidden = self.lm.hidden_states(params["model"], ids, mask, positions=default_positions(mask))
        return classification_head_apply(params["head"], gather_last(hidden, mask))[..., 0]

    def score(self, params: dict, ids: jax.Array, mask: jax.Array, prompt_tokens: Any = None) -> jax.Array:
        """The score in [0, 1] (the env's `score_fn`; the prompt's length is not needed)."""
        return jax.nn.sigmoid(self.logits(params, ids, mask))


@dataclasses.dataclass(frozen=True, eq=False)
class LikelihoodVerifier:
    """A path's score is the probability, under the verifier decoder `lm` (params: its weights), of
    the least likely token of its steps: exp(min_t log p(x_t | x_<t)) over the tokens after the
    prompt. One wrong token (a digit the verifier would not have written) sinks the whole path, the
    shape of a process label; the prompt's own tokens are not judged."""

    lm: Any

    def score(self, params: Any, ids: jax.Array, mask: jax.Array, prompt_tokens: jax.Array) -> jax.Array:
        from jaxrl_hier.llm.sampling import token_logprobs

        logp = token_logprobs(self.lm, params, ids, mask)  # [B, L - 1]: token t + 1 given those up to t
        index = jnp.cumsum(mask, axis=-1)[:, 1:] - 1  # each target's index among the row's real tokens
        steps = (mask[:, 1:] > 0) & (index >= jnp.asarray(prompt_tokens)[:, None])
        return jnp.exp(jnp.min(jnp.where(steps, logp, 0.0), axis=-1))


def split_steps(tokens: Sequence[int], delimiter_id: int, eos_id: int, step_tokens: int) -> list[list[int]]:
    """A completion's tokens (up to and including EOS) cut into steps as the env cuts them: at the
    delimiter, at EOS, or after `step_tokens` tokens."""
    steps, cur = [], []
    for t in tokens:
        cur.append(int(t))
        if t in (delimiter_id, eos_id) or len(cur) == step_tokens:
            steps.append(cur)
            cur = []
        if t == eos_id:
            break
    if cur:
        steps.append(cur)
    return steps


def build_path_data(prompt_ids: np.ndarray, prompt_mask: np.ndarray, completions: Sequence[Sequence[int]],
                    labels: Sequence[bool], *, delimiter_id: int, eos_id: int, pad_id: int, step_tokens: int,
                    max_depth: int, prefix_labels: Sequence[Sequence[bool]] | None = None) -> PathData:
    """Every prefix (1..max_depth steps) of each completion, in the env's layout: left-padded
    [prompt_length + max_depth * step_tokens]. prompt_ids/mask are [M, prompt_length] per completion.
    Each prefix is labelled with its completion's final-answer label, or, given `prefix_labels` (one
    list per completion, one bool per step), with its own."""
    length = prompt_ids.shape[1] + max_depth * step_tokens
    rows, label_rows, groups, depths, prompts = [], [], [], [], []
    for i, (completion, label) in enumerate(zip(completions, labels)):
        prompt = [int(t) for t, m in zip(prompt_ids[i], prompt_mask[i]) if m]
        path: list[int] = []
        for j, step in enumerate(split_steps(completion, delimiter_id, eos_id, step_tokens)[:max_depth]):
            path = path + step
            rows.append(prompt + path)
            label_rows.append(float(label if prefix_labels is None else prefix_labels[i][j]))
            groups.append(i)
            depths.append(j + 1)
            prompts.append(len(prompt))
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for r, row in enumerate(rows):
        ids[r, length - len(row):] = row
        mask[r, length - len(row):] = 1
    return PathData(ids, mask, np.asarray(label_rows, np.float32), np.asarray(groups, np.int32),
                    np.asarray(depths, np.int32), np.asarray(prompts, np.int32))


def sample_path_data(lm: Any, params: Any, tokenizer: Any, task: Any, problems: Sequence[Any], *, samples: int,
                     key: jax.Array, temperature: float, prompt_length: int, step_tokens: int, max_depth: int,
                     batch_size: int = 256, labels: str = "final") -> tuple[PathData, dict]:
    """Sample `samples` solutions per problem with the generator, label them and cut them into
    partial-path examples. `labels="final"`: every prefix gets its solution's final-answer
    correctness; `"steps"`: each prefix whether all its steps are right (`task.steps_correct`, a
    process label). Returns the data and a summary (solutions, their accuracy, the positive rate)."""
    if labels not in ("final", "steps"):
        raise ConfigError(f"reward model labels must be 'final' or 'steps', got {labels!r}.")
    if labels == "steps" and not hasattr(task, "steps_correct"):
        raise ConfigError(f"reward model labels 'steps' need a task with steps_correct(); {task.name} has none.")
    from jaxrl_hier.llm.sampling import generate
    from jaxrl_hier.llm_rl.data import encode_prompts, fixed_batches, special_ids
    from jaxrl_hier.tasks.jax_rewards import decode_completions

    if samples < 1:
        raise ConfigError(f"reward model: samples per problem must be >= 1, got {samples}.")
    pad, _, eos = special_ids(tokenizer)
    delimiter = tokenizer.convert_tokens_to_ids("\n")
    flat = [p for p in problems for _ in range(samples)]
    enc = encode_prompts(tokenizer, [p.prompt for p in flat], prompt_length)
    completions, finals, prefix_labels = [], [], []
    for start, n, (ids, mask) in fixed_batches(batch_size, enc.ids, enc.mask):
        chunk = slice(start, start + n)
        out = generate(lm, params, ids, mask, key=jax.random.fold_in(key, start), max_new_tokens=max_depth * step_tokens,
                       temperature=temperature, eos_token_id=eos, pad_token_id=pad, min_bucket=prompt_length)
        tokens, tmask = np.asarray(out.tokens)[:n], np.asarray(out.mask)[:n]
        texts = decode_completions(tokenizer, tokens, tmask)
        for p, row, m, text in zip(flat[chunk], tokens, tmask, texts):
            completions.append(row[m > 0].tolist())
            finals.append(bool(task.is_correct(p, text)))
            if labels == "steps":
                steps = split_steps(completions[-1], delimiter, eos, step_tokens)[:max_depth]
                prefix_labels.append(task.steps_correct(p, [tokenizer.decode(st, skip_special_tokens=True)
                                                            for st in steps]))
    data = build_path_data(enc.ids, enc.mask, completions, finals, delimiter_id=delimiter, eos_id=eos, pad_id=pad,
                           step_tokens=step_tokens, max_depth=max_depth,
                           prefix_labels=prefix_labels if labels == "steps" else None)
    return data, {"solutions": len(flat), "solution_accuracy": float(np.mean(finals)), "examples": len(data.label),
                  "labels": labels, "positive_rate": float(np.mean(data.label)) if len(data.label) else float("nan")}


def bce_loss(rm: RewardModel, params: dict, ids: jax.Array, mask: jax.Array, label: jax.Array) -> jax.Array:
    return optax.sigmoid_binary_cross_entropy(rm.logits(params, ids, mask), label).mean()


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the probability that a random positive outscores a random negative,
    ties counting half); NaN when one class is missing."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels) > 0.5
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    allv = np.concatenate([pos, neg])
    for v in np.unique(allv):  # average ranks of ties
        same = allv == v
        if same.sum() > 1:
            ranks[same] = ranks[same].mean()
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def make_train_step(rm: RewardModel, learning_rate: float, weight_decay: float = 0.01):
    """(optimizer, jitted step(params, opt_state, ids, mask, label) -> (params, opt_state, loss))."""
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate, weight_decay=weight_decay))

    @jax.jit
    def step(params, opt_state, ids, mask, label):
        loss, grads = jax.value_and_grad(lambda p: bce_loss(rm, p, ids, mask, label))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return tx, step


def train_reward_model(rm: RewardModel, params: dict, data: PathData, *, steps: int, batch_size: int,
                       learning_rate: float, seed: int = 0, on_step: Any = None) -> tuple[dict, list[float]]:
    """`steps` Adam steps on random minibatches (seeded); returns params and the loss of each step."""
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"reward model: steps and batch_size must be >= 1, got {steps} and {batch_size}.")
    if len(data.label) == 0:
        raise ConfigError("reward model: no training paths (the generator produced no steps).")
    tx, step = make_train_step(rm, learning_rate)
    opt_state = tx.init(params)
    rng = np.random.default_rng(seed)
    losses = []
    for i in range(steps):
        idx = rng.integers(0, len(data.label), batch_size)
        params, opt_state, loss = step(params, opt_state, jnp.asarray(data.ids[idx]), jnp.asarray(data.mask[idx]),
                                       jnp.asarray(data.label[idx]))
        losses.append(float(loss))
        if on_step is not None:
            on_step(i + 1, losses[-1])
    return params, losses


def score_paths(rm: Any, params: Any, ids: np.ndarray, mask: np.ndarray, prompt_tokens: np.ndarray,
                batch_size: int = 512) -> np.ndarray:
    """Scores [M] of many left-padded paths (either kind of reward model), in fixed-size batches
    (one compiled shape)."""
    from jaxrl_hier.llm_rl.data import fixed_batches

    fn = _score_fn(rm)
    out = []
    for _, n, (a, m, p) in fixed_batches(batch_size, ids, mask, prompt_tokens):
        out.append(np.asarray(fn(params, jnp.asarray(a), jnp.asarray(m), jnp.asarray(p)))[:n])
    return np.concatenate(out) if out else np.zeros(0, np.float32)


_SCORE = JitCache()


def _score_fn(rm: RewardModel):
    return _SCORE.get(rm, (), lambda: rm.score)


def evaluate_reward_model(rm: Any, params: Any, data: PathData) -> dict:
    """Accuracy (score > 0.5 vs label), AUC and mean BCE on held-out paths, overall and on the
    final (complete) paths only."""
    scores = score_paths(rm, params, data.ids, data.mask, data.prompt_tokens)
    labels = data.label
    eps = 1e-7
    loss = float(-np.mean(labels * np.log(scores + eps) + (1 - labels) * np.log(1 - scores + eps)))
    last = np.r_[data.group[1:] != data.group[:-1], True] if len(labels) else np.zeros(0, bool)
    return {"accuracy": float(np.mean((scores > 0.5) == (labels > 0.5))), "auc": auc(scores, labels), "loss": loss,
            "examples": int(len(labels)), "positive_rate": float(np.mean(labels)),
            "final_accuracy": float(np.mean((scores[last] > 0.5) == (labels[last] > 0.5))),
            "final_auc": auc(scores[last], labels[last])}


__all__ = ["LikelihoodVerifier", "PathData", "RewardModel", "auc", "bce_loss", "build_path_data", "evaluate_reward_model",
           "make_train_step", "sample_path_data", "score_paths", "split_steps", "train_reward_model"]
