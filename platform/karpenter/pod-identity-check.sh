#!/usr/bin/env bash
# First bring-up check, run as a Job before the Karpenter release (infra/trainyard/platform/pod_identity_check.py):
# a pod on the pod network fetches EKS Pod Identity credentials from the node's agent, through Cilium's datapath.
# Karpenter, the EBS CSI controller and the trainers all depend on that path, and Cilium regressions have broken
# it before (cilium/cilium 35989: BPF host routing dropped pod -> 169.254.170.23 with "FIB lookup failed";
# cilium/cilium 40273). Without this check such a break shows up as Karpenter crash-looping at its EC2 connectivity
# check until its atomic release times out.
#
# The Pod Identity webhook gives the pod AWS_CONTAINER_CREDENTIALS_FULL_URI (the agent, http://169.254.170.23/...)
# and AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, whose token goes in the Authorization header (docs.aws.amazon.com/eks/
# latest/userguide/pod-id-how-it-works.html). The image has bash but no HTTP client, so the request goes through
# bash's /dev/tcp. Nothing of the credentials is printed.
set -euo pipefail

ATTEMPTS=${ATTEMPTS:-30}
DELAY_SECONDS=${DELAY_SECONDS:-10}

log() { printf '%s pod-identity-check: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2; }

uri=${AWS_CONTAINER_CREDENTIALS_FULL_URI:-}
token_file=${AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE:-}
if [[ -z "$uri" || -z "$token_file" ]]; then
  log "FAILED: no Pod Identity credentials were injected into this pod: the service account has no pod identity" \
      "association, or the eks-pod-identity-agent add-on (its webhook) is missing"
  exit 1
fi
rest=${uri#http://}
hostport=${rest%%/*}
path=/${rest#*/}
host=${hostport%:*}
port=80
[[ "$hostport" != *:* ]] || port=${hostport##*:}

# One GET; prints the response (status line, headers, body) or fails when no connection is made.
fetch() {
  local token
  token=$(< "$token_file")
  # The inner script's $0..$3 are its arguments, expanded by the inner bash.
  # shellcheck disable=SC2016
  timeout 10 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n" "$2" "$0" "$3" >&3 && cat <&3' \
    "$host" "$port" "$path" "$token"
}

for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
  if response=$(fetch 2> /dev/null); then
    status=$(head -n 1 <<< "$response" | awk '{print $2}')
    body=${response#*$'\r\n\r\n'}
    if [[ "$status" == 200 ]] && jq -e '.AccessKeyId and .SecretAccessKey and .Token' > /dev/null 2>&1 <<< "$body"; then
      log "passed: the pod identity agent at $host:$port handed this pod credentials (account" \
          "$(jq -r '.AccountId // "?"' <<< "$body"))"
      exit 0
    fi
    log "attempt $attempt/$ATTEMPTS: the agent at $host:$port answered ${status:-nothing}: $(tr -d '\r' <<< "${body:0:200}")"
  else
    log "attempt $attempt/$ATTEMPTS: no connection to $host:$port (the pod network's path to the node's pod" \
        "identity agent)"
  fi
  sleep "$DELAY_SECONDS"
done
log "FAILED: no Pod Identity credentials after $ATTEMPTS attempts; Karpenter would not reach AWS either"
exit 1
