#!/usr/bin/env bash
# GPU node admission check, run by the gpu-health DaemonSet on every GPU node not yet admitted
# (infra/trainyard/platform/gpu_health.py renders it). One script, three steps, one per container:
#
#   wait   (kubectl image, init)  GPU Operator validation files and, on a MIG pool, mig-manager's state label
#   probe  (DCGM image, init)     the pool's DCGM check (whole GPUs: dcgmi diag at DIAG_LEVEL; MIG pools: DCGM
#                                 health watches and the MIG devices against the layout), GPU count and memory
#                                 (nvidia-smi), EFA devices, the filesystem at the NVMe cache mount
#   admit  (kubectl image)        compare with the pool's expectations; on pass remove the startup taint, on
#                                 fail add the failure taint; label the node and record an Event either way
#
# and a fourth, run by the gpu-health-reaper CronJob (kubectl image), that bounds the life of nodes admission
# failed or never decided (Karpenter never disrupts a node that is not initialized):
#
#   reap                          mark a node with no verdict after STUCK_SECONDS failed; delete the NodeClaim of
#                                 a node failed for FAILED_HOLD_SECONDS, and of every failed node of a pool
#                                 beyond its newest MAX_FAILED_PER_POOL
#
# The steps hand results over as KEY=value files in STATE_DIR (an emptyDir). wait and probe never fail the pod:
# they record what they saw, so that admit can name the reason on the node.
set -euo pipefail

STATE_DIR=${STATE_DIR:-/run/gpu-health}
VALIDATIONS_DIR=${VALIDATIONS_DIR:-/run/nvidia/validations}
EXPECTED=${EXPECTED:-/etc/gpu-health/expected.tsv}
EFA_SYSFS=${EFA_SYSFS:-/host/sys/class/infiniband}
# Where the probe sees host paths (the host's /mnt at $HOST_ROOT/mnt), and the mount table that shows them.
HOST_ROOT=${HOST_ROOT:-/host}
MOUNTINFO=${MOUNTINFO:-/proc/self/mountinfo}
WAIT_SECONDS=${WAIT_SECONDS:-1800}
POLL_SECONDS=${POLL_SECONDS:-10}
DIAG_LEVEL=${DIAG_LEVEL:-1}
MIN_MEMORY_PERCENT=${MIN_MEMORY_PERCENT:-90}
HOSTENGINE_PORT=${HOSTENGINE_PORT:-5555}
# DCGM's memory, PCIe, thermal, power and NVLink watches need 60 s of samples before the first check
# (NVIDIA/DCGM v4.6.0 dcgmi/CommandLineParser.cpp, `dcgmi health --set` help).
HEALTH_WATCH_SECONDS=${HEALTH_WATCH_SECONDS:-90}
NAMESPACE=${NAMESPACE:-gpu-health}
STUCK_SECONDS=${STUCK_SECONDS:-7200}
FAILED_HOLD_SECONDS=${FAILED_HOLD_SECONDS:-14400}
MAX_FAILED_PER_POOL=${MAX_FAILED_PER_POOL:-1}
# Pools (space-separated) whose failed nodes are deleted at once: reserved-only capacity, where a held node keeps
# its reservation's instance and the pool's node limit from the replacement (no on-demand fallback).
UNHELD_POOLS=${UNHELD_POOLS:-}

STARTUP_TAINT=trainyard.io/gpu-health
FAILED_TAINT=trainyard.io/gpu-health-failed
RESULT_LABEL=trainyard.io/gpu-health
REASON_LABEL=trainyard.io/gpu-health-reason
FAILED_AT_ANNOTATION=trainyard.io/gpu-health-failed-at
ROLE_LABEL=trainyard.io/role
POOL_LABEL=trainyard.io/pool
# Written by the GPU Operator's validator once the CUDA workload and the device plugin ran on the node
# (NVIDIA/gpu-operator validator: /run/nvidia/validations/<component>-ready).
VALIDATIONS=(cuda-ready plugin-ready)

