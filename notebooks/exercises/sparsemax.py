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
# # Exercise 5: sparsemax
#
# Softmax gives every real key some weight. **Sparsemax** (Martins and Astudillo, 2016) projects
# the scores z onto the probability simplex, p = [z - τ]₊, so that weak keys get exactly 0:
# sort z descending, find the largest k with 1 + k z₍ₖ₎ > Σ_{j≤k} z₍ⱼ₎ (the support), set
# τ = (Σ_{j≤k} z₍ⱼ₎ - 1) / k.
#
# Write `sparsemax(logits, mask)`: `logits` (B, Tq, Tk), `mask` (B, Tq, Tk) bool, True at a real
# key; padded keys get exactly 0, a row with no real key zeros.

# %%
import torch

import seq2seq
from seq2seq.attention import DotProductAttention

# %% [raw]
# # BEGIN QUESTION
# name: sparsemax
# points: 4

# %% [raw]
# # BEGIN SOLUTION


# %%
def sparsemax(logits, mask):
    # BEGIN SOLUTION
    z = logits.masked_fill(~mask, float("-inf"))  # padding sorts last and never enters
    ranked, _ = z.sort(dim=-1, descending=True)  # (B, Tq, Tk)
    real = ranked.isfinite()
    cumulative = ranked.masked_fill(~real, 0.0).cumsum(dim=-1)
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    support = (1 + k * ranked > cumulative) & real
    size = support.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, Tq, 1)
    tau = (cumulative.gather(-1, size - 1) - 1) / size.to(z.dtype)
    return (z - tau).clamp(min=0.0).masked_fill(~mask, 0.0)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
points: 1
"""  # END TEST CONFIG
w = sparsemax(torch.tensor([[[3.0, 1.0, 0.5, 9.0]]]), torch.tensor([[[True, True, True, False]]]))
assert w.shape == (1, 1, 4), "the weights have the logits' shape"
assert w[0, 0, 3] == 0 and w[0, 0, 2] == 0, "padding, and a key far below the best, get exactly 0"

# %%
""" # BEGIN TEST CONFIG
points: 2
"""  # END TEST CONFIG
result = seq2seq.check(sparsemax)
assert result.passed, result.table()

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
from seq2seq.normalizers import sparsemax as reference  # noqa: E402

logits, lens = 3 * torch.randn(3, 4, 6), torch.tensor([6, 2, 0])
mask = (torch.arange(6) < lens[:, None, None]).expand(3, 4, 6)
torch.testing.assert_close(sparsemax(logits, mask), reference(logits, mask))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Train with it
#
# Scaled dot-product attention with your sparsemax, beside the built-in
# `attention.normalizer=sparsemax`, on the toy task; then both in the attention explorer (hatched
# cells are exact zeros). `SEQ2SEQ_EXERCISE_TRAINING=0` skips this cell, as grading does.

# %%
import os  # noqa: E402


class WithYourSparsemax(DotProductAttention):
    """Scaled dot-product attention whose weights are your sparsemax's."""

    def normalize(self, logits, queries, valid_lens, positions=None):
        mask = torch.arange(logits.shape[-1]) < valid_lens.view(-1, 1, 1)  # (B, 1, Tk)
        return sparsemax(logits, mask.expand_as(logits))


if os.environ.get("SEQ2SEQ_EXERCISE_TRAINING", "1") != "0":
    small = ["data.train_size=2000", "trainer.max_epochs=1", "threads=1", "attention=scaled_dot"]
    yours = seq2seq.train(*small, "run_dir=runs/yours", attention=WithYourSparsemax)
    built_in = seq2seq.train(*small, "attention.normalizer=sparsemax", "run_dir=runs/built_in")
    display(seq2seq.explore({"yours": yours, "built-in": built_in}, ["w3 w14 w7 w1"]))  # noqa: F821
