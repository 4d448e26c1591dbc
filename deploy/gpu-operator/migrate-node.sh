#!/usr/bin/env bash
# Moves one GPU node from the GPU Operator's device plugin to Tessera, or back.
#
#   deploy/gpu-operator/migrate-node.sh NODE             # operator plugin -> Tessera
#   deploy/gpu-operator/migrate-node.sh NODE --taint     # ... and keep stock pods off it
#   deploy/gpu-operator/migrate-node.sh NODE --rollback  # Tessera -> operator plugin
#
# Steps (each waits for the previous one; stop anywhere and run --rollback):
#   1. cordon the node (no new pods);
#   2. evict its GPU pods (Eviction API: PodDisruptionBudgets are respected),
#      so no running container holds devices from the plugin that leaves;
#   3. label (or unlabel) the node: the operator removes its device plugin, GFD
#      and MIG manager there, and Tessera's node agent, whose nodeSelector is
#      nvidia.com/gpu.deploy.device-plugin=false, starts (or the reverse);
#   4. wait until the plugin that leaves is gone and the one that arrives is
#      Ready (Tessera: its agent pod Ready and the node's GpuNode published);
#   5. with --taint: taint the node tessera.io/managed=true:NoSchedule, so the
#      default scheduler sends no stock GPU pod there (Tessera's agent would refuse
#      it: no grant); the pods Tessera places get the toleration from the webhook
#      (webhook.podTolerations in deploy/gpu-operator/values.yaml). Refused unless
#      the ClusterPolicy's daemonsets tolerate it (clusterpolicy-patch.yaml), so
#      the operator's driver and toolkit pods keep landing there. --rollback
#      removes the taint;
#   6. uncordon.
# Environment: TESSERA_NAMESPACE (tessera-system), OPERATOR_NAMESPACE (gpu-operator),
# TIMEOUT (300s).
set -euo pipefail

# The node labels that turn the operator's components off on a Tessera node
# (scripts/validate-deploy.sh checks them against deploy/gpu-operator/values.yaml).
LABELS=(
    nvidia.com/gpu.deploy.device-plugin=false
    nvidia.com/gpu.deploy.gpu-feature-discovery=false
    nvidia.com/gpu.deploy.mig-manager=false
)

# The taint --taint sets (webhook.podTolerations in values.yaml tolerates it).
TAINT_KEY=tessera.io/managed
TAINT="$TAINT_KEY=true:NoSchedule"

NODE="${1:?usage: $0 NODE [--taint | --rollback]}"
ROLLBACK=""
TAINT_NODE=""
for arg in "${@:2}"; do
    case "$arg" in
        --rollback) ROLLBACK="--rollback" ;;
        --taint) TAINT_NODE=1 ;;
        *) echo "error: unknown argument $arg (usage: $0 NODE [--taint | --rollback])" >&2; exit 64 ;;
    esac
done
if [[ -n "$ROLLBACK" && -n "$TAINT_NODE" ]]; then
    echo "error: --taint and --rollback together (rollback removes the taint)" >&2; exit 64
fi
TESSERA_NS="${TESSERA_NAMESPACE:-tessera-system}"
OPERATOR_NS="${OPERATOR_NAMESPACE:-gpu-operator}"
TIMEOUT="${TIMEOUT:-300s}"

gpu_pods() {
    # namespace/name of every pod on NODE that asks an nvidia.com/* or tessera.io/* resource.
    kubectl get pods -A --field-selector "spec.nodeName=$NODE" -o go-template='{{range .items}}{{$p := .}}{{$gpu := false}}{{range .spec.containers}}{{range $k, $v := .resources.limits}}{{if or (eq (printf "%.11s" $k) "nvidia.com/") (eq (printf "%.11s" $k) "tessera.io/")}}{{$gpu = true}}{{end}}{{end}}{{end}}{{if $gpu}}{{$p.metadata.namespace}}/{{$p.metadata.name}}{{"\n"}}{{end}}{{end}}'
}

evict_gpu_pods() {
    local pod ns name
    for pod in $(gpu_pods); do
        ns="${pod%%/*}"; name="${pod#*/}"
        echo "evicting $pod"
        printf '{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"%s","namespace":"%s"}}' "$name" "$ns" |
            kubectl create --raw "/api/v1/namespaces/$ns/pods/$name/eviction" -f - >/dev/null
    done
    for pod in $(gpu_pods); do
        kubectl -n "${pod%%/*}" wait --for=delete "pod/${pod#*/}" --timeout="$TIMEOUT"
    done
}