log() { printf '%s gpu-health %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${NODE_NAME:-?}" "$*" >&2; }

node_label() {
  kubectl get node "$NODE_NAME" -o "go-template={{with index .metadata.labels \"$1\"}}{{.}}{{end}}"
}

# Expectations row for this node: gpus memory_mib efa mig_layout mig_devices check nvme_cache ("-" = none).
# Empty when unknown.
expectation() {
  local pool=$1 type=$2
  awk -v pool="$pool" -v type="$type" \
    '!/^#/ && $1 == pool && $2 == type {print $3, $4, $5, $6, $7, $8, ($9 == "" ? "-" : $9); exit}' "$EXPECTED"
}

missing_validations() {
  local missing=() name
  for name in "${VALIDATIONS[@]}"; do
    [[ -e "$VALIDATIONS_DIR/$name" ]] || missing+=("$name")
  done
  echo "${missing[*]:-}"
}

step_wait() {
  local deadline=$((SECONDS + WAIT_SECONDS)) missing row layout check cache state=none efa_requested
  missing=$(missing_validations)
  while [[ -n "$missing" && $SECONDS -lt $deadline ]]; do
    sleep "$POLL_SECONDS"
    missing=$(missing_validations)
  done
  row=$(expectation "$(node_label "$POOL_LABEL")" "$(node_label node.kubernetes.io/instance-type)")
  layout=$(awk '{print $4}' <<< "$row")
  check=$(awk '{print $6}' <<< "$row")
  cache=$(awk '{print $7}' <<< "$row")
  if [[ -n "$layout" && "$layout" != "-" ]]; then
    # mig-manager sets pending, rebooting, then success or failed (NVIDIA/mig-parted reconfigure script).
    state=$(node_label nvidia.com/mig.config.state)
    while [[ "$state" != success && "$state" != failed && $SECONDS -lt $deadline ]]; do
      sleep "$POLL_SECONDS"
      state=$(node_label nvidia.com/mig.config.state)
    done
    state=${state:-unset}
  fi
  # EFA devices are required where the node's NodeClaim requested them (pods that need EFA); an EFA pool's node
  # class lists its efa-only interfaces (platform/karpenter.py), a node of any other pool rightly has none.
  # (jq ships in the kubectl image: kubernetes/kubernetes#119592.)
  efa_requested=$(kubectl get nodeclaims.karpenter.sh -o json | jq -r --arg node "$NODE_NAME" \
    '[.items[] | select(.status.nodeName == $node) | .spec.resources.requests["vpc.amazonaws.com/efa"] // empty]
     | first // empty' || true)
  { echo "validations=${missing:+missing}"; echo "mig_state=$state"; echo "efa_requested=${efa_requested:-0}"
    echo "check=${check:-dcgm-diag}"; echo "cache_mount=${cache:--}"; } > "$STATE_DIR/wait.env"
  log "validations ${missing:-ready}, MIG state $state, EFA requested ${efa_requested:-0}, check ${check:-dcgm-diag}"
}

# DCGM's health watches over the whole node: "Healthy", "Warning", "Failure", or "error" when no report came.
# `dcgmi health --check` exits 0 whatever the health (dcgmi/Health.cpp CheckWatches), so the JSON report's
# "Overall Health" value decides (DcgmiOutputJson: body -> "Overall Health" -> value).
dcgm_health() {
  local host=127.0.0.1:$HOSTENGINE_PORT
  if ! dcgmi health --host "$host" --set a > "$STATE_DIR/health.log" 2>&1; then
    echo error; return
  fi
  sleep "$HEALTH_WATCH_SECONDS"
  if ! dcgmi health --host "$host" --check -j > "$STATE_DIR/health.json" 2>> "$STATE_DIR/health.log"; then
    echo error; return
  fi
  tr -d '\n' < "$STATE_DIR/health.json" | grep -o '"Overall Health"[^}]*' | grep -o '"value" *: *"[^"]*"' \
    | sed 's/.*"\([^"]*\)"$/\1/' | grep . || echo error
}

# The node's MIG devices as profile=count,... in byte order, as the component renders the layout's
# (`nvidia-smi -L` lists each as "MIG <profile> Device <n>: (UUID: ...)" under its GPU).
mig_devices() {
  nvidia-smi -L 2> /dev/null | awk '$1 == "MIG" {n[$2]++} END {for (p in n) print p "=" n[p]}' \
    | LC_ALL=C sort | paste -sd, -
}

# The filesystem type mounted at host PATH (seen under HOST_ROOT), or "none" (mountinfo: mount point in field 5,
# the type after the "-" separator; proc(5)).
cache_fs() {
  awk -v mp="$HOST_ROOT$1" '$5 == mp {for (i = 7; i <= NF; i++) if ($i == "-") {type = $(i + 1); break}}
                     END {print (type == "" ? "none" : type)}' "$MOUNTINFO"
}

step_probe() {
  local diag=skipped health=skipped mig=- gpus=0 memory=0 efa=0 cache=- engine
  # shellcheck source=/dev/null
  source "$STATE_DIR/wait.env"
  if [[ -z "${validations:-}" ]]; then
    # Our own host engine, inside this pod's network namespace: no other DCGM user on the node is touched.
    nv-hostengine -n -b 127.0.0.1 -p "$HOSTENGINE_PORT" & engine=$!
    sleep 2
    if [[ "${check:-dcgm-diag}" == dcgm-health ]]; then
      # dcgmi diag refuses MIG-partitioned GPUs (NVIDIA/DCGM v4.6.0 nvvs/src/Gpu.cpp IsMigModeDiagCompatible,
      # nvvs/src/NvidiaValidationSuite.cpp BuildCommonGpusList); health watches cover GPU instances too
      # (modules/health/DcgmHealthWatch.cpp: DCGM_FE_GPU, DCGM_FE_GPU_I, DCGM_FE_GPU_CI).
      health=$(dcgm_health)
      mig=$(mig_devices)
    elif dcgmi diag --host "127.0.0.1:$HOSTENGINE_PORT" -r "$DIAG_LEVEL" > "$STATE_DIR/diag.log" 2>&1; then
      diag=pass
    else
      diag=fail
    fi
    kill "$engine" 2> /dev/null || true
  fi
  local sizes
  sizes=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null || true)
  if [[ -n "$sizes" ]]; then
    gpus=$(wc -l <<< "$sizes")
    memory=$(sort -n <<< "$sizes" | head -n 1 | tr -d ' ')
  fi
  if [[ -d "$EFA_SYSFS" ]]; then
    efa=$(find "$EFA_SYSFS" -mindepth 1 -maxdepth 1 | wc -l)
  fi
  if [[ "${cache_mount:--}" != - ]]; then cache=$(cache_fs "$cache_mount"); fi
  { echo "diag=$diag"; echo "health=$health"; echo "mig_devices=${mig:--}"; echo "gpus=$gpus"
    echo "memory_mib=$memory"; echo "efa=$efa"; echo "cache_fs=$cache"; } > "$STATE_DIR/probe.env"
  log "diag level $DIAG_LEVEL $diag, health $health, MIG devices ${mig:--}, $gpus GPUs, smallest ${memory} MiB," \
      "$efa EFA devices, ${cache_mount:--}: $cache"
}

# Total of a profile=count,... list ("-" or empty: 0).
mig_total() {
  tr ',' '\n' <<< "${1#-}" | awk -F= '{n += $2} END {print n + 0}'
}

# Prints the failure reason (a valid label value), or nothing when the node passes.
decide() {
  local pool=$1 type=$2 row want_gpus want_mib want_efa layout min_mib
  row=$(expectation "$pool" "$type")
  if [[ -z "$row" ]]; then
    echo "no-expectation"; return
  fi
  read -r want_gpus want_mib want_efa layout want_mig check want_cache <<< "$row"
  if [[ "${validations:-}" == missing ]]; then
    echo "gpu-operator-validation-timeout"; return
  fi
  if [[ "$layout" != "-" && "${mig_state:-unset}" != success ]]; then
    echo "mig-config-${mig_state:-unset}"; return
  fi
  if [[ "$check" == dcgm-health ]]; then
    if [[ "${health:-skipped}" != Healthy ]]; then
      echo "dcgm-health-$(tr '[:upper:]' '[:lower:]' <<< "${health:-skipped}")"; return
    fi
    if [[ "${mig_devices:--}" != "$want_mig" ]]; then
      local found wanted
      found=$(mig_total "${mig_devices:--}") wanted=$(mig_total "$want_mig")
      if (( found != wanted )); then echo "mig-devices-$found-of-$wanted"; else echo "mig-profiles-mismatch"; fi
      return
    fi
  elif [[ "${diag:-skipped}" != pass ]]; then
    echo "dcgm-diag-level-${DIAG_LEVEL}-${diag:-skipped}"; return
  fi
  if (( ${gpus:-0} != want_gpus )); then
    echo "gpu-count-${gpus:-0}-of-${want_gpus}"; return
  fi
  min_mib=$((want_mib * MIN_MEMORY_PERCENT / 100))
  if (( ${memory_mib:-0} < min_mib )); then
    echo "gpu-memory-${memory_mib:-0}mib-below-${min_mib}mib"; return
  fi
  if (( ${efa_requested:-0} > 0 && ${efa:-0} < want_efa )); then
    echo "efa-devices-${efa:-0}-of-${want_efa}"; return
  fi
  # prepare-node.sh mounts the instance store there as XFS, or refuses (foreign data) and leaves no mount: the
  # dataset cache's FUSE pod, whose hostPath must exist, would then hold a training pod in ContainerCreating.
  if [[ "$want_cache" != - && "${cache_fs:-none}" != xfs ]]; then
    echo "nvme-cache-${cache_fs:-none}"; return
  fi
}

record_event() {
  local type=$1 reason=$2 message=$3 uid now
  uid=$(kubectl get node "$NODE_NAME" -o "go-template={{.metadata.uid}}")
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  kubectl create -f - <<JSON
{"apiVersion": "v1", "kind": "Event",
 "metadata": {"generateName": "$NODE_NAME.gpu-health-", "namespace": "$NAMESPACE"},
 "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "$NODE_NAME", "uid": "$uid"},
 "type": "$type", "reason": "$reason", "message": "$message",
 "source": {"component": "gpu-health-check", "host": "$NODE_NAME"},
 "firstTimestamp": "$now", "lastTimestamp": "$now", "count": 1}
JSON
}

step_admit() {
  local reason pool type
  # shellcheck source=/dev/null
  source "$STATE_DIR/wait.env"
  # shellcheck source=/dev/null
  source "$STATE_DIR/probe.env"
  pool=$(node_label trainyard.io/pool)
  type=$(node_label node.kubernetes.io/instance-type)
  reason=$(decide "$pool" "$type")
  [[ "$reason" != no-expectation ]] || log "no row for pool '$pool' and instance type '$type' in $EXPECTED"
  if [[ -z "$reason" ]]; then
    local checked="DCGM diag level $DIAG_LEVEL passed"
    [[ "${check:-dcgm-diag}" != dcgm-health ]] || checked="DCGM health watches healthy, MIG devices $mig_devices"
    # Taints first, label last: the label moves the node out of this DaemonSet, which deletes this pod. A rerun
    # (after a reboot or a restart of this pod) that passes also clears an earlier failure.
    kubectl taint node "$NODE_NAME" "$FAILED_TAINT:NoSchedule-" 2> /dev/null || true
    kubectl taint node "$NODE_NAME" "$STARTUP_TAINT:NoSchedule-" || true
    kubectl annotate node "$NODE_NAME" "$FAILED_AT_ANNOTATION-" > /dev/null || true
    record_event Normal GpuHealthCheckPassed "$checked; $gpus GPUs, $efa EFA devices"
    kubectl label node "$NODE_NAME" --overwrite "$RESULT_LABEL=passed" "$REASON_LABEL-"
    log "passed: startup taint removed"
  else
    fail_node "$reason" "see the gpu-health pod's logs on this node"
  fi
}

# A taint that is not a startup taint: Karpenter no longer counts this node as capacity for pending pods and
# launches a replacement; the node stays for inspection until the reaper deletes its NodeClaim (README,
# "GPU node health").
fail_node() {
  local reason=$1 detail=$2
  kubectl taint node "$NODE_NAME" --overwrite "$FAILED_TAINT=$reason:NoSchedule"
  kubectl annotate node "$NODE_NAME" --overwrite "$FAILED_AT_ANNOTATION=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  kubectl label node "$NODE_NAME" --overwrite "$RESULT_LABEL=failed" "$REASON_LABEL=$reason"
  record_event Warning GpuHealthCheckFailed "$reason ($detail)"
  log "FAILED: $reason; node stays tainted"
}

# What the reaper does to each GPU node, one "node action" line per node it acts on: `fail` for a node without
# a verdict after STUCK_SECONDS (it then counts as failed, with its hold starting now), `delete` for a failed node
# held FAILED_HOLD_SECONDS (0 in UNHELD_POOLS) or beyond its pool's newest MAX_FAILED_PER_POOL. A failed node
# without the annotation counts as failed since it registered.
reap_plan() {
  jq -r --argjson now "$(date -u +%s)" --argjson stuck "$STUCK_SECONDS" --argjson hold "$FAILED_HOLD_SECONDS" \
     --argjson keep "$MAX_FAILED_PER_POOL" --arg result "$RESULT_LABEL" --arg pool "$POOL_LABEL" \
     --arg failed_at "$FAILED_AT_ANNOTATION" --arg unheld "$UNHELD_POOLS" '
    ($unheld | split(" ") | map(select(. != ""))) as $unheld_pools
    | [.items[] | {name: .metadata.name, pool: (.metadata.labels[$pool] // ""),
                 result: (.metadata.labels[$result] // ""),
                 registered: (.metadata.creationTimestamp | fromdateiso8601),
                 failed: (.metadata.annotations[$failed_at] // .metadata.creationTimestamp | fromdateiso8601)}]
    | (map(select(.result != "passed" and .result != "failed" and $now - .registered >= $stuck)
           | "\(.name) fail")),
      (map(select(.result == "failed")) | group_by(.pool) | map(sort_by(-.failed) | to_entries[]
           | select(.key >= $keep or (.value.pool as $p | any($unheld_pools[]; . == $p))
                    or $now - .value.failed >= $hold) | "\(.value.name) delete"))
    | .[]'
}

step_reap() {
  local nodes claims line node action claim
  nodes=$(kubectl get nodes -l "$ROLE_LABEL=gpu" -o json)
  claims=$(kubectl get nodeclaims.karpenter.sh -o json)
  while read -r line; do
    [[ -n "$line" ]] || continue
    read -r node action <<< "$line"
    NODE_NAME=$node
    if [[ "$action" == fail ]]; then
      fail_node "admission-stuck" "no verdict $((STUCK_SECONDS / 60)) minutes after the node registered"
      continue
    fi
    claim=$(jq -r --arg node "$node" '[.items[] | select(.status.nodeName == $node)] | first // empty
                                      | if .metadata.deletionTimestamp then "deleting" else .metadata.name end' \
            <<< "$claims")
    case "$claim" in
      "") log "failed, but no NodeClaim names it (not Karpenter's): left for a person" ;;
      deleting) ;;
      *)
        # Karpenter drains and terminates the instance behind a deleted NodeClaim (its termination finalizer).
        kubectl delete nodeclaims.karpenter.sh "$claim" --wait=false
        record_event Warning GpuHealthNodeReclaimed \
          "NodeClaim $claim deleted after failed admission ($(node_label "$REASON_LABEL"))"
        log "NodeClaim $claim deleted" ;;
    esac
  done < <(reap_plan <<< "$nodes")
}

main() {
  [[ "${1:-}" == reap ]] || : "${NODE_NAME:?NODE_NAME must be set (downward API spec.nodeName)}"
  case "${1:-}" in
    wait) step_wait ;;
    probe) step_probe ;;
    admit) step_admit ;;
    reap) step_reap ;;
    *) echo "usage: $0 wait|probe|admit|reap" >&2; exit 2 ;;
  esac
}

main "$@"
