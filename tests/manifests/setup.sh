#!/usr/bin/env bash
# bash tests/manifests/setup.sh DIR PYTHON UV: builds the manifests tier's tools into DIR, from scratch (PyPI and npm are
# reached here only; the tests then run offline):
#   DIR/                          a venv from PYTHON with requirements.txt (kubernetes-validate, envoy-data-plane,
#                                 pytest, ...); tests/test_manifests.py runs in it and finds the rest through it
#   DIR/node/node_modules/        package.json's npm packages
#   DIR/node/httproute.schema.json, podmonitor.schema.json  strict JSON Schemas of HTTPRoute and PodMonitor
#                                 (unknown fields rejected), generated from httproute.ts and podmonitor.ts
# @kubernetes-models/gateway-api is pinned to exactly 2.0.0: it is built from Gateway API v1.5.1's CRDs, with the
# experimental HTTPRoute sessionPersistence deploy/kubernetes uses. 2.0.0 declares engines node >= 22 (it runs on
# node 20), and on an older node npm resolves any looser spec to 0.5.1 (Gateway API v1.0, no sessionPersistence).
# node and npm: Debian's packages, installed here when missing if run as root (tests/tiers/need.sh).
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: bash tests/manifests/setup.sh DIR PYTHON UV   (e.g. .venv-manifests python3.12 .venv-uv/bin/uv)" >&2
    exit 2
fi
DIR=$1
PYTHON=$2
UV=$3
HERE=$(cd "$(dirname "$0")" && pwd)

bash "$HERE/../tiers/need.sh" node=nodejs npm=npm

rm -rf "$DIR"
"$UV" venv --quiet --python "$PYTHON" "$DIR"
DIR=$(cd "$DIR" && pwd)
"$UV" pip install --quiet --python "$DIR/bin/python" -r "$HERE/requirements.txt"

# The inputs are copied beside what they built: the tests compare them with the checkout's, so stale tools fail.
mkdir "$DIR/node"
cp "$HERE/requirements.txt" "$DIR/"
cp "$HERE/package.json" "$HERE/httproute.ts" "$HERE/podmonitor.ts" "$HERE/tsconfig.json" "$DIR/node/"
(cd "$DIR/node" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
for kind in HTTPRoute PodMonitor; do
    name=$(echo "$kind" | tr '[:upper:]' '[:lower:]')
    "$DIR/node/node_modules/.bin/ts-json-schema-generator" --path "$DIR/node/$name.ts" \
        --tsconfig "$DIR/node/tsconfig.json" --type "$kind" --no-type-check --out "$DIR/node/$name.schema.json"
done

touch "$DIR/.installed"