ready_on_node() {
    # Waits until a pod with label selector $2 in namespace $1 exists on NODE, then until it is Ready.
    local deadline=$((SECONDS + ${TIMEOUT%s}))
    until [[ -n "$(kubectl -n "$1" get pods -l "$2" --field-selector "spec.nodeName=$NODE" -o name)" ]]; do
        (( SECONDS < deadline )) || { echo "error: no pod $2 on $NODE after $TIMEOUT" >&2; exit 1; }
        sleep 5
    done
    kubectl -n "$1" wait --for=condition=Ready pod -l "$2" --field-selector "spec.nodeName=$NODE" --timeout="$TIMEOUT"
}

if [[ -n "$TAINT_NODE" ]]; then
    # Before anything changes: the operator's DaemonSets must tolerate the taint.
    tolerated="$(kubectl get clusterpolicies.nvidia.com -o jsonpath='{range .items[*].spec.daemonsets.tolerations[*]}{.key}{"\n"}{end}')"
    if ! grep -qx "$TAINT_KEY" <<<"$tolerated"; then
        echo "error: the ClusterPolicy's daemonsets do not tolerate $TAINT_KEY: apply deploy/gpu-operator/clusterpolicy-patch.yaml first" >&2
        exit 1
    fi
fi

echo "== 1. cordon $NODE"
kubectl cordon "$NODE"
echo "== 2. evict the GPU pods on $NODE"
evict_gpu_pods
if [[ "$ROLLBACK" != "--rollback" ]]; then
    # The GPU Operator's MIG strategy as GFD labelled the node ("single": every MIG
    # instance is an nvidia.com/gpu), kept for Tessera under its own label: GFD
    # leaves the node in step 3 and its labels may go with it.
    strategy="$(kubectl get node "$NODE" -o jsonpath='{.metadata.labels.nvidia\.com/mig\.strategy}')"
    kept="$(kubectl get node "$NODE" -o jsonpath='{.metadata.labels.tessera\.io/mig-strategy}')"
    if [[ -n "$strategy" && -z "$kept" ]]; then
        kubectl label node "$NODE" "tessera.io/mig-strategy=$strategy"
    fi
    echo "== 3. label $NODE: the operator's device plugin, GFD and MIG manager off"
    kubectl label node "$NODE" --overwrite "${LABELS[@]}"
    echo "== 4. wait: the operator's device plugin gone, Tessera's agent Ready"
    kubectl -n "$OPERATOR_NS" wait --for=delete pod -l app=nvidia-device-plugin-daemonset \
        --field-selector "spec.nodeName=$NODE" --timeout="$TIMEOUT"
    ready_on_node "$TESSERA_NS" app.kubernetes.io/component=node-agent
    kubectl wait --for=jsonpath='{.metadata.name}'="$NODE" "gpunode/$NODE" --timeout="$TIMEOUT"
    if [[ -n "$TAINT_NODE" ]]; then
        echo "== 5. taint $NODE $TAINT: stock pods of the default scheduler stay off"
        kubectl taint node "$NODE" "$TAINT" --overwrite
    fi
else
    echo "== 3. unlabel $NODE: the operator's components return"
    kubectl label node "$NODE" "${LABELS[@]/%=*/-}"
    echo "== 4. wait: Tessera's agent gone, the operator's device plugin Ready"
    kubectl -n "$TESSERA_NS" wait --for=delete pod -l app.kubernetes.io/component=node-agent \
        --field-selector "spec.nodeName=$NODE" --timeout="$TIMEOUT"
    ready_on_node "$OPERATOR_NS" app=nvidia-device-plugin-daemonset
    if kubectl get node "$NODE" -o jsonpath='{.spec.taints[*].key}' | tr ' ' '\n' | grep -qx "$TAINT_KEY"; then
        echo "== 5. untaint $NODE"
        kubectl taint node "$NODE" "$TAINT_KEY:NoSchedule-"
    fi
fi
echo "== 6. uncordon $NODE"
kubectl uncordon "$NODE"
