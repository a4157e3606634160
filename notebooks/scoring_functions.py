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
# # Scoring functions, from the formula
#
# Attention is `softmax(score(q, k)) · V`. This notebook writes the pieces out by hand — the masked softmax, additive (Bahdanau) and scaled dot-product (Vaswani) scoring — checks each against the toolkit's own modules with the same weights, then turns the seven claims of [docs/attention.md](../docs/attention.md) into small live experiments: unscaled dot products grow as √d; tanh saturates; a scalar bias does nothing; only v/T is identifiable; additive attention learns an XOR that no bilinear score can; two heads retrieve what one cannot; the FFN acts on each position alone. No data: it runs in well under a minute on a laptop CPU.

# %%
import importlib.util, subprocess, sys
if importlib.util.find_spec("seq2seq") is None:  # a fresh environment: install the toolkit beside this notebook
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", ".."])

import math
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from seq2seq.attention import (AdditiveAttention, DotProductAttention, GeneralAttention,
                               MultiHeadAttention, masked_softmax)
from seq2seq.models.transformer import PositionWiseFFN, TransformerEncoderLayer

_ = torch.manual_seed(0)

# %% [markdown]
# ## The masked softmax
#
# A batch pads its sentences to one length; the padded keys must get weight **exactly 0**, and a query with no key at all gets a row of zeros (not NaN, not uniform). By hand: set padded scores to −∞, softmax, then zero the rows with nothing to read.

# %%
scores = torch.randn(2, 3, 5)            # (B, Tq, Tk)
valid_lens = torch.tensor([3, 0])          # sentence 1 has 3 real keys, sentence 2 none

def masked_softmax_by_hand(scores, valid_lens):
    keys = torch.arange(scores.shape[-1])
    mask = keys[None, None, :] < valid_lens[:, None, None]          # (B, 1, Tk): real keys
    weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.nan_to_num(weights, nan=0.0)                        # an empty row: all zeros

ours = masked_softmax(scores, valid_lens)
print(ours[0, 0], ours[1, 0])
assert torch.allclose(ours, masked_softmax_by_hand(scores, valid_lens))

# %% [markdown]
# ## Additive attention (Bahdanau et al., 2015)
#
# score(q, k) = w_vᵀ tanh(W_q q + W_k k): a one-hidden-layer network over each query–key pair. The module keeps W_q, W_k and w_v; we reuse its weights and compute the same thing in three lines.

# %%
B, Tq, Tk, Dq, Dk, H = 2, 4, 6, 8, 10, 16
queries, keys, values = torch.randn(B, Tq, Dq), torch.randn(B, Tk, Dk), torch.randn(B, Tk, 7)
valid_lens = torch.tensor([6, 4])
additive = AdditiveAttention(query_size=Dq, key_size=Dk, num_hiddens=H).eval()

features = torch.tanh(additive.W_q(queries)[:, :, None, :] + additive.W_k(keys)[:, None, :, :])  # (B, Tq, Tk, H)
by_hand = masked_softmax(additive.w_v(features).squeeze(-1), valid_lens)                         # (B, Tq, Tk)
context, weights = additive(queries, keys, values, valid_lens)
assert torch.allclose(weights, by_hand, atol=1e-6)
assert torch.allclose(context, by_hand @ values, atol=1e-6)
print("additive: the same weights and context as the module")

# %% [markdown]
# ## Scaled dot-product attention (Vaswani et al., 2017)
#
# score(q, k) = qᵀk / √d: no parameters at all; the query and key must have the same size d.

# %%
d = 8
queries, keys = torch.randn(B, Tq, d), torch.randn(B, Tk, d)
dot = DotProductAttention(scaled=True).eval()
by_hand = masked_softmax(queries @ keys.transpose(1, 2) / math.sqrt(d), valid_lens)
context, weights = dot(queries, keys, values, valid_lens)
assert torch.allclose(weights, by_hand, atol=1e-6) and torch.allclose(context, by_hand @ values, atol=1e-6)
print("scaled dot product: the same weights and context as the module")

# %% [markdown]
# ## Claim 1: unscaled dot products grow as √d and saturate the softmax
#
# With q and k of independent unit-variance entries, qᵀk is a sum of d products of variance 1: its standard deviation is √d. Softmax over such scores puts nearly all weight on one key as d grows; dividing by √d keeps the scores at variance 1.

