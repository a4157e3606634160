"""The run directory, and resuming a run in it: the checkpoint and config checked against the
command's before Lightning reads them."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from seq2seq.attention import AttentionParts
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import RUNTIME_KEYS, ModelFileError, TrainedModel, read_checkpoint
from seq2seq.inference.bundle import load_checkpoint as load_trained_checkpoint
from seq2seq.pipeline.building import trusted_by_config
from seq2seq.training.checkpointing import run_dir_of_checkpoint


def resolve_run_dir(cfg: DictConfig) -> Path:
    """The run directory: ``run_dir`` if it was set; when resuming without it, the checkpoint's run
    (``RUN/checkpoints/last.ckpt`` -> ``RUN``), so a resumed run writes where the original did."""
    if cfg.ckpt_path and OmegaConf.is_interpolation(cfg, "run_dir"):
        original = run_dir_of_checkpoint(cfg.ckpt_path)
        if original is not None and not HydraConfig.initialized():
            return original  # train(compose(...)) has no Hydra output dir to resolve
    return Path(cfg.run_dir)


def hydra_run_dir(ckpt_path: str | None, default: str) -> str:
    """The ``seq2seq_run_dir`` resolver behind ``hydra.run.dir``: a resumed run's own directory."""
    original = run_dir_of_checkpoint(ckpt_path) if ckpt_path else None
    return str(original) if original is not None else default


def resume_command() -> str:
    """The command that resumes this run, with ``{ckpt_path}`` to fill in."""
    if not HydraConfig.initialized():
        return "train(cfg) with ckpt_path={ckpt_path}"
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("ckpt_path=")]
    return " ".join(["seq2seq train", *map(shlex.quote, overrides), "ckpt_path={ckpt_path}"])


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "last.ckpt").exists()


def check_new_run(run_dir: Path) -> None:
    """Refuse to start a new run over the checkpoints of another."""
    if holds_a_run(run_dir):
        last = run_dir / "checkpoints" / "last.ckpt"
        raise ConfigError(
            f"{run_dir} already holds a run ({last}); a new run there would overwrite its "
            f"checkpoints. Resume it with ckpt_path={last}, or choose another directory with "
            f"hydra.run.dir=DIR (run_dir=DIR from Python)."
        )


def prepare_run_dir(run_dir: Path, resuming: bool) -> None:
    """Create the run directory; refuse to start a new run over the checkpoints of another."""
    if not resuming:
        check_new_run(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"cannot write to the run directory {run_dir} ({error.strerror or error}): choose a "
            "writable one with run_dir=... (or hydra.run.dir=...), or fix its permissions."
        ) from None


# What a run writes before it trains: Hydra's record and log, then the pipeline's config,
# vocabularies and tracker's run id; anything else (metrics, checkpoints) means it trained.
STARTING_FILES = frozenset(
    {".hydra", "train.log", "config.yaml", "src_tokenizer.json", "tgt_tokenizer.json",
     "wandb_run_id"}
)  # fmt: skip


