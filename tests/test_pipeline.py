"""The real Hydra config, composed and trained: every option runs, runs write what they promise."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sacrebleu
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.errors import ConfigError
from seq2seq.models.decoder import LuongDecoder
from seq2seq.pipeline import build_optimizer, changed_keys, load_checkpoint, train
from tests.configs import TINY, write_toy_files
from tests.configs import compose_config as compose_plain
from tests.scoring import SCORING_FUNCTIONS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ATTENTIONS = SCORING_FUNCTIONS  # every YAML in conf/attention/
# A few hundred sentences: enough to exercise every code path in seconds.
SMALL = [
    "data.train_size=300",
    "data.val_size=40",
    "data.test_size=40",
    "data.batch_size=32",
    "model.hidden_size=32",
    "model.embedding_size=16",
    "trainer.enable_progress_bar=false",
    "logger=csv",
]


def compose_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"run_dir={run_dir}", *SMALL, *overrides])


def run_training(run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    return train(compose_config(run_dir, overrides))


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_every_option_composes_and_runs_fast_dev_run(
    tmp_path: Path, attention: str, model: str
) -> None:
    result = run_training(
        tmp_path, [f"attention={attention}", f"model={model}", "trainer.fast_dev_run=true"]
    )
    assert result["metrics"]["train/loss"] > 0
    assert 0 <= result["metrics"]["val/bleu"] <= 100


@pytest.mark.parametrize("model", ["gru", "lstm"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_the_luong_decoder_composes_and_runs_fast_dev_run(
    tmp_path: Path, attention: str, model: str
) -> None:
    result = run_training(
        tmp_path,
        [
            f"attention={attention}",
            f"model={model}",
            "model.decoder=luong",
            "trainer.fast_dev_run=true",
        ],
    )
    assert result["metrics"]["train/loss"] > 0
    assert 0 <= result["metrics"]["val/bleu"] <= 100


def test_a_luong_checkpoint_reloads_as_a_luong_model(tmp_path: Path) -> None:
    result = run_training(
        tmp_path, ["model.decoder=luong", "trainer.max_epochs=1", "test_after_training=false"]
    )
    module = load_checkpoint(result["best_checkpoint"])
    assert isinstance(module.model.decoder, LuongDecoder)
    assert module.model_config["decoder"]["_target_"] == "seq2seq.models.LuongDecoder"


def test_dot_product_with_a_narrow_encoder_trains(tmp_path: Path) -> None:
    result = run_training(
        tmp_path,
        ["attention=scaled_dot", "model.encoder_hidden_size=8", "trainer.fast_dev_run=true"],
    )
    assert result["metrics"]["train/loss"] > 0


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("run")
    return run_training(run_dir, ["trainer.max_epochs=2", "trainer.log_every_n_steps=2"])


def test_run_directory_holds_checkpoints_metrics_config_and_tokenizers(
    trained_run: dict[str, Any],
) -> None:
    run_dir = Path(trained_run["run_dir"])
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert Path(trained_run["last_checkpoint"]) == run_dir / "checkpoints" / "last.ckpt"
    assert Path(trained_run["best_checkpoint"]) == run_dir / "checkpoints" / "best.ckpt"
    assert (run_dir / "checkpoints" / "best.ckpt").is_file()
    assert (run_dir / "config.yaml").read_text().count("${") == 0  # resolved
    assert (run_dir / "src_tokenizer.json").is_file()
    with open(run_dir / "metrics.csv") as metrics_file:
        rows = list(csv.DictReader(metrics_file))
    assert "step" in rows[0]
    bleu_rows = [row for row in rows if row.get("val/bleu")]
    assert len(bleu_rows) == 2  # validated every epoch
    assert float(bleu_rows[-1]["val/bleu"]) <= trained_run["best_val_bleu"] + 1e-6
    assert any(row.get("train/loss") for row in rows)


def test_checkpoint_alone_reproduces_the_logged_bleu(trained_run: dict[str, Any]) -> None:
    """Reload best.ckpt with no config and no data module, decode val, compare with val/bleu."""
    module = load_checkpoint(trained_run["best_checkpoint"])
    config = compose_config(Path(trained_run["run_dir"]), [])
    from hydra.utils import instantiate

    corpus = instantiate(config.data.corpus)
    datamodule = Seq2SeqDataModule(
        corpus, src_tokenizer=module.src_tokenizer, tgt_tokenizer=module.tgt_tokenizer
    )
    datamodule.setup()
    hypotheses: list[str] = []
    references: list[str] = []
    for batch in datamodule.val_dataloader():
        hypotheses += module.translate_batch(batch)
        references += batch.tgt_text
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert bleu == pytest.approx(trained_run["best_val_bleu"], abs=1e-4)


def test_checkpoint_loads_without_pickle(trained_run: dict[str, Any]) -> None:
    checkpoint = torch.load(trained_run["best_checkpoint"], weights_only=True)
    assert "seq2seq" in checkpoint


def test_unknown_option_and_key_fail_with_hydra_message(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for override, expected in [
        ("attention=foo", "Available options in 'attention'"),
        ("model.hiden_size=3", "hiden_size"),
        ("model.decoder=foo", "Available options in 'model.decoder'"),
    ]:
        completed = subprocess.run(
            [sys.executable, "train.py", override, f"hydra.run.dir={tmp_path}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode != 0
        assert expected in completed.stderr
        assert "Traceback" not in completed.stderr


def test_unknown_attention_lists_every_choice(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "train.py", "attention=foo", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # One choice a line, tab-indented, under Hydra's heading: "dot" must be a line of its own, not
    # a part of "scaled_dot".
    listed = completed.stderr.split("Available options in 'attention':\n")[1].split("Config")[0]
    assert sorted(line.strip() for line in listed.splitlines()) == sorted(ATTENTIONS)


@pytest.mark.parametrize(
    ("overrides", "fused"),
    [
        ([], True),  # Adam in full precision: the fused kernel
        (["trainer.precision=bf16-mixed"], None),  # mixed precision: Adam's own default
        (["optim.optimizer.fused=false"], False),  # an explicit choice is kept
        (["optim.optimizer.fused=true", "trainer.precision=bf16-mixed"], True),
        (["optim.optimizer._target_=torch.optim.RMSprop"], None),  # no fused kernel: no keyword
    ],
)
def test_fused_null_chooses_the_fused_optimizer_in_full_precision(
    overrides: list[str], fused: bool | None, tmp_path: Path
) -> None:
    factory = build_optimizer(compose_config(tmp_path, overrides))
    assert factory.keywords.get("fused") is fused
    optimizer = factory([torch.nn.Parameter(torch.zeros(2))])
    assert optimizer.defaults.get("fused") in ((None, False) if fused is None else (fused,))


def test_resuming_may_switch_the_fused_optimizer_but_not_the_learning_rate(tmp_path: Path) -> None:
    saved = compose_config(tmp_path, [])
    fused_off = compose_config(tmp_path, ["optim.optimizer.fused=false"])
    assert changed_keys(saved, fused_off) == []
    other_rate = compose_config(tmp_path, ["optim.optimizer.lr=0.1"])
    assert changed_keys(saved, other_rate) == [("optim.optimizer.lr", 0.002, 0.1)]


def train_batches_per_epoch(config: DictConfig, epochs: int) -> list[int]:
    """How many training batches each of the first ``epochs`` epochs of ``config``'s run has."""
    from hydra.utils import instantiate

    datamodule = instantiate(config.data.module)  # the run's own, batches and seed included
    datamodule.setup("fit")
    sampler = datamodule._sampler("train", datamodule.batch_size, shuffle=True)
    counts = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.append(len(list(sampler)))
    return counts


