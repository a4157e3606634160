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
# # Exercise 4: multi-head attention
#
# Vaswani et al. (2017): h heads, each scaled dot-product attention on its own slice of
# W_q q, W_k k and W_v v (d = D / h features each), the heads' contexts side by side through
# W_o. Written with d2l's interface: `forward(queries, keys, values, valid_lens)` returns the
# context (B, Tq, D) and keeps the weights in `self.attention_weights`, here the heads' average
# (B, Tq, Tk), as the decoders read them. `valid_lens` (B,): each sentence's real keys; padded
# keys get weight exactly 0, a sentence with none zeros.

# %%
import math

import torch
from torch import nn

import seq2seq

# %% [raw]
# # BEGIN QUESTION
# name: multi_head_attention
# points: 4

# %% [raw]
# # BEGIN SOLUTION


# %%
class MultiHead(nn.Module):
    def __init__(self, num_hiddens, num_heads):
        super().__init__()
        self.num_heads = num_heads
        # Lazy: each learns its input size at the first call (values may be of another size).
        self.W_q = nn.LazyLinear(num_hiddens, bias=False)
        self.W_k = nn.LazyLinear(num_hiddens, bias=False)
        self.W_v = nn.LazyLinear(num_hiddens, bias=False)
        self.W_o = nn.LazyLinear(num_hiddens, bias=False)
        self.attention_weights = None

    def forward(self, queries, keys, values, valid_lens):
        # BEGIN SOLUTION
        h = self.num_heads

        def split(x):  # (B, T, D) -> (B, h, T, d)
            return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2)

        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, h, Tq, Tk)
        real = torch.arange(keys.shape[1]) < valid_lens.view(-1, 1, 1, 1)  # (B, 1, 1, Tk)
        weights = torch.softmax(scores.masked_fill(~real, float("-inf")), dim=-1).nan_to_num(0.0)
        self.attention_weights = weights.mean(dim=1)  # (B, Tq, Tk)
        context = (weights @ v).transpose(1, 2)  # (B, h, Tq, d) -> (B, Tq, h, d)
        return self.W_o(context.reshape(context.shape[0], context.shape[1], -1))  # (B, Tq, D)
        # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
points: 1
"""  # END TEST CONFIG
block = MultiHead(8, 2)
context = block(
    torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.tensor([5, 2])
)
assert context is not None and context.shape == (2, 3, 8), "the context is (B, Tq, D)"
assert block.attention_weights.shape == (2, 3, 5), "the heads' average weights are (B, Tq, Tk)"

# %%
""" # BEGIN TEST CONFIG
points: 2
"""  # END TEST CONFIG
result = seq2seq.check(MultiHead(16, 4))
assert result.passed, result.table()
assert not result.warnings, result.table()  # a forgotten 1/√d passes every property, not this

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
yours = MultiHead(16, 4)
q, k, v, lens = (
    torch.randn(3, 4, 16),
    torch.randn(3, 6, 16),
    torch.randn(3, 6, 16),
    torch.tensor([6, 2, 1]),
)
context = yours(q, k, v, lens)
reference = nn.MultiheadAttention(16, 4, bias=False, batch_first=True)
with torch.no_grad():
    _ = reference.in_proj_weight.copy_(
        torch.cat([yours.W_q.weight, yours.W_k.weight, yours.W_v.weight])
    )
    _ = reference.out_proj.weight.copy_(yours.W_o.weight)
padding = torch.arange(6) >= lens[:, None]  # (B, Tk): True at a padded key
want, weights = reference(q, k, v, key_padding_mask=padding)
torch.testing.assert_close(context, want)
torch.testing.assert_close(yours.attention_weights, weights)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# ## Train with it
#
# The decoders build their own block around a scoring function (`model.num_heads`): this cell
# trains it with 4 heads on the toy task, the block your class rebuilds, and opens the explorer,
# whose head menu shows each head's map. `SEQ2SEQ_EXERCISE_TRAINING=0` skips it, as grading does.

# %%
import os  # noqa: E402

if os.environ.get("SEQ2SEQ_EXERCISE_TRAINING", "1") != "0":
    small = ["data.train_size=2000", "trainer.max_epochs=1", "threads=1", "attention=scaled_dot"]
    heads = seq2seq.train(*small, "model.num_heads=4", "run_dir=runs/heads")
    display(seq2seq.explore({"4 heads": heads}, ["w3 w14 w7 w1"]))  # noqa: F821
