"""Multi-turn episodes as one compiled loop (llm_rl.turns) over a JAX environment (tasks.text_games_jax):
the JAX guess parser agrees with the host game's on every kind of utterance; a scripted batch of
games played by the compiled loop gives, turn by turn, the host game's rewards, ends and state text;
a tiny random model's sampled games replay the same way on the host."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_hier.llm.sampling import GenerateOutput
from jaxrl_hier.llm_rl.data import encode_completions, special_ids
from jaxrl_hier.llm_rl.turns import compiled_rollout
from jaxrl_hier.tasks import build_char_tokenizer
from jaxrl_hier.tasks.jax_rewards import decode_completions
from jaxrl_hier.tasks.text_games import (ATTRIBUTES, OBJECTS, WORDS, GameEpisode, GuessNumberEnv, MazeEnv,
                                         TwentyQuestionsEnv, WordleEnv, make_mazes, maze_distances, wordle_feedback)
from jaxrl_hier.tasks.text_games_jax import (GuessNumberJax, MazeJax, TwentyQuestionsJax, WordleJax, jax_form,
                                             token_classes)

TOK = build_char_tokenizer()
N = 5  # utterance tokens


def utterance_ids(texts, eos=True, n=N):
    ids, mask, _ = encode_completions(TOK, texts, n, add_eos=eos)
    return jnp.asarray(ids), jnp.asarray(mask)


def test_the_jax_parser_agrees_with_the_host_game():
    game = GuessNumberEnv(high=100, max_turns=8)
    env = GuessNumberJax.build(game, TOK, len(TOK))
    rng = random.Random(0)
    texts = ["7", " 42", "42 ", " 9\n", "100", "101", "0", "007", "07", "4 2", "x1", "1x", "", " ", "12a", "99",
             "1000", "\n5", "5\n\n", "-3"]
    texts += ["".join(rng.choice("0123456789 \na") for _ in range(rng.randrange(1, N))) for _ in range(300)]
    ids, mask = utterance_ids(texts)
    got = np.asarray(env.parse(ids, mask))
    want = [game._parse(t) or 0 for t in decode_completions(TOK, ids, mask)]
    assert got.tolist() == want
    assert sum(w > 0 for w in want) > 50 and sum(w == 0 for w in want) > 50  # both kinds well covered
    # no EOS within N tokens (the utterance ran out), and a special token inside: the host's reading too
    pad, bos, _ = special_ids(TOK)
    raw = np.asarray(utterance_ids(["12345"], eos=False)[0])
    spec = raw.copy()
    spec[0, 1] = bos
    both = jnp.asarray(np.concatenate([raw, spec]))
    ones = jnp.ones_like(both)
    assert np.asarray(env.parse(both, ones)).tolist() == [game._parse(t) or 0 for t in
                                                          decode_completions(TOK, both, ones)] == [0, 0]


def host_replay(game, secrets, texts_per_turn):
    """The host game played with the same utterances: per turn (state text, reward, done, valid)."""
    eps = [GameEpisode(s) for s in secrets]
    rows = []
    for texts in texts_per_turn:
        row = []
        for i, ep in enumerate(eps):
            before = game.observation(ep)
            if ep.done:
                row.append((before, 0.0, 1.0, 0.0))
                continue
            eps[i], r, d = game.step(ep, texts[i])
            row.append((before, r, float(d), 1.0))
        rows.append(row)
    return rows, eps


def context_texts(ids, mask):
    """Each row's context, its masked-out padding skipped (BOS shown as the host's state carries none)."""
    _, bos, _ = special_ids(TOK)
    return [TOK.decode([int(i) for i, m in zip(r, mr) if m and i != bos], clean_up_tokenization_spaces=False)
            for r, mr in zip(np.asarray(ids), np.asarray(mask))]


def play_scripted(env, game, secrets, plays, n=N):
    """The compiled loop playing `plays` (per turn, one utterance per game, whatever the context) and the
    host game replaying them: asserts each turn's state text, reward, done and valid agree, and that each
    live game's next state is the next turn's state; returns (the JAX state at the end, the host episodes)."""
    tokens = jnp.stack([utterance_ids(p, n=n)[0] for p in plays])
    masks = jnp.stack([utterance_ids(p, n=n)[1] for p in plays])

    def sample(t, policy, ids, mask, rng, greedy):
        return GenerateOutput(tokens[t], jnp.zeros(tokens.shape[1:]), masks[t])

    S = env.obs_len + (game.max_turns - 1) * env.append_len
    state, ids, mask = env.initial([GameEpisode(s) for s in secrets])
    state, turns = jax.jit(compiled_rollout(env, sample, S))(None, state, ids, mask, jax.random.key(0))
    want, eps = host_replay(game, secrets, plays)
    for t, row in enumerate(want):
        assert context_texts(turns.state[t], turns.state_mask[t]) == [w[0] for w in row], t
        assert np.asarray(turns.reward[t]).tolist() == [w[1] for w in row], t
        assert np.asarray(turns.done[t]).tolist() == [w[2] for w in row], t
        assert np.asarray(turns.valid[t]).tolist() == [w[3] for w in row], t
        live = [i for i, w in enumerate(row) if not w[2]]  # the next state of a game still on: the next turn's
        if t + 1 < len(want):
            assert [context_texts(turns.next_state[t], turns.next_mask[t])[i] for i in live] == \
                [want[t + 1][i][0] for i in live]
    assert np.asarray(state.success).tolist() == [e.success for e in eps]
    assert np.asarray(state.turn).tolist() == [e.turn for e in eps]
    return state, eps


def test_scripted_games_match_the_host_game_turn_by_turn():
    game = GuessNumberEnv(high=20, max_turns=5)
    env = GuessNumberJax.build(game, TOK, len(TOK))
    secrets = [7, 20, 1, 13, 5, 9]
    plays = [["10", "10", "x", "13", " 5", "3"],      # turn 1: lower, lower, bad, hit, hit (spaces), higher
             ["5", "15", "21", "13", "2", "8 "],
             ["7", "25", "0", "1", "1", "09"],           # hit; out of range; bad; (ended); (ended); hit as "09"
             ["1", "20", "2", "1", "1", "1"],
             ["1", "19", "2", "1", "1", "1"]]
    state, eps = play_scripted(env, game, secrets, plays)
    assert [e.success for e in eps] == [True, True, False, True, True, True]
    assert [e.turn for e in eps] == [3, 4, 5, 1, 1, 3]


@pytest.fixture(scope="module", params=[dict(env="guess_number", game_high=12, game_max_turns=6, max_new_tokens=3),
                                        dict(env="wordle", game_max_turns=4, max_new_tokens=6)],
                ids=["guess_number", "wordle"])
def game_agents(request):
    """One tiny random backbone playing guess-the-number (1..12, 6 turns), or Wordle (4 turns), through the
    compiled loop and through the host loop."""
    import dataclasses

    from jaxrl_hier.config import build_dataclass
    from jaxrl_hier.llm_rl.guided import make_env, make_train
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig
    from jaxrl_hier.llm_rl.model_setup import build_policy

    cfg = build_dataclass(GuidedConfig, dict(
        **request.param, temperature=1.0,
        model=dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64), lora_rank=2,
        critic="backbone", critic_mlp_hidden=16, episodes_per_iteration=12, replay_capacity=128))
    env = make_env(cfg)
    lm, tok = build_policy(cfg, TOK)
    compiled = make_train(cfg, env, lm, tok)
    host = make_train(dataclasses.replace(cfg, turn_loop="host"), env, lm, tok)
    assert compiled.jax_env is not None and host.jax_env is None
    return compiled, host


def test_the_compiled_loop_plays_the_host_loops_games(game_agents):
    compiled, host = game_agents
    state = compiled.init(jax.random.key(0))
    for greedy, key in ((True, None), (False, jax.random.key(3))):
        eps = compiled.env.evaluation_episodes("test", 12, 0)
        got_eps, got, times = compiled.rollout(state, list(eps), key, greedy=greedy)
        want_eps, want, _ = host.rollout(state, list(eps), key, greedy=greedy)
        assert "time/turns" in times and len(got) == compiled.env.max_turns
        assert [e.guesses for e in got_eps] == [e.guesses for e in want_eps]
        assert [(e.turn, e.success, e.ret) for e in got_eps] == [(e.turn, e.success, e.ret) for e in want_eps]
        for t in range(len(want)):  # the host loop stops once every game has ended
            for k in ("action", "action_mask", "reward", "done", "valid"):
                np.testing.assert_array_equal(got[t][k], want[t][k], err_msg=f"turn {t} {k} greedy={greedy}")
            # the same tokens in each state (the compiled context keeps a short reply's padding inside)
            assert compact(got[t]["state"], got[t]["state_mask"]) == compact(want[t]["state"], want[t]["state_mask"])
            live = [i for i, d in enumerate(want[t]["done"]) if not d]
            assert [compact(got[t]["next_state"], got[t]["next_mask"])[i] for i in live] == \
                [compact(want[t]["next_state"], want[t]["next_mask"])[i] for i in live]
            np.testing.assert_allclose(got[t]["logprobs"], want[t]["logprobs"], atol=1e-5)
        assert all(not np.asarray(got[t]["valid"]).any() for t in range(len(want), len(got)))
    # the random policy's sampled games run to the turn limit, with bad guesses and misses
    assert max(e.turn for e in got_eps) == compiled.env.max_turns and any("?" in e.guesses for e in got_eps)


def compact(ids, mask):
    return [[int(i) for i, m in zip(r, mr) if m] for r, mr in zip(np.asarray(ids), np.asarray(mask))]


def test_the_parser_reads_multi_character_tokens_as_their_text():
    """A vocabulary with tokens such as " 12", "3 ", "4\n" and "  " (as BPE vocabularies have): random id
    sequences parse as the host parses their decoded text."""
    import transformers
    from tokenizers import Tokenizer, decoders, models

    pieces = ["1", "2", "3", "12", " 12", "3 ", "4\n", "  ", " ", "\n", "07", "999", "a", "1a", " 5 ", "0"]
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{p: 4 + i for i, p in enumerate(pieces)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                               eos_token="<eos>", unk_token="<unk>", clean_up_tokenization_spaces=False)
    game = GuessNumberEnv(high=200, max_turns=8)
    classes = token_classes(tok, len(tok))
    assert classes["digits"][vocab[" 12"]] == 2 and classes["lead"][vocab[" 12"]] == 1
    assert classes["cls"][vocab["1a"]] == 0 and classes["cls"][vocab["  "]] == 1
    env = GuessNumberJax(game, np.zeros(1, np.int32), np.zeros((1, 1), np.int32), np.zeros((1, 1), np.int32),
                         classes, eos=2, pad=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, len(tok), size=(400, 4))
    ids[rng.random(400) < 0.3, rng.integers(1, 4)] = 2  # EOS somewhere in some rows
    ids[:40, 0], ids[:40, 1:] = rng.choice([vocab["12"], vocab[" 12"], vocab["3 "], vocab["07"]], 40), 2
    mask = np.ones_like(ids)
    got = np.asarray(env.parse(jnp.asarray(ids), jnp.asarray(mask))).tolist()
    want = [game._parse(t) or 0 for t in decode_completions(tok, ids, mask)]
    assert got == want and sum(w > 0 for w in want) >= 40


def test_wordle_splits_are_disjoint_and_the_warm_start_is_consistent():
    game = WordleEnv()
    splits = {s: set(game.secrets(s)) for s in ("train", "validation", "test")}
    assert not splits["train"] & splits["test"] and not splits["train"] & splits["validation"]
    assert not splits["validation"] & splits["test"] and set().union(*splits.values()) == set(WORDS)
    assert all(ep.secret in splits["test"] for ep in game.reset("test", 50, 0))
    assert wordle_feedback("crane", "nacre") == "yyyyg" and wordle_feedback("speed", "steel") == "g.gg." and wordle_feedback("speed", "crepe") == ".ygy."
    for p in game.sft_problems("train", 20, 0):
        assert game.sft_correct(p, p.target) and p.answer in splits["train"]
        assert all(wordle_feedback(g, p.answer) == r for g, r in zip(p.meta["guesses"], p.meta["replies"]))


def test_wordle_in_jax_matches_the_host_game():
    game = WordleEnv(max_turns=4)
    env = jax_form(game, TOK, len(TOK))
    assert isinstance(env, WordleJax) and env.append_len == 12
    texts = ["plane", " plane", "plane\n", "plan", "planes", "zzzzz", "p lane", "", "about", "ABOUT", "abou7", "crane"]
    ids, mask = utterance_ids(texts, n=8)
    got = np.asarray(env.parse(ids, mask)).tolist()
    assert got == [WORDS.index(t.strip()) if t.strip() in WORDS else -1 for t in texts]
    assert [g >= 0 for g in got] == [True] * 3 + [False] * 5 + [True] + [False] * 3
    secrets = ["crane", "about", "speed", "stone"]
    plays = [["stone", "about", "xx", "stone"], ["crane", "zz", "steel", "crane"], ["crane", "crane", "speed", "a"],
             ["about", "about", "about", "about"]]
    _, eps = play_scripted(env, game, secrets, plays, n=8)
    assert [e.success for e in eps] == [False, True, True, True]
    assert eps[0].replies == ["...gg", "bad", "bad", "y...."]  # "crane" is not a listed word


def test_twenty_questions_table_splits_and_warm_start():
    game = TwentyQuestionsEnv()
    assert len(set(OBJECTS.values())) == len(OBJECTS)  # questions alone can single out every object
    assert not set(OBJECTS) & set(ATTRIBUTES)
    splits = {s: set(game.secrets(s)) for s in ("train", "validation", "test")}
    assert sum(map(len, splits.values())) == len(OBJECTS) and set().union(*splits.values()) == set(OBJECTS)
    assert min(map(len, splits.values())) >= 5 and all(ep.secret in splits["test"] for ep in game.reset("test", 30, 0))
    ep = GameEpisode("cow")
    for said, reply in (("big", "yes"), ("flies", "no"), ("horse", "wrong"), ("dog", "bad"), ("food", "yes")):
        ep, reward, done = game.step(ep, f" {said}\n")
        assert (ep.replies[-1], reward, done) == (reply, -1.0, False)
    assert game.consistent(ep.guesses, ep.replies) == ["cow"]  # big, not flying, food, not the horse
    ep, reward, done = game.step(ep, "cow")
    assert (reward, done, ep.success, ep.ret) == (0.0, True, True, -5.0)
    problems = game.sft_problems("train", 200, 0)
    for p in problems:
        assert game.sft_correct(p, p.target) and p.answer in splits["train"]
        assert all(game.reply(g, p.answer) == r for g, r in zip(p.meta["guesses"], p.meta["replies"]))
    targets = [p.target for p in problems]
    assert any(t in ATTRIBUTES for t in targets) and any(t in OBJECTS for t in targets)  # asks and guesses
    assert not game.sft_correct(problems[0], "sun moon")
    asked = next(p for p in problems if any(g in ATTRIBUTES for g in p.meta["guesses"]))
    assert not game.sft_correct(asked, next(g for g in asked.meta["guesses"] if g in ATTRIBUTES))  # asked again


def test_twenty_questions_in_jax_matches_the_host_game():
    game = TwentyQuestionsEnv(max_turns=5)
    env = jax_form(game, TOK, len(TOK))
    assert isinstance(env, TwentyQuestionsJax)
    texts = ["cat", " cat", "cat\n", "ca", "cats", "big", "flies", "sweet ", "c at", "", "CAT", "tree", "rope", "zz"]
    ids, mask = utterance_ids(texts, n=8)
    phrases = list(OBJECTS) + list(ATTRIBUTES)
    got = np.asarray(env.parse(ids, mask)).tolist()
    assert got == [phrases.index(t.strip()) if t.strip() in phrases else -1 for t in texts]
    secrets = ["cow", "kite", "rope", "sun"]
    plays = [["big", "flies", "horse", "cow", "food"], ["flies", "round", "ball", "?", "kite"],
             ["long", "tool", "metal", "knife", "pencil"], ["sun", "big", "x", "y", "z"]]
    _, eps = play_scripted(env, game, secrets, [[p[t] for p in plays] for t in range(5)], n=8)
    assert [e.success for e in eps] == [True, True, False, True] and [e.turn for e in eps] == [4, 5, 5, 1]
    assert eps[1].replies == ["yes", "no", "wrong", "bad"] and eps[2].replies[:3] == ["yes", "yes", "no"]


def test_maze_mazes_splits_and_warm_start():
    game = MazeEnv()
    mazes = make_mazes(game.mazes, game.size)
    assert len(set(mazes)) == game.mazes
    for maze in mazes:  # perfect mazes: every cell reachable, one path (cells - 1 passages), walls agree both ways
        assert min(maze_distances(maze, game.size, 0)) == 0 and -1 not in maze_distances(maze, game.size, 0)
        assert sum(map(len, maze)) == 2 * (len(maze) - 1)
        for cell, open_ in enumerate(maze):
            for d in open_:
                assert {"n": "s", "e": "w", "s": "n", "w": "e"}[d] in maze[game.move(mazes.index(maze), cell, d)]
    splits = {s: set(game.maze_indices(s)) for s in ("train", "validation", "test")}
    assert set().union(*splits.values()) == set(range(game.mazes)) and sum(map(len, splits.values())) == game.mazes
    assert min(map(len, splits.values())) >= 5
    assert all(ep.secret[0] in splits["test"] for ep in game.reset("test", 40, 0))
    for m, start, goal in game.secrets("validation")[:50]:
        assert m in splits["validation"] and 4 <= maze_distances(mazes[m], game.size, start)[goal] <= 6
    # a scripted game: "goal 11 at 00 e", then east twice, a wall, a bad move, and on to the goal
    secret = next(s for s in game.secrets("train") + game.secrets("test") + game.secrets("validation")
                  if mazes[s[0]][s[1]] == "e" and s[1] == 0)
    ep = GameEpisode(secret)
    assert game.observation(ep).startswith(f"goal {game.cell(secret[2])} at 00 e\n")
    ep, reward, done = game.step(ep, "n")
    assert (ep.replies[-1], reward, done) == ("wall", -1.0, False)
    ep, reward, done = game.step(ep, " e\n")
    assert ep.replies[-1] == f"01 {mazes[secret[0]][1]}" and game.position(secret, ep.guesses) == 1
    ep, _, _ = game.step(ep, "east")
    assert ep.replies[-1] == "bad" and ep.guesses[-1] == "?"
    rng = random.Random(0)
    won = game.play(secret, game.explorer_move, rng)
    assert won.success and won.replies[-1] == "goal" and won.ret == 1 - won.turn
    problems = game.sft_problems("train", 300, 0)
    for p in problems:
        assert game.sft_correct(p, p.target) and p.meta["game"][0] in splits["train"]
        assert p.prompt == game.observation(GameEpisode(tuple(p.meta["game"]), p.meta["moves"], p.meta["replies"]))
    walled = next(p for p in problems if len(game.open_here(tuple(p.meta["game"]), p.meta["moves"], p.meta["replies"])) < 4)
    blocked = next(m for m in "nesw" if m not in game.open_here(tuple(walled.meta["game"]), walled.meta["moves"],
                                                                walled.meta["replies"]))
    assert not game.sft_correct(walled, blocked) and not game.sft_correct(walled, "x")
    # the explorer beats the warm-start's walk on test games: room to learn
    test = game.secrets("test")[::20]
    rule = game.summarize([game.play(s, game.rule_move, random.Random(1)) for s in test])["success"]
    explorer = game.summarize([game.play(s, game.explorer_move, random.Random(1)) for s in test])["success"]
    assert 0.3 < rule < explorer - 0.15


def test_maze_in_jax_matches_the_host_game():
    game = MazeEnv(max_turns=6)
    env = jax_form(game, TOK, len(TOK))
    assert isinstance(env, MazeJax)
    texts = ["n", " e", "s\n", "w ", "nn", "x", "", "N", "e s"]
    ids, mask = utterance_ids(texts, n=4)
    assert np.asarray(env.parse(ids, mask)).tolist() == [0, 1, 2, 3, -1, -1, -1, -1, -1]
    rng = random.Random(3)
    secrets = rng.sample(game.secrets("test"), 6)
    # per game: the explorer's moves with a wall and a bad move mixed in, so every kind of reply appears
    plays = []
    for s in secrets:
        moves = game.play(s, game.explorer_move, random.Random(0)).guesses
        walls = [d for d in "nesw" if d not in game.maze(s[0])[s[1]]]
        plays.append(([walls[0]] + ["?"] + moves + ["n"] * 6)[:6])
    state, eps = play_scripted(env, game, secrets, [[p[t] for p in plays] for t in range(6)], n=3)
    assert np.asarray(state.secret[:, 2]).tolist() == [game.position(e.secret, e.guesses) for e in eps]
    assert any(e.success for e in eps) and not all(e.success for e in eps)
    assert all(e.replies[:2] == ["wall", "bad"] for e in eps)


def test_the_shipped_game_configs_play_the_compiled_loop():
    from pathlib import Path

    from jaxrl_hier.config import build_dataclass, read_yaml
    from jaxrl_hier.llm_rl.guided import make_env, state_length
    from jaxrl_hier.llm_rl.guided_config import GuidedConfig
    from jaxrl_hier.llm_rl.turns import check_state_len

    for name in ("guided_game.yaml", "guided_guess64.yaml", "guided_wordle.yaml", "guided_twenty_questions.yaml",
                 "guided_maze.yaml"):
        raw = read_yaml(Path(__file__).resolve().parents[2] / "configs" / name)
        cfg = build_dataclass(GuidedConfig, {k: v for k, v in raw.items() if k != "algorithm"})
        cfg.validate()
        env = make_env(cfg)
        form = jax_form(env, TOK, len(TOK))
        assert cfg.turn_loop == "auto" and form is not None, name
        check_state_len(form, state_length(cfg, env))
        assert form.obs_len + (env.max_turns - 1) * form.append_len == state_length(cfg, env)  # no slack
