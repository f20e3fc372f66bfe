#!/usr/bin/env bash
# Schemathesis (https://schemathesis.io) against a live node, from the
# OpenAPI document the node serves at /openapi.json (docs/openapi.json).
#
# It installs a pinned schemathesis into a virtualenv under the cargo target
# directory (once), starts `meshlog serve` on a free loopback port with a
# scratch data directory, and runs every phase (the document's examples,
# coverage of each parameter's edges, random fuzzing, and stateful
# sequences that follow the document's links: append -> page the stream,
# page -> next page, stale -> resume, add peer -> remove it), bounded in
# examples per operation and in time. It fails on any 5xx, on any response
# the document does not describe (status, content type, headers, body
# schema), on data the document calls invalid being accepted or valid data
# refused, and on the state check in hooks.py (every event a POST /events
# acknowledges is read back with its payload). The node runs with secrets
# (docs/SECURITY.md): schemathesis sends the admin secret, and its
# `ignored_auth` check sends each protected operation without it and must
# be refused. The node is stopped at the end, whatever happened.
#
# Usage: tests/schemathesis/run.sh [extra schemathesis options]
# Environment:
#   MESHLOG              the binary (default: target/debug/meshlog, built if missing)
#   SCHEMATHESIS_SEED    replay a run (the seed is printed at the start)
#   SCHEMATHESIS_MAX_EXAMPLES, SCHEMATHESIS_MAX_TIME   the bounds (50, 90 s)
set -euo pipefail
cd "$(dirname "$0")/../.."

version=4.32.5
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
meshlog="${MESHLOG:-$target/debug/meshlog}"
venv="$target/schemathesis-venv"
seed="${SCHEMATHESIS_SEED:-$(python3 -c 'import random; print(random.getrandbits(32))')}"
max_examples="${SCHEMATHESIS_MAX_EXAMPLES:-50}"
max_time="${SCHEMATHESIS_MAX_TIME:-90}"

if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -qx "schemathesis, version $version"; then
  echo "== installing schemathesis $version into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 keeps venv apart.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$venv"
      python3 -m venv "$venv"
    else
      echo "python3 -m venv failed: install python3-venv" >&2
      exit 1
    fi
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi
if [ ! -x "$meshlog" ]; then
  cargo build --locked -p meshlog-node
fi

scratch="$(mktemp -d)"
node_pid=
cleanup() {
  if [ -n "$node_pid" ]; then
    kill -TERM "$node_pid" 2>/dev/null || true
    wait "$node_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

# Test values, not secrets: they live and die with this scratch node.
admin_secret="schemathesis-admin-secret-$$-$RANDOM"
MESHLOG_ADMIN_SECRETS="$admin_secret" MESHLOG_PEER_SECRETS="schemathesis-peer-secret-$$" \
  "$meshlog" serve --data "$scratch/data" --listen 127.0.0.1:0 \
  >"$scratch/stdout" 2>"$scratch/node.log" &
node_pid=$!
addr=
for _ in $(seq 100); do
  addr="$(sed -n 's/^listening on //p' "$scratch/stdout")"
  [ -n "$addr" ] && break
  if ! kill -0 "$node_pid" 2>/dev/null; then
    cat "$scratch/node.log" >&2
    echo "the node exited before it listened" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "the node did not listen within 10 s" >&2
  exit 1
fi
url="http://$addr"
echo "== schemathesis $version against $url (seed $seed; replay with SCHEMATHESIS_SEED=$seed)"

# One worker: with two, hypothesis parses lambda sources from two threads
# and CPython 3.11.7's `ast.parse` fails under that ("AST constructor
# recursion depth mismatch", CPython gh-106905), an error of the tool.
# Schemathesis keeps its crash store (for `st replay`) in the working
# directory: run it from one under the target directory.
here="$PWD/tests/schemathesis"
work="$target/schemathesis"
mkdir -p "$work"
status=0
(cd "$work" && MESHLOG_NODE_URL="$url" MESHLOG_TOKEN="$admin_secret" \
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" \
  PYTHONDONTWRITEBYTECODE=1 \
  SCHEMATHESIS_HOOKS=hooks \
  "$venv/bin/schemathesis" --config-file "$here/schemathesis.toml" \
  run "$url/openapi.json" \
  --checks all \
  --exclude-checks positive_data_acceptance \
  --generation-with-security-parameters false \
  --header "Authorization: Bearer $admin_secret" \
  --phases examples,coverage,fuzzing,stateful \
  --max-examples "$max_examples" \
  --max-time "$max_time" \
  --seed "$seed" \
  --workers 1 \
  --request-timeout 10 \
  --generation-database none \
  --no-color \
  "$@") || status=$?

# The node must still be serving after all of it.
if ! kill -0 "$node_pid" 2>/dev/null; then
  echo "the node died during the run; its log:" >&2
  tail -50 "$scratch/node.log" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "the node's log (last 30 lines):" >&2
  tail -30 "$scratch/node.log" >&2
fi
exit "$status"
