"""The translation server (``seq2seq serve``): an HTTP JSON API over Translators, requests
merged into batched searches, and the attention explorer page served live."""
