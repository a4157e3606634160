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
# # Inside a Transformer
#
# A small Transformer (2 encoder and 2 decoder layers, 4 heads each) trained on the toy task for about half a minute, then opened up: its layers × heads in the explorer, every cross-attention head scored against the gold word alignments, one head's map read against the toy language's rules, and the encoder's self-attention heads summed up by where they look.

# %%
import importlib.util, subprocess, sys
if importlib.util.find_spec("seq2seq") is None:  # a fresh environment: install the toolkit beside this notebook
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", ".."])

import shutil

import hydra.utils
import matplotlib.pyplot as plt
import torch
import seq2seq
from seq2seq.analysis.alignment import GoldAlignment, argmax_links, corpus_aer
from seq2seq.explorer.data import self_attention

# %% [markdown]
# ## Train
#
# The same overrides as `seq2seq train model=transformer …` on the command line: d_model 64, 4 heads of 16, 2 + 2 layers, 6,000 toy sentences for 6 epochs.

# %%
shutil.rmtree("runs/transformer", ignore_errors=True)  # this notebook's own run, afresh each time it runs
run = seq2seq.train("model=transformer", "model.d_model=64", "model.num_heads=4", "model.d_ff=128",
                    "model.encoder_layers=2", "model.decoder_layers=2",
                    "data.train_size=6000", "data.val_size=100", "data.test_size=100", "trainer.max_epochs=6",
                    "logger=csv", "trainer.enable_progress_bar=false", "run_dir=runs/transformer")
translator = run.translator()
print(run, f"· test BLEU {run.summary['test_bleu']:.1f}, test AER {run.summary['test_aer']:.3f}")

# %% [markdown]
# The run's own validation sentences, with their gold links: its config builds the same corpus.

# %%
val = hydra.utils.instantiate(run.config.data.corpus).splits()["val"]
sources = [example.src for example in val]
references = [example.tgt for example in val]
gold = [GoldAlignment.from_links(example.alignment) for example in val]
print(sources[0], "→", references[0])

# %% [markdown]
# ## Every layer and head in the explorer
#
# The menus pick a layer and a head (or a layer's average); the thumbnails show every head of the layer at once, each with its AER against the gold links; the self-attention view shows the encoder's and decoder's own heads.

# %%
seq2seq.explore({"transformer": run}, sources[:6], references[:6], gold[:6])

# %% [markdown]
# ## Which heads align?
#
# For every cross-attention head: read each reference with teacher forcing, link each target word to the source word the head attends to most, and score those links against the gold ones (AER: 0 is perfect). The model's own `test_aer` uses the last layer's average of its heads: when that average aligns better than every head alone, no one head carries the alignment, the heads share it.

# %%
heads = [translator.attention_heads(src, ref.split()) for src, ref in zip(sources, references)]  # each (L, h, T, S)
layers, num_heads = heads[0].shape[:2]
aer = torch.zeros(layers, num_heads)
for layer in range(layers):
    for head in range(num_heads):
        links = [argmax_links(weights[layer, head], len(src.split()), len(ref.split()))
                 for weights, src, ref in zip(heads, sources, references)]
        aer[layer, head] = corpus_aer(links, gold)
mean_aer = [corpus_aer([argmax_links(weights[layer].mean(0), len(src.split()), len(ref.split()))
                        for weights, src, ref in zip(heads, sources, references)], gold) for layer in range(layers)]

plt.figure(figsize=(5, 2.6))
plt.imshow(aer, cmap="viridis_r", vmin=0, vmax=1)
plt.colorbar(label="AER (lower aligns better)")
plt.xticks(range(num_heads), [f"head {h}" for h in range(num_heads)])
plt.yticks(range(layers), [f"layer {l}" for l in range(layers)])
for (layer, head), value in [((l, h), aer[l, h]) for l in range(layers) for h in range(num_heads)]:
    plt.text(head, layer, f"{value:.2f}", ha="center", va="center", color="white" if value > 0.5 else "black")