# %%
sizes = [4, 16, 64, 256, 1024]
std, top_unscaled, top_scaled = [], [], []
for d in sizes:
    q, k = torch.randn(2000, 1, d), torch.randn(2000, 10, d)
    s = (q @ k.transpose(1, 2)).squeeze(1)                  # (2000, 10) scores
    std.append(s.std().item())
    top_unscaled.append(s.softmax(-1).max(-1).values.mean().item())
    top_scaled.append((s / math.sqrt(d)).softmax(-1).max(-1).values.mean().item())

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
left.loglog(sizes, std, "o-", label="std of qᵀk")
left.loglog(sizes, [math.sqrt(d) for d in sizes], "--", label="√d")
left.set_xlabel("d"); left.legend()
right.semilogx(sizes, top_unscaled, "o-", label="unscaled")
right.semilogx(sizes, top_scaled, "o-", label="scaled by √d")
right.set_xlabel("d"); right.set_ylabel("mean largest weight (10 keys)"); right.legend()
plt.tight_layout()
for d, s in zip(sizes, std):
    assert abs(s / math.sqrt(d) - 1) < 0.1   # the claim, within sampling noise

# %% [markdown]
# ## Claim 2: the tanh of additive attention saturates when its inputs grow
#
# If W_q q + W_k k is large, tanh sits at ±1 where its gradient is ~0: the score stops responding to the query. The share of saturated units (|tanh| > 0.99) grows with the scale of the inputs. (LayerNorm before the tanh, `attention.layer_norm=true`, keeps it in range; docs/attention.md §2 measures it in training.)

# %%
scales = [0.25, 0.5, 1, 2, 4, 8]
additive = AdditiveAttention(query_size=32, key_size=32, num_hiddens=64).eval()
saturated = []
with torch.no_grad():
    for scale in scales:
        q, k = scale * torch.randn(64, 1, 32), scale * torch.randn(64, 12, 32)
        pre = additive.W_q(q)[:, :, None, :] + additive.W_k(k)[:, None, :, :]
        saturated.append((torch.tanh(pre).abs() > 0.99).float().mean().item())
plt.figure(figsize=(5, 3.2))
plt.semilogx(scales, saturated, "o-")
plt.xticks(scales, [f"{scale:g}" for scale in scales]); plt.minorticks_off()
plt.xlabel("scale of queries and keys"); plt.ylabel("share of |tanh| > 0.99")
plt.tight_layout()
assert saturated == sorted(saturated) and saturated[-1] > 0.5 > saturated[0]

# %% [markdown]
# ## Claim 3: a scalar bias on a dot-product score does nothing; a bias inside the tanh does
#
# softmax(s + c) = softmax(s): every score of a row moves by the same c, and e^c cancels in the normalisation, so a learned scalar bias gets no gradient worth the name. A bias vector *inside* additive attention's tanh, w_vᵀ tanh(W_q q + W_k k + b), is not a shift of the scores: it changes which keys win (`attention.bias=true`).

# %%
q, k = torch.randn(8, 5, 32), torch.randn(8, 9, 32)
lens = torch.randint(1, 10, (8,))                               # every sentence has a key
dot = DotProductAttention(scaled=True).eval()
plain = dot(q, k, k, lens)[1]                                   # (8, 5, 9)
for c in (-10.0, 0.5, 10.0):
    shifted = masked_softmax(dot.logits(q, k) + c, lens)
    print(f"dot product, score + {c:>5}: largest change of a weight {(shifted - plain).abs().max():.1e}")
    assert (shifted - plain).abs().max() < 1e-5

additive = AdditiveAttention(query_size=32, key_size=32, num_hiddens=32, bias=True).eval()
with torch.no_grad():
    additive.W_q.bias.zero_()
    without = additive(q, k, k, lens)[1]
    additive.W_q.bias.normal_()                                 # b inside the tanh
    inside = additive(q, k, k, lens)[1]
moved = (inside - without).abs().max()
print(f"additive, b inside the tanh: largest change of a weight {moved:.1e}")
assert moved > 1e-2

# %% [markdown]
# ## Claim 4: with a learnable temperature only v/T is identifiable
#
# Additive attention's score is linear in w_v, so (α w_v, α T) gives exactly the weights of (w_v, T): training can move along that line at no cost, and a learned T means nothing on its own — only the ratio does. Scaling w_v alone (the control) does change the weights.

