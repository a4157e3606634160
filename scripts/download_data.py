"""Download a real corpus, verify its sha256 and write it atomically.

The installed command ``seq2seq download`` is the same program (seq2seq/commands/download.py).
"""

from seq2seq.cli import run
from seq2seq.commands.download import main

if __name__ == "__main__":
    run(main)
