"""Train an attention encoder–decoder: ``python train.py attention=scaled_dot``, from a checkout;
the same as the installed ``seq2seq train attention=scaled_dot`` (``seq2seq/commands/train.py``)."""

from seq2seq.commands.train import main

if __name__ == "__main__":
    main()
