"""Translate raw text with a trained model (a checkpoint or an export bundle).

from seq2seq import Translator
Translator.load("bundle/").translate(["ein Hund läuft ."], beam_size=5)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from seq2seq.data.batching import pad
from seq2seq.data.tokenization import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    decode,
    encode_batch,
    token_ids,
    unknown_words,
)
from seq2seq.errors import CTRANSLATE2, ONNX, ModelFileError, missing_extra, require_extra
from seq2seq.inference.bundle import TrainedModel, load
from seq2seq.models import Transformer
from seq2seq.search import (
    BeamOutput,
    Hypotheses,
    StepwiseModel,
    beam_search,
    best_search,
    check_beam,
    check_coverage_penalty,
    check_length_penalty,
    is_count,
    max_output_lengths,
)

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One translated sentence; token lists and attention only when asked for."""

    text: str
    truncated: bool = False  # the source was longer than the model's maximum and was cut
    src_tokens: list[str] | None = None
    tgt_tokens: list[str] | None = None
    attention: Tensor | None = None  # (len(tgt_tokens), len(src_tokens)), rows sum to 1
    # Beam search's log P(Y) / lp(Y) of ``text``, when scores were asked for.
    score: float | None = None
    # The n best (text, score), best first (``text`` and ``score`` are the first), when asked for.
    n_best: list[tuple[str, float]] | None = None
    # The n best in full (text, score, tokens and attention), when asked for with the attention.
    hypotheses: list[Translation] | None = None


# What runs the search: PyTorch (the model itself), ONNX Runtime (the bundle's encoder.onnx and
# decoder_step.onnx, from scripts/export.py --onnx) or CTranslate2 (the bundle's ctranslate2/,
# from --format ctranslate2: its own search, with its own length penalty).
BACKENDS = ("torch", "onnx", "ctranslate2")


