"""trainyard_train: an elastic torchrun/DDP trainer with DCP checkpoints (see workloads/README.md)."""

__version__ = "0.1.0"
