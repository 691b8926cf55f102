"""A tiny offline character tokenizer as a Hugging Face fast tokenizer (one token per character).

Built with the `tokenizers` library: a WordLevel vocabulary over single characters, a
pre-tokenizer that isolates every character, and a Fuse decoder, so `decode(encode(text)) == text`
exactly (no spaces inserted). Ids: the specials first (<pad>=0, <bos>=1, <eos>=2 by default),
then <unk>, then the characters in the order given. Characters outside the vocabulary map to
<unk> (decoded back as "<unk>", or dropped with skip_special_tokens=True): a stray character in a
dataset never stops training. Encoding adds no BOS/EOS by itself; padding is on the left (for
batched generation).
"""

from __future__ import annotations

import string
import tempfile
from pathlib import Path

from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from jaxrl_hier.config import ConfigError
from jaxrl_hier.io import atomic_write_bytes

if TYPE_CHECKING:  # transformers takes seconds to import; load it only when a tokenizer is built
    import transformers

# Digits, the arithmetic / answer-line symbols, space and newline, a little punctuation and the
# lowercase letters: enough for the tasks' prompts and short English. 53 characters + 4 specials.
DEFAULT_CHARS = string.digits + "+-*/()=#" + " \n" + ".,?:'$%" + string.ascii_lowercase
DEFAULT_SPECIALS = ("<pad>", "<bos>", "<eos>")
UNK = "<unk>"


def build_char_tokenizer(chars: str = DEFAULT_CHARS, specials: tuple[str, ...] = DEFAULT_SPECIALS,
                         unk_token: str = UNK) -> transformers.PreTrainedTokenizerFast:
    """A character-level `PreTrainedTokenizerFast`: `specials` are (pad, bos, eos) and take ids
    0..2, `unk_token` comes next, then one id per character of `chars`."""
    if not isinstance(chars, str) or not chars:
        raise ConfigError("build_char_tokenizer: chars must be a non-empty string.")
    duplicates = sorted({c for c in chars if chars.count(c) > 1})
    if duplicates:
        raise ConfigError(f"build_char_tokenizer: chars holds duplicates {duplicates}; list each character once.")
    specials = tuple(specials)
    if len(specials) != 3 or len(set(specials + (unk_token,))) != 4 or any(len(s) < 2 for s in specials + (unk_token,)):
        raise ConfigError(f"build_char_tokenizer: specials must be three distinct multi-character strings "
                          f"(pad, bos, eos) different from unk_token={unk_token!r}, got {specials!r}.")
    vocab = {tok: i for i, tok in enumerate(specials + (unk_token,))}
    vocab.update({c: len(vocab) + i for i, c in enumerate(chars)})
    core = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    # [\s\S] matches every character, newline included.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    import transformers

    pad, bos, eos = specials
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk_token,
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=1 << 20)


def save_tokenizer(tokenizer: transformers.PreTrainedTokenizerBase, directory: str | Path) -> list[Path]:
    """Write `tokenizer.json`, `tokenizer_config.json` (and whatever else `save_pretrained`
    produces) into `directory`, each file atomically; `AutoTokenizer.from_pretrained(directory)`
    loads it back with identical ids. Returns the written paths."""
    directory = Path(directory)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for src in sorted(Path(tmp).iterdir()):
            if src.is_file():
                atomic_write_bytes(directory / src.name, src.read_bytes())
                written.append(directory / src.name)
    return written
