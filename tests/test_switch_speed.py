"""benchmarks/switch_speed.py: every setting it times is a config train.py accepts, and one
setting's step and searches run; the table shows what was measured."""

from __future__ import annotations

import pytest

from benchmarks.step_benchmark import compose, random_batch
from benchmarks.switch_speed import (
    SETTINGS,
    VOCABULARY,
    Setting,
    markdown,
    only,
    search_flops,
    step_work,
    train_py_markdown,
)
from seq2seq.normalizers import BISECTION_ITERATIONS


@pytest.mark.parametrize(
    "overrides",
    [[*default, *extra] for default, settings in SETTINGS.items() for extra in settings],
    ids=lambda overrides: " ".join(overrides) or "default",
)
def test_every_setting_composes(overrides: list[str]) -> None:
    compose([*overrides, "trainer=cpu"])


def test_a_setting_trains_and_decodes_and_the_table_shows_it() -> None:
    batch = random_batch(4, 6, VOCABULARY, "cpu")
    setting = Setting(["attention=scaled_dot", "attention.normalizer=sparsemax"], batch)
    before = [p.detach().clone() for p in setting.model.parameters()]
    setting.train()
    assert any(not p.equal(q) for p, q in zip(setting.model.parameters(), before, strict=True))
    setting.greedy()
    setting.beam5()
    row = {"decoder": "bahdanau", "setting": "attention=scaled_dot", "train_ms": 1.5}
    row |= {"train_ratio": 1.2, "greedy_ms": 2, "greedy_ratio": 1, "beam5_ms": 3}
    row |= {"greedy_flops_added": 0.5, "beam5_flops_added": 0.25, "elementwise_added": 2.0}
    table = markdown([{**row, "beam5_ratio": 0.9, "gemm_flops_added": -0.125}])
    expected = "| bahdanau | `attention=scaled_dot` | -12.5% / +200% | 1.5 | 1.2 | +50.0% / +0% "
    assert expected + "| 2 | 1 | +25.0% / +0% | 3 | 0.9 |" in table


def test_the_flops_count_the_attention_s_products() -> None:
    """Local-p adds W_p and v_p's products, and the key bias none (an addition)."""
    batch = random_batch(4, 6, VOCABULARY, "cpu")
    default = step_work([], batch)["gemm"]
    assert step_work(["attention.key_bias=true"], batch)["gemm"] == default
    local_p = step_work(["attention.window=local_p", "attention.window_size=2"], batch)["gemm"]
    assert local_p > default


def test_the_element_wise_work_counts_what_the_products_leave_out() -> None:
    """α-entmax's bisection is element-wise work that no GEMM counts: each of its halvings
    writes at least one (B, T, S) tensor of sums; the key bias adds a little."""
    batch = random_batch(4, 6, VOCABULARY, "cpu")
    logits = 4 * 7 * 6  # B, T (6 + EOS), S
    default = step_work([], batch)
    bisection = step_work(["attention.normalizer=entmax", "attention.alpha=1.3"], batch)
    assert bisection["gemm"] == default["gemm"]
    assert bisection["elementwise"] - default["elementwise"] >= BISECTION_ITERATIONS * logits
    key_bias = step_work(["attention.key_bias=true"], batch)["elementwise"]
    assert default["elementwise"] < key_bias < 1.1 * default["elementwise"]


def test_the_searches_flops_count_what_a_part_adds_to_them() -> None:
    """Input feeding adds W_if h~ to every decoding step of the Luong decoder; the key bias no
    product."""
    batch = random_batch(4, 6, VOCABULARY, "cpu")
    luong = ["model.decoder=luong", "attention=dot"]
    default = search_flops(luong, batch)
    key_bias = search_flops([*luong, "attention.key_bias=true"], batch)
    assert (key_bias["greedy"], key_bias["beam5"]) == (default["greedy"], default["beam5"])
    fed = search_flops([*luong, "model.input_feeding=true"], batch)
    assert fed["greedy"] > default["greedy"] and fed["beam5"] > default["beam5"]


def test_the_train_py_table_shows_the_median_and_its_ratio() -> None:
    row = {"decoder": "luong", "setting": "model.num_heads=4", "median_tokens_per_s": 7321}
    table = train_py_markdown([{**row, "tokens_per_s": [7000, 7321, 7400], "ratio": 0.812}])
    assert "| luong | `model.num_heads=4` | 7,321 | 0.812 |" in table


def test_only_keeps_each_block_s_default_and_the_settings_that_match() -> None:
    chosen = only(SETTINGS, ["num_heads"])
    assert chosen.keys() == SETTINGS.keys()
    for default, settings in chosen.items():
        assert settings[0] == SETTINGS[default][0]  # what the ratios divide by
        assert all("num_heads" in " ".join(extra) for extra in settings[1:])
    assert sum(len(settings) for settings in chosen.values()) < sum(map(len, SETTINGS.values()))
    assert only(SETTINGS, None) is SETTINGS
    exact = only(SETTINGS, ["model.num_heads=4"])  # one setting, not all that contain it
    assert all(len(settings) == 2 for settings in exact.values() if len(settings) > 1)
    with pytest.raises(SystemExit, match="--only zzz: no setting"):
        only(SETTINGS, ["zzz"])
