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
# # Exercise 1: masked softmax
#
# Attention turns each query's scores over the source words into weights. A batch pads its
# sentences to one length, so a row's **padded keys must get weight exactly 0**, its real keys
# weights that sum to 1, and a row with no real key at all (an empty sentence) zeros, never NaN.
#
# Write `masked_softmax(logits, mask)`: `logits` (B, Tq, Tk), `mask` (B, Tq, Tk) bool, True at a
# real key. `seq2seq.check` runs the properties every attention must have and names the bug that
# fits a failure.

# %%
import torch

import seq2seq
from seq2seq.attention import DotProductAttention

# %% [raw]
# # BEGIN QUESTION
# name: masked_softmax
# points: 4

# %% [raw]
# # BEGIN SOLUTION


# %%
def masked_softmax(logits, mask):
    # BEGIN SOLUTION
    # -inf at padding, so that exp gives exactly 0 there; a row of -inf only is NaN: zeros.
    weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
points: 1
"""  # END TEST CONFIG
w = masked_softmax(torch.tensor([[[1.0, 2.0, 3.0]]]), torch.tensor([[[True, True, False]]]))
assert w.shape == (1, 1, 3), "the weights have the logits' shape"
assert w[0, 0, 2] == 0, "a padded key gets weight exactly 0"

# %%
""" # BEGIN TEST CONFIG
points: 2
"""  # END TEST CONFIG
result = seq2seq.check(masked_softmax)
assert result.passed, result.table()

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
from seq2seq.attention import masked_softmax as reference  # noqa: E402

logits, lens = torch.randn(3, 4, 6), torch.tensor([6, 2, 0])
mask = (torch.arange(6) < lens[:, None, None]).expand(3, 4, 6)
torch.testing.assert_close(masked_softmax(logits, mask), reference(logits, lens))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Train with it
#
# The same model twice on the toy task: scaled dot-product attention with your masked softmax,
# and with the built-in one; then both in the attention explorer, side by side. (Set
# `SEQ2SEQ_EXERCISE_TRAINING=0` to skip this cell, as grading does.)

# %%
import os  # noqa: E402


class WithYourSoftmax(DotProductAttention):
    """Scaled dot-product attention whose weights are your masked_softmax's."""

    def normalize(self, logits, queries, valid_lens, positions=None):
        mask = torch.arange(logits.shape[-1]) < valid_lens.view(-1, 1, 1)  # (B, 1, Tk)
        return masked_softmax(logits, mask.expand_as(logits))


if os.environ.get("SEQ2SEQ_EXERCISE_TRAINING", "1") != "0":
    small = ["data.train_size=2000", "trainer.max_epochs=1", "threads=1"]
    yours = seq2seq.train(
        *small, "attention=scaled_dot", "run_dir=runs/yours", attention=WithYourSoftmax
    )
    built_in = seq2seq.train(*small, "attention=scaled_dot", "run_dir=runs/built_in")
    display(seq2seq.explore({"yours": yours, "built-in": built_in}, ["w3 w14 w7 w1"]))  # noqa: F821
