"""The Transformer (Vaswani et al., 2017), with the scoring function of every attention pluggable.

Shape legend: B batch, S source length, T target length, D model size (``d_model``), F the
feed-forward size (``d_ff``), h heads, d = D / h, V target vocabulary, L layers.

- Encoder layer: self-attention (queries, keys and values are the layer's input; padded source
  positions masked), then the position-wise feed-forward network
  ``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``; each sublayer wrapped in a residual connection and
  LayerNorm: ``LayerNorm(x + Dropout(Sublayer(x)))`` (post-norm, the paper's) or
  ``x + Dropout(Sublayer(LayerNorm(x)))`` (pre-norm, ``norm_first``: steadier for deep stacks;
  the stack then ends with one more LayerNorm).
- Decoder layer: causal self-attention (position t attends to positions 1..t: ``valid_lens`` of
  shape (B, T) holding 1..T, the masking chapter's own trick, so one masked softmax serves all),
  cross-attention (the decoder's queries against the encoder's outputs), the FFN.
- Embeddings scaled by √D, plus sinusoidal positions (section 3.5); the target embedding is the
  output layer's weight when ``tie_embeddings`` (Press and Wolf, 2017).

Every attention is a ``MultiHeadAttention`` around the ``attention=`` group's scoring function
(scaled dot-product by default; additive, dot and general too). Decoding caches each layer's
self-attention keys and values (``decode_step``: one new position per step, the prefix never
recomputed) and projects the encoder's outputs into every layer's cross-attention keys and values
once per batch (``prepare_source``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.attention import Attention, AttentionParts, MultiHeadAttention, head_size
from seq2seq.errors import ConfigError
from seq2seq.models.decoder import per_hypothesis, queries_per_sentence, select_sentences
from seq2seq.models.embedding import Embedding
from seq2seq.models.model import EncoderDecoder

AttentionFactory = Callable[..., Attention]


def sinusoidal_positions(positions: Tensor, size: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...): positions (T,) -> (T, D)."""
    frequencies = torch.exp(
        torch.arange(0, size, 2, device=positions.device, dtype=torch.float32)
        * (-math.log(10000.0) / size)
    )  # (ceil(D/2),)
    angles = positions.float()[:, None] * frequencies[None, :]  # (T, ceil(D/2))
    table = torch.zeros(positions.shape[0], size, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : size // 2])
    return table  # (T, D)


class PositionWiseFFN(nn.Module):
    """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``, applied to each position on its own (eq. 2)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        return self.W_2(self.dropout(torch.relu(self.W_1(x))))  # (..., F) inside


Extra = TypeVar("Extra")


class Residual(nn.Module):
    """A sublayer's residual connection and LayerNorm, post-norm or pre-norm."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``x + sublayer(x)``, normed after (post-norm) or the sublayer's input normed before."""
        return self.around(x, lambda y: (sublayer(y), None))[0]

    def around(
        self, x: Tensor, sublayer: Callable[[Tensor], tuple[Tensor, Extra]]
    ) -> tuple[Tensor, Extra]:
        """``forward`` for a sublayer that also returns something besides its output (attention
        weights, a cache): (x + sublayer(x), that)."""
        if self.norm_first:
            output, extra = sublayer(self.norm(x))
            return x + self.dropout(output), extra
        output, extra = sublayer(x)
        return self.norm(x + self.dropout(output)), extra


def multi_head(
    attention: AttentionFactory,
    num_heads: int,
    d_model: int,
    dropout: float,
    parts: AttentionParts | None = None,
) -> MultiHeadAttention:
    """A multi-head attention of the model's size around a scoring function of the head's size,
    with the attention's ``parts`` (a normalizer; none by default)."""
    size = head_size(d_model, num_heads, f"model.d_model={d_model}")
    scoring = attention(query_size=size, key_size=size)
    return MultiHeadAttention(
        scoring, num_heads, d_model, d_model, d_model, d_model, bias=True, dropout=dropout
    ).use_parts(parts or AttentionParts(), d_model)


class TransformerEncoderLayer(nn.Module):
    def __init__(
        self,
        attention: AttentionFactory,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float,
        norm_first: bool,
        parts: AttentionParts | None = None,
    ) -> None:
        super().__init__()
        self.self_attention = multi_head(attention, num_heads, d_model, attention_dropout, parts)
        self.ffn = PositionWiseFFN(d_model, d_ff, dropout)
        self.attention_residual = Residual(d_model, dropout, norm_first)
        self.ffn_residual = Residual(d_model, dropout, norm_first)

    def forward(self, x: Tensor, src_lens: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, S, D), src_lens (B,) -> (B, S, D), self-attention weights (B, h, S, S)."""
        x, weights = self.attention_residual.around(x, lambda y: self.attend(y, src_lens))
        return self.ffn_residual(x, self.ffn), weights

    def attend(self, y: Tensor, src_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention, Q = K = V = y (B, S, D) -> context (B, S, D), weights (B, h, S, S)."""
        context, weights = self.self_attention(y, y, y, src_lens)
        assert weights is not None  # asked for by default
        return context, weights


class TransformerEncoder(nn.Module):
    """Embeddings (× √D) plus positions, then ``num_layers`` encoder layers."""

    def __init__(
        self,
        vocab_size: int,
        attention: AttentionFactory,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        dropout: float,
        attention_dropout: float,
        norm_first: bool,
        padding_idx: int,
        parts: AttentionParts | None = None,
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                attention, d_model, num_heads, d_ff, dropout, attention_dropout, norm_first, parts
            )
            for _ in range(num_layers)
        )
        # Pre-norm leaves the last layer's output unnormalised: one more LayerNorm.
        self.final_norm = nn.LayerNorm(d_model) if norm_first else None
        self.output_size = d_model

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, None]:
        """src (B, S), src_lens (B,) -> memory (B, S, D), and no summary (the decoder starts
        from nothing but its BOS)."""
        x = embed(self.embedding, src, 0, self.dropout)  # (B, S, D)
        for layer in self.layers:
            x, _ = layer(x, src_lens)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, None


