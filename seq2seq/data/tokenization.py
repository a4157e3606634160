"""Vocabularies from Hugging Face ``tokenizers`` (torchtext no longer loads on torch 2.13).

Every tokenizer of this project has the same four special tokens at the same ids, so that a model,
its checkpoint and its export bundle agree on them without asking the tokenizer.

``TokenizerSpec`` (a Hydra config schema) picks one of four levels:

* ``whitespace``: one token per whitespace-separated word, as the toy tasks are written. Decoding
  joins tokens with one space, so it inverts tokenization only for single-spaced text.
* ``word``: words with punctuation and symbols split off, for real text.
* ``bpe`` / ``unigram``: subwords (Sennrich et al., 2016; Kudo, 2018).

Why ``word``, ``bpe`` and ``unigram`` decode exactly: all three mark each space as ``▁`` (U+2581,
SentencePiece's mark) on the token that follows it, before anything is split (Metaspace with
``split=True``). A token then carries its own spacing ("Hello, world!" -> ``▁Hello`` ``,``
``▁world`` ``!``), and the Metaspace decoder only has to concatenate tokens and turn ``▁`` back
into a space; the mark that Metaspace adds before the first word is dropped again. Runs of spaces
become lone ``▁`` tokens; tabs, U+2028 and other whitespace stay characters of their own. So
``decode(encode(x)) == x`` for text ``x`` that ``corpora.normalize`` has produced (NFC, no outer
whitespace), as long as every token is in the vocabulary; with ``lowercase`` it gives
``x.lower()`` (except Greek final sigma: the tokenizer lowercases character by character). Text
that contains ``▁`` itself decodes with a space there.

A rule-based detokenizer ("no space before , . ! ?") cannot do this: "a , b" and "a, b" would
give the same tokens, and French puts a space before ! ? : ; that such rules remove. The price of
the mark is that a word after an opening bracket, quote or apostrophe is a different token from
the same word after a space (``homme`` in "l'homme", ``▁homme`` in "un homme").

As with every ``tokenizers`` vocabulary, text that spells out a special token ("<eos>") is
encoded as that token; neither Multi30k nor Tatoeba contains one.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from seq2seq.errors import ConfigError

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))

TokenizerLevel = Literal["whitespace", "word", "bpe", "unigram"]
SPACE_MARK = "\u2581"  # ▁, the mark SentencePiece uses for a space

# A punctuation mark or symbol, with the space mark before it if there is one, or any whitespace
# character that is not a space (spaces are marks by now). Symbols (\p{S}: € % + emoji) are split
# off like punctuation; ▁ is a symbol too (So), hence the class subtraction.
_WORD_BOUNDARY = Regex(rf"{SPACE_MARK}?[\p{{P}}\p{{S}}&&[^{SPACE_MARK}]]|\s")


def _metaspace_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # prepend_scheme="first" marks the first word like every other one (so "Hello" at the start
    # is the same token as in the middle) but, unlike "always", does not mark the text after a
    # special token spelled out in the input ("a<unk>b"), which would decode with a space there.
    return pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=True)


def _metaspace_decoder() -> decoders.Decoder:
    # The same settings as the pre-tokenizer: the decoder drops the mark of the first token only.
    return decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="first", split=True)


def _normalizer(lowercase: bool, nfc: bool) -> normalizers.Normalizer | None:
    # NFC although corpora.normalize already applies it: text typed into the translator may be
    # decomposed ("e" + U+0301), and would otherwise miss the training vocabulary.
    steps: list[normalizers.Normalizer] = [normalizers.NFC()] if nfc else []
    if lowercase:
        steps.append(normalizers.Lowercase())
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else normalizers.Sequence(steps)


def _word_level(
    pre_tokenizer: pre_tokenizers.PreTokenizer,
    decoder: decoders.Decoder | None,
    normalizer: normalizers.Normalizer | None,
    min_frequency: int,
    max_vocab_size: int | None,
) -> tuple[Tokenizer, trainers.Trainer]:
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    if decoder is not None:
        tokenizer.decoder = decoder
    trainer = trainers.WordLevelTrainer(
        vocab_size=max_vocab_size or 10**9,  # the trainer's size includes the special tokens
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    return tokenizer, trainer


def _train(tokenizer: Tokenizer, trainer: trainers.Trainer, texts: Iterable[str]) -> Tokenizer:
    tokenizer.train_from_iterator(texts, trainer=trainer)
    check_special_tokens(tokenizer, "a trained tokenizer")
    return tokenizer


def train_word_tokenizer(
    texts: Iterable[str], min_frequency: int = 1, max_vocab_size: int | None = None
) -> Tokenizer:
    """A word-level tokenizer that splits on whitespace, trained on ``texts``."""
    # No decoder: Tokenizer.decode then joins tokens with a space, which the toy tasks expect.
    tokenizer, trainer = _word_level(
        pre_tokenizers.WhitespaceSplit(), None, None, min_frequency, max_vocab_size
    )
    return _train(tokenizer, trainer, texts)


@dataclass(frozen=True)
class TokenizerSpec:
    """How to build a tokenizer from training text; the fields are the ``data.tokenizer`` config.

    ``vocab_size`` counts the special tokens. For ``bpe`` and ``unigram`` it is the size to train
    to (never exceeded: rare characters beyond it become ``<unk>``); for ``whitespace`` and
    ``word`` it caps the vocabulary at the most frequent words, 0 meaning no cap.
    ``min_frequency`` is the count a word (``whitespace``, ``word``) or a merged pair (``bpe``)
    needs to enter the vocabulary; ``unigram`` has no such threshold and refuses a value other
    than 1.
    """

    level: TokenizerLevel = "whitespace"
    vocab_size: int = 8000
    min_frequency: int = 1
    lowercase: bool = False

    def __post_init__(self) -> None:
        # Fail at instantiate time, naming the key, rather than after reading the corpus.
        if self.level not in get_args(TokenizerLevel):
            raise ConfigError(
                f"tokenizer level must be one of {', '.join(get_args(TokenizerLevel))}, got "
                f"{self.level!r}."
            )
        n_special = len(SPECIAL_TOKENS)
        if self.level in ("bpe", "unigram") and self.vocab_size <= n_special:
            raise ConfigError(
                f"vocab_size must be larger than the {n_special} special tokens for a "
                f"{self.level} tokenizer, got {self.vocab_size}."
            )
        if self.vocab_size < 0 or 0 < self.vocab_size <= n_special:
            raise ConfigError(
                f"vocab_size must be 0 (no cap) or larger than the {n_special} special tokens, "
                f"got {self.vocab_size}."
            )
        if self.min_frequency < 0:
            raise ConfigError(f"min_frequency must be >= 0, got {self.min_frequency}.")
        if self.level == "unigram" and self.min_frequency != 1:
            # Silently ignoring the setting would look like it worked.
            raise ConfigError(
                "min_frequency has no effect on a unigram tokenizer (its trainer has no such "
                f"threshold), got {self.min_frequency}: leave it at 1, or use level=bpe."
            )

    def train(self, texts: Iterable[str]) -> Tokenizer:
        """A tokenizer of this spec trained on ``texts``, with the special tokens at ids 0-3."""
        tokenizer, trainer = _BUILDERS[self.level](self)
        try:
            _train(tokenizer, trainer, texts)
        except Exception as error:
            if "not large enough to contain all chars" not in str(error):
                raise
            raise ConfigError(
                f"vocab_size={self.vocab_size} is too small for a unigram vocabulary of these "
                "texts, which must hold every character they contain: raise vocab_size."
            ) from None
        if self.level in ("bpe", "unigram") and tokenizer.get_vocab_size() > self.vocab_size:
            # The unigram trainer overshoots when vocab_size barely exceeds the alphabet.
            raise ConfigError(
                f"the {self.level} trainer made {tokenizer.get_vocab_size()} tokens although "
                f"vocab_size={self.vocab_size}: the texts have almost that many distinct "
                "characters. Raise vocab_size."
            )
        return tokenizer


def _whitespace(spec: TokenizerSpec) -> tuple[Tokenizer, trainers.Trainer]:
    normalizer = _normalizer(spec.lowercase, nfc=False)  # as train_word_tokenizer when not lowered
    return _word_level(
        pre_tokenizers.WhitespaceSplit(), None, normalizer, spec.min_frequency, spec.vocab_size
    )


def _word(spec: TokenizerSpec) -> tuple[Tokenizer, trainers.Trainer]:
    pre_tokenizer = pre_tokenizers.Sequence(
        [_metaspace_pre_tokenizer(), pre_tokenizers.Split(_WORD_BOUNDARY, behavior="isolated")]
    )
    normalizer = _normalizer(spec.lowercase, nfc=True)
    return _word_level(
        pre_tokenizer, _metaspace_decoder(), normalizer, spec.min_frequency, spec.vocab_size
    )


def _subword(
    spec: TokenizerSpec, model: models.Model, trainer: trainers.Trainer
) -> tuple[Tokenizer, trainers.Trainer]:
    tokenizer = Tokenizer(model)
    normalizer = _normalizer(spec.lowercase, nfc=True)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = _metaspace_pre_tokenizer()
    tokenizer.decoder = _metaspace_decoder()
    return tokenizer, trainer


def _bpe(spec: TokenizerSpec) -> tuple[Tokenizer, trainers.Trainer]:
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # Otherwise a text with more distinct characters than vocab_size exceeds it.
        limit_alphabet=spec.vocab_size - len(SPECIAL_TOKENS),
        show_progress=False,
    )
    return _subword(spec, models.BPE(unk_token=UNK, fuse_unk=True), trainer)


def _unigram(spec: TokenizerSpec) -> tuple[Tokenizer, trainers.Trainer]:
    trainer = trainers.UnigramTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        unk_token=UNK,
        show_progress=False,
    )
    return _subword(spec, models.Unigram(), trainer)


_BUILDERS: dict[str, Callable[[TokenizerSpec], tuple[Tokenizer, trainers.Trainer]]] = {
    "whitespace": _whitespace,
    "word": _word,
    "bpe": _bpe,
    "unigram": _unigram,
}


def train_tokenizers(
    spec: TokenizerSpec, src_texts: Sequence[str], tgt_texts: Sequence[str], joint: bool = False
) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers; ``joint``: one trained on both sides, returned twice."""
    if joint:
        tokenizer = spec.train(itertools.chain(src_texts, tgt_texts))
        return tokenizer, tokenizer
    return spec.train(src_texts), spec.train(tgt_texts)


