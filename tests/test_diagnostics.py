"""Attention diagnostics: statistics against direct formulas, the training callback's metrics
against a recomputation from the checkpoint, the experiments' claims, and the script."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from benchmarks.attention_experiments import (
    ONE_HEAD_ERROR_BOUND,
    Settings,
    bilinear_accuracy_bound,
    heads_block,
    measure_dimension,
    measure_heads,
    measure_positionwise,
    measure_saturation,
    retrieval_batch,
    xor_accuracy,
    xor_batch,
)
from benchmarks.attention_report import update_docs
from seq2seq.analysis.diagnostics import (
    attention_statistics,
    coverage_metrics,
    entropy,
    gradient_norm,
    model_attention_statistics,
    softmax_jacobian_norm,
    teacher_forced_queries,
)
from seq2seq.attention import (
    AdditiveAttention,
    DotProductAttention,
    GeneralAttention,
    masked_softmax,
)
from seq2seq.cli import run
from seq2seq.models.model import Seq2Seq
from seq2seq.pipeline import load_checkpoint, train
from tests.scoring import SCORING_FUNCTIONS, scoring_factory

ROOT = Path(__file__).resolve().parents[1]


# ---- the statistics ------------------------------------------------------------------------------


def test_entropy_and_jacobian_of_uniform_and_one_hot_rows() -> None:
    uniform, one_hot = torch.full((5,), 0.2), torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])
    assert float(entropy(uniform)) == pytest.approx(math.log(5))
    assert float(entropy(one_hot)) == 0.0
    # diag(w) - wwᵀ for uniform w over n keys has squared Frobenius norm 1/n - 1/n².
    assert float(softmax_jacobian_norm(uniform)) == pytest.approx(math.sqrt(0.2 - 0.04))
    assert float(softmax_jacobian_norm(one_hot)) == 0.0


def test_softmax_jacobian_norm_matches_autograd() -> None:
    scores = torch.randn(6, dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), scores)
    expected = float(jacobian.norm())
    assert float(softmax_jacobian_norm(torch.softmax(scores, -1))) == pytest.approx(expected)


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
def test_statistics_use_valid_pairs_only_and_match_a_direct_computation(name: str) -> None:
    torch.manual_seed(0)
    # A temperature other than 1, which the statistics must see through.
    settings = {"num_hiddens": 8, "temperature": 0.7}
    attention = scoring_factory(name, settings)(query_size=6, key_size=6)
    queries, keys = torch.randn(3, 4, 6), torch.randn(3, 5, 6)
    valid_lens = torch.tensor([5, 2, 3])
    query_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    stats = attention_statistics(
        attention, queries, attention.project_keys(keys), valid_lens, query_mask
    )

    # The same numbers, one valid row at a time.
    rows, pairs, saturation = [], [], []
    for b in range(3):
        n = int(valid_lens[b])
        for i in range(4):
            if query_mask[b, i]:
                logits = attention.logits(
                    queries[b : b + 1, i : i + 1], attention.project_keys(keys[b : b + 1, :n])
                )[0, 0]
                rows.append(logits.double())
                pairs.extend(logits.double().tolist())
                if isinstance(attention, AdditiveAttention):
                    x = attention.preactivations(
                        queries[b : b + 1, i : i + 1], attention.project_keys(keys[b : b + 1, :n])
                    )
                    saturation.extend((x.abs() > 2).double().mean(-1).flatten().tolist())
    weights = [torch.softmax(row, -1) for row in rows]
    all_pairs = torch.tensor(pairs, dtype=torch.float64)
    assert stats.score_mean == pytest.approx(float(all_pairs.mean()))
    assert stats.score_std == pytest.approx(float(all_pairs.std(correction=0)))
    assert stats.score_row_std == pytest.approx(
        sum(float(row.std(correction=0)) for row in rows) / len(rows)
    )
    assert stats.entropy == pytest.approx(
        sum(float(-(w * w.log()).sum()) for w in weights) / len(weights)
    )
    assert stats.max_weight == pytest.approx(sum(float(w.max()) for w in weights) / len(weights))
    if isinstance(attention, AdditiveAttention):
        assert stats.tanh_saturation == pytest.approx(sum(saturation) / len(saturation))
    else:
        assert stats.tanh_saturation is None
        assert "attn/tanh_saturation" not in stats.as_metrics()

    # Junk in padded keys and padded queries changes nothing.
    junk_queries, junk_keys = queries.clone(), keys.clone()
    junk_queries[0, 3] = 1e3
    junk_keys[1, 2:] = 1e3
    junk = attention_statistics(
        attention, junk_queries, attention.project_keys(junk_keys), valid_lens, query_mask
    )
    assert junk.as_metrics() == pytest.approx(stats.as_metrics())


def make_model(attention: str) -> Seq2Seq:
    torch.manual_seed(0)
    factory = {
        "additive": lambda **sizes: AdditiveAttention(num_hiddens=8, **sizes),
        "dot": lambda **sizes: DotProductAttention(scaled=False, **sizes),
    }[attention]
    return Seq2Seq(13, 11, factory, embedding_size=8, hidden_size=16).eval()


@pytest.mark.parametrize("attention", ["additive", "dot"])
def test_teacher_forced_queries_reproduce_the_models_attention(attention: str) -> None:
    model = make_model(attention)
    src_lens = torch.tensor([5, 2, 4])
    src = torch.randint(4, 13, (3, 5))
    tgt_in = torch.randint(4, 11, (3, 6))
    _, expected_weights = model(src, src_lens, tgt_in)  # (B, T, S)
    with torch.no_grad():
        queries, projected_keys = teacher_forced_queries(model, src, src_lens, tgt_in)
        logits = model.decoder.attention.logits(queries, projected_keys)
    torch.testing.assert_close(masked_softmax(logits, src_lens), expected_weights)


def test_model_statistics_ignore_target_padding_and_keep_the_training_mode() -> None:
    model = make_model("additive").train()
    src_lens, tgt_lens = torch.tensor([5, 2]), torch.tensor([4, 2])
    src = torch.randint(4, 13, (2, 5))
    tgt_in = torch.randint(4, 11, (2, 4))
    stats = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    assert model.training  # restored after the measurement, which ran without dropout
    padded = torch.cat([tgt_in, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    assert model_attention_statistics(model, src, src_lens, padded, tgt_lens) == stats
    assert model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens) == stats


# ---- the callback in a training run --------------------------------------------------------------


@pytest.fixture(scope="module")
def diagnosed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, str]]]:
    run_dir = tmp_path_factory.mktemp("diagnosed")
    overrides = [
        "trainer.max_epochs=2",
        "+trainer.max_steps=13",  # 7 batches an epoch: it stops the run one batch short of 14
        "trainer.log_every_n_steps=3",
    ]
    return run_dir, metrics_of_small_run(run_dir, overrides)


def metrics_of_small_run(run_dir: Path, overrides: list[str]) -> list[dict[str, str]]:
    """``metrics.csv`` of a run of a tiny model on 200 toy pairs (7 batches an epoch)."""
    small = [
        f"run_dir={run_dir}",
        "data.train_size=200",
        "data.val_size=20",
        "data.test_size=20",
        "data.batch_size=32",
        "model.hidden_size=16",
        "model.embedding_size=8",
        "trainer.enable_progress_bar=false",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        train(compose("config", overrides=[*small, *overrides]))
    with open(run_dir / "metrics.csv", newline="") as metrics_file:
        return list(csv.DictReader(metrics_file))


def test_training_logs_attention_diagnostics_every_n_steps_and_every_validation(
    diagnosed_run: tuple[Path, list[dict[str, str]]],
) -> None:
    _, rows = diagnosed_run
    names = ["score_mean", "score_std", "score_row_std", "entropy", "max_weight",
             "softmax_jacobian", "tanh_saturation", "grad_norm"]  # fmt: skip
    step_rows = [row for row in rows if row["attn/entropy"] and row["train/loss"]]
    val_rows = [row for row in rows if row["attn/entropy"] and row["val/loss"]]
    # 7 batches an epoch, 13 steps: steps 3, 6, 9, 12 and the last (the step column counts from
    # 0), where Lightning writes the step's row because the run stops.
    assert [int(row["step"]) for row in step_rows] == [2, 5, 8, 11, 12]
    assert len(val_rows) == 2
    for row in step_rows:
        assert all(row[f"attn/{name}"] for name in names)
        assert 0 < float(row["attn/max_weight"]) <= 1
        assert 0 <= float(row["attn/tanh_saturation"]) <= 1
        assert float(row["attn/grad_norm"]) > 0
    for row in val_rows:
        assert not row["attn/grad_norm"]  # gradients exist only at training steps


def test_gradient_norm_is_the_joint_norm_of_the_gradients_that_exist() -> None:
    parameters = [torch.randn(3, 4, requires_grad=True) for _ in range(3)]
    assert gradient_norm(parameters) is None
    (parameters[0].sum() * 2 + parameters[1].pow(2).sum()).backward()
    grads = [parameters[0].grad.double(), parameters[1].grad.double()]  # the third has none
    expected = torch.nn.utils.get_total_norm(grads)
    assert gradient_norm(parameters) == pytest.approx(float(expected), rel=1e-12)


def stub_trainer(
    step: int,
    should_stop: bool = False,
    min_steps: int | None = None,
    min_epochs: int | None = None,
    epoch: int = 0,
) -> Any:
    """The attributes of a Trainer that say whether this step's row is written."""
    from types import SimpleNamespace

    loop = SimpleNamespace(min_steps=min_steps, min_epochs=min_epochs)
    return SimpleNamespace(log_every_n_steps=5, global_step=step, should_stop=should_stop,
                           fit_loop=loop, current_epoch=epoch)  # fmt: skip