def embed(embedding: Embedding, tokens: Tensor, start: int, dropout: nn.Module) -> Tensor:
    """tokens (B, T) at positions start.. -> dropout(√D · embedding + PE), (B, T, D)."""
    size = embedding.embedding_dim
    positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)  # (T,)
    scaled = embedding(tokens) * math.sqrt(size)  # (B, T, D)
    return dropout(scaled + sinusoidal_positions(positions, size).to(scaled.dtype))


@dataclass
class TransformerSource:
    """What every decoding step reads, computed once per source batch: the encoder's outputs and
    every decoder layer's cross-attention keys and values, head by head."""

    memory: Tensor  # (B, S, D)
    src_lens: Tensor  # (B,)
    cross_keys: list[Tensor]  # per layer: MultiHeadAttention.project_keys(memory), (B·h, S, ·)
    cross_values: list[Tensor]  # per layer: project_values(memory), (B·h, S, d)

    def index_select(self, indices: Tensor) -> TransformerSource:
        """Sentences in the order of ``indices`` (B',); the keys and values hold h rows each."""
        sentences = len(self.src_lens)
        return TransformerSource(
            self.memory.index_select(0, indices),
            self.src_lens.index_select(0, indices),
            [select_sentences(keys, indices, sentences) for keys in self.cross_keys],
            [select_sentences(values, indices, sentences) for values in self.cross_values],
        )


# The decoding state: per layer, the self-attention's cached keys (B, h, t, ·) and values
# (B, h, t, d) of the t positions decoded so far. Sentence-major, so search can reorder rows.
TransformerState = tuple[Tensor, ...]


