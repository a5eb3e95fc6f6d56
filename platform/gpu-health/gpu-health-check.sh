#!/usr/bin/env bash
# GPU node admission check, run by the gpu-health DaemonSet on every GPU node not yet admitted
# (infra/trainyard/platform/gpu_health.py renders it). One script, three steps, one per container:
#
#   wait   (kubectl image, init)  GPU Operator validation files and, on a MIG pool, mig-manager's state label
#   probe  (DCGM image, init)     dcgmi diag at DIAG_LEVEL, GPU count and memory (nvidia-smi), EFA devices
#   admit  (kubectl image)        compare with the pool's expectations; on pass remove the startup taint, on
#                                 fail add the failure taint; label the node and record an Event either way
#
# The steps hand results over as KEY=value files in STATE_DIR (an emptyDir). wait and probe never fail the pod:
# they record what they saw, so that admit can name the reason on the node.
set -euo pipefail

STATE_DIR=${STATE_DIR:-/run/gpu-health}
VALIDATIONS_DIR=${VALIDATIONS_DIR:-/run/nvidia/validations}
EXPECTED=${EXPECTED:-/etc/gpu-health/expected.tsv}
EFA_SYSFS=${EFA_SYSFS:-/host/sys/class/infiniband}
WAIT_SECONDS=${WAIT_SECONDS:-1800}
POLL_SECONDS=${POLL_SECONDS:-10}
DIAG_LEVEL=${DIAG_LEVEL:-1}
MIN_MEMORY_PERCENT=${MIN_MEMORY_PERCENT:-90}
HOSTENGINE_PORT=${HOSTENGINE_PORT:-5555}
NAMESPACE=${NAMESPACE:-gpu-health}

STARTUP_TAINT=trainyard.io/gpu-health
FAILED_TAINT=trainyard.io/gpu-health-failed
RESULT_LABEL=trainyard.io/gpu-health
REASON_LABEL=trainyard.io/gpu-health-reason
# Written by the GPU Operator's validator once the CUDA workload and the device plugin ran on the node
# (NVIDIA/gpu-operator validator: /run/nvidia/validations/<component>-ready).
VALIDATIONS=(cuda-ready plugin-ready)

