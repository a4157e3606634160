"""benchmarks/joey.py: Joey NMT's Transformer is ours, of the same size and trained the same way.

These check the config mapping without Joey NMT (CI has none); the last test builds Joey's model
where it is installed (its own environment, docs/performance.md)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.benchmark import (
    BenchmarkOptions,
    chosen_peers,
    compose_config,
    model_description,
)
from benchmarks.joey import joey_config, joeynmt_available
from benchmarks.report import _peer_attention, markdown_table, peer_report
from seq2seq.errors import ConfigError
from seq2seq.training.schedules import InverseSquareRootSchedule


def reverse_files(root: Path, train_sentences: int = 130) -> list[str]:
    """A few lines of the peers' reverse task in ``root``; the data overrides that read them."""
    for split, count in [("train", train_sentences), ("dev", 4), ("test", 4)]:
        (root / f"{split}.src").write_text("w1 w2 w3\n" * count)
        (root / f"{split}.trg").write_text("w3 w2 w1\n" * count)
    return [
        "data=parallel", f"data.root={root}", "data.train=train", "data.val=dev",
        "data.test=test", "data.src_lang=src", "data.tgt_lang=trg",
    ]  # fmt: skip


# experiment=bench_reverse_transformer: bench_reverse's data, batch, clip and epochs with
# model=transformer's own sizes and optimizer (docs/performance.md).
TRANSFORMER_TASK = ["experiment=bench_reverse_transformer"]