class TransformerDecoderLayer(nn.Module):
    def __init__(
        self,
        attention: AttentionFactory,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float,
        norm_first: bool,
        parts: AttentionParts | None = None,
    ) -> None:
        super().__init__()
        self.self_attention = multi_head(attention, num_heads, d_model, attention_dropout, parts)
        self.cross_attention = multi_head(attention, num_heads, d_model, attention_dropout, parts)
        self.ffn = PositionWiseFFN(d_model, d_ff, dropout)
        self.self_residual = Residual(d_model, dropout, norm_first)
        self.cross_residual = Residual(d_model, dropout, norm_first)
        self.ffn_residual = Residual(d_model, dropout, norm_first)

    def forward(
        self,
        x: Tensor,
        self_lens: Tensor,
        source: TransformerSource,
        layer: int,
        cache: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None, tuple[Tensor, Tensor]]:
        """x (R, Tq, D): the layer's input at the Tq positions computed now; ``self_lens``
        (R, Tq): how many positions each may read (causality); ``cache``: the self-attention's
        keys (R, h, t, ·) and values (R, h, t, d) of the t positions before them (decoding), or
        None (teacher forcing, t = 0). -> (R, Tq, D), the cross-attention weights (R, h, Tq, S)
        or None, and the keys and values of all t + Tq positions (the next step's cache)."""
        x, keys_values = self.self_residual.around(
            x, lambda y: self.attend_self(y, self_lens, cache)
        )
        x, weights = self.cross_residual.around(
            x, lambda y: self.attend_source(y, source, layer, need_weights)
        )
        return self.ffn_residual(x, self.ffn), weights, keys_values

    def attend_self(
        self, y: Tensor, self_lens: Tensor, cache: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Causal self-attention of the Tq new positions y (R, Tq, D) over the cached ones and
        themselves -> context (R, Tq, D), and the keys (R, h, t + Tq, ·) and values
        (R, h, t + Tq, d) of all positions so far (the next step's cache)."""
        attention = self.self_attention
        keys, values = attention.project_keys(y), attention.project_values(y)  # (R·h, Tq, ·)
        if cache is not None:
            keys = torch.cat([cache[0].flatten(0, 1), keys], dim=1)  # (R·h, t + Tq, ·)
            values = torch.cat([cache[1].flatten(0, 1), values], dim=1)
        context, _ = attention(
            y, y, y, self_lens, projected_keys=keys, projected_values=values, need_weights=False
        )
        heads = (y.shape[0], attention.num_heads)
        return context, (keys.unflatten(0, heads), values.unflatten(0, heads))

    def attend_source(
        self, y: Tensor, source: TransformerSource, layer: int, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention of y (R, Tq, D) over the source's keys and values of this layer ->
        context (R, Tq, D), weights (R, h, Tq, S) or None. R may be K hypotheses per sentence
        (beam search): they read their sentence's one copy of the source."""
        rows, steps = y.shape[:2]
        queries = queries_per_sentence(y, source.src_lens.shape[0])  # (B, K·Tq, D)
        context, weights = self.cross_attention(
            queries, queries, queries, source.src_lens,
            projected_keys=source.cross_keys[layer],
            projected_values=source.cross_values[layer],
            need_weights=need_weights,
        )  # fmt: skip
        if weights is not None:  # (B, h, K·Tq, S) -> (R, h, Tq, S)
            weights = per_hypothesis(weights, rows, steps, dim=2)
        return per_hypothesis(context, rows, steps), weights


class TransformerDecoder(nn.Module):
    """Target embeddings (× √D) plus positions, ``num_layers`` decoder layers, the output layer
    (the target embedding's weight when ``tie_embeddings``, with a bias of its own)."""

    def __init__(
        self,
        vocab_size: int,
        attention: AttentionFactory,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        dropout: float,
        attention_dropout: float,
        norm_first: bool,
        tie_embeddings: bool,
        padding_idx: int,
        parts: AttentionParts | None = None,
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(
                attention, d_model, num_heads, d_ff, dropout, attention_dropout, norm_first, parts
            )
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else None
        # Tied: the logits are x Eᵀ + b with E the embedding's own weight (not a second parameter
        # sharing its storage, which safetensors will not save).
        self.output_layer: nn.Linear | None = None
        self.output_bias: nn.Parameter | None = None
        if tie_embeddings:
            self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        else:
            self.output_layer = nn.Linear(d_model, vocab_size)

    def prepare_source(self, memory: Tensor, src_lens: Tensor) -> TransformerSource:
        """Every layer's cross-attention keys and values, once per batch. memory (B, S, D)."""
        layers = [layer.cross_attention for layer in self.decoder_layers()]
        keys = [attention.project_keys(memory) for attention in layers]
        values = [attention.project_values(memory) for attention in layers]
        return TransformerSource(memory, src_lens, keys, values)

    def decoder_layers(self) -> list[TransformerDecoderLayer]:
        """``self.layers``, typed (a ``ModuleList`` yields plain modules)."""
        return [layer for layer in self.layers if isinstance(layer, TransformerDecoderLayer)]

    def init_state(self, summary: Tensor | None) -> TransformerState:
        """Nothing before the first step: the caches start empty (``decode_step``)."""
        return ()

    def logits(self, x: Tensor) -> Tensor:
        """The last layer's output (..., D) -> logits (..., V)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.output_layer is not None:
            return self.output_layer(x)
        return F.linear(x, self.embedding.weight, self.output_bias)

    def run(
        self, tgt_in: Tensor, source: TransformerSource, need_weights: bool
    ) -> tuple[Tensor, list[Tensor | None]]:
        """Teacher forcing, all T positions at once: tgt_in (B, T) -> the last layer's output
        (B, T, D) and each layer's cross-attention weights (B, h, T, S) (None without
        ``need_weights``)."""
        batch, steps = tgt_in.shape
        x = embed(self.embedding, tgt_in, 0, self.dropout)  # (B, T, D)
        # Position t reads positions 1..t: valid_lens (B, T) holding 1..T.
        causal = torch.arange(1, steps + 1, device=tgt_in.device).expand(batch, steps)
        weights = []
        for index, layer in enumerate(self.layers):
            x, layer_weights, _ = layer(x, causal, source, index, need_weights=need_weights)
            weights.append(layer_weights)
        return x, weights

    def forward(
        self,
        tgt_in: Tensor,
        state: TransformerState,
        source: TransformerSource,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), and the last layer's
        cross-attention weights averaged over its heads (B, T, S) or None."""
        x, weights = self.run(tgt_in, source, need_weights)
        last = weights[-1]
        return self.logits(x), None if last is None else last.mean(dim=1)

    def teacher_forced_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: TransformerState, source: TransformerSource
    ) -> tuple[Tensor, Tensor]:
        """What the loss reads: logits (B·T, V) and targets (B·T,) (PAD where padded)."""
        logits, _ = self(tgt_in, state, source, need_weights=False)  # (B, T, V)
        return logits.flatten(0, 1), tgt_out.flatten()

    def teacher_forced_logits_and_weights(
        self, tgt_in: Tensor, tgt_out: Tensor, state: TransformerState, source: TransformerSource
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``teacher_forced_logits`` and the weights of ``forward`` (B, T, S), what the losses on
        the attention read (alignment, coverage)."""
        logits, weights = self(tgt_in, state, source, need_weights=True)  # (B, T, V)
        assert weights is not None  # asked for
        return logits.flatten(0, 1), tgt_out.flatten(), weights

    def decode_step(
        self, prev_tokens: Tensor, state: TransformerState, source: TransformerSource
    ) -> tuple[Tensor, TransformerState, Tensor]:
        """One new position for each of the R rows: prev_tokens (R,) -> logits (R, V), the caches
        with it appended, and the last layer's cross-attention weights averaged over its heads
        (R, S). The prefix is read from the caches, never recomputed."""
        start = state[0].shape[2] if state else 0  # the positions decoded so far
        rows = prev_tokens.shape[0]
        x = embed(self.embedding, prev_tokens[:, None], start, self.dropout)  # (R, 1, D)
        self_lens = torch.full((rows, 1), start + 1, device=prev_tokens.device)  # all of them
        new_state: list[Tensor] = []
        weights: Tensor | None = None
        for index, layer in enumerate(self.layers):
            cache = (state[2 * index], state[2 * index + 1]) if state else None
            x, weights, (keys, values) = layer(x, self_lens, source, index, cache)
            new_state += [keys, values]
        assert weights is not None  # asked for by default
        return self.logits(x[:, 0]), tuple(new_state), weights[:, :, 0].mean(dim=1)

    def cross_attention_weights(self, tgt_in: Tensor, source: TransformerSource) -> Tensor:
        """Every layer's and head's cross-attention under teacher forcing: (B, L, h, T, S)."""
        _, weights = self.run(tgt_in, source, need_weights=True)
        return torch.stack([w for w in weights if w is not None], dim=1)


def xavier_init(model: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every linear layer of ``model`` (the
    embeddings keep N(0, 1/D), seq2seq.models.embedding), as Joey NMT and tensor2tensor start
    a Transformer (``model.init=xavier``). ``nn.Linear``'s own U(±1/√fan_in) (``init=pytorch``)
    is narrower: a standard deviation √3 times smaller in the D × D projections, 2.2 times in
    the FFN's W_2 at F = 4D. Neither wins everywhere (docs/performance.md): unscaled dot products
    suffer most from the wider start (claim 1's saturation: q·k grows with the square of the
    projections' scale)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


class Transformer(EncoderDecoder):
    """The encoder–decoder Transformer, every attention a ``MultiHeadAttention`` around the
    ``attention`` group's scoring function (built for the head size ``d_model / num_heads``).

    ``dropout`` acts on the embeddings, every residual branch and inside the FFN;
    ``attention_dropout`` on the attention weights (default: ``dropout``). ``init``: the linear
    layers' start, ``"pytorch"`` (``nn.Linear``'s) or ``"xavier"`` (``xavier_init``).
    ``attention_parts``: the normalizer of every attention (``AttentionParts``; a window or a key
    bias is refused, ``check_transformer_parts``)."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        attention: AttentionFactory,
        d_model: int = 256,
        num_heads: int = 4,
        d_ff: int = 1024,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        norm_first: bool = False,
        tie_embeddings: bool = True,
        padding_idx: int = 0,
        init: str = "pytorch",
        attention_parts: AttentionParts | None = None,
    ) -> None:
        super().__init__()
        check_transformer_parts(attention_parts)
        if init not in ("pytorch", "xavier"):
            raise ConfigError(
                f"model.init must be pytorch (nn.Linear's own initialisation) or xavier "
                f"(Xavier-uniform weights, zero biases), got {init!r}."
            )
        for name, size in [
            ("d_model", d_model), ("d_ff", d_ff),
            ("encoder_layers", encoder_layers), ("decoder_layers", decoder_layers),
        ]:  # fmt: skip
            if type(size) is not int or size < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {size!r}.")
        # Checked before anything is built; multi_head checks it the same way for every layer.
        head_size(d_model, num_heads, f"model.d_model={d_model}")
        weights_dropout = dropout if attention_dropout is None else attention_dropout
        common = (attention, d_model, num_heads, d_ff)
        self.encoder = TransformerEncoder(
            src_vocab_size, *common, encoder_layers, dropout, weights_dropout, norm_first,
            padding_idx, attention_parts,
        )  # fmt: skip
        self.decoder = TransformerDecoder(
            tgt_vocab_size, *common, decoder_layers, dropout, weights_dropout, norm_first,
            tie_embeddings, padding_idx, attention_parts,
        )  # fmt: skip
        if init == "xavier":
            xavier_init(self)


def check_transformer_parts(parts: AttentionParts | None) -> None:
    """A Transformer takes any normalizer; a window, a key bias or coverage is refused with the
    reason."""
    if parts is None:
        return
    refused = []
    if parts.window != "global":
        refused.append(
            f"attention.window={parts.window} (Luong's windows centre on the aligned source "
            "position of an RNN decoder's step; a Transformer's self-attention has no source "
            "position to centre on, and its positions come from the sinusoidal encodings)"
        )
    if parts.key_bias:
        refused.append(
            "attention.key_bias=true (a bias per source position of an RNN decoder's attention; "
            "the Transformer's attentions read positions from their encodings, and its "
            "self-attentions have no source positions)"
        )
    if parts.coverage:
        refused.append(
            "attention.coverage=true (an RNN decoder's running sum of its one attention map; a "
            "Transformer has a map per layer and head, and its decoder's state is a key/value "
            "cache; optim.coverage_loss_weight works with it, on the last layer's map)"
        )
    if refused:
        raise ConfigError(
            f"model=transformer does not take {' or '.join(refused)}. Drop the key, or train an "
            "RNN model (model=gru or model=lstm) with it; the normalizer "
            "(attention.normalizer=sparsemax, entmax15, entmax) works in every head of a "
            "Transformer."
        )
