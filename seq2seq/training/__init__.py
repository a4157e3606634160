"""Training: the LightningModule (loss, metrics, optimizers, schedules), callbacks,
checkpointing, loggers, DDP helpers and CUDA graphs."""
