"""Every rule the rehearsal applies, in the order it applies them to a resource (a resource's first finding is the
first rule's that fails)."""

from __future__ import annotations

from trainyard.plan.rules import (
    awaits,
    custom_resources,
    datasets,
    efa,
    gpu,
    kubelet_admission,
    lifecycle,
    network,
    nodes,
    placement,
    scheduling,
    startup_taints,
    storage,
    topology,
)
from trainyard.plan.rules.base import Rule

RULES: tuple[Rule, ...] = (
    # convergence of `pulumi up`: nodes, add-ons and releases, custom resources, storage, jobs, the network
    nodes.node_group_needs_cni,
    placement.addon_needs_nodes,
    custom_resources.crd_installed,
    placement.release_needs_nodes,
    storage.release_volumes_bind,
    storage.ceph_has_osds,
    storage.claim_binds,
    scheduling.gang_admitted,
    scheduling.queue_fits,
    scheduling.karpenter_can_launch,
    gpu.gpu_device_plugin,
    gpu.whole_gpus_on_mig,
    scheduling.reclaim_configured,
    network.pod_identity_reachable,
    topology.hard_topology_co_located,
    datasets.cache_off_gpu_nodes,
    gpu.trainer_config_valid,
    # the bounds on what it leaves running
    lifecycle.pool_limits_bound,
    lifecycle.stranded_nodes_reclaimed,
    # what the charts render
    nodes.host_paths_exist,
    placement.controllers_off_special_nodes,
    network.cni_runs_where_nodes_join,
    startup_taints.startup_taints_removable,
    nodes.nodes_initialize,
    datasets.dataset_chain,
    custom_resources.custom_resources_after_their_crds,
    custom_resources.resource_reconciled,
    # what each queue is handed, what the kubelets admit, what Cilium gives pods, how long the engine waits
    scheduling.queue_demand_fits,
    datasets.dataset_path_served,
    kubelet_admission.kubelet_admits_pod,
    efa.efa_interfaces_ip_less,
    awaits.job_ends_before_its_await,
)