def check_special_tokens(tokenizer: Tokenizer, origin: str) -> None:
    """Raise ValueError unless PAD, UNK, BOS and EOS have this project's ids."""
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != token_id:
            raise ValueError(
                f"{origin} does not map {token} to id {token_id} (it gives "
                f"{tokenizer.token_to_id(token)}); tokenizers of this project must start with "
                f"the special tokens {', '.join(SPECIAL_TOKENS)}. Rebuild it with "
                "seq2seq.data.tokenization."
            )


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens."""
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets, which nothing here
    # reads: 1.9 against 2.9 ms for the reverse task's 500 test sentences.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [encoding.ids for encoding in encode(list(texts))]


def unknown_words(tokenizer: Tokenizer, texts: Sequence[str]) -> Counter[str]:
    """How often each piece of ``texts`` that the vocabulary lacks (what the model reads as
    <unk>: a word-level vocabulary's unknown word, a subword one's unknown character) occurs."""
    found: Counter[str] = Counter()
    for text, encoding in zip(texts, tokenizer.encode_batch(list(texts)), strict=True):
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if token_id == UNK_ID:
                found[text[start:end].strip() or text[start:end]] += 1
    return found


def token_ids(tokenizer: Tokenizer, tokens: Sequence[str]) -> list[int]:
    """The ids of ``tokens`` (UNK for a token the vocabulary lacks)."""
    ids = [tokenizer.token_to_id(token) for token in tokens]
    return [UNK_ID if token_id is None else token_id for token_id in ids]


def decode(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Text of ``ids`` up to the first EOS, without PAD/BOS; unknown words stay visible as <unk>."""
    kept: list[int] = []
    for token_id in ids:
        if token_id == EOS_ID:
            break
        if token_id not in (PAD_ID, BOS_ID):
            kept.append(token_id)
    if isinstance(tokenizer.model, models.WordLevel) and isinstance(
        tokenizer.decoder, decoders.Metaspace
    ):
        # A word-level <unk> replaced a whole token, space mark included; most words follow a
        # space, so give it one back rather than glue it to the previous word ("a<unk> b").
        # (A subword <unk> stands for one character and the mark is a token of its own.)
        tokens = [
            f"{SPACE_MARK}{UNK}" if token_id == UNK_ID else tokenizer.id_to_token(token_id)
            for token_id in kept
        ]
        return tokenizer.decoder.decode([token for token in tokens if token is not None])
    return tokenizer.decode(kept, skip_special_tokens=False)
