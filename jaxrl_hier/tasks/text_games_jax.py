"""Turn-based text environments whose replies are computed from token ids in JAX.

The protocol (what `llm_rl.turns.compiled_rollout` drives):

- `initial(episodes) -> (state, obs_ids [B, O], obs_mask [B, O])`: the JAX state of a batch of the
  host environment's episodes (`text_games`: its `reset` or `evaluation_episodes` draws them, so
  splits and seeds stay in one place) and the token ids of each first observation, BOS included,
  left-padded to the static length O (`obs_len`);
- `step(state, utterance [B, N], mask [B, N]) -> (state, append_ids [B, A], append_mask [B, A],
  reward [B], done [B])`: one utterance per live episode (mask 1 up to and including EOS, as the
  sampling core returns it); `append_*` is what the turn adds to the context the policy reads next
  (the environment's rendering of the turn: here the parsed guess and the oracle's reply), at most
  A (`append_len`) tokens at the right end of the A slots, mask 0 on the unused start (the sampling
  core continues from the context's last column, which must hold a real token); rows whose episode
  had ended get reward 0, nothing appended, and stay done;
- `max_turns`, `obs_len`, `append_len`: static ints, so a batch of episodes is one compiled loop
  over turns with no host round trip.

The context is the concatenation of the first observation and each turn's append. With a tokenizer
that never merges tokens across a line break (the char-level one always), its tokens are those of the
host environment's state text (`observation(ep)`), which a test checks turn by turn.

- `GuessNumberJax`: `text_games.GuessNumberEnv` in JAX. An utterance is a guess when its text, cut
  at EOS and stripped of whitespace, is 1 to len(str(high)) ASCII digits with a value in 1..high
  (`GuessNumberEnv._parse`); a special token in it makes it a bad guess, as the host decoding
  renders it U+FFFD. The digit/whitespace class of every vocabulary entry is read once from the
  tokenizer, so multi-character tokens (" 12") parse as their text does.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks.text_games import GuessNumberEnv

OTHER, SPACE, DIGITS = 0, 1, 2  # a vocabulary entry's class for the guess parser


class GuessState(struct.PyTreeNode):
    secret: jax.Array  # [B] int32
    turn: jax.Array    # [B] int32: turns played
    done: jax.Array    # [B] bool
    success: jax.Array  # [B] bool


def token_classes(tokenizer: Any, vocab_size: int) -> dict[str, np.ndarray]:
    """Per vocabulary id: its class (OTHER, SPACE: whitespace only, DIGITS: ASCII digits with optional
    whitespace around), and for DIGITS its value, digit count and whether whitespace leads or trails it.
    Special and out-of-tokenizer ids are OTHER."""
    special = set(tokenizer.all_special_ids)
    cls = np.zeros(vocab_size, np.int32)
    value, digits, lead, trail = (np.zeros(vocab_size, np.int32) for _ in range(4))
    for i in range(min(vocab_size, len(tokenizer))):
        if i in special:
            continue
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        core = text.strip(string.whitespace)
        if text and not core:
            cls[i] = SPACE
        elif core and all(ch in string.digits for ch in core) and len(core) <= 9:
            cls[i], value[i], digits[i] = DIGITS, int(core), len(core)
            lead[i], trail[i] = text[0] in string.whitespace, text[-1] in string.whitespace
    return {"cls": cls, "value": value, "digits": digits, "lead": lead, "trail": trail}


def _encode(tokenizer: Any, texts: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids of each text (no special tokens) and their mask, `width` wide."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = [list(r) for r in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    ids = np.full((len(rows), width), pad, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


@dataclasses.dataclass(frozen=True, eq=False)
class GuessNumberJax:
    """`GuessNumberEnv` with its oracle in JAX (module docstring); build it with `GuessNumberJax.build`."""

    game: GuessNumberEnv
    obs: np.ndarray        # [O] BOS + header ids
    lines: np.ndarray      # [2 high + 1, A]: "g higher\n" at 2(g-1), "g lower\n" at 2(g-1)+1, "? bad\n" last
    line_mask: np.ndarray  # [2 high + 1, A]
    classes: dict          # token_classes
    eos: int
    pad: int

    @classmethod
    def build(cls, game: GuessNumberEnv, tokenizer: Any, vocab_size: int) -> "GuessNumberJax":
        from jaxrl_hier.llm_rl.data import special_ids

        pad, bos, eos = special_ids(tokenizer)
        header = tokenizer(game.header(), add_special_tokens=False)["input_ids"]
        texts = [game.render([str(g)], [r])[len(game.header()):] for g in range(1, game.high + 1)
                 for r in ("higher", "lower")] + [game.render(["?"], ["bad"])[len(game.header()):]]
        width = max(len(r) for r in tokenizer(texts, add_special_tokens=False)["input_ids"])
        lines, line_mask = _encode(tokenizer, texts, width)
        obs = np.asarray(([bos] if bos is not None else []) + list(header), np.int32)
        return cls(game, obs, lines, line_mask, token_classes(tokenizer, vocab_size), eos, pad)

    @property
    def max_turns(self) -> int:
        return self.game.max_turns

    @property
    def obs_len(self) -> int:
        return len(self.obs)

    @property
    def append_len(self) -> int:
        return self.lines.shape[1]

    def initial(self, episodes: Sequence[Any]) -> tuple[GuessState, jax.Array, jax.Array]:
        b = len(episodes)
        if not b:
            raise ConfigError("GuessNumberJax.initial: no episodes.")
        secret = jnp.asarray([ep.secret for ep in episodes], jnp.int32)
        state = GuessState(secret, jnp.zeros(b, jnp.int32), jnp.zeros(b, bool), jnp.zeros(b, bool))
        ids = jnp.broadcast_to(jnp.asarray(self.obs), (b, self.obs_len))
        return state, ids, jnp.ones_like(ids)

    def parse(self, utterance: jax.Array, mask: jax.Array) -> jax.Array:
        """[B] the guess of each utterance, 0 where it is not a guess in 1..high (module docstring)."""
        c = {k: jnp.asarray(v) for k, v in self.classes.items()}
        width = len(str(self.game.high))
        pow10 = jnp.asarray([10 ** k for k in range(10)], jnp.int32)

        def one(carry, tok_m):
            phase, bad, value, ndig, ended = carry  # phase 0: leading space, 1: digits, 2: trailing space
            tok, m = tok_m
            ended = ended | (m == 0) | (tok == self.eos)
            live = ~ended
            k = c["cls"][tok]
            d = c["digits"][tok]
            is_digits = live & (k == DIGITS)
            bad = bad | (live & (k == OTHER)) | (is_digits & ((phase == 2) | ((phase == 1) & (c["lead"][tok] == 1))))
            fits = ndig + d <= width
            value = jnp.where(is_digits, jnp.where(fits, value * pow10[jnp.minimum(d, 9)] + c["value"][tok], 0), value)
            ndig = jnp.where(is_digits, ndig + d, ndig)
            phase = jnp.where(is_digits, jnp.where(c["trail"][tok] == 1, 2, 1),
                              jnp.where(live & (k == SPACE) & (phase == 1), 2, phase))
            return (phase, bad, value, ndig, ended), None

        b = utterance.shape[0]
        zeros = jnp.zeros(b, jnp.int32)
        init = (zeros, jnp.zeros(b, bool), zeros, zeros, jnp.zeros(b, bool))
        (_, bad, value, ndig, _), _ = jax.lax.scan(one, init, (utterance.T, mask.T))
        ok = ~bad & (ndig >= 1) & (ndig <= width) & (value >= 1) & (value <= self.game.high)
        return jnp.where(ok, value, 0)

    def step(self, state: GuessState, utterance: jax.Array, mask: jax.Array
             ) -> tuple[GuessState, jax.Array, jax.Array, jax.Array, jax.Array]:
        guess = self.parse(utterance, mask)
        live = ~state.done
        hit = live & (guess == state.secret)
        miss = live & ~hit
        reply = jnp.where(guess == 0, 2 * self.game.high, 2 * (guess - 1) + (guess > state.secret))
        append_ids = jnp.asarray(self.lines)[reply]
        append_mask = jnp.asarray(self.line_mask)[reply] * miss[:, None]
        turn = state.turn + live
        done = state.done | hit | (turn >= self.game.max_turns)
        reward = jnp.where(miss, -1.0, 0.0).astype(jnp.float32)
        new = GuessState(state.secret, turn, done, state.success | hit)
        return new, jnp.where(append_mask == 1, append_ids, self.pad), append_mask, reward, done


def jax_form(env: Any, tokenizer: Any, vocab_size: int) -> Any | None:
    """The JAX form of a host environment (`text_games`), or None where its replies need host Python."""
    if isinstance(env, GuessNumberEnv):
        return GuessNumberJax.build(env, tokenizer, vocab_size)
    return None


__all__ = ["GuessNumberJax", "GuessState", "jax_form", "token_classes"]
