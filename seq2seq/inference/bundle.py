"""Trained models in and out, safely: checkpoints, and pickle-free export bundles.

A checkpoint (``train.py``'s ``*.ckpt``) is read with ``torch.load(weights_only=True)``; a bundle
is a directory of ``model.safetensors``, ``config.json``, ``src_tokenizer.json`` and
``tgt_tokenizer.json``. Neither runs code from the file: the model is rebuilt from the classes in
``ALLOWED_TARGETS``, and from a user's own scoring function only where the user trusts its module
(``trust_modules``; ``seq2seq.inference.plugins``), never from an arbitrary import path written in
the file.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import nn

from seq2seq.atomic import write_atomic
from seq2seq.attention import (
    AdditiveAttention,
    AttentionParts,
    DotProductAttention,
    GeneralAttention,
)
from seq2seq.data.tokenization import SPECIAL_TOKENS, check_special_tokens
from seq2seq.errors import ConfigError
from seq2seq.errors import ModelFileError as ModelFileError  # raised here; callers import it
from seq2seq.inference.plugins import PluginError as PluginError
from seq2seq.inference.plugins import resolve, trusted_modules
from seq2seq.kernels import KERNEL_CHOICES, accelerate
from seq2seq.models import BahdanauDecoder, EncoderDecoder, LuongDecoder, Seq2Seq, Transformer
from seq2seq.version import __version__

CHECKPOINT_KEY = "seq2seq"  # our entry in a Lightning checkpoint
CHECKPOINT_FORMAT = 1
BUNDLE_FORMAT = 1
BUNDLE_FILES = ("model.safetensors", "config.json", "src_tokenizer.json", "tgt_tokenizer.json")

# The callables a model config may always name. Anything else must be a scoring function from a
# module the user trusts (``seq2seq.inference.plugins``), so a file alone can never make us import
# or call code of its choosing.
ALLOWED_TARGETS: dict[str, Callable[..., Any]] = {
    "seq2seq.models.Seq2Seq": Seq2Seq,
    "seq2seq.attention.AdditiveAttention": AdditiveAttention,
    "seq2seq.attention.DotProductAttention": DotProductAttention,
    "seq2seq.attention.GeneralAttention": GeneralAttention,
    "seq2seq.attention.AttentionParts": AttentionParts,
    # The name of GeneralAttention in files written before it was renamed.
    "seq2seq.attention.MultiplicativeAttention": GeneralAttention,
    "seq2seq.models.BahdanauDecoder": BahdanauDecoder,
    "seq2seq.models.LuongDecoder": LuongDecoder,
    "seq2seq.models.Transformer": Transformer,
    "torch.nn.GRU": nn.GRU,
    "torch.nn.LSTM": nn.LSTM,
    "torch.nn.GRUCell": nn.GRUCell,
    "torch.nn.LSTMCell": nn.LSTMCell,
    # The names files written before the modules moved into seq2seq.models carry.
    "seq2seq.model.Seq2Seq": Seq2Seq,
    "seq2seq.decoder.BahdanauDecoder": BahdanauDecoder,
    "seq2seq.decoder.LuongDecoder": LuongDecoder,
}


def attention_parts_of(model_config: dict[str, Any]) -> dict[str, Any]:
    """A model config's normalizer, window, key bias and coverage
    (``seq2seq.attention.AttentionParts``) and input feeding, as plain values for a page or an
    API: files from before the parts were switches are global softmax without them; a user's
    normalizer is named by its ``_target_``."""
    parts = model_config.get("attention_parts") or {}
    normalizer = parts.get("normalizer", "softmax")
    if isinstance(normalizer, dict):
        normalizer = str(normalizer.get("_target_", "your own"))
    return {
        "normalizer": normalizer,
        "alpha": parts.get("alpha"),
        "window": parts.get("window", "global"),
        "window_size": parts.get("window_size"),
        "key_bias": bool(parts.get("key_bias", False)),
        "coverage": bool(parts.get("coverage", False)),
        "input_feeding": bool(model_config.get("input_feeding", False)),
    }


# Decoding settings for files that do not carry one (the training config's defaults).
DEFAULT_DECODING: dict[str, Any] = {"max_len_a": 2.0, "max_len_b": 10, "max_src_len": 256}


@dataclass
class TrainedModel:
    """Everything inference needs: the model (in eval mode), its vocabularies and settings."""

    model: EncoderDecoder
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    model_config: dict[str, Any]
    decoding: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_DECODING))
    metrics: dict[str, float] = field(default_factory=dict)


# What to do when a model file's config cannot build its model.
REEXPORT = (
    "The file was written by an incompatible version of seq2seq; re-export it with this version."
)


# Keys of a model config that choose how the model runs, not what it computes: they are not
# constructor arguments (``build_model`` reads them) and never part of a checkpoint's identity.
RUNTIME_KEYS = ("kernels", "fused_rnn")


def build_model(
    model_config: dict[str, Any],
    origin: str = "the model config",
    fix: str = REEXPORT,
    kernels: str | None = None,
    trust_modules: Iterable[str] = (),
) -> EncoderDecoder:
    """Instantiate a model (``Seq2Seq`` or ``Transformer``) from its Hydra-style config,
    allowing ``ALLOWED_TARGETS`` and the scoring functions of the ``trust_modules`` (module
    names or ``.py`` files: ``seq2seq.inference.plugins``), and accelerate it with
    ``seq2seq.kernels`` unless ``kernels`` is ``off``: the one place where the choice between the
    reference and the accelerated modules is made.

    ``fix`` ends the message when the config cannot build its model; ``kernels`` overrides the
    config's choice.
    """
    kernels = kernels_choice(model_config if kernels is None else {"kernels": kernels})
    trusted = trusted_modules(trust_modules)
    buildable = {k: v for k, v in model_config.items() if k not in RUNTIME_KEYS}
    model = _build(buildable, origin, trusted, fix)
    if not isinstance(model, EncoderDecoder):
        raise ModelFileError(
            f"{origin} does not describe a model (seq2seq.models.Seq2Seq or Transformer)."
        )
    if kernels == "auto":
        accelerate(model)
    return model


def kernels_choice(model_config: dict[str, Any]) -> str:
    """``model.kernels`` (``auto``: the CPU kernels where they apply; ``off``: the reference
    everywhere). Files written before it existed say ``fused_rnn: true`` or ``false``."""
    if "kernels" not in model_config:
        return "off" if model_config.get("fused_rnn") is False else "auto"
    choice = model_config["kernels"]
    if isinstance(choice, bool):  # YAML's off, no, false (on, yes, true), unquoted
        meant = "auto" if choice else "off"
        raise ConfigError(
            f"model.kernels is {str(choice).lower()}, not auto or off: YAML reads off, no, "
            f"false (and on, yes, true) as a boolean, in a file or on the command line. Write "
            f"model.kernels={meant} on the command line, or kernels: '{meant}' (quoted) in a file."
        )
    if choice not in KERNEL_CHOICES:
        raise ConfigError(
            f"model.kernels={choice} is not a choice: auto runs the C kernels on the CPU where "
            "they apply (the default), off the plain PyTorch reference everywhere. E.g. seq2seq "
            "train model.kernels=off."
        )
    return str(choice)


def _build(
    node: Any, origin: str, trusted: frozenset[str], fix: str = REEXPORT, key: str = ""
) -> Any:
    if isinstance(node, list):
        return [_build(item, origin, trusted, fix) for item in node]
    if not isinstance(node, dict):
        return node
    arguments = {
        name: _build(value, origin, trusted, fix, str(name))
        for name, value in node.items()
        if name[:1] != "_"
    }
    if "_target_" not in node:
        return arguments
    target = node["_target_"]
    if not isinstance(target, str):
        raise ModelFileError(f"{origin} has a _target_ that is not a string: {target!r}. {fix}")
    # A built-in class, or a user's scoring function (or, as attention_parts.normalizer, a
    # normalizer) from a trusted module (refused otherwise).
    factory = ALLOWED_TARGETS.get(target) or resolve(
        target, trusted, origin, normalizer=key == "normalizer"
    )
    try:
        return partial(factory, **arguments) if node.get("_partial_") else factory(**arguments)
    except ConfigError:
        raise  # a bad value (model.hidden_size=0): its message already names the key and the fix
    except (TypeError, ValueError) as error:
        said = str(error).rstrip()
        said = said if said.endswith((".", "!", "?")) else f"{said}."  # Python's errors have none
        raise ModelFileError(f"{origin} cannot build {target}: {said} {fix}") from None


def load(
    path: str | Path,
    map_location: str | torch.device = "cpu",
    kernels: str | None = None,
    trust_modules: Iterable[str] = (),
) -> TrainedModel:
    """Load a trained model from a checkpoint file or a bundle directory. ``kernels`` (auto or
    off) overrides the choice the model was trained with (``model.kernels``); ``trust_modules``
    (module names or ``.py`` files) may provide a scoring function that is not built in, which is
    refused otherwise (``seq2seq.inference.plugins``)."""
    path = Path(path)
    if path.is_dir():
        return load_bundle(path, map_location, kernels, trust_modules)
    if not path.exists():
        raise ModelFileError(
            f"{path} does not exist: pass a checkpoint written by training (seq2seq train: "
            "RUN/checkpoints/best.ckpt) or a bundle directory written by seq2seq export."
        )
    return load_checkpoint(path, map_location, kernels, trust_modules)


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """``torch.load(weights_only=True)`` with one-paragraph errors for foreign or broken files."""
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise ModelFileError(
            f"{path} was refused: loading it would need arbitrary unpickling, which can run code "
            "hidden in the file. seq2seq checkpoints hold only tensors, numbers and strings; use "
            "one written by train.py, or a bundle from scripts/export.py."
        ) from None
    # A file that is not a checkpoint at all (a text file) trips the unpickler anywhere: an
    # IndexError ("pop from empty list") as often as a clean UnpicklingError.
    except (RuntimeError, EOFError, OSError, ValueError, IndexError, KeyError, TypeError) as error:
        # The reader's own words where they say something (a zip archive's damage); not the
        # unpickler's internals ("pop from empty list").
        first = str(error).splitlines()[0] if str(error) else ""
        said = f" ({first})" if isinstance(error, RuntimeError | OSError) and first else ""
        raise ModelFileError(
            f"{path} is not a readable checkpoint{said}. It may be "
            "truncated (an interrupted copy or a full disk) or not a checkpoint at all; use "
            "RUN/checkpoints/last.ckpt or best.ckpt, or copy the file again."
        ) from None
    if not isinstance(checkpoint, dict):
        raise ModelFileError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint.")
    return checkpoint


def load_checkpoint(
    path: Path,
    map_location: str | torch.device = "cpu",
    kernels: str | None = None,
    trust_modules: Iterable[str] = (),
) -> TrainedModel:
    """Rebuild the model of a ``train.py`` checkpoint from the checkpoint alone."""
    checkpoint = read_checkpoint(path, map_location)
    meta = checkpoint.get(CHECKPOINT_KEY)
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ModelFileError(
            f"{path} is not a seq2seq checkpoint of format {CHECKPOINT_FORMAT} (it has no "
            f"'{CHECKPOINT_KEY}' entry of that format); it comes from another program or "
            "version. Pass a checkpoint written by this version's train.py."
        )
    trained = TrainedModel(
        model=build_model(
            meta["model_config"],
            f"the model config in {path}",
            kernels=kernels,
            trust_modules=trust_modules,
        ),
        src_tokenizer=_tokenizer_from_str(meta["src_tokenizer"], f"the source tokenizer in {path}"),
        tgt_tokenizer=_tokenizer_from_str(meta["tgt_tokenizer"], f"the target tokenizer in {path}"),
        model_config=meta["model_config"],
        decoding={**DEFAULT_DECODING, **meta.get("decoding", {})},
        metrics=dict(meta.get("metrics", {})),
    )
    prefix = "model."  # the LightningModule holds the model as .model
    state_dict = {
        key[len(prefix) :]: value
        for key, value in checkpoint.get("state_dict", {}).items()
        if key.startswith(prefix)
    }
    _load_weights(trained, state_dict, path)
    return trained


def load_bundle(
    directory: Path,
    map_location: str | torch.device = "cpu",
    kernels: str | None = None,
    trust_modules: Iterable[str] = (),
) -> TrainedModel:
    """Load an export bundle; nothing in it is unpickled."""
    missing = [name for name in BUNDLE_FILES if not (directory / name).is_file()]
    if missing:
        raise ModelFileError(
            f"{directory} is not a complete seq2seq bundle: {', '.join(missing)} missing. "
            "Export one with: seq2seq export --checkpoint RUN/checkpoints/best.ckpt "
            f"--out {directory}"
        )
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelFileError(
            f"{directory / 'config.json'} is not valid JSON ({error}); export the bundle again."
        ) from None
    if not isinstance(config, dict) or config.get("format") != BUNDLE_FORMAT:
        raise ModelFileError(
            f"{directory / 'config.json'} is not a seq2seq bundle config of format "
            f"{BUNDLE_FORMAT}; export the bundle again with this version of seq2seq."
        )
    trained = TrainedModel(
        model=build_model(
            config["model"],
            f"the model config in {directory / 'config.json'}",
            kernels=kernels,
            trust_modules=trust_modules,
        ),
        src_tokenizer=_tokenizer_from_file(directory / "src_tokenizer.json"),
        tgt_tokenizer=_tokenizer_from_file(directory / "tgt_tokenizer.json"),
        model_config=config["model"],
        decoding={**DEFAULT_DECODING, **config.get("decoding", {})},
        metrics=dict(config.get("metrics", {})),
    )
    try:
        state_dict = load_file(directory / "model.safetensors", device=str(map_location))
    except (SafetensorError, OSError) as error:
        raise ModelFileError(
            f"{directory / 'model.safetensors'} cannot be read ({error}); it may be truncated. "
            "Export the bundle again."
        ) from None
    _load_weights(trained, state_dict, directory / "model.safetensors")
    return trained


def export_bundle(trained: TrainedModel, out_dir: str | Path) -> Path:
    """Write ``trained`` as a bundle directory; each file is written atomically."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ModelFileError(
            f"cannot create the bundle directory {out_dir} ({error.strerror}); "
            "choose another --out."
        ) from None
    config = {
        "format": BUNDLE_FORMAT,
        "seq2seq_version": __version__,
        "attention": trained.model_config["attention"]["_target_"].rsplit(".", 1)[-1],
        "model": trained.model_config,
        "special_tokens": {token: index for index, token in enumerate(SPECIAL_TOKENS)},
        "src_vocab_size": trained.src_tokenizer.get_vocab_size(),
        "tgt_vocab_size": trained.tgt_tokenizer.get_vocab_size(),
        "decoding": trained.decoding,
        "metrics": trained.metrics,
    }
    # safetensors wants contiguous CPU tensors that share no memory.
    weights = {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in trained.model.state_dict().items()
    }
    write_atomic(out_dir / "model.safetensors", lambda path: save_file(weights, str(path)))
    write_atomic(
        out_dir / "config.json",
        lambda path: path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8"),
    )
    write_atomic(out_dir / "src_tokenizer.json", lambda path: trained.src_tokenizer.save(str(path)))
    write_atomic(out_dir / "tgt_tokenizer.json", lambda path: trained.tgt_tokenizer.save(str(path)))
    return out_dir


