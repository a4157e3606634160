"""Callbacks that show what the model does at each validation: sample translations and attention
maps of a fixed set of validation sentences, in the run directory and in the active loggers."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import matplotlib.image
import pytorch_lightning as pl
from pytorch_lightning.loggers import TensorBoardLogger, WandbLogger

from seq2seq.analysis.alignment import GoldAlignment, exact_zeros
from seq2seq.analysis.plotting import plot_attention, plot_attention_grid
from seq2seq.atomic import write_atomic
from seq2seq.explorer import ExplorerModel, explorer_data, write_page
from seq2seq.explorer.data import scoring_name
from seq2seq.inference.bundle import TrainedModel
from seq2seq.inference.translator import Translation, Translator
from seq2seq.training.lit_module import LitSeq2Seq

log = logging.getLogger(__name__)

ATTENTION_DIR = "attention"  # RUN/attention/step-000313.json and step-000313-<index>.png


def attention_record_path(run_dir: Path, step: int) -> Path:
    return run_dir / ATTENTION_DIR / f"step-{step:06d}.json"


class ValidationExamples(pl.Callback):
    """After each validation, translate ``num_samples`` fixed validation sentences (spread evenly
    over the split) and record them: a table of source, reference and hypothesis, and the
    attention heatmaps of the first ``num_maps``.

    Written to ``RUN/attention/step-NNNNNN.json`` (tokens and weights, for ``compare_runs.py``)
    and ``step-NNNNNN-<index>.png``; logged as a W&B table and images, or TensorBoard text and
    images. Rank zero only.
    """

    def __init__(self, run_dir: str | Path, num_samples: int = 8, num_maps: int = 4) -> None:
        self.run_dir = Path(run_dir)
        self.num_samples = num_samples
        self.num_maps = num_maps

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or self.num_samples < 1:
            return
        assert isinstance(pl_module, LitSeq2Seq)
        indices = sample_indices(trainer, self.num_samples)
        dataset = trainer.datamodule.datasets["val"]  # type: ignore[attr-defined]
        examples = [dataset.examples[index] for index in indices]
        translator = current_translator(pl_module)
        translations = translator.translate_detailed(
            [example.src_text for example in examples], with_attention=True
        )
        step = trainer.global_step
        out_dir = self.run_dir / ATTENTION_DIR
        out_dir.mkdir(parents=True, exist_ok=True)
        records = [
            _record(index, example.src_text, example.tgt_text, translation)
            for index, example, translation in zip(indices, examples, translations, strict=True)
        ]
        record_path = attention_record_path(self.run_dir, step)
        text = json.dumps({"step": step, "epoch": trainer.current_epoch, "sentences": records})
        write_atomic(record_path, lambda path: path.write_text(text, encoding="utf-8"))
        images = []
        for record, translation in list(zip(records, translations, strict=True))[: self.num_maps]:
            if translation.attention is None or not translation.tgt_tokens:
                continue  # an empty translation has no attention to draw
            assert translation.src_tokens is not None
            image = out_dir / f"step-{step:06d}-{record['index']}.png"
            plot_attention(
                translation.src_tokens,
                translation.tgt_tokens,
                translation.attention,
                image,
                title=f"val line {record['index'] + 1}, step {step}",
            )
            images.append((record, image))
            # A Transformer's cross-attention, every layer and head, for its first sentence.
            heads = None if len(images) > 1 else translator.attention_heads(
                record["source"], translation.tgt_tokens
            )  # fmt: skip
            if heads is not None:
                grid = out_dir / f"step-{step:06d}-{record['index']}-heads.png"
                plot_attention_grid(
                    translation.src_tokens, translation.tgt_tokens, heads, grid,
                    title=f"val line {record['index'] + 1}, step {step}: layers x heads",
                )  # fmt: skip
                images.append(({**record, "index": f"{record['index']}-heads"}, grid))
        self._log(trainer, step, records, images)

    def _log(
        self,
        trainer: pl.Trainer,
        step: int,
        records: list[dict[str, Any]],
        images: list[tuple[dict[str, Any], Path]],
    ) -> None:
        columns = ["index", "source", "reference", "hypothesis"]
        rows = [[record[column] for column in columns] for record in records]
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_table(key="val/samples", columns=columns, data=rows, step=step)
                # One key per sentence, as in TensorBoard: W&B lays a list of images out as one
                # grid of equal cells, and maps of sentences of other lengths have other sizes.
                for record, path in images:
                    logger.log_image(
                        key=f"val/attention/{record['index']}",
                        images=[str(path)],
                        step=step,
                        caption=[record["hypothesis"]],
                    )
            elif isinstance(logger, TensorBoardLogger):
                header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
                table = "".join("| " + " | ".join(map(str, row)) + " |\n" for row in rows)
                logger.experiment.add_text("val/samples", header + table, step)
                for record, path in images:
                    pixels = matplotlib.image.imread(str(path))[..., :3]  # (H, W, 3) RGB
                    logger.experiment.add_image(
                        f"val/attention/{record['index']}", pixels, step, dataformats="HWC"
                    )


def sample_indices(trainer: pl.Trainer, count: int) -> list[int]:
    """``count`` validation sentences spread evenly over the split: the same at every validation."""
    dataset = trainer.datamodule.datasets["val"]  # type: ignore[attr-defined]
    stride = max(1, len(dataset) // count)
    return list(range(0, len(dataset), stride))[:count]


def current_translator(pl_module: LitSeq2Seq) -> Translator:
    """The model being trained, as it is now, behind the Translator's interface."""
    return Translator(
        TrainedModel(
            pl_module.model,
            pl_module.src_tokenizer,
            pl_module.tgt_tokenizer,
            pl_module.model_config,
            decoding={
                "max_len_a": pl_module.max_len_a,
                "max_len_b": pl_module.max_len_b,
                "max_src_len": pl_module.max_src_len,
            },
        ),
        device=pl_module.device,
    )


