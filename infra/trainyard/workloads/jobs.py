"""Training-job components, one per job kind family, sharing the pod template, config, volume and monitoring.

Each component owns: the trainer ConfigMap, the checkpoint PVC (protected and retained: it holds the run), the
Volcano Job and, when monitoring is on, a PodMonitor for the trainer's metrics port.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pulumi
import pulumi_kubernetes as k8s

from trainyard.platform.kube import k8s_options
from trainyard.platform.monitor_policy import SAMPLE_LIMIT
from trainyard.workloads import launch, sizing, volcano
from trainyard.workloads.args import TrainingJobArgs
from trainyard.workloads.pod import PodShape, checkpoint_claim_name, config_map_name, job_labels, pod_template

POD_MONITOR_API = "monitoring.coreos.com/v1"
SCRAPE_INTERVAL = "30s"
# Only global rank 0 serves metrics, so a job's other targets are down by design: this target label marks them for
# platform/monitoring/rules/cluster.rules.yaml, whose TrainyardTargetDown replaces kube-prometheus-stack's TargetDown
# (which would fire for every multi-pod job) and whose TrainingMetricsDown fires when no pod of a job serves.
RANK_ZERO_LABEL = ("trainyard_metrics", "rank-0-only")


class _TrainingJob(pulumi.ComponentResource):
    TYPE: ClassVar[str]

    volcano_job: k8s.apiextensions.CustomResource
    checkpoint_claim: k8s.core.v1.PersistentVolumeClaim
    pod_monitor: k8s.apiextensions.CustomResource | None

    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(self.TYPE, name, None, opts)
        cluster, ready = args.cluster, list(args.tenant.ready)
        config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata={"name": config_map_name(args), "namespace": args.namespace, "labels": job_labels(args)},
            data={args.job.trainer_config: args.trainer_config},
            opts=k8s_options(cluster, self, ready),
        )
        self.checkpoint_claim = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-checkpoints",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=checkpoint_claim_name(args), namespace=args.namespace,
                                                labels=job_labels(args)),
            spec=self._claim_spec(args),
            # The checkpoints are the run: neither a replacement nor `pulumi destroy` may delete them.
            opts=pulumi.ResourceOptions.merge(k8s_options(cluster, self, [*ready, *args.checkpoint_storage]),
                                              pulumi.ResourceOptions(protect=args.protect, retain_on_delete=True)),
        )
        metadata, spec = self.manifest(args, pod_template(args, self.shape(args)))
        crds = [args.volcano] if args.volcano is not None else []
        self.volcano_job = k8s.apiextensions.CustomResource(
            name, api_version=volcano.API_VERSION, kind=volcano.KIND, metadata=metadata, spec=spec,
            opts=pulumi.ResourceOptions.merge(
                k8s_options(cluster, self, [*ready, *crds, config, self.checkpoint_claim]),
                volcano.REPLACE_ON_SPEC_CHANGE),
        )
        self.pod_monitor = None
        if args.monitoring is not None:
            self.pod_monitor = k8s.apiextensions.CustomResource(
                f"{name}-metrics", api_version=POD_MONITOR_API, kind="PodMonitor",
                metadata={"name": f"{args.job.name}-trainer", "namespace": args.namespace,
                          "labels": job_labels(args)},
                spec={
                    "selector": {"matchLabels": {"trainyard.io/job": args.job.name}},
                    # The most a tenant's monitor may take (platform/monitor_policy.py admits no more).
                    "sampleLimit": SAMPLE_LIMIT,
                    "podMetricsEndpoints": [{
                        "port": "metrics", "interval": SCRAPE_INTERVAL,
                        # Prometheus follows redirects by default; a tenant's monitor must say it does not
                        # (PodMetricsEndpoint followRedirects, CRD podmonitors @ 0.93.1; monitor_policy.py).
                        "followRedirects": False,
                        # A relabeling without source labels sets the label on every target (Prometheus
                        # relabel_config: action replace, regex (.*) matches the empty source).
                        "relabelings": [{"targetLabel": RANK_ZERO_LABEL[0], "replacement": RANK_ZERO_LABEL[1]}],
                    }],
                },
                opts=k8s_options(cluster, self, [*ready, args.monitoring]),
            )
        self.register_outputs({"job_name": args.job.name, "checkpoint_claim": checkpoint_claim_name(args)})

    @staticmethod
    def _claim_spec(args: TrainingJobArgs) -> k8s.core.v1.PersistentVolumeClaimSpecArgs:
        # Without a ReadWriteMany class the default class only gives ReadWriteOnce: enough for one pod.
        rwx = args.checkpoint_storage_class is not None
        if not rwx and args.job.max_nodes > 1:
            raise ValueError(f"job {args.job.name!r} spans up to {args.job.max_nodes} nodes and needs a "
                             "ReadWriteMany checkpoint volume: enable addons.rookCeph")
        return k8s.core.v1.PersistentVolumeClaimSpecArgs(
            access_modes=["ReadWriteMany" if rwx else "ReadWriteOnce"],
            resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": args.job.checkpoint_size}),
            storage_class_name=args.checkpoint_storage_class,
        )

    def shape(self, args: TrainingJobArgs) -> PodShape:
        raise NotImplementedError

    def manifest(self, args: TrainingJobArgs, template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        raise NotImplementedError


class ElasticTrainingJob(_TrainingJob):
    """torchrun --nnodes=MIN:MAX on a Volcano gang of MIN pods that grows into free capacity up to MAX.

    A Volcano Job has no scale subresource (its CRD declares only `status`), so no HPA can drive it. The
    elastic range is the autoscaling: with `autoscaling.enabled` the task asks for MAX pods, Volcano starts
    the job once MIN fit, Karpenter launches nodes for the pending rest and torchrun admits them as they come;
    spot reclaims shrink it again. Without it the job asks for MIN pods and keeps that size (an operator may
    still patch `tasks[0].replicas` within MIN..MAX: Volcano allows that update and torchrun follows).
    """

    TYPE = "trainyard:workloads:ElasticTrainingJob"

    def shape(self, args: TrainingJobArgs) -> PodShape:
        job = args.job
        multi_node = job.max_nodes > 1
        resources = (sizing.whole_gpus(args.pool, job.gpus_per_node, efa=multi_node) if args.pool
                     else sizing.cpu_only())
        command, arguments = launch.elastic(job, args.namespace, resources.processes, datasets=args.datasets,
                                            numa_binding=sizing.numa_binding(args.pool, resources))
        return PodShape(command=command, args=arguments, resources=resources, restart_policy="Never",
                        same_zone=multi_node)

    def manifest(self, args: TrainingJobArgs, template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        job = args.job
        return volcano.job_manifest(
            args, template, min_available=job.min_nodes,
            replicas=job.max_nodes if job.autoscaling.enabled else job.min_nodes,
            max_retry=volcano.ELASTIC_MAX_RETRY,
            policies=[volcano.TERMINATE_ON_CONFIG_ERROR, volcano.RESTART_JOB_ON_STORE_LOSS, volcano.RESTART_FAILED_POD],
            topology=volcano.network_topology(job),
        )


class MigTrainingJob(_TrainingJob):
    """One pod on one MIG slice (`nvidia.com/mig-<profile>: 1`) of a MIG-partitioned pool."""

    TYPE = "trainyard:workloads:MigTrainingJob"

    def shape(self, args: TrainingJobArgs) -> PodShape:
        if args.pool is None or args.job.mig_profile is None:
            raise ValueError(f"MIG job {args.job.name!r} needs a nodePool and a migProfile")
        resources = sizing.mig_slice(args.pool, args.job.mig_profile)
        command, arguments = launch.single_node(args.job, resources.processes, launch.TORCHRUN_MAX_RESTARTS,
                                                datasets=args.datasets)
        return PodShape(command=command, args=arguments, resources=resources, restart_policy="Never")

    def manifest(self, args: TrainingJobArgs, template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return volcano.job_manifest(args, template, min_available=1, replicas=1,
                                    max_retry=volcano.SINGLE_NODE_MAX_RETRY,
                                    policies=[volcano.TERMINATE_ON_CONFIG_ERROR, volcano.RESTART_FAILED_POD])


class SmokeTrainingJob(_TrainingJob):
    """A short single-node run (a few steps) that proves scheduling, storage, GPUs and the trainer work.

    On a GPU pool it takes whole GPUs; on the local target (no pool) it runs CPU-only, with gloo.
    """

    TYPE = "trainyard:workloads:SmokeTrainingJob"

    def shape(self, args: TrainingJobArgs) -> PodShape:
        resources = (sizing.whole_gpus(args.pool, args.job.gpus_per_node, efa=False) if args.pool
                     else sizing.cpu_only())
        # No retries anywhere: a smoke test that fails must show as failed.
        command, arguments = launch.single_node(args.job, resources.processes, 0,
                                                f"train.steps={launch.SMOKE_STEPS}", datasets=args.datasets,
                                                numa_binding=sizing.numa_binding(args.pool, resources))
        return PodShape(command=command, args=arguments, resources=resources, restart_policy="Never")

    def manifest(self, args: TrainingJobArgs, template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        return volcano.job_manifest(args, template, min_available=1, replicas=1, max_retry=0,
                                    policies=[volcano.TERMINATE_ON_FAILED_POD])


COMPONENTS: dict[str, type[_TrainingJob]] = {
    "elastic": ElasticTrainingJob, "mig": MigTrainingJob, "smoke": SmokeTrainingJob,
}
