"""LightningModule: loss, optimizer and schedule, greedy validation with corpus BLEU.

Shape legend: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor

from seq2seq.atomic import write_atomic
from seq2seq.bundle import CHECKPOINT_FORMAT, CHECKPOINT_KEY
from seq2seq.data.batching import Batch
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, decode
from seq2seq.model import Seq2Seq
from seq2seq.search import greedy_search

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class LitSeq2Seq(pl.LightningModule):
    """Trains a ``Seq2Seq`` with teacher forcing and validates it by greedy decoding.

    ``model_config`` is the resolved constructor config of ``model``; it travels in every checkpoint
    together with both tokenizers, so a checkpoint alone rebuilds the model
    (``seq2seq.bundle.load``, ``seq2seq.pipeline.load_checkpoint``).
    """

    def __init__(
        self,
        model: Seq2Seq,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        model_config: dict[str, Any],
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        grad_clip: float | None = 1.0,
        max_len_a: float = 2.0,
        max_len_b: int = 10,
        max_src_len: int = 256,
        bleu_tokenize: str = "13a",
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
        self.bleu_tokenize = bleu_tokenize
        # Per-validation accumulators, reset at the start of every validation run.
        self._val_loss_sum = torch.zeros(())
        self._val_tokens = torch.zeros(())
        self._val_hypotheses: list[tuple[int, str]] = []  # (dataset index, translation)
        self._val_references: list[str] = []

    def loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Summed token cross-entropy (in float32) and the number of target tokens."""
        # The loss needs no attention weights, which lets dot-product attention use fused SDPA.
        logits, _ = self.model(batch.src, batch.src_lens, batch.tgt_in, need_weights=False)
        loss_sum = F.cross_entropy(
            logits.float().flatten(0, 1),  # (B*T, V)
            batch.tgt_out.flatten(),  # (B*T,)
            ignore_index=PAD_ID,
            reduction="sum",
        )
        return loss_sum, batch.tgt_lens.sum()

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss_sum, num_tokens = self.loss(batch)
        loss = loss_sum / num_tokens
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch.src_lens))
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_loss_sum = torch.zeros((), device=self.device)
        self._val_tokens = torch.zeros((), device=self.device)
        self._val_hypotheses, self._val_references = [], []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss_sum, num_tokens = self.loss(batch)
        self._val_loss_sum += loss_sum.detach()
        self._val_tokens += num_tokens
        hypotheses = self.translate_batch(batch)
        self._val_hypotheses.extend(zip(batch.indices.tolist(), hypotheses, strict=True))
        self._val_references.extend(batch.tgt_text)

    def on_validation_epoch_end(self) -> None:
        hypotheses = [hypothesis for _, hypothesis in self._val_hypotheses]
        bleu = sacrebleu.corpus_bleu(
            hypotheses, [self._val_references], tokenize=self.bleu_tokenize
        )
        if not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self._write_hypotheses(Path(self.trainer.default_root_dir) / "val_hypotheses.txt")
        # Token-weighted mean, not a mean of batch means.
        val_loss = self._val_loss_sum / self._val_tokens.clamp(min=1)
        self.log("val/loss", val_loss, prog_bar=True)
        self.log("val/bleu", bleu.score, prog_bar=True)

    def _write_hypotheses(self, path: Path) -> None:
        """This validation's translations in dataset order, one per line (atomically replaced),
        so that ``sacrebleu REF -i val_hypotheses.txt`` can check ``val/bleu``."""
        ordered = sorted(self._val_hypotheses)  # validation batches come sorted by length
        text = "".join(f"{hypothesis}\n" for _, hypothesis in ordered)
        write_atomic(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))

    def translate_batch(self, batch: Batch) -> list[str]:
        """Greedy translations of a batch, detokenized."""
        hypotheses = greedy_search(
            self.model,
            batch.src,
            batch.src_lens,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_id=PAD_ID,
            max_len_a=self.max_len_a,
            max_len_b=self.max_len_b,
        )
        return [decode(self.tgt_tokenizer, ids) for ids in hypotheses.tokens.tolist()]

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise RuntimeError("LitSeq2Seq was built without an optimizer: it can only evaluate.")
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val/bleu", "interval": "epoch"},
        }

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | int | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # The module owns clipping so that it travels with the model config, not the trainer's.
        clip = self.grad_clip if gradient_clip_val is None else gradient_clip_val
        if clip:
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
            },
            "metrics": self._metrics_for_checkpoint(),
        }

    def _metrics_for_checkpoint(self) -> dict[str, float]:
        """The latest logged metrics, and the best val BLEU so far, as plain floats."""
        if self._trainer is None:
            return {}
        metrics = {
            name: float(value)
            for name, value in self.trainer.callback_metrics.items()
            if value.numel() == 1
        }
        best = self.trainer.checkpoint_callback
        if best is not None and getattr(best, "best_model_score", None) is not None:
            metrics["best/val_bleu"] = float(best.best_model_score)  # type: ignore[attr-defined]
        return metrics
