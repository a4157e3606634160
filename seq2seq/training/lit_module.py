"""LightningModule: loss, optimizer and schedule, validation with corpus metrics (greedy, or
beam search with ``decoding.beam_size`` or a coverage penalty).

Shape legend: B batch, S source length, T target length, V target vocabulary.

Validation (and testing) scores every sentence on its own (``score_batch``) and computes corpus
BLEU, chrF, loss, attention entropy and AER once from the scores of all DDP ranks
(``seq2seq.analysis.metrics``), so they equal what one process gets on the same split.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.trainer.states import TrainerFn
from tokenizers import Tokenizer
from torch import Tensor

from seq2seq.analysis.alignment import (
    AlignmentCounts,
    GoldAlignment,
    argmax_links,
    count_links,
)
from seq2seq.analysis.metrics import (
    SentenceScore,
    attention_totals,
    corpus_metrics,
    merge_sentence_scores,
    write_test_records,
)
from seq2seq.atomic import write_atomic
from seq2seq.data.batching import Batch
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, decode
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from seq2seq.models.model import EncoderDecoder
from seq2seq.models.transformer import Transformer
from seq2seq.search import Hypotheses, best_search
from seq2seq.training.cuda_graphs import DecoderGraphs, check_cuda_graphs, materialize_grads
from seq2seq.training.distributed import gather_objects
from seq2seq.training.loss import (
    alignment_loss,
    coverage_loss,
    decoder_loss,
    gold_attention,
    loss_with_weights,
    teacher_forced_loss,
)

log = logging.getLogger(__name__)

# The checkpoint key of the fit's training totals (target tokens, seconds), for resumed summaries.
THROUGHPUT_KEY = "seq2seq_throughput"

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


def attention_entropy(weights: Tensor, tgt_lens: Tensor) -> Tensor:
    """Summed entropy (nats) of the attention rows of each sentence's real target steps.

    weights (B, T, S), tgt_lens (B,) -> (B,). Padded keys have weight 0 and add 0·log 0 = 0, so a
    sparse row's entropy is over its support; a row is renormalised first (local-p's rows sum to
    less than 1).
    """
    weights = weights.float()
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    entropy = -torch.special.xlogy(weights, weights).sum(dim=-1)  # (B, T)
    steps = torch.arange(weights.shape[1], device=weights.device)  # (T,)
    return (entropy * (steps[None, :] < tgt_lens[:, None])).sum(dim=-1)  # (B,)


def logs_training_loss(trainer: pl.Trainer) -> bool:
    """Whether to log train/loss for the training batch that just ended: where Lightning writes
    the step's logged values to the loggers (every ``trainer.log_every_n_steps`` optimizer steps,
    when training stops, and in a fast_dev_run), and at the last batch of an epoch, so that the
    progress bar and the run's final metrics have the latest loss. The loggers get what logging
    at every step gave them; the progress bar's loss changes at those steps only.

    Asked at the end of a batch the optimizer stepped at (``on_train_batch_end``), after every
    callback's: a stop that a callback decides there (``max_time``'s Timer) is known only then."""
    # Lightning's own test (its logger connector's should_update_logs) from public attributes:
    # the optimizer steps taken, this one included, are a multiple of log_every_n_steps, or
    # training is stopping. fast_dev_run is set on the trainer without being declared on the class.
    every = int(getattr(trainer, "log_every_n_steps", 50))  # set at init, not declared either
    if getattr(trainer, "fast_dev_run", False) or trainer.should_stop:
        return True
    step = trainer.global_step
    if every > 0 and step > 0 and step % every == 0:
        return True
    return trainer.is_last_batch or 0 < trainer.max_steps <= step


@dataclass(frozen=True)
class StepLoss:
    """A training batch's loss terms (detached), kept from ``training_step`` until its end."""

    loss_sum: Tensor
    num_tokens: Tensor
    extras: dict[str, Tensor]
    batch_size: int