@pytest.mark.parametrize(
    ("trainer", "written"),
    [
        (stub_trainer(5), True),
        (stub_trainer(7), False),
        (stub_trainer(7, should_stop=True), True),  # max_steps, max_time: the run stops here
        # A stop waiting for min_steps or min_epochs: training goes on, on the grid only.
        (stub_trainer(7, should_stop=True, min_steps=20), False),
        (stub_trainer(20, should_stop=True, min_steps=20), True),
        (stub_trainer(7, should_stop=True, min_epochs=2, epoch=1), False),
        (stub_trainer(10, should_stop=True, min_epochs=2, epoch=1), True),
        (stub_trainer(7, should_stop=True, min_epochs=2, epoch=2), True),
    ],
)
def test_the_statistics_are_measured_where_lightning_writes_a_row(
    trainer: Any, written: bool
) -> None:
    from seq2seq.analysis.diagnostics import _is_written_step

    assert _is_written_step(trainer) is written


def test_the_row_of_the_step_a_run_stops_at_has_its_own_diagnostics(
    diagnosed_run: tuple[Path, list[dict[str, str]]],
) -> None:
    """Lightning writes every value logged on_step so far into the stopping step's row: there the
    statistics must be measured again, not repeat the last logging step's. Measured after the
    last update, they equal the validation's that follows it on the same weights."""
    _, rows = diagnosed_run
    *_, before, stop = [row for row in rows if row["attn/entropy"] and row["train/loss"]]
    last_validation = [row for row in rows if row["attn/entropy"] and row["val/loss"]][-1]
    assert int(last_validation["step"]) == int(stop["step"])
    names = ["score_mean", "score_std", "entropy", "max_weight", "softmax_jacobian"]
    for name in names:
        assert stop[f"attn/{name}"] == last_validation[f"attn/{name}"], name
        assert stop[f"attn/{name}"] != before[f"attn/{name}"], name
    assert stop["attn/grad_norm"] != before["attn/grad_norm"]
    assert stop["train/loss"] != before["train/loss"]


