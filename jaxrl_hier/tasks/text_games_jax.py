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
- `WordleJax`: `text_games.WordleEnv` in JAX, for tokenizers that write letters one per token (see
  the class); the feedback line is composed from letter and mark ids.
- `TwentyQuestionsJax`: `text_games.TwentyQuestionsEnv` in JAX, for the same tokenizers; an utterance
  is read as an object or an attribute (`parse_phrase`, Wordle's parser too) and answered from the
  attribute table.
- `MazeJax`: `text_games.MazeEnv` in JAX, for the same tokenizers; the state carries each episode's
  current cell, and each episode's first observation is its own opening line.
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
from jaxrl_hier.tasks.text_games import (ATTRIBUTES, MOVES, OBJECTS, WORDS, GuessNumberEnv, MazeEnv, TwentyQuestionsEnv,
                                         WordleEnv)

OTHER, SPACE, DIGITS = 0, 1, 2  # a vocabulary entry's class for the guess parser
SPACE_CODE = -2  # Wordle's parser: a whitespace token


class GameState(struct.PyTreeNode):
    secret: jax.Array   # [B] int32 (the number; Twenty Questions' object), [B, L] letter codes (Wordle) or
                        # [B, 3] maze, goal and current cell (the maze: each move updates the cell)
    turn: jax.Array     # [B] int32: turns played
    done: jax.Array     # [B] bool
    success: jax.Array  # [B] bool


class JaxGame:
    """What the JAX forms of `text_games.SecretGame`s share: the first observation, the batch's initial
    state, and a turn's end (a hit ends the game with reward 0; a miss costs -1 and appends the reply
    line; an ended game appends nothing). A subclass holds `game`, `obs`, `pad` and defines `secret_ids`,
    `append_len` and `step`."""

    game: Any
    obs: np.ndarray
    pad: int

    @property
    def max_turns(self) -> int:
        return self.game.max_turns

    @property
    def obs_len(self) -> int:
        return len(self.obs)

    def secret_ids(self, episodes: Sequence[Any]) -> jax.Array:
        raise NotImplementedError

    def initial(self, episodes: Sequence[Any]) -> tuple[GameState, jax.Array, jax.Array]:
        b = len(episodes)
        if not b:
            raise ConfigError(f"{type(self).__name__}.initial: no episodes.")
        state = GameState(self.secret_ids(episodes), jnp.zeros(b, jnp.int32), jnp.zeros(b, bool), jnp.zeros(b, bool))
        ids, mask = self.first_observations(episodes)
        return state, ids, mask

    def first_observations(self, episodes: Sequence[Any]) -> tuple[jax.Array, jax.Array]:
        """[B, O] each episode's first observation (left-padded) and its mask: here the one header."""
        ids = jnp.broadcast_to(jnp.asarray(self.obs), (len(episodes), self.obs_len))
        return ids, jnp.ones_like(ids)

    def end_turn(self, state: GameState, hit: jax.Array, line: jax.Array, line_mask: jax.Array
                 ) -> tuple[GameState, jax.Array, jax.Array, jax.Array, jax.Array]:
        """`step`'s outputs from whether each live game's guess hit and the reply line of a miss."""
        live = ~state.done
        hit = live & hit
        miss = live & ~hit
        append_mask = line_mask * miss[:, None]
        turn = state.turn + live
        done = state.done | hit | (turn >= self.max_turns)
        reward = jnp.where(miss, -1.0, 0.0).astype(jnp.float32)
        new = GameState(state.secret, turn, done, state.success | hit)
        return new, jnp.where(append_mask == 1, line, self.pad), append_mask, reward, done


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


def _left_pad(rows: Sequence[Sequence[int]], width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """[R, width] the rows of ids right-aligned after `pad`, and their mask."""
    ids = np.full((len(rows), width), pad, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def _encode(tokenizer: Any, texts: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids of each text (no special tokens) and their mask, `width` wide."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return _left_pad([list(r) for r in tokenizer(list(texts), add_special_tokens=False)["input_ids"]], width, pad)


def char_vocabulary(tokenizer: Any, vocab_size: int, extra: str) -> tuple[np.ndarray, dict[str, int]] | None:
    """For the per-character parsers: per vocabulary id its letter code (0..25 for a-z, SPACE_CODE for
    whitespace, -1 otherwise), and the id of each single character; None when the tokenizer merges
    letters or spaces into one token (the parser would misread it) or lacks a-z or a character of `extra`."""
    special = set(tokenizer.all_special_ids)
    letter_of = np.full(vocab_size, -1, np.int32)
    ids: dict[str, int] = {}
    for i in range(min(vocab_size, len(tokenizer))):
        if i in special:
            continue
        text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
        if len(text) > 1 and all(ch in string.ascii_lowercase + string.whitespace for ch in text):
            return None
        if len(text) == 1:
            ids.setdefault(text, i)
            if text in string.ascii_lowercase:
                letter_of[i] = ord(text) - ord("a")
            elif text in string.whitespace:
                letter_of[i] = SPACE_CODE
    if any(ch not in ids for ch in string.ascii_lowercase + extra):
        return None
    return letter_of, ids


def phrase_codes(phrases: Sequence[str]) -> np.ndarray:
    """[P, L] letter codes of lowercase phrases, -1 after each phrase's end (L: the longest)."""
    width = max(map(len, phrases))
    return np.asarray([[ord(ch) - ord("a") for ch in p] + [-1] * (width - len(p)) for p in phrases], np.int32)


def parse_phrase(utterance: jax.Array, mask: jax.Array, letter_of: np.ndarray, phrases: np.ndarray, eos: int
                 ) -> jax.Array:
    """[B] the row of `phrases` (`phrase_codes`) that each utterance's text is, cut at EOS and stripped of
    whitespace; -1 where it is none (a token that is neither a letter nor whitespace, a space inside the
    letters, or more letters than the longest phrase)."""
    width = phrases.shape[1]
    letter_of = jnp.asarray(letter_of)

    def one(carry, tok_m):
        phase, bad, count, letters, ended = carry  # phase 0: leading space, 1: letters, 2: trailing space
        tok, m = tok_m
        ended = ended | (m == 0) | (tok == eos)
        live = ~ended
        code = letter_of[tok]
        is_letter = live & (code >= 0)
        bad = bad | (live & (code == -1)) | (is_letter & ((phase == 2) | (count >= width)))
        slot = jnp.minimum(count, width - 1)
        letters = jnp.where(is_letter[:, None] & (jnp.arange(width)[None] == slot[:, None]), code[:, None], letters)
        count = count + is_letter
        phase = jnp.where(is_letter, 1, jnp.where(live & (code == SPACE_CODE) & (phase == 1), 2, phase))
        return (phase, bad, count, letters, ended), None

    b = utterance.shape[0]
    zeros = jnp.zeros(b, jnp.int32)
    init = (zeros, jnp.zeros(b, bool), zeros, jnp.full((b, width), -1, jnp.int32), jnp.zeros(b, bool))
    (_, bad, _, letters, _), _ = jax.lax.scan(one, init, (utterance.T, mask.T))
    match = jnp.all(letters[:, None, :] == jnp.asarray(phrases)[None], axis=-1)  # [B, P]; unused slots stay -1
    return jnp.where(~bad & match.any(axis=1), jnp.argmax(match, axis=1), -1)


def _first_observation(game: Any, tokenizer: Any, bos: int | None) -> np.ndarray:
    """[O] BOS + the header's ids: every game's first observation."""
    header = tokenizer(game.header(), add_special_tokens=False)["input_ids"]
    return np.asarray(([bos] if bos is not None else []) + list(header), np.int32)


def _reply_lines(game: Any, tokenizer: Any, turns: Sequence[tuple[str, str]], width: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """[R, A] left-padded ids (and mask) of the state line each (utterance, reply) adds; A is `width`, or
    the longest line's length."""
    texts = [game.render([u], [r])[len(game.header()):] for u, r in turns]
    if width is None:
        width = max(len(r) for r in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return _encode(tokenizer, texts, width)


@dataclasses.dataclass(frozen=True, eq=False)
class GuessNumberJax(JaxGame):
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
        turns = [(str(g), r) for g in range(1, game.high + 1) for r in ("higher", "lower")] + [("?", "bad")]
        lines, line_mask = _reply_lines(game, tokenizer, turns)
        return cls(game, _first_observation(game, tokenizer, bos), lines, line_mask,
                   token_classes(tokenizer, vocab_size), eos, pad)

    @property
    def append_len(self) -> int:
        return self.lines.shape[1]

    def secret_ids(self, episodes: Sequence[Any]) -> jax.Array:
        return jnp.asarray([ep.secret for ep in episodes], jnp.int32)

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

    def step(self, state: GameState, utterance: jax.Array, mask: jax.Array
             ) -> tuple[GameState, jax.Array, jax.Array, jax.Array, jax.Array]:
        guess = self.parse(utterance, mask)
        reply = jnp.where(guess == 0, 2 * self.game.high, 2 * (guess - 1) + (guess > state.secret))
        return self.end_turn(state, guess == state.secret, jnp.asarray(self.lines)[reply],
                             jnp.asarray(self.line_mask)[reply])


@dataclasses.dataclass(frozen=True, eq=False)
class WordleJax(JaxGame):
    """`text_games.WordleEnv` in JAX, for tokenizers that write each letter, space and newline as one token
    and have no token of several letters or spaces (the char-level one): `build` returns None for
    others, and the guided agent then plays the host loop. An utterance is a guess when its text, cut at
    EOS and stripped of whitespace, is a listed word; the reply line ("crane .gy..\n") is composed from
    the letters' and the feedback marks' ids."""

    game: WordleEnv
    obs: np.ndarray         # [O] BOS + header ids
    letter_of: np.ndarray   # [V] int32: a letter token's code 0..25, SPACE_CODE for whitespace, -1 otherwise
    words: np.ndarray       # [W, L] int32 letter codes of WORDS
    letter_ids: np.ndarray  # [26] each letter's token id
    marks: np.ndarray       # [3] ids of "g", "y", "." (the feedback marks)
    space: int
    newline: int
    bad_line: np.ndarray    # [A] "? bad\n", left-padded
    bad_mask: np.ndarray    # [A]
    eos: int
    pad: int

    @classmethod
    def build(cls, game: WordleEnv, tokenizer: Any, vocab_size: int) -> "WordleJax | None":
        from jaxrl_hier.llm_rl.data import special_ids

        pad, bos, eos = special_ids(tokenizer)
        chars = char_vocabulary(tokenizer, vocab_size, " \ngy.?")
        if chars is None:
            return None
        letter_of, ids = chars
        bad_line, bad_mask = _reply_lines(game, tokenizer, [("?", "bad")], width=2 * game.word_length + 2)
        return cls(game, _first_observation(game, tokenizer, bos), letter_of, phrase_codes(WORDS),
                   np.asarray([ids[ch] for ch in string.ascii_lowercase], np.int32),
                   np.asarray([ids["g"], ids["y"], ids["."]], np.int32), ids[" "], ids["\n"], bad_line[0],
                   bad_mask[0], eos, pad)

    @property
    def append_len(self) -> int:
        return len(self.bad_line)

    def secret_ids(self, episodes: Sequence[Any]) -> jax.Array:
        return jnp.asarray([[ord(ch) - ord("a") for ch in ep.secret] for ep in episodes], jnp.int32)

    def parse(self, utterance: jax.Array, mask: jax.Array) -> jax.Array:
        """[B] the index in WORDS of each utterance's word, -1 where it is not a listed word."""
        return parse_phrase(utterance, mask, self.letter_of, self.words, self.eos)

    def step(self, state: GameState, utterance: jax.Array, mask: jax.Array
             ) -> tuple[GameState, jax.Array, jax.Array, jax.Array, jax.Array]:
        index = self.parse(utterance, mask)
        guess = jnp.asarray(self.words)[jnp.maximum(index, 0)]  # [B, L]
        hit = (index >= 0) & jnp.all(guess == state.secret, axis=1)
        # feedback per letter: 0 "g" (right place), 1 "y" (elsewhere in the secret), 2 "." (absent)
        present = jnp.any(guess[:, :, None] == state.secret[:, None, :], axis=2)
        mark = jnp.where(guess == state.secret, 0, jnp.where(present, 1, 2))
        b = guess.shape[0]
        line = jnp.concatenate([jnp.asarray(self.letter_ids)[guess], jnp.full((b, 1), self.space),
                                jnp.asarray(self.marks)[mark], jnp.full((b, 1), self.newline)], axis=1)
        bad = (index < 0)[:, None]
        return self.end_turn(state, hit, jnp.where(bad, jnp.asarray(self.bad_line)[None], line),
                             jnp.where(bad, jnp.asarray(self.bad_mask)[None], jnp.ones_like(line)))


@dataclasses.dataclass(frozen=True, eq=False)
class TwentyQuestionsJax(JaxGame):
    """`text_games.TwentyQuestionsEnv` in JAX, for tokenizers that write letters one per token (as
    `WordleJax`; `build` returns None for others). An utterance is parsed to an object or attribute
    (`parse_phrase`); the reply line is one of the precomputed "attr yes / attr no / object wrong /
    ? bad" lines, picked from the attribute table."""

    game: TwentyQuestionsEnv
    obs: np.ndarray        # [O] BOS + header ids
    letter_of: np.ndarray  # [V] (char_vocabulary)
    phrases: np.ndarray    # [objects + attributes, L] letter codes: OBJECTS in order, then ATTRIBUTES
    has: np.ndarray        # [objects, attributes] bool: the table
    lines: np.ndarray      # [2 attributes + objects + 1, A]: "a yes\n" at 2a, "a no\n" at 2a+1, "o wrong\n"
    line_mask: np.ndarray  # at 2 attributes + o, "? bad\n" last
    eos: int
    pad: int

    @classmethod
    def build(cls, game: TwentyQuestionsEnv, tokenizer: Any, vocab_size: int) -> "TwentyQuestionsJax | None":
        from jaxrl_hier.llm_rl.data import special_ids

        pad, bos, eos = special_ids(tokenizer)
        chars = char_vocabulary(tokenizer, vocab_size, " \n?")
        if chars is None:
            return None
        objects = list(OBJECTS)
        has = np.asarray([[a in OBJECTS[o] for a in ATTRIBUTES] for o in objects])
        turns = [(a, r) for a in ATTRIBUTES for r in ("yes", "no")] + [(o, "wrong") for o in objects] + [("?", "bad")]
        lines, line_mask = _reply_lines(game, tokenizer, turns)
        return cls(game, _first_observation(game, tokenizer, bos), chars[0], phrase_codes(objects + list(ATTRIBUTES)),
                   has, lines, line_mask, eos, pad)

    @property
    def append_len(self) -> int:
        return self.lines.shape[1]

    def secret_ids(self, episodes: Sequence[Any]) -> jax.Array:
        index = {o: i for i, o in enumerate(OBJECTS)}
        return jnp.asarray([index[ep.secret] for ep in episodes], jnp.int32)

    def parse(self, utterance: jax.Array, mask: jax.Array) -> jax.Array:
        """[B] each utterance's row of `phrases` (an object below len(OBJECTS), else an attribute), -1 for none."""
        return parse_phrase(utterance, mask, self.letter_of, self.phrases, self.eos)

    def step(self, state: GameState, utterance: jax.Array, mask: jax.Array
             ) -> tuple[GameState, jax.Array, jax.Array, jax.Array, jax.Array]:
        n_obj, n_attr = self.has.shape
        said = self.parse(utterance, mask)
        attr = jnp.clip(said - n_obj, 0, n_attr - 1)
        yes = jnp.asarray(self.has)[state.secret, attr]
        line = jnp.where(said < 0, 2 * n_attr + n_obj,
                         jnp.where(said < n_obj, 2 * n_attr + said, 2 * attr + (~yes).astype(jnp.int32)))
        return self.end_turn(state, said == state.secret, jnp.asarray(self.lines)[line],
                             jnp.asarray(self.line_mask)[line])


@dataclasses.dataclass(frozen=True, eq=False)
class MazeJax(JaxGame):
    """`text_games.MazeEnv` in JAX, for tokenizers that write letters, digits and spaces one per token (as
    `WordleJax`; `build` returns None for others). The state's `secret` is [B, 3]: maze, goal and the
    current cell, which each turn's move updates. A move is parsed as a one-letter phrase (`parse_phrase`);
    the reply line ("e 01 sw\n", "e wall\n", "? bad\n") is picked from a table of every (move, cell, open
    directions), and each episode's opening line ("goal 34 at 00 es\n") is composed on the host."""

    game: MazeEnv
    obs_width: int          # O: BOS + the longest opening line
    char_ids: dict          # each character's token id (char_vocabulary)
    bos: int | None
    letter_of: np.ndarray   # [V] (char_vocabulary)
    open_bits: np.ndarray   # [mazes, cells] int32: bit k set where MOVES[k] is open
    lines: np.ndarray       # [4 cells 16 + 5, A]: "m cc open\n" at (move cells + cell) 16 + open bits, then
    line_mask: np.ndarray   # "m wall\n" for each move, then "? bad\n"
    eos: int
    pad: int

    @classmethod
    def build(cls, game: MazeEnv, tokenizer: Any, vocab_size: int) -> "MazeJax | None":
        from jaxrl_hier.llm_rl.data import special_ids

        pad, bos, eos = special_ids(tokenizer)
        chars = char_vocabulary(tokenizer, vocab_size, " \n?" + string.digits)
        if chars is None:
            return None
        cells = game.size * game.size
        letters = lambda bits: "".join(m for k, m in enumerate(MOVES) if bits >> k & 1)  # noqa: E731
        turns = [(m, f"{game.cell(c)} {letters(bits)}") for m in MOVES for c in range(cells) for bits in range(16)]
        turns += [(m, "wall") for m in MOVES] + [("?", "bad")]
        lines, line_mask = _reply_lines(game, tokenizer, turns)
        open_bits = np.asarray([[sum(1 << k for k, m in enumerate(MOVES) if m in cell) for cell in game.maze(i)]
                                for i in range(game.mazes)], np.int32)
        return cls(game, int(bos is not None) + game.max_opening_chars(), chars[1], bos, chars[0], open_bits,
                   lines, line_mask, eos, pad)

    @property
    def obs_len(self) -> int:
        return self.obs_width

    @property
    def append_len(self) -> int:
        return self.lines.shape[1]

    def secret_ids(self, episodes: Sequence[Any]) -> jax.Array:
        return jnp.asarray([[m, goal, start] for m, start, goal in (ep.secret for ep in episodes)], jnp.int32)

    def first_observations(self, episodes: Sequence[Any]) -> tuple[jax.Array, jax.Array]:
        bos = [self.bos] if self.bos is not None else []
        rows = [bos + [self.char_ids[ch] for ch in self.game.opening(ep.secret)] for ep in episodes]
        ids, mask = _left_pad(rows, self.obs_len, self.pad)
        return jnp.asarray(ids), jnp.asarray(mask)

    def parse(self, utterance: jax.Array, mask: jax.Array) -> jax.Array:
        """[B] each utterance's move, its index in MOVES, -1 where it is none."""
        return parse_phrase(utterance, mask, self.letter_of, phrase_codes(list(MOVES)), self.eos)

    def step(self, state: GameState, utterance: jax.Array, mask: jax.Array
             ) -> tuple[GameState, jax.Array, jax.Array, jax.Array, jax.Array]:
        cells, size = self.open_bits.shape[1], self.game.size
        move = self.parse(utterance, mask)
        maze, goal, here = state.secret[:, 0], state.secret[:, 1], state.secret[:, 2]
        open_bits = jnp.asarray(self.open_bits)
        d = jnp.maximum(move, 0)
        can = (move >= 0) & ~state.done & ((open_bits[maze, here] >> d) & 1 == 1)
        to = jnp.where(can, here + jnp.asarray([-size, 1, size, -1])[d], here)
        walls = 4 * cells * 16
        line = jnp.where(move < 0, walls + 4, jnp.where(can, (d * cells + to) * 16 + open_bits[maze, to], walls + d))
        state = state.replace(secret=state.secret.at[:, 2].set(to))
        return self.end_turn(state, can & (to == goal), jnp.asarray(self.lines)[line],
                             jnp.asarray(self.line_mask)[line])


def jax_form(env: Any, tokenizer: Any, vocab_size: int) -> Any | None:
    """The JAX form of a host environment (`text_games`), or None where its replies need host Python
    (the two-turn env's answer checker; Wordle with a tokenizer that merges letters)."""
    if isinstance(env, GuessNumberEnv):
        return GuessNumberJax.build(env, tokenizer, vocab_size)
    if isinstance(env, WordleEnv):
        return WordleJax.build(env, tokenizer, vocab_size)
    if isinstance(env, TwentyQuestionsEnv):
        return TwentyQuestionsJax.build(env, tokenizer, vocab_size)
    if isinstance(env, MazeEnv):
        return MazeJax.build(env, tokenizer, vocab_size)
    return None


__all__ = ["GameState", "GuessNumberJax", "JaxGame", "MazeJax", "TwentyQuestionsJax", "WordleJax", "char_vocabulary", "jax_form",
           "parse_phrase", "phrase_codes", "token_classes"]
