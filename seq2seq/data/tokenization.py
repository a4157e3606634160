"""Vocabularies from Hugging Face ``tokenizers`` (torchtext no longer loads on torch 2.13).

Every tokenizer of this project has the same four special tokens at the same ids, so that a model,
its checkpoint and its export bundle agree on them without asking the tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))


def train_word_tokenizer(
    texts: Iterable[str], min_frequency: int = 1, max_vocab_size: int | None = None
) -> Tokenizer:
    """A word-level tokenizer that splits on whitespace, trained on ``texts``."""
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(
        vocab_size=max_vocab_size or 10**9,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    check_special_tokens(tokenizer, "a trained tokenizer")
    return tokenizer


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
    return [encoding.ids for encoding in tokenizer.encode_batch(list(texts))]


def decode(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Text of ``ids`` up to the first EOS, without PAD/BOS; unknown words stay visible as <unk>."""
    kept: list[int] = []
    for token_id in ids:
        if token_id == EOS_ID:
            break
        if token_id not in (PAD_ID, BOS_ID):
            kept.append(token_id)
    return tokenizer.decode(kept, skip_special_tokens=False)
