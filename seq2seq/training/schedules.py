"""Learning-rate schedules beyond torch's own.

``inverse_sqrt``: the Transformer's schedule (Vaswani et al., 2017, eq. 3, as fairseq writes it):
the rate rises linearly from ``warmup_init_lr`` to the optimizer's ``lr`` over ``warmup_steps``
updates, then decays with the inverse square root of the update number,

    lr(n) = lr · n / warmup_steps                      for n <= warmup_steps (from warmup_init_lr)
    lr(n) = lr · sqrt(warmup_steps / n)                 afterwards,

so that it is continuous at the end of the warm-up. It steps once per optimizer update
(``interval = "step"``); torch's schedulers here step once per epoch.
"""

from __future__ import annotations

import math
from typing import ClassVar

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from seq2seq.errors import ConfigError


class InverseSquareRootSchedule(LambdaLR):
    """Linear warm-up, then ``lr · sqrt(warmup_steps / n)`` (module docstring)."""

    interval: ClassVar[str] = "step"  # how often the training loop steps it

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int = 4000, warmup_init_lr: float = 1e-7
    ) -> None:
        if type(warmup_steps) is not int or warmup_steps < 1:
            raise ConfigError(
                f"optim.scheduler.warmup_steps must be a positive integer, got {warmup_steps!r} "
                "(updates over which the learning rate rises to optim.optimizer.lr)."
            )
        self.warmup_steps = warmup_steps
        peak = optimizer.param_groups[0]["lr"]
        if not 0 <= warmup_init_lr <= peak:
            raise ConfigError(
                f"optim.scheduler.warmup_init_lr must lie in [0, optim.optimizer.lr = {peak}], "
                f"got {warmup_init_lr!r}."
            )
        self.start_ratio = warmup_init_lr / peak if peak > 0 else 0.0
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        """The multiplier of the optimizer's lr before update ``step + 1`` (LambdaLR counts
        from 0 before the first update)."""
        update = step + 1
        if update <= self.warmup_steps:
            return self.start_ratio + (1 - self.start_ratio) * update / self.warmup_steps
        return math.sqrt(self.warmup_steps / update)