def test_with_gradient_accumulation_rows_come_at_optimizer_steps_only(tmp_path: Path) -> None:
    """accumulate_grad_batches=2 over 7 batches an epoch: the optimizer steps after batches 2, 4,
    6 and 7 (Lightning steps on an epoch's last, partial, accumulation), then once more in the
    next epoch, at max_steps=5. The rows are those of steps 2 and 4 (the grid) and 5 (the stop),
    each with the loss, the statistics and the gradient's norm of its own step; none is written
    for a batch that only accumulated."""
    overrides = [
        "trainer.max_epochs=3",
        "+trainer.max_steps=5",
        "+trainer.accumulate_grad_batches=2",
        "trainer.log_every_n_steps=2",
        "test_after_training=false",
    ]
    rows = metrics_of_small_run(tmp_path, overrides)
    step_rows = [row for row in rows if row["train/loss"]]
    assert [int(row["step"]) for row in step_rows] == [1, 3, 4]  # the step column counts from 0
    assert all(row["attn/entropy"] and float(row["attn/grad_norm"]) > 0 for row in step_rows)
    assert len({row["attn/grad_norm"] for row in step_rows}) == 3
    last_validation = [row for row in rows if row["val/loss"]][-1]
    for name in ["score_mean", "score_std", "entropy", "max_weight", "softmax_jacobian"]:
        assert step_rows[-1][f"attn/{name}"] == last_validation[f"attn/{name}"], name


