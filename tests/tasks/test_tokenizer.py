"""The char tokenizer: one token per character, exact round trips, save + AutoTokenizer."""

import pytest
import transformers

from jaxrl_hier.config import ConfigError
from jaxrl_hier.tasks import DEFAULT_CHARS, build_char_tokenizer, save_tokenizer

TEXT = "5+3*4=\n3*4=12\n5+12=17\n#### 17\nmake 28 from 7 2 5 3:(7-2)*5+3  it's $4.50, 10%? ok/no"


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_vocabulary_layout(tok):
    assert len(set(DEFAULT_CHARS)) == len(DEFAULT_CHARS) and len(tok) == len(DEFAULT_CHARS) + 4 == 57
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens(list(range(4, 8))) == list(DEFAULT_CHARS[:4])
    assert tok.padding_side == "left"


def test_one_token_per_character_and_exact_round_trip(tok):
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT) and tok.unk_token_id not in ids  # no BOS/EOS added, nothing unknown
    assert ids == [4 + DEFAULT_CHARS.index(c) for c in TEXT]
    assert tok.decode(ids) == TEXT
    everything = DEFAULT_CHARS * 2
    assert tok.decode(tok(everything)["input_ids"]) == everything


def test_unknown_characters_map_to_unk(tok):
    ids = tok("1Zé2")["input_ids"]
    assert ids == [tok.convert_tokens_to_ids("1"), 3, 3, tok.convert_tokens_to_ids("2")]
    assert tok.decode(ids) == "1<unk><unk>2" and tok.decode(ids, skip_special_tokens=True) == "12"


def test_left_padding_batch(tok):
    batch = tok(["12", "1234"], padding=True)
    assert batch["input_ids"][0] == [0, 0] + tok("12")["input_ids"]
    assert batch["attention_mask"][0] == [0, 0, 1, 1]


def test_save_and_auto_tokenizer_load_identical(tok, tmp_path):
    written = save_tokenizer(tok, tmp_path / "tok")
    assert {p.name for p in written} >= {"tokenizer.json", "tokenizer_config.json"}
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    text = TEXT + "<eos>"  # special tokens written in text encode to their ids
    assert loaded(text)["input_ids"] == tok(text)["input_ids"] and tok(text)["input_ids"][-1] == 2
    assert loaded.get_vocab() == tok.get_vocab()
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token, loaded.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert loaded.padding_side == "left" and loaded.decode(loaded(TEXT)["input_ids"]) == TEXT


def test_a_run_loads_the_saved_tokenizer_beside_its_model_as_written(tok, tmp_path):
    # Beside a qwen2 config.json, AutoTokenizer would rebuild it as a Qwen2Tokenizer, whose
    # pre-tokenizer drops newlines: the step delimiter of worked solutions and hint lines.
    from jaxrl_hier.llm_rl.model_setup import policy_tokenizer

    save_tokenizer(tok, tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    loaded = policy_tokenizer(str(tmp_path), "grpo")
    text = "7-3=4\n#### 4\n"
    assert loaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text


def test_custom_chars_and_bad_arguments():
    small = build_char_tokenizer("01+#", specials=("[P]", "[B]", "[E]"))
    assert len(small) == 8 and small.decode(small("1+0#")["input_ids"]) == "1+0#"
    with pytest.raises(ConfigError, match="duplicates"):
        build_char_tokenizer("0112")
    with pytest.raises(ConfigError, match="specials"):
        build_char_tokenizer("01", specials=("<pad>", "<pad>", "<eos>"))
