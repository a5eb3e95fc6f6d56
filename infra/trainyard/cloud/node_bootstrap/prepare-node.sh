#!/usr/bin/env bash
# trainyard prepare-node: OS preparation of a trainyard EKS node (Amazon Linux 2023). EC2 user data runs it
# once from cloud-init, before nodeadm-run.service starts containerd and kubelet.
#
#   prepare-node.sh --role gpu|storage|system [--root DIR] [--devices "DEV ..."] [--sysfs DIR] [--no-apply]
#
#   --role      gpu: all NVMe instance-store devices become one XFS cache (mdadm RAID0 when there are
#               several) mounted at /mnt/trainyard-cache, the Alluxio SSD tier.
#               storage: the devices stay raw for Ceph OSDs; they are only reported.
#               system: devices are not looked at.
#   --root      prefix for every file written and every mount point (default /).
#   --devices   explicit device list ("" = none). Default: the NVMe namespaces whose controller reports the
#               model "Amazon EC2 NVMe Instance Storage" in sysfs (no dependency on udev's by-id links, which
#               may not exist yet when cloud-init runs).
#   --sysfs     sysfs to discover devices in (default /sys).
#   --no-apply  write the configuration files but do not load them (sysctl, systemctl daemon-reload).
#
# Exit status: 0 done, or nothing to do; 2 usage error; 3 refused: a device holds data that is not ours, so
# no device was touched and no cache is mounted. Kernel settings and limits are written before devices are
# handled, and a refusal does not stop the node from booting and joining: cloud-init records the failure
# (`cloud-init status`, console output), while nodeadm-run.service is only ordered after cloud-final, it does
# not require it. The node then simply has no cache, which the cache tier must tolerate anyway because
# instance store comes back blank after a stop/start.
set -Eeuo pipefail

readonly CACHE_LABEL=TYCACHE
readonly CACHE_MOUNT=/mnt/trainyard-cache
readonly MD_NAME=trainyard-cache
readonly INSTANCE_STORE_MODEL="Amazon EC2 NVMe Instance Storage"
readonly EXIT_USAGE=2
readonly EXIT_REFUSED=3
readonly USAGE='usage: prepare-node.sh --role gpu|storage|system [--root DIR] [--devices "DEV ..."] [--sysfs DIR] [--no-apply]'

role=""
root=/
sysfs=/sys
apply=1
devices_given=0
devices=()
refused=0
states=()
cache_dev=""

log() { printf 'trainyard-prepare-node: %s\n' "$*" >&2; }
trap 'log "error: line $LINENO: \"$BASH_COMMAND\" exited with $?"' ERR

usage_error() {
    log "$1"
    log "$USAGE"
    exit "$EXIT_USAGE"
}

refuse() {
    log "REFUSED: $*; left untouched"
    refused=1
}

parse_args() {
    while (($#)); do
        case $1 in
            --role | --root | --devices | --sysfs)
                (($# >= 2)) || usage_error "$1 needs a value"
                case $1 in
                    --role) role=$2 ;;
                    --root) root=$2 ;;
                    --devices)
                        read -r -a devices <<<"$2"
                        devices_given=1
                        ;;
                    --sysfs) sysfs=$2 ;;
                esac
                shift 2
                ;;
            --no-apply)
                apply=0
                shift
                ;;
            -h | --help)
                printf '%s\n' "$USAGE"
                exit 0
                ;;
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

# under PATH: PATH as seen from --root.
under() {
    if [[ $root == / ]]; then printf '%s\n' "$1"; else printf '%s%s\n' "$root" "$1"; fi
}

# install_file DEST MODE < content: DEST is replaced only when the content differs, so a rerun leaves
# files (and their mtimes) alone.
install_file() {
    local dest=$1 mode=$2 tmp
    mkdir -p "$(dirname "$dest")"
    tmp=$(mktemp "$dest.XXXXXX")
    cat >"$tmp"
    if [[ -f $dest ]] && cmp -s "$tmp" "$dest"; then
        rm -f "$tmp"
        chmod "$mode" "$dest"
        log "unchanged: $dest"
    else
        chmod "$mode" "$tmp"
        mv -f "$tmp" "$dest"
        log "wrote: $dest"
    fi
}

