"""CPU-accelerated subclasses of the reference modules: the one seam between the two.

Each class here subclasses a module of ``seq2seq.models`` or ``seq2seq.attention``, adds no
parameters, buffers or state, and overrides methods where a CPU kernel computes the same
function faster; where none applies (a GPU, float64, autocast, tracing or ONNX export, an LSTM,
a scoring form the kernels do not compute, no C compiler), the method calls ``super()``: the
reference. ``seq2seq.kernels.accelerate`` swaps a built model's modules to these classes, so the
parameters and their state-dict keys are the reference's, and checkpoints do not depend on the
choice (``model.kernels``).

What runs where, on the CPU in float32 (each path is tested against the reference):

- ``FastRNNEncoder``: a GRU over the packed real tokens through the C recurrence (``gru``).
- ``FastBahdanauDecoder``: where its attention's parts have C twins (``attention_parts``: every
  built-in score at a fixed or learned temperature, every normalizer, the key bias, local-m and
  local-p, coverage),
  teacher forcing as one step loop composing them, one autograd node (``bahdanau.Recurrence``;
  training over the packed real tokens only), and each decoding step's attention and cell in
  C; otherwise the steps split the cell's input projection, ``W_ih [e; c] = W_ie e + W_ic c``,
  so the embedding part of all T steps is one GEMM before the loop.
- ``FastLuongDecoder``: the cell over all steps through ``gru_steps``; training over the packed
  real tokens, with plain dot, scaled-dot and general attention from the packed rows
  (``PackedProductAttention``), any other attention with C twins through ``attend`` over all
  the target steps at once; input feeding as one step loop, coverage alone as the attention's
  loop between the cell over all steps and the readout over all rows (``luong``); decoding
  steps with the attention and cell in C, from tables built once per batch (each token's
  embedding gates; W_c1 applied to the memory), and greedy decoding of a whole batch in one C
  call (``greedy.luong_greedy``, every part).
- ``FastAdditiveAttention``: the context without the weights (training) through
  ``tanh(x) = 2σ(2x) - 1``: torch's CPU tanh costs several times its sigmoid.
- ``Dropout``: the keep mask from a counter-based hash in C (``seq2seq.kernels.dropout``).

Shape legend: B batch, S source length, T target length, E embedding size, H hidden size, M memory
size, V vocabulary, G gates (3H for a GRU, 4H for an LSTM), N real target tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.backends.cudnn import rnn as cudnn_rnn

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
    MultiHeadAttention,
    masked_softmax,
    own_formula,
    scores_as,
    valid_key_mask,
)
from seq2seq.kernels.attention_parts import StepAttention, step_attention
from seq2seq.kernels.attention_parts import attend as parts_attend
from seq2seq.kernels.bahdanau import Recurrence as FusedRecurrence
from seq2seq.kernels.dropout import Dropout
from seq2seq.kernels.greedy import StepParts, luong_greedy
from seq2seq.kernels.gru import Steps, gru, gru_cell, gru_steps, tanh_, tanh_with_grad_
from seq2seq.kernels.library import library, usable
from seq2seq.kernels.luong import AttentionLoop, SequentialRecurrence
from seq2seq.kernels.packing import PackedTokens, pack_tokens
from seq2seq.kernels.product_attention import PackedProductAttention, product_attend
from seq2seq.kernels.step_gemm import StepWeight
from seq2seq.models.decoder import (
    AttentionDecoder,
    BahdanauDecoder,
    DecoderState,
    EncodedSource,
    LuongDecoder,
    per_hypothesis,
    queries_per_sentence,
)
from seq2seq.models.encoder import RNNEncoder
from seq2seq.models.model import Seq2Seq
from seq2seq.normalizers import Entmax
from seq2seq.positions import LocalWindow
from seq2seq.search import GreedyTask

# W_q, b_q, w_v, the key bias, a learned α, a learned temperature, the coverage weight: each a
# tensor or None.
AttentionParameters = tuple[
    Tensor | None,
    Tensor | None,
    Tensor | None,
    Tensor | None,
    Tensor | None,
    Tensor | None,
    Tensor | None,
]

# A token-gate table costs V / B steps' worth of the (B, E) @ (E, G) GEMMs it saves: built only
# for vocabularies of at most this many tokens per sentence of the batch (the reverse task's 54
# at B = 64; not a 16k subword vocabulary).
TABLE_TOKENS_PER_SENTENCE = 8


def product_scale(attention: Attention | MultiHeadAttention, query_size: int) -> float | None:
    """c when the weights are the softmax of ``c · q · project_keys(k)`` over every real key for
    queries of this size (dot-product and general scoring at a fixed temperature, with no other
    part), else None: what ``seq2seq.kernels.product_attention`` computes. A subclass with its
    own ``score`` is neither (``scores_as``)."""
    is_dot = scores_as(attention, DotProductAttention)
    if not (is_dot or scores_as(attention, GeneralAttention)):
        return None
    assert isinstance(attention, Attention)  # scores_as checked
    if attention.log_temperature is not None:
        return None
    if attention.normalization is not None or attention.coverage_weight is not None:
        return None  # parts: attention_parts composes them
    if is_dot:
        assert isinstance(attention, DotProductAttention)
        scale = 1 / query_size**0.5 if attention.scaled else 1.0
        return scale / attention.fixed_temperature
    return 1.0 / attention.fixed_temperature


def weights_dropout_active(attention: Attention | MultiHeadAttention) -> bool:
    return attention.training and attention.dropout.p > 0


class FastAdditiveAttention(AdditiveAttention):
    """``context`` (no weights: training) through the sigmoid form on the CPU."""

    computes_its_parents_function = True  # seq2seq.attention.SAME_FUNCTION: own_formula reads it

    def context(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``forward``'s context from ``score + Σw_v``: tanh(x) = 2σ(2x) - 1, so
        ``score = 2 w_vᵀσ(2x) - Σw_v``, and the last term is the same for every key, which the
        softmax ignores (another normalizer might not: it takes the reference, as does a
        function of the user's assigned to the instance or a hook, ``own_formula``)."""
        if projected_values is not None:
            values = projected_values
        plain = self.normalization is None and own_formula(self) is None
        if queries.device.type != "cpu" or not plain:
            return super().context(
                queries, keys, values, valid_lens, projected_keys=projected_keys,
                positions=positions,
            )  # fmt: skip
        if projected_keys is None:
            projected_keys = self.project_keys(keys)
        if self.layer_norm is None:
            # 2(W_q q + W_k k) in the broadcasting add itself (alpha scales its second operand):
            # a separate doubling would be one more pass over (B, Tq, Tk, A) forward and back.
            # (B,Tq,1,A) + 2 * (B,1,Tk,A) -> (B,Tq,Tk,A)
            doubled = torch.add(
                2.0 * self.W_q(queries)[:, :, None, :], projected_keys[:, None, :, :], alpha=2.0
            )
        else:
            doubled = self.preactivations(queries, projected_keys) * 2.0  # (B, Tq, Tk, A)
        shifted = self.w_v(torch.sigmoid(doubled)).squeeze(-1) * 2.0  # (B, Tq, Tk)
        if self.log_temperature is not None or self.fixed_temperature != 1.0:
            shifted = shifted / self.temperature
        weights = masked_softmax(shifted, valid_lens)  # (B, Tq, Tk)
        return torch.bmm(self.dropout(weights), values)  # (B,Tq,Tk) @ (B,Tk,Dv) -> (B,Tq,Dv)


