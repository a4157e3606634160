"""Serve models over HTTP: concurrent requests are merged into batched searches.

The installed command ``seq2seq serve`` is the same program (seq2seq/commands/serve.py).
"""

from seq2seq.cli import run
from seq2seq.commands.serve import main

if __name__ == "__main__":
    run(main)
