#!/usr/bin/env bash
# The README's two commands on a fresh Debian 12: debootstrap makes a minimal bookworm root (no
# sudo, no compiler, no Node), a clone of this checkout's HEAD goes in, and the two commands
# (scripts/readme_commands.sh) run there in a chroot, as root; with --user, as a user with sudo
# instead (sudo is then installed first: that user's machine has it). The second command runs
# even when the first fails, so a failing main job still shows the tests' state.
#   tests/fresh/run.sh [--user] [--host-ca] [WORK]   as root, with debootstrap and a Debian mirror
# --host-ca: this machine's local CA certificates (/usr/local/share/ca-certificates) go into the
# root too, for a network whose HTTPS passes a proxy with its own CA (npm's registry); the
# ca-certificates package that deps.sh installs adds them to the root's trust store.
# WORK (default /tmp/dsv4-fresh) keeps the untouched debootstrap root (base/, made once and
# reused) and the root of the last run (root/). MIRROR overrides the Debian mirror.
# Prints each command's time and exit status; exits non-zero if either failed.
set -euo pipefail
user=0 host_ca=0
while [ $# -gt 0 ]; do
    case "$1" in
        --user) user=1 ;;
        --host-ca) host_ca=1 ;;
        -*) echo "fresh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
W=${1:-/tmp/dsv4-fresh}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "fresh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$W"
W=$(cd "$W" && pwd)
R=$W/root

mounted=()
cleanup() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R "${mounted[i]}" 2>/dev/null || umount -lR "${mounted[i]}" || true; done
}
trap cleanup EXIT

t0=$(date +%s)
if [ ! -f "$W/base/.done" ]; then
    rm -rf "$W/base"
    echo "fresh: debootstrap bookworm from $MIRROR"
    debootstrap --variant=minbase bookworm "$W/base" "$MIRROR" >"$W/debootstrap.log" 2>&1 ||
        { tail -n 20 "$W/debootstrap.log"; exit 1; }
    touch "$W/base/.done"
    echo "fresh: debootstrap took $(($(date +%s) - t0)) s"
fi
rm -rf "$R"
cp -a "$W/base" "$R"
rm -f "$R/.done"
cp -L /etc/resolv.conf "$R/etc/resolv.conf"   # npm fetches the test clients' packages
# as an installed system has it (sudo looks the host name up)
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(hostname)" >"$R/etc/hosts"
if [ $host_ca = 1 ]; then
    mkdir -p "$R/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null || true
fi

for d in proc sys dev; do
    case $d in
        proc) mount -t proc proc "$R/proc" ;;
        sys) mount -t sysfs sysfs "$R/sys" ;;
        dev) mount --rbind /dev "$R/dev" && mount --make-rslave "$R/dev" ;;
    esac
    mounted+=("$R/$d")
done

# the project as a clone has it: committed files only
home=/root
if [ $user = 1 ]; then
    home=/home/dev
    chroot "$R" bash -c 'apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q sudo >/dev/null &&
        useradd -m -s /bin/bash dev && echo "dev ALL=(ALL) NOPASSWD: ALL" >/etc/sudoers.d/dev'
fi
git clone -q "$repo" "$R$home/dsv4"
[ $user = 1 ] && chroot "$R" chown -R dev:dev "$home/dsv4"
mapfile -t cmds < <("$repo/scripts/readme_commands.sh" "$repo/README.md")

rc=0
for c in "${cmds[@]}"; do
    echo "fresh: \$ $c"
    s=$(date +%s)
    inner="cd $home/dsv4 && $c"
    if [ $user = 1 ]; then
        chroot "$R" env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin TERM=dumb su dev -c "$inner" </dev/null && r=0 || r=$?
    else
        chroot "$R" env -i HOME="$home" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb \
            bash -c "$inner" </dev/null && r=0 || r=$?
    fi
    echo "fresh: exit $r after $(($(date +%s) - s)) s: $c"
    [ $r -eq 0 ] || rc=1
done
echo "fresh: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(($(date +%s) - t0)) s ($([ $user = 1 ] && echo "user with sudo" || echo root))"
exit $rc
