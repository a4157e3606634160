"""The translation server (``scripts/serve.py``): an HTTP JSON API over Translators, requests
merged into batched searches, and the attention explorer page served live."""
