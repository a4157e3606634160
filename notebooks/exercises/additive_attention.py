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
# # Exercise 2: additive attention
#
# Bahdanau et al. (2015): score(q, k) = w_vᵀ tanh(W_q q + W_k k). W_k k is the same for every
# query, so the model computes it once per sentence (`project_keys`); `score` gets it.
#
# Fill in `score`: `queries` (B, Tq, Dq), `projected_keys` (B, Tk, A) -> scores (B, Tq, Tk):
# every query against every key, one tanh of A features per pair.

# %%
import torch
from torch import nn

import seq2seq
from seq2seq.attention import Attention

# %% [raw]
# # BEGIN QUESTION
# name: additive_attention
# points: 4

# %% [raw]
# # BEGIN SOLUTION


# %%
class Additive(Attention):
    """w_vᵀ tanh(W_q q + W_k k). The config's attention group also gives ``bias`` and
    ``layer_norm``: this class has neither."""

    def __init__(
        self,
        query_size,
        key_size,
        num_hiddens=16,
        dropout=0.0,
        temperature=1.0,
        initial_temperature=1.0,
        bias=False,
        layer_norm=False,
    ):
        super().__init__(dropout, temperature, initial_temperature)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def project_keys(self, keys):
        return self.W_k(keys)  # (B, Tk, Dk) -> (B, Tk, A), once per sentence

    def score(self, queries, projected_keys):
        # BEGIN SOLUTION
        # (B, Tq, 1, A) + (B, 1, Tk, A) -> (B, Tq, Tk, A): every query with every key
        features = torch.tanh(self.W_q(queries)[:, :, None, :] + projected_keys[:, None, :, :])
        return self.w_v(features).squeeze(-1)  # (B, Tq, Tk, 1) -> (B, Tq, Tk)
        # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
points: 1
"""  # END TEST CONFIG
attention = Additive(4, 6, num_hiddens=5)
scores = attention.score(torch.randn(2, 3, 4), attention.project_keys(torch.randn(2, 7, 6)))
assert scores is not None and scores.shape == (2, 3, 7), "scores are (B, Tq, Tk)"

# %%
""" # BEGIN TEST CONFIG
points: 2
"""  # END TEST CONFIG
from functools import partial  # noqa: E402

result = seq2seq.check(partial(Additive, num_hiddens=16))
assert result.passed, result.table()

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
from seq2seq.attention import AdditiveAttention  # noqa: E402

reference, yours = AdditiveAttention(8, 6, 16), Additive(8, 6, 16)
_ = yours.load_state_dict(reference.state_dict())  # the same W_q, W_k, w_v
q, k, v, lens = (
    torch.randn(3, 4, 8),
    torch.randn(3, 5, 6),
    torch.randn(3, 5, 2),
    torch.tensor([5, 2, 1]),
)
for got, want in zip(yours(q, k, v, lens), reference(q, k, v, lens), strict=True):
    torch.testing.assert_close(got, want)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Train with it
#
# Your class, then the built-in `attention=additive`, on the toy task; both in the attention
# explorer. `SEQ2SEQ_EXERCISE_TRAINING=0` skips this cell, as grading does.

# %%
import os  # noqa: E402

if os.environ.get("SEQ2SEQ_EXERCISE_TRAINING", "1") != "0":
    small = ["data.train_size=2000", "trainer.max_epochs=1", "threads=1", "attention=additive"]
    yours = seq2seq.train(*small, "run_dir=runs/yours", attention=Additive)
    built_in = seq2seq.train(*small, "run_dir=runs/built_in")
    display(seq2seq.explore({"yours": yours, "built-in": built_in}, ["w3 w14 w7 w1"]))  # noqa: F821
