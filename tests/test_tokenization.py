"""Tokenizer levels: special ids, splitting, vocabulary limits, serialization, and that decoding
inverts encoding on real and on hand-made text."""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from seq2seq.data.corpora import Pair, normalize, read_parallel, read_tsv, split_by_source
from seq2seq.data.tokenization import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK,
    UNK_ID,
    TokenizerLevel,
    TokenizerSpec,
    check_special_tokens,
    decode,
    encode_batch,
    train_tokenizers,
    train_word_tokenizer,
    unknown_words,
)
from seq2seq.errors import ConfigError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LEVELS: tuple[TokenizerLevel, ...] = ("whitespace", "word", "bpe", "unigram")
EXACT_LEVELS: tuple[TokenizerLevel, ...] = ("word", "bpe", "unigram")

# Spacing, punctuation and scripts that a careless detokenizer gets wrong.
TRICKY = [
    "Hello, world!",
    "a  b   c",
    "a\tb \t c",
    "...leading dots",
    "« Bonjour ! » dit-il.",
    "«Salut»",
    "L'homme qu'il a vu n'est pas là ; d’accord ?",
    "Über Äpfel, Öl und Größe: ja?",
    "line\u2028separator",
    "(paren) [bracket] {brace}",
    "\"quoted\" 'single'",
    "5€ / 20 % + emoji 😀!",
    "C'est l’été…",
    "¿Qué? ¡Sí!",
    "-- —dash— --",
    "x",
]


def spec_for(
    level: TokenizerLevel, vocab_size: int = 2000, lowercase: bool = False
) -> TokenizerSpec:
    # Word levels get no cap, so that every word of the training text is in the vocabulary.
    size = vocab_size if level in ("bpe", "unigram") else 0
    return TokenizerSpec(level=level, vocab_size=size, lowercase=lowercase)


def expected(text: str, level: TokenizerLevel, lowercase: bool = False) -> str:
    """What decoding the encoding of normalized ``text`` gives back."""
    if lowercase:
        text = text.lower()
    # Whitespace level: tokens are joined by one space whatever separated them.
    return " ".join(text.split()) if level == "whitespace" else text


def round_trip(tokenizer: Tokenizer, text: str) -> str:
    return decode(tokenizer, tokenizer.encode(text).ids)


@pytest.fixture(scope="module")
def tricky_tokenizers() -> dict[TokenizerLevel, Tokenizer]:
    texts = [normalize(text) for text in TRICKY] * 3
    return {level: spec_for(level, vocab_size=400).train(texts) for level in LEVELS}


# --- Special tokens, splitting, options ---------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_special_tokens_have_fixed_ids(level: TokenizerLevel) -> None:
    tokenizer = spec_for(level, vocab_size=200).train(TRICKY)
    check_special_tokens(tokenizer, level)
    assert [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3]


def test_whitespace_level_is_the_old_word_tokenizer() -> None:
    texts = ["the cat sat", "the  dog,  sat\there", "a cat"]
    spec_tokenizer = TokenizerSpec("whitespace", vocab_size=0).train(texts)
    assert spec_tokenizer.to_str() == train_word_tokenizer(texts).to_str()
    capped = TokenizerSpec("whitespace", vocab_size=6, min_frequency=2).train(texts)
    assert capped.to_str() == train_word_tokenizer(texts, 2, 6).to_str()
    encoding = spec_tokenizer.encode("the  dog,\tsat")
    assert encoding.tokens == ["the", "dog,", "sat"]  # whitespace only, punctuation stays on
    assert decode(spec_tokenizer, encoding.ids) == "the dog, sat"
    assert decode(spec_tokenizer, spec_tokenizer.encode("the zebra").ids) == f"the {UNK}"


def test_word_level_splits_punctuation_and_marks_spaces() -> None:
    tokenizer = TokenizerSpec("word", vocab_size=0).train(["Hello, world!", "« Salut ! »"])
    assert tokenizer.encode("Hello, world!").tokens == ["▁Hello", ",", "▁world", "!"]
    assert tokenizer.encode("« Salut ! »").tokens == ["▁«", "▁Salut", "▁!", "▁»"]
    assert round_trip(tokenizer, "Hello, world!") == "Hello, world!"


