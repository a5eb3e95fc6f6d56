"""Ceph as the cluster would run it, read from what the charts render (Helm 3.19.0 over the pinned trees): CSI
drivers on every node that mounts a volume, OSD lifecycle on instance store, mon stores, failure domains and no
hidden snapshot schedule (issue 19 findings 11, 14a, 16, 17, 18, 25)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
from owned_stacks import FLEET, Stack, planned, stack_file, stack_settings, stacks_where
from trainyard.config import ConfigError, Settings
from trainyard.config.load import decode_value, parse_settings
from trainyard.plan.runtime import PROJECT, StackPlan
from trainyard.plan.writers import is_kubernetes_object, manifest_of


def _runs_ceph(settings: Settings) -> bool:
    return settings.is_aws and settings.addons.rook_ceph.enabled


CEPH_STACKS = stacks_where(_runs_ceph)
DRIVERS = ("rook-ceph.rbd.csi.ceph.com", "rook-ceph.cephfs.csi.ceph.com")
# udev's persistent links for NVMe (60-persistent-storage.rules: nvme-<model>_<serial>[_<nsid>], -part<N>):
# what an i4i's instance store and its EBS root look like under /dev/disk/by-id.
INSTANCE_STORE = "/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2B3C4D5E6F7A8B9"
NOT_OSDS = ("/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0",
            "/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1F2B3C4D5E6F7A8B9-part1",
            "/dev/nvme0n1", "/dev/nvme1n1")


def _plan(stack: Stack) -> StackPlan:
    return planned(stack)


def _rendered(stack: Stack, chart: str, kind: str) -> list[Mapping[str, Any]]:
    return [obj for release, obj in _plan(stack).rendered.objects()
            if release.chart == chart and obj.get("kind") == kind]


def _cluster(stack: Stack) -> Mapping[str, Any]:
    (cluster,) = _rendered(stack, "rook-ceph-cluster", "CephCluster")
    return cluster["spec"]


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_csi_node_plugins_reach_every_node_and_controllers_run_two(stack: Stack) -> None:
    """ceph-csi-drivers 1.0.4 renders each Driver CR with its own `nodePlugin.tolerations: []` and
    `controllerPlugin.replicas: 1`, and ceph-csi-operator v1.0.4 mergeDriverSpecs fills only nil fields from the
    OperatorConfig: both must be on the Driver, or GPU pods never mount a Ceph volume."""
    drivers = {d["metadata"]["name"]: d["spec"] for d in _rendered(stack, "ceph-csi-drivers", "Driver")}
    assert set(drivers) == set(DRIVERS)
    for name, spec in drivers.items():
        assert {"operator": "Exists"} in spec["nodePlugin"]["tolerations"], name
        assert spec["controllerPlugin"]["replicas"] >= 2, name


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_osds_are_the_instance_store_by_its_model_link(stack: Stack) -> None:
    storage = _cluster(stack)["storage"]
    # deviceFilter and per-node devices would win over devicePathFilter (ceph-cluster-crd.md).
    assert "deviceFilter" not in storage and not storage.get("nodes") and storage["useAllDevices"] is False
    pattern = re.compile(storage["devicePathFilter"])
    assert pattern.search(INSTANCE_STORE)
    assert not any(pattern.search(path) for path in NOT_OSDS)


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_a_replaced_storage_node_leaves_no_dead_osds(stack: Stack) -> None:
    """Instance store is blank on a new instance: Rook removes the old OSDs once out and safe to destroy."""
    spec = _cluster(stack)
    assert spec["removeOSDsIfOutAndSafeToRemove"] is True
    # Drains of storage nodes wait for Ceph (Rook's PDBs), so the next node goes only once PGs are clean again.
    assert spec["disruptionManagement"]["managePodBudgets"] is True


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_mon_stores_survive_a_system_node_replacement(stack: Stack) -> None:
    mon = _cluster(stack)["mon"]
    template = mon["volumeClaimTemplate"]["spec"]
    classes = {c["metadata"]["name"]: c for c in (manifest_of(r) for r in _plan(stack).recording.resources
                                                   if is_kubernetes_object(r)) if c["kind"] == "StorageClass"}
    storage_class = classes[template["storageClassName"]]
    # Rook asks for a class that binds where the mon is scheduled (ceph-cluster-crd.md, "Mon Settings").
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    assert template["resources"]["requests"]["storage"]


@pytest.mark.parametrize("stack", CEPH_STACKS)
def test_pools_use_the_configured_failure_domain_and_no_snapshot_schedule(stack: Stack) -> None:
    rook = _plan(stack).settings.addons.rook_ceph
    for pool in _rendered(stack, "rook-ceph-cluster", "CephBlockPool"):
        assert pool["spec"]["failureDomain"] == rook.failure_domain
    (filesystem,) = _rendered(stack, "rook-ceph-cluster", "CephFilesystem")
    spec = filesystem["spec"]
    assert {p["failureDomain"] for p in [spec["metadataPool"], *spec["dataPools"]]} == {rook.failure_domain}
    # A snap-schedule only exists through `mirroring`, which also turns on fs mirroring with no daemon.
    assert not (spec.get("mirroring") or {}).get("enabled")


def test_the_fleet_spreads_replicas_over_zones() -> None:
    assert stack_settings(FLEET).addons.rook_ceph.failure_domain == "zone"


@pytest.mark.parametrize("stack", stacks_where(lambda s: _runs_ceph(s) and s.addons.rook_ceph.failure_domain == "zone"))
def test_a_zone_failure_domain_spans_as_many_zones_as_replicas(stack: Stack) -> None:
    settings = _plan(stack).settings
    (storage,) = settings.pools("storage")
    zones = storage.zones or (settings.aws.availability_zones if settings.aws else [])
    assert len(zones) >= settings.addons.rook_ceph.replicas


def test_zone_failure_domain_needs_as_many_zones_as_replicas() -> None:
    raw = {k.split(":", 1)[1]: decode_value(v) for k, v in stack_file(FLEET).values.items()}
    (storage,) = [p for p in raw["nodePools"] if p["role"] == "storage"]
    storage["zones"] = raw["aws"]["availabilityZones"][:2]
    with pytest.raises(ConfigError) as caught:
        parse_settings(PROJECT, "fleet", raw)
    assert "spans 2" in {p.path: p.message for p in caught.value.problems}["addons.rookCeph.failureDomain"]
