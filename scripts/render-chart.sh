#!/usr/bin/env bash
# Renders the Helm chart (release `tessera`, namespace `tessera-system`) with the
# values given as one JSON object, and prints the manifest, exactly as
# `helm install --dry-run=client` would. The end-to-end suite (crates/tessera-e2e)
# applies its RBAC and CRDs to a real control plane from this render.
#
#   scripts/render-chart.sh '{"scheduler":{"mode":"standalone"}}'
#
# Helm is Helm's own Go SDK from PyPI (helm-python-sdk), in the same tools
# environment scripts/validate-deploy.sh installs ($TESSERA_DEPLOY_TOOLS or
# ~/.cache/tessera/deploy-tools); installed here when it is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${TESSERA_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/deploy-tools}"
HELM_SDK_VERSION=0.2.2
PYTHON="${PYTHON:-python3}"
if ! "$TOOLS/bin/python" -c 'import helm_python' >/dev/null 2>&1; then
    echo "render-chart: installing helm-python-sdk $HELM_SDK_VERSION into $TOOLS" >&2
    [[ -x "$TOOLS/bin/python" ]] || "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check "helm-python-sdk==$HELM_SDK_VERSION" >&2
fi
exec "$TOOLS/bin/python" - "$ROOT/deploy/helm/tessera" "${1:-{\}}" <<'PY'
import json, sys
import helm_python as helm
chart, values = sys.argv[1], json.loads(sys.argv[2])
with helm.Config(namespace="tessera-system") as cfg:
    rel = cfg.install(chart, "tessera", values, namespace="tessera-system", dry_run="client")
sys.stdout.write(rel["manifest"])
PY
