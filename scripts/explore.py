"""Write the attention explorer: one self-contained HTML page (no network) for one to four models.

The installed command ``seq2seq explore`` is the same program (seq2seq/commands/explore.py).
"""

from seq2seq.cli import run
from seq2seq.commands.explore import main

if __name__ == "__main__":
    run(main)
