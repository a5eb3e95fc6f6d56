"""Where the program's data lives: the catalogue, trainer configs and stacks sit beside `infra/` in the repo."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PLATFORM_DIR = REPO_ROOT / "platform"
WORKLOADS_DIR = REPO_ROOT / "workloads"
TRAINER_CONFIGS_DIR = WORKLOADS_DIR / "configs"
STACKS_DIR = REPO_ROOT / "stacks"
