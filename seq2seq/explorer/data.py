"""What the attention explorer page shows, as plain JSON-able data.

For each sentence and each model: the model's translation (and n-best list with beam search), its
attention while producing it, and the attention under teacher forcing on the reference (when one
is given: the same tokens for every model, so maps compare cell by cell) or on the model's own
translation. A Transformer gives every layer's and head's cross-attention as well as the last
layer's average (what its decoding reports), and its encoder's and decoder's self-attention.
With gold alignments: the AER of each map, per sentence, per model and per head. For every map:
the entropy of each target step's weights and the spread of the scores behind them (softmax
models: sparsemax and entmax forget the scores below their threshold).

Weights are rounded to 4 decimals: the page draws them and sums nothing again. Rounding makes a
small weight look like none, so each map also lists, per row, the columns whose weight is
exactly 0.0 (``zeros``): what a sparse normalizer or a window left out, not merely small. A
model's own maps (teacher-forced and decoding) carry ``coverage``: row t is what steps 0..t gave
each source word in total (the running sum of the weights, summed before rounding): the last row
shows which words were read more than once and which barely
(``seq2seq.analysis.metrics.attention_totals``), what coverage is for. (The page sums a head's or
a self-attention's rows itself.) A windowed model's teacher-forced map carries its ``window``:
each step's centre p_t and the half-width D.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq.analysis.alignment import (
    GoldAlignment,
    Link,
    argmax_links,
    count_links,
    exact_zeros,
)
from seq2seq.data.tokenization import BOS_ID, encode_batch, token_ids
from seq2seq.inference.bundle import attention_parts_of
from seq2seq.inference.translator import Translation, Translator
from seq2seq.kernels import reference_path
from seq2seq.models.transformer import Transformer, TransformerEncoderLayer
from seq2seq.positions import LocalWindow

DECIMALS = 4


@dataclass(frozen=True)
class ExplorerModel:
    """A model the page shows, under the name the page gives it."""

    name: str
    translator: Translator


def entropy(weights: Tensor) -> list[float]:
    """The entropy, in nats, of each row of ``weights`` (T, S), renormalised (local-p's rows sum
    to less than 1): 0 for a one-hot row, ln S for a uniform one, over a sparse row's support."""
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)
    rows = weights.clamp_min(1e-12)
    # + 0.0: a one-hot row's -0.0 reads 0.
    return [round(float(value), DECIMALS) + 0.0 for value in -(weights * rows.log()).sum(-1)]


def rounded(weights: Tensor) -> list[list[float]]:
    return [[round(float(w), DECIMALS) for w in row] for row in weights.tolist()]


def aer(weights: Tensor, gold: GoldAlignment | None) -> float | None:
    """AER of the argmax links of ``weights`` (T, S) against ``gold``; None without gold."""
    if gold is None:
        return None
    links = argmax_links(weights, weights.shape[1], weights.shape[0])
    return round(count_links(links, gold).aer, DECIMALS)


# The spread of the scores, recovered from the weights: softmax forgets each row's mean score,
# and ln w_i minus the row's mean of ln w is the score minus its mean, exactly (clamped where a
# weight underflowed). Bins of one unit from -SPREAD to +SPREAD, the outermost open-ended.
SPREAD = 12


def score_spread(weights: Tensor, readable: Tensor | None = None) -> dict[str, Any]:
    """Histogram of (score − the row's mean score) over the cells of softmax ``weights`` (T, S)
    that a row may read (``readable`` (T, S) bool; all by default: causal self-attention's future
    is masked, not scored) and did read (a window's outside has weight exactly 0, unscored)."""
    readable = torch.ones_like(weights, dtype=torch.bool) if readable is None else readable
    readable = readable & (weights > 0)
    logs = weights.clamp_min(1e-30).log()  # (T, S)
    means = (logs * readable).sum(-1, keepdim=True) / readable.sum(-1, keepdim=True).clamp_min(1)
    centered = (logs - means)[readable]  # (cells read,)
    bins = centered.clamp(-SPREAD, SPREAD - 1e-6).floor().long() + SPREAD  # 0 .. 2·SPREAD - 1
    counts = torch.bincount(bins, minlength=2 * SPREAD).tolist()
    std = float(centered.std()) if centered.numel() > 1 else 0.0
    return {"low": -SPREAD, "counts": counts, "std": round(std, DECIMALS)}