def test_word_level_unknown_word_keeps_its_space() -> None:
    tokenizer = TokenizerSpec("word", vocab_size=0).train(["a cat sat, and"])
    assert round_trip(tokenizer, "a zebra sat, and yak") == f"a {UNK} sat, and {UNK}"
    assert round_trip(tokenizer, "zebra") == UNK


@pytest.mark.parametrize("level", LEVELS)
def test_lowercase_option(level: TokenizerLevel) -> None:
    texts = ["Hello HELLO hello Über über"]
    lowered = spec_for(level, vocab_size=100, lowercase=True).train(texts)
    ids = lowered.encode("Hello HELLO hello").ids
    assert ids[: len(ids) // 3] * 3 == ids  # three times the same word
    assert round_trip(lowered, "Hello ÜBER") == "hello über"
    cased = spec_for(level, vocab_size=100).train(texts)
    assert round_trip(cased, "Hello HELLO Über") == "Hello HELLO Über"


@pytest.mark.parametrize("level", LEVELS)
def test_unknown_characters_do_not_crash(level: TokenizerLevel) -> None:
    tokenizer = spec_for(level, vocab_size=100).train(["abc abc, cab."])
    ids = tokenizer.encode("abc ☃ zq, 😀").ids
    assert UNK_ID in ids
    assert UNK in decode(tokenizer, ids)


@pytest.mark.parametrize("level", LEVELS)
def test_decode_stops_at_eos_and_drops_pad_and_bos(level: TokenizerLevel) -> None:
    tokenizer = spec_for(level, vocab_size=200).train(TRICKY)
    first = tokenizer.encode("Hello, world!").ids
    second = tokenizer.encode("«Salut»").ids
    ids = [BOS_ID, *first[:1], PAD_ID, *first[1:], EOS_ID, *second, EOS_ID, PAD_ID, PAD_ID]
    assert decode(tokenizer, ids) == expected("Hello, world!", level)
    assert decode(tokenizer, [BOS_ID, EOS_ID, *first]) == ""


def test_invalid_specs_fail_at_construction() -> None:
    with pytest.raises(ConfigError, match="level"):
        TokenizerSpec(level="char")  # type: ignore[arg-type]  # the typo a YAML file could hold
    with pytest.raises(ConfigError, match="vocab_size"):
        TokenizerSpec(level="bpe", vocab_size=0)
    with pytest.raises(ConfigError, match="vocab_size"):
        TokenizerSpec(level="word", vocab_size=3)
    with pytest.raises(ConfigError, match="min_frequency"):
        TokenizerSpec(level="unigram", min_frequency=2)


def test_unigram_vocab_smaller_than_alphabet_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        TokenizerSpec("unigram", vocab_size=8).train(["abcdefghijklmnop"])


# --- Round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_round_trip_on_tricky_text(
    level: TokenizerLevel, lowercase: bool, tricky_tokenizers: dict[TokenizerLevel, Tokenizer]
) -> None:
    tokenizer = tricky_tokenizers[level]
    if lowercase:
        tokenizer = spec_for(level, 400, lowercase=True).train([normalize(t) for t in TRICKY])
    for text in map(normalize, TRICKY):
        ids = tokenizer.encode(text).ids
        assert UNK_ID not in ids, text
        assert decode(tokenizer, ids) == expected(text, level, lowercase), text


# Letters, accents, spaces of several kinds and punctuation that glues to either side; no ▁
# (the space mark itself) and no "<" (no special token can be spelled out).
ALPHABET = "aAbzäÄéÉßœ  \t\u2028'’«»,.!?;:-()\"…0"
alphabet_text = st.text(alphabet=ALPHABET, max_size=40).map(normalize)


@pytest.fixture(scope="module")
def alphabet_tokenizers() -> dict[TokenizerLevel, Tokenizer]:
    # Every character appears in training, so every text over the alphabet is covered.
    corpus = [ALPHABET, " ".join(ALPHABET), "Abz « äÄ » ; éÉ, ßœ !", "aa bb zz ÄÄ"] * 5
    return {level: spec_for(level, vocab_size=120).train(corpus) for level in ("bpe", "unigram")}