# %%
q, k = torch.randn(8, 5, 16), torch.randn(8, 9, 16)
additive = AdditiveAttention(query_size=16, key_size=16, num_hiddens=16, temperature="learnable").eval()
with torch.no_grad():
    before = additive(q, k, k)[1]
    additive.w_v.weight.mul_(3.0)
    scale_only = additive(q, k, k)[1]
    additive.log_temperature.add_(math.log(3.0))                 # T times 3 as well
    same_ratio = additive(q, k, k)[1]
print(f"w_v × 3:          largest change {(scale_only - before).abs().max():.3f}")
print(f"w_v × 3, T × 3:   largest change {(same_ratio - before).abs().max():.1e}")
assert (same_ratio - before).abs().max() < 1e-5 < (scale_only - before).abs().max()

# %% [markdown]
# ## Claim 5: additive attention learns an XOR pattern that no bilinear score can
#
# Keys are corners (x₁, x₂) of {−1, 1}²; a query of type 0 must find the one key whose bits differ (x₁ XOR x₂), a query of type 1 the one key whose bits are equal. For a fixed query a bilinear score qᵀWk is linear in k, and f(1,−1) + f(−1,1) = 0 = f(1,1) + f(−1,−1): some target pattern never beats some distractor pattern, so its accuracy is at most 1/2 + 2^−Tk, the best it can ever do; while it tries, it swings between patterns it cannot hold together and can fall below chance. Additive attention's tanh layer is a small network over (q, k) and can learn it. The figure shows the accuracy at every step; the printout, the best each reached.

# %%
def xor_batch(batch_size, num_keys, generator):
    """queries (B, 1, 2), keys (B, Tk, 2), targets (B,): the key each query must find."""
    query_type = torch.randint(0, 2, (batch_size,), generator=generator)
    queries = F.one_hot(query_type, 2).float()[:, None, :]
    first_bit = torch.randint(0, 2, (batch_size, num_keys), generator=generator) * 2 - 1
    targets = torch.randint(0, num_keys, (batch_size,), generator=generator)
    bits_differ = F.one_hot(targets, num_keys).bool() == (query_type[:, None] == 0)  # (B, Tk)
    keys = torch.stack([first_bit, torch.where(bits_differ, -first_bit, first_bit)], -1).float()
    return queries, keys, targets

def train_xor(attention, steps=300, num_keys=4):
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(attention.parameters(), lr=0.03)
    generator = torch.Generator().manual_seed(0)
    held_out = xor_batch(4096, num_keys, torch.Generator().manual_seed(1))
    accuracy = []
    for step in range(steps):
        queries, keys, targets = xor_batch(256, num_keys, generator)
        weights = attention(queries, keys, keys)[1][:, 0]                        # (B, Tk)
        loss = F.nll_loss(weights.clamp(min=1e-30).log(), targets)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        with torch.no_grad():
            queries, keys, targets = held_out
            accuracy.append((attention(queries, keys, keys)[1][:, 0].argmax(-1) == targets).float().mean().item())
    return accuracy

torch.manual_seed(0)
curves = {"additive": train_xor(AdditiveAttention(query_size=2, key_size=2, num_hiddens=16)),
          "general (bilinear)": train_xor(GeneralAttention(query_size=2, key_size=2))}
plt.figure(figsize=(5, 3.2))
for name, accuracy in curves.items():
    plt.plot(accuracy, label=name)
plt.axhline(0.5 + 2**-4, ls="--", c="grey", label="bilinear bound 1/2 + 2⁻⁴")
plt.axhline(1 / 4, ls=":", c="grey", label="chance, 1 of 4 keys")
plt.xlabel("step"); plt.ylabel("held-out accuracy"); plt.ylim(0, 1.05)
plt.legend(loc="center right", fontsize=8); plt.tight_layout()
best = {name: max(accuracy) for name, accuracy in curves.items()}
print("best held-out accuracy over training:", {name: round(value, 3) for name, value in best.items()})
assert best["general (bilinear)"] <= 0.5 + 2**-4 + 0.02 < best["additive"]

# %% [markdown]
# ## Claim 6: two heads retrieve what one head cannot
#
# The keys are positions (one-hot), the values random; a query names two positions and asks for both values, [v_p ; v_p′]. Two heads can each attend to one position. One head returns one mixture a v_p + b v_p′, and no read-out recovers both: its mean squared error stays at 1/2 or above, whatever it learns.