def attention_map(
    weights: Tensor,
    gold: GoldAlignment | None,
    readable: Tensor | None = None,
    softmax: bool = True,
    coverage: bool = False,
) -> dict[str, Any]:
    """One map (T, S) as the page reads it; the score spread only for ``softmax`` weights, the
    one normalizer whose weights keep every score (up to each row's mean); with ``coverage``, the
    running sum of its rows (a model's own maps: a head's or a self-attention's would double the
    page for a sum the page can take itself)."""
    return {
        "weights": rounded(weights),
        "zeros": exact_zeros(weights),
        **({"coverage": rounded(weights.double().cumsum(dim=0))} if coverage else {}),  # (T, S)
        "entropy": entropy(weights),
        "aer": aer(weights, gold),
        "spread": score_spread(weights, readable) if softmax else None,
    }


def self_attention(translator: Translator, source: str, target_tokens: list[str]) -> Any:
    """A Transformer's encoder and decoder self-attention under teacher forcing, every layer and
    head: ``(encoder (L, h, S, S), decoder (L, h, T, T))``, or None for an RNN model.

    Forward hooks read each self-attention's inputs and run it once more asking for its weights
    (decoding never asks: the fast path returns none); they are removed before returning."""
    model = translator.model
    if not isinstance(model, Transformer):
        return None
    captured: dict[str, list[Tensor]] = {"encoder": [], "decoder": []}

    def capture(side: str) -> Any:
        def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            # module.forward, not module(): the call must not run this hook again.
            weights = module.forward(*args, **{**kwargs, "need_weights": True})[1]
            captured[side].append(weights[0].detach())  # (h, Tq, Tk) of the one sentence

        return hook

    encoder_layers = [m for m in model.encoder.modules() if isinstance(m, TransformerEncoderLayer)]
    attentions = [("encoder", layer.self_attention) for layer in encoder_layers]
    attentions += [("decoder", layer.self_attention) for layer in model.decoder.decoder_layers()]
    handles = [a.register_forward_hook(capture(side), with_kwargs=True) for side, a in attentions]
    try:
        [src_ids] = encode_batch(translator.src_tokenizer, [source])
        # The decoder reads <bos> t1 .. t(T-1): row j predicts t(j+1) (one row for no target).
        tgt_in = [BOS_ID, *token_ids(translator.tgt_tokenizer, target_tokens)][:-1] or [BOS_ID]
        device = translator.device
        with torch.no_grad():
            model(
                torch.tensor([src_ids], device=device),
                torch.tensor([len(src_ids)], device=device),
                torch.tensor([tgt_in], device=device),
            )
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(captured["encoder"]).cpu(), torch.stack(captured["decoder"]).cpu()


# Our scoring functions' classes, by the names the config gives them (conf/attention/*.yaml).
SCORING_NAMES = {
    "seq2seq.attention.AdditiveAttention": "additive",
    "seq2seq.attention.GeneralAttention": "general",
}


def model_label(path: str | Path) -> str:
    """A short name for the model at ``path``, for a page's panels and title: the run's name for
    ``RUN/bundle`` and ``RUN/checkpoints/NAME.ckpt`` (with the checkpoint's name), else the
    file's or folder's own name."""
    path = Path(path)
    if path.name == "bundle" and path.parent.name:
        return path.parent.name
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name}/{path.stem}"
    return path.stem if path.is_file() else path.name or str(path)


def scoring_name(attention: dict[str, Any]) -> str:
    """The name ``attention=NAME`` gives a scoring function (``dot`` and ``scaled_dot`` are one
    class, told apart by ``scaled``); a user's is named by its ``_target_``."""
    target = str(attention.get("_target_", ""))
    if target == "seq2seq.attention.DotProductAttention":
        return "scaled_dot" if attention.get("scaled") else "dot"
    return SCORING_NAMES.get(target, target or "unknown")


def describe_model(model: ExplorerModel) -> dict[str, Any]:
    config = model.translator.model_config
    attention = config.get("attention", {})
    network = model.translator.model
    layers = network.decoder.decoder_layers() if isinstance(network, Transformer) else None
    return {
        "name": model.name,
        "architecture": str(config.get("_target_", "")).rsplit(".", 1)[-1],
        "scoring": str(attention.get("_target_", "")).rsplit(".", 1)[-1],
        "attention": scoring_name(attention),
        "scaled": attention.get("scaled"),
        **attention_parts_of(config),
        "layers": None if layers is None else len(layers),
        "heads": None if layers is None else layers[0].cross_attention.num_heads,
        "backend": model.translator.backend,
    }