# at_least KEY WANT: WANT, or the live value of sysctl KEY when the kernel already allows more. These keys
# are ceilings, and lowering one is a regression: systemd raises fs.file-max far above 1000000 at boot, and
# the kernel scales it with memory (a p5 has 2 TiB). Compared as digit strings, so huge values cannot
# overflow shell arithmetic.
at_least() {
    local want=$2 live="" path="/proc/sys/${1//.//}"
    if [[ -r $path ]]; then read -r live <"$path" || true; fi
    if [[ $live =~ ^[1-9][0-9]*$ ]] && { ((${#live} > ${#want})) || { ((${#live} == ${#want})) && [[ $live > $want ]]; }; }; then
        printf '%s\n' "$live"
    else
        printf '%s\n' "$want"
    fi
}

sysctl_conf() {
    cat <<EOF
# Managed by trainyard prepare-node (role: $role). Ceilings are never set below what the kernel allows.

# Project requirement: system-wide open files for DataLoader workers (each holding shard files), NCCL/Gloo
# sockets, and the Alluxio and Ceph clients sharing the node.
fs.file-max = $(at_least fs.file-max 1000000)

# Memory-mapped datasets (numpy memmap, Arrow, WebDataset) and the CUDA driver create many mappings per
# process; the kernel default 65530 makes mmap fail with ENOMEM in large DataLoader pools.
vm.max_map_count = $(at_least vm.max_map_count 1048576)

# kubelet, containerd, config reloaders and the data loaders' file watchers each take inotify instances and
# watches; running out shows up as "too many open files" from unrelated pods.
fs.inotify.max_user_instances = $(at_least fs.inotify.max_user_instances 8192)
fs.inotify.max_user_watches = $(at_least fs.inotify.max_user_watches 524288)

# The torchrun c10d rendezvous store on one node accepts a connection from every worker at once; a short
# accept backlog drops them and shows up as rendezvous timeouts when a large job (re)starts.
net.core.somaxconn = $(at_least net.core.somaxconn 32768)

# 16 MiB socket buffers: cap for applications that size their buffers explicitly (Ceph messenger, Gloo)
# and the TCP autotuning maximum, so one stream can fill a 100+ Gbit/s in-VPC path (NCCL socket transport on
# GPU types without EFA, Alluxio workers reading S3 and serving peers, Ceph replication).
net.core.rmem_max = $(at_least net.core.rmem_max 16777216)
net.core.wmem_max = $(at_least net.core.wmem_max 16777216)
net.ipv4.tcp_rmem = 4096 131072 16777216
net.ipv4.tcp_wmem = 4096 16384 16777216

# With Cilium ENI IPAM every pod has a VPC address, so a busy node resolves neighbours for thousands of
# peers; past the default gc_thresh3 (1024) the kernel logs "neighbour table overflow" and drops packets.
net.ipv4.neigh.default.gc_thresh1 = $(at_least net.ipv4.neigh.default.gc_thresh1 8192)
net.ipv4.neigh.default.gc_thresh2 = $(at_least net.ipv4.neigh.default.gc_thresh2 32768)
net.ipv4.neigh.default.gc_thresh3 = $(at_least net.ipv4.neigh.default.gc_thresh3 65536)
EOF
    if [[ $role == gpu ]]; then
        cat <<'EOF'

# Automatic NUMA balancing unmaps pages to sample their use and migrates them; on GPU hosts that stalls
# the pinned host buffers CUDA, NCCL and EFA DMA into and adds step-time jitter. Placement is decided by
# the kubelet topology manager instead.
kernel.numa_balancing = 0
EOF
    fi
}

# pam_limits applies these to login sessions (SSM/SSH debugging, nccl-tests on the host); "*" does not
# cover root, hence the explicit root lines. Pods get their limits from containerd (see below).
limits_conf() {
    cat <<'EOF'
# Managed by trainyard prepare-node.
# Project requirement: 500000 open files per process (DataLoader worker pools, many shard files). Kept
# below fs.nr_open (1048576): a hard limit above it makes pam_limits fail and the login with it.
*       soft    nofile    500000
*       hard    nofile    500000
root    soft    nofile    500000
root    hard    nofile    500000
# EFA (libfabric/ibverbs) registers and pins host memory for RDMA; a memlock limit makes registration
# fail and NCCL fall back to sockets or abort.
*       soft    memlock   unlimited
*       hard    memlock   unlimited
root    soft    memlock   unlimited
root    hard    memlock   unlimited
EOF
}

# Containers inherit RLIMIT_MEMLOCK from containerd: the base runtime spec only sets RLIMIT_NOFILE (which
# the user data's NodeConfig raises), so without this drop-in EFA memory registration inside pods is
# limited to systemd's default. LimitNOFILE is left alone for that reason too.
containerd_dropin() {
    cat <<'EOF'
# Managed by trainyard prepare-node: pods inherit containerd's memlock limit; EFA/RDMA needs it unlimited.
[Service]
LimitMEMLOCK=infinity
EOF
}

write_settings() {
    sysctl_conf | install_file "$(under /etc/sysctl.d/90-trainyard.conf)" 0644
    limits_conf | install_file "$(under /etc/security/limits.d/90-trainyard.conf)" 0644
    if [[ $role == gpu ]]; then
        containerd_dropin | install_file "$(under /etc/systemd/system/containerd.service.d/90-trainyard-limits.conf)" 0644
    fi
}

apply_settings() {
    if ((!apply)); then
        log "--no-apply: configuration written, not loaded"
        return 0
    fi
    if [[ $root == / ]]; then
        sysctl --system >/dev/null || log "warning: sysctl --system reported errors"
        if [[ -d /run/systemd/system ]]; then
            systemctl daemon-reload || log "warning: systemctl daemon-reload failed"
        fi
    else
        # Only our file: the other sysctl.d files under --root are not this machine's.
        sysctl -p "$(under /etc/sysctl.d/90-trainyard.conf)" >/dev/null || log "warning: sysctl -p reported errors"
    fi
}

discover_instance_store() {
    local dir model
    for dir in "$sysfs"/block/nvme*; do
        [[ -r $dir/device/model ]] || continue
        model=""
        read -r model <"$dir/device/model" || true # read also strips the padding sysfs adds
        if [[ $model == "$INSTANCE_STORE_MODEL" ]]; then printf '/dev/%s\n' "${dir##*/}"; fi
    done
}

# classify DEV: blank | cache-fs | cache-member:<array uuid> | missing | foreign:<signatures>.
# wipefs lists every signature it knows (filesystems, RAID superblocks, partition tables), so anything
# other than exactly our own filesystem or array membership counts as foreign.
classify() {
    local dev=$1 out sigs="" type label
    if [[ ! -b $dev ]]; then
        echo missing
        return
    fi
    if ! out=$(wipefs --noheadings --output TYPE,LABEL "$dev" 2>&1); then
        echo "foreign:unreadable(${out//$'\n'/ })"
        return
    fi
    while read -r type label; do
        if [[ -n $type ]]; then sigs+="${sigs:+,}$type${label:+:$label}"; fi
    done <<<"$out"
    case $sigs in
        "") echo blank ;;
        "xfs:$CACHE_LABEL") echo cache-fs ;;
        "linux_raid_member:any:$MD_NAME") echo "cache-member:$(mdadm --examine --export "$dev" | sed -n 's/^MD_UUID=//p')" ;;
        *) echo "foreign:$sigs" ;;
    esac
}