# %%
def retrieval_batch(batch_size, num_keys, value_size, generator):
    first = torch.randint(0, num_keys, (batch_size,), generator=generator)
    second = (first + torch.randint(1, num_keys, (batch_size,), generator=generator)) % num_keys
    queries = torch.cat([F.one_hot(first, num_keys), F.one_hot(second, num_keys)], -1).float()[:, None, :]
    keys = torch.eye(num_keys).expand(batch_size, -1, -1)                       # (B, Tk, Tk)
    values = torch.randn(batch_size, num_keys, value_size, generator=generator)  # (B, Tk, Dv)
    rows = torch.arange(batch_size)
    targets = torch.cat([values[rows, first], values[rows, second]], -1)[:, None, :]  # (B, 1, 2 Dv)
    return queries, keys, values, targets

def train_heads(num_heads, steps=400, num_keys=8, value_size=8):
    torch.manual_seed(0)
    block = MultiHeadAttention(DotProductAttention(scaled=True), num_heads, 2 * num_keys, num_keys,
                               value_size, 2 * value_size)
    optimizer = torch.optim.Adam(block.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    queries, keys, values, targets = retrieval_batch(2048, num_keys, value_size, torch.Generator().manual_seed(1))
    errors = []
    for step in range(steps):
        batch = retrieval_batch(256, num_keys, value_size, generator)
        loss = F.mse_loss(block(*batch[:3])[0], batch[3])
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        with torch.no_grad():
            errors.append(F.mse_loss(block(queries, keys, values)[0], targets).item())
    return errors

errors = {f"{h} head{'s' if h > 1 else ''}": train_heads(h) for h in (1, 2)}
plt.figure(figsize=(5, 3.2))
for name, error in errors.items():
    plt.semilogy(error, label=name)
plt.axhline(0.5, ls="--", c="grey", label="one head's bound")
plt.xlabel("step"); plt.ylabel("held-out mean squared error"); plt.legend(); plt.tight_layout()
print({name: round(error[-1], 3) for name, error in errors.items()})
assert errors["2 heads"][-1] < 0.5 <= errors["1 head"][-1] + 0.02

# %% [markdown]
# ## Claim 7: the FFN acts on each position on its own; self-attention mixes positions
#
# Change the input at one position and see which output positions move. The Transformer's position-wise FFN, max(0, xW₁ + b₁)W₂ + b₂, changes only that position; self-attention changes the output at every position, because every query reads the changed key and value (and the changed position need not move most: its output is a weighted average of all the values, not its own input).

# %%
torch.manual_seed(0)
size, positions, changed = 64, 12, 4
ffn = PositionWiseFFN(size, 4 * size).eval()
layer = TransformerEncoderLayer(lambda query_size, key_size: DotProductAttention(scaled=True),
                                size, 4, 4 * size, dropout=0.0, attention_dropout=0.0, norm_first=False).eval()
lengths = torch.tensor([positions])
blocks = {"position-wise FFN": ffn,
          "self-attention (4 heads)": lambda x: layer.self_attention(x, x, x, lengths)[0]}
x = torch.randn(1, positions, size)                                             # (1, T, D)
nudged = x.clone(); nudged[0, changed] += torch.randn(size)
plt.figure(figsize=(6, 3.2))
with torch.no_grad():
    for name, block in blocks.items():
        moved = (block(nudged) - block(x))[0].norm(dim=-1)                   # (T,) per output position
        plt.plot(moved, "o-", label=name)
        others = torch.cat([moved[:changed], moved[changed + 1:]])
        print(f"{name}: moved {moved[changed]:.2f} at position {changed}; elsewhere from "
              f"{others.min():.1e} to {others.max():.1e}, {int((others > 1e-6).sum())} of {len(others)} positions moved")
plt.xlabel("output position"); plt.ylabel(f"‖Δ output‖ (input changed at {changed})"); plt.legend(); plt.tight_layout()
with torch.no_grad():
    assert (ffn(nudged) - ffn(x))[0, torch.arange(positions) != changed].abs().max() < 1e-6
    attended = layer.self_attention(nudged, nudged, nudged, lengths)[0] - layer.self_attention(x, x, x, lengths)[0]
    assert (attended[0].norm(dim=-1) > 1e-6).all()  # every position moved

# %% [markdown]
# Next: train scoring functions on the toy task and compare them over seeds ([train_and_compare.ipynb](train_and_compare.ipynb)), write and train your own ([your_own_attention.ipynb](your_own_attention.ipynb)), or open a Transformer's heads ([inside_a_transformer.ipynb](inside_a_transformer.ipynb)).