EXPLORER_PAGE = "explorer.html"  # RUN/attention/explorer.html


class ExplorerPage(pl.Callback):
    """After each validation, the attention explorer page (``seq2seq.explorer``) of the same fixed
    validation sentences as ``ValidationExamples``, with their gold links where the data has
    them: ``RUN/attention/explorer.html``, rewritten every time with a checkpoint slider over the
    validations so far (each kept as ``RUN/attention/explorer-step-NNNNNN.json``, so a resumed run
    keeps its history), and logged to W&B as HTML. Earlier validations keep their maps without
    the Transformer's per-head and self-attention ones, and at most ``max_snapshots`` of them are
    shown, so that the page stays light. Rank zero only."""

    def __init__(self, run_dir: str | Path, num_samples: int = 8, max_snapshots: int = 40) -> None:
        self.run_dir = Path(run_dir)
        self.num_samples = num_samples
        self.max_snapshots = max_snapshots

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or self.num_samples < 1:
            return
        assert isinstance(pl_module, LitSeq2Seq)
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        indices = sample_indices(trainer, self.num_samples)
        examples = [datamodule.datasets["val"].examples[index] for index in indices]
        links = datamodule.alignments.get("val")
        gold = None
        if links is not None and all(links[index] is not None for index in indices):
            gold = [GoldAlignment.from_links(links[index]) for index in indices]
        step = trainer.global_step
        scoring = scoring_name(pl_module.model_config.get("attention", {}))
        data = explorer_data(
            [ExplorerModel(scoring, current_translator(pl_module))],
            [example.src_text for example in examples],
            [example.tgt_text for example in examples],
            gold,
            title=f"{self.run_dir.name}: validation sentences",
        )
        data["checkpoint"] = f"step {step}, epoch {trainer.current_epoch}"
        directory = self.run_dir / ATTENTION_DIR
        directory.mkdir(parents=True, exist_ok=True)
        snapshot = directory / f"explorer-step-{step:06d}.json"
        text = json.dumps(data)
        write_atomic(snapshot, lambda path: path.write_text(text, encoding="utf-8"))
        page = write_training_page(directory, data, snapshot, self.max_snapshots)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                # inject=False: no stylesheet from W&B's servers; the page is whole as it is.
                html = wandb.Html(page.read_text(encoding="utf-8"), inject=False)
                logger.experiment.log({"val/explorer": html}, step=step)


# What an earlier validation on the slider leaves out: per-layer, per-head cross-attention and
# self-attention are most of a Transformer's snapshot; the page says they are the latest's only.
PER_HEAD = ("heads", "layer_means", "encoder_self", "decoder_self", "decoder_inputs")


def write_training_page(
    directory: Path, data: dict[str, Any], snapshot: Path, max_snapshots: int = 40
) -> Path:
    """``directory``'s explorer page: ``data`` (the validation saved as ``snapshot``) with the
    ``max_snapshots`` validations before it on the slider, each without its per-head maps."""
    earlier = sorted(directory.glob("explorer-step-*.json"))
    earlier = [path for path in earlier if path < snapshot][-max_snapshots:]
    data["checkpoints"] = [without_heads(json.loads(path.read_text())) for path in earlier]
    return write_page(data, directory / EXPLORER_PAGE)


def without_heads(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the per-layer, per-head maps (an earlier validation's, on the slider)."""
    for sentence in data["sentences"]:
        for view in sentence["models"].values():
            for key in PER_HEAD:
                view.pop(key, None)
    return data


def _record(index: int, source: str, reference: str, translation: Translation) -> dict[str, Any]:
    attention = translation.attention
    return {
        "index": index,
        "source": source,
        "reference": reference,
        "hypothesis": translation.text,
        "src_tokens": translation.src_tokens,
        "tgt_tokens": translation.tgt_tokens,
        # (len(tgt_tokens), len(src_tokens)) rows of weights, rounded: files stay small; and per
        # row the columns that are exactly 0 (a weight that rounds to 0 is not one).
        "attention": [[round(w, 5) for w in row] for row in attention.tolist()]
        if attention is not None
        else None,
        "zeros": exact_zeros(attention) if attention is not None else None,
    }