def attached_trainer(module: pl.LightningModule) -> pl.Trainer | None:
    """The module's Trainer, or None outside one (``module.trainer`` raises there)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def clip_grad_norm_on_cpu(grads: list[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` of CPU gradients (their joint 2-norm, and each scaled
    by max_norm / (norm + 1e-6) where that is below 1), in place; returns the norm.

    Torch multiplies every gradient by the clamped factor on every step, so that a GPU never
    waits for the norm; on the CPU the norm is at hand, and the multiply is skipped on the many
    steps where it is 1, with the norms taken in one ``_foreach_norm`` instead of one call per
    parameter.
    """
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    factor = max_norm / (float(norm) + 1e-6)
    if factor < 1.0:  # false for a NaN norm, which torch's multiply would spread to every grad
        torch._foreach_mul_(grads, factor)
    return norm


class LitSeq2Seq(pl.LightningModule):
    """Trains an encoder–decoder (``Seq2Seq``, ``Transformer``) with teacher forcing and
    validates it by greedy decoding (or beam search: ``decoding.beam_size``, a coverage penalty).

    ``model_config`` is the resolved constructor config of ``model``; it travels in every checkpoint
    together with both tokenizers, so a checkpoint alone rebuilds the model
    (``seq2seq.inference.bundle.load``, ``seq2seq.pipeline.load_checkpoint``).
    """

    def __init__(
        self,
        model: EncoderDecoder,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        model_config: dict[str, Any],
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        grad_clip: float | None = 1.0,
        max_len_a: float = 2.0,
        max_len_b: int = 10,
        max_src_len: int = 256,
        beam_size: int = 1,
        length_penalty: float = 0.6,
        coverage_penalty: float = 0.0,
        bleu_tokenize: str = "13a",
        cuda_graphs: bool = False,
        label_smoothing: float = 0.0,
        alignment_loss_weight: float = 0.0,
        coverage_loss_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.model_config = model_config
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.grad_clip = grad_clip
        self.max_len_a = max_len_a
        self.max_len_b = max_len_b
        self.max_src_len = max_src_len
        # The search of validation and test (decoding.*): greedy unless a beam or GNMT's
        # coverage penalty (which needs finished hypotheses to rank) is asked for.
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.coverage_penalty = coverage_penalty
        self.bleu_tokenize = bleu_tokenize
        self.label_smoothing = label_smoothing
        # λ of guided alignment: the training loss adds λ times the cross-entropy between the
        # attention and the gold alignment (seq2seq.training.loss.alignment_loss); 0: off.
        self.alignment_loss_weight = alignment_loss_weight
        # λ of the coverage loss (seq2seq.training.loss.coverage_loss); 0: off.
        self.coverage_loss_weight = coverage_loss_weight
        # Training replays the decoder from CUDA graphs (seq2seq.training.cuda_graphs); a cache of
        # recordings, not a submodule: the parameters stay the model's.
        self.decoder_graphs = (
            DecoderGraphs(model.decoder, label_smoothing=label_smoothing) if cuda_graphs else None
        )
        # Sentence scores of the running evaluation, reset when each one starts.
        self._eval_scores: list[SentenceScore] = []
        # Training throughput since the last validation: target tokens, and seconds spent
        # training (the clock stops while validating).
        self._train_tokens = torch.zeros((), dtype=torch.long)
        self._train_seconds = 0.0
        self._train_clock: float | None = None
        # The running training batch's loss, logged (or not) when the batch ends, and whether
        # the optimizer stepped in it.
        self._step_loss: StepLoss | None = None
        self._stepped = False
        # The whole fit's totals over all ranks, for the run summary. Checkpoints carry them, so
        # a resumed run's summary counts the training done before it was stopped too.
        self.total_train_tokens = 0
        self.total_train_seconds = 0.0

    def extra_losses(self) -> dict[str, float]:
        """The training loss's terms on the attention weights that are on, with their λ:
        ``alignment`` (guided alignment) and ``coverage`` (the coverage loss)."""
        weights = {"alignment": self.alignment_loss_weight, "coverage": self.coverage_loss_weight}
        return {name: weight for name, weight in weights.items() if weight > 0}

    def loss(self, batch: Batch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Summed token cross-entropy (in float32), the number of target tokens and, in training,
        each of ``extra_losses`` summed over the batch (train/NAME_loss)."""
        extras = self.extra_losses() if self.training else {}
        if extras:
            # The weights are needed: the pass that computes them (the kernels' fused training
            # loops and CUDA graphs compute none, so they stand aside: on_fit_start says so).
            token_loss, weights = loss_with_weights(
                self.model, batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out,
                label_smoothing=self.label_smoothing,
            )  # fmt: skip
            terms = {}
            if "alignment" in extras:
                gold = gold_attention(
                    self.training_links(batch), batch.src.shape[1], batch.tgt_in.shape[1]
                ).to(batch.src.device)  # (B, T, S)
                terms["alignment"] = alignment_loss(weights, gold)
            if "coverage" in extras:
                terms["coverage"] = coverage_loss(weights, batch.tgt_out != PAD_ID)
            return token_loss, batch.tgt_lens.sum(), terms
        decode: Callable[..., Tensor] = functools.partial(
            decoder_loss, self.model.decoder, label_smoothing=self.label_smoothing
        )
        if self.decoder_graphs is not None and self.training:
            decode = self.decoder_graphs
        loss_sum = teacher_forced_loss(
            self.model, decode, batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out
        )
        return loss_sum, batch.tgt_lens.sum(), {}

    def training_links(self, batch: Batch) -> list[Sequence[tuple[int, int]] | None]:
        """The gold word links of ``batch``'s training sentences (checked to exist at the start
        of training, ``check_extra_losses``)."""
        gold = self._gold_alignments("train")
        assert gold is not None  # check_extra_losses refused training without them
        return [gold[index] for index in batch.indices.tolist()]

    def check_extra_losses(self) -> None:
        """Guided alignment needs the training split's gold alignments, over the model's tokens;
        say once that the losses on the weights put the weight-free fast paths aside."""
        extras = self.extra_losses()
        if not extras:
            return
        if "alignment" in extras and self._gold_alignments("train") is None:
            raise ConfigError(
                f"optim.alignment_loss_weight={self.alignment_loss_weight} needs gold word "
                "alignments of the training sentences, over whitespace tokens: the toy tasks "
                "(data=toy, reverse, copy, sort) have them, and file corpora with data.align and "
                "data.tokenizer=whitespace. Set optim.alignment_loss_weight=0 for this data."
            )
        log.info(
            "%s: the training pass returns the attention weights too (the C kernels' training "
            "loops give them from their pass over the real tokens; CUDA graphs, which compute "
            "none, stand aside for it).",
            " ".join(f"optim.{name}_loss_weight={weight}" for name, weight in extras.items()),
        )

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        if self._train_clock is None:  # training starts, resumes, or goes on after validation
            self._train_clock = time.perf_counter()
        loss_sum, num_tokens, extras = self.loss(batch)
        self._train_tokens += num_tokens.detach()
        self._step_loss = StepLoss(
            loss_sum.detach(),
            num_tokens.detach(),
            {name: term.detach() for name, term in extras.items()},
            len(batch.src_lens),
        )
        weights = self.extra_losses()
        for name, term in extras.items():
            loss_sum = loss_sum + weights[name] * term
        return loss_sum / num_tokens

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._stepped = True

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step_loss, self._step_loss = self._step_loss, None
        stepped, self._stepped = self._stepped, False
        # Within gradient accumulation global_step stands still: a micro-batch that did not step
        # would log (and reduce) a loss that Lightning never writes.
        if step_loss is not None and stepped and logs_training_loss(self.trainer):
            self._log_training_loss(step_loss)

    def _log_training_loss(self, step: StepLoss) -> None:
        """train/loss, and each extra term's, over all ranks and per target token (each rank's
        gradient still uses its own batch mean; DDP averages those). Not at every step: each
        self.log deep-copies Lightning's metadata for the value (a visible share of a small step:
        docs/performance.md), and the reduce is a collective under DDP."""
        extras = {f"{name}_loss": term for name, term in step.extras.items()}
        terms = {"loss": step.loss_sum} | extras
        for name, term in terms.items():
            # The extras: the gold attention's cross-entropy, or the attention given again to
            # words already attended.
            totals = torch.stack([term, step.num_tokens.to(term.dtype)])  # (2,)
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
            loss = totals[0] / totals[1]
            self.log(f"train/{name}", loss, prog_bar=name == "loss", batch_size=step.batch_size)

    def on_fit_start(self) -> None:
        self._train_tokens = torch.zeros((), dtype=torch.long, device=self.device)
        self.check_extra_losses()
        if self.decoder_graphs is not None:
            trainer = self.trainer
            check_cuda_graphs(self.device, trainer.world_size, str(trainer.precision))
            materialize_grads(self)

    def on_train_end(self) -> None:
        # The training after the last validation (a run stopped by max_time mid-epoch) counts too.
        self._fold_train_interval()

    def on_fit_end(self) -> None:
        if self.decoder_graphs is not None:
            log.info("training: %s", self.decoder_graphs.summary())

    def optimizer_zero_grad(
        self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer
    ) -> None:
        # With CUDA graphs the gradients keep their own buffers (DecoderGraphs), zeroed in place.
        optimizer.zero_grad(set_to_none=self.decoder_graphs is None)

    def on_validation_epoch_start(self) -> None:
        self._stop_train_clock()
        self._eval_scores = []

    def on_test_epoch_start(self) -> None:
        self._eval_scores = []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_scores.extend(self.score_batch(batch, "val"))

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._eval_scores.extend(self.score_batch(batch, "test"))

    def on_validation_epoch_end(self) -> None:
        metrics = self._corpus_metrics("val")
        if not self.trainer.sanity_checking:
            metrics.update(self._training_rates())
        self._log_pooled(metrics)

    def on_test_epoch_end(self) -> None:
        self._log_pooled(self._corpus_metrics("test"))

    def _log_pooled(self, metrics: dict[str, float]) -> None:
        """Log metrics that every rank computed from the same pooled scores. They are equal on
        all ranks already; the max over ranks keeps them exactly so (a mean of equal float32
        values need not be) and tells Lightning they are synchronized."""
        for name, value in metrics.items():
            prog_bar = name in ("val/loss", "val/bleu")
            self.log(name, value, prog_bar=prog_bar, sync_dist=True, reduce_fx="max")

    def score_batch(self, batch: Batch, split: str) -> list[SentenceScore]:
        """Teacher-forced loss, attention entropy and alignment, and the translation
        (``search``), of every sentence in ``batch`` (of the dataset ``split``)."""
        logits, weights = self.model(batch.src, batch.src_lens, batch.tgt_in)  # (B,T,V), (B,T,S)
        assert weights is not None  # asked for by default
        token_losses = F.cross_entropy(
            logits.float().flatten(0, 1),  # (B*T, V)
            batch.tgt_out.flatten(),  # (B*T,)
            ignore_index=PAD_ID,
            reduction="none",
        ).view_as(batch.tgt_out)  # (B, T)
        loss_sums = token_losses.sum(dim=1).tolist()
        entropy_sums = attention_entropy(weights, batch.tgt_lens).tolist()
        decoded = self.search(batch)
        hypotheses = self.detokenize(decoded)
        over, under = attention_totals(decoded.attention, batch.src_lens)
        gold = self._gold_alignments(split)
        heads = self._head_weights(batch) if gold is not None else None  # (B, L, h, T, S)
        src_lens, tgt_lens = batch.src_lens.tolist(), batch.tgt_lens.tolist()
        scores = []
        for row, index in enumerate(batch.indices.tolist()):
            counts = None
            head_counts: tuple[tuple[str, AlignmentCounts], ...] = ()
            links = gold[index] if gold is not None else None
            if links is not None:
                # The attention of the step that predicts target word j is row j (EOS excluded).
                reference = GoldAlignment.from_links(links)
                predicted = argmax_links(weights[row], src_lens[row], tgt_lens[row] - 1)
                counts = count_links(predicted, reference)
                if heads is not None:
                    head_counts = tuple(
                        (f"L{layer + 1}H{head + 1}", count_links(argmax_links(
                            heads[row, layer, head], src_lens[row], tgt_lens[row] - 1
                        ), reference))
                        for layer in range(heads.shape[1])
                        for head in range(heads.shape[2])
                    )  # fmt: skip
            scores.append(
                SentenceScore(
                    index=index,
                    hypothesis=hypotheses[row],
                    reference=batch.tgt_text[row],
                    loss_sum=loss_sums[row],
                    tokens=tgt_lens[row],
                    entropy_sum=entropy_sums[row],
                    alignment=counts,
                    head_alignments=head_counts,
                    source_tokens=src_lens[row],
                    over_attended=over[row],
                    under_attended=under[row],
                )
            )
        return scores

    def _head_weights(self, batch: Batch) -> Tensor | None:
        """A Transformer's cross-attention of every layer and head, (B, L, h, T, S), for AER per
        head; None for other models (their one map is ``forward``'s)."""
        if not isinstance(self.model, Transformer):
            return None
        source, _ = self.model.encode(batch.src, batch.src_lens)
        return self.model.decoder.cross_attention_weights(batch.tgt_in, source)

    def _gold_alignments(self, split: str) -> Sequence[Sequence[tuple[int, int]] | None] | None:
        """Gold word alignments of ``split`` (the toy tasks have them) when tokens are words."""
        datamodule = getattr(attached_trainer(self), "datamodule", None)
        if not isinstance(datamodule, Seq2SeqDataModule):
            return None
        # Alignments link words; with a subword tokenizer token positions are not word positions.
        if datamodule.tokenizer_spec.level != "whitespace":
            return None
        return datamodule.alignments.get(split)

    def _corpus_metrics(self, split: str) -> dict[str, float]:
        """Every rank's sentence scores pooled, deduplicated and put in dataset order; the corpus
        metrics computed once from them (the same on every rank)."""
        scores = merge_sentence_scores(gather_objects(self._eval_scores))
        self._eval_scores = []
        run_dir = Path(self.trainer.default_root_dir)
        if split == "val" and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self._write_hypotheses(
                [score.hypothesis for score in scores], run_dir / "val_hypotheses.txt"
            )
        if split == "test" and self.trainer.is_global_zero:
            write_test_records(scores, run_dir)
        metrics = corpus_metrics(scores, self.bleu_tokenize)
        return {f"{split}/{name}": value for name, value in metrics.items()}

    def _stop_train_clock(self) -> None:
        if self._train_clock is not None:
            self._train_seconds += time.perf_counter() - self._train_clock
            self._train_clock = None

    def _interval_over_ranks(self) -> tuple[int, float]:
        """This training interval so far (a running clock included): its target tokens over all
        ranks and the slowest rank's seconds. A collective under DDP, like every hook that calls
        it (Lightning saves on every rank)."""
        running = time.perf_counter() - self._train_clock if self._train_clock is not None else 0.0
        gathered = gather_objects((int(self._train_tokens), self._train_seconds + running))
        return sum(count for count, _ in gathered), max(spent for _, spent in gathered)

    def _train_totals(self) -> tuple[int, float]:
        """The fit's target tokens and training seconds so far, over all ranks: the totals up to
        the last validation and the interval since."""
        tokens, seconds = self._interval_over_ranks()
        return self.total_train_tokens + tokens, self.total_train_seconds + seconds

    def _fold_train_interval(self) -> tuple[int, float]:
        """End the training interval: add it to the fit's totals, start the next, and return the
        interval's target tokens (all ranks) and seconds (the slowest rank's)."""
        self._stop_train_clock()
        tokens, seconds = self._interval_over_ranks()
        self._train_tokens = torch.zeros((), dtype=torch.long, device=self.device)
        self._train_seconds = 0.0
        self.total_train_tokens += tokens
        self.total_train_seconds += seconds
        return tokens, seconds

    def _training_rates(self) -> dict[str, float]:
        """Learning rate, and training throughput (target tokens/s of all ranks together) since
        the previous validation."""
        tokens, seconds = self._fold_train_interval()
        rates = {"train/lr": float(self.trainer.optimizers[0].param_groups[0]["lr"])}
        if seconds > 0:
            rates["train/tokens_per_s"] = tokens / seconds
        return rates

    @staticmethod
    def _write_hypotheses(hypotheses: list[str], path: Path) -> None:
        """This validation's translations in dataset order, one per line (atomically replaced),
        so that ``sacrebleu REF -i val_hypotheses.txt`` can check ``val/bleu``."""
        text = "".join(f"{hypothesis}\n" for hypothesis in hypotheses)
        write_atomic(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))

    def translate_batch(self, batch: Batch) -> list[str]:
        """Translations of a batch by validation's search, detokenized."""
        return self.detokenize(self.search(batch))

    def detokenize(self, hypotheses: Hypotheses) -> list[str]:
        """The text of each decoded output."""
        return [decode(self.tgt_tokenizer, ids) for ids in hypotheses.tokens.tolist()]

    def search(self, batch: Batch) -> Hypotheses:
        """Validation's and test's decoding of a batch: greedy, or beam search (the best
        hypothesis) with ``decoding.beam_size`` > 1 or a coverage penalty."""
        return best_search(
            self.model,
            batch.src,
            batch.src_lens,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_id=PAD_ID,
            beam_size=self.beam_size,
            length_penalty=self.length_penalty,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
            coverage_penalty_weight=self.coverage_penalty,
        )

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise RuntimeError("LitSeq2Seq was built without an optimizer: it can only evaluate.")
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        # Epoch-wise (torch's, ReduceLROnPlateau on val/bleu), or as the schedule says
        # (InverseSquareRootSchedule: every update).
        config = {"scheduler": scheduler, "interval": getattr(scheduler, "interval", "epoch")}
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            config["monitor"] = "val/bleu"
            # At the epochs that validate: every one, or every N-th with
            # trainer.check_val_every_n_epoch=N (Lightning stops at an epoch without val/bleu).
            config["frequency"] = self.trainer.check_val_every_n_epoch or 1
        return {"optimizer": optimizer, "lr_scheduler": config}

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | int | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # The module owns clipping so that it travels with the model config, not the trainer's.
        clip = self.grad_clip if gradient_clip_val is None else gradient_clip_val
        if not clip:
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads and all(grad.device.type == "cpu" for grad in grads):
            clip_grad_norm_on_cpu(grads, float(clip))
        else:
            self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain strings and dicts only, so the checkpoint loads with torch.load(weights_only=True).
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,
            "model_config": self.model_config,
            "src_tokenizer": self.src_tokenizer.to_str(),
            "tgt_tokenizer": self.tgt_tokenizer.to_str(),
            "decoding": {
                "max_len_a": self.max_len_a,
                "max_len_b": self.max_len_b,
                "max_src_len": self.max_src_len,
                # Validation's search, so that the checkpoint alone reproduces val/bleu
                # (translate.py takes its own --beam-size and penalties).
                "beam_size": self.beam_size,
                "length_penalty": self.length_penalty,
                "coverage_penalty": self.coverage_penalty,
            },
            "metrics": self._metrics_for_checkpoint(),
        }
        tokens, seconds = self._train_totals()
        checkpoint[THROUGHPUT_KEY] = {"target_tokens": tokens, "seconds": seconds}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Resuming: the training before the checkpoint, counted once (what a killed run trained
        # after it is trained again, and counted then). Checkpoints older than the key start at 0.
        # Only when fitting: testing the best checkpoint after training loads it too.
        trainer = attached_trainer(self)
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return
        totals = checkpoint.get(THROUGHPUT_KEY, {})
        self.total_train_tokens = int(totals.get("target_tokens", 0))
        self.total_train_seconds = float(totals.get("seconds", 0.0))

    def _metrics_for_checkpoint(self) -> dict[str, float]:
        """The latest logged metrics, and the best val BLEU so far, as plain floats."""
        trainer = attached_trainer(self)
        if trainer is None:
            return {}
        metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if value.numel() == 1
        }
        best = trainer.checkpoint_callback
        if best is not None and getattr(best, "best_model_score", None) is not None:
            metrics["best/val_bleu"] = float(best.best_model_score)  # type: ignore[attr-defined]
        return metrics