def test_logged_diagnostics_equal_a_recomputation_from_the_checkpoint(
    diagnosed_run: tuple[Path, list[dict[str, str]]],
) -> None:
    run_dir, rows = diagnosed_run
    last_validation = [row for row in rows if row["attn/entropy"] and row["val/loss"]][-1]
    module = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={run_dir}", "data.train_size=200",
                                           "data.val_size=20", "data.test_size=20"])  # fmt: skip
    datamodule = instantiate(cfg.data.module)
    datamodule.setup("fit")
    loader = datamodule.val_dataloader()
    # All 20 validation sentences: the callback's 64 evenly spaced ones are all of them.
    batch = loader.collate_fn([loader.dataset[i] for i in range(len(loader.dataset))])
    stats = model_attention_statistics(
        module.model, batch.src, batch.src_lens, batch.tgt_in, batch.tgt_lens
    )
    for name, value in stats.as_metrics().items():
        assert float(last_validation[name]) == pytest.approx(value, rel=1e-5), name
    coverage = coverage_metrics(
        module.model, batch.src, batch.src_lens, batch.tgt_in, batch.tgt_lens
    )
    for name, value in coverage.items():
        assert float(last_validation[name]) == pytest.approx(value, abs=1e-9), name


def test_coverage_metrics_count_the_real_steps_totals_over_real_words() -> None:
    """Recomputed by hand from the model's teacher-forced weights: padded target steps add
    nothing, padded source positions are not words."""
    from tests.test_model import make_batch, make_model

    model = make_model("additive")
    src, src_lens, tgt_in = make_batch()
    tgt_lens = torch.tensor([6, 3, 5])
    metrics = coverage_metrics(model, src, src_lens, tgt_in, tgt_lens)
    with torch.no_grad():
        _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
    over = under = 0
    for b in range(3):
        totals = weights[b, : int(tgt_lens[b]), : int(src_lens[b])].sum(dim=0)
        over += int((totals > 1.5).sum())
        under += int((totals < 0.5).sum())
    words = int(src_lens.sum())
    assert metrics == {"attn/coverage_over": over / words, "attn/coverage_under": under / words}


# ---- the experiments: the claims hold ------------------------------------------------------------


def test_dimension_experiment_shows_sqrt_d_growth_and_entropy_collapse() -> None:
    rows = measure_dimension(Settings.quick())
    by_key = {(row.d, row.scaled): row for row in rows}
    small, large = Settings.quick().dims[0], Settings.quick().dims[-1]
    for d in (small, large):
        assert by_key[(d, True)].score_std == pytest.approx(1.0, rel=0.1)
        assert by_key[(d, False)].score_std == pytest.approx(math.sqrt(d), rel=0.1)
    assert by_key[(large, False)].entropy < by_key[(small, False)].entropy / 2
    assert by_key[(large, False)].softmax_jacobian < by_key[(large, True)].softmax_jacobian / 2


def test_saturation_experiment_layer_norm_keeps_the_gradient_through_tanh() -> None:
    rows = measure_saturation(Settings.quick())
    plain = [row for row in rows if not row.layer_norm]
    normed = [row for row in rows if row.layer_norm]
    assert plain[-1].saturation > 0.8 > 0.1 > normed[-1].saturation
    # Plain: the gradient at the tanh inputs falls as the norm grows; LayerNorm holds it steady.
    assert plain[-1].grad_at_tanh < plain[0].grad_at_tanh / 4
    assert normed[-1].grad_at_tanh == pytest.approx(normed[0].grad_at_tanh, rel=0.1)
    assert all(row.max_abs_score < row.score_bound for row in rows)


def test_xor_batches_have_one_target_of_the_pattern_the_query_asks_for() -> None:
    queries, keys, targets = xor_batch(500, 5, torch.Generator().manual_seed(0))
    bits_differ = keys[..., 0] != keys[..., 1]  # (B, Tk)
    asks_for_different = queries[:, 0, 0] == 1  # type 0, one-hot
    is_target_pattern = bits_differ == asks_for_different[:, None]
    assert (is_target_pattern.sum(-1) == 1).all()
    assert is_target_pattern[torch.arange(500), targets].all()


def test_additive_attention_can_represent_the_xor_pattern() -> None:
    # The construction of docs/attention.md: units 1-2 read |x1 + x2| for type-0 queries, units
    # 3-4 for type-1 queries; the other query type saturates them at a constant (-1).
    attention = AdditiveAttention(2, 2, num_hiddens=4)
    lam, big = 5.0, 50.0
    with torch.no_grad():
        attention.W_k.weight.copy_(lam * torch.tensor([[1.0, 1.0], [-1.0, -1.0]] * 2))
        attention.W_q.weight.copy_(
            torch.tensor([[-lam, -big], [-lam, -big], [-big, -lam], [-big, -lam]])
        )
        attention.w_v.weight.copy_(10 * torch.tensor([[-1.0, -1.0, 1.0, 1.0]]))
    assert xor_accuracy(attention, *xor_batch(4096, 4, torch.Generator().manual_seed(1))) == 1.0