def model_view(
    model: ExplorerModel,
    source: str,
    reference: str | None,
    translation: Translation,
    gold: GoldAlignment | None,
) -> dict[str, Any]:
    """One model's view of one sentence."""
    translator = model.translator
    # The score spread is read back from softmax weights: not from a sparse normalizer's (it
    # forgets the scores below its threshold) nor from local-p's (times a Gaussian).
    parts = attention_parts_of(translator.model_config)
    softmax = parts["normalizer"] == "softmax" and parts["window"] != "local_p"
    view: dict[str, Any] = {
        "hypothesis": translation.text,
        "hyp_tokens": translation.tgt_tokens or [],
        "hyp_attention": None
        if translation.attention is None
        else attention_map(translation.attention, None, softmax=softmax, coverage=True),
        "score": translation.score,
        "n_best": [{"text": text, "score": score} for text, score in translation.n_best or []],
    }
    target = reference if reference is not None else translation.text
    [forced] = translator.force_decode([source], [target])
    assert forced.attention is not None
    view["src_tokens"] = forced.src_tokens or []
    view["forced_on"] = "reference" if reference is not None else "hypothesis"
    view["tgt_tokens"] = forced.tgt_tokens or []
    view["forced"] = attention_map(forced.attention, gold, softmax=softmax, coverage=True)
    if parts["window"] != "global":
        view["forced"]["window"] = {
            "centres": window_centres(translator, source, target),
            "size": window_size(translator),
        }
    heads = translator.attention_heads(source, forced.tgt_tokens or [])
    if heads is not None:  # (L, h, T, S)
        view["heads"] = [
            [attention_map(head, gold, softmax=softmax) for head in layer] for layer in heads
        ]
        # Each layer's average over its heads, with its AER (the last is view["forced"]).
        view["layer_means"] = [
            attention_map(layer.mean(0), gold, softmax=softmax) for layer in heads
        ]
        inputs = ["<bos>", *(forced.tgt_tokens or [])][: len(forced.tgt_tokens or []) or 1]
        encoder, decoder = self_attention(translator, source, forced.tgt_tokens or [])
        view["decoder_inputs"] = inputs
        view["encoder_self"] = [
            [attention_map(h, None, softmax=softmax) for h in layer] for layer in encoder
        ]
        causal = torch.ones(decoder.shape[-2:], dtype=torch.bool).tril()  # (T, T)
        view["decoder_self"] = [
            [attention_map(h, None, causal, softmax) for h in layer] for layer in decoder
        ]
    return view


def view_cells(translator: Translator, source_tokens: int, target_tokens: int) -> int:
    """At most how many attention weights ``model_view`` holds for a sentence of
    ``source_tokens`` S whose translations have at most ``target_tokens`` T: the hypothesis's and
    the teacher-forced maps with their coverage (4 · T · S) and, for a Transformer, every head
    and layer mean of the cross-attention (L · (h + 1) · T · S) and every head of the encoder's
    and decoder's self-attention (L_enc · h · S², L · h · T²). The server bounds a live request
    by it before running anything."""
    source, target = source_tokens, target_tokens
    cells = 4 * target * source
    model = translator.model
    if isinstance(model, Transformer):
        layers = model.decoder.decoder_layers()
        heads = layers[0].cross_attention.num_heads
        encoder = sum(isinstance(m, TransformerEncoderLayer) for m in model.encoder.modules())
        cells += len(layers) * (heads + 1) * target * source
        cells += heads * (encoder * source * source + len(layers) * target * target)
    return cells


def window_modules(translator: Translator) -> list[LocalWindow]:
    return [m for m in translator.model.modules() if isinstance(m, LocalWindow)]


def window_size(translator: Translator) -> int:
    return window_modules(translator)[0].size


