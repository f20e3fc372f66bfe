#!/bin/sh
# Installs the node bench's peers from Debian's packages when they are
# missing: Redis (redis-server, for Streams) and NATS (nats-server, for
# JetStream). Called by `cargo bench -p meshlog-bench --bench node`; safe
# to run by hand. Needs root (or sudo) and apt-get; does nothing when both
# binaries are already on the PATH.
set -eu

missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v nats-server >/dev/null 2>&1 || missing="$missing nats-server"
if [ -z "$missing" ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "peers.sh: missing$missing and no apt-get to install them" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo -n"
    else
        echo "peers.sh: missing$missing; installing needs root" >&2
        exit 1
    fi
fi

echo "peers.sh: installing$missing from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
# The packages' own services are not wanted (the bench starts its own
# servers on free ports): policy-rc.d's 101 tells invoke-rc.d not to
# start them, if this machine has no policy already.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ] && [ -z "$sudo" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    # Removed however this script ends.
    trap 'rm -f "$policy"' EXIT
    trap 'exit 130' INT TERM
fi
status=0
{ $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends $missing; } >&2 || status=$?
exit $status
