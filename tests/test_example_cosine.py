"""examples/cosine_attention/ as a user runs it: copied outside the checkout, trained with its own
YAML (RNN and Transformer), checked against the scoring contract, exported and translated only
when its module is trusted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from seq2seq.inference.bundle import build_model, load
from seq2seq.inference.plugins import PluginError
from tests.configs import ROOT, TINY, TINY_TRANSFORMER, installed_command
from tests.scoring import SCORING_FUNCTIONS, assert_attention_follows_score, model_config

EXAMPLE = ROOT / "examples" / "cosine_attention"


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example, copied where a user keeps their own code: outside the checkout."""
    directory = tmp_path_factory.mktemp("user") / "cosine_attention"
    shutil.copytree(EXAMPLE, directory)
    assert not directory.resolve().is_relative_to(ROOT)
    return directory


def run(user_dir: Path, *args: str, trusted_path: bool = True) -> subprocess.CompletedProcess[str]:
    """``python ROOT/ARGS...`` (or the installed command, ``seq2seq ARGS...``) from the user's
    directory, with it on PYTHONPATH as the README says (``PYTHONPATH=.``) unless
    ``trusted_path`` is false."""
    env = {**os.environ, "PYTHONPATH": "." if trusted_path else ""}
    script = [sys.executable, str(ROOT / args[0])]
    program = [installed_command()] if args[0] == "seq2seq" else script
    return subprocess.run(
        [*program, *args[1:]], cwd=user_dir, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(user_dir: Path) -> dict[str, Path]:
    """One small epoch of each model family with ``attention=cosine``: their best checkpoints."""
    checkpoints = {}
    data_and_trainer = [override for override in TINY if not override.startswith("model.")]
    for family, program, overrides in [
        ("rnn", ["seq2seq", "train"], TINY),  # the installed command takes --config-dir too
        ("transformer", ["train.py"], [*data_and_trainer, *TINY_TRANSFORMER]),
    ]:
        result = run(
            user_dir, *program, "--config-dir", "conf", "attention=cosine",
            *overrides, "trainer.max_epochs=1", "logger=csv", f"hydra.run.dir={family}",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        checkpoints[family] = user_dir / family / "checkpoints" / "best.ckpt"
        assert checkpoints[family].is_file()
    return checkpoints


def test_the_example_trains_its_own_scoring_function(
    user_dir: Path, trained: dict[str, Path]
) -> None:
    for checkpoint in trained.values():
        model = load(checkpoint, trust_modules=[str(user_dir / "cosine_attention.py")]).model
        scorings = [m for m in model.modules() if type(m).__name__ == "CosineAttention"]
        assert scorings, "the model has no CosineAttention"
        for scoring in scorings:
            # Learned, from the YAML's start: a trained epoch moves it, but not back to 1.
            assert scoring.log_temperature is not None
            assert float(scoring.log_temperature.detach().exp()) < 0.5


@pytest.mark.parametrize("kernels", ["auto", "off"])
@pytest.mark.parametrize("family", ["bahdanau", "luong", "transformer"])
def test_the_example_keeps_the_scoring_contract(user_dir: Path, family: str, kernels: str) -> None:
    config = model_config(family, "cosine", [f"hydra.searchpath=[file://{user_dir / 'conf'}]"])
    trusted = [str(user_dir / "cosine_attention.py")]
    torch.manual_seed(0)
    model = build_model(config, kernels=kernels, trust_modules=trusted)
    reference = build_model(config, kernels="off", trust_modules=trusted)
    reference.load_state_dict(model.state_dict())
    assert_attention_follows_score(model, reference, family)


# The attention's other parts around the user's score: the switches.
PARTS = {
    "sparsemax": ["attention.normalizer=sparsemax"],
    "entmax15": ["attention.normalizer=entmax15"],
    "local_p": ["attention.window=local_p", "attention.window_size=3"],
    "key_bias": ["attention.key_bias=true"],
}


@pytest.mark.parametrize("part", sorted(PARTS))
@pytest.mark.parametrize("family", ["bahdanau", "luong"])
def test_the_attentions_parts_work_around_the_users_score(
    user_dir: Path, family: str, part: str
) -> None:
    search = f"hydra.searchpath=[file://{user_dir / 'conf'}]"
    config = model_config(family, "cosine", [search, *PARTS[part]])
    trusted = [str(user_dir / "cosine_attention.py")]
    torch.manual_seed(0)
    model = build_model(config, kernels="auto", trust_modules=trusted)
    reference = build_model(config, kernels="off", trust_modules=trusted)
    reference.load_state_dict(model.state_dict())
    assert model.decoder.attention.normalization is not None
    assert_attention_follows_score(model, reference, family)


@pytest.mark.slow  # end to end through train.py, as a user runs it
@pytest.mark.parametrize("part", [*sorted(PARTS), "transformer entmax15"])
def test_the_example_trains_with_each_part_and_translates(user_dir: Path, part: str) -> None:
    data_and_trainer = [override for override in TINY if not override.startswith("model.")]
    overrides = (
        [*data_and_trainer, *TINY_TRANSFORMER, "attention.normalizer=entmax15"]
        if part.startswith("transformer")
        else [*TINY, *PARTS[part]]
    )
    name = part.replace(" ", "-")
    result = run(
        user_dir, "train.py", "--config-dir", "conf", "attention=cosine", *overrides,
        "trainer.max_epochs=1", "logger=csv", "test_after_training=false",
        f"hydra.run.dir=parts-{name}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (user_dir / "in.txt").write_text("a b c\nd e\n", encoding="utf-8")
    checkpoint = user_dir / f"parts-{name}" / "checkpoints" / "best.ckpt"
    translated = run(
        user_dir, "scripts/translate.py", "--model", str(checkpoint), "--input", "in.txt",
        "--beam-size", "5", "--trust-module", "cosine_attention",
    )  # fmt: skip
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert len(translated.stdout.splitlines()) == 2


@pytest.mark.slow  # end to end through the scripts: the default suite keeps the in-process checks
def test_the_bundle_translates_only_when_the_module_is_trusted(
    user_dir: Path, trained: dict[str, Path]
) -> None:
    (user_dir / "in.txt").write_text("a b c\nd e\n", encoding="utf-8")
    for family, checkpoint in trained.items():
        bundle = user_dir / f"{family}-bundle"
        exported = run(
            user_dir, "scripts/export.py", "--checkpoint", str(checkpoint), "--out", str(bundle),
            "--trust-module", "cosine_attention",
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr[-3000:]
        for model in (checkpoint, bundle):
            translate = ["scripts/translate.py", "--model", str(model), "--input", "in.txt"]
            trusted = run(user_dir, *translate, "--trust-module", "cosine_attention")
            assert trusted.returncode == 0, trusted.stderr[-3000:]
            assert len(trusted.stdout.splitlines()) == 2
            # The file itself may be trusted, with nothing on PYTHONPATH.
            by_file = run(
                user_dir, *translate, "--trust-module", "cosine_attention.py", trusted_path=False
            )
            assert by_file.stdout == trusted.stdout, by_file.stderr[-3000:]
            refused = run(user_dir, *translate)
            assert refused.returncode == 2 and not refused.stdout
            assert "Traceback" not in refused.stderr
            assert "'cosine_attention.CosineAttention'" in refused.stderr
            assert "--trust-module cosine_attention" in refused.stderr


@pytest.mark.slow  # end to end through the scripts: the default suite keeps the in-process checks
def test_the_compare_experiment_sweeps_the_users_yaml_too(user_dir: Path) -> None:
    """experiment=compare_attention is every YAML of the attention group: conf/attention/'s and
    the user's config directory's, with no list to edit."""
    result = run(
        user_dir, "train.py", "--config-dir", "conf", "experiment=compare_attention", *TINY,
        "data.train_size=64", "trainer.max_epochs=1", "logger=csv", "test_after_training=false",
        "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    swept = []
    for run_dir in (user_dir / "sweep").iterdir():
        if run_dir.is_dir():
            overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")  # [key=value, ...]
            swept += [o.split("=", 1)[1] for o in overrides if o.startswith("attention=")]
    assert sorted(swept) == sorted([*SCORING_FUNCTIONS, "cosine"])


@pytest.mark.slow  # end to end through the scripts: the default suite keeps the in-process checks
def test_the_example_trains_under_ddp(user_dir: Path) -> None:
    """Two CPU processes, started by the installed command (Lightning starts the second as
    ``python FILE ARGS``, the file the command names): each rank imports the user's module
    (PYTHONPATH is inherited) and the run writes a checkpoint that names it."""
    result = run(
        user_dir, "seq2seq", "train", "--config-dir", "conf", "attention=cosine", *TINY,
        "data.train_size=128", "trainer.max_epochs=1", "trainer=ddp", "trainer.accelerator=cpu",
        "trainer.devices=2", "threads=1", "logger=csv", "test_after_training=false",
        "hydra.run.dir=ddp",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = torch.load(user_dir / "ddp" / "checkpoints" / "last.ckpt", weights_only=True)
    target = checkpoint["seq2seq"]["model_config"]["attention"]["_target_"]
    assert target == "cosine_attention.CosineAttention"


def test_nothing_is_imported_from_an_untrusted_file(
    user_dir: Path, trained: dict[str, Path], tmp_path: Path
) -> None:
    """A file naming a module that would run code on import: refused before any import."""
    canary = tmp_path / "canary"
    (tmp_path / "hostile_scoring.py").write_text(
        f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n", encoding="utf-8"
    )
    checkpoint = torch.load(trained["rnn"], weights_only=True)
    checkpoint["seq2seq"]["model_config"]["attention"]["_target_"] = "hostile_scoring.Anything"
    hostile = tmp_path / "hostile.ckpt"
    torch.save(checkpoint, hostile)
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(PluginError, match=r"--trust-module hostile_scoring"):
            load(hostile)
        with pytest.raises(PluginError, match=r"not a scoring function"):
            load(hostile, trust_modules=["hostile_scoring"])  # trusted: imported, then refused
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hostile_scoring", None)
    assert canary.read_text() == "ran"  # only the trusted load imported it


@pytest.mark.slow  # end to end through the scripts: the default suite keeps the in-process checks
def test_an_untrusted_resume_is_refused_and_a_trusted_one_goes_on(
    user_dir: Path, trained: dict[str, Path]
) -> None:
    """Resuming builds the checkpoint's model: the command's config names the module (trusted);
    the same checkpoint named by a config that does not is refused."""
    last = user_dir / "rnn" / "checkpoints" / "last.ckpt"
    common = [*TINY, "logger=csv", "hydra.run.dir=rnn", f"ckpt_path={last}"]
    resumed = run(
        user_dir, "train.py", "--config-dir", "conf", "attention=cosine", *common,
        "trainer.max_epochs=2", "test_after_training=false",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    refused = run(user_dir, "train.py", *common, "trainer.max_epochs=3")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "'cosine_attention.CosineAttention'" in refused.stderr
    assert "--trust-module cosine_attention" in refused.stderr
