"""Export bundles and safe loading: identical outputs, nothing unpickled, bad files refused."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from seq2seq import Translator
from seq2seq.inference.bundle import ModelFileError, TrainedModel, build_model, export_bundle, load
from seq2seq.models import BahdanauDecoder
from seq2seq.models.decoder import LuongDecoder

SENTENCES = ["the dog sees a cat .", "", "these two big dogs do not sleep in the garden .", "a"]


@pytest.fixture(scope="module")
def bundle_dir(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bundle(load(tiny_checkpoint), tmp_path_factory.mktemp("bundle") / "bundle")


def test_bundle_holds_the_promised_files_and_config(bundle_dir: Path) -> None:
    names = {path.name for path in bundle_dir.iterdir()}
    assert names == {"model.safetensors", "config.json", "src_tokenizer.json", "tgt_tokenizer.json"}
    config = json.loads((bundle_dir / "config.json").read_text())
    assert config["attention"] == "AdditiveAttention"
    assert config["special_tokens"] == {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}
    assert config["src_vocab_size"] == config["model"]["src_vocab_size"]
    assert config["seq2seq_version"]
    assert "val/bleu" in config["metrics"]
    # Every file readable by others, as the umask allows (the weights too: not save_file's 0600).
    umask = os.umask(0)
    os.umask(umask)
    assert {oct(path.stat().st_mode & 0o777) for path in bundle_dir.iterdir()} == {
        oct(0o666 & ~umask)
    }


def test_bundle_and_checkpoint_translate_identically(
    tiny_checkpoint: Path, bundle_dir: Path
) -> None:
    from_checkpoint = Translator.load(tiny_checkpoint)
    from_bundle = Translator.load(bundle_dir)
    for name, tensor in from_checkpoint.model.state_dict().items():
        assert torch.equal(tensor, from_bundle.model.state_dict()[name]), name
    for beam_size in (1, 3):
        assert from_bundle.translate(SENTENCES, beam_size=beam_size) == from_checkpoint.translate(
            SENTENCES, beam_size=beam_size
        )


def test_loading_a_bundle_unpickles_nothing(
    bundle_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bundle load tried to unpickle")

    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert Translator.load(bundle_dir).translate(["the dog sees a cat ."])


class WritesAMarker:
    """A pickle payload: unpickling it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": WritesAMarker(marker)}, evil)
    with pytest.raises(ModelFileError, match=r"refused.*arbitrary unpickling"):
        load(evil)
    assert not marker.exists()


def test_truncated_and_foreign_files_get_a_clear_error(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(tiny_checkpoint.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="truncated"):
        load(truncated)
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    with pytest.raises(ModelFileError, match=str(text)):
        load(text)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"weight": torch.zeros(2)}}, foreign)
    with pytest.raises(ModelFileError, match="not a seq2seq checkpoint"):
        load(foreign)
    with pytest.raises(ModelFileError, match="does not exist"):
        load(tmp_path / "missing.ckpt")


def test_a_config_naming_other_code_is_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    checkpoint["seq2seq"]["model_config"]["attention"]["_target_"] = "os.system"
    hostile = tmp_path / "hostile.ckpt"
    torch.save(checkpoint, hostile)
    with pytest.raises(ModelFileError, match=r"'os\.system'.*refused"):
        load(hostile)


def test_a_tokenizer_from_another_model_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(bundle_dir, mixed)
    # The target vocabulary in place of the source one: a tokenizer that is not the model's.
    shutil.copy(mixed / "tgt_tokenizer.json", mixed / "src_tokenizer.json")
    with pytest.raises(ModelFileError, match="does not belong to this model"):
        load(mixed)


def test_an_incomplete_bundle_names_what_is_missing(bundle_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(bundle_dir, partial)
    (partial / "model.safetensors").unlink()
    with pytest.raises(ModelFileError, match=r"model\.safetensors missing"):
        load(partial)
    shutil.copy(bundle_dir / "model.safetensors", partial / "model.safetensors")
    (partial / "model.safetensors").write_bytes(
        (bundle_dir / "model.safetensors").read_bytes()[:100]
    )
    with pytest.raises(ModelFileError, match="cannot be read"):
        load(partial)


def test_a_luong_model_round_trips_through_a_bundle(tiny_checkpoint: Path, tmp_path: Path) -> None:
    trained = load(tiny_checkpoint)
    luong = {"_target_": "seq2seq.models.LuongDecoder", "_partial_": True}
    config = {**trained.model_config, "decoder": luong}
    torch.manual_seed(0)
    model = build_model(config).eval()
    original = TrainedModel(model, trained.src_tokenizer, trained.tgt_tokenizer, config)
    reloaded = load(export_bundle(original, tmp_path / "bundle"))
    assert isinstance(reloaded.model.decoder, LuongDecoder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reloaded.model.state_dict()[name]), name
    translations = Translator(original).translate(SENTENCES, beam_size=3)
    assert Translator(reloaded).translate(SENTENCES, beam_size=3) == translations


def test_a_checkpoint_without_a_decoder_key_builds_the_bahdanau_decoder(
    tiny_checkpoint: Path,
) -> None:
    config = dict(load(tiny_checkpoint).model_config)
    config.pop("decoder", None)  # as written before the decoder was configurable
    assert isinstance(build_model(config).decoder, BahdanauDecoder)