@settings(max_examples=150, deadline=None)
@given(text=alphabet_text)
@pytest.mark.parametrize("level", ["bpe", "unigram"])
def test_subword_round_trip_on_generated_text(
    level: TokenizerLevel, text: str, alphabet_tokenizers: dict[TokenizerLevel, Tokenizer]
) -> None:
    tokenizer = alphabet_tokenizers[level]
    ids = tokenizer.encode(text).ids
    assert UNK_ID not in ids
    assert decode(tokenizer, ids) == text


@settings(max_examples=100, deadline=None)
@given(text=alphabet_text, lowercase=st.booleans())
@pytest.mark.parametrize("level", EXACT_LEVELS)
def test_text_seen_in_training_round_trips(
    level: TokenizerLevel, text: str, lowercase: bool
) -> None:
    # Trained on the text itself, so that every word is in a word-level vocabulary too.
    tokenizer = spec_for(level, vocab_size=200, lowercase=lowercase).train([text])
    assert round_trip(tokenizer, text) == expected(text, level, lowercase)


def corpus_or_skip(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared data directory holds the real corpora)")
    return path


@pytest.fixture(scope="module")
def multi30k() -> tuple[list[Pair], list[Pair]]:
    root = corpus_or_skip(DATA / "multi30k")
    train = read_parallel(root / "train.de", root / "train.en")
    val = read_parallel(root / "val.de", root / "val.en")
    return train[:8000], val  # a training subset keeps unigram training to about a second


@pytest.fixture(scope="module")
def tatoeba() -> tuple[list[Pair], list[Pair]]:
    pairs = read_tsv(corpus_or_skip(DATA / "tatoeba-fra-eng" / "fra.txt"))
    splits = split_by_source(pairs, val_size=1000, test_size=0, seed=1)
    return splits["train"][::18], splits["val"][:1000]  # the file is sorted by length


def check_real_round_trip(
    level: TokenizerLevel, lowercase: bool, train: Sequence[Pair], val: Sequence[Pair]
) -> None:
    spec = spec_for(level, vocab_size=2000, lowercase=lowercase)
    tokenizer, same = train_tokenizers(spec, [s for s, _ in train], [t for _, t in train], True)
    assert tokenizer is same
    texts = [side for pair in val for side in pair]
    covered = 0
    for text, ids in zip(texts, encode_batch(tokenizer, texts), strict=True):
        decoded = decode(tokenizer, ids)
        if UNK_ID in ids:
            assert UNK in decoded
            continue
        covered += 1
        assert decoded == expected(text, level, lowercase), text
    # Lines with an unknown word or character cannot round-trip: they must be few.
    min_covered = 0.98 if level in ("bpe", "unigram") else 0.3
    assert covered >= min_covered * len(texts), (covered, len(texts))


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_round_trip_on_multi30k(
    level: TokenizerLevel, lowercase: bool, multi30k: tuple[list[Pair], list[Pair]]
) -> None:
    check_real_round_trip(level, lowercase, *multi30k)


@pytest.mark.parametrize("level", LEVELS)
def test_round_trip_on_tatoeba(
    level: TokenizerLevel, tatoeba: tuple[list[Pair], list[Pair]]
) -> None:
    # Lowercased: French capitals (É, À) and English ones meet their lowercase forms.
    check_real_round_trip(level, level != "whitespace", *tatoeba)


# --- Vocabulary sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["bpe", "unigram"])
@pytest.mark.parametrize("vocab_size", [150, 600])
def test_subword_vocab_size_is_respected(level: TokenizerLevel, vocab_size: int) -> None:
    texts = [normalize(text) for text in TRICKY] * 20 + [f"w{n} v{n * 7}" for n in range(300)]
    tokenizer = TokenizerSpec(level, vocab_size=vocab_size).train(texts)
    assert len(SPECIAL_TOKENS) < tokenizer.get_vocab_size() <= vocab_size