log() { printf '%s gpu-health %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${NODE_NAME:-?}" "$*" >&2; }

node_label() {
  kubectl get node "$NODE_NAME" -o "go-template={{with index .metadata.labels \"$1\"}}{{.}}{{end}}"
}

# Expectations row for this node: gpus memory_mib efa mig_layout ("-" = none). Empty when unknown.
expectation() {
  local pool=$1 type=$2
  awk -v pool="$pool" -v type="$type" '!/^#/ && $1 == pool && $2 == type {print $3, $4, $5, $6; exit}' "$EXPECTED"
}

missing_validations() {
  local missing=() name
  for name in "${VALIDATIONS[@]}"; do
    [[ -e "$VALIDATIONS_DIR/$name" ]] || missing+=("$name")
  done
  echo "${missing[*]:-}"
}

step_wait() {
  local deadline=$((SECONDS + WAIT_SECONDS)) missing layout state=none efa_requested
  missing=$(missing_validations)
  while [[ -n "$missing" && $SECONDS -lt $deadline ]]; do
    sleep "$POLL_SECONDS"
    missing=$(missing_validations)
  done
  layout=$(expectation "$(node_label trainyard.io/pool)" "$(node_label node.kubernetes.io/instance-type)" \
           | awk '{print $4}')
  if [[ -n "$layout" && "$layout" != "-" ]]; then
    # mig-manager sets pending, rebooting, then success or failed (NVIDIA/mig-parted reconfigure script).
    state=$(node_label nvidia.com/mig.config.state)
    while [[ "$state" != success && "$state" != failed && $SECONDS -lt $deadline ]]; do
      sleep "$POLL_SECONDS"
      state=$(node_label nvidia.com/mig.config.state)
    done
    state=${state:-unset}
  fi
  # Karpenter gives a node EFA interfaces only when it launches it for pods that request EFA (the NodeClaim's
  # requests); a node of an EFA pool launched for other pods rightly has none.
  # (jq ships in the kubectl image: kubernetes/kubernetes#119592.)
  efa_requested=$(kubectl get nodeclaims.karpenter.sh -o json | jq -r --arg node "$NODE_NAME" \
    '[.items[] | select(.status.nodeName == $node) | .spec.resources.requests["vpc.amazonaws.com/efa"] // empty]
     | first // empty' || true)
  { echo "validations=${missing:+missing}"; echo "mig_state=$state"; echo "efa_requested=${efa_requested:-0}"; } \
    > "$STATE_DIR/wait.env"
  log "validations ${missing:-ready}, MIG state $state, EFA requested ${efa_requested:-0}"
}

step_probe() {
  local diag=skipped gpus=0 memory=0 efa=0 engine
  # shellcheck source=/dev/null
  source "$STATE_DIR/wait.env"
  if [[ -z "${validations:-}" ]]; then
    # Our own host engine, inside this pod's network namespace: no other DCGM user on the node is touched.
    nv-hostengine -n -b 127.0.0.1 -p "$HOSTENGINE_PORT" & engine=$!
    sleep 2
    if dcgmi diag --host "127.0.0.1:$HOSTENGINE_PORT" -r "$DIAG_LEVEL" > "$STATE_DIR/diag.log" 2>&1; then
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
  { echo "diag=$diag"; echo "gpus=$gpus"; echo "memory_mib=$memory"; echo "efa=$efa"; } > "$STATE_DIR/probe.env"
  log "diag level $DIAG_LEVEL $diag, $gpus GPUs, smallest ${memory} MiB, $efa EFA devices"
}

# Prints the failure reason (a valid label value), or nothing when the node passes.
decide() {
  local pool=$1 type=$2 row want_gpus want_mib want_efa layout min_mib
  row=$(expectation "$pool" "$type")
  if [[ -z "$row" ]]; then
    echo "no-expectation"; return
  fi
  read -r want_gpus want_mib want_efa layout <<< "$row"
  if [[ "${validations:-}" == missing ]]; then
    echo "gpu-operator-validation-timeout"; return
  fi
  if [[ "$layout" != "-" && "${mig_state:-unset}" != success ]]; then
    echo "mig-config-${mig_state:-unset}"; return
  fi
  if [[ "${diag:-skipped}" != pass ]]; then
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
    # Taint first, label last: the label moves the node out of this DaemonSet, which deletes this pod.
    kubectl taint node "$NODE_NAME" "$STARTUP_TAINT:NoSchedule-" || true
    record_event Normal GpuHealthCheckPassed "DCGM diag level $DIAG_LEVEL passed; $gpus GPUs, $efa EFA devices"
    kubectl label node "$NODE_NAME" --overwrite "$RESULT_LABEL=passed" "$REASON_LABEL-"
    log "passed: startup taint removed"
  else
    # A taint that is not a startup taint: Karpenter no longer counts this node as capacity for pending pods
    # and launches a replacement; the node stays for inspection (README, "GPU node health").
    kubectl taint node "$NODE_NAME" --overwrite "$FAILED_TAINT=$reason:NoSchedule"
    kubectl label node "$NODE_NAME" --overwrite "$RESULT_LABEL=failed" "$REASON_LABEL=$reason"
    record_event Warning GpuHealthCheckFailed "$reason (see the gpu-health pod's logs on this node)"
    log "FAILED: $reason; node stays tainted"
  fi
}

main() {
  : "${NODE_NAME:?NODE_NAME must be set (downward API spec.nodeName)}"
  case "${1:-}" in
    wait) step_wait ;;
    probe) step_probe ;;
    admit) step_admit ;;
    *) echo "usage: $0 wait|probe|admit" >&2; exit 2 ;;
  esac
}

main "$@"
