#!/usr/bin/env bash
# trainyard prepare-node: OS setup of an EKS AL2023 node, run once by cloud-init before nodeadm starts
# kubelet. gpu: NVMe instance store -> one XFS cache (RAID0 if several) at /mnt/trainyard-cache; storage:
# devices left raw for Ceph, only reported; system: devices unused. Exit 0 ok/nothing to do, 2 usage,
# 3 refused (foreign data: nothing touched, no cache). A refusal does not brick the boot: settings are
# written first, and nodeadm-run.service is only ordered after cloud-final, it does not require it.
set -Eeuo pipefail

readonly CACHE_LABEL=TYCACHE CACHE_MOUNT=/mnt/trainyard-cache MD_NAME=trainyard-cache
readonly STORE_MODEL="Amazon EC2 NVMe Instance Storage" EXIT_USAGE=2 EXIT_REFUSED=3
readonly USAGE='usage: prepare-node.sh --role gpu|storage|system [--root DIR] [--devices "DEV ..."]
  [--sysfs DIR] [--no-apply]   (defaults: /, instance store found in sysfs, /sys, load settings)'

role="" root=/ sysfs=/sys apply=1 devices_given=0 refused=0 cache_dev=""
devices=() states=()

log() { printf 'trainyard-prepare-node: %s\n' "$*" >&2; }
trap 'log "error: line $LINENO: \"$BASH_COMMAND\" exited with $?"' ERR
usage_error() { log "$1"; log "$USAGE"; exit "$EXIT_USAGE"; }
refuse() { log "REFUSED: $*; left untouched"; refused=1; }
under() { if [[ $root == / ]]; then echo "$1"; else echo "$root$1"; fi; } # PATH as seen from --root

parse_args() {
  while (($#)); do
    case $1 in
      --role | --root | --devices | --sysfs)
        (($# >= 2)) || usage_error "$1 needs a value"
        case $1 in
          --role) role=$2 ;;
          --root) root=$2 ;;
          --devices) read -r -a devices <<<"$2" && devices_given=1 ;;
          --sysfs) sysfs=$2 ;;
        esac
        shift 2 ;;
      --no-apply) apply=0 && shift ;;
      -h | --help) echo "$USAGE" && exit 0 ;;
      *) usage_error "unknown argument: $1" ;;
    esac
  done
  case $role in
    gpu | storage | system) ;;
    "") usage_error "--role is required" ;;
    *) usage_error "unknown role: $role" ;;
  esac
  [[ -d $root ]] || usage_error "--root $root is not a directory"
  root=$(cd "$root" && pwd -P)
}

# install_file DEST MODE < content: replaces DEST only if the content differs (reruns keep mtimes).
install_file() {
  local dest=$1 mode=$2 tmp
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp "$dest.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -f $dest ]] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"; chmod "$mode" "$dest"; log "unchanged: $dest"
  else
    mv -f "$tmp" "$dest"; log "wrote: $dest"
  fi
}