def outermost_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist (None where ``path``
    does): what making ``path`` creates. Absolute, as Hydra writes it (``a/../b`` is ``b``)."""
    path = Path(os.path.abspath(path))
    missing = None
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing = folder
    return missing


def claim_run_dir(path: Path) -> Path | None:
    """Make ``path`` and its missing parents, each with one ``mkdir`` (atomic: of two commands
    started in the same second, one makes the folder and the other finds it made); returns the
    outermost folder this call made, if it made ``path`` itself, else None (the directory is
    someone else's, or was there before)."""
    path = Path(os.path.abspath(path))
    missing = outermost_missing(path)
    if missing is None:
        return None
    created = None
    for folder in [*reversed(path.parents), path]:
        if not folder.is_relative_to(missing):
            continue
        try:
            folder.mkdir()
        except FileExistsError:
            created = None  # made by another command meanwhile: not this one's to delete
            continue
        except OSError:  # unwritable, or under a file: Hydra says so when it makes the folder
            return None
        created = created or folder
    return created


def remove_refused_run(
    run_dir: Path, created: Path | None, overrides: list[str] | None = None
) -> bool:
    """Delete ``run_dir``, which this command made (``created``: the outermost folder it made
    for it, from ``claim_run_dir`` or ``outermost_missing``), where the run stopped before it
    trained: it holds only ``STARTING_FILES``, and Hydra's record there (``.hydra/
    overrides.yaml``) is of ``overrides``, this command's (another command sharing the folder
    wrote its own). Then the folders made for it, up to ``created``, that are left empty (a
    multirun's multirun.yaml aside). Nothing that existed before the command is touched.
    Returns whether ``run_dir`` was deleted."""
    run_dir = Path(os.path.abspath(run_dir))
    if created is None or not run_dir.is_relative_to(created) or not run_dir.is_dir():
        return False
    if any(path.name not in STARTING_FILES for path in run_dir.iterdir()):
        return False
    record = run_dir / ".hydra" / "overrides.yaml"
    foreign = record.exists() and OmegaConf.to_container(OmegaConf.load(record)) != overrides
    if overrides is not None and foreign:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    folder = run_dir.parent
    while folder.is_relative_to(created) and folder.is_dir():
        if any(path.name != "multirun.yaml" for path in folder.iterdir()):
            break
        shutil.rmtree(folder, ignore_errors=True)
        folder = folder.parent
    return not run_dir.exists()


# Config sections that must not change when a run is resumed: they define its data and model.
RESUME_SECTIONS = ("seed", "data", "model", "attention", "optim")


def read_resume_checkpoint(cfg: DictConfig, run_dir: Path) -> TrainedModel:
    """Check that ``cfg.ckpt_path`` can be resumed with ``cfg``; returns its model and tokenizers.

    Every problem is one paragraph here, before Lightning would fail on it with a traceback: a
    missing, truncated or foreign file, or a config whose data or model differ from the run's.
    """
    path = Path(cfg.ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"ckpt_path={path} does not exist. Resume from a checkpoint a run wrote: "
            "RUN/checkpoints/last.ckpt (written every checkpoint.every_n_steps steps and at the "
            "end of every epoch) or RUN/checkpoints/best.ckpt."
        )
    # A truncated or foreign file fails here, clearly; a user's scoring function loads because
    # the command's own config names it.
    trained = load_trained_checkpoint(path, trust_modules=trusted_by_config(cfg))
    if "optimizer_states" not in read_checkpoint(path):
        raise ModelFileError(
            f"ckpt_path={path} holds a model but no optimizer state, so training cannot resume "
            "from it. Pass RUN/checkpoints/last.ckpt of a run."
        )
    saved = run_dir / "config.yaml"
    if saved.is_file():
        changed = changed_keys(OmegaConf.load(saved), cfg)
        if changed:
            shown = "; ".join(
                f"{key}: {old!r} in the run, {new!r} now" for key, old, new in changed
            )
            raise ConfigError(
                f"ckpt_path={path} continues the run in {run_dir}, but this command changes "
                f"settings the run was trained with ({shown}). Resume with the run's original "
                f"overrides (see {run_dir / '.hydra' / 'overrides.yaml'} or {saved}); only "
                "trainer.* and decoding.* may change."
            )
    return trained


def changed_keys(saved: Any, cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for each leaf in ``RESUME_SECTIONS`` that differs."""
    changed = []
    for key in RESUME_SECTIONS:
        # Section by section: run_dir may not resolve outside Hydra, and is not compared.
        before_section, after_section = (_plain(config, key) for config in (saved, cfg))
        for name, (before, after) in _differences(before_section, after_section, key).items():
            # Where the data cache lives, and which Adam kernel runs, change no result.
            if "cache_dir" not in name and name != "optim.optimizer.fused":
                changed.append((name, before, after))
    return changed


def _plain(config: Any, key: str) -> Any:
    node = OmegaConf.select(config, key, default=None)
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


DEFAULT_PARTS = dataclasses.asdict(AttentionParts())

# Keys added to (or moved within) the config since runs were first written, with the value that
# reproduces what those runs did: a run or checkpoint without the key is the same as one with
# this value (num_heads: attention.num_heads of RNN runs before it became model.num_heads).
ADDED_KEYS: dict[str, Any] = {
    "initial_temperature": 1.0,
    "alignment_loss_weight": 0.0,
    "num_heads": 1,
    # The attention's parts besides its score: global softmax without a key bias before them.
    "normalizer": "softmax",
    "window": "global",
    "key_bias": False,
    "attention_parts": {"_target_": "seq2seq.attention.AttentionParts", **DEFAULT_PARTS},
    "input_feeding": False,
    "coverage": False,
    "coverage_loss_weight": 0.0,
}


def _differences(old: Any, new: Any, prefix: str) -> dict[str, tuple[Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(old) | set(new), key=str):
            default = ADDED_KEYS.get(str(key))
            before, after = (default if c.get(key) is None else c[key] for c in (old, new))
            found.update(_differences(before, after, f"{prefix}.{key}"))
        return found
    return {} if old == new else {prefix: (old, new)}


def check_same_model(ckpt_path: str, saved: dict[str, Any], model_config: dict[str, Any]) -> None:
    """The config must build the model the checkpoint holds, or its weights cannot be loaded."""
    changed = {
        key: values
        for key, values in _differences(saved, model_config, "model").items()
        if key.removeprefix("model.") not in RUNTIME_KEYS
    }
    if changed:
        # The attention's parts are the attention.* keys on the command line.
        shown = "; ".join(
            f"{key.replace('model.attention_parts.', 'attention.')}: {old!r} in the checkpoint, "
            f"{new!r} now"
            for key, (old, new) in changed.items()
        )
        raise ConfigError(
            f"ckpt_path={ckpt_path} holds a different model than this config builds ({shown}). "
            "Resume with the model.* and attention=... settings the run was trained with."
        )
