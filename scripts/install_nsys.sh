#!/usr/bin/env bash
# Installs Nsight Systems (the `nsys` CLI) from Debian's non-free component, when it is missing.
# Does something only on Debian 12 (bookworm) as root; elsewhere it prints the install steps and
# exits 0 so that setup carries on (the benchmark runs without nsys; the profiling tests skip).
# Idempotent and silent when nsys is already usable. DDP_NO_APT=1 (setup's --no-system): changes
# nothing on the system (no apt source, no apt-get, no symlink); prints the steps instead.
#   usage: bash scripts/install_nsys.sh
set -euo pipefail

DEB_TARGET=/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64
DEB_HOST=/usr/lib/nsight-systems/host-linux-x64
SOURCES=/etc/apt/sources.list.d/ddp-overlap-non-free.sources

say() { printf '[install_nsys] %s\n' "$*" >&2; }

steps() {
    cat >&2 <<'EOF'
[install_nsys] nsys not installed. Either install NVIDIA's Nsight Systems
  (https://developer.nvidia.com/nsight-systems, then put its bin/ on PATH or set NSYS=/path/to/nsys),
  or on Debian 12 as root:
    add the contrib and non-free components to your bookworm apt source (same mirror as main), then
    apt-get update && apt-get install -y --no-install-recommends nsight-systems-target nsight-systems
    ln -s /usr/lib/nsight-systems/host-linux-x64 /usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
EOF
}

# The mirror this machine already uses for bookworm's main component (deb822 or one-line sources).
bookworm_mirror() {
    local uri
    uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ {print u; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    printf '%s' "$uri"
}

# Debian's nsys looks for its importer at ../host-linux-x64 beside the CLI; the package puts it
# elsewhere, and without it `nsys profile` writes only a .qdstrm. (Profiling works without the link
# too, from a private folder, but the link also makes a bare `nsys profile` work.)
link_importer() {
    if [ -d "$DEB_HOST" ] && [ ! -e "$DEB_TARGET/../host-linux-x64" ]; then
        if [ "${DDP_NO_APT:-0}" = 1 ]; then
            say "nsys needs its importer beside the CLI (DDP_NO_APT=1: not linking it): as root,"
            say "  ln -s $DEB_HOST $(dirname "$DEB_TARGET")/host-linux-x64"
            return 0
        fi
        ln -s "$DEB_HOST" "$(dirname "$DEB_TARGET")/host-linux-x64"
        say "linked the nsys importer into $(dirname "$DEB_TARGET")"
    fi
}

if [ -n "${NSYS:-}" ] && [ -x "$NSYS" ]; then exit 0; fi
if [ -x "$DEB_TARGET/nsys" ]; then
    [ "$(id -u)" = 0 ] && link_importer
    exit 0
fi
if command -v nsys >/dev/null 2>&1; then exit 0; fi
# Nsight Compute's nsys (host/target-linux-x64) counts too: profiling runs it beside its importer
# from a private folder (profiling/nsys_layout.py), so nothing needs linking there.
for d in /usr/local/cuda/bin /opt/nvidia/nsight-systems/*/bin /opt/nvidia/nsight-systems-cli/*/bin \
         /opt/nvidia/nsight-compute/*/host/target-linux-x64; do
    [ -x "$d/nsys" ] && exit 0
done

if [ "${DDP_NO_APT:-0}" = 1 ]; then
    say "DDP_NO_APT=1: not installing nsys with apt"
    steps
    exit 0
fi
codename=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}" ) || codename=""
if [ "$codename" != bookworm ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    steps
    exit 0
fi

# nsight-systems is in non-free and needs libcuda1's dependencies from contrib.
if [ ! -f "$SOURCES" ] && ! grep -rqs -E '^[^#]*contrib.*non-free([[:space:]]|$)|^[^#]*non-free([[:space:]]).*contrib' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(bookworm_mirror)
    [ -n "$mirror" ] || { say "found no bookworm entry in the apt sources to add non-free to"; steps; exit 0; }
    say "enabling Debian's contrib and non-free components for bookworm ($SOURCES)"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" >"$SOURCES"
fi
say "installing nsight-systems from Debian (about 170 MB)"
export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
apt-get update -qq -o DPkg::Lock::Timeout=600 >/dev/null
apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 nsight-systems-target nsight-systems >/dev/null
link_importer
[ -x "$DEB_TARGET/nsys" ] || { say "install finished but $DEB_TARGET/nsys is missing"; exit 1; }
say "nsys $("$DEB_TARGET/nsys" --version | awk '{print $NF}') installed at $DEB_TARGET/nsys"