class Translator:
    """Batched greedy or beam-search translation of untokenized sentences."""

    def __init__(
        self,
        trained: TrainedModel,
        device: str | torch.device = "cpu",
        searched: StepwiseModel | None = None,
        backend: str = "torch",
    ) -> None:
        """``searched``: what the search steps through instead of the model (an ONNX Runtime
        model for ``backend="onnx"``); the model still answers ``force_decode`` and
        ``attention_heads``."""
        self.device = torch.device(device)
        self.model = trained.model.to(self.device).eval()
        self.searched: StepwiseModel = self.model if searched is None else searched
        self.backend = backend
        self.ctranslate2: Any = None  # a ctranslate2.Translator for backend="ctranslate2"
        self.src_tokenizer = trained.src_tokenizer
        self.tgt_tokenizer = trained.tgt_tokenizer
        self.max_len_a = float(trained.decoding["max_len_a"])
        self.max_len_b = int(trained.decoding["max_len_b"])
        self.max_src_len = int(trained.decoding["max_src_len"])
        self.metrics = trained.metrics
        self.model_config = trained.model_config

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        kernels: str | None = None,
        trust_modules: Iterable[str] = (),
        backend: str = "torch",
    ) -> Translator:
        """From a train.py checkpoint or a scripts/export.py bundle; runs no code from it.
        ``kernels`` (auto or off) overrides the model's ``model.kernels``; ``trust_modules``
        (module names or ``.py`` files) may provide a scoring function that is not built in:
        a file that names one from any other module is refused. ``backend="onnx"`` decodes with
        the bundle's ONNX graphs in ONNX Runtime (on the CPU)."""
        if backend not in BACKENDS:
            raise ModelFileError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
        trained = load(path, map_location="cpu", kernels=kernels, trust_modules=trust_modules)
        if backend == "torch":
            return cls(trained, device)
        if torch.device(device).type != "cpu":
            raise ModelFileError(f"the {backend} backend runs on the CPU here; got {device!r}.")
        if backend == "ctranslate2":
            translator = cls(trained, device, backend=backend)
            translator.ctranslate2 = ctranslate2_model(Path(path))
            return translator
        return cls(trained, device, onnx_model(Path(path), trained), backend)

    def bounds(self, sentences: Sequence[str]) -> list[tuple[int, int]]:
        """Per sentence, what translating it may cost at most: the source tokens the model
        reads (at most ``max_src_len``) and the target tokens it may write (a·S + b, EOS
        included); (0, 0) for a blank sentence, which is answered without the model."""
        src_ids = encode_batch(self.src_tokenizer, list(sentences))
        lengths = torch.tensor([min(len(ids), self.max_src_len) for ids in src_ids])  # (N,)
        limits = max_output_lengths(lengths, self.max_len_a, self.max_len_b)  # (N,)
        return [
            (int(n), max(1, int(m))) if n else (0, 0)
            for n, m in zip(lengths.tolist(), limits.tolist(), strict=True)
        ]

    def translate(
        self,
        sentences: Sequence[str],
        beam_size: int = 1,
        length_penalty: float = 0.6,
        batch_size: int = 64,
        coverage_penalty: float = 0.0,
    ) -> list[str]:
        """One translation per sentence, in order; a blank sentence gives an empty string."""
        translations = self.translate_detailed(
            sentences, beam_size, length_penalty, batch_size, coverage_penalty=coverage_penalty
        )
        return [translation.text for translation in translations]

    def translate_detailed(
        self,
        sentences: Sequence[str],
        beam_size: int = 1,
        length_penalty: float = 0.6,
        batch_size: int = 64,
        with_attention: bool = False,
        n_best: int | None = None,
        with_scores: bool = False,
        coverage_penalty: float = 0.0,
    ) -> list[Translation]:
        """Like ``translate``, with truncation flags and, if asked, tokens and attention weights,
        the score of each translation (``with_scores``) and the ``n_best`` best of the beam.

        Scores and n-best lists come from beam search, which ranks by log P(Y) / lp(Y), plus
        GNMT's coverage penalty with β = ``coverage_penalty`` > 0 (``seq2seq.search``): with
        ``beam_size=1`` that is a beam of one (greedy search's tokens where the length penalty
        and β are 0). Sentences are sorted by length into batches (less padding) and put back
        in input order.
        """
        check_request(sentences, beam_size, length_penalty, batch_size, n_best, coverage_penalty)
        src_ids = encode_batch(self.src_tokenizer, list(sentences))
        results = [Translation("") for _ in sentences]
        if self.ctranslate2 is not None:
            if coverage_penalty > 0:
                raise ValueError(
                    f"coverage penalty {coverage_penalty}: the CTranslate2 backend cannot apply "
                    "it as this toolkit does (its penalty reads the attention of its alignment "
                    "head, not the map averaged over the last layer's heads that ours reads), so "
                    "it refuses rather than rank differently. Use the PyTorch or ONNX backend "
                    "for a coverage penalty, or set it to 0."
                )
            search = (beam_size, length_penalty, n_best, with_attention, with_scores)
            for indices in length_batches(src_ids, batch_size):
                self._translate_ctranslate2(src_ids, indices, results, *search)
            return results
        # Blank lines (no tokens) are answered without the model: an RNN cannot encode nothing.
        for indices in length_batches(src_ids, batch_size):
            batch = [src_ids[i][: self.max_src_len] for i in indices]
            src = pad(batch).to(self.device)  # (B, S)
            src_lens = torch.tensor([len(ids) for ids in batch], device=self.device)  # (B,)
            if n_best is None and not with_scores:
                hypotheses = self._search(
                    src, src_lens, beam_size, length_penalty, coverage_penalty
                )
                ranked = None
            else:
                ranked = self._beam(
                    src, src_lens, beam_size, length_penalty, n_best or 1, coverage_penalty
                )
                hypotheses = ranked.best
            # One conversion per batch instead of one per row.
            token_rows, lengths = hypotheses.tokens.tolist(), hypotheses.lengths.tolist()
            for row, index in enumerate(indices):
                length = lengths[row]
                ids = token_rows[row][:length]
                result = (
                    self._attended(
                        ids, hypotheses.attention[row], _tokens(self.src_tokenizer, batch[row])
                    )
                    if with_attention
                    else Translation(decode(self.tgt_tokenizer, ids))
                )
                result.truncated = len(src_ids[index]) > self.max_src_len
                if ranked is not None:
                    alternatives = self._ranked(ranked, row)
                    result.score = alternatives[0][1]
                    result.n_best = alternatives if n_best is not None else None
                    if n_best is not None and with_attention:
                        result.hypotheses = self._hypotheses(ranked, row, result.src_tokens)
                results[index] = result
        return results

    def _translate_ctranslate2(
        self,
        src_ids: list[list[int]],
        indices: list[int],
        results: list[Translation],
        beam_size: int,
        length_penalty: float,
        n_best: int | None,
        with_attention: bool,
        with_scores: bool,
    ) -> None:
        """CTranslate2's search over the sentences ``indices``, into ``results``, each within our
        length limit (a·S + b tokens, EOS included; CTranslate2's max_decoding_length counts it
        too). Greedy tokens do not depend on the limit, so one call takes the batch at its
        largest limit and each output is cut to its own; a beam's ranking does, so beam search
        (and scores) runs one call per limit."""
        lengths = {i: min(len(src_ids[i]), self.max_src_len) for i in indices}
        limits = {
            i: max(1, int(max_output_lengths(torch.tensor([n]), self.max_len_a, self.max_len_b)))
            for i, n in lengths.items()
        }
        cut = beam_size == 1 and n_best is None and not with_scores
        groups: dict[int, list[int]] = {}
        for index in indices:
            groups.setdefault(0 if cut else limits[index], []).append(index)
        for group in groups.values():
            tokens = [_tokens(self.src_tokenizer, src_ids[i][: lengths[i]]) for i in group]
            outputs = self.ctranslate2.translate_batch(
                tokens,
                beam_size=beam_size,
                length_penalty=length_penalty,
                max_decoding_length=max(limits[i] for i in group),
                num_hypotheses=n_best or 1,
                return_scores=True,
                return_attention=with_attention,
            )
            for index, source, output in zip(group, tokens, outputs, strict=True):
                hypotheses = [hypothesis[: limits[index]] for hypothesis in output.hypotheses]
                texts = [
                    decode(self.tgt_tokenizer, token_ids(self.tgt_tokenizer, hypothesis))
                    for hypothesis in hypotheses
                ]
                result = Translation(texts[0], len(src_ids[index]) > self.max_src_len)
                if with_scores or n_best is not None:
                    result.score = float(output.scores[0])
                    ranked = list(zip(texts, map(float, output.scores), strict=True))
                    result.n_best = ranked if n_best is not None else None
                if with_attention:
                    ranks = [
                        Translation(
                            text,
                            score=float(score),
                            src_tokens=source,
                            tgt_tokens=list(hypothesis),
                            attention=torch.tensor(weights)[: len(hypothesis), : len(source)],
                        )
                        for text, score, hypothesis, weights in zip(
                            texts, output.scores, hypotheses, output.attention, strict=True
                        )
                    ]
                    result.src_tokens = source
                    result.tgt_tokens = ranks[0].tgt_tokens
                    result.attention = ranks[0].attention
                    result.hypotheses = ranks if n_best is not None else None
                results[index] = result

    @torch.no_grad()
    def force_decode(
        self, sources: Sequence[str], targets: Sequence[str], batch_size: int = 64
    ) -> list[Translation]:
        """The attention the model pays while reading each given target (teacher forcing).

        Returns, per pair, the source and target tokens and weights (len(tgt_tokens),
        len(src_tokens)): row j is the attention of the step that predicts target token j. A pair
        with an empty side gets an empty (0, S) or (T, 0) matrix.
        """
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets.")
        src_ids = encode_batch(self.src_tokenizer, list(sources))
        tgt_ids = encode_batch(self.tgt_tokenizer, list(targets))
        results = [
            Translation(
                target,
                src_tokens=_tokens(self.src_tokenizer, source),
                tgt_tokens=_tokens(self.tgt_tokenizer, tgt),
                attention=torch.zeros(len(tgt), len(source)),
            )
            for target, source, tgt in zip(targets, src_ids, tgt_ids, strict=True)
        ]
        for indices in length_batches(src_ids, batch_size):
            src = pad([src_ids[i] for i in indices]).to(self.device)  # (B, S)
            src_lens = torch.tensor([len(src_ids[i]) for i in indices], device=self.device)
            tgt_in = pad([[BOS_ID, *tgt_ids[i]] for i in indices]).to(self.device)  # (B, T)
            _, weights = self.model(src, src_lens, tgt_in)  # (B, T, S)
            assert weights is not None  # asked for by default
            for row, index in enumerate(indices):
                shape = len(tgt_ids[index]), len(src_ids[index])
                results[index].attention = weights[row, : shape[0], : shape[1]].cpu()
        return results

    @torch.no_grad()
    def attention_heads(self, source: str, target_tokens: Sequence[str]) -> Tensor | None:
        """Every layer's and head's cross-attention while reading ``target_tokens`` (a
        ``Translation``'s ``tgt_tokens``) after ``source`` (teacher forcing), (L, h,
        len(target_tokens), len(src_tokens)): a Transformer's; None for a model with one
        attention (its map is ``force_decode``'s)."""
        if not isinstance(self.model, Transformer):
            return None
        [src_ids] = encode_batch(self.src_tokenizer, [source])
        tgt_ids = token_ids(self.tgt_tokenizer, target_tokens)
        src = torch.tensor([src_ids], device=self.device)  # (1, S)
        src_lens = torch.tensor([len(src_ids)], device=self.device)
        tgt_in = torch.tensor([[BOS_ID, *tgt_ids]], device=self.device)  # (1, T + 1)
        encoded, _ = self.model.encode(src, src_lens)
        weights = self.model.decoder.cross_attention_weights(tgt_in, encoded)  # (1, L, h, T+1, S)
        return weights[0, :, :, : len(tgt_ids)].cpu()

    def _beam(
        self,
        src: Tensor,
        src_lens: Tensor,
        beam_size: int,
        length_penalty: float,
        n_best: int,
        coverage_penalty: float = 0.0,
    ) -> BeamOutput:
        return beam_search(
            self.searched,
            src,
            src_lens,
            BOS_ID,
            EOS_ID,
            PAD_ID,
            beam_size=beam_size,
            length_penalty=length_penalty,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            n_best=n_best,
            coverage_penalty_weight=coverage_penalty,
        )

    def _ranked(self, output: BeamOutput, row: int) -> list[tuple[str, float]]:
        """Sentence ``row``'s n best (text, score), best first."""
        tokens, lengths = output.tokens[row].tolist(), output.lengths[row].tolist()  # (N, L), (N,)
        scores = output.scores[row].tolist()  # (N,)
        return [
            (decode(self.tgt_tokenizer, ids[:length]), score)
            for ids, length, score in zip(tokens, lengths, scores, strict=True)
        ]

    def _hypotheses(
        self, output: BeamOutput, row: int, src_tokens: list[str] | None
    ) -> list[Translation]:
        """Sentence ``row``'s n best with their tokens and attention (no EOS row), best first."""
        assert src_tokens is not None
        tokens, lengths = output.tokens[row].tolist(), output.lengths[row].tolist()  # (N, L), (N,)
        hypotheses = []
        for rank, (ids, length) in enumerate(zip(tokens, lengths, strict=True)):
            hypothesis = self._attended(ids[:length], output.attention[row, rank], src_tokens)
            hypothesis.score = float(output.scores[row, rank])
            hypotheses.append(hypothesis)
        return hypotheses

    def _attended(self, ids: list[int], weights: Tensor, src_tokens: list[str]) -> Translation:
        """The translation of ``ids`` (EOS included) with its tokens and its rows of attention
        ``weights`` (L, S): one per target token, none for EOS, which has no word."""
        n_out = len(ids) - (ids[-1] == EOS_ID if ids else 0)
        return Translation(
            decode(self.tgt_tokenizer, ids),
            src_tokens=src_tokens,
            tgt_tokens=_tokens(self.tgt_tokenizer, ids[:n_out]),
            attention=weights[:n_out, : len(src_tokens)].cpu(),
        )

    def _search(
        self,
        src: Tensor,
        src_lens: Tensor,
        beam_size: int,
        length_penalty: float,
        coverage_penalty: float = 0.0,
    ) -> Hypotheses:
        return best_search(
            self.searched,
            src,
            src_lens,
            BOS_ID,
            EOS_ID,
            PAD_ID,
            beam_size=beam_size,
            length_penalty=length_penalty,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            coverage_penalty_weight=coverage_penalty,
        )