class FastRNNEncoder(RNNEncoder):
    """A GRU through the C recurrence, over the real tokens only."""

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, Tensor]:
        if not self.runs_fused(self.embedding.weight):
            return super().forward(src, src_lens)
        memory, final = self.fused_recurrence(src, src_lens.cpu())
        return memory, self.summary(final)

    def runs_fused(self, embedded: Tensor) -> bool:
        """Whether ``forward`` runs the GRU in C for ``embedded`` (the embeddings, or their
        weight: same device and dtype)."""
        return isinstance(self.rnn, nn.GRU) and usable(embedded, *self.rnn.parameters())

    def fused_recurrence(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S), lengths (B,) on the CPU -> memory (B, S, 2H) (dropout applied), final
        states (L·2, B, H).

        The token ids are packed (``pack_tokens``), so the embedding, its dropout, the input
        projections and the steps see the N real tokens and no padding, whatever the batch's
        mix of lengths; one scatter puts the memory back on the (B, S) grid for the attention.
        """
        assert isinstance(self.rnn, nn.GRU)
        packed = pack_tokens(src, lengths)
        rows = self.dropout(self.embedding(packed.tokens))  # (N, E)
        batch_sizes = torch.tensor(packed.batch_sizes, dtype=torch.long)
        sequence = nn.utils.rnn.PackedSequence(
            rows, batch_sizes, packed.sorted_indices, packed.unsorted_indices()
        )
        outputs, final = gru(self.rnn, sequence)  # (N, 2H) rows; final (L·2, B, H)
        return packed.pad(self.dropout(outputs.data)), final  # (B, S, 2H)


@dataclass
class DecodingSource(EncodedSource):
    """The reference's ``EncodedSource`` and the tables the C decoding steps read, built at the
    first decoding step of a batch (``FastDecoder.build_tables``): never for teacher forcing."""

    # (V, G): the embedding part of the cell's input projection, W_ie e + b_ih, of every target
    # token, on the CPU for a small vocabulary (``TABLE_TOKENS_PER_SENTENCE``); not per row.
    token_gates: Tensor | None = None
    # (B, S, H): the context part of Luong's attentional layer applied to every source position,
    # W_c1 m_s: W_c [c; h] = W_c1 c + W_c2 h, and W_c1 c = Σ_s a_s (W_c1 m_s).
    attentional_memory: Tensor | None = None
    # With several heads instead: W_c1 W_o (H, D) and W_c1 b_o (H,) or None, the same W_c1 c
    # read from the heads' concatenated contexts before W_o (``FastLuongDecoder.heads_readout``).
    heads_readout: tuple[Tensor, Tensor | None] | None = None
    tables_built: bool = False
    # The weights a decoding step multiplies its rows by, each packed once per batch at its
    # first use (``product``), by address and layout: the same parameters at every step.
    products: dict[tuple[int, ...], StepWeight] | None = None
    # The attention's C parts and what they read (``FastDecoder.fused_attention``), decided at
    # the batch's first decoding step, as the products are packed: one list of the attention's
    # modules walked per batch, not per step (``own_formula``), and a learned α's 1 + softplus
    # computed once. A one-element list: [None] where the parts do not compute it.
    attention_parts: list[tuple[StepAttention, AttentionParameters] | None] | None = None

    def index_select(self, indices: Tensor) -> DecodingSource:
        selected = super().index_select(indices)
        memory = self.attentional_memory
        return DecodingSource(
            **{field.name: getattr(selected, field.name) for field in fields(EncodedSource)},
            token_gates=self.token_gates,
            attentional_memory=None if memory is None else memory.index_select(0, indices),
            heads_readout=self.heads_readout,
            tables_built=self.tables_built,
            products=self.products,
            attention_parts=self.attention_parts,
        )

    def product(self, weight: Tensor, *operands: Tensor) -> StepWeight | None:
        """``weight`` as a ``StepWeight`` packed for this batch's decoding steps (x @ W^T), or
        None before the tables are built (not decoding), while autograd records (the panels
        have no backward), or where ``operands``, what the step multiplies and adds, are not
        tensors the kernels take (autocast's, say): the caller's torch op then computes as the
        reference's."""
        if self.products is None or torch.is_grad_enabled() or not usable(weight, *operands):
            return None
        key = (weight.data_ptr(), *weight.shape, *weight.stride())  # a view: where, and how read
        packed = self.products.get(key)
        if packed is None:
            packed = self.products[key] = StepWeight(weight)
        return packed

    def affine(self, rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
        """rows (N, K) @ weight (M, K)^T + bias (M,) or None -> (N, M) through the weight
        packed for this batch, or None where ``product`` does not give it (the caller's torch
        op then computes it)."""
        packed = self.product(weight, rows, *([] if bias is None else [bias]))
        if packed is None:
            return None
        out = rows.new_empty(rows.shape[0], weight.shape[0])  # (N, M)
        packed.into(out, rows, bias)
        return out


def source_linear(layer: nn.Module, inputs: Tensor, source: EncodedSource | None) -> Tensor:
    """``layer(inputs)`` (…, K) -> (…, N), through ``DecodingSource.affine`` where ``source``
    is one (a decoding step's) and the layer an ``nn.Linear``."""
    if not (isinstance(source, DecodingSource) and isinstance(layer, nn.Linear)):
        return layer(inputs)
    flat = inputs.reshape(-1, inputs.shape[-1])  # (N', K)
    out = source.affine(flat, layer.weight, layer.bias)
    return layer(inputs) if out is None else out.view(*inputs.shape[:-1], layer.out_features)


def step_queries(
    source: EncodedSource, queries: Tensor, weight: Tensor | None, bias: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """An additive score's queries (R, H) and its W_q (A, H) and b_q (A,) as ``parts_attend``
    takes them: in a decoding step, projected here through W_q packed for the batch
    (``DecodingSource.affine``), (R, A) and None twice; else as they are (``parts_attend``
    projects them through torch, with their gradient). A product's (no W_q): as they are."""
    if weight is None or not isinstance(source, DecodingSource):
        return queries, weight, bias
    projected = source.affine(queries, weight, bias)  # (R, A)
    return (queries, weight, bias) if projected is None else (projected, None, None)


def decoding_tanh(readout: Tensor, fused: bool) -> Tensor:
    """h~ = tanh(W_c [c; h]) of a decoding step's fresh readout (B, H): in place through the C
    pass where the step's cell went through C too (``FastDecoder.fused_step_applies``: a GRU,
    no autograd, tensors the kernels take), else ``torch.tanh``."""
    return tanh_(readout) if fused else torch.tanh(readout)


class FastDecoder(AttentionDecoder):
    """What both accelerated decoders share: the decoding tables, the cell from its input
    projection, and the conditions of the C paths."""

    def prepare_source(self, memory: Tensor, src_lens: Tensor) -> DecodingSource:
        source = self.packed_source(memory, src_lens)
        if source is None:
            source = super().prepare_source(memory, src_lens)
        return DecodingSource(
            **{field.name: getattr(source, field.name) for field in fields(source)}
        )

    def packed_source(self, memory: Tensor, src_lens: Tensor) -> EncodedSource | None:
        """The reference's ``prepare_source`` with the attention's projections of the keys (a
        scoring's W_k or W; several heads' W_k and W_v too) over the real source positions
        alone, or None where the C parts do not attend (the reference's then) or the keys are
        not projected. Their padded positions hold zeros where the reference has the projection
        of the padding: no C part reads a key or value past a sentence's length (padded keys get
        weight exactly 0, an empty row attends to nothing), and the reference's path, where it
        runs instead, masks them."""
        attention = self.attention
        heads = getattr(attention, "num_heads", 1)
        projects = heads > 1 or isinstance(attention, (AdditiveAttention, GeneralAttention))
        if not projects or self.step_parts() is None:
            return None
        if memory.device.type != "cpu" or src_lens.dim() != 1 or not usable(memory):
            return None
        batch, steps, size = memory.shape
        keys = self.key_projection(memory)  # (B, S, K); the memory itself with several heads
        real = valid_key_mask(src_lens, 1, steps).reshape(-1)  # (B·S,)
        positions = real.nonzero().squeeze(1)  # (N_s,) b·S + s of each real position
        sentence, position = positions // steps, positions % steps  # (N_s,) each

        def heads_of(projected: Tensor) -> Tensor:
            """(N_s, D) -> (B·h, S, d), zeros at the padding: ``split_heads`` of the (B, S, D)
            grid, written in its layout at once (B, h, S, d) rather than copied into it; one
            head's (B, S, D) itself."""
            grid = projected.new_zeros(batch, heads, steps, projected.shape[1] // heads)
            grid[sentence, :, position] = projected.view(-1, heads, grid.shape[-1])
            return grid.view(batch * heads, steps, -1)

        if not isinstance(attention, MultiHeadAttention):
            rows = keys.reshape(batch * steps, -1).index_select(0, positions)  # (N_s, K)
            # (N_s, A): a built-in score's project_keys reads each key by itself
            return EncodedSource(memory, keys, heads_of(attention.project_keys(rows)), src_lens)
        rows = memory.reshape(batch * steps, size).index_select(0, positions)  # (N_s, M)

        # Each head's keys projected by the score (W_a k: an additive score's A features) on the
        # real positions alone, (N_s, h, d) -> (N_s, h·K): a built-in score's project_keys reads
        # each key by itself.
        head_keys = attention.W_k(rows).view(rows.shape[0], heads, -1)
        projected = attention.scoring.project_keys(head_keys).flatten(1)  # (N_s, h·K)
        projected_keys = heads_of(projected)  # (B·h, S, K)
        return EncodedSource(memory, keys, projected_keys, src_lens, heads_of(attention.W_v(rows)))

    def is_decoding(self) -> bool:
        """Stepping in eval mode without autograd: where the decoding tables pay off."""
        return not (self.training or torch.is_grad_enabled())

    def build_tables(self, source: EncodedSource) -> None:
        """Fill ``source``'s decoding tables, once per batch, when decoding."""
        if not isinstance(source, DecodingSource) or source.tables_built or not self.is_decoding():
            return
        source.tables_built = True
        source.products = {}
        memory = source.memory
        small_vocabulary = (
            self.embedding.num_embeddings <= TABLE_TOKENS_PER_SENTENCE * memory.shape[0]
        )
        if memory.device.type == "cpu" and small_vocabulary:
            embedding_weight = self.cell.weight_ih[:, : self.embedding_size]  # (G, E)
            source.token_gates = self.embedding_gates(self.embedding.weight, embedding_weight)

    def embedding_gates(self, embedded: Tensor, weight: Tensor) -> Tensor:
        """W_ie e + b_ih, (..., E) -> (..., G): the part of the cell input without attention.
        ``weight`` is the embedding part (G, E) of the cell's input weight."""
        return F.linear(embedded, weight, self.cell.bias_ih)

    def input_gates(self, prev_tokens: Tensor, embedded: Tensor, source: EncodedSource) -> Tensor:
        """The embedding part of a decoding step's cell input (B, G): rows of the token-gate table
        where there is one (index_select: on the CPU several times faster than advanced
        indexing), else its GEMM."""
        table = source.token_gates if isinstance(source, DecodingSource) else None
        if table is None:
            return self.embedding_gates(embedded, self.cell.weight_ih[:, : self.embedding_size])
        return table.index_select(0, prev_tokens)

    def cpu_cell(
        self, cell_input: Tensor, input_gates: Tensor, state: DecoderState, input_weight: Tensor
    ) -> DecoderState:
        """The cell through ATen's own CPU kernels, with part of its input projection done by
        the caller: ``input_gates`` (B, G) + ``input_weight`` (G, I) @ ``cell_input`` (B, I).

        ``torch.gru_cell(x, h, W_ih, W_hh, b_ih, b_hh)`` is ``nn.GRUCell``'s function; on the CPU
        it adds ``b_ih`` through ``addmm``, which broadcasts, so a per-row bias (B, G) carries
        the precomputed part and the kernel's input GEMM covers only ``cell_input``.
        """
        weight_hh, bias_hh = self.cell.weight_hh, self.cell.bias_hh
        if self.is_lstm:
            hidden, cell = torch.lstm_cell(
                cell_input, (state[0], state[1]), input_weight, weight_hh, input_gates, bias_hh
            )
            return hidden, cell
        hidden = torch.gru_cell(cell_input, state[0], input_weight, weight_hh, input_gates, bias_hh)
        return (hidden,)

    def fused_step_applies(self, hidden: Tensor) -> bool:
        """Whether ``cell_gates`` steps through the C GRU cell: a GRU stepped without autograd
        (decoding) on tensors the kernels take."""
        if self.is_lstm or torch.is_grad_enabled():
            return False
        return usable(hidden, self.cell.weight_hh)

    def fused_attention_source(self, source: EncodedSource, rows: int) -> bool:
        """What the C attention kernels need whatever the scoring: no active dropout on the
        weights, one length per sentence, a whole number of the ``rows`` queries per sentence,
        and source tensors they take. Each decoder adds its scoring's own conditions."""
        if weights_dropout_active(self.attention):
            return False
        if source.src_lens.dim() != 1 or rows % source.memory.shape[0]:
            return False  # a ragged query count: attend's error says what is wrong
        values = source.projected_values  # several heads' W_v m, or None
        return usable(source.memory, source.projected_keys, *([] if values is None else [values]))

    def step_parts(self) -> StepAttention | None:
        """The C parts that compute this decoder's attention, or None (``step_attention``)."""
        return step_attention(self.attention, self.cell.hidden_size)

    def attention_parameters(self) -> AttentionParameters:
        """W_q, b_q and w_v of additive scoring (else None each: a product's q is the state),
        the key bias (P,), a learned α (0-d), a learned temperature T (0-d) and the coverage
        weight (w_c or γ; a multi-head attention's γ (h,)), or None each: what
        ``bahdanau.Recurrence`` and ``attention_parts.attend`` read, in their order. With
        several heads, the scoring function's own (each head's queries are projected by the
        block's W_q before them)."""
        coverage_weight = self.attention.coverage_weight
        parts = self.attention.normalization
        attention = self.attention
        if isinstance(attention, MultiHeadAttention):
            attention = attention.scoring
        key_bias = alpha = None
        if parts is not None:
            key_bias = None if parts.key_bias is None else parts.key_bias.bias
            normalizer = parts.normalizer
            if isinstance(normalizer, Entmax) and normalizer.raw_alpha is not None:
                alpha = 1 + F.softplus(normalizer.raw_alpha)  # Entmax.alpha, with its gradient
        temperature = attention.temperature  # a learned one's tensor, with its gradient
        learned = temperature if isinstance(temperature, Tensor) else None
        if not isinstance(attention, AdditiveAttention):
            return None, None, None, key_bias, alpha, learned, coverage_weight
        score_weight = attention.w_v.weight  # w_v (1, A)
        if attention.layer_norm is not None:  # [w_v; γ; β] (3, A), with their gradients
            norm = attention.layer_norm
            score_weight = torch.cat([score_weight, norm.weight[None], norm.bias[None]])
        additive = attention.W_q.weight, attention.W_q.bias, score_weight
        return *additive, key_bias, alpha, learned, coverage_weight

    def fused_attention(
        self, source: EncodedSource, rows: int
    ) -> tuple[StepAttention, AttentionParameters] | None:
        """The C parts and what they read of the attention (``attention_parameters``), where
        ``seq2seq.kernels.bahdanau`` can compute this attention for ``rows`` queries; else None.
        Read once per call: a decoding step asks once, not once to check and once to run, and
        a batch's decoding steps once for all (``DecodingSource.attention_parts``)."""
        if not self.fused_attention_source(source, rows):
            return None
        batch = source if isinstance(source, DecodingSource) and source.tables_built else None
        if batch is not None and batch.attention_parts is not None:
            return batch.attention_parts[0]
        fused = None
        parts = self.step_parts()
        if parts is not None:
            parameters = self.attention_parameters()
            if usable(*(p for p in parameters if p is not None)):
                fused = parts, parameters
        if batch is not None:
            batch.attention_parts = [fused]
        return fused

    def fused_attention_applies(self, source: EncodedSource, rows: int) -> bool:
        """Whether ``seq2seq.kernels.bahdanau`` can compute this attention for ``rows`` queries."""
        return self.fused_attention(source, rows) is not None

    def loop_inputs(
        self, source: EncodedSource, parameters: AttentionParameters, output_weight: Tensor
    ) -> tuple[tuple[Tensor | None, ...], Tensor, Tensor | None]:
        """What a step loop (``bahdanau.Recurrence``, ``luong.SequentialRecurrence``) reads of the
        attention from the source on (keys, values, lengths, ``attention_parameters``), the
        weight (·, M) that reads the attention's output (the Bahdanau cell's W_ic, the Luong
        decoder's W_c1) as the loop applies it, and a bias (·,) to add after it, or None.

        The query's weights are W_q (·, H) and b_q, then the heads' own W_q (D, H) and b_q
        (D,) where an additive score projects each head's query (else None each): a product
        scores the block's W_q s + b_q itself, an additive score W_a (W_q,i s + b_i) + b_a per
        head (``loop_attention``'s two GEMMs). With several heads the output weight reads W
        (W_o c + b_o) = (W W_o) c + W b_o of the heads' concatenated contexts c
        (``head_output`` applies W_o where the loop returns them)."""
        attention = self.attention
        query_weight, query_bias, *rest = parameters
        if not isinstance(attention, MultiHeadAttention):
            source_tensors = (source.projected_keys, source.memory, source.src_lens)
            queries: tuple[Tensor | None, ...] = (query_weight, query_bias, None, None)
            return (*source_tensors, *queries, *rest), output_weight, None
        heads, head_projection = attention.num_heads, attention.W_q
        bias = head_projection.bias  # (D,) or None
        if query_weight is None:  # a product scores the heads' queries themselves
            queries = (head_projection.weight, bias, None, None)
        else:  # W_a (A, d) of each head's W_q,i s + b_i
            queries = (query_weight, query_bias, head_projection.weight, bias)
        assert source.projected_values is not None  # a multi-head attention's source has them
        lens = source.src_lens.repeat_interleave(heads)  # (B·h,): sentence b·h + i is b's
        source_tensors = (source.projected_keys, source.projected_values, lens)
        folded_output, output_bias = self.folded_head_output(output_weight)
        return (*source_tensors, *queries, *rest), folded_output, output_bias

    def folded_head_output(self, output_weight: Tensor) -> tuple[Tensor, Tensor | None]:
        """A weight W (·, M) that reads a multi-head attention's output, folded with its W_o:
        W (W_o c + b_o) = (W W_o) c + W b_o reads the heads' concatenated contexts c directly
        -> W W_o (·, D) and W b_o (·,) (None without b_o)."""
        output = self.attention.W_o
        assert isinstance(output, nn.Linear)  # a MultiHeadAttention's
        output_bias = None if output.bias is None else output_weight @ output.bias  # (·,)
        return output_weight @ output.weight, output_bias  # (·, M) @ (M, D)

    def head_output(self, contexts: Tensor, source: EncodedSource | None = None) -> Tensor:
        """A loop's contexts (…, h·d) as the reference's (…, M): the heads' through W_o (with a
        decoding step's ``source``, its packed weight: ``source_linear``); one head's as they
        are."""
        attention = self.attention
        if not isinstance(attention, MultiHeadAttention):
            return contexts
        return source_linear(attention.W_o, contexts, source)

    def average_heads(self, weights: Tensor) -> Tensor:
        """A loop's weights (…, h·S) as the reference's (…, S): averaged over the heads."""
        heads = getattr(self.attention, "num_heads", 1)
        return weights if heads == 1 else weights.unflatten(-1, (heads, -1)).mean(dim=-2)

    def centre_parameters(self) -> tuple[Tensor | None, Tensor | None]:
        """Local-p's W_p (H, H) and v_p (1, H), which predict each step's centre, or None."""
        parts = self.attention.normalization
        window = None if parts is None else parts.window
        if window is None or window.W_p is None or window.v_p is None:
            return None, None
        return window.W_p.weight, window.v_p.weight

    def attend(
        self,
        queries: Tensor,
        source: EncodedSource,
        need_weights: bool = True,
        positions: Tensor | None = None,
        coverage: Tensor | None = None,
        *,
        live: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The reference's ``attend`` through the attention's C parts where they compute it
        (``fused_attention``), with its gradient: queries (R, Tq, H) -> contexts (R, Tq, M),
        weights (R, Tq, S) or None. Hypothesis r's Tq queries are rows r·Tq .. r·Tq + Tq - 1 of
        its sentence, r / (R / B): (R·Tq) rows, (R / B)·Tq per sentence. ``live`` (N,): which of
        the R·Tq rows are real where the others are padding (``parts_attend``'s), else None."""
        rows, num_queries, size = queries.shape
        fused = None
        if source.memory.device.type == "cpu" and usable(queries):
            fused = self.fused_attention(source, rows)
        if fused is None:
            return super().attend(queries, source, need_weights, positions, coverage)
        parts, parameters = fused
        if parts.heads > 1:
            merged, averaged = self.attend_heads(
                queries, source, parts, parameters, positions, coverage, live
            )
            return self.head_output(merged, source), averaged  # (R, Tq, M), (R, Tq, S)
        flat_positions = None if positions is None else positions.reshape(-1)  # (R·Tq,)
        flat_coverage = None if coverage is None else coverage.reshape(rows * num_queries, -1)
        centres = None
        if parts.needs_centres:  # local-p's p_t, (B, K·Tq) -> (R·Tq,) with their gradient
            window = getattr(self.attention.normalization, "window", None)
            assert window is not None  # step_attention named local-p
            per_sentence = queries_per_sentence(queries, source.memory.shape[0])
            centres = local_p_centres(window, per_sentence, source.src_lens).reshape(-1)
        query_weight, query_bias, *rest = parameters
        flat, query_weight, query_bias = step_queries(
            source, queries.reshape(rows * num_queries, size), query_weight, query_bias
        )
        score_weight, key_bias, alpha, temperature, coverage_weight = rest
        # (R·Tq, M), (R·Tq, S)
        contexts, weights = parts_attend(
            parts, flat, source.projected_keys, source.memory, source.src_lens, query_weight,
            query_bias, score_weight, key_bias, alpha, temperature, coverage_weight,
            positions=flat_positions, coverage=flat_coverage, centres=centres, live=live,
        )  # fmt: skip
        contexts = contexts.view(rows, num_queries, -1)  # (R, Tq, M)
        if not (need_weights or coverage is not None):
            return contexts, None
        return contexts, weights.view(rows, num_queries, -1)  # (R, Tq, S)

    def attend_heads(
        self,
        queries: Tensor,
        source: EncodedSource,
        parts: StepAttention,
        parameters: AttentionParameters,
        positions: Tensor | None,
        coverage: Tensor | None,
        live: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``attend`` for a ``MultiHeadAttention`` through the C parts (``heads_context``), with
        the block's W_q before them (through PyTorch) but not its W_o, which the caller applies
        (``head_output``) or folds into the weight that reads it (``heads_readout``): queries
        (R, Tq, H) -> the heads' concatenated contexts (R, Tq, D) and the weights averaged over
        the heads (R, Tq, S), as the reference returns them; ``live`` as ``attend``'s (row
        r·Tq + j of the queries is row r·Tq + j of the heads' (B, K·Tq) grid)."""
        attention = self.attention
        assert isinstance(attention, MultiHeadAttention)  # parts.heads > 1
        rows, num_queries, _ = queries.shape
        per_sentence = queries_per_sentence(queries, source.memory.shape[0])  # (B, K·Tq, H)
        head_queries = source_linear(attention.W_q, per_sentence, source)  # (B, K·Tq, D)
        merged, averaged = self.heads_context(
            per_sentence, head_queries, source, parts, parameters, positions, coverage, live
        )
        return (
            per_hypothesis(merged, rows, num_queries),  # (R, Tq, D)
            per_hypothesis(averaged, rows, num_queries),  # (R, Tq, S)
        )

    def heads_context(
        self,
        per_sentence: Tensor,
        head_queries: Tensor,
        source: EncodedSource,
        parts: StepAttention,
        parameters: AttentionParameters,
        positions: Tensor | None,
        coverage: Tensor | None,
        live: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The heads between W_q and W_o: head i of sentence b scored as a sentence of its own,
        b·h + i, against that head's keys and values (the source's, split into heads once per
        batch), the rows of sentence b (its K hypotheses' Tq queries) its rows. per_sentence
        (B, K·Tq, H), the queries before W_q (local-p predicts its centre from them), and
        head_queries (B, K·Tq, D), after it -> the heads' concatenated contexts (B, K·Tq, D),
        before W_o, and the weights averaged over the heads (B, K·Tq, S). ``live`` (N,): the
        real rows b·K·Tq + j of the (B, K·Tq) grid where the others are padding (skipped, their
        contexts and weights zeros), else None."""
        attention = self.attention
        assert isinstance(attention, MultiHeadAttention)  # parts.heads > 1
        heads, sentences = parts.heads, source.memory.shape[0]
        split = attention.split_heads(head_queries)  # (B·h, K·Tq, d)
        per_head_rows, head_size = split.shape[1], split.shape[2]  # K·Tq: each head-sentence's

        def each_head(per_row: Tensor) -> Tensor:
            """(B, K·Tq, ...) -> (B·h·K·Tq, ...): every head's rows read the same."""
            expanded = per_row.unsqueeze(1).expand(-1, heads, *per_row.shape[1:])
            return expanded.flatten(0, 2)

        flat_positions = None if positions is None else each_head(positions.reshape(sentences, -1))
        centres = None
        if parts.needs_centres:  # local-p's p_t from the queries before their projection
            window = getattr(attention.normalization, "window", None)
            assert window is not None  # step_attention named local-p
            centres = each_head(local_p_centres(window, per_sentence, source.src_lens))
        query_weight, query_bias, score_weight, key_bias, alpha, temperature, gamma = parameters
        head_coverage = coverage_weight = None
        if coverage is not None:  # γ_i c for head i, (B, h, K·Tq, S), the C twin's γ then 1
            assert gamma is not None  # step_attention chose coverage
            covered = queries_per_sentence(coverage, sentences)  # (B, K·Tq, S)
            scaled = gamma[None, :, None, None] * covered[:, None]  # (B, h, K·Tq, S)
            head_coverage = scaled.flatten(0, 2)  # (B·h·K·Tq, S)
            coverage_weight = gamma.new_ones(())
        values = source.projected_values
        assert values is not None  # a multi-head attention's source has them
        flat, query_weight, query_bias = step_queries(
            source, split.reshape(-1, head_size), query_weight, query_bias
        )
        head_live = None
        if live is not None:  # row b·P + j of the grid is row (b·h + i)·P + j of head i
            sentence, row = live // per_head_rows, live % per_head_rows  # (N,) each
            head_rows = sentence[:, None] * heads + torch.arange(heads, device=live.device)
            head_live = (head_rows * per_head_rows + row[:, None]).flatten()  # (N·h,)
        # (B·h·K·Tq, d), (B·h·K·Tq, S)
        contexts, weights = parts_attend(
            parts, flat, source.projected_keys, values,
            source.src_lens.repeat_interleave(heads), query_weight, query_bias, score_weight,
            key_bias, alpha, temperature, coverage_weight, positions=flat_positions,
            coverage=head_coverage, centres=centres, live=head_live,
        )  # fmt: skip
        merged = attention.merge_heads(contexts.view(sentences * heads, per_head_rows, -1))
        averaged = weights.view(sentences, heads, per_head_rows, -1).mean(dim=1)  # (B, K·Tq, S)
        return merged, averaged

    def cell_gates(
        self, input_gates: Tensor, state: DecoderState, source: EncodedSource | None = None
    ) -> DecoderState:
        """The cell from its input projection ``W_ih x + b_ih`` (B, G): the same function as
        ``nn.GRUCell`` / ``nn.LSTMCell`` (their gate order), with the input GEMM done by the
        caller; a GRU decoding on the CPU takes the C pass (one pass where the ops below are
        five kernels), its W_hh packed once per batch where ``source`` has the tables."""
        hidden = state[0]  # (B, H)
        if self.fused_step_applies(hidden):
            weight_hh = self.cell.weight_hh
            packed = None
            if isinstance(source, DecodingSource):
                packed = source.product(weight_hh, hidden, input_gates)
            return (gru_cell(input_gates, hidden, weight_hh, self.cell.bias_hh, packed),)
        recurrent = F.linear(hidden, self.cell.weight_hh, self.cell.bias_hh)  # (B, G)
        if self.is_lstm:
            # Gates i, f, g, o (PyTorch's order), each (B, H).
            i, f, g, o = (input_gates + recurrent).chunk(4, dim=-1)
            cell = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
            return torch.sigmoid(o) * torch.tanh(cell), cell
        # GRU gates r, z, n: r and z read input and state together, n reads r ⊙ (W_hn h + b_hn).
        size = hidden.shape[-1]
        both = torch.sigmoid(input_gates[:, : 2 * size] + recurrent[:, : 2 * size])  # (B, 2H)
        reset, update = both.chunk(2, dim=-1)  # (B, H) each
        new = torch.tanh(torch.addcmul(input_gates[:, 2 * size :], reset, recurrent[:, 2 * size :]))
        # n + z (h - n) = (1 - z) n + z h. Under autocast the gates are in the low precision
        # while the first state (the encoder's, in float32) is not, and lerp takes one dtype.
        return (torch.lerp(new, hidden.to(new.dtype), update),)

    def pack_targets(self, tgt_in: Tensor, tgt_out: Tensor) -> tuple[PackedTokens, Tensor]:
        """tgt_in's real tokens packed (``pack_tokens``; a sentence's length is its count of
        targets), and tgt_out's tokens at the same rows (N,)."""
        padding = self.embedding.padding_idx
        assert padding is not None  # the constructor gives the embedding one
        real = tgt_out.ne(padding)  # (B, T)
        packed = pack_tokens(tgt_in, real.sum(1))
        return packed, tgt_out.reshape(-1).index_select(0, packed.positions)


class FastBahdanauDecoder(FastDecoder, BahdanauDecoder):
    """The Bahdanau decoder's loops in C where its attention's parts have C twins, and on the
    CPU otherwise with the cell's input projection split (module docstring)."""

    def split_input_weight(self) -> tuple[Tensor, Tensor]:
        """The cell's input weight (G, E + M) as its embedding part (G, E) and context part (G, M).

        Called once per batch: every step's use of the context part then adds into one gradient.
        """
        return self.cell.weight_ih.split([self.embedding_size, self.memory_size], dim=1)

    def fused_recurrence(
        self, source: EncodedSource, hidden: Tensor
    ) -> tuple[StepAttention, AttentionParameters] | None:
        """``fused_attention`` where teacher forcing runs as ``bahdanau.Recurrence``'s one
        autograd node: a GRU, an attention whose parts have C twins, one length per sentence,
        and tensors the C kernels take (the weights, when wanted, come with their gradient)."""
        if self.is_lstm or not usable(hidden, self.cell.weight_hh):
            return None
        return self.fused_attention(source, hidden.shape[0])

    def fused_recurrence_applies(self, source: EncodedSource, hidden: Tensor) -> bool:
        """Whether ``fused_recurrence`` applies."""
        return self.fused_recurrence(source, hidden) is not None

    def gates_step(
        self,
        input_gates: Tensor,
        state: DecoderState,
        source: EncodedSource,
        context_weight: Tensor,
        need_weights: bool = True,
    ) -> tuple[DecoderState, Tensor, Tensor | None]:
        """``step`` from the previous token's ``embedding_gates`` (B, G) -> new state, context
        (B, M), weights (B, S). ``context_weight`` is ``split_input_weight()[1]``."""
        fused_step = self.fused_step_applies(state[0])
        steps = self.steps_of(state)  # (B,): the target step t, for a window centred on it
        coverage = self.coverage_of(state)  # (B, S): what steps < t attended, or None
        query = state[0][:, None, :]  # (B, 1, H): the previous state asks where to look
        positions = None if steps is None else steps[:, None]  # (B, 1)
        covered = None if coverage is None else coverage[:, None, :]  # (B, 1, S)
        # (B, 1, M), (B, 1, S): the attention's C parts where they apply (``attend``)
        context, weights = self.attend(query, source, need_weights, positions, covered)
        context = context[:, 0]  # (B, M)
        weights = None if weights is None else weights[:, 0]  # (B, S)
        if coverage is not None:
            assert weights is not None  # attend returns them with coverage
            coverage = coverage + weights
        if not fused_step:
            new_state = self.cpu_cell(context, input_gates, state, context_weight)
        else:
            new_state = self.cell_gates(
                self.context_gates(input_gates, context, source, context_weight), state, source
            )
        return self.advance(new_state, state, coverage=coverage), context, weights

    def context_gates(
        self, input_gates: Tensor, context: Tensor, source: EncodedSource, context_weight: Tensor
    ) -> Tensor:
        """The cell's input W_ie e + b_ih + W_ic c: (B, G) + (B, M) @ (M, G). A decoding step's
        ``input_gates`` are its own (a table's rows), so W_ic c adds into them in place."""
        packed = None
        if isinstance(source, DecodingSource):
            packed = source.product(context_weight, input_gates, context)
        if packed is None:
            return torch.addmm(input_gates, context, context_weight.t())
        packed.into(input_gates, context, accumulate=True)
        return input_gates

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        if source.memory.device.type != "cpu":
            return super().forward(tgt_in, state, source, need_weights)
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        embedding_weight, context_weight = self.split_input_weight()
        # Every step's embedding part in one GEMM: (B, T, E) @ (E, G) -> (B, T, G).
        input_gates = self.embedding_gates(embedded, embedding_weight)
        fused = self.fused_recurrence(source, state[0])
        if fused is not None:
            parts, parameters = fused
            attention_inputs, cell_weight, gate_bias = self.loop_inputs(
                source, parameters, context_weight
            )
            steps = None  # (B, T, ·), row b·T + t; with heads time-major (``time_major``)
            if parts.heads > 1:
                input_gates = time_major(input_gates)
                steps = Steps.padded(tgt_in.shape[0], tgt_in.shape[1], batch_first=False)
            if gate_bias is not None:
                input_gates = input_gates + gate_bias
            # (B, T, H), (B, T, h·d), (B, T, h·S); or (T·B, ·) each with heads
            outputs = FusedRecurrence.apply(
                input_gates, state[0], *attention_inputs, self.coverage_of(state),
                *self.centre_parameters(), cell_weight, self.cell.weight_hh, self.cell.bias_hh,
                parts, steps,
            )  # fmt: skip
            if steps is not None:
                outputs = tuple(batch_major(output, tgt_in.shape[0]) for output in outputs)
            states, step_contexts, attention_weights = outputs
            step_contexts = self.head_output(step_contexts)  # (B, T, M)
            attention_weights = self.average_heads(attention_weights)  # (B, T, S)
            logits = self.output(states, step_contexts, embedded)  # (B, T, V)
            return logits, attention_weights if need_weights else None
        hiddens, contexts, weights = [], [], []
        # unbind, not input_gates[:, t]: the backward of T selects would allocate and add a
        # zero (B, T, G) gradient per step; unbind's backward stacks the T gradients once.
        for step_gates in input_gates.unbind(1):  # (B, G) each
            state, context, step_weights = self.gates_step(
                step_gates, state, source, context_weight, need_weights
            )
            hiddens.append(state[0])
            contexts.append(context)
            if step_weights is not None:
                weights.append(step_weights)
        # One matmul over all steps: (B, T, H + M + E) @ (H + M + E, V).
        logits = self.output(torch.stack(hiddens, 1), torch.stack(contexts, 1), embedded)
        return logits, torch.stack(weights, dim=1) if need_weights else None

    def teacher_forced_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor]:
        """Over the N real target tokens where the recurrence runs in C: the batch is sorted
        longest target first, so that each step of the loop runs only the sentences that have
        not ended; the embedding's GEMM and the output layer skip the padding too."""
        fused = self.fused_recurrence(source, state[0])
        if fused is None:
            return super().teacher_forced_logits(tgt_in, tgt_out, state, source)
        logits, targets, _ = self.packed_pass(tgt_in, tgt_out, state, source, fused, False)
        return logits, targets

    def teacher_forced_logits_and_weights(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``teacher_forced_logits`` with the weights (B, T, S), 0 at the padded steps: what a
        loss on the attention reads, from the same packed pass."""
        fused = self.fused_recurrence(source, state[0])
        if fused is None:
            return super().teacher_forced_logits_and_weights(tgt_in, tgt_out, state, source)
        logits, targets, weights = self.packed_pass(tgt_in, tgt_out, state, source, fused, True)
        assert weights is not None  # asked for
        return logits, targets, weights

    def packed_pass(
        self,
        tgt_in: Tensor,
        tgt_out: Tensor,
        state: DecoderState,
        source: EncodedSource,
        fused: tuple[StepAttention, AttentionParameters],
        with_weights: bool,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``bahdanau.Recurrence`` over the real target tokens: logits (N, V), targets (N,), and
        with ``with_weights`` the weights (B, T, S), 0 at the padded steps."""
        parts, parameters = fused
        packed, targets = self.pack_targets(tgt_in, tgt_out)
        order = packed.sorted_indices  # (B,) longest target first
        source = source.index_select(order)
        embedded = self.dropout(self.embedding(packed.tokens))  # (N, E)
        embedding_weight, context_weight = self.split_input_weight()
        input_gates = self.embedding_gates(embedded, embedding_weight)  # (N, G)
        coverage = self.coverage_of(state)  # (B, S) or None
        coverage = None if coverage is None else coverage.index_select(0, order)
        attention_inputs, cell_weight, gate_bias = self.loop_inputs(
            source, parameters, context_weight
        )
        if gate_bias is not None:
            input_gates = input_gates + gate_bias
        # (N, H), (N, M or h·d), (N, S or h·S)
        states, contexts, weights = FusedRecurrence.apply(
            input_gates, state[0].index_select(0, order), *attention_inputs, coverage,
            *self.centre_parameters(), cell_weight, self.cell.weight_hh, self.cell.bias_hh,
            parts, Steps.packed(packed.batch_sizes),
        )  # fmt: skip
        logits = self.output(states, self.head_output(contexts), embedded)  # (N, V)
        padded = packed.pad(self.average_heads(weights)) if with_weights else None  # (B, T, S)
        return logits, targets, padded

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        if source.memory.device.type != "cpu":
            return super().decode_step(prev_tokens, state, source)
        self.build_tables(source)
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        _, context_weight = self.split_input_weight()
        input_gates = self.input_gates(prev_tokens, embedded, source)  # (B, G)
        state, context, weights = self.gates_step(input_gates, state, source, context_weight)
        assert weights is not None  # asked for by default
        return self.output(state[0], context, embedded), state, weights


class FastLuongDecoder(FastDecoder, LuongDecoder):
    """The Luong decoder's cell, attention and greedy loop in C where they apply (module
    docstring)."""

    def build_tables(self, source: EncodedSource) -> None:
        """The base tables, and ``attentional_memory``: W_c1 m (B, S, H) over the S source
        positions costs about S steps' worth of the per-step W_c1 c GEMM it replaces, and beam
        search saves it for each of its K rows per sentence. Several heads' context is W_o of
        their averages, not an average of the memory: ``heads_readout`` folds W_c1 into W_o
        instead, once per batch where each step would pay W_o's GEMM and W_c1's."""
        if not isinstance(source, DecodingSource) or source.tables_built or not self.is_decoding():
            return
        super().build_tables(source)
        context_weight = self.attentional.weight[:, : self.memory_size]  # W_c1 (H, M)
        if isinstance(self.attention, MultiHeadAttention):
            source.heads_readout = self.folded_head_output(context_weight)  # (H, D), (H,)
            return
        source.attentional_memory = F.linear(source.memory, context_weight)  # (B, S, H)

    def cell_runs_fused(self, *tensors: Tensor) -> bool:
        """Whether the cell over all steps runs in C for these tensors (its inputs and
        parameters): a GRU, and tensors the kernels take."""
        return not self.is_lstm and usable(*tensors)

    def run_cell(self, embedded: Tensor, state: DecoderState) -> Tensor:
        """The reference's loop over the cell in one call: the C kernel where it applies, else
        ATen's (cuDNN's on a GPU)."""
        params = self.cell_parameters()
        if self.cell_runs_fused(embedded, *params):
            return gru_steps(embedded, state[0], params)  # (B, T, H)
        return self.aten_cell(embedded, state)

    def cell_parameters(self) -> list[Tensor]:
        """The cell's parameters in ``torch.gru`` / ``torch.lstm``'s order for one layer."""
        cell = self.cell
        params = [cell.weight_ih, cell.weight_hh]
        if cell.bias_ih is not None:
            params += [cell.bias_ih, cell.bias_hh]
        return params

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FastLuongDecoder:
        """Every device or dtype move (``.to``, ``.cuda``, ``.half``) re-lays the cell out for
        cuDNN afterwards, as ``nn.GRU`` does (``flatten_cell``)."""
        moved = super()._apply(fn, recurse)
        self.flatten_cell()
        return moved

    def flatten_cell(self) -> None:
        """On a GPU, make the cell's parameters views of one buffer in cuDNN's layout (what
        ``nn.GRU.flatten_parameters`` does for its own). ``aten_cell``'s ``torch.gru`` then reads
        them in place; otherwise cuDNN copies them into such a buffer at every call and warns
        ("RNN module weights are not part of single contiguous chunk of memory"). The parameters
        keep their names and shapes, so checkpoints and the decoding step are unaffected.
        """
        params = self.cell_parameters()
        first = params[0]
        if not (first.is_cuda and torch.backends.cudnn.is_acceptable(first)):
            return
        if any(p.dtype != first.dtype for p in params):
            return
        with torch.cuda.device_of(first), torch.no_grad():
            # Arguments: weight stride (parameters per layer), input size, mode, hidden size,
            # projection size, layers, batch_first, bidirectional.
            torch._cudnn_rnn_flatten_weight(
                params,
                len(params),
                self.cell.input_size,
                cudnn_rnn.get_cudnn_mode("LSTM" if self.is_lstm else "GRU"),
                self.cell.hidden_size,
                0,
                1,
                True,
                False,
            )

    def aten_cell(self, embedded: Tensor, state: DecoderState) -> Tensor:
        """The cell over every step in one call: embedded (B, T, E) -> states (B, T, H).

        ``torch.gru`` / ``torch.lstm`` are the kernels behind ``nn.GRU`` / ``nn.LSTM``; a one-layer
        unidirectional RNN has exactly the parameters of its cell, so this is
        ``for t: h_t = cell(e_t, h_{t-1})``, looped in C++ (cuDNN on a GPU) instead of Python.
        """
        params = self.cell_parameters()
        has_biases = len(params) == 4
        # Arguments after params: has_biases, num_layers, dropout, train, bidirectional,
        # batch_first. The initial state gets a layer axis: (B, H) -> (1, B, H).
        if self.is_lstm:
            outputs, _, _ = torch.lstm(
                embedded,
                (state[0][None], state[1][None]),
                params,
                has_biases,
                1,
                0.0,
                self.training,
                False,
                True,
            )
        else:
            outputs, _ = torch.gru(
                embedded, state[0][None], params, has_biases, 1, 0.0, self.training, False, True
            )
        return outputs  # (B, T, H)

    def output(self, hidden: Tensor, contexts: Tensor) -> Tensor:
        """The reference's readout with the C pass's tanh where it applies."""
        attentional = self.attentional(torch.cat([contexts, hidden], dim=-1))  # (..., H)
        if usable(attentional) and attentional.is_contiguous():
            activated = tanh_with_grad_(attentional)  # a fresh tensor: in place
        else:
            activated = torch.tanh(attentional)
        return self.output_layer(self.dropout(activated))  # (..., V)

    def fused_product_scale(
        self, source: EncodedSource, query: Tensor, rows: int | None = None
    ) -> float | None:
        """The scale of ``product_scale`` when ``seq2seq.kernels.product_attention`` can compute
        the attention for ``query`` (R, H), else None. ``rows`` stands in for R where the rows
        name their sentences themselves (teacher forcing's packed rows), not R / B rows per
        sentence (a decoding step's)."""
        scale = product_scale(self.attention, query.shape[-1])
        rows = query.shape[0] if rows is None else rows
        if scale is None or not self.fused_attention_source(source, rows):
            return None
        return scale if usable(query) else None

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """The reference's step with the tables, and the attention in C (``product_attend`` for
        plain product scoring, ``attend``'s parts otherwise); an input-fed decoder or one with
        coverage through ``sequential_decode_step``."""
        if not isinstance(source, DecodingSource) or source.memory.device.type != "cpu":
            return super().decode_step(prev_tokens, state, source)
        self.build_tables(source)
        if self.is_sequential:
            return self.sequential_decode_step(prev_tokens, state, source)
        steps = self.steps_of(state)  # (B,): the target step t, for a window centred on it
        if source.token_gates is None:
            embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
            cell_state = self.step_cell(embedded, state)
        else:
            # (B, G) rows of the table, then the gates (see ``cell_gates``).
            gates = source.token_gates.index_select(0, prev_tokens)
            cell_state = self.cell_gates(gates, state, source)
        state, query = self.advance(cell_state, state), cell_state[0]  # query: (B, H)
        fused_step = self.fused_step_applies(query)
        positions = None if steps is None else steps[:, None]  # (B, 1)
        heads = self.heads_readout(query, source, positions, None)
        if heads is not None:
            readout, weights = heads
            attentional = decoding_tanh(readout, fused_step)
            return self.output_layer(self.dropout(attentional)), state, weights
        # When decoding, the weights average ``attentional_memory`` instead of the memory:
        # W_c [c; h] = W_c1 c + W_c2 h, and W_c1 c = Σ_s a_s (W_c1 m_s), projected once per batch,
        # which leaves no concatenation and only the W_c2 h GEMM per step.
        values = source.memory if source.attentional_memory is None else source.attentional_memory
        scale = self.fused_product_scale(source, query) if fused_step else None
        if scale is not None:
            # The scores, mask, softmax and average in one C pass: (B, M) or (B, H), and (B, S).
            averaged, weights = product_attend(
                query, source.projected_keys, values, source.src_lens, scale
            )
        else:
            # (B, 1, M) or (B, 1, H), and (B, 1, S)
            step_averaged, step_weights = self.attend_values(
                query[:, None, :], source, values, positions
            )
            averaged, weights = step_averaged[:, 0], step_weights[:, 0]
        if source.attentional_memory is None:
            return self.output(query, averaged), state, weights
        attentional = decoding_tanh(self.add_hidden_part(averaged, query, source), fused_step)
        return self.output_layer(self.dropout(attentional)), state, weights

    def sequential_decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: DecodingSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """The reference's ``sequential_step`` for decoding, from the tables: the cell's input
        W_ie e + b_ih (a table row) + W_if h~_{t-1}, the cell, the attention through ``attend``
        averaging W_c1 m (``attentional_memory``), h~_t = tanh(W_c1 c + W_c2 h), and the new
        state with h~_t fed and the coverage updated."""
        feed, coverage, steps = self.feed_of(state), self.coverage_of(state), self.steps_of(state)
        embedding_weight = self.cell.weight_ih[:, : self.embedding_size]  # W_ie (G, E)
        if source.token_gates is None:
            embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
            gates = self.embedding_gates(embedded, embedding_weight)  # (B, G)
        else:
            gates = source.token_gates.index_select(0, prev_tokens)  # (B, G)
        if feed is not None:  # + W_if h~_{t-1}: (B, H) @ (H, G), into the step's own gates
            feed_weight = self.cell.weight_ih[:, self.embedding_size :]
            packed = source.product(feed_weight, gates, feed)
            if packed is None:
                gates = torch.addmm(gates, feed, feed_weight.t())
            else:
                packed.into(gates, feed, accumulate=True)
        cell_state = self.cell_gates(gates, state, source)
        query = cell_state[0]  # (B, H): h_t asks where to look
        positions = None if steps is None else steps[:, None]  # (B, 1)
        step_coverage = None if coverage is None else coverage[:, None, :]  # (B, 1, S)
        heads = self.heads_readout(query, source, positions, step_coverage)
        if heads is not None:  # h~ = tanh(W_c [c; h]) from the heads' folded readout
            readout, weights = heads
            attentional = decoding_tanh(readout, self.fused_step_applies(query))
        else:
            attentional, weights = self.attended_vector(query, source, positions, step_coverage)
        attentional = self.dropout(attentional)  # (B, H): what is output and fed
        if coverage is not None:
            coverage = coverage + weights
        new_state = self.advance(
            cell_state, state, attentional if feed is not None else None, coverage
        )
        return self.output_layer(attentional), new_state, weights

    def attended_vector(
        self,
        query: Tensor,
        source: DecodingSource,
        positions: Tensor | None,
        coverage: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """A decoding step's h~ = tanh(W_c [c; h]) (B, H) and weights (B, S) through ``attend``,
        averaging W_c1 m (``attentional_memory``) where there is one; query h (B, H),
        positions (B, 1) and coverage (B, 1, S) or None each."""
        tables = source.attentional_memory  # W_c1 m (B, S, H), or None
        attended = source if tables is None else replace_memory(source, tables)
        # (B, 1, M or H), (B, 1, S)
        averaged, weights = self.attend(query[:, None, :], attended, True, positions, coverage)
        assert weights is not None  # asked for
        if tables is None:  # h~ = tanh(W_c [c; h])
            return self.attentional_vector(query, averaged[:, 0]), weights[:, 0]
        readout = self.add_hidden_part(averaged[:, 0], query, source)  # W_c [c; h] (B, H)
        return decoding_tanh(readout, self.fused_step_applies(query)), weights[:, 0]

    def add_hidden_part(self, averaged: Tensor, query: Tensor, source: DecodingSource) -> Tensor:
        """W_c [c; h] = W_c1 c + W_c2 h (B, H) from W_c1 c as it came averaged (B, H, a
        step's own) and the query h (B, H): (B, H) @ (H, H), added in place where the tables
        pack W_c2."""
        hidden_weight = self.attentional.weight[:, self.memory_size :]  # W_c2 (H, H)
        packed = source.product(hidden_weight, averaged, query)
        if packed is None:
            return torch.addmm(averaged, query, hidden_weight.t())
        packed.into(averaged, query, accumulate=True)
        return averaged

    def heads_readout(
        self,
        query: Tensor,
        source: DecodingSource,
        positions: Tensor | None,
        coverage: Tensor | None,
    ) -> tuple[Tensor, Tensor] | None:
        """W_c [c; h] (B, H) before its tanh and the weights averaged over the heads (B, S),
        from a decoding step's query h (B, H), positions (B, 1) and coverage (B, 1, S) or None,
        where several heads attend through the C parts; else None. The context c = W_o m + b_o
        of the heads' concatenated contexts m enters as W_c1 c = (W_c1 W_o) m + W_c1 b_o,
        folded once per batch (``build_tables``): no W_o GEMM and no concatenation a step."""
        folded = source.heads_readout
        if folded is None or not usable(query):
            return None
        fused = self.fused_attention(source, query.shape[0])
        if fused is None:
            return None
        # (B, 1, D), (B, 1, S)
        merged, averaged = self.attend_heads(query[:, None, :], source, *fused, positions, coverage)
        merged, averaged = merged[:, 0], averaged[:, 0]
        weight, bias = folded  # W_c1 W_o (H, D), W_c1 b_o (H,) or None
        readout = source.affine(merged, weight, bias)  # (B, D) @ (D, H) + (B, H) @ (H, H)
        if readout is None:
            readout = F.linear(merged, weight, bias)
        return self.add_hidden_part(readout, query, source), averaged

    def attend_values(
        self, queries: Tensor, source: EncodedSource, values: Tensor, positions: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """``attend`` with ``values`` (B, S, D) in place of the memory as what the weights
        average: contexts (R, Tq, D), weights (R, Tq, S); positions (R, Tq) or None."""
        if values is not source.memory:
            source = replace_memory(source, values)
        context, weights = self.attend(queries, source, positions=positions)
        assert weights is not None  # asked for by default
        return context, weights

    def fused_sequential(
        self, source: EncodedSource, hidden: Tensor
    ) -> tuple[StepAttention, AttentionParameters] | None:
        """The C parts and what they read, where ``luong.SequentialRecurrence`` computes this
        decoder's steps: each waits for the one before (input feeding, coverage), a GRU, an
        attention whose parts have C twins, and tensors the kernels take."""
        if not self.is_sequential or self.is_lstm or not usable(hidden, *self.cell_parameters()):
            return None
        return self.fused_attention(source, hidden.shape[0])

    def sequential_inputs(self, tokens: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``SequentialRecurrence``'s per-row inputs from target tokens (N,) or (B, T): the
        embedding part of the cell's input projection (…, G), the fed vector's weight W_if (G, H)
        or None, and the output's dropout as a multiplier (…, H) or None (one draw per row:
        the fed vector and the output are the same dropped h~)."""
        embedded = self.dropout(self.embedding(tokens))  # (…, E)
        weight_ih = self.cell.weight_ih
        input_gates = self.embedding_gates(embedded, weight_ih[:, : self.embedding_size])
        feed_weight = weight_ih[:, self.embedding_size :] if self.input_feeding else None
        keep = None
        if self.dropout.training and self.dropout.p > 0:
            keep = self.dropout(embedded.new_ones(*tokens.shape, self.cell.hidden_size))
        return input_gates, feed_weight, keep

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """The reference's teacher forcing, in one autograd node where each step waits for the
        one before (``fused_sequential``)."""
        fused = (
            None if source.memory.device.type != "cpu" else self.fused_sequential(source, state[0])
        )
        if fused is None:
            return super().forward(tgt_in, state, source, need_weights)
        if not self.input_feeding:  # coverage alone: the cell over every step first
            hiddens = self.run_cell(self.dropout(self.embedding(tgt_in)), state)  # (B, T, H)
            batch, length = tgt_in.shape
            time_steps = Steps.padded(batch, length, batch_first=False)  # row t·B + b
            logits, weights = self.looped_readout(
                time_major(hiddens), source, state, fused, time_steps
            )
            weights = self.average_heads(batch_major(weights, batch))  # (B, T, S)
            return batch_major(logits, batch), weights if need_weights else None
        parts, parameters = fused
        input_gates, feed_weight, keep = self.sequential_inputs(tgt_in)
        attention_inputs, attentional_weight, attentional_bias = self.sequential_loop_inputs(
            source, parameters
        )
        steps = None  # (B, T, ·), row b·T + t; with heads time-major (``time_major``)
        if parts.heads > 1:
            input_gates = time_major(input_gates)
            steps = Steps.padded(tgt_in.shape[0], tgt_in.shape[1], batch_first=False)
            keep = None if keep is None else time_major(keep)
        # (B, T, H), (B, T, h·S); or (T·B, ·) each with heads
        outputs = SequentialRecurrence.apply(
            input_gates, state[0], self.feed_of(state), *attention_inputs,
            self.coverage_of(state), *self.centre_parameters(), feed_weight,
            self.cell.weight_hh, self.cell.bias_hh, attentional_weight, attentional_bias, keep,
            parts, steps,
        )  # fmt: skip
        if steps is not None:
            outputs = tuple(batch_major(output, tgt_in.shape[0]) for output in outputs)
        attentionals, weights = outputs
        weights = self.average_heads(weights)  # (B, T, S)
        return self.output_layer(attentionals), weights if need_weights else None

    def sequential_loop_inputs(
        self, source: EncodedSource, parameters: AttentionParameters
    ) -> tuple[tuple[Tensor | None, ...], Tensor, Tensor | None]:
        """``loop_inputs`` for ``SequentialRecurrence``: the attention's inputs, W_c (H, M + H)
        with its context part W_c1 folded (several heads), and the bias that folding adds."""
        weight = self.attentional.weight
        context_weight, hidden_weight = weight.split([self.memory_size, weight.shape[0]], dim=1)
        inputs, context_weight, bias = self.loop_inputs(source, parameters, context_weight)
        if not isinstance(self.attention, MultiHeadAttention):
            return inputs, weight, None
        return inputs, torch.cat([context_weight, hidden_weight], dim=1), bias

    def looped_readout(
        self,
        hiddens: Tensor,
        source: EncodedSource,
        state: DecoderState,
        fused: tuple[StepAttention, AttentionParameters],
        steps: Steps,
    ) -> tuple[Tensor, Tensor]:
        """Coverage without input feeding: only the attention waits for the step before, so
        the cell has run over every step (hiddens (N, H), a step's rows together), the
        attention steps through ``AttentionLoop``, and the readout takes every row in one
        GEMM: logits (N, V) and the weights (N, h·S)."""
        parts, parameters = fused
        attention_inputs, attentional_weight, attentional_bias = self.sequential_loop_inputs(
            source, parameters
        )
        centre_weight, centre_vector = self.centre_parameters()
        keys, values, lens = attention_inputs[:3]
        # W_q and b_q, the heads' W_q and b_q; then the scoring's and the other parts' inputs
        query_weights, scoring = list(attention_inputs[3:7]), attention_inputs[7:]
        queries = hiddens
        weight, bias, heads_weight, heads_bias = query_weights
        if weight is not None and centre_weight is None:
            # No step's query waits for the step before: W_q h + b_q (N, A or h·K) of every row
            # in one GEMM (and its gradient in one), the loop reading them as its queries.
            # Local-p predicts its centres from the states, which the loop must then read.
            queries = project_queries(hiddens, weight, bias, heads_weight, heads_bias, parts.heads)
            query_weights = [None] * 4
        contexts, weights = AttentionLoop.apply(
            queries, keys, values, lens, *query_weights, *scoring,
            self.coverage_of(state), centre_weight, centre_vector, parts, steps,
        )  # fmt: skip
        return self.readout(contexts, hiddens, attentional_weight, attentional_bias), weights

    def readout(
        self, contexts: Tensor, hiddens: Tensor, weight: Tensor, bias: Tensor | None
    ) -> Tensor:
        """Logits (N, V) of every row at once: h~ = tanh(W [c; h] + b) through the C tanh, W
        the attentional layer's W_c (H, M + H) or its heads-folded form (``folded_head_output``;
        b the bias that folding adds, else None), contexts (N, M or D), states (N, H)."""
        combined = torch.cat([contexts, hiddens], dim=1)  # (N, M + H) @ (M + H, H)
        attentional = F.linear(combined, weight, bias)
        activated = tanh_with_grad_(attentional)  # a fresh contiguous tensor: in place
        return self.output_layer(self.dropout(activated))

    def sequential_logits(
        self,
        tgt_in: Tensor,
        tgt_out: Tensor,
        state: DecoderState,
        source: EncodedSource,
        fused: tuple[StepAttention, AttentionParameters],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``teacher_forced_logits`` through ``SequentialRecurrence`` over the N real target
        tokens, the batch sorted longest target first: logits (N, V), targets (N,), and the
        weights (B, T, S), 0 at the padded steps."""
        parts, parameters = fused
        packed, targets = self.pack_targets(tgt_in, tgt_out)
        order = packed.sorted_indices  # (B,) longest target first
        source = source.index_select(order)
        state = tuple(part.index_select(0, order) for part in state)
        if not self.input_feeding:  # coverage alone: the cell over every step first
            embedded = self.dropout(self.embedding(packed.tokens))  # (N, E)
            hiddens = gru_steps(embedded, state[0], self.cell_parameters(), packed.batch_sizes)
            steps = Steps.packed(packed.batch_sizes)
            logits, weights = self.looped_readout(hiddens, source, state, fused, steps)
            return logits, targets, packed.pad(self.average_heads(weights))  # (N, V), (B, T, S)
        input_gates, feed_weight, keep = self.sequential_inputs(packed.tokens)  # (N, ·)
        attention_inputs, attentional_weight, attentional_bias = self.sequential_loop_inputs(
            source, parameters
        )
        attentionals, weights = SequentialRecurrence.apply(
            input_gates, state[0], self.feed_of(state), *attention_inputs,
            self.coverage_of(state), *self.centre_parameters(), feed_weight,
            self.cell.weight_hh, self.cell.bias_hh, attentional_weight, attentional_bias, keep,
            parts, Steps.packed(packed.batch_sizes),
        )  # fmt: skip
        padded = packed.pad(self.average_heads(weights))  # (B, T, S)
        return self.output_layer(attentionals), targets, padded  # (N, V), (N,)

    def teacher_forced_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor]:
        """Over the N real target tokens where the cell runs in C: the embedding, the cell's input
        projection and steps, W_c and the output layer skip the padding, much of a batch of mixed
        lengths. Product scoring (dot, scaled dot, general) attends from the
        rows too, each over its sentence's keys (``PackedProductAttention``); other scoring
        reads the states back on the padded grid, one (B, T, S) product whose padded rows the
        C parts skip (``attend``'s ``live``), W_q included."""
        params = self.cell_parameters()
        if self.is_sequential:
            fused = self.fused_sequential(source, state[0])
            if fused is None:
                return super().teacher_forced_logits(tgt_in, tgt_out, state, source)
            logits, targets, _ = self.sequential_logits(tgt_in, tgt_out, state, source, fused)
            return logits, targets
        if not self.cell_runs_fused(*params):
            return super().teacher_forced_logits(tgt_in, tgt_out, state, source)
        packed, targets = self.pack_targets(tgt_in, tgt_out)
        embedded = self.dropout(self.embedding(packed.tokens))  # (N, E)
        initial = state[0].index_select(0, packed.sorted_indices)  # (B, H), longest first
        hiddens = gru_steps(embedded, initial, params, packed.batch_sizes)  # (N, H)
        scale = self.fused_product_scale(source, hiddens, rows=source.memory.shape[0])
        if scale is not None:
            # (N, H) queries, each against its sentence's (S, K) keys -> contexts (N, M)
            contexts = PackedProductAttention.apply(
                hiddens, source.projected_keys, source.memory, source.src_lens,
                packed.row_sentences(), scale,
            )  # fmt: skip
        else:
            positions = self.positions(state, tgt_in)  # (B, T) for a local-m window, else None
            heads_logits = self.packed_heads_logits(hiddens, packed, source, positions)
            if heads_logits is not None:
                return heads_logits, targets
            # (B, T, H) queries against (B, S, K) -> contexts (B, T, M) -> the rows' (N, M): the
            # attention's C parts where they apply (``attend``), all T steps in one call, the
            # padding's rows skipped.
            padded, _ = self.attend(
                packed.pad(hiddens), source, False, positions, live=packed.positions
            )
            contexts = packed.select(padded)
        return self.output(hiddens, contexts), targets  # (N, V), (N,)

    def packed_heads_logits(
        self, hiddens: Tensor, packed: PackedTokens, source: EncodedSource, positions: Tensor | None
    ) -> Tensor | None:
        """Several heads' teacher forcing from the N real rows' states (N, H) -> logits (N, V),
        or None where their C parts do not apply: ``attend_heads`` with W_q of the rows rather
        than of the padded grid, and W_o folded into the attentional layer's W_c1
        (``folded_head_output``), so that neither projection runs on the padding."""
        attention = self.attention
        if not isinstance(attention, MultiHeadAttention) or not usable(hiddens):
            return None
        fused = self.fused_attention(source, source.memory.shape[0])
        if fused is None:
            return None
        parts, parameters = fused
        head_queries = packed.pad(attention.W_q(hiddens))  # (N, D) -> (B, T, D)
        # (B, T, D), zeros at the padding, whose rows the C parts skip
        merged, _ = self.heads_context(
            packed.pad(hiddens), head_queries, source, parts, parameters, positions, None,
            packed.positions,
        )  # fmt: skip
        weight = self.attentional.weight
        context_weight, hidden_weight = weight.split([self.memory_size, weight.shape[0]], dim=1)
        folded, bias = self.folded_head_output(context_weight)  # (H, D), (H,) or None
        # h~ = tanh(W_c1 W_o c + W_c2 h + W_c1 b_o)
        folded_weight = torch.cat([folded, hidden_weight], dim=1)  # (H, D + H)
        return self.readout(packed.select(merged), hiddens, folded_weight, bias)  # (N, V)

    def teacher_forced_logits_and_weights(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor, Tensor]:
        """With input feeding or coverage, from ``sequential_logits``' packed pass (the weights
        0 at the padded steps); otherwise the reference's, whose grid's modules are the fast
        ones already (the cell in one call, the attention's parts)."""
        fused = self.fused_sequential(source, state[0]) if self.is_sequential else None
        if fused is None:
            return super().teacher_forced_logits_and_weights(tgt_in, tgt_out, state, source)
        return self.sequential_logits(tgt_in, tgt_out, state, source, fused)

    def fused_greedy(
        self, source: EncodedSource, state: DecoderState, task: GreedyTask
    ) -> tuple[Tensor, Tensor, int] | None:
        """``seq2seq.kernels.greedy`` where ``decode_step`` would take the C paths at every step:
        a GRU decoding on the CPU, product scoring, the decoding tables, and no active dropout
        before the output layer. The same steps, without the Python between their GEMMs."""
        query = state[0]
        self.build_tables(source)
        if not isinstance(source, DecodingSource) or not self.fused_step_applies(query):
            return None
        # One head averages W_c1 m (``attentional_memory``); several their own values.
        table, values = source.token_gates, source.attentional_memory
        heads = isinstance(self.attention, MultiHeadAttention)
        values = source.projected_values if heads else values
        if table is None or values is None or (self.dropout.training and self.dropout.p > 0):
            return None
        scale, parts = self.fused_product_scale(source, query), None
        if scale is None or self.counts_steps or self.is_sequential:  # the parts, in the loop
            parts = self.greedy_parts(source, query)
            if parts is None:
                return None
            scale = parts.parts.scale
        feed_weight = self.cell.weight_ih[:, self.embedding_size :] if self.input_feeding else None
        return luong_greedy(
            table, self.cell.weight_hh, self.cell.bias_hh, source.projected_keys, values,
            source.src_lens, scale, self.attentional.weight[:, self.memory_size :],
            self.output_layer.weight, self.output_layer.bias, query, task, parts,
            self.coverage_of(state), feed_weight, self.feed_of(state),
        )  # fmt: skip

    def greedy_parts(self, source: EncodedSource, query: Tensor) -> StepParts | None:
        """The attention's C parts and their tensors where ``luong_greedy`` composes them
        (``StepParts.applies``), else None: with several heads, their projections as the step
        loops take them (``loop_inputs``: an additive score's two query GEMMs, W_c1 reading the
        block's output)."""
        fused = self.fused_attention(source, query.shape[0])
        if fused is None or not StepParts.applies(fused[0]):
            return None
        parts, parameters = fused
        context_weight = self.attentional.weight[:, : self.memory_size]  # W_c1 (H, M)
        inputs, context_weight, context_bias = self.loop_inputs(source, parameters, context_weight)
        query_weight, query_bias, heads_weight, heads_bias = inputs[3:7]
        score_weight, key_bias, _, _, coverage_weight = inputs[7:12]
        several = parts.heads > 1  # one head's values are W_c1 m: nothing to fold after them
        centre_weight, centre_vector = self.centre_parameters()
        return StepParts(
            parts, query_weight, query_bias, score_weight, key_bias, coverage_weight,
            context_weight if several else None, context_bias if several else None,
            centre_weight, centre_vector, heads_weight, heads_bias,
        )  # fmt: skip


def local_p_centres(window: LocalWindow, queries: Tensor, src_lens: Tensor) -> Tensor:
    """``window.centres`` of local-p for queries (B, Tq, H) -> (B, Tq): with autograd, the
    module's; without (decoding), W_p q's GEMM and the C twin ``seq2seq_local_p_centres``,
    a step's half-dozen ATen ops in one call."""
    kernels = library()
    if torch.is_grad_enabled() or kernels is None or window.W_p is None or window.v_p is None:
        return window.centres(queries, src_lens, None)
    batch, per_sentence, size = queries.shape
    features = F.linear(queries.reshape(-1, size), window.W_p.weight).contiguous()  # (B·Tq, H)
    lengths = src_lens.to(torch.int64).contiguous()
    # row b·Tq + j reads sentence b
    sentence_of = torch.arange(batch).repeat_interleave(per_sentence)
    centres = features.new_empty(batch * per_sentence)
    vector = window.v_p.weight.contiguous()  # (1, H)
    kernels.seq2seq_local_p_centres(
        features.shape[0], size, vector.data_ptr(), lengths.data_ptr(), sentence_of.data_ptr(),
        features.data_ptr(), None, centres.data_ptr(),
    )  # fmt: skip
    return centres.view(batch, per_sentence)


def project_queries(
    states: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    heads_weight: Tensor | None,
    heads_bias: Tensor | None,
    heads: int,
) -> Tensor:
    """W_q s + b_q of states (N, H) -> (N, K or h·K); with the heads' own W_q (D, H) first,
    each head's d features through W_q (A, d) -> (N, h·A) (``FastDecoder.loop_inputs``)."""
    if heads_weight is None:
        return F.linear(states, weight, bias)
    head_queries = F.linear(states, heads_weight, heads_bias)  # (N, D)
    rows = states.shape[0]
    return F.linear(head_queries.view(rows * heads, -1), weight, bias).view(rows, -1)


def time_major(rows: Tensor) -> Tensor:
    """(B, T, ·) -> (T·B, ·), row t·B + b: each step's rows side by side, as a step loop with
    several heads reads them (``Steps.padded(B, T, batch_first=False)``)."""
    return rows.transpose(0, 1).reshape(-1, rows.shape[2])


def batch_major(rows: Tensor, batch: int) -> Tensor:
    """The inverse of ``time_major``: (T·B, ·) -> (B, T, ·)."""
    return rows.view(-1, batch, rows.shape[1]).transpose(0, 1)


def replace_memory(source: EncodedSource, memory: Tensor) -> EncodedSource:
    """``source`` with other values to average (same keys and lengths; a single scoring
    function's source: ``build_tables`` makes no ``attentional_memory`` for multi-head)."""
    return EncodedSource(memory, source.keys, source.projected_keys, source.src_lens)


class FastSeq2Seq(Seq2Seq):
    """The model, with its decoder's whole greedy loop in C where it has one that applies."""

    def fused_greedy(
        self, source: EncodedSource, state: DecoderState, task: GreedyTask
    ) -> tuple[Tensor, Tensor, int] | None:
        if isinstance(self.decoder, FastLuongDecoder):
            return self.decoder.fused_greedy(source, state, task)
        return None


# The reference class -> its accelerated subclass. Only these exact classes are swapped: a
# user's own subclass of a reference module keeps its own methods.
ACCELERATED: dict[type[nn.Module], type[nn.Module]] = {
    Seq2Seq: FastSeq2Seq,
    RNNEncoder: FastRNNEncoder,
    BahdanauDecoder: FastBahdanauDecoder,
    LuongDecoder: FastLuongDecoder,
    AdditiveAttention: FastAdditiveAttention,
    nn.Dropout: Dropout,
}
