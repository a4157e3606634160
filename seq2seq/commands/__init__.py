"""The installed command: ``seq2seq COMMAND [ARGS]``, one program per job.

    seq2seq train attention=additive trainer.max_epochs=1     # python train.py's overrides
    seq2seq translate --model RUN/checkpoints/best.ckpt < in.txt
    seq2seq evaluate|export|explore|serve|compare|average|download|tune|align|check|toy-data --help

Each command is exactly the script of the same job in a checkout (``scripts/translate.py`` is
``seq2seq translate``, ``train.py`` is ``seq2seq train``): the scripts call these modules.
"""

from __future__ import annotations

import importlib
import sys

# Command -> (module, what it does).
COMMANDS = {
    "train": ("seq2seq.commands.train", "train a model (Hydra overrides, as python train.py)"),
    "translate": ("seq2seq.commands.translate", "translate lines of text"),
    "evaluate": ("seq2seq.commands.evaluate", "BLEU and chrF of a test set"),
    "export": ("seq2seq.commands.export", "a bundle (and ONNX or CTranslate2) from a checkpoint"),
    "explore": ("seq2seq.commands.explore", "the attention explorer page"),
    "serve": ("seq2seq.commands.serve", "the translation server (the serve extra)"),
    "compare": ("seq2seq.commands.compare", "compare runs over seeds, with paired tests"),
    "average": ("seq2seq.commands.average", "average a run's last checkpoints"),
    "download": ("seq2seq.commands.download", "download a real corpus"),
    "tune": ("seq2seq.commands.tune", "choose beam size and length penalty on a dev set"),
    "align": ("seq2seq.commands.align", "AER of a model against gold alignments"),
    "check": ("seq2seq.commands.check", "check an attention you wrote; the bug named"),
    "toy-data": ("seq2seq.commands.toy_data", "write a toy task's splits as files"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "usage: seq2seq COMMAND [ARGS]  (seq2seq COMMAND --help)\n\ncommands:\n" + "\n".join(
        lines
    )


def main(argv: list[str] | None = None) -> None:
    """Run ``seq2seq COMMAND ARGS``: the command's module with ``ARGS`` as its command line."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    name, arguments = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"error: seq2seq has no command {name!r}; the commands are {', '.join(COMMANDS)} "
            "(seq2seq --help says what each does).",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.argv = [f"seq2seq {name}", *arguments]  # what argparse and Hydra read
    module = importlib.import_module(COMMANDS[name][0])
    if name == "train":
        # Lightning starts DDP's other processes as `python sys.argv[0] ARGS`: the file of the
        # training command, which runs as a script.
        sys.argv[0] = str(module.__file__)
        module.main()
        return
    from seq2seq.cli import run

    run(module.main)
