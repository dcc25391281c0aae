#!/usr/bin/env bash
# bash tests/tiers/need.sh COMMAND=PACKAGE...: installs from Debian's packages the package of each COMMAND this
# machine lacks, in one apt run. Runs are serialised by a lock, so tiers and venv builds that run side by side (make
# -j) can each ask for what they need without tripping over apt's own locks.
set -euo pipefail
missing=()
for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null || missing+=("${pair#*=}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "need.sh: install these Debian packages first: ${missing[*]}" >&2
    exit 1
fi
exec 9>/var/lock/gymhost-apt.lock
flock 9
still=()
for package in "${missing[@]}"; do dpkg -s "$package" >/dev/null 2>&1 || still+=("$package"); done
[ ${#still[@]} -eq 0 ] && exit 0
echo "need.sh: installing ${still[*]} (Debian packages)"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${still[@]}" >/dev/null
