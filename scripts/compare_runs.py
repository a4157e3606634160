"""Compare training runs side by side from their local files (no W&B server needed).

The installed command ``seq2seq compare`` is the same program (seq2seq/commands/compare.py).
"""

from seq2seq.cli import run
from seq2seq.commands.compare import main

if __name__ == "__main__":
    run(main)