make_fs() {
    log "formatting $1 as XFS, label $CACHE_LABEL"
    # No -f: mkfs.xfs itself refuses to overwrite an existing signature, a second guard after classify.
    mkfs.xfs -q -L "$CACHE_LABEL" "$1"
}

# active_array DEV: the md device DEV is currently a member of, if any.
active_array() {
    local holder
    for holder in /sys/class/block/"$(basename "$(readlink -f "$1")")"/holders/md*; do
        if [[ -e $holder ]]; then
            printf '/dev/%s\n' "${holder##*/}"
            return
        fi
    done
}

# cache_on_array DEV... with their states in the global `states`: sets cache_dev to the RAID0 array.
# Only an all-blank set (create) or a set that is exactly one earlier array of ours (reassemble) is used.
cache_on_array() {
    local -a devs=("$@")
    local state first=${states[0]} all_blank=1 same_member=1
    for state in "${states[@]}"; do
        [[ $state == blank ]] || all_blank=0
        [[ $state == cache-member:?* && $state == "$first" ]] || same_member=0
    done
    if ((all_blank)); then
        log "creating RAID0 /dev/md/$MD_NAME from ${devs[*]}"
        # homehost "any": the array keeps its name when udev assembles it on the next boot.
        mdadm --create "/dev/md/$MD_NAME" --run --level=0 --metadata=1.2 --homehost=any --name="$MD_NAME" \
            --raid-devices="${#devs[@]}" "${devs[@]}"
        cache_dev=/dev/md/$MD_NAME
    elif ((same_member)); then
        cache_dev=$(active_array "${devs[0]}")
        if [[ -z $cache_dev ]]; then
            log "assembling existing array /dev/md/$MD_NAME from ${devs[*]}"
            mdadm --assemble "/dev/md/$MD_NAME" "${devs[@]}"
            cache_dev=/dev/md/$MD_NAME
        fi
    else
        refuse "devices ${devs[*]} are not all blank nor one trainyard array (${states[*]})"
        return
    fi
    case $(classify "$cache_dev") in
        blank) make_fs "$cache_dev" ;;
        cache-fs) log "$cache_dev already holds the cache filesystem" ;;
        *)
            refuse "array $cache_dev holds $(classify "$cache_dev")"
            cache_dev=""
            ;;
    esac
}

