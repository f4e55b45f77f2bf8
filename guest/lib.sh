# shellcheck shell=bash
# Shared helpers for the guest/*.sh build scripts. Source it, do not run it.
#
# Environment knobs (all optional):
#   GUEST_CACHE        cache root            (default: <repo>/.cache/guest)
#   LINUX_SOURCE_TAR   kernel source tarball (default: /usr/src/linux-source-6.1.tar.xz)
#   GUEST_NO_APT=1     never run apt-get, only report what is missing
#   GUEST_JOBS         make -j value         (default: nproc)

GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$GUEST_DIR/.." && pwd)
GUEST_CACHE=${GUEST_CACHE:-$REPO_ROOT/.cache/guest}
LINUX_SOURCE_PKG=linux-source-6.1
LINUX_SOURCE_TAR=${LINUX_SOURCE_TAR:-/usr/src/linux-source-6.1.tar.xz}
LINUX_SRC_DIR=$GUEST_CACHE/src/linux-source-6.1
GUEST_JOBS=${GUEST_JOBS:-$(nproc 2>/dev/null || echo 2)}

_prog=$(basename "$0")
log() { printf '[%s] %s\n' "$_prog" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$_prog" "$*" >&2; exit 1; }

# ensure_packages "cmd-or-file:debian-package" ...
# Each item is checked by an executable name (plain word) or an absolute file
# path (a header, a tarball). Missing ones are installed with apt-get when we
# are root and GUEST_NO_APT is not set; otherwise the script stops and says
# which packages to install.
ensure_packages() {
    local item what pkg missing=()
    for item in "$@"; do
        what=${item%%:*}
        pkg=${item#*:}
        if [[ $what == /* ]]; then
            [[ -e $what ]] && continue
        else
            command -v "$what" >/dev/null 2>&1 && continue
        fi
        missing+=("$pkg")
    done
    ((${#missing[@]} == 0)) && return 0
    # de-duplicate, keep order
    local uniq=() p seen=" "
    for p in "${missing[@]}"; do
        [[ $seen == *" $p "* ]] && continue
        seen+="$p "
        uniq+=("$p")
    done
    if [[ $(id -u) -eq 0 && -z ${GUEST_NO_APT:-} ]] && command -v apt-get >/dev/null; then
        log "installing missing build dependencies: ${uniq[*]}"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${uniq[@]}" >&2; then
            log "apt-get install failed; refreshing the package index and retrying"
            apt-get update >&2 || die "apt-get update failed"
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${uniq[@]}" >&2 ||
                die "could not install: ${uniq[*]}"
        fi
        return 0
    fi
    die "missing build dependencies; install them with: apt-get install ${uniq[*]}"
}

# Version string of the kernel source: the Debian package version when the
# package is installed, else a hash of the tarball.
linux_source_version() {
    local v
    if v=$(dpkg-query -W -f='${Version}' "$LINUX_SOURCE_PKG" 2>/dev/null) && [[ -n $v ]]; then
        printf '%s %s\n' "$LINUX_SOURCE_PKG" "$v"
    else
        printf 'tarball-sha256 %s\n' "$(sha256sum "$LINUX_SOURCE_TAR" | cut -d' ' -f1)"
    fi
}

# Extract the kernel source once into $LINUX_SRC_DIR (again only when the
# source package version changes).
ensure_linux_source() {
    ensure_packages "$LINUX_SOURCE_TAR:$LINUX_SOURCE_PKG" tar:tar xz:xz-utils
    [[ -r $LINUX_SOURCE_TAR ]] || die "cannot read $LINUX_SOURCE_TAR (apt-get install $LINUX_SOURCE_PKG)"
    local want have=""
    want=$(linux_source_version)
    [[ -f $GUEST_CACHE/src/.version ]] && have=$(cat "$GUEST_CACHE/src/.version")
    if [[ $have == "$want" && -f $LINUX_SRC_DIR/Makefile ]]; then
        return 0
    fi
    log "extracting $LINUX_SOURCE_TAR ($want) into $GUEST_CACHE/src/"
    rm -rf "$GUEST_CACHE/src"
    mkdir -p "$GUEST_CACHE/src.tmp"
    tar -xf "$LINUX_SOURCE_TAR" -C "$GUEST_CACHE/src.tmp"
    [[ -f $GUEST_CACHE/src.tmp/linux-source-6.1/Makefile ]] ||
        die "$LINUX_SOURCE_TAR does not contain linux-source-6.1/Makefile"
    printf '%s\n' "$want" >"$GUEST_CACHE/src.tmp/.version"
    mv "$GUEST_CACHE/src.tmp" "$GUEST_CACHE/src"
}

# Serialise concurrent runs of the build scripts on one cache (tests may call
# them in parallel). The lock is released when the script exits.
take_cache_lock() {
    mkdir -p "$GUEST_CACHE"
    exec 9>"$GUEST_CACHE/.lock"
    if ! flock -n 9; then
        log "waiting for another guest build using $GUEST_CACHE ..."
        flock 9
    fi
}