def ctranslate2_model(path: Path) -> Any:
    """The bundle's CTranslate2 model; a clear error without it or without the package."""
    require_extra("ctranslate2", CTRANSLATE2)
    from seq2seq.inference.ctranslate2_export import CTRANSLATE2_DIR

    directory = path / CTRANSLATE2_DIR
    if not (directory / "model.bin").is_file():
        raise ModelFileError(
            f"{path} has no {CTRANSLATE2_DIR}/model.bin: the ctranslate2 backend needs a bundle "
            "exported with --format ctranslate2 (seq2seq export --checkpoint CKPT --out "
            "DIR --format ctranslate2 --quantization int8)."
        )
    try:
        import ctranslate2
    except ImportError as error:  # installed, but it cannot load
        raise missing_extra("ctranslate2", CTRANSLATE2, ["ctranslate2"], str(error)) from None
    return ctranslate2.Translator(
        str(directory), device="cpu", intra_threads=torch.get_num_threads()
    )


def onnx_model(path: Path, trained: TrainedModel) -> StepwiseModel:
    """The bundle's ONNX graphs as a model search can step through; a clear error without them."""
    require_extra("onnx", ONNX)
    from seq2seq.inference.onnx_transformer import (
        DECODER_STEP,
        ENCODER,
        OnnxSeq2Seq,
        OnnxTransformer,
    )

    missing = [name for name in (ENCODER, DECODER_STEP) if not (path / name).is_file()]
    if missing:
        raise ModelFileError(
            f"{path} has no {' or '.join(missing)}: the onnx backend needs a bundle exported "
            "with --onnx (seq2seq export --checkpoint CKPT --out DIR --onnx)."
        )
    try:
        if isinstance(trained.model, Transformer):
            return OnnxTransformer(
                path, float(trained.decoding["max_len_a"]), int(trained.decoding["max_len_b"])
            )
        return OnnxSeq2Seq(path)
    except ImportError as error:  # installed, but it cannot load
        raise missing_extra("onnx", ONNX, ["onnxruntime"], str(error)) from None


