# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Your own attention
#
# A scoring function written in a cell, checked against its formula, trained on the toy task, compared with scaled dot-product attention, exported, and loaded again — with trust, because a model file that names code outside the toolkit must not run it on its own. About a minute on two laptop cores.

# %%
import importlib.util, subprocess, sys
if importlib.util.find_spec("seq2seq") is None:  # a fresh environment: install the toolkit beside this notebook
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", ".."])

import math
import shutil
import torch
import seq2seq
from seq2seq import Translator
from seq2seq.attention import Attention, masked_softmax
from seq2seq.errors import Seq2SeqError

# %% [markdown]
# ## The scoring function
#
# **Distance attention**: score(q, k) = −‖q − k‖² / √d, the keys nearest the query win. Written out, −‖q‖² + 2 qᵀk − ‖k‖²: the ‖q‖² term is the same for every key of a row, so the softmax ignores it, and what is left is twice the scaled dot product with a penalty on long keys.
#
# A scoring function is a subclass of `seq2seq.attention.Attention` that implements `score(queries, projected_keys)` → (B, Tq, Tk). The toolkit does the rest: masking, softmax, temperature, dropout, several heads, beam search, checkpoints and export. `needs_equal_sizes` asks the model to project keys to the query's size, as for dot products.

# %%
class DistanceAttention(Attention):
    """score(q, k) = -‖q - k‖² / √d."""

    needs_equal_sizes = True

    def __init__(self, dropout: float = 0.0, temperature: float | str = 1.0,
                 initial_temperature: float = 1.0, *, query_size: int, key_size: int) -> None:
        super().__init__(dropout, temperature, initial_temperature)

    def score(self, queries, projected_keys):
        # (B, Tq, D) and (B, Tk, D) -> (B, Tq, Tk)
        return -torch.cdist(queries, projected_keys) ** 2 / math.sqrt(queries.shape[-1])

# %% [markdown]
# Checked against the formula written another way, and against the claim that it is the scaled dot product with a penalty on ‖k‖² (padding masked, rows of different lengths):

# %%
B, Tq, Tk, d = 3, 4, 6, 16
queries, keys, values = torch.randn(B, Tq, d), torch.randn(B, Tk, d), torch.randn(B, Tk, 5)
valid_lens = torch.tensor([6, 3, 1])
attention = DistanceAttention(query_size=d, key_size=d).eval()
context, weights = attention(queries, keys, values, valid_lens)

by_hand = masked_softmax(-((queries[:, :, None] - keys[:, None]) ** 2).sum(-1) / math.sqrt(d), valid_lens)
dot_minus_norm = masked_softmax((2 * queries @ keys.transpose(1, 2) - (keys ** 2).sum(-1)[:, None]) / math.sqrt(d), valid_lens)
assert torch.allclose(weights, by_hand, atol=1e-5) and torch.allclose(weights, dot_minus_norm, atol=1e-5)
assert torch.allclose(context, by_hand @ values, atol=1e-5)
print("weights as the formula says; padded keys get", weights[1, :, 3:].abs().max().item())

# %% [markdown]
# ## Train it, and a baseline
#
# `seq2seq.train(..., attention=DistanceAttention)` trains the class itself: its arguments come from the attention group the overrides choose (`attention=dot` has `dropout`, `temperature` and `initial_temperature`), and the model builds it in place of the built-in score. The baseline is scaled dot-product attention with the same overrides and seed.

# %%
SMALL = ["data.train_size=6000", "data.val_size=100", "data.test_size=100", "trainer.max_epochs=3",
         "logger=csv", "trainer.enable_progress_bar=false", "seed=1"]
shutil.rmtree("runs/own", ignore_errors=True)  # this notebook's own runs, afresh each time it runs
mine = seq2seq.train(*SMALL, "attention=dot", "run_dir=runs/own/distance", attention=DistanceAttention)
baseline = seq2seq.train(*SMALL, "attention=scaled_dot", "run_dir=runs/own/scaled_dot")
mine, baseline

# %% [markdown]
# ## Compare
#
# The runs' table, and a paired bootstrap test on the test set's hypotheses (one seed each here: the [train and compare](train_and_compare.ipynb) notebook shows intervals over seeds).

# %%
seq2seq.compare([baseline, mine], samples=200)  # the first group is the baseline of the tests

# %% [markdown]
# ## Export, and load with trust
#
# The checkpoint and the bundle name the class by its import path, `__main__.DistanceAttention`: `__main__` is this notebook. Loading a file that names a class outside the toolkit would run that module's code, so it is refused unless you trust the module — here your own notebook, `trust_modules=["__main__"]`. (`mine.translator()` and `mine.export()` trust it already: the run trained it.)

# %%
bundle = mine.export("runs/own/bundle")
try:
    Translator.load(bundle)
except Seq2SeqError as refusal:
    print("refused:", refusal)

# %%
translator = Translator.load(bundle, trust_modules=["__main__"])
translator.translate(["the two big dogs see a cat .", "my women do not help the boy ."])

# %% [markdown]
# **Where trust applies.** A class defined in a notebook lives in the notebook's `__main__`, so the bundle loads only in a process that defines `DistanceAttention` under that name — run the defining cell first, then load with `trust_modules=["__main__"]`. To share the model, or to use it from the command line, put the class in a file (e.g. `distance_attention.py`, as in [examples/cosine_attention](../examples/cosine_attention/)) and *import* it from there before training (`from distance_attention import DistanceAttention`: a class the file defines while it runs as a script would be `__main__`'s again); then load with `--trust-module distance_attention.py` on the command line (`seq2seq translate --model BUNDLE --trust-module distance_attention.py`) or `trust_modules=["distance_attention.py"]` in Python. Trust a module as you would `import` it.
