#!/usr/bin/env bash
# Builds Tessera's image and packages its Helm chart, both at the workspace's version.
#
#   scripts/release.sh [--registry REG] [--no-image] [--push] [--out DIR]
#
#   --registry REG  image repository prefix (default: $TESSERA_REGISTRY or ghcr.io/example);
#                   the image is REG/tessera:VERSION
#   --no-image      only package the chart (no container engine needed)
#   --push          push the image after building it
#   --out DIR       where the chart's .tgz goes (default: dist/)
#
# VERSION is [workspace.package] version in Cargo.toml. The chart is packaged with
# --version VERSION --app-version VERSION and image.repository REG/tessera, so
# `helm install tessera dist/tessera-VERSION.tgz` pulls exactly the image built
# here (image.tag defaults to the chart's appVersion). Refuses to run when
# Chart.yaml's version or appVersion differs from VERSION: bump them together.
#
# Container engine: docker, else podman (buildah bud works the same way).
# helm: the `helm` binary when on PATH, else the Helm SDK that
# scripts/validate-deploy.sh installs (helm-python-sdk).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REGISTRY="${TESSERA_REGISTRY:-ghcr.io/example}"
BUILD_IMAGE=1
PUSH=0
OUT="$ROOT/dist"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --registry) REGISTRY="$2"; shift 2 ;;
        --no-image) BUILD_IMAGE=0; shift ;;
        --push) PUSH=1; shift ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

VERSION="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && $1=="version" {gsub(/"/, "", $3); print $3; exit}' "$ROOT/Cargo.toml")"
[[ -n "$VERSION" ]] || { echo "error: no [workspace.package] version in Cargo.toml" >&2; exit 1; }
CHART="$ROOT/deploy/helm/tessera"
chart_field() { awk -v k="$1:" '$1==k {gsub(/"/, "", $2); print $2; exit}' "$CHART/Chart.yaml"; }
for field in version appVersion; do
    if [[ "$(chart_field "$field")" != "$VERSION" ]]; then
        echo "error: Chart.yaml $field is $(chart_field "$field"), Cargo.toml's version is $VERSION: bump them together" >&2
        exit 1
    fi
done
IMAGE="$REGISTRY/tessera:$VERSION"

if [[ "$BUILD_IMAGE" == 1 ]]; then
    ENGINE="$(command -v docker || command -v podman || true)"
    [[ -n "$ENGINE" ]] || { echo "error: neither docker nor podman found (or use --no-image)" >&2; exit 1; }
    echo "== building $IMAGE with $ENGINE"
    DOCKER_BUILDKIT=1 "$ENGINE" build --build-arg "VERSION=$VERSION" -t "$IMAGE" "$ROOT"
    if [[ "$PUSH" == 1 ]]; then
        "$ENGINE" push "$IMAGE"
    fi
fi

# The packaged chart points at the image built above.
mkdir -p "$OUT"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
cp -r "$CHART" "$STAGE/tessera"
sed -i "s|^  repository: .*|  repository: $REGISTRY/tessera|" "$STAGE/tessera/values.yaml"
grep -q "^  repository: $REGISTRY/tessera\$" "$STAGE/tessera/values.yaml" ||
    { echo "error: could not set image.repository in the packaged values.yaml" >&2; exit 1; }
echo "== packaging the chart $VERSION (image $IMAGE) into $OUT"
if command -v helm >/dev/null 2>&1; then
    helm package "$STAGE/tessera" --version "$VERSION" --app-version "$VERSION" -d "$OUT"
else
    TOOLS="${TESSERA_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/deploy-tools}"
    [[ -x "$TOOLS/bin/python" ]] ||
        { echo "error: no helm on PATH and no Helm SDK in $TOOLS: install helm, or run scripts/validate-deploy.sh once" >&2; exit 1; }
    "$TOOLS/bin/python" -c '
import sys, helm_python as helm
print(helm.package(sys.argv[1], destination=sys.argv[2], version=sys.argv[3], app_version=sys.argv[3]))
' "$STAGE/tessera" "$OUT" "$VERSION"
fi
