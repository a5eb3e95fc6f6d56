"""The trainer's command line: the trainer's node agent (torchrun's, behind an exit-code contract) around
`python -m trainyard_train`, elastic or single-node.

Rendezvous for elastic jobs is c10d, hosted by the torchrun agent of pod `<job>-worker-0`, reached through
the headless Service of Volcano's `svc` plugin (stable name, published before the pod is ready). That agent is
told explicitly that it hosts the store (`is_host`): torch would otherwise guess by resolving the endpoint,
which fails while the pod's DNS record is not yet published. When worker-0 is lost the store goes with it:
every other agent's next store call fails, and the agent exits STORE_LOST_EXIT_CODE, which restarts the whole
Volcano job once from the last checkpoint (volcano.py) instead of costing one retry per surviving pod.

The agent (`python -m trainyard_train.agent`, workloads/trainyard_train/agent.py) takes torchrun's arguments and
exits with the trainer's codes: CONFIG_ERROR_EXIT_CODE for a config error found before or after the rendezvous
(plain torchrun would retry it like a crash and exit 1), STOPPED_EXIT_CODE once a signal's checkpoint is committed,
CRASH_EXIT_CODE for what a retry may fix. The Volcano job's policies act on these (volcano.py).
"""

from __future__ import annotations

import posixpath

from trainyard.config.model import Job

RDZV_PORT = 29400
METRICS_PORT = 9108
CONFIG_DIR = "/etc/trainyard"
CHECKPOINT_DIR = "/checkpoints"
# The Alluxio dataset claim, mounted read-only.
DATASET_DIR = "/data"
WORKER_TASK = "worker"
# Worker-process failures each torchrun agent absorbs before it gives up (membership changes do not count).
TORCHRUN_MAX_RESTARTS = 10
# Seconds the first agents wait for --nnodes MIN to join: pulling a large image onto fresh nodes is slow.
RDZV_JOIN_TIMEOUT = 1800
# Seconds a rendezvous waits for more nodes once MIN have joined (c10d's last_call_timeout, 30 by default:
# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py). Volcano starts a gang's pods together, so
# peers arrive within seconds; a node that comes later joins through torchrun's scale-up restart.
RDZV_LAST_CALL_TIMEOUT = 5
SMOKE_STEPS = 20
# torchrun forwards SIGTERM to its workers and SIGKILLs them after --shutdown-timeout (30 s by default): it must
# outwait the trainer's checkpoint grace, and the kubelet (terminationGracePeriodSeconds) must outwait torchrun.
SHUTDOWN_MARGIN_SECONDS = 10


def shutdown_timeout(job: Job) -> int:
    return job.checkpoint_grace_seconds + SHUTDOWN_MARGIN_SECONDS

# The trainer's exit codes (workloads/trainyard_train/exitcodes.py; this layer does not import the trainer, and the
# rendered-job runner checks both agree by running the rendered command).
CRASH_EXIT_CODE = 1
CONFIG_ERROR_EXIT_CODE = 2
STORE_LOST_EXIT_CODE = 75
GRACE_EXPIRED_EXIT_CODE = 124
STOPPED_EXIT_CODE = 143
AGENT = "python -m trainyard_train.agent"
# $VC_TASK_INDEX comes from Volcano's env plugin; "$@" are the container args (the torchrun flags below).
_IS_HOST = 'if [ "$VC_TASK_INDEX" = 0 ]; then host=1; else host=0; fi; '
_RDZV_CONF = (f'--rdzv-conf="is_host=$host,join_timeout={RDZV_JOIN_TIMEOUT},'
              f'last_call_timeout={RDZV_LAST_CALL_TIMEOUT}"')
# Any module over an elastic c10d rendezvous (the fabric check runs its own module with it).
ELASTIC_WRAPPER = f'{_IS_HOST}exec torchrun {_RDZV_CONF} "$@"'
# The trainer's: the node agent checks its config, then runs torchrun's agent.
TRAINER_ELASTIC_WRAPPER = f'{_IS_HOST}exec {AGENT} {_RDZV_CONF} "$@"'
SINGLE_NODE_WRAPPER = f'exec {AGENT} "$@"'


def rendezvous_endpoint(job_name: str, namespace: str) -> str:
    """worker-0's name under the svc plugin's headless Service (hostname.subdomain.namespace.svc)."""
    return f"{job_name}-{WORKER_TASK}-0.{job_name}.{namespace}.svc:{RDZV_PORT}"


def dataset_root(claim_subpath: str = "") -> str:
    """Where datasets sit in the pod: the claim's mount, plus the directory of the claim the cache's data shows at
    (platform/alluxio.py `claim_subpath`, Fluid's mount-path rule)."""
    return posixpath.join(DATASET_DIR, claim_subpath.strip("/")).rstrip("/")


def trainer_module_args(job: Job, *overrides: str, datasets: str = DATASET_DIR) -> list[str]:
    """`-m trainyard_train` with the mounted config and the overrides the pod's layout dictates; `datasets` is
    where the dataset claim shows the cache's data (`dataset_root`)."""
    return [
        "-m", "trainyard_train", "--config", f"{CONFIG_DIR}/{job.trainer_config}",
        f"run_dir={CHECKPOINT_DIR}",
        # The trainer's own watchdog must fire before the kubelet's SIGKILL (terminationGracePeriodSeconds).
        f"shutdown.grace_period_s={job.checkpoint_grace_seconds}",
        *_dataset_overrides(job, datasets),
        *overrides,
    ]


def _dataset_overrides(job: Job, datasets: str) -> list[str]:
    """Read prepared shards from the dataset mount; never write into it (it is read-only)."""
    if job.dataset is None:
        return []
    return [f"data.path={posixpath.join(datasets, job.dataset)}", "data.generate=false"]


def _numa(binding: str | None) -> list[str]:
    """torchrun --numa-binding (torch 2.13; it runs each worker under numactl, which the image installs)."""
    return [f"--numa-binding={binding}"] if binding else []


def elastic(job: Job, namespace: str, processes: int, *, datasets: str = DATASET_DIR,
            numa_binding: str | None = None) -> tuple[list[str], list[str]]:
    """(command, args) of a multi-node elastic job: torchrun --nnodes=MIN:MAX over c10d."""
    args = [
        f"--nnodes={job.min_nodes}:{job.max_nodes}",
        f"--nproc-per-node={processes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous_endpoint(job.name, namespace)}",
        # Constant for the job's life, so a recreated pod joins the same rendezvous.
        f"--rdzv-id={namespace}-{job.name}",
        f"--max-restarts={TORCHRUN_MAX_RESTARTS}",
        f"--shutdown-timeout={shutdown_timeout(job)}",
        *_numa(numa_binding),
        *trainer_module_args(job, datasets=datasets),
    ]
    return ["sh", "-c", TRAINER_ELASTIC_WRAPPER, "torchrun"], args


def single_node(job: Job, processes: int, max_restarts: int, *overrides: str, datasets: str = DATASET_DIR,
                numa_binding: str | None = None) -> tuple[list[str], list[str]]:
    """(command, args) of a one-pod job: torchrun's standalone rendezvous on localhost."""
    args = [
        "--standalone", "--nnodes=1", f"--nproc-per-node={processes}", f"--max-restarts={max_restarts}",
        f"--shutdown-timeout={shutdown_timeout(job)}",
        *_numa(numa_binding),
        *trainer_module_args(job, *overrides, datasets=datasets),
    ]
    return ["sh", "-c", SINGLE_NODE_WRAPPER, "torchrun"], args