def test_no_bilinear_score_beats_the_bound_on_the_xor_task() -> None:
    batch = xor_batch(8192, 4, torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(3)
    bound = bilinear_accuracy_bound(4)
    for _ in range(50):
        attention = GeneralAttention(2, 2)
        with torch.no_grad():
            attention.W.weight.copy_(torch.randn(2, 2, generator=generator) * 10)
        # The identity the bound rests on: f(1,-1) + f(-1,1) = f(1,1) + f(-1,-1) for each query.
        corners = torch.tensor([[[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]]]).expand(
            2, -1, -1
        )
        scores = attention.score(torch.eye(2)[:, None, :], attention.project_keys(corners))[:, 0]
        torch.testing.assert_close(scores[:, 0] + scores[:, 1], scores[:, 2] + scores[:, 3])
        # 8,192 examples: one standard error of the accuracy is about 0.005.
        assert xor_accuracy(attention, *batch) <= bound + 0.02


def test_retrieval_targets_are_the_two_named_positions_values() -> None:
    queries, keys, values, targets = retrieval_batch(300, 6, 3, torch.Generator().manual_seed(0))
    first, second = queries[:, 0, :6].argmax(-1), queries[:, 0, 6:].argmax(-1)
    assert (first != second).all() and (queries.sum(-1) == 2).all()
    rows = torch.arange(300)
    torch.testing.assert_close(
        targets[:, 0], torch.cat([values[rows, first], values[rows, second]], -1)
    )
    torch.testing.assert_close(keys[0], torch.eye(6))


def test_two_heads_built_by_hand_retrieve_both_values_exactly() -> None:
    # The solution the claim says two heads can reach: head 1 reads the first one-hot of the
    # query, head 2 the second; W_v copies the value into each head's half.
    settings = Settings.quick()
    n, dv = settings.heads_keys, settings.heads_value_size
    block = heads_block("scaled_dot", 2, settings)
    with torch.no_grad():
        for layer in (block.W_q, block.W_k, block.W_v, block.W_o):
            layer.weight.zero_()
            layer.bias.zero_()
        big = 60.0  # sharp enough for weights within 1e-6 of one-hot
        block.W_q.weight[:n, :n] = big * torch.eye(n)  # head 1 (first dv dims) <- first one-hot
        block.W_q.weight[dv : dv + n, n:] = big * torch.eye(n)  # head 2 <- second one-hot
        block.W_k.weight[:n] = torch.eye(n)
        block.W_k.weight[dv : dv + n] = torch.eye(n)
        block.W_v.weight.copy_(torch.cat([torch.eye(dv), torch.eye(dv)]))
        block.W_o.weight.copy_(torch.eye(2 * dv))
    queries, keys, values, targets = retrieval_batch(64, n, dv, torch.Generator().manual_seed(1))
    context, weights = block(queries, keys, values)
    torch.testing.assert_close(context, targets, atol=1e-4, rtol=0)
    assert weights.shape == (64, 2, 1, n)


def test_two_heads_learn_retrieval_and_diverge_one_head_stays_above_its_bound() -> None:
    curves = {(c.scoring, c.num_heads): c for c in measure_heads(Settings.quick())}
    for scoring in ("scaled_dot", "additive"):
        one, two = curves[(scoring, 1)], curves[(scoring, 2)]
        assert min(one.loss) > ONE_HEAD_ERROR_BOUND - 0.03  # sampling error of 2,048 examples
        assert two.loss[-1] < 0.05
        assert two.divergence[0] < 0.01 < 0.3 < two.divergence[-1] <= math.log(2)
        assert one.divergence == [0.0] * len(one.divergence)  # one head: nothing to compare


def test_the_ffn_is_position_wise_and_self_attention_is_not() -> None:
    ffn, attention, layer = measure_positionwise(Settings.quick())
    assert ffn.permutation_max_change < 1e-6 and ffn.cross_position_fraction < 1e-6
    # Without positional encodings self-attention is permutation-equivariant too, yet every
    # output position depends on every input position.
    for row in (attention, layer):
        assert row.permutation_max_change < 1e-5 and row.cross_position_fraction > 0.05


# ---- the script ----------------------------------------------------------------------------------


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "attention_diagnostics.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def test_quick_mode_writes_plots_report_and_numbers_that_show_each_claim(
    tmp_path: Path, diagnosed_run: tuple[Path, list[dict[str, str]]]
) -> None:
    run_dir, _ = diagnosed_run
    docs = tmp_path / "page.md"
    docs.write_text("intro\n<!-- generated:bias -->\nold\n<!-- /generated:bias -->\n"
                    "<!-- generated:other -->\nkept\n<!-- /generated:other -->\n")  # fmt: skip
    result = run_script("--out", str(tmp_path / "out"), "--quick", "--runs", str(run_dir),
                        "--docs", str(docs))  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    for name in ("dimension.png", "saturation.png", "xor.png", "heads.png", "report.md",
                 "results.json"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert max(results["bias"]["dot_shift_max_change"].values()) < 1e-5
    assert results["bias"]["additive_inside_max_change"] > 1e-2
    for row in results["identifiability"]:
        assert row["same_ratio_max_change"] < 1e-5 < row["scale_only_max_change"]
    final = {curve["scoring"]: curve["accuracy"][-1] for curve in results["xor"]}
    assert final["additive"] > 0.95
    assert final["general"] <= bilinear_accuracy_bound(Settings.quick().xor_keys) + 0.02
    report = (out / "report.md").read_text()
    assert "![XOR task learning curves](xor.png)" in report
    assert "## The toy task" in report and "hidden 16" in report
    assert "## 6. Heads learn" in report and "## 7. The FFN" in report
    assert {row["block"].split(",")[0] for row in results["positionwise"]} >= {"position-wise FFN"}
    page = docs.read_text()
    assert "old" not in page and "additive, w_vᵀ tanh" in page and "kept" in page
    assert page.startswith("intro\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "no/such/run"], "is not a finished training run"),
        (["--docs", "no/such/page.md"], "does not exist"),
    ],
)
def test_bad_input_is_one_paragraph_and_exit_status_2(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process (the quick-mode test above runs the real subprocess): what run() prints and exits.
    spec = importlib.util.spec_from_file_location(
        "script", ROOT / "scripts/attention_diagnostics.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as exit_info:
        run(lambda: script.main(["--out", str(tmp_path / "out"), "--quick", *args]))
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and message in stderr and "Traceback" not in stderr
    assert not (tmp_path / "out" / "report.md").exists()  # refused before any experiment ran


def test_update_docs_replaces_only_named_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- generated:x -->\n1\n<!-- /generated:x -->\nb\n")
    assert update_docs(page, {"x": "two\\1 $", "y": "unused"}) == ["x"]
    assert page.read_text() == "a\n<!-- generated:x -->\ntwo\\1 $\n<!-- /generated:x -->\nb\n"


# ---- the attention's other parts: the statistics read the model's own weights ------------------


def test_statistics_of_a_sparse_windowed_model_follow_its_own_weights() -> None:
    """zero_share counts the exact zeros of the weights the model computes (sparsemax inside a
    local-m window here), the entropy is over each row's support, and the Jacobian is
    sparsemax's: ‖diag(s) - ssᵀ/|S|‖_F = sqrt(|S| - 1) for a support S."""
    from functools import partial

    from seq2seq.attention import AttentionParts, DotProductAttention
    from seq2seq.models import LuongDecoder

    torch.manual_seed(0)
    parts = AttentionParts("sparsemax", window="local_m", window_size=1)
    model = Seq2Seq(
        13, 11, partial(DotProductAttention, temperature=0.2), embedding_size=8,
        hidden_size=16, decoder=LuongDecoder, attention_parts=parts,
    ).eval()  # fmt: skip
    src_lens, tgt_lens = torch.tensor([6, 3]), torch.tensor([5, 2])
    src, tgt_in = torch.randint(4, 13, (2, 6)), torch.randint(4, 11, (2, 5))
    stats = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    with torch.no_grad():
        _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
    real = torch.zeros(2, 5, 6, dtype=torch.bool)
    for b in range(2):
        real[b, : tgt_lens[b], : src_lens[b]] = True
    assert stats.zero_share == pytest.approx(float((weights[real] == 0).double().mean()))
    assert stats.zero_share > 0.4  # the window alone leaves half of the keys out
    rows = [weights[b, t, : src_lens[b]] for b in range(2) for t in range(int(tgt_lens[b]))]
    support = [int((row > 0).sum()) for row in rows]
    expected = sum(math.sqrt(size - 1) for size in support) / len(support)
    assert stats.softmax_jacobian == pytest.approx(expected, rel=1e-6)


def test_a_transformer_logs_its_zero_share_and_a_learned_alpha_is_logged() -> None:
    from functools import partial

    from seq2seq.analysis.diagnostics import learned_alphas, transformer_head_metrics
    from seq2seq.attention import AttentionParts, DotProductAttention
    from seq2seq.models import Transformer

    torch.manual_seed(1)
    parts = AttentionParts("entmax", alpha="learnable", initial_alpha=1.7)
    model = Transformer(
        13, 11, partial(DotProductAttention, temperature=0.1), d_model=16, num_heads=2,
        d_ff=32, encoder_layers=1, decoder_layers=1, attention_parts=parts,
    )  # fmt: skip
    src_lens, tgt_lens = torch.tensor([6, 3]), torch.tensor([5, 2])
    src, tgt_in = torch.randint(4, 13, (2, 6)), torch.randint(4, 11, (2, 5))
    metrics = transformer_head_metrics(model, src, src_lens, tgt_in, tgt_lens)
    model.eval()
    with torch.no_grad():
        source, _ = model.encode(src, src_lens)
        weights = model.decoder.cross_attention_weights(tgt_in, source)  # (B, L, h, T, S)
    real = torch.zeros(2, 5, 6, dtype=torch.bool)
    for b in range(2):
        real[b, : tgt_lens[b], : src_lens[b]] = True
    pairs = real[:, None, None].expand_as(weights)
    assert metrics["attn/zero_share"] == pytest.approx(float((weights[pairs] == 0).double().mean()))
    assert metrics["attn/zero_share"] > 0
    assert learned_alphas(model) == {"attn/alpha": pytest.approx(1.7, rel=1e-5)}


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("scoring", ["additive", "general"])
def test_statistics_of_a_model_with_coverage_follow_its_own_weights(
    scoring: str, heads: int
) -> None:
    """With coverage, each teacher-forced query's logits read what the steps before it attended:
    the statistics' entropy and largest weight are those of the weights the model computes."""
    from seq2seq.attention import AttentionParts
    from tests.test_model import ATTENTIONS, randomize_coverage

    torch.manual_seed(0)
    model = Seq2Seq(
        13, 11, ATTENTIONS[scoring], embedding_size=8, hidden_size=16, num_heads=heads,
        attention_parts=AttentionParts(coverage=True),
    ).eval()  # fmt: skip
    randomize_coverage(model)
    src_lens, tgt_lens = torch.tensor([6, 3]), torch.tensor([5, 2])
    src, tgt_in = torch.randint(4, 13, (2, 6)), torch.randint(4, 11, (2, 5))
    stats = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    with torch.no_grad():
        _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
    rows = [weights[b, t, : src_lens[b]] for b in range(2) for t in range(int(tgt_lens[b]))]
    if heads == 1:  # multi-head statistics pool the heads, the model's map averages them
        entropies = [float(-(row * row.clamp(min=1e-30).log()).sum()) for row in rows]
        assert stats.entropy == pytest.approx(sum(entropies) / len(entropies), rel=1e-5)
        largest = [float(row.max()) for row in rows]
        assert stats.max_weight == pytest.approx(sum(largest) / len(largest), rel=1e-5)
    else:  # each head's rows hold weights: the pooled largest weight lies in (0, 1]
        assert 0 < stats.max_weight <= 1


@pytest.mark.parametrize("coverage", [False, True])
@pytest.mark.parametrize("heads", [1, 2])
def test_additive_statistics_in_query_chunks_equal_one_grid(
    heads: int, coverage: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The additive score's logits and tanh saturation computed a chunk of queries at a time
    (here one query per chunk) are those of the whole (B, Tq, Tk, A) grid at once, and the
    saturation is the share ``tanh_saturation`` gives that grid."""
    from seq2seq.analysis import diagnostics
    from seq2seq.attention import AttentionParts
    from tests.test_model import ATTENTIONS, randomize_coverage

    torch.manual_seed(0)
    model = Seq2Seq(
        13, 11, ATTENTIONS["additive"], embedding_size=8, hidden_size=16, num_heads=heads,
        attention_parts=AttentionParts(coverage=coverage),
    ).eval()  # fmt: skip
    if coverage:
        randomize_coverage(model)
    with torch.no_grad():  # scaled up so that some tanh inputs pass |x| > 2 and some do not
        for parameter in model.decoder.attention.parameters():
            parameter.mul_(8)
    src_lens, tgt_lens = torch.tensor([6, 3, 1]), torch.tensor([5, 2, 4])
    src, tgt_in = torch.randint(4, 13, (3, 6)), torch.randint(4, 11, (3, 5))
    whole = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    monkeypatch.setattr(diagnostics, "CHUNK_ELEMENTS", 1)
    chunked = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    # The same floats, summed in another order.
    assert asdict(chunked) == pytest.approx(asdict(whole), rel=1e-6)
    assert whole.tanh_saturation is not None and 0 < whole.tanh_saturation < 1

    queries = torch.randn(3, 5, 16) * 4
    attention = ATTENTIONS["additive"](query_size=16, key_size=16)
    is_valid = diagnostics.valid_pairs(src_lens, None, torch.Size((3, 5, 6)))
    with torch.no_grad():
        keys = attention.project_keys(torch.randn(3, 6, 16) * 4)
        logits, share = diagnostics.additive_logits_and_saturation(
            attention, queries, keys, is_valid
        )
        grid = attention.preactivations(queries, keys)  # (B, Tq, Tk, A) at once
        assert torch.allclose(logits, attention.logits(queries, keys), rtol=1e-6, atol=1e-6)
    # The share as the mean of each pair's share, in float64.
    expected = float((grid.abs() > 2).double().mean(-1)[is_valid].mean())
    assert share == pytest.approx(expected, rel=1e-12)
    assert diagnostics.tanh_saturation(grid, is_valid) == pytest.approx(expected, rel=1e-12)
    assert 0 < expected < 1


@pytest.mark.parametrize("queries", [0, 1, 4, 5])
def test_query_chunks_cover_every_query_once_with_an_uneven_tail(
    queries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of two queries over Tq queries: each query in exactly one chunk, the last chunk
    shorter where two does not divide Tq, and one empty chunk for no queries."""
    from seq2seq.analysis import diagnostics

    batch, keys, width = 3, 6, 4
    monkeypatch.setattr(diagnostics, "CHUNK_ELEMENTS", 2 * batch * keys * width)
    chunks = diagnostics.query_chunks(
        torch.zeros(batch, queries, 5), torch.zeros(batch, keys, width), width
    )
    covered = [index for chunk in chunks for index in range(queries)[chunk]]
    assert covered == list(range(queries))
    assert all(len(range(queries)[chunk]) <= 2 for chunk in chunks)
    assert len(chunks) == max(1, -(-queries // 2))


@pytest.mark.parametrize("kind", ["foreign", "preactivations", "coverage"])
def test_chunked_saturation_equals_the_whole_grid_of_a_users_module_or_coverage(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The callback's saturation, one query per chunk, against ``tanh_saturation`` of the whole
    grid the model's own ``preactivations`` gives: with W_q a module of the user's own (no
    ``out_features``), a 2-argument ``preactivations`` of the user's, and w_c coverage inside the
    tanh, which the whole grid gets as ``preactivations``' third argument."""
    from seq2seq.analysis import diagnostics
    from seq2seq.attention import AttentionParts
    from tests.test_model import ATTENTIONS, randomize_coverage
    from tests.test_scoring_contract import own_module

    if kind == "coverage":
        torch.manual_seed(0)
        model = Seq2Seq(
            13, 11, ATTENTIONS["additive"], embedding_size=8, hidden_size=16,
            attention_parts=AttentionParts(coverage=True),
        ).eval()  # fmt: skip
        randomize_coverage(model)
    else:
        model = own_module(kind).eval()
    attention = model.decoder.attention
    with torch.no_grad():  # scaled so that some tanh inputs pass |x| > 2 and some do not
        for parameter in attention.parameters():
            parameter.mul_(4)
    src_lens, tgt_lens = torch.tensor([6, 3, 1]), torch.tensor([5, 2, 4])
    src, tgt_in = torch.randint(4, 13, (3, 6)), torch.randint(4, 11, (3, 5))
    monkeypatch.setattr(diagnostics, "CHUNK_ELEMENTS", 1)
    stats = model_attention_statistics(model, src, src_lens, tgt_in, tgt_lens)
    with torch.no_grad():
        queries, keys = teacher_forced_queries(model, src, src_lens, tgt_in)
        coverage = diagnostics.teacher_forced_coverage(model, src, src_lens, tgt_in)
        if coverage is None:
            grid = attention.preactivations(queries, keys)  # (B, T, S, A) at once
        else:
            grid = attention.preactivations(queries, keys, coverage)
    query_mask = torch.arange(5)[None, :] < tgt_lens[:, None]
    is_valid = diagnostics.valid_pairs(src_lens, query_mask, grid.shape[:3])
    expected = float((grid.abs() > 2).double().mean(-1)[is_valid].mean())
    assert stats.tanh_saturation == pytest.approx(expected, rel=1e-12)
    assert 0 < expected < 1


def test_statistics_of_no_queries_say_so() -> None:
    """No queries: the one-paragraph error of no valid pair, not a failure inside the chunks."""
    attention = scoring_factory("additive", {})(query_size=6, key_size=6)
    with pytest.raises(ValueError, match="at least one valid"):
        attention_statistics(
            attention, torch.zeros(2, 0, 6), attention.project_keys(torch.zeros(2, 5, 6))
        )
