#!/usr/bin/env bash
# Installs the wheel from DIR (dist.sh's) into a clean virtualenv with
# Flask-Limiter (pinned, requirements-test.txt's versions), and serves
# examples/flask_app.py from the xcloak:// URI against a redis-server with the
# module: 3 requests admitted, the 4th answered 429, decided by XCLOAK.ALLOW,
# the package imported from the virtualenv, not this folder (make dist-check).
set -euo pipefail
dist=${1:?usage: dist-check.sh DIR}
dist=$(cd "$dist" && pwd)
cd "$(dirname "$0")"
here=$PWD
repo=${XCLOAK_REPO:-$(cd ../.. && pwd)}
module=${XCLOAK_MODULE:-$repo/target/release/libxcloak.so}
server_bin=${XCLOAK_SERVER:-redis-server}
wheel=$(ls "$dist"/xcloak-*.whl | head -1)
pin() { grep -i "^$1==" requirements-test.txt; }

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" \
    "$(pin flask-limiter)" "$(pin flask)" "$(pin limits)" "$(pin werkzeug)"

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 1000))
        if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return; fi
    done
    return 1
}
redis_port=$(free_port)
"$server_bin" --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --loadmodule "$module" >/dev/null 2>&1 &
pids+=($!)
app_port=$(free_port)
cp examples/flask_app.py "$work/app.py"
(cd "$work" && RATELIMIT_STORAGE_URI="xcloak://127.0.0.1:$redis_port" exec venv/bin/python app.py "$app_port" \
    >"$work/app.log" 2>&1) &
pids+=($!)
status_of() {  # the HTTP status of GET $1 (000 when nothing answers); no curl needed
    python3 -c 'import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print("000")' "$1"
}
for _ in $(seq 100); do
    [ "$(status_of "http://127.0.0.1:$app_port/health")" = 200 ] && break
    sleep 0.1
done
statuses=""
for _ in 1 2 3 4; do
    statuses+="$(status_of "http://127.0.0.1:$app_port/") "
done
where=$("$work/venv/bin/python" -c 'import xcloak; print(xcloak.__file__)')
calls=$(redis-cli -p "$redis_port" INFO commandstats | grep -o 'cmdstat_xcloak.allow:calls=[0-9]*' || true)
echo "dist-check: $(basename "$wheel") from $where: HTTP $statuses($calls)"
if [ "$statuses" != "200 200 200 429 " ] || [ -z "$calls" ] || [[ "$where" != "$work/venv/"* ]]; then
    echo "dist-check: FAILED" >&2
    cat "$work/app.log" >&2
    exit 1
fi
