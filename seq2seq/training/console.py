"""Third-party messages that tell a user of this toolkit nothing, each stopped at its narrowest
point, so that ``python train.py`` shows Lightning's progress, our log lines and the summary.

Each is the one message named, from the one place that emits it; every other warning and log
line of the same libraries still shows (tests/test_console.py checks both). Messages with an
argument or setting that avoids them are handled where that call is made instead (sacreBLEU's
``force`` in ``seq2seq.analysis.metrics``, W&B's ``anonymous`` in ``seq2seq.training.loggers``,
matplotlib's tight bounding box in ``seq2seq.analysis.plotting``, the explicit checkpoint path of
``trainer.test``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# Lightning 2.6 advertises its hosted logger at every Trainer start ("💡 Tip: ... litlogger"),
# through rank_zero_info, with no argument to turn it off; and it says that it skips its own
# model summary when it finds ours (``pipeline.callbacks.ParameterSummary``), our choice, not the
# user's. The same logger also says which accelerator runs, which stays.
LIGHTNING_LOGGER = "pytorch_lightning.utilities.rank_zero"
LIGHTNING_TIP = "💡 Tip:"
LIGHTNING_OWN_SUMMARY = "Trainer already configured with model summary callbacks"
# Lightning 2.6's CombinedLoader builds torch's deprecated ``LeafSpec()`` for every dataloader
# (fixed upstream after 2.6.6, Lightning-AI/pytorch-lightning#21326): a FutureWarning addressed to
# Lightning's developers, raised from their module whatever our code does.
PYTREE_MESSAGE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
PYTREE_MODULE = r"pytorch_lightning\.utilities\._pytree"


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith((LIGHTNING_TIP, LIGHTNING_OWN_SUMMARY))


_TIP_FILTER = _DropLightningTips()


def drop_lightning_tips() -> None:
    """Stop Lightning's advertising tips and its note that our model summary replaces its own
    (idempotent: the same filter is added once)."""
    logging.getLogger(LIGHTNING_LOGGER).addFilter(_TIP_FILTER)


@contextmanager
def lightning_quietly() -> Iterator[None]:
    """Around ``trainer.fit`` / ``test`` / ``validate``: without Lightning's tips and its own
    deprecation warning; every other warning is shown as before."""
    drop_lightning_tips()
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", PYTREE_MESSAGE, category=FutureWarning, module=PYTREE_MODULE
        )
        yield