# at_least KEY WANT: WANT, or the live value if higher; lowering a ceiling is a regression (systemd sets
# fs.file-max to LONG_MAX at boot). Digit-count check first: no shell arithmetic overflow.
at_least() {
  local want=$2 live="" path="/proc/sys/${1//.//}"
  if [[ -r $path ]]; then read -r live <"$path" || true; fi
  if [[ $live =~ ^[1-9][0-9]*$ ]] && ((${#live} > ${#want} || (${#live} == ${#want}) && live > want)); then
    echo "$live"
  else
    echo "$want"
  fi
}

sysctl_conf() {
  cat <<EOF
# Managed by trainyard prepare-node (role $role). Ceilings never go below the kernel's own value.
# Project requirement: open files (DataLoader workers x shards, NCCL sockets, Alluxio, Ceph clients).
fs.file-max = $(at_least fs.file-max 1000000)
# mmap-ed datasets (numpy memmap, Arrow) and the CUDA driver map a lot; 65530 -> mmap ENOMEM.
vm.max_map_count = $(at_least vm.max_map_count 1048576)
# kubelet, containerd, reloaders and pods' file watchers; running out fails unrelated pods.
fs.inotify.max_user_instances = $(at_least fs.inotify.max_user_instances 8192)
fs.inotify.max_user_watches = $(at_least fs.inotify.max_user_watches 524288)
# All workers hit the torchrun c10d store at once on (re)start; a short backlog times rendezvous out.
net.core.somaxconn = $(at_least net.core.somaxconn 32768)
# 16 MiB buffers so one TCP stream fills a 100 Gbit/s VPC path (NCCL sockets without EFA, Alluxio, Ceph).
net.core.rmem_max = $(at_least net.core.rmem_max 16777216)
net.core.wmem_max = $(at_least net.core.wmem_max 16777216)
net.ipv4.tcp_rmem = 4096 131072 16777216
net.ipv4.tcp_wmem = 4096 16384 16777216
# Cilium ENI IPAM: every pod has a VPC IP, so thousands of neighbours; past 1024 -> table overflow drops.
net.ipv4.neigh.default.gc_thresh1 = $(at_least net.ipv4.neigh.default.gc_thresh1 8192)
net.ipv4.neigh.default.gc_thresh2 = $(at_least net.ipv4.neigh.default.gc_thresh2 32768)
net.ipv4.neigh.default.gc_thresh3 = $(at_least net.ipv4.neigh.default.gc_thresh3 65536)
EOF
  [[ $role != gpu ]] || cat <<'EOF'
# NUMA balancing unmaps/migrates pages, stalling pinned CUDA/NCCL/EFA DMA buffers (step jitter); the
# kubelet topology manager does the placement.
kernel.numa_balancing = 0
EOF
}

# pam_limits covers login sessions (SSM, host-side nccl-tests); "*" skips root. Pods: see containerd below.
limits_conf() {
  cat <<'EOF'
# Managed by trainyard prepare-node.
# Project requirement: 500000 files per process; above fs.nr_open (1048576) pam_limits blocks logins.
*       soft    nofile    500000
*       hard    nofile    500000
root    soft    nofile    500000
root    hard    nofile    500000
# EFA (libfabric/ibverbs) pins registered memory; a memlock cap fails registration, and NCCL with it.
*       soft    memlock   unlimited
*       hard    memlock   unlimited
root    soft    memlock   unlimited
root    hard    memlock   unlimited
EOF
}

containerd_dropin() {
  cat <<'EOF'
# Managed by trainyard prepare-node. The base runtime spec sets only RLIMIT_NOFILE (raised in the
# NodeConfig), so pods inherit containerd's memlock limit, which EFA needs unlimited.
[Service]
LimitMEMLOCK=infinity
EOF
}

write_settings() {
  sysctl_conf | install_file "$(under /etc/sysctl.d/90-trainyard.conf)" 0644
  limits_conf | install_file "$(under /etc/security/limits.d/90-trainyard.conf)" 0644
  if [[ $role == gpu ]]; then
    # Unprivileged pods get no GPU by NVIDIA_VISIBLE_DEVICES (toolkit 1.20 cuda_image.go)
    ! command -v nvidia-ctk >/dev/null || nvidia-ctk config -i -c "$(under /etc/nvidia-container-runtime/config.toml)" --set accept-nvidia-visible-devices-envvar-when-unprivileged=false
    containerd_dropin | install_file "$(under /etc/systemd/system/containerd.service.d/90-trainyard.conf)" 0644
  fi
}

apply_settings() {
  if ((!apply)); then
    log "--no-apply: configuration written, not loaded"
  elif [[ $root == / ]]; then
    sysctl --system >/dev/null || log "warning: sysctl --system reported errors"
    [[ ! -d /run/systemd/system ]] || systemctl daemon-reload || log "warning: daemon-reload failed"
  else # only our file: the rest of --root is not this machine's configuration
    sysctl -p "$(under /etc/sysctl.d/90-trainyard.conf)" >/dev/null || log "warning: sysctl -p failed"
  fi
}

# Instance-store namespaces by their sysfs model: udev's by-id links may not exist yet under cloud-init.
discover() {
  local dir model
  for dir in "$sysfs"/block/nvme*; do
    [[ -r $dir/device/model ]] || continue
    model=""
    read -r model <"$dir/device/model" || true # also strips the padding
    if [[ $model == "$STORE_MODEL" ]]; then echo "/dev/${dir##*/}"; fi
  done
}

# classify DEV: blank | cache-fs | cache-member:<array uuid> | missing | foreign:<signatures>. wipefs sees
# filesystems, RAID superblocks and partition tables; anything but exactly ours is foreign.
classify() {
  local out sigs="" type label
  [[ -b $1 ]] || { echo missing && return; }
  out=$(wipefs --noheadings --output TYPE,LABEL "$1" 2>&1) || { echo "foreign:unreadable" && return; }
  while read -r type label; do
    if [[ -n $type ]]; then sigs+="${sigs:+,}$type${label:+:$label}"; fi
  done <<<"$out"
  case $sigs in
    "") echo blank ;;
    "xfs:$CACHE_LABEL") echo cache-fs ;;
    # name is "any:<name>" (homehost any); accept any host: instance store never leaves its instance
    linux_raid_member:*:"$MD_NAME" | "linux_raid_member:$MD_NAME")
      echo "cache-member:$(mdadm -E --export "$1" | sed -n 's/^MD_UUID=//p')" ;;
    *) echo "foreign:$sigs" ;;
  esac
}

