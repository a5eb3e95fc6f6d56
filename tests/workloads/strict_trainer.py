"""`python -m strict_trainer ...`: the trainer with a default process group that refuses CPU tensors.

Under NCCL the default group serves CUDA tensors only, and a CPU tensor sent to it fails with "No backend
type associated with device type cpu" (the crash at the first checkpoint in issue 10). Gloo would accept
it, so CPU runs could not see that class of bug. Here the default group is gloo registered for the cuda
device type only (a backend map, https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group):
any collective that reaches it with a CPU tensor, explicitly or by omitting its group, fails as on a GPU.
"""

from __future__ import annotations

import gc
from typing import Any

gc.disable()  # torch is imported here, before train.main, which imports it with the collector off: the same here
import torch.distributed as dist  # noqa: E402
from trainyard_train.train import main  # noqa: E402

_init_process_group = dist.init_process_group


def _init_without_cpu(*args: Any, **kwargs: Any) -> None:
    if kwargs.get("backend") == "gloo":
        kwargs["backend"] = "cuda:gloo"
    _init_process_group(*args, **kwargs)


dist.init_process_group = _init_without_cpu  # this test process only; the trainer itself patches nothing

if __name__ == "__main__":
    raise SystemExit(main())