def _tokenizer_from_str(serialized: str, origin: str) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_str(serialized)
    except Exception as error:  # tokenizers raises its own exception type for bad JSON
        raise ModelFileError(f"{origin} cannot be read ({error}).") from None
    try:
        check_special_tokens(tokenizer, origin)
    except ValueError as error:
        raise ModelFileError(str(error)) from None
    return tokenizer


def _tokenizer_from_file(path: Path) -> Tokenizer:
    return _tokenizer_from_str(path.read_text(encoding="utf-8"), str(path))


def _load_weights(trained: TrainedModel, state_dict: dict[str, torch.Tensor], origin: Path) -> None:
    config = trained.model_config
    for side, tokenizer in [("src", trained.src_tokenizer), ("tgt", trained.tgt_tokenizer)]:
        if tokenizer.get_vocab_size() != config.get(f"{side}_vocab_size"):
            raise ModelFileError(
                f"the {side} tokenizer of {origin} has {tokenizer.get_vocab_size()} tokens but the "
                f"model was built for {config.get(f'{side}_vocab_size')}: the tokenizer does not "
                "belong to this model. Export the bundle again from its checkpoint."
            )
    try:
        trained.model.load_state_dict(state_dict)
    except RuntimeError as error:
        raise ModelFileError(
            f"the weights in {origin} do not fit the model its config describes "
            f"({str(error).splitlines()[0]} ...). The file is damaged, its parts come from "
            "different models, or an older seq2seq wrote it for a model with other parts (the "
            "Luong decoder's output layer changed); use the original checkpoint or export it "
            "again, and retrain a model from an older version."
        ) from None
    trained.model.eval()