def length_batches(src_ids: Sequence[Sequence[int]], batch_size: int) -> Iterator[list[int]]:
    """Indices of the non-empty sources in batches of similar length (shortest batch first, less
    padding), each batch longest first: the order packing puts them in (``pack_tokens``)."""
    order = sorted((i for i, ids in enumerate(src_ids) if ids), key=lambda i: len(src_ids[i]))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size][::-1]


def check_request(
    sentences: Sequence[str],
    beam_size: int,
    length_penalty: float,
    batch_size: int,
    n_best: int | None,
    coverage_penalty: float,
) -> None:
    """``translate_detailed``'s arguments, refused with a ValueError that names the one wrong."""
    if isinstance(sentences, str):
        raise ValueError(
            "translate takes a list of sentences, e.g. ['the dog sees a cat .']; got one "
            "string, which would be translated character by character."
        )
    if not is_count(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    check_beam(beam_size, 1 if n_best is None else n_best)
    check_length_penalty(length_penalty)
    check_coverage_penalty(coverage_penalty)


def _tokens(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    return [tokenizer.id_to_token(token_id) or "<?>" for token_id in ids]


@dataclass
class StreamReport:
    """What ``translate_stream`` did: lines read, and how many were unusable or cut."""

    lines: int = 0
    invalid: int = 0  # invalid UTF-8 or NUL bytes: answered with an empty line
    truncated: int = 0  # longer than the model's maximum source length
    unknown: Counter[str] = field(default_factory=Counter)  # source words read as <unk>


def translate_stream(
    translator: Translator,
    lines: Iterable[bytes],
    write: Callable[[str], object],
    beam_size: int = 1,
    length_penalty: float = 0.6,
    batch_size: int = 64,
    coverage_penalty: float = 0.0,
    chunk_size: int = 2048,
    n_best: int | None = None,
    scores: bool = False,
    links: Callable[[str, Translation], str] | None = None,
) -> StreamReport:
    """Translate raw input lines, writing exactly one output line per input line, in order; with
    ``n_best``, that many lines per input line in the Moses n-best format (``output_lines``),
    with ``scores`` the 1-best's score after it, with ``links`` what it makes of (the input line,
    a hypothesis with its tokens and attention) as the last field of each hypothesis' line.

    Lines are read ``chunk_size`` at a time, so memory does not grow with the input; inside a chunk
    they are sorted by length into batches. A line that is not UTF-8 or holds a NUL byte is logged
    and answered with an empty line.
    """
    report = StreamReport()
    chunk: list[str | None] = []  # None: an unusable line, answered with ""
    answered = [0]  # input lines answered so far: the next one's index (from 0)

    def flush() -> None:
        texts = [text for text in chunk if text is not None]
        report.unknown.update(unknown_words(translator.src_tokenizer, texts))
        translations = iter(
            translator.translate_detailed(
                texts, beam_size, length_penalty, batch_size, with_attention=links is not None,
                n_best=n_best, with_scores=scores or n_best is not None,
                coverage_penalty=coverage_penalty,
            )
        )  # fmt: skip
        for text in chunk:
            translation = next(translations) if text is not None else Translation("")
            report.truncated += translation.truncated
            fields = None
            if links is not None:
                ranked = translation.hypotheses or [translation]
                fields = ["" if text is None else links(text, each) for each in ranked]
            lines = output_lines(answered[0], translation, n_best, scores, fields)
            write("".join(f"{line}\n" for line in lines))
            answered[0] += 1
        chunk.clear()

    for raw in lines:
        report.lines += 1
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            log.warning(
                "input line %d: invalid UTF-8 at byte %d; writing an empty line for it",
                report.lines,
                error.start,
            )
            text = None
        if text is not None and "\0" in text:
            log.warning("input line %d: NUL byte; writing an empty line for it", report.lines)
            text = None
        report.invalid += text is None
        chunk.append(text)
        if len(chunk) >= chunk_size:
            flush()
    flush()
    if report.truncated:
        log.warning(
            "%d line(s) were longer than the model's maximum of %d source tokens and were cut",
            report.truncated,
            translator.max_src_len,
        )
    if report.unknown:
        log.warning("%s", unknown_words_message(report.unknown, translator.src_tokenizer))
    return report


def output_lines(
    index: int,
    translation: Translation,
    n_best: int | None,
    scores: bool,
    links: Sequence[str] | None = None,
) -> list[str]:
    """What ``translate_stream`` writes for input line ``index`` (from 0): the translation; with
    ``scores`` ``TEXT ||| SCORE``; with ``n_best`` the Moses n-best format, one
    ``INDEX ||| TEXT ||| SCORE`` line per hypothesis, best first; ``links`` (one per hypothesis)
    go right after each TEXT, where Marian writes them (``INDEX ||| TEXT ||| LINKS ||| SCORE``).
    SCORE is the beam's: the log-probability over GNMT's length penalty, plus the coverage
    penalty (``search``). A blank or unusable line has one empty hypothesis of score 0 (and no
    links)."""
    score = 0.0 if translation.score is None else translation.score
    ranked = (translation.n_best if n_best is not None else None) or [(translation.text, score)]
    lines = []
    for (text, value), link in zip(ranked, links or [""] * len(ranked), strict=True):
        shown = text if links is None else f"{text} ||| {link}"
        if n_best is not None:
            lines.append(f"{index} ||| {shown} ||| {value:.6f}")
        else:
            lines.append(f"{shown} ||| {value:.6f}" if scores else shown)
    return lines


def unknown_words_message(
    unknown: Counter[str], vocabulary: Tokenizer | None = None, shown: int = 5
) -> str:
    """One line on the source words the vocabulary lacks: how many, and the most frequent; with
    the source ``vocabulary``, those it has in lowercase, since a cased word is the commonest
    unknown word of a lowercased corpus."""
    examples = ", ".join(
        word if count == 1 else f"{word} (×{count})" for word, count in unknown.most_common(shown)
    )
    more = f" and {len(unknown) - shown} more" if len(unknown) > shown else ""
    total = sum(unknown.values())
    cased = [
        word for word, _ in unknown.most_common()
        if vocabulary is not None and word != word.lower()
        and vocabulary.token_to_id(word.lower()) is not None
    ][:shown]  # fmt: skip
    hint = (
        " The vocabulary is case-sensitive and has "
        f"{', '.join(repr(w.lower()) for w in cased)} in lowercase: lowercase the input if the "
        "training data was lowercased."
        if cased
        else ""
    )
    return (
        f"{total} source word(s) are not in the model's vocabulary and were read as <unk>: "
        f"{examples}{more}. The translations are what the model makes of <unk> there.{hint}"
    )
