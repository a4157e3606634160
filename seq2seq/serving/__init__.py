"""The translation server (``seq2seq serve``): an HTTP JSON API over Translators, requests
merged into batched searches, and the attention explorer page served live."""

from seq2seq.errors import SERVER, require_extra

# Every module here imports the serve extra's packages: say which extra is missing, once, here.
require_extra("serve", SERVER)
