"""``seq2seq.kernels.packing``: packed token rows against torch's own packing, and the training
loss on them (the accelerated decoders' ``teacher_forced_logits``) against the same loss on the
padded grid."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from benchmarks.step_benchmark import build_dropout_free, compose, random_batch
from seq2seq.kernels import library
from seq2seq.kernels.packing import pack_tokens
from seq2seq.models.decoder import AttentionDecoder
from seq2seq.training.loss import decoder_loss

needs_kernels = pytest.mark.skipif(
    library.library() is None, reason=f"no fused GRU here: {library.unavailable_reason()}"
)
TINY = ["model.hidden_size=16", "model.embedding_size=8", "data.batch_size=6", "threads=1"]


def padded_tokens(lengths: list[int], steps: int) -> torch.Tensor:
    """(B, T) distinct positive ids at the real positions, 0 at the padding."""
    lens = torch.tensor(lengths)
    tokens = torch.arange(1, len(lengths) * steps + 1).view(len(lengths), steps)
    return tokens.masked_fill(torch.arange(steps)[None, :] >= lens[:, None], 0)


@pytest.mark.parametrize(
    "lengths", [[6, 4, 3, 1], [1, 3, 4, 6], [2, 6, 1, 5], [5], [3, 3, 3]], ids=str
)
def test_rows_are_torchs_packed_order(lengths: list[int]) -> None:
    # Distinct lengths (or all equal) so that torch's unstable sort gives the same order.
    tokens = padded_tokens(lengths, 7)  # a padding column past the longest sentence
    packed = pack_tokens(tokens, torch.tensor(lengths))
    reference = pack_padded_sequence(tokens, torch.tensor(lengths), True, enforce_sorted=False)
    assert torch.equal(packed.tokens, reference.data)
    assert packed.batch_sizes == reference.batch_sizes.tolist()
    assert torch.equal(packed.sorted_indices, reference.sorted_indices)
    assert torch.equal(packed.unsorted_indices(), reference.unsorted_indices)
    assert torch.equal(packed.tokens, tokens.flatten()[packed.positions])


def test_each_row_names_its_sentence() -> None:
    tokens = torch.arange(4 * 5).reshape(4, 5)  # token b * 5 + t: its sentence is token // 5
    packed = pack_tokens(tokens, torch.tensor([2, 5, 1, 3]))
    assert torch.equal(packed.row_sentences(), packed.tokens.div(5, rounding_mode="floor"))


def test_ties_keep_the_batch_order() -> None:
    packed = pack_tokens(padded_tokens([2, 4, 2, 4], 4), torch.tensor([2, 4, 2, 4]))
    assert packed.sorted_indices.tolist() == [1, 3, 0, 2]
    assert packed.batch_sizes == [4, 4, 2, 2]


def test_pad_and_select_are_inverse_and_differentiable() -> None:
    lengths = [3, 5, 1]
    packed = pack_tokens(padded_tokens(lengths, 6), torch.tensor(lengths))
    rows = torch.randn(len(packed.tokens), 4, dtype=torch.float64, requires_grad=True)
    grid = packed.pad(rows)  # (B, T, 4)
    assert grid.shape == (3, 6, 4)
    real = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    assert torch.all(grid[~real] == 0)
    assert torch.equal(packed.select(grid), rows)
    assert torch.autograd.gradcheck(packed.pad, (rows,))
    padded = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(packed.select, (padded,))


@pytest.mark.parametrize("lengths", [[0, 2], [3, 8]], ids=["empty", "too long"])
def test_lengths_outside_the_grid_are_refused(lengths: list[int]) -> None:
    with pytest.raises(ValueError, match=r"every length must lie in \[1, 7\]"):
        pack_tokens(torch.ones(2, 7, dtype=torch.long), torch.tensor(lengths))


@needs_kernels
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("decoder", "attention"),
    [
        ("luong", "dot"),  # packed rows' attention in C (PackedProductAttention)
        ("luong", "scaled_dot"),
        ("luong", "general"),
        ("luong", "additive"),  # the padded grid's attention between pad and select
        ("bahdanau", "additive"),
    ],
)
def test_the_loss_on_packed_rows_equals_the_padded_loss(
    decoder: str, attention: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decoder_loss and every gradient, each decoder's packed rows against its own padded
    forward (same fused kernels, dropout off), on batches of mixed lengths in random order."""
    config = compose([*TINY, f"model.decoder={decoder}", f"attention={attention}"])
    model = build_dropout_free(config, vocab_size=20, device="cpu").train()
    batch = random_batch(6, 9, 20, "cpu", seed=seed)
    results = []
    real = int((batch["tgt_out"] != 0).sum())
    for packed in (True, False):
        memory, summary = model.encoder(batch["src"], batch["src_lens"])
        state = model.initial_state(summary, memory)
        if packed:
            source = model.decoder.prepare_source(memory, batch["src_lens"])
            logits, _ = model.decoder.teacher_forced_logits(
                batch["tgt_in"], batch["tgt_out"], state, source
            )
            assert logits.shape[0] == real
        else:  # the padded grid, through the same accelerated forward
            padded = AttentionDecoder.teacher_forced_logits
            monkeypatch.setattr(type(model.decoder), "teacher_forced_logits", padded)
        loss = decoder_loss(
            model.decoder, batch["tgt_in"], batch["tgt_out"], memory, batch["src_lens"], *state
        )
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append([loss.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "fused"),
    [
        (["model.decoder=luong"], True),
        (["model.decoder=luong", "model.kernels=off"], False),
        (["model=lstm", "model.decoder=luong"], False),
        (["model.decoder=bahdanau", "attention=additive"], True),
        (["model.decoder=bahdanau", "attention=dot"], True),
        (["model.decoder=bahdanau", "attention.coverage=true"], True),
        (["model.decoder=bahdanau", "attention.window=local_p", "attention.window_size=2"], True),
        (["model.decoder=bahdanau", "attention.layer_norm=true"], True),
        (["model.decoder=bahdanau", "model.kernels=off"], False),
    ],
    ids=[
        "luong",
        "unfused",
        "lstm",
        "bahdanau",
        "bahdanau-dot",
        "bahdanau-coverage",
        "bahdanau-local-p",
        "bahdanau-layer-norm",
        "bahdanau-unfused",
    ],
)
def test_packing_applies_where_the_kernels_run(overrides: list[str], fused: bool) -> None:
    model = build_dropout_free(compose([*TINY, *overrides]), vocab_size=20, device="cpu")
    batch = random_batch(6, 9, 20, "cpu")
    memory, summary = model.encoder(batch["src"], batch["src_lens"])
    state = model.initial_state(summary, memory)
    source = model.decoder.prepare_source(memory, batch["src_lens"])
    logits, targets = model.decoder.teacher_forced_logits(
        batch["tgt_in"], batch["tgt_out"], state, source
    )
    real = int((batch["tgt_out"] != 0).sum())
    if fused and library.library() is not None:  # the real tokens' rows only
        assert logits.shape == (real, 20) and targets.shape == (real,)
        assert bool((targets != 0).all())
    else:  # every position of the (B, T) grid, padding included
        assert logits.shape == (batch["tgt_out"].numel(), 20)
        assert int((targets != 0).sum()) == real
