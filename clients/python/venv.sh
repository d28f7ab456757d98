# Sourced by test.sh and lint.sh: makes .venv here (git-ignored) with the
# pinned requirements-test.txt when missing or when the pins changed (a stamp
# of them makes a second run install nothing), under a lock. Needs $repo.
apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "clients/python: installing $* (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv

exec 9>"$here/.deps.lock"
flock 9
venv=$here/.venv
want=$(sha256sum <requirements-test.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
    echo "clients/python: creating $venv (requirements-test.txt, from PyPI)" >&2
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        rm -rf "$venv"
        apt_install python3-venv
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements-test.txt
    echo "$want" >"$venv/.installed"
fi
flock -u 9