def test_bpe_vocab_smaller_than_alphabet_keeps_the_frequent_characters() -> None:
    tokenizer = TokenizerSpec("bpe", vocab_size=10).train(["aaaa bbb cc dd ee k"])
    assert tokenizer.get_vocab_size() <= 10
    assert decode(tokenizer, tokenizer.encode("ab k").ids) == f"ab {UNK}"


@pytest.mark.parametrize("level", ["whitespace", "word"])
def test_word_vocab_cap_and_min_frequency(level: TokenizerLevel) -> None:
    texts = ["the cat , the dog . the cat !", "a cat , a bird", "one-off words here"]
    full = TokenizerSpec(level, vocab_size=0).train(texts)
    capped = TokenizerSpec(level, vocab_size=7).train(texts)
    assert capped.get_vocab_size() == 7 < full.get_vocab_size()
    # The cap keeps the most frequent words.
    counts = Counter(
        token for text in texts for token in full.encode(text).tokens if token not in SPECIAL_TOKENS
    )
    kept = set(capped.get_vocab()) - set(SPECIAL_TOKENS)
    assert min(counts[token] for token in kept) >= max(
        count for token, count in counts.items() if token not in kept
    )
    frequent = TokenizerSpec(level, vocab_size=0, min_frequency=2).train(texts)
    assert set(frequent.get_vocab()) - set(SPECIAL_TOKENS) == {
        token for token, count in counts.items() if count >= 2
    }


# --- Serialization and joint vocabularies -------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_serialization_round_trip(level: TokenizerLevel, tmp_path: Path) -> None:
    tokenizer = spec_for(level, vocab_size=300, lowercase=True).train(TRICKY[:-3])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    copies = [Tokenizer.from_str(tokenizer.to_str()), Tokenizer.from_file(str(path))]
    texts = [*map(normalize, TRICKY), "Unseen ZEBRA, ☃ (new) words!"]
    expected_ids = encode_batch(tokenizer, texts)
    for copy in copies:
        check_special_tokens(copy, "a copy")
        assert copy.get_vocab() == tokenizer.get_vocab()
        assert encode_batch(copy, texts) == expected_ids
        # Decoding of unknown words too: the word-level <unk> rule must still recognize the copy.
        assert [decode(copy, ids) for ids in expected_ids] == [
            decode(tokenizer, ids) for ids in expected_ids
        ]


@pytest.mark.parametrize("level", LEVELS)
def test_joint_and_separate_vocabularies(level: TokenizerLevel) -> None:
    src = ["der Hund läuft schnell ."] * 5
    tgt = ["the dog runs quickly ."] * 5
    spec = spec_for(level, vocab_size=200)
    src_tok, tgt_tok = train_tokenizers(spec, src, tgt, joint=True)
    assert src_tok is tgt_tok
    for text in (src[0], tgt[0]):
        assert UNK_ID not in src_tok.encode(text).ids
    src_tok, tgt_tok = train_tokenizers(spec, src, tgt, joint=False)
    assert src_tok is not tgt_tok and src_tok.get_vocab() != tgt_tok.get_vocab()
    assert UNK_ID not in src_tok.encode(src[0]).ids
    assert UNK_ID in src_tok.encode("quickly").ids  # "q", "y" and the word are English only


def test_normalized_text_is_nfc() -> None:
    # The round-trip promise is for normalized text: a decomposed é comes back composed.
    tokenizer = TokenizerSpec("bpe", vocab_size=100).train(["café"])
    decomposed = unicodedata.normalize("NFD", "café")
    assert round_trip(tokenizer, decomposed) == "café"


@pytest.mark.parametrize("level", ["whitespace", "word"])
def test_unknown_words_are_the_source_pieces_read_as_unk(level: TokenizerLevel) -> None:
    """What translate reports: each word the vocabulary lacks, as the user wrote it, counted."""
    tokenizer = spec_for(level).train(["the dog sees a cat ."] * 3)
    found = unknown_words(tokenizer, ["the zebra eats a pizza .", "a zebra .", "the dog ."])
    assert found == Counter({"zebra": 2, "eats": 1, "pizza": 1})
    assert not unknown_words(tokenizer, ["the cat sees a dog ."])