make_fs() {
  log "formatting $1 as XFS, label $CACHE_LABEL"
  mkfs.xfs -q -L "$CACHE_LABEL" "$1" # no -f: mkfs.xfs refuses existing signatures too
}

# RAID0 from an all-blank set, or reassembly of exactly one earlier array of ours; else refuse.
cache_on_array() {
  local state all_blank=1 one_array=1 holder
  for state in "${states[@]}"; do
    [[ $state == blank ]] || all_blank=0
    [[ $state == cache-member:?* && $state == "${states[0]}" ]] || one_array=0
  done
  if ((all_blank)); then
    log "creating RAID0 /dev/md/$MD_NAME from $*"
    # homehost any: udev reassembles it under this name on the next boot
    mdadm --create "/dev/md/$MD_NAME" --run --level=0 --metadata=1.2 --homehost=any --name="$MD_NAME" \
      --raid-devices=$# "$@"
    cache_dev=/dev/md/$MD_NAME
  elif ((one_array)); then
    for holder in /sys/class/block/"$(basename "$(readlink -f "$1")")"/holders/md*; do
      if [[ -e $holder ]]; then cache_dev=/dev/${holder##*/}; fi
    done
    if [[ -z $cache_dev ]]; then
      log "assembling /dev/md/$MD_NAME from $*"
      mdadm --assemble "/dev/md/$MD_NAME" "$@"
      cache_dev=/dev/md/$MD_NAME
    fi
  else
    refuse "devices $* are neither all blank nor one trainyard array (${states[*]})"
    return
  fi
  state=$(classify "$cache_dev")
  case $state in
    blank) make_fs "$cache_dev" ;;
    cache-fs) log "$cache_dev already holds the cache filesystem" ;;
    *) refuse "array $cache_dev holds $state" && cache_dev="" ;;
  esac
}

mount_cache() {
  local target current fstab
  target=$(under "$CACHE_MOUNT") fstab=$(under /etc/fstab)
  mkdir -p "$target"
  current=$(findmnt -rn -o SOURCE --mountpoint "$target" | head -n 1 || true)
  if [[ -z $current ]]; then
    mount -t xfs -o noatime "$cache_dev" "$target"; log "mounted $cache_dev at $target"
  elif [[ $(readlink -f "$current") == "$(readlink -f "$cache_dev")" ]]; then
    log "$target already mounted from $current"
  else
    refuse "$target is already a mount of $current" && return
  fi
  # By label (NVMe names change across boots); nofail: instance store is blank after a stop/start.
  {
    if [[ -f $fstab ]]; then awk -v mp="$CACHE_MOUNT" '$2 != mp && !/^# trainyard-cache:/' "$fstab"; fi
    echo "# trainyard-cache: NVMe instance-store cache (Alluxio SSD tier), written by prepare-node"
    echo "LABEL=$CACHE_LABEL $CACHE_MOUNT xfs defaults,noatime,nofail,x-systemd.device-timeout=30s 0 0"
  } | install_file "$fstab" 0644
}

prepare_cache() {
  local dev
  for dev in "$@"; do
    states+=("$(classify "$dev")") && log "$dev: ${states[-1]}"
  done
  if (($# > 1)); then
    cache_on_array "$@"
  elif [[ ${states[0]} == blank || ${states[0]} == cache-fs ]]; then
    if [[ ${states[0]} == blank ]]; then make_fs "$1"; fi
    cache_dev=$1
  else
    refuse "$1 holds ${states[0]}"
  fi
  if [[ -n $cache_dev ]]; then mount_cache; fi
}

report_raw() {
  local dev state
  for dev in "$@"; do
    state=$(classify "$dev")
    case $state in
      blank) log "$dev: raw, left for a Ceph OSD" ;;
      cache-*) log "$dev: carries the trainyard cache ($state) from an earlier life; left untouched" ;;
      missing) log "$dev: not a block device; skipped" ;;
      *) log "$dev: holds ${state#foreign:}; left untouched (Rook will not use it)" ;;
    esac
  done
}

main() {
  parse_args "$@"
  write_settings
  apply_settings
  if [[ $role == system ]]; then
    log "role system: instance-store devices are not used" && return
  fi
  if ((!devices_given)); then mapfile -t devices < <(discover); fi
  if ((${#devices[@]} == 0)); then
    log "no NVMe instance-store devices: nothing to do with devices" && return
  fi
  if [[ $role == gpu ]]; then prepare_cache "${devices[@]}"; else report_raw "${devices[@]}"; fi
  if ((refused)); then
    log "finished with refusals (see REFUSED above)" && exit "$EXIT_REFUSED"
  fi
  log "done"
}

main "$@"
