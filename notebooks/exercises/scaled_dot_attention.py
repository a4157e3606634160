# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [raw]
# # ASSIGNMENT CONFIG
# requirements: null
# export_cell: false
# init_cell: true
# check_all_cell: false
# run_tests: true

# %% [markdown]
# # Exercise 3: scaled dot-product attention
#
# Vaswani et al. (2017): score(q, k) = q·k / √d. Without the √d, the scores of d-dimensional
# random vectors spread as √d and the softmax saturates on one key.
#
# Fill in `score`: `queries` (B, Tq, d), `projected_keys` (B, Tk, d) -> scores (B, Tq, Tk). The
# base class `seq2seq.attention.Attention` does the rest: the masked softmax over real keys,
# the context, a temperature.

# %%
import math

import torch

import seq2seq
from seq2seq.attention import Attention

# %% [raw]
# # BEGIN QUESTION
# name: scaled_dot_attention
# points: 4

# %% [raw]
# # BEGIN SOLUTION


# %%
class ScaledDot(Attention):
    """q·k / √d. query_size and key_size (equal) come from the model; ``scaled`` from the
    config's attention group: this class always scales."""

    def __init__(
        self,
        query_size=None,
        key_size=None,
        dropout=0.0,
        temperature=1.0,
        initial_temperature=1.0,
        scaled=True,
    ):
        super().__init__(dropout, temperature, initial_temperature)

    def score(self, queries, projected_keys):
        # BEGIN SOLUTION
        # (B, Tq, d) @ (B, d, Tk) -> (B, Tq, Tk)
        return queries @ projected_keys.transpose(1, 2) / math.sqrt(queries.shape[-1])
        # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
points: 1
"""  # END TEST CONFIG
scores = ScaledDot().score(torch.ones(1, 2, 4), torch.ones(1, 3, 4))
assert scores is not None and scores.shape == (1, 2, 3), "scores are (B, Tq, Tk)"
assert torch.allclose(scores, torch.full((1, 2, 3), 2.0)), "q·k / √d: 4 / √4 = 2"

# %%
""" # BEGIN TEST CONFIG
points: 2
"""  # END TEST CONFIG
result = seq2seq.check(ScaledDot)
assert result.passed, result.table()
assert not result.warnings, result.table()  # a forgotten 1/√d passes every property, not this

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
from seq2seq.attention import DotProductAttention  # noqa: E402

q, k, v, lens = (
    torch.randn(3, 4, 16),
    torch.randn(3, 6, 16),
    torch.randn(3, 6, 5),
    torch.tensor([6, 2, 1]),
)
for got, want in zip(
    ScaledDot(16, 16)(q, k, v, lens), DotProductAttention()(q, k, v, lens), strict=True
):
    torch.testing.assert_close(got, want)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Train with it
#
# Your class, then the built-in `attention=scaled_dot`, on the toy task; both in the attention
# explorer. `SEQ2SEQ_EXERCISE_TRAINING=0` skips this cell, as grading does.

# %%
import os  # noqa: E402

if os.environ.get("SEQ2SEQ_EXERCISE_TRAINING", "1") != "0":
    small = ["data.train_size=2000", "trainer.max_epochs=1", "threads=1", "attention=scaled_dot"]
    yours = seq2seq.train(*small, "run_dir=runs/yours", attention=ScaledDot)
    built_in = seq2seq.train(*small, "run_dir=runs/built_in")
    display(seq2seq.explore({"yours": yours, "built-in": built_in}, ["w3 w14 w7 w1"]))  # noqa: F821