def transformer(tmp_path: Path, *overrides: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our resolved config with ``overrides``, and Joey NMT's of the same work."""
    config = compose_config(
        [*reverse_files(tmp_path), *TRANSFORMER_TASK, *overrides], tmp_path / "run"
    )
    return config, joey_config(config, tmp_path / "work", val_check_interval=1.0)


# Every size and training setting the mapping reads, away from its default.
CHANGED = [
    "model.d_model=64", "model.num_heads=8", "model.d_ff=96", "model.encoder_layers=2",
    "model.decoder_layers=4", "model.dropout=0.3", "model.norm_first=true",
    "model.tie_embeddings=false", "optim.label_smoothing=0.2", "optim.scheduler.warmup_steps=50",
    "optim.optimizer.lr=0.002", "+optim.optimizer.betas=[0.9,0.98]", "optim.grad_clip=null",
    "data.batch_size=32", "trainer.max_epochs=5",
]  # fmt: skip


# [] is conf/model/transformer.yaml as it is.
@pytest.mark.parametrize("overrides", [[], CHANGED], ids=["defaults", "changed"])
def test_joey_transformer_is_ours_of_the_same_size(tmp_path: Path, overrides: list[str]) -> None:
    config, joey = transformer(tmp_path, *overrides)
    model, optim = config["model"], config["optim"]
    joey_model, training = joey["model"], joey["training"]
    for side, layers in [("encoder", "encoder_layers"), ("decoder", "decoder_layers")]:
        stack = joey_model[side]
        assert stack["type"] == "transformer"
        assert stack["num_layers"] == model[layers]
        assert (stack["hidden_size"], stack["ff_size"]) == (model["d_model"], model["d_ff"])
        assert stack["num_heads"] == model["num_heads"]
        assert stack["dropout"] == stack["embeddings"]["dropout"] == model["dropout"]
        assert stack["layer_norm"] == ("pre" if model["norm_first"] else "post")
        # Embeddings of size D, × √D before the positions are added, as ours.
        assert stack["embeddings"]["embedding_dim"] == model["d_model"]
        assert stack["embeddings"]["scale"] is True
    # Ours: one embedding per side; the target's is the output layer when tie_embeddings.
    assert joey_model["tied_embeddings"] is False
    assert joey_model["tied_softmax"] is model["tie_embeddings"]
    assert joey_model["embed_initializer"] == "normal"
    assert joey_model["embed_init_weight"] == pytest.approx(model["d_model"] ** -0.5)

    assert training["optimizer"] == "adam"
    assert training["adam_betas"] == list(optim["optimizer"].get("betas", [0.9, 0.999]))
    assert training["label_smoothing"] == optim["label_smoothing"]
    assert training["clip_grad_norm"] == optim["grad_clip"]  # None: no clipping, in both
    assert training["normalization"] == "tokens"  # ours divides the summed loss by tokens
    assert (training["batch_size"], training["batch_type"]) == (
        config["data"]["batch_size"],
        "sentence",
    )
    assert training["epochs"] == config["trainer"]["max_epochs"]
    assert training["scheduling"] == "warmupinversesquareroot"
    assert training["learning_rate"] == optim["optimizer"]["lr"]  # Joey 2.3 peaks there
    assert training["learning_rate_warmup"] == optim["scheduler"]["warmup_steps"]
    assert training["learning_rate_min"] == 0.0  # Joey stops training below it


def joey_rates(training: dict[str, Any], updates: int) -> list[float]:
    """The rate of each of Joey NMT 2.3's first ``updates`` updates under ``training``: the
    optimizer's learning_rate for the first; after update n its scheduler steps to
    WarmupInverseSquareRootScheduler's rate(n) (joeynmt/builders.py), floored at
    learning_rate_min, which the next update uses. Its peak is learning_rate: Joey 2.3's
    parse_train_args keeps no learning_rate_peak, so build_scheduler falls back to it
    (``test_joey_rates_are_joeys_own`` checks this model against Joey's code)."""
    peak, warmup = training["learning_rate"], training["learning_rate_warmup"]

    def rate(step: int) -> float:
        if step < warmup:
            return max(step * peak / warmup, training["learning_rate_min"])
        return max(peak * math.sqrt(warmup / step), training["learning_rate_min"])

    return [training["learning_rate"]] + [rate(n) for n in range(1, updates)]


def our_rates(optim: dict[str, Any], updates: int) -> list[float]:
    """The rate of each of our first ``updates`` updates (InverseSquareRootSchedule)."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=optim["optimizer"]["lr"])
    schedule = InverseSquareRootSchedule(
        optimizer,
        optim["scheduler"]["warmup_steps"],
        optim["scheduler"]["warmup_init_lr"],
    )
    rates = []
    for _ in range(updates):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_joey_learning_rates_follow_ours(tmp_path: Path) -> None:
    config, joey = transformer(tmp_path, "optim.scheduler.warmup_steps=40")
    theirs, ours = joey_rates(joey["training"], 200), our_rates(config["optim"], 200)
    peak = config["optim"]["optimizer"]["lr"]
    assert theirs[0] == pytest.approx(peak)  # Joey's first update runs at its peak: one update
    assert max(theirs) == pytest.approx(max(ours)) == pytest.approx(peak)
    # From the second, one update behind ours (Joey steps its schedule after each update):
    # within 1/40 of the peak (and our warm-up's start) during the warm-up, the same after it.
    start = config["optim"]["scheduler"]["warmup_init_lr"]
    assert all(abs(a - b) <= peak / 40 + start for a, b in zip(theirs[1:], ours[1:], strict=True))
    assert theirs[1:] == pytest.approx(ours[:-1], rel=0.03)
    assert theirs[-1] == pytest.approx(ours[-1], rel=0.01)
    assert theirs[-1] == pytest.approx(peak * math.sqrt(40 / 200), rel=0.01)


def test_joey_warns_where_its_transformer_cannot_be_ours(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="benchmarks.joey"):
        transformer(tmp_path)
    assert not caplog.records  # the default setup is comparable as it is
    with caplog.at_level(logging.WARNING, logger="benchmarks.joey"):
        transformer(
            tmp_path, "attention=additive", "model.attention_dropout=0.2", "model.init=pytorch"
        )
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "attention=scaled_dot" in messages
    assert "model.attention_dropout=0.2" in messages
    assert "model.init=xavier" in messages
    # A constant rate for a schedule Joey has no counterpart of, with a warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="benchmarks.joey"):
        _, joey = transformer(tmp_path, "optim/scheduler=plateau")
    assert (joey["training"]["scheduling"], joey["training"]["decrease_factor"]) == (
        "exponential",
        1.0,
    )
    assert "no counterpart" in caplog.text


def test_joey_rnn_config_is_as_before(tmp_path: Path) -> None:
    """The RNN comparison keeps PEERS.md's setup: recurrent GRUs, a constant rate, the loss per
    sentence."""
    config = compose_config(
        ["experiment=bench_reverse", *reverse_files(tmp_path), "attention=dot"], tmp_path / "run"
    )
    joey = joey_config(config, tmp_path / "work", val_check_interval=1.0)
    model, training = joey["model"], joey["training"]
    assert (model["encoder"]["type"], model["encoder"]["rnn_type"]) == ("recurrent", "gru")
    assert (model["encoder"]["hidden_size"], model["decoder"]["hidden_size"]) == (128, 256)
    assert model["decoder"]["attention"] == "luong"
    assert model["encoder"]["embeddings"] == {"embedding_dim": 128, "scale": False, "dropout": 0.1}
    assert (model["tied_embeddings"], model["tied_softmax"]) == (False, False)
    assert (training["scheduling"], training["decrease_factor"]) == ("exponential", 1.0)
    assert (training["learning_rate"], training["clip_grad_norm"]) == (0.001, 5.0)
    assert (training["normalization"], training["label_smoothing"]) == ("batch", 0.0)
    assert _peer_attention("joeynmt", joey) == "luong"


def test_the_transformer_experiment_runs_the_rnn_experiments_task(tmp_path: Path) -> None:
    rnn = compose_config(["experiment=bench_reverse", *reverse_files(tmp_path)], tmp_path / "a")
    ours, _ = transformer(tmp_path)
    assert ours["data"] == rnn["data"]
    # More epochs, so that both Transformers reach BLEU 95; the rest of the trainer as it is.
    assert {**ours["trainer"], "max_epochs": None} == {**rnn["trainer"], "max_epochs": None}
    assert ours["trainer"]["max_epochs"] > rnn["trainer"]["max_epochs"]
    assert (ours["threads"], ours["seed"], ours["decoding"]) == (
        rnn["threads"], rnn["seed"], rnn["decoding"],
    )  # fmt: skip
    assert ours["optim"]["grad_clip"] == rnn["optim"]["grad_clip"]
    assert ours["model"]["_target_"] == "seq2seq.models.Transformer"
    assert ours["model"]["encoder_layers"] == 3  # the Transformer's own, not bench_reverse's 1
    assert ours["optim"]["scheduler"]["warmup_steps"] == 400


def test_the_rnn_experiment_is_refused_for_the_transformer(tmp_path: Path) -> None:
    # experiment=bench_reverse would give our Transformer encoder_layers=1, no warm-up and keys
    # its constructor does not take.
    overrides = ["experiment=bench_reverse", *reverse_files(tmp_path), "model=transformer"]
    with pytest.raises(ConfigError, match=r"RNN models' model\.embedding_size"):
        compose_config(overrides, tmp_path / "run")


def test_joey_is_the_transformer_peer_and_opennmt_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("benchmarks.benchmark.joeynmt_available", lambda: True)
    monkeypatch.setattr("benchmarks.benchmark.opennmt_available", lambda python: True)
    config, _ = transformer(tmp_path)
    assert chosen_peers(BenchmarkOptions(peer="auto"), config) == ["joeynmt"]
    assert chosen_peers(BenchmarkOptions(peer="joeynmt"), config) == ["joeynmt"]
    for peer in ("opennmt", "all"):
        with pytest.raises(ConfigError, match="OpenNMT-py is compared with our RNN models only"):
            chosen_peers(BenchmarkOptions(peer=peer), config)


def test_the_report_names_the_model_kind_sizes_and_parameters(tmp_path: Path) -> None:
    config, joey = transformer(tmp_path)
    description = model_description(config)
    assert (description["kind"], description["decoder"]) == (
        "transformer",
        "seq2seq.models.Transformer",
    )
    assert description["sizes"]["d_model"] == 128 and description["sizes"]["d_ff"] == 512
    ours_run = {"train_tgt_tok_per_s": 2000.0, "parameters": 1_402_422}
    joey_run = {"train_tgt_tok_per_s": 1000.0, "parameters": 1_402_368}
    report: dict[str, Any] = {
        "ours_runs": [ours_run],
        "model": description,
        "bleu_target": 95.0,
        "machine": {"cpu": "c"},
        **ours_run,
    }
    peer = peer_report("joeynmt", _peer_attention("joeynmt", joey), [joey_run], report)
    assert peer["ratios"] == {"train_tgt_tok_per_s": 2.0}  # sizes are shown, not compared
    table = markdown_table({**report, "peers": [peer]}, {})
    assert "Model: transformer (d_model 128, num_heads 4, d_ff 512, encoder_layers 3" in table
    header = "| seq2seq (Transformer, DotProductAttention) | Joey NMT (Transformer, scaled dot) |"
    assert header in table
    assert "| parameters | 1,402,422 | 1,402,368 | |" in table


@pytest.mark.skipif(not joeynmt_available(), reason="needs joeynmt==2.3.0 (its own environment)")
def test_joey_builds_our_transformer_less_our_output_bias(tmp_path: Path) -> None:
    from joeynmt.config import parse_global_args
    from joeynmt.prediction import prepare
    from omegaconf import OmegaConf

    from seq2seq.inference.bundle import build_model
    from seq2seq.pipeline import build_model_config

    for tie in ("true", "false"):
        config, joey = transformer(tmp_path, "model.d_model=32", f"model.tie_embeddings={tie}")
        Path(joey["model_dir"]).mkdir(parents=True, exist_ok=True)
        theirs, *_ = prepare(parse_global_args(joey, rank=0, mode="train"), rank=0, mode="train")
        vocab = len(theirs.trg_vocab)  # <unk> <pad> <s> </s> and the words, as ours
        model_config = build_model_config(OmegaConf.create(config), len(theirs.src_vocab), vocab)
        ours = build_model(model_config, kernels="off")
        count = sum(parameter.numel() for parameter in ours.parameters())
        # Ours has a bias on the output layer; Joey's has none.
        assert sum(parameter.numel() for parameter in theirs.parameters()) == count - vocab


def test_joey_rates_are_joeys_own(tmp_path: Path) -> None:
    # joey_rates above models Joey's schedule; this checks the model against Joey's own parser
    # and scheduler (a peak its parser dropped once left Joey at 2.6e-6 for a whole benchmark).
    pytest.importorskip("joeynmt", reason="needs joeynmt==2.3.0 (its own environment)")
    from joeynmt.builders import build_scheduler
    from joeynmt.config import parse_train_args

    _, joey = transformer(tmp_path, "optim.scheduler.warmup_steps=40")
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=joey["training"]["learning_rate"])
    args = parse_train_args(joey["training"], mode="train")
    scheduler, step_at = build_scheduler(
        cfg=args._asdict(), scheduler_mode="min", optimizer=optimizer, hidden_size=128
    )
    assert step_at == "step"
    rates = []
    for step in range(200):  # as TrainManager: update, then scheduler.step(steps), steps += 1
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step(step)
    assert rates == pytest.approx(joey_rates(joey["training"], 200))