mount_cache() {
    local target current
    target=$(under "$CACHE_MOUNT")
    mkdir -p "$target"
    current=$(findmnt -rn -o SOURCE --mountpoint "$target" | head -n 1 || true)
    if [[ -z $current ]]; then
        mount -t xfs -o noatime "$cache_dev" "$target"
        log "mounted $cache_dev at $target"
    elif [[ $(readlink -f "$current") == "$(readlink -f "$cache_dev")" ]]; then
        log "$target already mounted from $current"
    else
        refuse "$target is already a mount of $current"
        return
    fi
    # By label: NVMe names are not stable across boots. nofail and a short device timeout: after a stop/start
    # the instance store is blank, and the boot must go on without the cache instead of hanging.
    {
        if [[ -f $(under /etc/fstab) ]]; then
            awk -v mp="$CACHE_MOUNT" '$2 != mp && $0 !~ /^# trainyard-cache:/' "$(under /etc/fstab)"
        fi
        echo "# trainyard-cache: NVMe instance-store cache (Alluxio SSD tier), written by prepare-node"
        echo "LABEL=$CACHE_LABEL $CACHE_MOUNT xfs defaults,noatime,nofail,x-systemd.device-timeout=30s 0 0"
    } | install_file "$(under /etc/fstab)" 0644
}

prepare_cache() {
    local dev
    states=()
    for dev in "$@"; do
        states+=("$(classify "$dev")")
        log "$dev: ${states[-1]}"
    done
    if (($# == 1)); then
        case ${states[0]} in
            blank) make_fs "$1" ;;
            cache-fs) log "$1 already holds the cache filesystem" ;;
            *)
                refuse "$1 holds ${states[0]}"
                return
                ;;
        esac
        cache_dev=$1
    else
        cache_on_array "$@"
    fi
    if [[ -n $cache_dev ]]; then mount_cache; fi
}

report_raw() {
    local dev state
    for dev in "$@"; do
        state=$(classify "$dev")
        case $state in
            blank) log "$dev: raw, left for a Ceph OSD" ;;
            cache-fs | cache-member:*)
                log "$dev: still carries the trainyard cache ($state) from an earlier life; left untouched" \
                    "(Rook skips devices holding data: wipe it deliberately to give it to an OSD)"
                ;;
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
        log "role system: instance-store devices are not used"
        return 0
    fi
    if ((!devices_given)); then
        mapfile -t devices < <(discover_instance_store)
    fi
    if ((${#devices[@]} == 0)); then
        log "no NVMe instance-store devices: nothing to do with devices"
        return 0
    fi
    case $role in
        gpu) prepare_cache "${devices[@]}" ;;
        storage) report_raw "${devices[@]}" ;;
    esac
    if ((refused)); then
        log "finished with refusals (see REFUSED above)"
        exit "$EXIT_REFUSED"
    fi
    log "done"
}

main "$@"