def window_centres(translator: Translator, source: str, target: str) -> list[float]:
    """p_t of each target step of the teacher-forced ``target`` after ``source``, what a local
    window is centred on (Luong's eq. 9 for local-p, t for local-m): a forward hook reads the
    window's inputs and asks it for its centres; it is removed before returning. The model runs
    on its reference path meanwhile: the C kernels compute the same window without calling the
    module."""
    captured: list[Tensor] = []

    def hook(module: LocalWindow, args: Any, kwargs: Any, output: Any) -> None:
        call = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        centres = module.centres(call["queries"], call["src_lens"], call["positions"])
        captured.append(centres[0].detach().cpu())  # (Tq,) of the one sentence

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in window_modules(translator)]
    try:
        with reference_path(translator.model):
            [forced] = translator.force_decode([source], [target])
    finally:
        for handle in handles:
            handle.remove()
    steps = len(forced.tgt_tokens or [])
    # Teacher forcing calls the window once (every step) or, step by step, once per step.
    return [round(float(c), DECIMALS) for c in torch.cat(captured)[:steps]] if captured else []


def explorer_data(
    models: Sequence[ExplorerModel],
    sources: Sequence[str],
    references: Sequence[str] | None = None,
    alignments: Sequence[GoldAlignment] | None = None,
    beam_size: int = 1,
    n_best: int | None = None,
    title: str = "Attention explorer",
    checkpoints: Sequence[dict[str, Any]] = (),
    links: tuple[str, Sequence[Sequence[Link]]] | None = None,
) -> dict[str, Any]:
    """The page's data: ``models`` translating ``sources`` (with ``references`` and gold
    ``alignments``, line-parallel, when given). ``checkpoints`` are earlier snapshots of the
    same data (the checkpoint slider of a training run), oldest first. ``links``: another
    aligner's name and links of each (source, reference) pair (e.g. eflomal's), drawn beside the
    gold, with their AER against it."""
    if references is not None and len(references) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(references)} references.")
    if alignments is not None and len(alignments) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(alignments)} alignments.")
    if links is not None and len(links[1]) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(links[1])} lines of links.")
    translations = {
        model.name: model.translator.translate_detailed(
            list(sources),
            beam_size=beam_size,
            with_attention=True,
            n_best=n_best if beam_size > 1 else None,
            with_scores=beam_size > 1,
        )
        for model in models
    }
    sentences = []
    for index, source in enumerate(sources):
        reference = None if references is None else references[index]
        gold = None if alignments is None else alignments[index]
        sentences.append(
            {
                "src": source,
                "ref": reference,
                "gold": None
                if gold is None
                else {
                    "sure": sorted([i, j] for i, j in gold.sure),
                    "possible": sorted([i, j] for i, j in gold.possible - gold.sure),
                },
                "models": {
                    model.name: model_view(
                        model, source, reference, translations[model.name][index], gold
                    )
                    for model in models
                },
                **other_links(links, index, gold),
            }
        )
    return {
        "title": title,
        "links_name": None if links is None else links[0],
        "models": [describe_model(model) for model in models],
        "beam_size": beam_size,
        "sentences": sentences,
        "checkpoints": list(checkpoints),
        "version": 1,
    }


def other_links(
    links: tuple[str, Sequence[Sequence[Link]]] | None, index: int, gold: GoldAlignment | None
) -> dict[str, Any]:
    """Sentence ``index``'s entries for another aligner's links: the links (source, target) and
    their AER against the gold (None without gold); nothing without such links."""
    if links is None:
        return {}
    found = sorted(set(links[1][index]))
    score = None if gold is None else round(count_links(found, gold).aer, DECIMALS)
    return {"links": [[i, j] for i, j in found], "links_aer": score}


def snapshot_sentences(
    data: dict[str, Any],
) -> tuple[list[str], list[str] | None, list[GoldAlignment] | None]:
    """The sources, references and gold links of a page's data (e.g. a training run's
    ``explorer-step-NNNNNN.json``), to show the same sentences under other models."""
    sentences = data["sentences"]
    sources = [sentence["src"] for sentence in sentences]
    references = [sentence["ref"] for sentence in sentences]
    golds = [sentence["gold"] for sentence in sentences]
    gold = None
    if all(g is not None for g in golds):
        gold = [
            GoldAlignment(
                frozenset((i, j) for i, j in g["sure"]),
                frozenset((i, j) for i, j in g["possible"]),
            )
            for g in golds
        ]
    return sources, None if None in references else references, gold