plt.title("cross-attention heads against the gold links"); plt.tight_layout()
best_layer, best_head = divmod(int(aer.argmin()), num_heads)
print(f"best head: layer {best_layer}, head {best_head}, AER {aer.min():.3f}; "
      f"layer averages: {', '.join(f'{value:.3f}' for value in mean_aer)}")
better = "better" if mean_aer[-1] < aer[-1].min() else "no better"
print(f"the last layer's average of its heads aligns {better} than the best of them alone")

# %% [markdown]
# ## One head's pattern, explained
#
# The toy language moves the verb to the end of its clause, mirrors each noun phrase (noun, adjectives reversed, numeral, determiner), turns prepositions into postpositions and drops the articles (`seq2seq/data/toy.py`). A head that aligns must therefore leave the diagonal: the map below (left) is the best head's on one sentence, the gold links (right) are what the grammar says. Where they agree, the head has learned where each target word comes from; a target word with no gold link (the object marker `ka`) shows where the head looks when nothing in the source is its origin.

# %%
index = max(range(len(sources)), key=lambda i: len(gold[i].sure) if len(sources[i].split()) <= 9 else 0)
src, ref = sources[index].split(), references[index].split()
weights = heads[index][best_layer, best_head, :, : len(src)]                            # (T, S)
gold_map = torch.zeros(len(ref), len(src))
for i, j in gold[index].sure:
    gold_map[j, i] = 1
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for axis, matrix, title in [(axes[0], weights, f"layer {best_layer}, head {best_head}"), (axes[1], gold_map, "gold links")]:
    axis.imshow(matrix, cmap="viridis_r", vmin=0, vmax=1)
    axis.set_xticks(range(len(src)), src, rotation=60); axis.set_yticks(range(len(ref)), ref); axis.set_title(title)
plt.tight_layout()
agree = sum((int(weights[j].argmax()), j) in gold[index].sure for j in range(len(ref)))
print(f"{agree} of the {len(gold[index].sure)} gold links are this head's strongest weight in their row")

# %% [markdown]
# ## Where the encoder's heads look
#
# Self-attention has no order of its own; the positional encodings give it one, and a head can specialise by *offset*: the previous word, the next one, itself. Whether this model's heads do, after half a minute of training, is what the plot shows. Averaged over the validation sentences, the weight each encoder head puts at offsets −3 … +3 from the query's own position:

# %%
offsets = range(-3, 4)
profile = torch.zeros(layers, num_heads, len(offsets))
for src, ref in zip(sources, references):
    encoder, _ = self_attention(translator, src, ref.split())                  # (L, h, S, S)
    for column, offset in enumerate(offsets):
        profile[:, :, column] += torch.diagonal(encoder, offset=offset, dim1=-2, dim2=-1).sum(-1) / encoder.shape[-1]
profile /= len(sources)
plt.figure(figsize=(6, 3.2))
plt.imshow(profile.reshape(layers * num_heads, -1), cmap="viridis_r", vmin=0)
plt.colorbar(label="mean weight")
plt.xticks(range(len(offsets)), [f"{o:+d}" for o in offsets]); plt.xlabel("key position − query position")
plt.yticks(range(layers * num_heads), [f"L{l} h{h}" for l in range(layers) for h in range(num_heads)])
plt.tight_layout()
for layer in range(layers):
    for head in range(num_heads):
        peak = int(profile[layer, head].argmax())
        print(f"encoder layer {layer} head {head}: most weight at offset {offsets[peak]:+d} "
              f"({profile[layer, head, peak]:.2f} of each row on average)")

# %% [markdown]
# A head that puts most of each row at one offset is positional: it passes a neighbour's word along, which the noun-phrase mirroring needs. A head whose weight spreads over many offsets reads by content. Try `model.num_heads=1` or `model.encoder_layers=1` as more overrides, or another scoring function in every head (`attention=additive`), and run the notebook again.