def test_token_budget_epochs_of_different_lengths_each_validate_and_train_every_batch(
    tmp_path: Path,
) -> None:
    # Under data.max_tokens the number of batches differs between epochs. Lightning counts them
    # once per load: without a reload every epoch, an epoch one batch short never validated and
    # one batch long lost its last batch.
    overrides = ["data.max_tokens=120", "data.bucket_batches=2", "trainer.max_epochs=4",
                 "test_after_training=false", "trainer.log_every_n_steps=10"]  # fmt: skip
    counts = train_batches_per_epoch(compose_config(tmp_path, overrides), 4)
    assert len(set(counts)) > 1 and counts[1:] != counts[:1] * 3, counts  # the case at hand
    run_training(tmp_path, overrides)
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/bleu")]
    assert [int(row["epoch"]) for row in rows] == [0, 1, 2, 3]
    # The step of each epoch's validation (global step - 1): every batch of every epoch trained.
    ends = [sum(counts[: epoch + 1]) - 1 for epoch in range(4)]
    assert [int(row["step"]) for row in rows] == ends


def test_a_run_that_max_steps_ends_in_mid_epoch_validates_and_checkpoints_its_last_step(
    tmp_path: Path,
) -> None:
    # Lightning validates at an epoch's end; at max_steps it would just stop, leaving the updates
    # since the last epoch's end unscored and out of best.ckpt and the kept checkpoints.
    overrides = ["trainer.max_epochs=10", "test_after_training=false", "checkpoint.keep_last=2"]
    counts = train_batches_per_epoch(compose_config(tmp_path, overrides), 2)
    per_epoch = counts[0]
    max_steps = per_epoch + per_epoch // 2  # in the middle of the second epoch
    assert counts == [per_epoch] * 2 and per_epoch >= 2 and max_steps % per_epoch, counts
    run_training(tmp_path, [*overrides, f"+trainer.max_steps={max_steps}"])
    with open(tmp_path / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/bleu")]
    # Logged at global step - 1: the first epoch's end, then the step max_steps stopped at.
    assert [int(row["step"]) for row in rows] == [per_epoch - 1, max_steps - 1]
    assert [int(row["epoch"]) for row in rows] == [0, 1]
    kept = sorted(path.name for path in (tmp_path / "checkpoints").glob("val-step=*.ckpt"))
    assert kept == sorted([f"val-step={per_epoch}.ckpt", f"val-step={max_steps}.ckpt"])
    best = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    scores = [float(row["val/bleu"]) for row in rows]
    # best.ckpt is whichever validation scored higher, the mid-epoch one included.
    assert best["global_step"] == (max_steps if scores[1] > scores[0] else per_epoch)


@pytest.mark.parametrize(
    ("overrides", "scoring"),
    [
        (["model=transformer"], "DotProductAttention"),  # the paper's, scaled
        (["model=transformer", "attention=additive"], "AdditiveAttention"),  # the command wins
        (["model=transformer", "attention=general"], "GeneralAttention"),
        ([], "AdditiveAttention"),  # the RNN models' default is unchanged
    ],
)
def test_the_transformer_defaults_to_scaled_dot_and_the_command_line_wins(
    overrides: list[str], scoring: str
) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = compose("config", overrides=overrides)  # no SMALL: its RNN sizes
    assert config.attention._target_ == f"seq2seq.attention.{scoring}"
    if scoring == "DotProductAttention":
        assert config.attention.scaled is True


# Enough sentences that two epochs learn to attend at all (the parallel Luong decoder: seconds).
GUIDED = ["data.train_size=1000", "trainer.max_epochs=2", "test_after_training=false"]


def test_guided_alignment_pulls_the_attention_onto_the_gold_links(tmp_path: Path) -> None:
    """optim.alignment_loss_weight adds the alignment cross-entropy to the loss the optimizer
    sees: from the same start, the attention of the guided run lands on the gold links far more
    often (val/aer), and train/alignment_loss is logged."""
    settings = [*GUIDED, "model.decoder=luong", "attention=dot", "optim.optimizer.lr=0.01"]
    runs = {
        weight: run_training(
            tmp_path / str(weight), [*settings, f"optim.alignment_loss_weight={weight}"]
        )["metrics"]
        for weight in (0.0, 5.0)
    }
    assert runs[5.0]["val/aer"] < runs[0.0]["val/aer"] - 0.2
    assert runs[5.0]["train/alignment_loss"] > 0 and "train/alignment_loss" not in runs[0.0]


def test_guided_alignment_without_gold_alignments_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    root.mkdir()
    for split in ("train", "val", "test"):
        (root / f"{split}.xx").write_text("a b c\nb c\n" * 20, encoding="utf-8")
        (root / f"{split}.yy").write_text("c b a\nc b\n" * 20, encoding="utf-8")
    data = [
        "data=parallel", f"data.root={root}", "data.src_lang=xx", "data.tgt_lang=yy",
        "data.min_frequency=1", "optim.alignment_loss_weight=1",
    ]  # fmt: skip
    config = compose_plain([f"run_dir={tmp_path / 'run'}", *data, "logger=csv"])
    with pytest.raises(ConfigError, match=r"optim\.alignment_loss_weight=1\.0 needs gold word"):
        train(config)


def test_a_run_from_before_the_new_keys_resumes_with_todays_config(tmp_path: Path) -> None:
    """Runs written before attention.initial_temperature, optim.alignment_loss_weight and
    model.num_heads (then attention.num_heads) existed compare equal to today's defaults, so they
    resume; a setting they did change still counts."""
    config = compose_config(tmp_path, [])
    saved = OmegaConf.to_container(config, resolve=False)
    assert isinstance(saved, dict)
    del saved["attention"]["initial_temperature"], saved["optim"]["alignment_loss_weight"]
    del saved["model"]["num_heads"]
    saved["attention"]["num_heads"] = 1
    assert changed_keys(OmegaConf.create(saved), config) == []
    saved["attention"]["num_heads"] = 4  # an old multi-head run: not today's single head
    assert changed_keys(OmegaConf.create(saved), config) == [("attention.num_heads", 4, 1)]


def test_a_file_corpus_with_gold_alignments_gets_aer_and_guided_training(tmp_path: Path) -> None:
    """data.align: the toy task written as files with its Pharaoh alignments trains with
    optim.alignment_loss_weight and scores val/aer, as the generated task does; with a tokenizer
    whose tokens are not the alignment's words it is refused."""
    data = write_toy_files(tmp_path / "toy", train=300, val=40, test=40)
    files = [
        "data=parallel", f"data.root={data}", "data.src_lang=src", "data.tgt_lang=tgt",
        "data.align=align", "data.min_frequency=1", "data.batch_size=32",
    ]  # fmt: skip
    model = ["model.hidden_size=32", "model.embedding_size=16", "logger=csv"]
    overrides = [f"run_dir={tmp_path / 'run'}", *files, *model, "trainer.max_epochs=1"]
    with pytest.raises(ConfigError, match=r"data\.align=align .* data\.tokenizer=word"):
        train(compose_plain(overrides))
    overrides += ["data.tokenizer=whitespace", "optim.alignment_loss_weight=1"]
    metrics = train(compose_plain(overrides))["metrics"]
    assert 0 <= metrics["val/aer"] <= 1 and 0 <= metrics["test/aer"] <= 1
    assert metrics["train/alignment_loss"] > 0


def test_kept_checkpoints_keep_the_state_key_of_runs_written_before() -> None:
    """Their callback state is stored under this key in every checkpoint: the format of
    Lightning's own keys, which runs from before wrote, so that resuming them restores it."""
    from seq2seq.pipeline.callbacks import KeptCheckpoints

    kept = KeptCheckpoints(filename="top-step={step}", monitor="val/bleu", mode="max")
    assert kept.state_key == "KeptCheckpoints{'monitor': 'val/bleu', 'filename': 'top-step={step}'}"


# The generated toy tasks of conf/data/ (no files): every one composes and trains.
TOY_TASKS = sorted(
    path.stem
    for path in (CONF / "data").glob("*.yaml")
    if "seq2seq.data.toy." in path.read_text(encoding="utf-8")
)


@pytest.mark.parametrize("task", TOY_TASKS)
def test_every_toy_task_composes_trains_and_scores_alignments(tmp_path: Path, task: str) -> None:
    result = run_training(tmp_path, [f"data={task}", "trainer.fast_dev_run=true"])
    metrics = result["metrics"]
    assert metrics["train/loss"] > 0 and 0 <= metrics["val/bleu"] <= 100
    assert 0 <= metrics["val/aer"] <= 1  # every toy task has gold alignments


def test_average_checkpoints_cli_writes_the_mean_that_every_script_takes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_training(run_dir, ["trainer.max_epochs=3", "checkpoint.keep_last=2"])
    out = tmp_path / "avg.ckpt"
    averaged = subprocess.run(
        [sys.executable, "scripts/average_checkpoints.py", "--run", str(run_dir), "--last", "2",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert averaged.returncode == 0, averaged.stderr[-2000:]
    kept = sorted((run_dir / "checkpoints").glob("val-step=*.ckpt"))
    assert len(kept) == 2
    states = [torch.load(path, weights_only=True)["state_dict"] for path in kept]
    mean = torch.load(out, weights_only=True)["state_dict"]
    for name, value in mean.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, (states[0][name] + states[1][name]) / 2)
    sentences = tmp_path / "in.txt"
    sentences.write_text("the dog sees a cat .\n", encoding="utf-8")
    translated = subprocess.run(
        [sys.executable, "scripts/translate.py", "--model", str(out), "--input", str(sentences)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert translated.returncode == 0 and len(translated.stdout.splitlines()) == 1


def validations(run_dir: Path) -> list[dict[str, str]]:
    """The metrics.csv rows of the run's validations, in order."""
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as file:
        return [row for row in csv.DictReader(file) if row.get("val/bleu")]


def test_early_stopping_fires_when_val_bleu_stops_improving(tmp_path: Path) -> None:
    """With a learning rate of 0 val/bleu never improves: patience 1 stops the run after its
    second validation, of max_epochs' 4."""
    frozen = ["optim.optimizer.lr=0.0", "optim.scheduler=null", "trainer.max_epochs=4"]
    run_training(tmp_path / "stopped", [*frozen, "early_stopping.patience=1"])
    run_training(tmp_path / "full", frozen)
    assert len(validations(tmp_path / "stopped")) == 2
    assert len(validations(tmp_path / "full")) == 4


def test_max_time_stops_a_run_and_validates_where_it_stops(tmp_path: Path) -> None:
    """trainer.max_time ends a run long before max_epochs; its last step is validated and
    checkpointed, as for max_steps."""
    run_dir = tmp_path / "run"
    result = run_training(
        run_dir,
        [
            "data.train_size=2000",
            "trainer.max_epochs=1000",
            "trainer.max_time=00:00:00:03",
            "trainer.log_every_n_steps=5",
        ],
    )
    rows = validations(run_dir)
    assert 1 <= len(rows) < 1000 and int(rows[-1]["epoch"]) < 999
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    # The last validation scored the run's last update (logged at step N - 1 of N updates).
    assert last["global_step"] == int(rows[-1]["step"]) + 1
    assert result["best_checkpoint"] is not None
    # The Timer stops the run in its on_train_batch_end: the stopping step's row has that step's
    # own diagnostics (those the validation after it measures on the same weights), not a repeat
    # of the last logging step's.
    with open(run_dir / "metrics.csv", newline="", encoding="utf-8") as file:
        *_, before, stop = [row for row in csv.DictReader(file) if row.get("train/loss")]
    assert stop["step"] == rows[-1]["step"]
    assert stop["attn/entropy"] == rows[-1]["attn/entropy"]
    assert stop["attn/score_std"] == rows[-1]["attn/score_std"]
    assert stop["train/loss"] != before["train/loss"]  # logged once the Timer has decided


@pytest.mark.parametrize(
    ("max_time", "seconds"),
    [
        ("00:01:30:00", 5400),
        ("1:0:0:2", 86402),
        ({"hours": 1, "minutes": 30}, 5400),
        ({"seconds": 0.5}, 0.5),
        ({"weeks": 1, "milliseconds": 500}, 604800.5),
    ],
)
def test_max_time_takes_the_timers_forms(max_time: object, seconds: float) -> None:
    from seq2seq.pipeline.checks import training_time

    assert training_time(OmegaConf.create({"t": max_time}).t).total_seconds() == seconds


@pytest.mark.parametrize(
    "max_time",
    [
        *[
            5,
            "abc",
            "1:2:3",
            "0:0:-1:0",
            "0:0:xx:0",
            "0:0:0:\u00b2",
            "00:00:00:00",
            "minutes:30",  # what the shell passes of an unquoted {hours:1,minutes:30}
        ],
        *[{}, {"hour": 1}, {"hours": -1}, {"hours": True}, {"hours": 0}],
    ],
)
def test_a_bad_max_time_is_a_config_error_naming_the_key(max_time: object) -> None:
    from seq2seq.pipeline.checks import check_max_time

    cfg = OmegaConf.create({"trainer": {"max_time": max_time}})
    with pytest.raises(
        ConfigError, match=r"trainer\.max_time must be a training time .* got "
    ) as info:
        check_max_time(cfg)
    assert "quoted on the command line: trainer.max_time='{hours:1,minutes:30}'" in str(info.value)


@pytest.mark.parametrize("max_time", ["999999999999:0:0:0", "0:0:0:99999999999999", {"days": 1e10}])
def test_a_max_time_too_long_for_a_timedelta_says_so(max_time: object) -> None:
    from seq2seq.pipeline.checks import check_max_time

    cfg = OmegaConf.create({"trainer": {"max_time": max_time}})
    with pytest.raises(ConfigError, match=r"trainer\.max_time must be at most 999,999,999 days"):
        check_max_time(cfg)


def test_a_max_time_yaml_read_as_a_number_is_told_to_be_quoted(tmp_path: Path) -> None:
    """YAML 1.1 reads an unquoted 1:30:00:00 as 324000 (base 60); refused before the run starts."""
    cfg = OmegaConf.create("trainer:\n  max_time: 1:30:00:00\n")
    assert cfg.trainer.max_time == 324000
    with pytest.raises(ConfigError, match=r'got 324000 \(in a YAML file, quote it: max_time: "'):
        train(compose_config(tmp_path / "run", [f"trainer.max_time={cfg.trainer.max_time}"]))
    assert not (tmp_path / "run").exists()


def test_val_loss_stays_the_plain_cross_entropy_under_label_smoothing(tmp_path: Path) -> None:
    """optim.label_smoothing changes the training targets only: the logged val/loss equals the
    plain token cross-entropy of the validation split, recomputed from last.ckpt (written at the
    epoch's end, after that validation), and differs from the smoothed one."""
    run_dir = tmp_path / "run"
    config = compose_config(run_dir, ["trainer.max_epochs=1", "optim.label_smoothing=0.3"])
    train(config)
    logged = float(validations(run_dir)[-1]["val/loss"])
    module = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    datamodule = instantiate(config.data.module)
    datamodule.setup("fit")
    totals = {0.0: 0.0, 0.3: 0.0}
    tokens = 0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            logits, _ = module.model(batch.src, batch.src_lens, batch.tgt_in)
            for epsilon in totals:
                totals[epsilon] += float(torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0,
                    reduction="sum", label_smoothing=epsilon,
                ))  # fmt: skip
            tokens += int(batch.tgt_lens.sum())
    assert logged == pytest.approx(totals[0.0] / tokens, rel=1e-4)
    assert abs(logged - totals[0.3] / tokens) > 1e-2


def test_a_notebook_gets_tqdm_bars_one_line_an_epoch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """In a Jupyter kernel, tqdm's text bar (Rich's needs ipywidgets there, and warns at every
    bar without them), with the sanity check's and validation's bars off; elsewhere, and with
    trainer.enable_progress_bar=false, Lightning's own choice."""
    from seq2seq.pipeline import callbacks

    assert callbacks.progress_bar(compose_plain([])) == []  # not in a notebook
    monkeypatch.setattr(callbacks, "in_notebook", lambda: True)
    [bar] = callbacks.progress_bar(compose_plain([]))
    assert isinstance(bar, callbacks.NotebookProgressBar)
    assert callbacks.progress_bar(compose_plain(["trainer.enable_progress_bar=false"])) == []
    overrides = [*TINY, "trainer.enable_progress_bar=true", "logger=csv",
                 "test_after_training=false", f"run_dir={tmp_path}"]  # fmt: skip
    train(compose_plain(overrides))
    shown = capsys.readouterr().out
    assert "Epoch 1: 100%" in shown and "val/bleu=" in shown
    assert "Validation" not in shown and "Sanity Checking" not in shown


def test_the_model_summary_lists_parameters_and_no_flops() -> None:
    """Lightning's summary columns as it gathers them, without its FLOPs (all 0 without an
    example_input_array): the table and the parameter totals only, on Lightning's logger."""
    import io
    import logging

    from pytorch_lightning.utilities.model_summary import summarize

    from seq2seq.pipeline.callbacks import SUMMARY_LOG, ParameterSummary

    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    summary = summarize(pl_module_of(module), max_depth=1)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    SUMMARY_LOG.addHandler(handler)
    try:
        ParameterSummary.summarize(
            summary._get_summary_data(), summary.total_parameters,
            summary.trainable_parameters, summary.model_size, summary.total_training_modes,
            summary.total_flops,
        )  # fmt: skip
    finally:
        SUMMARY_LOG.removeHandler(handler)
    text = stream.getvalue()
    assert "FLOPs" not in text and "Flops" not in text and "Mode" not in text
    assert "Params" in text and "net" in text
    assert "26 trainable parameters of 26" in text


def pl_module_of(module: torch.nn.Module) -> Any:
    import pytorch_lightning as pl

    class Holder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = module

    return Holder()
