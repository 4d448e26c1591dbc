#!/usr/bin/env bash
# Validates every manifest under deploy/ for Kubernetes 1.28 and later.
#
#   scripts/validate-deploy.sh
#
# Tools (installed once from PyPI into a virtual environment outside the repo,
# $TESSERA_DEPLOY_TOOLS or ~/.cache/tessera/deploy-tools):
#   helm-python-sdk     Helm's own Go SDK (v4) as a shared library: renders the
#                       chart exactly as `helm install --dry-run=client` and runs
#                       `helm lint --strict`.
#   kubernetes-validate the official Kubernetes OpenAPI schemas per release,
#                       as strict JSON schemas (unknown fields are errors).
#   cel-python          a CEL evaluator, for the webhooks' matchConditions.
#
# Checks:
#   - helm lint --strict (kube-version 1.28.0) for each values scenario;
#   - each scenario renders, every object has no duplicate YAML keys and passes
#     the strict schema of every Kubernetes release from 1.28 to the newest one
#     bundled; a kind without a schema (a removed API) is an error;
#   - API-server rules the schemas do not carry: names, labels, port names,
#     resource names, selectors matching their pod templates;
#   - references inside a render: ServiceAccounts, ConfigMaps, Secrets, the
#     webhook's Service and port, RBAC role references, volume mounts;
#   - the KubeSchedulerConfiguration in the chart and in deploy/examples
#     (strict v1 fields of 1.28, kube-scheduler's extender validation, the
#     extender URL being the tessera container's loopback --listen), and the example equals the
#     chart's default render;
#   - the CRD: the apiextensions.k8s.io/v1 schema plus structural-schema rules,
#     and deploy/examples/gpunode.yaml against the CRD's own schema;
#   - webhook scoping: the rendered webhooks' rules, namespaceSelectors and
#     matchConditions (CEL, evaluated) against sample pods: a plain pod and a
#     stock nvidia.com/gpu pod are sent to no webhook (so a dead scheduler cannot
#     refuse them), Tessera's pods, the allocation annotation (set or removed)
#     and cdi.k8s.io/* annotations are sent to the validating one;
#   - the Grafana dashboard: JSON, unique panel ids, datasource variable, and
#     that every metric it queries is one the code exports;
#   - the Dockerfile (no daemon needed): multi-stage, distroless runtime, non-root,
#     COPY sources exist and survive .dockerignore, the binaries it copies are the
#     [[bin]]s built by the same cargo profile;
#   - when a tessera binary is at hand ($TESSERA_BIN, $CARGO_TARGET_DIR or
#     target/, debug or release), every flag the chart passes to
#     `tessera scheduler`, `tessera node-agent` and `tessera estimator` is one their --help lists;
#   - the Karmada estimator (estimator.enabled): a Deployment runs `tessera estimator`
#     for estimator.clusterName behind the Service karmada-scheduler dials
#     (karmada-scheduler-estimator-<cluster>, the --listen port), TLS flags pointing
#     into the mounted Secret, a ClusterRole that grants only get/list/watch;
#   - the DRA driver (nodeAgent.dra): a DaemonSet runs `node-agent --dra` with the
#     kubelet's plugin registry, the driver's socket directory and the CDI directory
#     mounted at the paths the code uses, on nodes the device-plugin agent leaves;
#     its ClusterRole grants the resource.k8s.io verbs the code calls; the
#     DeviceClasses select the driver's device types (CEL, evaluated).
#   - the DRA extended-resource mapping (nodeAgent.dra.extendedResourceName): the class
#     gpu.tessera.io, and only it, carries spec.extendedResourceName exactly when it is
#     set, as resource.k8s.io/v1, validated against the releases whose DeviceClass schema
#     has the field (and shown unknown to the older releases the chart then refuses); the
#     chart refuses what the API server's IsExtendedResourceName refuses (sample names
#     rendered), tessera.io/* and MIG profile names; a stock pod asking the name is sent
#     to no webhook, so it stays with the default scheduler the mapping serves.
# Exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${TESSERA_DEPLOY_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/deploy-tools}"
HELM_SDK_VERSION=0.2.2
KUBERNETES_VALIDATE_VERSION=1.37.0
CEL_PYTHON_VERSION=0.5.0
STAMP="$TOOLS/.installed-helm-python-sdk-$HELM_SDK_VERSION-kubernetes-validate-$KUBERNETES_VALIDATE_VERSION-cel-python-$CEL_PYTHON_VERSION"

PYTHON="${PYTHON:-python3}"
if [[ ! -f "$STAMP" ]]; then
    echo "== installing tools into $TOOLS (helm-python-sdk $HELM_SDK_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION, cel-python $CEL_PYTHON_VERSION)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        { echo "error: $PYTHON is older than 3.10 (helm-python-sdk needs 3.10+)" >&2; exit 1; }
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS" ||
        { echo "error: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
    "$TOOLS/bin/pip" install --quiet --disable-pip-version-check \
        "helm-python-sdk==$HELM_SDK_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
        "cel-python==$CEL_PYTHON_VERSION"
    touch "$STAMP"
fi

# The flag check uses $TESSERA_BIN as given, or the newest built binary when no source
# file is newer than it (a stale binary would report flags that no longer exist).
BIN="${TESSERA_BIN:-}"
if [[ -z "$BIN" ]]; then
    for dir in "${CARGO_TARGET_DIR:-}" "$ROOT/target"; do
        for profile in debug release; do
            candidate="$dir/$profile/tessera"
            if [[ -n "$dir" && -x "$candidate" && ( -z "$BIN" || "$candidate" -nt "$BIN" ) ]]; then BIN="$candidate"; fi
        done
    done
    if [[ -n "$BIN" ]] && [[ -n "$(find "$ROOT/crates" "$ROOT/Cargo.lock" -newer "$BIN" \( -name '*.rs' -o -name 'Cargo.*' \) -print -quit)" ]]; then
        echo "flags: $BIN is older than the sources; not used (rebuild, or set TESSERA_BIN)"
        BIN=""
    fi
fi

exec "$TOOLS/bin/python" - "$ROOT" "$BIN" <<'PY'
import json
import re
import subprocess
import sys
from pathlib import Path

import celpy
import helm_python as helm
import jsonschema
import yaml
from kubernetes_validate import utils as kvu
from referencing import Registry, Resource

ROOT = Path(sys.argv[1])
TESSERA_BIN = sys.argv[2]
CHART = ROOT / "deploy/helm/tessera"
EXAMPLES = ROOT / "deploy/examples"
DASHBOARDS = CHART / "dashboards"
RELEASE, NAMESPACE = "tessera", "tessera-system"
MIN_KUBE = (1, 28)

failures = []
checked = {"objects": 0, "schema validations": 0}


def fail(where, msg):
    failures.append(f"{where}: {msg}")
    print(f"FAIL {where}: {msg}")


def vtuple(v):
    return tuple(int(x) for x in v.split(".")[:2])


KUBE_VERSIONS = sorted({v for v in kvu.all_versions() if vtuple(v) >= MIN_KUBE}, key=vtuple)
if not KUBE_VERSIONS:
    sys.exit("kubernetes-validate bundles no schema for Kubernetes 1.28 or later")


# ---------------------------------------------------------------- YAML
class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (the API server's strict decoding does)."""


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_docs(text, where):
    try:
        return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]
    except yaml.YAMLError as e:
        fail(where, f"invalid YAML: {e}")
        return []


# ---------------------------------------------------------------- schemas
_validators = {}


def k8s_validator(api_version, kind, version):
    key = (api_version, kind, version)
    if key not in _validators:
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        d = f"kubernetes-json-schema/v{version}-local-strict"
        try:
            schema = kvu.schema_contents(f"{d}/{kind.lower()}-{group}.json", version)
        except FileNotFoundError:
            _validators[key] = None
        else:
            defs = kvu.schema_contents(f"{d}/_definitions.json", version)
            registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
            _validators[key] = jsonschema.Draft202012Validator(schema, registry=registry)
    return _validators[key]


def describe(obj):
    md = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{md.get('name')}"


# Kinds of operators the chart can use (cert-manager, the Prometheus operator), whose
# CRDs kubernetes-validate does not carry: their required fields, from the operators'
# CRDs (cert-manager v1.x, monitoring.coreos.com/v1).
_STR = {"type": "string", "minLength": 1}
_LIST = {"type": "array", "minItems": 1}
THIRD_PARTY = {
    ("cert-manager.io/v1", "Issuer"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "minProperties": 1, "maxProperties": 1,
        "properties": {"selfSigned": {"type": "object"}, "ca": {"type": "object", "required": ["secretName"]}},
        "additionalProperties": False}}},
    ("cert-manager.io/v1", "Certificate"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["secretName", "issuerRef"],
        "properties": {"secretName": _STR, "issuerRef": {"type": "object", "required": ["name"]},
                       "dnsNames": {"type": "array", "items": _STR}, "isCA": {"type": "boolean"},
                       "commonName": _STR, "duration": _STR, "renewBefore": _STR,
                       "privateKey": {"type": "object"}}, "additionalProperties": False}}},
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["selector", "endpoints"],
        "properties": {"endpoints": {**_LIST, "items": {"type": "object", "required": ["port"]}}}}}},
    ("monitoring.coreos.com/v1", "PodMonitor"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["selector", "podMetricsEndpoints"],
        "properties": {"podMetricsEndpoints": {**_LIST, "items": {"type": "object", "required": ["port"]}}}}}},
    ("monitoring.coreos.com/v1", "PrometheusRule"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["groups"], "properties": {"groups": {**_LIST, "items": {
            "type": "object", "required": ["name", "rules"], "properties": {"rules": {**_LIST, "items": {
                "type": "object", "required": ["expr"],
                "properties": {"alert": _STR, "expr": _STR, "for": _STR,
                               "labels": {"type": "object"}, "annotations": {"type": "object"}}}}}}}}}}},
}


# API versions the chart renders only in scenarios that need a newer cluster (the DRA
# driver's DeviceClasses: resource.k8s.io/v1 is served from Kubernetes 1.34, v1beta2 from
# 1.33, v1beta1 from 1.32). Their objects are validated against the releases that serve
# them; the older releases have no such kind (the chart's kubeVersion stays >=1.28 for
# everything else), so those validations are skipped, not failed (check_dra says which).
API_SINCE = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): (1, 30),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (1, 30),
    ("resource.k8s.io/v1", "DeviceClass"): (1, 34),
    ("resource.k8s.io/v1beta2", "DeviceClass"): (1, 33),
    ("resource.k8s.io/v1beta1", "DeviceClass"): (1, 32),
}


def schema_check(obj, where):
    third = THIRD_PARTY.get((obj.get("apiVersion"), obj.get("kind")))
    if third is not None:
        checked["schema validations"] += 1
        for err in jsonschema.Draft202012Validator(third).iter_errors(obj):
            fail(where, f"{describe(obj)}: {'.'.join(map(str, err.path))}: {err.message}")
        return
    for version in KUBE_VERSIONS:
        if vtuple(version) < API_SINCE.get((obj.get("apiVersion"), obj.get("kind")), MIN_KUBE):
            continue
        v = k8s_validator(obj.get("apiVersion", ""), obj.get("kind", ""), version)
        if v is None:
            fail(where, f"{describe(obj)}: no {obj.get('apiVersion')} {obj.get('kind')} in Kubernetes {version}")
            continue
        checked["schema validations"] += 1
        for err in sorted(v.iter_errors(obj), key=lambda e: list(e.path)):
            path = ".".join(str(p) for p in err.path)
            fail(where, f"{describe(obj)} (Kubernetes {version}): {path}: {err.message}")


# ---------------------------------------------------------------- API-server rules
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def qualified_name_errors(name):
    errs = []
    parts = name.split("/")
    if len(parts) > 2:
        return ["has more than one '/'"]
    if len(parts) == 2:
        prefix, short = parts
        if not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix):
            errs.append(f"prefix {prefix!r} is not a DNS-1123 subdomain")
    else:
        short = parts[0]
    if not short or len(short) > 63 or not QUALIFIED_NAME_PART.match(short):
        errs.append(f"name part {short!r} is not a qualified name")
    return errs


def check_labels(labels, where, what):
    for k, v in (labels or {}).items():
        for e in qualified_name_errors(str(k)):
            fail(where, f"{what} key {k!r}: {e}")
        if not isinstance(v, str):
            fail(where, f"{what} {k!r}: value {v!r} is not a string")
        elif len(v) > 63 or not LABEL_VALUE.match(v):
            fail(where, f"{what} {k!r}: value {v!r} is not a valid label value")


def check_name(obj, where):
    md = obj.get("metadata") or {}
    name = md.get("name", "")
    kind = obj.get("kind")
    if kind == "Service":
        ok = len(name) <= 63 and DNS1035_LABEL.match(name)
        rule = "a DNS-1035 label"
    elif kind in ("Namespace",):
        ok = len(name) <= 63 and DNS1123_LABEL.match(name)
        rule = "a DNS-1123 label"
    elif kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        ok = bool(name) and "/" not in name and "%" not in name and name not in (".", "..")
        rule = "a path segment name"
    else:
        ok = len(name) <= 253 and DNS1123_SUBDOMAIN.match(name)
        rule = "a DNS-1123 subdomain"
    if not ok:
        fail(where, f"{describe(obj)}: name {name!r} is not {rule}")
    if kind in ("Deployment", "DaemonSet") and len(name) > 63:
        fail(where, f"{describe(obj)}: name longer than 63 characters (pod names derive from it)")
    check_labels(md.get("labels"), where, f"{describe(obj)} label")
    for k in (md.get("annotations") or {}):
        for e in qualified_name_errors(str(k)):
            fail(where, f"{describe(obj)} annotation key {k!r}: {e}")


def extended_resource_errors(name):
    errs = qualified_name_errors(name)
    native = "/" not in name or "kubernetes.io/" in name
    if native or name.startswith("requests."):
        errs.append("is not an extended resource name")
    elif qualified_name_errors("requests." + name):
        errs.append("'requests.' + name is not a qualified name")
    return errs


def check_pod_spec(spec, where, owner):
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for n in volumes:
        if not n or len(n) > 63 or not DNS1123_LABEL.match(n):
            fail(where, f"{owner}: volume name {n!r} is not a DNS-1123 label")
    names = set()
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        cn = c.get("name", "")
        if cn in names:
            fail(where, f"{owner}: duplicate container name {cn!r}")
        names.add(cn)
        if not DNS1123_LABEL.match(cn) or len(cn) > 63:
            fail(where, f"{owner}: container name {cn!r} is not a DNS-1123 label")
        ports = {}
        for p in c.get("ports") or []:
            pn = p.get("name")
            if pn is not None:
                if len(pn) > 15 or not IANA_SVC_NAME.match(pn) or "--" in pn or not re.search("[a-z]", pn):
                    fail(where, f"{owner}/{cn}: port name {pn!r} is not an IANA service name")
                ports[pn] = p.get("containerPort")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in ports:
                fail(where, f"{owner}/{cn}: {probe} uses port {port!r}, which the container does not name")
        for e in c.get("env") or []:
            if not ENV_NAME.match(e.get("name", "")):
                fail(where, f"{owner}/{cn}: env name {e.get('name')!r} is invalid")
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                fail(where, f"{owner}/{cn}: mounts volume {m.get('name')!r}, which the pod does not declare")
        for section in ("requests", "limits"):
            for rname, q in ((c.get("resources") or {}).get(section) or {}).items():
                if rname in ("cpu", "memory", "ephemeral-storage") or rname.startswith("hugepages-"):
                    continue
                for e in extended_resource_errors(rname):
                    fail(where, f"{owner}/{cn}: resource {rname!r} {e}")
                if not re.fullmatch(r"[0-9]+", str(q)):
                    fail(where, f"{owner}/{cn}: extended resource {rname} must be a whole number, not {q!r}")
        req = (c.get("resources") or {}).get("requests") or {}
        lim = (c.get("resources") or {}).get("limits") or {}
        for rname in set(req) & set(lim):
            if "/" in rname and str(req[rname]) != str(lim[rname]):
                fail(where, f"{owner}/{cn}: extended resource {rname} must have requests == limits")
    return volumes


def check_object(obj, where):
    checked["objects"] += 1
    check_name(obj, where)
    kind = obj.get("kind")
    owner = describe(obj)
    if kind == "Pod":
        check_pod_spec(obj.get("spec") or {}, where, owner)
    if kind in ("Deployment", "DaemonSet", "StatefulSet"):
        spec = obj.get("spec") or {}
        tmpl = spec.get("template") or {}
        tlabels = (tmpl.get("metadata") or {}).get("labels") or {}
        check_labels(tlabels, where, f"{owner} pod template label")
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        check_labels(sel, where, f"{owner} selector")
        if not sel:
            fail(where, f"{owner}: empty selector")
        for k, v in sel.items():
            if tlabels.get(k) != v:
                fail(where, f"{owner}: selector {k}={v} does not match the pod template's labels")
        check_pod_spec(tmpl.get("spec") or {}, where, owner)
    if kind == "Service":
        check_labels((obj.get("spec") or {}).get("selector"), where, f"{owner} selector")


# ---------------------------------------------------------------- references in one render
SYSTEM_CLUSTER_ROLES = {"system:auth-delegator"}
SYSTEM_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}


def check_references(objs, where, values):
    by_kind = {}
    for o in objs:
        md = o.get("metadata") or {}
        by_kind.setdefault(o["kind"], {})[(md.get("namespace"), md.get("name"))] = o
    def has(kind, ns, name):
        return (ns, name) in by_kind.get(kind, {})
    existing_secrets = {values.get("signingKey", {}).get("existingSecret"),
                        values.get("webhook", {}).get("existingTlsSecret"),
                        (values.get("nodeAgent", {}).get("allocationKeySecret") or {}).get("name"),
                        ((values.get("estimator") or {}).get("tls") or {}).get("secretName")} - {None, ""}
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                      "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PriorityClass",
                      "DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for o in objs:
        md = o.get("metadata") or {}
        ns = md.get("namespace")
        if o["kind"] in cluster_scoped:
            if ns:
                fail(where, f"{describe(o)} is cluster-scoped but has namespace {ns!r}")
        elif ns != NAMESPACE and not (o["kind"] == "RoleBinding" and ns == "kube-system") \
                and not (dashboard_cm(o, values) and ns == (values.get("grafanaDashboards") or {}).get("namespace")):
            fail(where, f"{describe(o)}: namespace {ns!r}, expected the release namespace {NAMESPACE!r}")
        if o["kind"] in ("Deployment", "DaemonSet"):
            pod = o["spec"]["template"]["spec"]
            sa = pod.get("serviceAccountName")
            if sa and not has("ServiceAccount", ns, sa):
                fail(where, f"{describe(o)}: ServiceAccount {sa!r} is not in the chart")
            for v in pod.get("volumes") or []:
                if "configMap" in v and not has("ConfigMap", ns, v["configMap"]["name"]):
                    fail(where, f"{describe(o)}: ConfigMap {v['configMap']['name']!r} is not in the chart")
                if "secret" in v:
                    name = v["secret"]["secretName"]
                    issued = any(c["spec"]["secretName"] == name and cns == ns
                                 for (cns, _), c in by_kind.get("Certificate", {}).items())
                    if not has("Secret", ns, name) and name not in existing_secrets and not issued:
                        fail(where, f"{describe(o)}: Secret {name!r} is neither in the chart nor named in values")
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = o["roleRef"]
            if ref["kind"] == "ClusterRole":
                if not has("ClusterRole", None, ref["name"]) and ref["name"] not in SYSTEM_CLUSTER_ROLES:
                    fail(where, f"{describe(o)}: ClusterRole {ref['name']!r} is neither in the chart nor built in")
            elif not has("Role", ns, ref["name"]) and (ns, ref["name"]) not in SYSTEM_ROLES:
                fail(where, f"{describe(o)}: Role {ref['name']!r} is neither in the chart nor built in")
            for s in o.get("subjects") or []:
                if s["kind"] == "ServiceAccount" and not has("ServiceAccount", s.get("namespace"), s["name"]):
                    fail(where, f"{describe(o)}: subject ServiceAccount {s['name']!r} is not in the chart")
        if o["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for w in o.get("webhooks") or []:
                svc_ref = (w.get("clientConfig") or {}).get("service") or {}
                svc = by_kind.get("Service", {}).get((svc_ref.get("namespace"), svc_ref.get("name")))
                if svc is None:
                    fail(where, f"{describe(o)}: webhook {w['name']} points at Service {svc_ref} that is not in the chart")
                    continue
                if svc_ref.get("port", 443) not in [p["port"] for p in svc["spec"]["ports"]]:
                    fail(where, f"{describe(o)}: webhook {w['name']}: Service {svc_ref['name']} has no port {svc_ref.get('port', 443)}")
                inject = ((o.get("metadata") or {}).get("annotations") or {}).get("cert-manager.io/inject-ca-from")
                if inject:
                    cns, _, cname = inject.partition("/")
                    if not has("Certificate", cns, cname):
                        fail(where, f"{describe(o)}: inject-ca-from names Certificate {inject!r}, which is not in the chart")
                    if (w.get("clientConfig") or {}).get("caBundle"):
                        fail(where, f"{describe(o)}: webhook {w['name']} has a caBundle and cert-manager injects one")
                elif not (w.get("clientConfig") or {}).get("caBundle"):
                    fail(where, f"{describe(o)}: webhook {w['name']} has no caBundle")
    for svc in by_kind.get("Service", {}).values():
        sel = svc["spec"].get("selector") or {}
        targets = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")
                   and all(o["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        if not targets:
            fail(where, f"{describe(svc)}: its selector matches no pod template in the chart")
        for p in svc["spec"]["ports"]:
            tp = p.get("targetPort")
            if isinstance(tp, str):
                for t in targets:
                    names = [cp.get("name") for c in t["spec"]["template"]["spec"]["containers"] for cp in c.get("ports") or []]
                    if tp not in names:
                        fail(where, f"{describe(svc)}: targetPort {tp!r} is no port of {describe(t)}")


# ---------------------------------------------------------------- KubeSchedulerConfiguration
def _obj(props, required=()):
    return {"type": "object", "additionalProperties": False, "properties": props, "required": list(required)}


_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
_PLUGIN = _obj({"name": {"type": "string"}, "weight": {"type": "integer"}}, ["name"])
_PLUGIN_SET = _obj({"enabled": {"type": "array", "items": _PLUGIN}, "disabled": {"type": "array", "items": _PLUGIN}})
# kubescheduler.config.k8s.io/v1 as kube-scheduler 1.28 decodes it (strictly: unknown or
# duplicate fields are errors), from k8s.io/kube-scheduler/config/v1/types.go and
# k8s.io/component-base/config/v1alpha1.
KUBE_SCHEDULER_CONFIG_V1_128 = _obj({
    "apiVersion": {"const": "kubescheduler.config.k8s.io/v1"},
    "kind": {"const": "KubeSchedulerConfiguration"},
    "parallelism": {"type": "integer", "minimum": 1},
    "leaderElection": _obj({
        "leaderElect": {"type": "boolean"},
        "leaseDuration": _DURATION, "renewDeadline": _DURATION, "retryPeriod": _DURATION,
        "resourceLock": {"enum": ["leases"]},
        "resourceName": {"type": "string"}, "resourceNamespace": {"type": "string"},
    }),
    "clientConnection": _obj({
        "kubeconfig": {"type": "string"}, "acceptContentTypes": {"type": "string"},
        "contentType": {"type": "string"}, "qps": {"type": "number"}, "burst": {"type": "integer"},
    }),
    "enableProfiling": {"type": "boolean"},
    "enableContentionProfiling": {"type": "boolean"},
    "percentageOfNodesToScore": {"type": "integer", "minimum": 0, "maximum": 100},
    "podInitialBackoffSeconds": {"type": "integer", "minimum": 1},
    "podMaxBackoffSeconds": {"type": "integer", "minimum": 1},
    "profiles": {"type": "array", "items": _obj({
        "schedulerName": {"type": "string", "minLength": 1},
        "percentageOfNodesToScore": {"type": "integer", "minimum": 0, "maximum": 100},
        "plugins": _obj({k: _PLUGIN_SET for k in (
            "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
            "reserve", "permit", "preBind", "bind", "postBind", "multiPoint")}),
        "pluginConfig": {"type": "array", "items": _obj({"name": {"type": "string"}, "args": {"type": "object"}}, ["name"])},
    })},
    "extenders": {"type": "array", "items": _obj({
        "urlPrefix": {"type": "string", "minLength": 1},
        "filterVerb": {"type": "string"}, "preemptVerb": {"type": "string"},
        "prioritizeVerb": {"type": "string"}, "bindVerb": {"type": "string"},
        "weight": {"type": "integer"},
        "enableHTTPS": {"type": "boolean"},
        "tlsConfig": _obj({k: {"type": "string"} for k in (
            "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData")} | {"insecure": {"type": "boolean"}}),
        "httpTimeout": _DURATION,
        "nodeCacheCapable": {"type": "boolean"},
        "managedResources": {"type": "array", "items": _obj(
            {"name": {"type": "string"}, "ignoredByScheduler": {"type": "boolean"}}, ["name"])},
        "ignorable": {"type": "boolean"},
    }, ["urlPrefix"])},
}, ["apiVersion", "kind"])


def check_scheduler_config(cfg, where):
    """Strict v1 decoding, then kube-scheduler's own validation of profiles and extenders."""
    checked["schema validations"] += 1
    for err in jsonschema.Draft202012Validator(KUBE_SCHEDULER_CONFIG_V1_128).iter_errors(cfg):
        fail(where, f"KubeSchedulerConfiguration: {'.'.join(map(str, err.path))}: {err.message}")
    names = [p.get("schedulerName", "default-scheduler") for p in cfg.get("profiles") or []]
    if len(set(names)) != len(names):
        fail(where, f"KubeSchedulerConfiguration: duplicate profile schedulerName in {names}")
    binders, managed = 0, set()
    for i, ext in enumerate(cfg.get("extenders") or []):
        if ext.get("prioritizeVerb") and ext.get("weight", 0) <= 0:
            fail(where, f"extenders[{i}].weight must be positive with a prioritizeVerb")
        binders += bool(ext.get("bindVerb"))
        for j, r in enumerate(ext.get("managedResources") or []):
            for e in extended_resource_errors(r["name"]):
                fail(where, f"extenders[{i}].managedResources[{j}].name {r['name']!r} {e}")
            if r["name"] in managed:
                fail(where, f"extenders[{i}].managedResources[{j}].name {r['name']!r} is a duplicate")
            managed.add(r["name"])
    if binders > 1:
        fail(where, "only one extender may have a bindVerb")


PROTOCOL_VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind", "preemptVerb": "preempt"}


def tessera_extender(cfg, where):
    exts = cfg.get("extenders") or []
    if len(exts) != 1:
        fail(where, f"expected one extender (Tessera), found {len(exts)}")
        return None
    ext = exts[0]
    for k, v in PROTOCOL_VERBS.items():
        if ext.get(k) != v:
            fail(where, f"extender {k} is {ext.get(k)!r}; Tessera serves /{v}")
    if ext.get("nodeCacheCapable") is not True:
        fail(where, "extender nodeCacheCapable must be true (Tessera keeps its own node and pod cache)")
    if ext.get("ignorable") is not False:
        fail(where, "extender ignorable must be false (Tessera binds: its errors must fail the attempt)")
    names = {r["name"]: r.get("ignoredByScheduler", False) for r in ext.get("managedResources") or []}
    for r in ("tessera.io/gpu", "tessera.io/gpu-memory", "tessera.io/gpu-memory-percent",
              "tessera.io/gpu-cores", "tessera.io/gpu-milli"):
        if names.get(r) is not True:
            fail(where, f"managedResources must list {r} with ignoredByScheduler: true")
    if names.get("nvidia.com/gpu") is not False:
        fail(where, "managedResources must list nvidia.com/gpu with ignoredByScheduler: false")
    return ext


# ---------------------------------------------------------------- CRD
def structural_errors(s, path, root=False):
    errs = []
    if not isinstance(s, dict):
        return [f"{path}: not a schema object"]
    if "type" not in s and not s.get("x-kubernetes-int-or-string") and not s.get("x-kubernetes-preserve-unknown-fields"):
        errs.append(f"{path}: no type (structural schemas need one at every level)")
    if "properties" in s and isinstance(s.get("additionalProperties"), (dict, bool)) and s.get("additionalProperties") is not False:
        errs.append(f"{path}: properties and additionalProperties are mutually exclusive")
    for bad in ("$ref", "definitions", "dependencies", "patternProperties", "id", "$schema"):
        if bad in s:
            errs.append(f"{path}: {bad} is not allowed in a CRD schema")
    if root and "metadata" in (s.get("properties") or {}):
        md = s["properties"]["metadata"]
        if set(md.get("properties") or {}) - {"name", "generateName"}:
            errs.append(f"{path}.properties.metadata: only name and generateName may be specified")
    for k, sub in (s.get("properties") or {}).items():
        errs += structural_errors(sub, f"{path}.properties.{k}")
    if "items" in s:
        errs += structural_errors(s["items"], f"{path}.items")
    if isinstance(s.get("additionalProperties"), dict):
        errs += structural_errors(s["additionalProperties"], f"{path}.additionalProperties")
    return errs


def to_json_schema(s):
    """The CRD's OpenAPI v3 schema as a JSON schema: nullable becomes a null type, and
    objects that do not preserve unknown fields reject unknown ones (the API server prunes
    them; an example that relies on pruning is wrong)."""
    if not isinstance(s, dict):
        return s
    out = {k: v for k, v in s.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "format", "default")}
    if s.get("nullable") and "type" in s:
        out["type"] = [s["type"], "null"]
    if "properties" in s:
        out["properties"] = {k: to_json_schema(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if "items" in s:
        out["items"] = to_json_schema(s["items"])
    if isinstance(s.get("additionalProperties"), dict):
        out["additionalProperties"] = to_json_schema(s["additionalProperties"])
    return out


def check_defaults(s, path, where):
    """Every default must be valid against its own schema (the API server checks this)."""
    if not isinstance(s, dict):
        return
    if "default" in s:
        for err in jsonschema.Draft202012Validator(to_json_schema(s)).iter_errors(s["default"]):
            fail(where, f"{path}: default {s['default']!r} is invalid: {err.message}")
    for k, sub in (s.get("properties") or {}).items():
        check_defaults(sub, f"{path}.properties.{k}", where)
    if "items" in s:
        check_defaults(s["items"], f"{path}.items", where)


def check_crds():
    crds = {}
    files = sorted((CHART / "crds").glob("*.yaml"))
    if not files:
        fail("crds", "no CRD under deploy/helm/tessera/crds")
    for f in files:
        where = str(f.relative_to(ROOT))
        for crd in load_docs(f.read_text(), where):
            schema_check(crd, where)
            check_object(crd, where)
            spec = crd["spec"]
            if crd["metadata"]["name"] != f"{spec['names']['plural']}.{spec['group']}":
                fail(where, "metadata.name must be <plural>.<group>")
            storage = [v["name"] for v in spec["versions"] if v.get("storage")]
            if len(storage) != 1:
                fail(where, f"exactly one version must be the storage version, found {storage}")
            for v in spec["versions"]:
                s = (v.get("schema") or {}).get("openAPIV3Schema")
                if s is None:
                    fail(where, f"version {v['name']}: no openAPIV3Schema")
                    continue
                for e in structural_errors(s, f"{v['name']}.openAPIV3Schema", root=True):
                    fail(where, e)
                check_defaults(s, f"{v['name']}.openAPIV3Schema", where)
                crds[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = (s, spec["scope"])
            print(f"ok   {where}: {describe(crd)}")
    return crds


def check_custom_object(obj, crds, where):
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in crds:
        fail(where, f"{describe(obj)}: no CRD in the chart serves {key[0]} {key[1]}")
        return
    schema, scope = crds[key]
    check_name(obj, where)
    checked["schema validations"] += 1
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    for err in jsonschema.Draft202012Validator(to_json_schema(schema)).iter_errors(body):
        fail(where, f"{describe(obj)}: {'.'.join(map(str, err.path))}: {err.message}")
    if scope == "Cluster" and (obj.get("metadata") or {}).get("namespace"):
        fail(where, f"{describe(obj)}: cluster-scoped, must not have a namespace")


# ---------------------------------------------------------------- chart
def render(values, where):
    try:
        with helm.Config(namespace=NAMESPACE) as cfg:
            rel = cfg.install(str(CHART), RELEASE, values, namespace=NAMESPACE, dry_run="client")
    except helm.HelmError as e:
        fail(where, f"does not render: {e}")
        return None
    return rel["manifest"]


def lint(values, where):
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v1.28.0")
    for m in report.get("messages") or []:
        if m.get("severity", 0) >= 2:
            fail(where, f"helm lint: {m.get('path')}: {m.get('error')}")
    for e in report.get("errors") or []:
        fail(where, f"helm lint: {e}")


GPU_OPERATOR = ROOT / "deploy/gpu-operator"
# The operator's per-node switches for the components Tessera replaces (GPU Operator
# docs: nvidia.com/gpu.deploy.<component>=false stops that operand on the node).
OPERATOR_OFF = {"nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery",
                "nvidia.com/gpu.deploy.mig-manager"}


def gpu_operator_values():
    f = GPU_OPERATOR / "values.yaml"
    docs = load_docs(f.read_text(), str(f.relative_to(ROOT))) if f.exists() else []
    if not docs:
        fail("gpu-operator", f"{f.relative_to(ROOT)}: missing or empty (item 3)")
        return {}
    return docs[0]


SCENARIOS = {
    "defaults": {},
    "webhook off": {"webhook": {"enabled": False}},
    "webhook without setSchedulerName": {"webhook": {"setSchedulerName": False}},
    "node agent off": {"nodeAgent": {"enabled": False}},
    "webhook and node agent off": {"webhook": {"enabled": False}, "nodeAgent": {"enabled": False}},
    "standalone": {"scheduler": {"mode": "standalone"}},
    "existing secrets": {"signingKey": {"existingSecret": "my-key"},
                         "webhook": {"existingTlsSecret": "my-tls", "caBundle": "Q0EK"},
                         "nodeAgent": {"allocationKeySecret": {"name": "agent-key", "key": "hmac"}}},
    "webhook scoping, served schedulerNames": {"scheduler": {"serveSchedulerNames": ["gpu-batch"]}},
    "existing-Secret signing key": {"signingKey": {"existingSecret": "tessera-keys", "generate": False}},
    "gitops: existing key, cert-manager": {"signingKey": {"existingSecret": "tessera-keys", "generate": False},
                                          "webhook": {"certManager": {"enabled": True}}},
    "cert-manager with your issuer": {"webhook": {"certManager": {"enabled": True, "issuerRef": {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "ServiceMonitor on": {"monitoring": {"serviceMonitor": True, "podMonitor": True, "prometheusRule": True,
                                         "labels": {"release": "kube-prometheus-stack"}}},
    "agent rolling update": {"nodeAgent": {"updateStrategy": "RollingUpdate"}},
    "GPU Operator coexistence": gpu_operator_values(),
    "GPU Operator coexistence, monitored": {**gpu_operator_values(),
                                            "monitoring": {**gpu_operator_values().get("monitoring", {}),
                                                           "podMonitor": True, "serviceMonitor": True}},
    "grafana dashboards": {"grafanaDashboards": {"enabled": True, "namespace": "monitoring",
                                                 "annotations": {"grafana_folder": "GPUs"}}},
    "DRA driver": {"nodeAgent": {"dra": {"enabled": True}}},
    "DRA driver, no slice policy": {"nodeAgent": {"dra": {"enabled": True, "slicePolicy": False}}},
    "DRA driver, shares with your own MPS daemons": {"nodeAgent": {"mpsDaemons": "external", "dra": {
        "enabled": True, "features": "consumable-capacity"}}},
    "a longer GpuNode TTL": {"scheduler": {"gpunodeTtl": 600}},
    "standalone scheduler allocating DRA claims": {"scheduler": {"mode": "standalone", "dra": True},
                                                   "nodeAgent": {"dra": {"enabled": True}}},
    "DRA driver, monitored": {"nodeAgent": {"dra": {"enabled": True}},
                              "monitoring": {"podMonitor": True, "serviceMonitor": True}},
    "DRA driver, another kubelet root": {"nodeAgent": {
        "nodeSelector": {"nvidia.com/gpu.present": "true"}, "xidIgnore": "94",
        "dra": {"enabled": True, "nodeLabel": "example.com/gpu-dra",
                "features": "consumable-capacity,partitionable-mig,device-taints",
                "registryDir": "/var/lib/k0s/kubelet/plugins_registry",
                "pluginDir": "/var/lib/k0s/kubelet/plugins/gpu.tessera.io", "cdiDir": "/etc/cdi",
                "deviceClasses": False, "updateStrategy": "OnDelete"}}},
    "DRA driver, nvidia.com/gpu through the class": {"nodeAgent": {"dra": {
        "enabled": True, "extendedResourceName": "nvidia.com/gpu"}}},
    "DRA driver, an extended resource of your own": {"nodeAgent": {"dra": {
        "enabled": True, "extendedResourceName": "example.com/gpu-whole",
        "deviceClassApiVersion": "resource.k8s.io/v1", "features": "consumable-capacity"}}},
    "Karmada estimator": {"estimator": {"enabled": True, "clusterName": "member-1"}},
    "Karmada estimator over TLS, client certificates, LoadBalancer": {"estimator": {
        "enabled": True, "clusterName": "gpu-east", "tls": {"secretName": "estimator-tls", "verifyClients": True},
        "service": {"type": "LoadBalancer"}, "replicas": 2, "priorityClassName": "system-cluster-critical",
        "extraArgs": ["--gpu-equivalents=H100-80GB=1,T4=0.1"]}},
    "Kueue admission check, trusted Kueue admission": {"kueue": {
        "trustAdmission": True, "admissionCheck": {"enabled": True, "extraArgs": ["--interval=30"]}}},
    "everything set": {"scheduler": {"leaderElection": False, "replicas": 1, "priorityClassName": "",
                                     "nodeSelector": {"kubernetes.io/os": "linux"},
                                     "tolerations": [{"key": "dedicated", "operator": "Exists"}]},
                       "nodeAgent": {"nodeLabels": False, "xidIgnore": "94", "xidFatal": "109",
                                     "mpsDaemons": "external", "mpsRoot": "/var/run/mps",
                                     "extraArgs": ["--pod-resources-socket=off"],
                                     "nodeSelector": {"nvidia.com/gpu.present": "true"},
                                     "resources": {"limits": {"memory": "512Mi"}}}},
}

MUST_FAIL = {  # values -> a phrase the chart's refusal must contain
    "existing TLS Secret without its CA": ({"webhook": {"existingTlsSecret": "my-tls"}}, "webhook.caBundle must"),
    "two replicas without leader election": ({"scheduler": {"leaderElection": False}}, "needs scheduler.replicas=1"),
    "no signing key to use": ({"signingKey": {"generate": False}}, "name your Secret in signingKey.existingSecret"),
    "cert-manager and an existing TLS Secret": ({"webhook": {"certManager": {"enabled": True}, "existingTlsSecret": "x",
                                                             "caBundle": "Q0EK"}}, "are exclusive"),
    "an unknown agent update strategy": ({"nodeAgent": {"updateStrategy": "Recreate"}}, "nodeAgent.updateStrategy must be OnDelete or RollingUpdate"),
    "an unknown anti-affinity": ({"scheduler": {"antiAffinity": "maybe"}}, "scheduler.antiAffinity must be hard or soft"),
    "an unknown MPS daemon mode": ({"nodeAgent": {"mpsDaemons": "sidecar"}}, "nodeAgent.mpsDaemons must be per-gpu or external"),
    "DRA claims in extender mode": ({"scheduler": {"dra": True}}, "scheduler.dra needs scheduler.mode=standalone"),
    "an unknown DRA agent update strategy": ({"nodeAgent": {"dra": {"enabled": True, "updateStrategy": "Recreate"}}},
                                             "nodeAgent.dra.updateStrategy must be OnDelete or RollingUpdate"),
    "a relative DRA socket directory": ({"nodeAgent": {"dra": {"enabled": True, "pluginDir": "plugins/gpu.tessera.io"}}},
                                        "nodeAgent.dra.pluginDir must be an absolute path"),
    "a DRA extended resource name without a domain": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "gpu"}}},
        'nodeAgent.dra.extendedResourceName "gpu" is not a valid extended resource name'),
    "a DRA extended resource name in kubernetes.io": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "gpu.kubernetes.io/gpu"}}},
        "is not a valid extended resource name"),
    "tessera.io/gpu as the DRA extended resource": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "tessera.io/gpu"}}},
        "tessera.io/* resources cannot be mapped to DRA"),
    "a MIG profile as the DRA extended resource": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "nvidia.com/mig-1g.10gb"}}},
        "names a MIG profile"),
    "a DRA extended resource on v1beta2 DeviceClasses (Kubernetes 1.33)": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "nvidia.com/gpu",
                               "deviceClassApiVersion": "resource.k8s.io/v1beta2"}}},
        "needs the DeviceClasses as resource.k8s.io/v1 (Kubernetes 1.34 or later, with the DRAExtendedResource feature gate"),
    "a DRA extended resource with Tessera allocating claims (two allocators, one device)": (
        {"scheduler": {"mode": "standalone", "dra": True},
         "nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "nvidia.com/gpu"}}},
        "with scheduler.dra: kube-scheduler would allocate Tessera's devices"),
    "a DRA extended resource without the chart's DeviceClasses": (
        {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": "nvidia.com/gpu", "deviceClasses": False}}},
        "needs the chart's DeviceClasses, but nodeAgent.dra.deviceClasses is false"),
    "the estimator without a cluster name": ({"estimator": {"enabled": True}}, "estimator.enabled needs estimator.clusterName"),
    "an estimator cluster name that is no Service name": (
        {"estimator": {"enabled": True, "clusterName": "Member_1"}}, "is not a DNS-1035 label"),
    "the estimator's health port on its gRPC port": (
        {"estimator": {"enabled": True, "clusterName": "m", "healthPort": 10352}},
        "estimator.port and estimator.healthPort must differ"),
    "estimator client verification without a Secret": (
        {"estimator": {"enabled": True, "clusterName": "m", "tls": {"verifyClients": True}}},
        "estimator.tls.verifyClients needs estimator.tls.secretName"),
}


def help_flags(sub):
    out = subprocess.run([TESSERA_BIN, sub, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail("flags", f"`tessera {sub} --help` exited {out.returncode}: {out.stderr.strip()[:200]}")
        return None
    return set(re.findall(r"--([a-z][a-z0-9-]*)", out.stdout))


def check_flags(objs, where, helps):
    for o in objs:
        if o["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            args = c.get("args") or []
            if not args or args[0] not in helps:
                continue
            known = helps[args[0]]
            if known is None:
                continue
            for a in args[1:]:
                m = re.match(r"--([a-z0-9-]+)", a)
                if not m or m.group(1) not in known:
                    fail(where, f"{describe(o)}/{c['name']}: `tessera {args[0]}` does not accept {a!r}")


def dashboard_cm(o, values):
    """A Grafana dashboard ConfigMap (grafanaDashboards.namespace may put it beside Grafana)."""
    label = (values.get("grafanaDashboards") or {}).get("label", "grafana_dashboard")
    return o["kind"] == "ConfigMap" and label in ((o.get("metadata") or {}).get("labels") or {})


def check_dashboard_configmaps(objs, where, values):
    """With grafanaDashboards.enabled, one ConfigMap per dashboard file, holding exactly
    its JSON under the sidecar's label; without it, none."""
    opts = values.get("grafanaDashboards") or {}
    label = opts.get("label", "grafana_dashboard")
    found = {}
    for o in objs:
        if not dashboard_cm(o, values):
            continue
        for key, text in (o.get("data") or {}).items():
            found[key] = (o, text)
    if not opts.get("enabled"):
        if found:
            fail(where, f"dashboards rendered although grafanaDashboards.enabled is off: {sorted(found)}")
        return
    files = sorted(DASHBOARDS.glob("*.json"))
    if sorted(found) != [f.name for f in files]:
        fail(where, f"dashboard ConfigMaps hold {sorted(found)}, the chart has {[f.name for f in files]}")
    for f in files:
        if f.name not in found:
            continue
        o, text = found[f.name]
        meta = o["metadata"]
        try:
            same = json.loads(text) == json.loads(f.read_text())
        except json.JSONDecodeError as e:
            fail(where, f"ConfigMap {meta['name']}: {f.name} is not JSON: {e}")
            continue
        if not same:
            fail(where, f"ConfigMap {meta['name']}: {f.name} differs from the chart's file")
        if meta["labels"][label] != opts.get("labelValue", "1"):
            fail(where, f"ConfigMap {meta['name']}: label {label}={meta['labels'][label]!r}")
        if meta.get("namespace") != (opts.get("namespace") or NAMESPACE):
            fail(where, f"ConfigMap {meta['name']}: namespace {meta.get('namespace')!r}")
        if (meta.get("annotations") or {}) != (opts.get("annotations") or {}):
            fail(where, f"ConfigMap {meta['name']}: annotations {meta.get('annotations')!r}")


# ---------------------------------------------------------------- webhook scoping
_cel = celpy.Environment()


def selector_matches(sel, labels):
    """A metav1.LabelSelector (nil or empty: everything)."""
    sel = sel or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def webhook_sends(w, ns_labels, request, obj, old, where):
    """Whether the API server sends this admission request to webhook `w`: a rule
    matches, the namespaceSelector and objectSelector match, and every matchCondition
    is true. A condition that errors counts as sent (the API server then applies the
    failurePolicy, which for Fail refuses the pod) and is reported."""
    resource = request["resource"]
    if not any(request["operation"] in r.get("operations", []) and resource in r.get("resources", [])
               for r in w.get("rules") or []):
        return False
    if not selector_matches(w.get("namespaceSelector"), ns_labels):
        return False
    obj_labels = (obj.get("metadata") or {}).get("labels") or {}
    old_labels = ((old or {}).get("metadata") or {}).get("labels") or {}
    if not (selector_matches(w.get("objectSelector"), obj_labels)
            or (old and selector_matches(w.get("objectSelector"), old_labels))):
        return False
    activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                  "request": celpy.json_to_cel(request)}
    for c in w.get("matchConditions") or []:
        try:
            prog = _cel.program(_cel.compile(c["expression"]))
            result = prog.evaluate(activation)
        except Exception as e:  # a CEL error: the API server applies failurePolicy
            fail(where, f"webhook {w['name']}: matchCondition {c['name']} errors ({e.__class__.__name__}: {e})")
            return True
        if not isinstance(result, celpy.celtypes.BoolType):
            fail(where, f"webhook {w['name']}: matchCondition {c['name']} is {result!r}, not a bool")
            return True
        if not result:
            return False
    return True


def vap_denies(policy, request, obj, old):
    """What a ValidatingAdmissionPolicy says about one request, as the API server
    evaluates it: None when a matchCondition leaves the request alone, else the list of
    failed validations' messages (empty: allowed). Variables are evaluated in order and
    seen by later ones as `variables.<name>`. An expression that errors counts as a
    failure (failurePolicy Fail)."""
    spec = policy["spec"]
    act = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
           "oldObject": celpy.json_to_cel(old)}

    def run(expr):
        return _cel.program(_cel.compile(expr)).evaluate(act)
    for c in spec.get("matchConditions") or []:
        if not run(c["expression"]):
            return None
    variables = {}
    for v in spec.get("variables") or []:
        variables[celpy.celtypes.StringType(v["name"])] = run(v["expression"])
        act["variables"] = celpy.celtypes.MapType(variables)
    denied = []
    for v in spec.get("validations") or []:
        try:
            ok = bool(run(v["expression"]))
        except Exception as e:
            denied.append(f"{v['expression']!r} errors ({e.__class__.__name__}: {e})")
            continue
        if not ok:
            denied.append(str(run(v["messageExpression"])) if v.get("messageExpression") else v.get("message", ""))
    return denied


def check_slice_policy(objs, where, dra, sa, ns):
    """Issue 29: with nodeAgent.dra.slicePolicy (the default) a ValidatingAdmissionPolicy,
    bound with Deny, lets the DRA driver's ServiceAccount create, update and delete only
    its own node's ResourceSlices (RBAC grants every slice). Evaluated on sample requests:
    the driver on node-a writing node-a's slice passes; node-b's slice, a slice of no
    node, a delete of node-b's slice and a token without a node are denied; other users
    are not matched."""
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    if dra.get("slicePolicy", True) is False:
        if policies or bindings:
            fail(where, f"DRA: nodeAgent.dra.slicePolicy is false, yet {[describe(o) for o in policies + bindings]} rendered")
        return
    if len(policies) != 1:
        fail(where, f"DRA: {len(policies)} ValidatingAdmissionPolicies rendered, expected one limiting the driver to its node's ResourceSlices")
        return
    vap = policies[0]
    name = vap["metadata"]["name"]
    bound = [b for b in bindings if b["spec"].get("policyName") == name]
    if len(bound) != 1 or "Deny" not in (bound[0]["spec"].get("validationActions") or []):
        fail(where, f"DRA: {describe(vap)} is not bound exactly once with validationActions [Deny]")
    rules = vap["spec"].get("matchConstraints", {}).get("resourceRules") or []
    for op in ("CREATE", "UPDATE", "DELETE"):
        if not any(op in r.get("operations", []) and "resourceslices" in r.get("resources", [])
                   and "resource.k8s.io" in r.get("apiGroups", []) for r in rules):
            fail(where, f"DRA: {describe(vap)} does not match {op} of resource.k8s.io resourceslices")
    driver = f"system:serviceaccount:{ns}:{sa}"

    def request(op, user=driver, node="node-a"):
        extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
        return {"operation": op, "userInfo": {"username": user, "extra": extra}}

    def slice_of(node):
        return {"spec": {"driver": "gpu.tessera.io", "nodeName": node}} if node else {"spec": {"driver": "gpu.tessera.io", "allNodes": True}}
    cases = [
        ("its own node's slice", request("CREATE"), slice_of("node-a"), None, False),
        ("an update of its own node's slice", request("UPDATE"), slice_of("node-a"), slice_of("node-a"), False),
        ("another node's slice", request("CREATE"), slice_of("node-b"), None, True),
        ("a slice of no node", request("UPDATE"), slice_of(None), slice_of(None), True),
        ("a delete of another node's slice", request("DELETE"), None, slice_of("node-b"), True),
        ("a token without a node", request("CREATE", node=None), slice_of("node-a"), None, True),
    ]
    for what, req, obj, old, want_denied in cases:
        try:
            denied = vap_denies(vap, req, obj, old)
        except Exception as e:
            fail(where, f"DRA: {describe(vap)} errors on {what} ({e.__class__.__name__}: {e})")
            continue
        if denied is None:
            fail(where, f"DRA: {describe(vap)} does not match the driver's ServiceAccount {driver} ({what})")
        elif bool(denied) != want_denied:
            fail(where, f"DRA: {describe(vap)}: {what} is {'denied: ' + '; '.join(denied) if denied else 'allowed'}, expected {'denied' if want_denied else 'allowed'}")
    if vap_denies(vap, request("CREATE", user="system:serviceaccount:kube-system:someone-else"), slice_of("node-b"), None) is not None:
        fail(where, f"DRA: {describe(vap)} matches users other than the driver's ServiceAccount")


def sample_pod(name, ns, resources=None, annotations=None, labels=None, scheduler="default-scheduler",
               init_resources=None):
    """A pod as the API server hands it to admission (defaulted: schedulerName set,
    resources present)."""
    md = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if annotations:
        md["annotations"] = annotations
    if labels:
        md["labels"] = labels
    spec = {"schedulerName": scheduler,
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"requests": dict(resources or {}), "limits": dict(resources or {})}
                            if resources else {}}]}
    if init_resources:
        spec["initContainers"] = [{"name": "init", "image": "busybox",
                                   "resources": {"limits": dict(init_resources)}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}


def scoping_cases(values):
    """(case, namespace labels, operation, resource, object, oldObject, object as the
    validating webhook sees it (after mutation) or None, sent to validate, sent to a
    mutating webhook)."""
    def ns(name, **labels):
        return {"kubernetes.io/metadata.name": name, **labels}
    default, optin = ns("default"), ns("ml", **{"tessera.io/schedule": "true"})
    own, optout = ns(NAMESPACE), ns("lab", **{"tessera.io/webhook": "disabled"})
    sched = (values.get("scheduler") or {}).get("schedulerName", "tessera")
    gpu = {"nvidia.com/gpu": "1"}
    share = {"tessera.io/gpu-milli": "400"}
    alloc = {"tessera.io/allocation": '{"version":1}'}
    stock = sample_pod("stock", "default", gpu)
    cases = [
        # The two that must survive a dead webhook (item 2's "scaled to 0" test).
        ("plain pod", default, "CREATE", "pods", sample_pod("plain", "default"), None, None, False, False),
        ("stock nvidia.com/gpu pod", default, "CREATE", "pods", stock, None, None, False, False),
        ("stock pod relabelled (UPDATE)", default, "UPDATE", "pods",
         sample_pod("stock", "default", gpu, labels={"app": "x"}), stock, None, False, False),
        ("plain pod in an opted-in namespace", optin, "CREATE", "pods", sample_pod("cpu", "ml"), None, None, False, False),
        # Tessera's pods.
        ("tessera.io pod", default, "CREATE", "pods", sample_pod("share", "default", share), None,
         sample_pod("share", "default", share, scheduler=sched), True, True),
        ("tessera.io init container", default, "CREATE", "pods", sample_pod("init", "default", init_resources=share),
         None, None, True, True),
        (f"pod naming schedulerName {sched}", default, "CREATE", "pods",
         sample_pod("named", "default", gpu, scheduler=sched), None, None, True, False),
        ("stock pod labelled tessera.io/schedule", default, "CREATE", "pods",
         sample_pod("opt", "default", gpu, labels={"tessera.io/schedule": "true"}), None, None, True, True),
        ("stock pod with tessera.io/isolation", default, "CREATE", "pods",
         sample_pod("iso", "default", gpu, annotations={"tessera.io/isolation": "mps"}), None, None, True, True),
        ("stock pod in an opted-in namespace", optin, "CREATE", "pods", sample_pod("stock", "ml", gpu), None,
         sample_pod("stock", "ml", gpu, scheduler=sched), True, True),
        ("ephemeral container on a Tessera pod", default, "UPDATE", "pods/ephemeralcontainers",
         sample_pod("named", "default", gpu, scheduler=sched), sample_pod("named", "default", gpu, scheduler=sched),
         None, True, False),
        # The allocation annotation is guarded on every pod.
        ("plain pod setting tessera.io/allocation", default, "CREATE", "pods",
         sample_pod("forge", "default", annotations=alloc), None, None, True, True),
        ("pod removing tessera.io/allocation (UPDATE)", default, "UPDATE", "pods",
         sample_pod("stock", "default", gpu), sample_pod("stock", "default", gpu, annotations=alloc), None, True, False),
        ("pod adding tessera.io/allocation (UPDATE)", default, "UPDATE", "pods",
         sample_pod("stock", "default", gpu, annotations=alloc), stock, None, True, False),
        ("pod with a cdi.k8s.io annotation", default, "CREATE", "pods",
         sample_pod("cdi", "default", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), None, None, True, False),
        # Never sent: the scheduler's own namespace (its pods must start while the
        # webhook is down) and namespaces that opted out.
        ("tessera.io pod in the release namespace", own, "CREATE", "pods",
         sample_pod("share", NAMESPACE, share), None, None, False, False),
        ("tessera.io pod in an opted-out namespace", optout, "CREATE", "pods",
         sample_pod("share", "lab", share), None, None, False, False),
    ]
    # With scheduler.dra the mutating webhook reads a pod's claims (Tessera's classes
    # make it Tessera's: two allocators must not share devices); otherwise it is not sent.
    claims = sample_pod("claims", "default")
    claims["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "one-gpu"}]
    dra = bool((values.get("scheduler") or {}).get("dra"))
    cases.append(("pod with ResourceClaims", default, "CREATE", "pods", claims, None, None, False, dra))
    for extra in (values.get("scheduler") or {}).get("serveSchedulerNames") or []:
        cases.append((f"pod naming served schedulerName {extra}", default, "CREATE", "pods",
                      sample_pod("served", "default", gpu, scheduler=extra), None, None, True, False))
    return cases


def check_webhook_scoping(objs, where, values):
    hooks = {"validate": [], "mutate": []}
    for o in objs:
        if o["kind"] == "ValidatingWebhookConfiguration":
            hooks["validate"] += o.get("webhooks") or []
        elif o["kind"] == "MutatingWebhookConfiguration":
            hooks["mutate"] += o.get("webhooks") or []
    if not hooks["validate"] and not hooks["mutate"]:
        return
    set_name = (values.get("webhook") or {}).get("setSchedulerName", True)
    n = 0
    for case, ns_labels, op, resource, obj, old, validated, want_v, want_m in scoping_cases(values):
        request = {"operation": op, "resource": resource,
                   "namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"]}
        sent_m = [w["name"] for w in hooks["mutate"] if webhook_sends(w, ns_labels, request, obj, old, where)]
        sent_v = [w["name"] for w in hooks["validate"]
                  if webhook_sends(w, ns_labels, request, validated or obj, old, where)]
        want_m = want_m and set_name
        if bool(sent_v) != want_v:
            fail(where, f"webhook scoping: {case}: validating webhook {'sent' if sent_v else 'not sent'} it, "
                        f"must {'' if want_v else 'not '}be")
        if bool(sent_m) != want_m:
            fail(where, f"webhook scoping: {case}: mutating webhook {sent_m or 'none'} sent it, "
                        f"must {'' if want_m else 'not '}be")
        n += 1
    print(f"ok   {where}: webhook scoping, {n} sample admission requests")


def check_scheduler_availability(objs, where, values):
    """More than one scheduler replica: a PodDisruptionBudget that selects them (a drain
    never evicts all), and required anti-affinity by hostname unless antiAffinity=soft."""
    sv = values.get("scheduler") or {}
    deps = [o for o in objs if o["kind"] == "Deployment"
            and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"]
    if len(deps) != 1:
        fail(where, f"expected one scheduler Deployment, found {len(deps)}")
        return
    dep = deps[0]
    tlabels = dep["spec"]["template"]["metadata"]["labels"]
    if dep["spec"]["replicas"] < 2:
        return
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"
            and selector_matches(o["spec"].get("selector"), tlabels)]
    if sv.get("podDisruptionBudget", True) and len(pdbs) != 1:
        fail(where, f"{dep['spec']['replicas']} scheduler replicas: expected one PodDisruptionBudget selecting them, found {len(pdbs)}")
    for pdb in pdbs:
        if pdb["spec"].get("maxUnavailable") != 1:
            fail(where, f"{describe(pdb)}: maxUnavailable must be 1")
    anti = ((dep["spec"]["template"]["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
    required = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    hard = [t for t in required if t.get("topologyKey") == "kubernetes.io/hostname"
            and selector_matches(t.get("labelSelector"), tlabels)]
    if sv.get("antiAffinity", "hard") == "hard" and not sv.get("affinity") and not hard:
        fail(where, "scheduler replicas: no required pod anti-affinity by kubernetes.io/hostname")


def check_signing_keys(objs, where, values):
    """Item 7: the scheduler and every node agent verify with the whole signing Secret
    (--verify-key-dir names a directory where the Secret is mounted without an `items`
    filter, so its verify-* keys are there), and the scheduler signs with its `key`."""
    sk = values.get("signingKey") or {}
    want_secret = sk.get("existingSecret") or f"{RELEASE}-allocation-key"
    agent_secret = ((values.get("nodeAgent") or {}).get("allocationKeySecret") or {}).get("name") or want_secret
    for o in objs:
        if o["kind"] not in ("Deployment", "DaemonSet"):
            continue
        pod = o["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes") or []}
        for c in pod["containers"]:
            args = c.get("args") or []
            if not args or args[0] not in ("scheduler", "node-agent"):
                continue
            if "--dra" in args:
                continue  # the DRA driver verifies no grant: the kubelet names the claim
            dirs = [a.split("=", 1)[1] for a in args if a.startswith("--verify-key-dir=")]
            if len(dirs) != 1:
                fail(where, f"{describe(o)}/{c['name']}: expected one --verify-key-dir, found {dirs}")
                continue
            mounts = [m for m in c.get("volumeMounts") or [] if m["mountPath"].rstrip("/") == dirs[0].rstrip("/")]
            secret = (vols.get(mounts[0]["name"], {}) if mounts else {}).get("secret")
            expected = want_secret if args[0] == "scheduler" else agent_secret
            if not secret or secret.get("secretName") != expected:
                fail(where, f"{describe(o)}/{c['name']}: --verify-key-dir {dirs[0]} is not the Secret {expected!r} mounted")
            elif secret.get("items"):
                fail(where, f"{describe(o)}/{c['name']}: the key Secret is mounted with items {secret['items']}: its verify-* keys are left out")
            if args[0] == "scheduler" and f"--signing-key-file={dirs[0].rstrip('/')}/key" not in args:
                fail(where, f"{describe(o)}/{c['name']}: does not sign with {dirs[0]}/key")
    generated = [o for o in objs if o["kind"] == "Secret"]
    if sk.get("existingSecret") and any(o["metadata"]["name"] == want_secret for o in generated):
        fail(where, f"signingKey.existingSecret is set, but the chart renders Secret {want_secret!r} (it would overwrite yours)")


def check_gitops_render(values, where, first):
    """With an existing signing key and cert-manager, `helm template` (Argo CD, Flux)
    must render the same bytes every time and generate no Secret: a new key on every
    sync would stop every running grant from verifying."""
    cm = ((values.get("webhook") or {}).get("certManager") or {}).get("enabled")
    if not ((values.get("signingKey") or {}).get("existingSecret") and cm):
        return
    second = render(values, where)
    if second != first:
        fail(where, "two renders differ: a GitOps tool would change the release on every sync")
    for o in load_docs(first, where):
        if o["kind"] == "Secret":
            fail(where, f"{describe(o)} is generated at render time")
    print(f"ok   {where}: renders byte-identical twice, no generated Secret")


def promql_metrics(expr):
    """The metric names a PromQL expression reads (labels, strings, grouping and
    functions left out)."""
    stripped = re.sub(r'"[^"]*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", "{}", stripped)
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)
    return {i for i in re.findall(r"\b[A-Za-z_][A-Za-z0-9_:]*\b", stripped)
            if i not in PROMQL_WORDS and not i.isdigit()}


def check_monitoring(objs, where, values):
    """Item 10: with monitoring on, the ServiceMonitor selects the scheduler's Service
    and names one of its ports, the PodMonitor selects the node agents' pods and names
    their metrics port, and every alert reads only metrics a Tessera component exports
    (or the scrape's own `up`); with it off (the default), none of them is rendered."""
    m = values.get("monitoring") or {}
    kinds = {"ServiceMonitor": m.get("serviceMonitor"), "PodMonitor": m.get("podMonitor"),
             "PrometheusRule": m.get("prometheusRule")}
    agent_on = (values.get("nodeAgent") or {}).get("enabled", True)
    for kind, on in kinds.items():
        found = [o for o in objs if o["kind"] == kind]
        want = bool(on) and (kind != "PodMonitor" or agent_on)
        if bool(found) != want:
            fail(where, f"{kind}: {len(found)} rendered, monitoring says {'on' if want else 'off'}")
    for sm in (o for o in objs if o["kind"] == "ServiceMonitor"):
        svcs = [o for o in objs if o["kind"] == "Service"
                and selector_matches(sm["spec"]["selector"], o["metadata"].get("labels") or {})]
        if not svcs:
            fail(where, f"{describe(sm)}: selects no Service of the chart")
        for ep in sm["spec"]["endpoints"]:
            for svc in svcs:
                if ep["port"] not in [p.get("name") for p in svc["spec"]["ports"]]:
                    fail(where, f"{describe(sm)}: Service {svc['metadata']['name']} has no port {ep['port']!r}")
    for pm in (o for o in objs if o["kind"] == "PodMonitor"):
        pods = [o for o in objs if o["kind"] in ("Deployment", "DaemonSet")
                and selector_matches(pm["spec"]["selector"], o["spec"]["template"]["metadata"]["labels"])]
        agents = [o for o in objs if o["kind"] == "DaemonSet"]
        if not pods or [p["kind"] for p in pods] != ["DaemonSet"] * len(pods) or len(pods) != len(agents):
            fail(where, f"{describe(pm)}: selects {[describe(p) for p in pods]}, "
                        f"expected every node agent DaemonSet (device plugin and DRA) and nothing else")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            for p in pods:
                names = [cp.get("name") for c in p["spec"]["template"]["spec"]["containers"] for cp in c.get("ports") or []]
                if ep["port"] not in names:
                    fail(where, f"{describe(pm)}: {describe(p)} has no port {ep['port']!r}")
    exported = exported_metrics() | {"up"}
    for pr in (o for o in objs if o["kind"] == "PrometheusRule"):
        alerts = set()
        for g in pr["spec"]["groups"]:
            for r in g["rules"]:
                alerts.add(r.get("alert"))
                for name in promql_metrics(r["expr"]) - exported:
                    fail(where, f"{describe(pr)}: {r.get('alert')}: reads {name!r}, which no Tessera component exports")
        for need in ("TesseraNoLeader", "TesseraBindsFailing", "TesseraSchedulerProblems", "TesseraAgentWithoutGpus", "TesseraGpuUnhealthy"):
            if need not in alerts:
                fail(where, f"{describe(pr)}: no alert {need}")


# What each component's code asks the API server for (group, resource) -> verbs: the
# node agent (crates/tessera-node: pods.rs watches its node's pods, inventory.rs applies
# the GpuNode and its status and merge-patches the Node's labels) and the scheduler
# (crates/tessera-k8s: the mirror's watches, the binder, preemption, events). A verb the
# code needs and the ClusterRole lacks is refused on a real cluster (403), which no
# schema catches.
RBAC_NEEDS = {
    "node-agent": {
        ("", "pods"): {"list", "watch"},
        # patch: GFD-style labels; list, watch: its own Node's tessera.io/mig-dynamic
        # label (tessera_node::nodesettings), one watch by field selector.
        ("", "nodes"): {"patch", "list", "watch"},
        ("tessera.io", "gpunodes"): {"create", "patch"},
        ("tessera.io", "gpunodes/status"): {"patch"},
        # Whether the DRA driver serves the node (tessera_node::run::yield_to_dra), and
        # the Warning event that says so.
        ("resource.k8s.io", "resourceslices"): {"list"},
        ("", "events"): {"create"},
    },
    "scheduler": {
        ("", "nodes"): {"list", "watch"},
        ("", "pods"): {"get", "list", "watch"},
        ("", "pods/binding"): {"create"},
        ("", "pods/eviction"): {"create"},
        ("", "namespaces"): {"list", "watch"},
        ("tessera.io", "gpunodes"): {"list", "watch"},
        ("tessera.io", "gpuqueues"): {"list", "watch"},
        ("tessera.io", "gpuqueues/status"): {"patch"},
        ("policy", "poddisruptionbudgets"): {"list", "watch"},
        ("scheduling.x-k8s.io", "podgroups"): {"list", "watch"},
        ("events.k8s.io", "events"): {"create", "patch"},
    },
    # tessera kueue-admission (crates/tessera-k8s/src/kueue/controller.rs: the placement
    # watches, Kueue's two kinds, merge patches of their status and a re-read on 409).
    "kueue-admission": {
        ("", "nodes"): {"list", "watch"},
        ("", "pods"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        ("tessera.io", "gpunodes"): {"list", "watch"},
        ("tessera.io", "gpuqueues"): {"list", "watch"},
        ("kueue.x-k8s.io", "workloads"): {"list", "watch"},
        ("kueue.x-k8s.io", "admissionchecks"): {"list", "watch"},
        ("kueue.x-k8s.io", "workloads/status"): {"get", "patch"},
        ("kueue.x-k8s.io", "admissionchecks/status"): {"get", "patch"},
    },
    # tessera estimator (crates/tessera-k8s/src/run: watch_placement_state; and
    # estimator/unschedulable.rs: a Deployment and its ReplicaSets).
    "estimator": {
        ("", "nodes"): {"list", "watch"},
        ("", "pods"): {"list", "watch"},
        ("", "namespaces"): {"list", "watch"},
        ("tessera.io", "gpunodes"): {"list", "watch"},
        ("tessera.io", "gpuqueues"): {"list", "watch"},
        ("apps", "deployments"): {"get"},
        ("apps", "replicasets"): {"list"},
    },
}
READ_VERBS = {"get", "list", "watch"}


# The scheduler with --dra (crates/tessera-k8s/src/dra: watch.rs lists and watches the
# three kinds, write.rs merge-patches a claim's status; 1.36 checks the same write
# against resourceclaims/binding).
RBAC_NEEDS_SCHEDULER_DRA = {
    ("resource.k8s.io", "resourceclaims"): {"list", "watch"},
    ("resource.k8s.io", "resourceslices"): {"list", "watch"},
    ("resource.k8s.io", "deviceclasses"): {"list", "watch"},
    ("resource.k8s.io", "resourceclaims/status"): {"patch"},
    ("resource.k8s.io", "resourceclaims/binding"): {"patch"},
}


# Extender mode (crates/tessera-k8s/src/preemptor.rs): a pod kube-scheduler holds as
# unschedulable that fits now gets the tessera.io/fits-at annotation (a merge patch).
RBAC_NEEDS_SCHEDULER_EXTENDER = {
    ("", "pods"): {"get", "list", "watch", "patch"},
}


def granted_verbs(roles):
    """(apiGroup, resource) -> the verbs the rules of these ClusterRoles grant."""
    granted = {}
    for r in roles:
        for rule in r.get("rules") or []:
            for g in rule.get("apiGroups") or []:
                for res in rule.get("resources") or []:
                    granted.setdefault((g, res), set()).update(rule.get("verbs") or [])
    return granted


def check_rbac(objs, where):
    """Every verb the code needs is granted by the component's ClusterRole."""
    workloads = {"node-agent": "DaemonSet", "scheduler": "Deployment", "estimator": "Deployment",
                 "kueue-admission": "Deployment"}
    for component, needs in RBAC_NEEDS.items():
        if not any(o["kind"] == workloads[component]
                   and (o["metadata"]["name"].endswith(f"-{component}")
                        or (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component)
                   for o in objs):
            continue  # not installed in this scenario
        roles = [o for o in objs if o["kind"] == "ClusterRole"
                 and (o["metadata"]["name"].endswith(f"-{component}")
                      or (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == component)]
        if not roles:
            fail(where, f"no ClusterRole for the {component}")
            continue
        granted = granted_verbs(roles)
        if component == "scheduler" and any(
                "--dra" in (c.get("args") or []) for o in objs if o["kind"] == "Deployment"
                for c in o["spec"]["template"]["spec"]["containers"]):
            needs = {**needs, **RBAC_NEEDS_SCHEDULER_DRA}
        if component == "scheduler" and any(
                "--mode=extender" in (c.get("args") or []) for o in objs if o["kind"] == "Deployment"
                for c in o["spec"]["template"]["spec"]["containers"]):
            needs = {**needs, **RBAC_NEEDS_SCHEDULER_EXTENDER}
        if component == "estimator":
            # It only reads: any other verb (or a wildcard) is a failure.
            for (g, res), verbs in granted.items():
                if verbs - READ_VERBS:
                    fail(where, f"estimator ClusterRole grants {sorted(verbs - READ_VERBS)} on {res} ({g or 'core'}): it must only read")
        for (g, res), verbs in needs.items():
            have = granted.get((g, res), set())
            missing = set() if "*" in have else verbs - have
            if missing:
                fail(where, f"{component} ClusterRole: {res} ({g or 'core'}) lacks {sorted(missing)}, which the code uses")


def check_estimator(objs, where, values):
    """estimator.enabled: a Deployment runs `tessera estimator` for the cluster named in
    values, behind a Service named as karmada-scheduler dials it
    (karmada-scheduler-estimator-<cluster>) on the container's --listen port, with the
    TLS Secret mounted where --tls-cert/--tls-key point; nothing of it otherwise."""
    est = values.get("estimator") or {}
    deps = [o for o in objs if o["kind"] == "Deployment"
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "estimator"]
    if not est.get("enabled"):
        if deps:
            fail(where, "estimator.enabled is false, but an estimator Deployment renders")
        return
    if len(deps) != 1:
        fail(where, f"estimator.enabled renders {len(deps)} estimator Deployments")
        return
    dep = deps[0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    args = c.get("args") or []
    if args[:1] != ["estimator"]:
        fail(where, f"{describe(dep)}: runs {args[:1]}, not `tessera estimator`")
    flag = lambda n: next((a.split("=", 1)[1] for a in args if a.startswith(f"--{n}=")), None)
    cluster = est["clusterName"]
    if flag("cluster-name") != cluster:
        fail(where, f"{describe(dep)}: --cluster-name={flag('cluster-name')!r}, values say {cluster!r}")
    port = (est.get("port") or 10352)
    listen = flag("listen") or ""
    if not listen.endswith(f":{port}"):
        fail(where, f"{describe(dep)}: --listen={listen!r} is not on port {port}")
    want = f"karmada-scheduler-estimator-{cluster}"
    svcs = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == want]
    if len(svcs) != 1:
        fail(where, f"no Service {want!r} (the name karmada-scheduler dials)")
    else:
        svc = svcs[0]
        labels = dep["spec"]["template"]["metadata"].get("labels") or {}
        if not selector_matches({"matchLabels": svc["spec"].get("selector") or {}}, labels):
            fail(where, f"{describe(svc)} does not select the estimator's pods")
        ports = svc["spec"].get("ports") or []
        cports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
        if not any(p["port"] == port and cports.get(p.get("targetPort"), p.get("targetPort")) == port for p in ports):
            fail(where, f"{describe(svc)}: no port {port} onto the container's {port}")
    tls = (est.get("tls") or {})
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    def mounted_secret(path):
        d = path.rsplit("/", 1)[0]
        v = vols.get(mounts.get(d))
        return (v or {}).get("secret", {}).get("secretName")
    if tls.get("secretName"):
        for f in ("tls-cert", "tls-key") + (("tls-client-ca",) if tls.get("verifyClients") else ()):
            path = flag(f)
            if not path:
                fail(where, f"{describe(dep)}: estimator.tls.secretName is set, but no --{f}")
            elif mounted_secret(path) != tls["secretName"]:
                fail(where, f"{describe(dep)}: --{f}={path} is not in the Secret {tls['secretName']!r}")
    elif any(flag(f) for f in ("tls-cert", "tls-key", "tls-client-ca")):
        fail(where, f"{describe(dep)}: TLS flags without estimator.tls.secretName")
    for f in ("signing-key-file",):
        path = flag(f)
        if not path or not mounted_secret(path):
            fail(where, f"{describe(dep)}: --{f}={path!r} is not in a mounted Secret")


def check_kueue_admission(objs, where, values):
    """kueue.admissionCheck.enabled: one Deployment of one replica runs `tessera
    kueue-admission` with the signing key mounted; kueue.trustAdmission: the scheduler
    gets --trust-kueue-admission; nothing of either otherwise."""
    kq = values.get("kueue") or {}
    deps = [o for o in objs if o["kind"] == "Deployment"
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "kueue-admission"]
    if not (kq.get("admissionCheck") or {}).get("enabled"):
        if deps:
            fail(where, "kueue.admissionCheck.enabled is false, but its Deployment renders")
    elif len(deps) != 1:
        fail(where, f"kueue.admissionCheck.enabled renders {len(deps)} Deployments")
    else:
        dep = deps[0]
        if dep["spec"].get("replicas") != 1:
            fail(where, f"{describe(dep)}: {dep['spec'].get('replicas')} replicas; two would judge the same room twice")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        args = c.get("args") or []
        if args[:1] != ["kueue-admission"]:
            fail(where, f"{describe(dep)}: runs {args[:1]}, not `tessera kueue-admission`")
        mounts = {m["mountPath"] for m in c.get("volumeMounts") or []}
        key = next((a.split("=", 1)[1] for a in args if a.startswith("--signing-key-file=")), "")
        if key.rsplit("/", 1)[0] not in mounts:
            fail(where, f"{describe(dep)}: --signing-key-file={key!r} is not in a mounted volume")
    trusted = any("--trust-kueue-admission" in (c.get("args") or [])
                  for o in objs if o["kind"] == "Deployment"
                  for c in o["spec"]["template"]["spec"]["containers"])
    if trusted != bool(kq.get("trustAdmission")):
        fail(where, f"kueue.trustAdmission is {bool(kq.get('trustAdmission'))}, the scheduler's "
                    f"--trust-kueue-admission {'is' if trusted else 'is not'} set")


def check_agent_update_strategy(objs, where, values):
    """Item 10: per-gpu MPS daemons end with the agent's container, so a rolling update
    would cut every MPS pod off its daemon: the default must then be OnDelete."""
    na = values.get("nodeAgent") or {}
    for o in objs:
        if o["kind"] != "DaemonSet":
            continue
        got = o["spec"].get("updateStrategy", {}).get("type", "RollingUpdate")
        want = na.get("updateStrategy") or ("OnDelete" if na.get("mpsDaemons", "per-gpu") == "per-gpu" else "RollingUpdate")
        if any("--dra" in (c.get("args") or []) for c in o["spec"]["template"]["spec"]["containers"]):
            # The DRA driver runs MPS daemons only for shares (consumable-capacity).
            dra = na.get("dra") or {}
            shares = "consumable-capacity" in (dra.get("features") or "").replace(" ", "").split(",")
            per_gpu = shares and na.get("mpsDaemons", "per-gpu") == "per-gpu"
            want = dra.get("updateStrategy") or ("OnDelete" if per_gpu else "RollingUpdate")
            args = [a for c in o["spec"]["template"]["spec"]["containers"] for a in c.get("args") or []]
            mounts = {m["mountPath"] for c in o["spec"]["template"]["spec"]["containers"]
                      for m in c.get("volumeMounts") or []}
            root = na.get("mpsRoot", "/run/tessera/mps")
            if per_gpu and (f"--mps-daemons=per-gpu" not in args or root not in mounts or "/dev/shm" not in mounts):
                fail(where, f"{describe(o)}: shares need the driver's MPS daemons: --mps-daemons=per-gpu and "
                            f"{root} and /dev/shm mounted (args {args}, mounts {sorted(mounts)})")
            if shares and not per_gpu and "--mps-daemons=external" not in args:
                fail(where, f"{describe(o)}: nodeAgent.mpsDaemons external, yet the driver is not told so")
        if got != want:
            fail(where, f"{describe(o)}: updateStrategy {got}, expected {want} (mpsDaemons {na.get('mpsDaemons', 'per-gpu')})")
        for c in o["spec"]["template"]["spec"]["containers"]:
            if (c.get("securityContext") or {}).get("runAsUser") != 0:
                fail(where, f"{describe(o)}/{c['name']}: must run as root (runAsUser: 0): the image's user cannot write the kubelet's device-plugin directory")


def check_gpu_operator(objs, where, values):
    """Item 3: the coexistence values, the node labels migrate-node.sh sets and the
    ClusterPolicy patch agree. The agent runs only on nodes whose operator device
    plugin is off (never two plugins for one GPU); every component Tessera replaces
    there (device plugin, GFD, MIG manager) is switched off by a label the script
    sets and rolls back; the toolkit's unprivileged-envvar switch is off through the
    ClusterPolicy, with the operator's own plugin moved to volume mounts so that its
    nodes keep their GPUs."""
    script = (GPU_OPERATOR / "migrate-node.sh")
    if not script.exists():
        fail(where, "deploy/gpu-operator/migrate-node.sh is missing")
        return
    m = re.search(r"^LABELS=\(\n(.*?)\n\)", script.read_text(), re.S | re.M)
    labels = dict(l.strip().split("=", 1) for l in m.group(1).splitlines() if l.strip()) if m else {}
    if set(labels) != OPERATOR_OFF or set(labels.values()) != {"false"}:
        fail(where, f"migrate-node.sh LABELS {labels} must set exactly {sorted(OPERATOR_OFF)} to false")
    text = script.read_text()
    # The MIG strategy GFD labelled the node with outlives GFD (issue 27 item 8).
    for step in ("kubectl cordon", "/eviction", "kubectl uncordon", "--rollback", '"${LABELS[@]/%=*/-}"',
                 "tessera.io/mig-strategy=$strategy"):
        if step not in text:
            fail(where, f"migrate-node.sh: no {step!r} step")
    agents = [o for o in objs if o["kind"] == "DaemonSet"]
    if len(agents) != 1:
        fail(where, "expected the node agent DaemonSet")
        return
    spec = agents[0]["spec"]["template"]["spec"]
    sel = spec.get("nodeSelector") or {}
    if sel.get("nvidia.com/gpu.deploy.device-plugin") != "false":
        fail(where, f"node agent nodeSelector {sel}: must require nvidia.com/gpu.deploy.device-plugin=false "
                    "(the agent beside the operator's device plugin would hand out the same GPUs)")
    if any(labels.get(k) != v for k, v in sel.items()):
        fail(where, f"node agent nodeSelector {sel} is not what migrate-node.sh labels ({labels}): the agent would never start")
    args = spec["containers"][0].get("args") or []
    if "--no-nvidia-gpu-resource" in args:
        fail(where, "the operator's device plugin is off on Tessera nodes: the agent must serve nvidia.com/gpu")
    if "--no-node-labels" in args:
        fail(where, "GPU feature discovery is off on Tessera nodes: the agent must write the nvidia.com/gpu.* labels")
    strategy = next((a.split("=", 1)[1] for a in args if a.startswith("--device-list-strategy=")), "")
    patch_file = GPU_OPERATOR / "clusterpolicy-patch.yaml"
    patch = (load_docs(patch_file.read_text(), str(patch_file)) or [{}])[0] if patch_file.exists() else {}
    if not patch:
        fail(where, "deploy/gpu-operator/clusterpolicy-patch.yaml is missing")
        return

    def env(component):
        return {e["name"]: str(e["value"]) for e in ((patch.get("spec") or {}).get(component) or {}).get("env") or []}
    tk, dp = env("toolkit"), env("devicePlugin")
    if tk.get("ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED") != "false":
        fail(where, "ClusterPolicy patch: toolkit ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED must be false (a pod could name any GPU)")
    if "volume-mounts" in strategy and tk.get("ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS") != "true":
        fail(where, "ClusterPolicy patch: the agent hands devices as volume mounts; the toolkit must accept them")
    if dp.get("DEVICE_LIST_STRATEGY") not in ("volume-mounts", "cdi-annotations", "cdi-cri"):
        fail(where, "ClusterPolicy patch: the operator's device plugin must stop using envvar, which the toolkit now ignores")
    if ((patch.get("spec") or {}).get("devicePlugin") or {}).get("enabled") is False:
        fail(where, "ClusterPolicy patch: do not turn the operator's device plugin off cluster-wide; label Tessera's nodes")
    # --taint: the taint migrate-node.sh sets is tolerated by the pods the webhook
    # hands to Tessera, by the agent and by the operator's DaemonSets; rollback removes it.
    tm = re.search(r'^TAINT_KEY=(\S+)\nTAINT="\$TAINT_KEY=(\S*):(\w+)"', text, re.M)
    if not tm:
        fail(where, "migrate-node.sh: no TAINT_KEY/TAINT for --taint")
    else:
        key, value, effect = tm.groups()
        if 'kubectl taint node "$NODE" "$TAINT" --overwrite' not in text \
                or 'kubectl taint node "$NODE" "$TAINT_KEY:NoSchedule-"' not in text:
            fail(where, "migrate-node.sh: --taint must taint the node and --rollback untaint it")

        def tolerates(tols):
            return any((t.get("key") in (None, "", key)) and t.get("operator") == "Exists"
                       and t.get("effect") in (None, "", effect) or
                       (t.get("key") == key and t.get("value") == value and t.get("effect") in (None, "", effect))
                       for t in tols or [])
        if not tolerates(spec.get("tolerations")):
            fail(where, f"node agent does not tolerate {key}:{effect}: it would leave a tainted node")
        sched = [c for o in objs if o["kind"] == "Deployment"
                 for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == "tessera"]
        pod_tols = [a.split("=", 1)[1] for c in sched for a in c.get("args") or []
                    if a.startswith("--pod-toleration=")]
        if f"{key}={value}:{effect}" not in pod_tols and f"{key}:{effect}" not in pod_tols:
            fail(where, f"the webhook adds no toleration for {key}={value}:{effect} (webhook.podTolerations: {pod_tols}): "
                        "Tessera's pods would not land on nodes migrate-node.sh --taint tainted")
        ds_tols = ((patch.get("spec") or {}).get("daemonsets") or {}).get("tolerations")
        if not tolerates(ds_tols):
            fail(where, f"ClusterPolicy patch: daemonsets.tolerations must tolerate {key}: the operator's driver and toolkit pods would not return to a tainted node")
        if not any(t.get("key") == "nvidia.com/gpu" for t in ds_tols or []):
            fail(where, "ClusterPolicy patch: daemonsets.tolerations replaces the operator's list: keep nvidia.com/gpu")
    pms = [o for o in objs if o["kind"] == "PodMonitor"]
    for pm in pms:
        drops = [r for ep in pm["spec"]["podMetricsEndpoints"] for r in ep.get("metricRelabelings") or []
                 if r.get("action") == "drop" and "DCGM_FI_" in r.get("regex", "")]
        if not drops:
            fail(where, f"{describe(pm)}: dcgm-exporter runs beside the agent: its DCGM_FI_* series must be dropped")
    print(f"ok   {where}: GPU Operator coexistence (labels {sorted(labels)}, ClusterPolicy patch, agent selector)")


# What `tessera node-agent --dra` asks the API server for (crates/tessera-node/src/dra/
# apiserver.rs), in whichever resource.k8s.io version answers (v1, v1beta2, v1beta1: RBAC
# names the group, not the version). Checked only where nodeAgent.dra.enabled renders the
# DRA driver; the device-plugin agent's needs stay in RBAC_NEEDS.
RBAC_NEEDS_DRA = {
    # SlicePublisher::publish: server-side apply of each slice (`api.patch` with
    # Patch::Apply; an apply that creates the slice is authorized as create), `api.list`
    # of the node's slices (fieldSelector spec.nodeName, spec.driver), `api.delete` of
    # the stale ones with UID/resourceVersion preconditions.
    ("resource.k8s.io", "resourceslices"): {"create", "patch", "list", "delete"},
    # KubeClaims::get: NodePrepareResources reads the claim the kubelet names (`api.get`).
    ("resource.k8s.io", "resourceclaims"): {"get"},
    # Inventory::retire: the node's GpuNode read (`api.get_opt`), then deleted with
    # its UID and resourceVersion as preconditions.
    ("tessera.io", "gpunodes"): {"get", "delete"},
}
DRA_SRC = ROOT / "crates/tessera-node/src/dra"
AGENT_CLI = ROOT / "crates/tessera/src/cmd/node_agent.rs"


def dra_code_defaults():
    """The driver name, the socket directories and the CDI directory as the code has them
    (dra/mod.rs constants, the --cdi-dir default), and the device types slice.rs publishes."""
    mod = (DRA_SRC / "mod.rs").read_text()
    const = dict(re.findall(r'pub const ([A-Z_]+): &str = "([^"]+)";', mod))
    cli = re.sub(r"\s+", " ", AGENT_CLI.read_text())
    cdi = re.search(r'default_value = "([^"]+)"[^\]]*\)\] cdi_dir: PathBuf', cli)
    plugin = re.search(r'default_value = "([^"]+)"[^\]]*\)\] dra_plugin_dir: PathBuf', cli)
    types = set(re.findall(r'attributes\.insert\("type"\.into\(\), string_attr\("([a-z-]+)"\)\)',
                           (DRA_SRC / "slice.rs").read_text()))
    driver = const.get("DRIVER_NAME")
    out = {"driver": driver, "registry": const.get("REGISTRY_DIR"),
           "plugin": f"{const['PLUGINS_DIR']}/{driver}" if "PLUGINS_DIR" in const and driver else None,
           "cdi": cdi.group(1) if cdi else None, "types": types}
    if plugin and plugin.group(1) != out["plugin"]:
        fail("dra", f"node_agent.rs --dra-plugin-dir default {plugin.group(1)!r} is not DraConfig's {out['plugin']!r}")
    for k, v in out.items():
        if not v:
            fail("dra", f"cannot read the DRA {k} from the code (dra/mod.rs, dra/slice.rs, cmd/node_agent.rs)")
    return out


def daemonset_runs_on(ds, labels):
    """Whether the DaemonSet's pods may run on a node with these labels: its nodeSelector
    and its required node affinity (terms ORed, expressions ANDed)."""
    pod = ds["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    req = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(selector_matches({"matchExpressions": t.get("matchExpressions") or []}, labels) for t in terms)


def check_dra(objs, where, values):
    """Issue 29, node side: with nodeAgent.dra.enabled the chart runs the agent as the DRA
    driver. Its DaemonSet passes --dra and the directory flags, and mounts the kubelet's
    plugin registry, the driver's socket directory and the CDI directory from the host at
    the very paths the agent uses (the kubelet dials the socket path the agent announces);
    it runs exactly on the nodes the device-plugin agent leaves (never both on a node); the
    ClusterRole bound to its ServiceAccount grants RBAC_NEEDS_DRA; its readinessProbe reads
    /readyz where --metrics-addr serves it; the DeviceClasses select every device type the
    code publishes and nothing of another driver. With DRA off (the default) none of it
    is rendered."""
    na = values.get("nodeAgent") or {}
    dra = na.get("dra") or {}
    on = bool(dra.get("enabled")) and na.get("enabled", True) is not False
    daemonsets = [o for o in objs if o["kind"] == "DaemonSet"]
    drivers = [o for o in daemonsets if any("--dra" in (c.get("args") or [])
                                             for c in o["spec"]["template"]["spec"]["containers"])]
    classes = [o for o in objs if o["kind"] == "DeviceClass"]
    if not on:
        if drivers or classes:
            fail(where, f"DRA: nodeAgent.dra is off, yet {[describe(o) for o in drivers + classes]} rendered")
        return
    code = dra_code_defaults()
    if len(drivers) != 1:
        fail(where, f"DRA: nodeAgent.dra.enabled, but {len(drivers)} DaemonSets run `tessera node-agent --dra` (expected 1)")
        return
    ds = drivers[0]
    pod = ds["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if "--dra" in (c.get("args") or []))
    args = c["args"]
    if args[0] != "node-agent":
        fail(where, f"DRA: {describe(ds)} runs `tessera {args[0]}`, not node-agent")

    def flag(name):
        vals = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
        if len(vals) > 1:
            fail(where, f"DRA: {describe(ds)} passes --{name} {len(vals)} times")
        return vals[-1] if vals else None
    vols = {v["name"]: v for v in pod.get("volumes") or []}
    mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts") or []}
    for what, flag_name, value_key in (("plugin registry", "dra-registry-dir", "registryDir"),
                                       ("driver socket directory", "dra-plugin-dir", "pluginDir"),
                                       ("CDI directory", "cdi-dir", "cdiDir")):
        code_default = code[{"registryDir": "registry", "pluginDir": "plugin", "cdiDir": "cdi"}[value_key]]
        want = (dra.get(value_key) or code_default or "").rstrip("/")
        used = (flag(flag_name) or code_default or "").rstrip("/")
        if used != want:
            fail(where, f"DRA: {describe(ds)}: the agent uses {used!r} as its {what} (--{flag_name}), expected {want!r}")
        m = mounts.get(used)
        host = ((vols.get(m["name"]) or {}).get("hostPath") or {}) if m else {}
        if not m:
            fail(where, f"DRA: {describe(ds)}: the {what} {used} (--{flag_name}) is not mounted")
        elif (host.get("path") or "").rstrip("/") != used:
            fail(where, f"DRA: {describe(ds)}: {used} is mounted from {host.get('path') or vols.get(m['name'])!r}, "
                        f"not the host's {used} (the kubelet and the runtime look on the host)")
        elif m.get("readOnly"):
            fail(where, f"DRA: {describe(ds)}: the agent writes {used}, which is mounted read-only")
    features = flag("dra-features") or ""
    if features != (dra.get("features") or ""):
        fail(where, f"DRA: --dra-features={features!r}, nodeAgent.dra.features is {dra.get('features')!r}")
    # `node-agent --dra` serves /healthz and /readyz on --metrics-addr (dra::probe):
    # a rollout waits for the kubelet's registration and the published slices.
    ready = ((c.get("readinessProbe") or {}).get("httpGet") or {})
    addr = flag("metrics-addr") or ""
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    port = ports.get(ready.get("port"), ready.get("port"))
    if ready.get("path") != "/readyz":
        fail(where, f"DRA: {describe(ds)}: no readinessProbe on /readyz: the pod is Ready before the kubelet registers the driver")
    elif addr == "off" or not addr.endswith(f":{port}"):
        fail(where, f"DRA: {describe(ds)}: readinessProbe port {port!r} is not where --metrics-addr={addr!r} serves /readyz")
    if (c.get("securityContext") or {}).get("runAsUser") != 0:
        fail(where, f"DRA: {describe(ds)}: must run as root: the kubelet's plugin directories belong to root")
    # Never both agents on one node: a GPU node labelled for DRA runs the driver only, an
    # unlabelled one the device-plugin agent only.
    label = dra.get("nodeLabel") or "tessera.io/dra"
    others = [o for o in daemonsets if o is not ds]
    base = {}
    for o in [ds] + others:
        base.update(o["spec"]["template"]["spec"].get("nodeSelector") or {})
    base.pop(label, None)
    for node, want_driver in (({**base, label: "true"}, True), (base, False)):
        if daemonset_runs_on(ds, node) != want_driver:
            fail(where, f"DRA: {describe(ds)} {'does not run' if want_driver else 'runs'} on a node labelled {node}")
        for o in others:
            if daemonset_runs_on(o, node) == want_driver:
                fail(where, f"DRA: {describe(o)} {'runs' if want_driver else 'does not run'} on a node labelled {node}"
                            f"{' beside the DRA driver (both would hand out its GPUs)' if want_driver else ''}")
    # RBAC: what the ClusterRoles bound to the driver's ServiceAccount grant.
    sa = pod.get("serviceAccountName")
    role_names = {b["roleRef"]["name"] for b in objs if b["kind"] == "ClusterRoleBinding"
                  and b["roleRef"].get("kind") == "ClusterRole"
                  and any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                          and s.get("namespace") == ds["metadata"].get("namespace") for s in b.get("subjects") or [])}
    granted = granted_verbs(r for r in objs if r["kind"] == "ClusterRole" and r["metadata"]["name"] in role_names)
    for (g, res), verbs in RBAC_NEEDS_DRA.items():
        have = granted.get((g, res), set()) | granted.get((g, "*"), set()) | granted.get(("*", res), set())
        missing = set() if "*" in have else verbs - have
        if missing:
            fail(where, f"DRA: the ClusterRoles of ServiceAccount {sa!r} ({sorted(role_names)}): {res} ({g}) "
                        f"lacks {sorted(missing)}, which the code uses")
    check_slice_policy(objs, where, dra, pod.get("serviceAccountName"), ds["metadata"]["namespace"])
    # DeviceClasses: a class named after the driver for whole GPUs (docs/kubernetes.md §10),
    # every device type slice.rs publishes selected by a class, another driver's by none.
    if dra.get("deviceClasses", True) is False:
        if classes:
            fail(where, f"DRA: nodeAgent.dra.deviceClasses is false, yet {[describe(o) for o in classes]} rendered")
        print(f"ok   {where}: DRA driver {describe(ds)} (no DeviceClass)")
        return
    names = {o["metadata"]["name"]: o for o in classes}
    if code["driver"] not in names:
        fail(where, f"DRA: no DeviceClass {code['driver']!r} (the class docs/kubernetes.md §10 names)")

    def selects(cls, device):
        act = {"device": celpy.json_to_cel(device)}
        for s in (cls.get("spec") or {}).get("selectors") or []:
            expr = (s.get("cel") or {}).get("expression", "")
            try:
                if not bool(_cel.program(_cel.compile(expr)).evaluate(act)):
                    return False
            except Exception as e:  # an error in a class selector fails the allocation
                fail(where, f"DRA: {describe(cls)}: {expr!r} errors on {device} ({e.__class__.__name__}: {e})")
                return False
        return True
    for t in sorted(code["types"]):
        device = {"driver": code["driver"], "attributes": {code["driver"]: {"type": t}}, "capacity": {}}
        picked = [n for n, cls in names.items() if selects(cls, device)]
        if len(picked) != 1:
            fail(where, f"DRA: a {t!r} device of {code['driver']} is selected by {picked or 'no'} DeviceClass (expected one)")
        if t == "gpu" and code["driver"] not in picked:
            fail(where, f"DRA: DeviceClass {code['driver']} does not select the driver's whole GPUs")
    stranger = {"driver": "gpu.nvidia.com", "attributes": {"gpu.nvidia.com": {"type": "gpu"}}, "capacity": {}}
    for n, cls in names.items():
        if selects(cls, stranger):
            fail(where, f"DRA: DeviceClass {n} selects another driver's devices")
    # The same classes as a 1.32 (v1beta1) or 1.33 (v1beta2) cluster gets them (the chart
    # picks the newest version the cluster serves; the body does not change).
    for cls in classes:
        # With extendedResourceName the chart refuses v1beta2/v1beta1 (check_dra_extended_resource).
        if cls.get("apiVersion") == "resource.k8s.io/v1" and not (cls.get("spec") or {}).get("extendedResourceName"):
            for older in ("resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"):
                schema_check({**cls, "apiVersion": older}, f"{where} as {older}")
    print(f"ok   {where}: DRA driver {describe(ds)} (--dra, {len(RBAC_NEEDS_DRA)} resources granted), "
          f"DeviceClasses {sorted(names)} over device types {sorted(code['types'])}; DeviceClass schemas: "
          f"v1 on Kubernetes 1.34+, v1beta2 on 1.33+, v1beta1 on 1.32+, none earlier (API_SINCE)")


def extended_resource_name_errors(name):
    """Why the API server refuses `name` as an extended resource name (IsExtendedResourceName,
    k8s.io/kubernetes pkg/apis/core/helper, which DeviceClassSpec.extendedResourceName and a
    device plugin's resource name both go through): no '/' or anything in kubernetes.io/
    (native), a "requests." prefix (quota's), or "requests.<name>" not a qualified name."""
    if "/" not in name or "kubernetes.io/" in name:
        return ["is a native resource name (no domain, or in kubernetes.io/)"]
    if name.startswith("requests."):
        return ["starts with \"requests.\" (quota's prefix)"]
    return qualified_name_errors(f"requests.{name}")


# Names rendered once each: the chart must refuse exactly those the API server refuses
# (plus tessera.io/* and MIG profile names, its own rules).
ERN_SAMPLES = ["nvidia.com/gpu", "example.com/gpu-whole", "amd.com/gpu", "gpu.example.com/A100_80GB",
               "nvidia.com/gpu.shared", "gpu", "kubernetes.io/gpu", "gpu.kubernetes.io/gpu",
               "requests.example.com/gpu", "NVIDIA.com/gpu", "example.com/-gpu", "example.com/", "/gpu",
               "a/b/c", "example.com/" + "g" * 64, "example.com/" + "g" * 63, "x" * 236 + ".io/gpu", "x" * 245 + ".io/gpu",
               "tessera.io/gpu", "tessera.io/gpu-memory", "nvidia.com/mig-1g.10gb"]


def ern_schema_releases():
    """{release: {apiVersion of DeviceClass whose spec has extendedResourceName}}, from the
    bundled strict schemas."""
    out = {}
    for version in KUBE_VERSIONS:
        have = set()
        for api in ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"):
            v = k8s_validator(api, "DeviceClass", version)
            if v is None:
                continue
            spec = {"selectors": [], "extendedResourceName": "example.com/gpu"}
            probe = {"apiVersion": api, "kind": "DeviceClass", "metadata": {"name": "probe"}, "spec": spec}
            if not any(list(e.path)[:2] == ["spec", "extendedResourceName"] or "extendedResourceName" in e.message
                       for e in v.iter_errors(probe)):
                have.add(api)
        out[version] = have
    return out


def check_dra_extended_resource(objs, where, values):
    """Issue 29 item 3: with nodeAgent.dra.extendedResourceName the DeviceClass gpu.tessera.io
    carries spec.extendedResourceName (so kube-scheduler serves pods asking that resource on
    nodes that do not advertise it, the DRA nodes, with whole GPUs of the class); without it
    no class carries the field, and mig.tessera.io never does. The class is
    resource.k8s.io/v1, whose every release (API_SINCE) has the field in its schema; the
    v1beta2/v1beta1 releases before the field (1.32, 1.33) do not know it, so the chart must
    refuse those versions (MUST_FAIL). A stock pod asking the name is sent to no webhook:
    it stays with the default scheduler, the one the mapping serves."""
    na = values.get("nodeAgent") or {}
    dra = na.get("dra") or {}
    if not (dra.get("enabled") and na.get("enabled", True) is not False):
        return
    ern = dra.get("extendedResourceName") or ""
    classes = [o for o in objs if o["kind"] == "DeviceClass"]
    driver = dra_code_defaults()["driver"]
    for cls in classes:
        got = (cls.get("spec") or {}).get("extendedResourceName")
        want = (ern or None) if cls["metadata"]["name"] == driver else None
        if got != want:
            fail(where, f"DRA: {describe(cls)}: spec.extendedResourceName is {got!r}, expected {want!r} "
                        f"(nodeAgent.dra.extendedResourceName {ern!r}; only {driver} carries it)")
    if not ern:
        return
    gpu_cls = [c for c in classes if c["metadata"]["name"] == driver]
    if not gpu_cls:
        fail(where, f"DRA: nodeAgent.dra.extendedResourceName {ern!r}, but no DeviceClass {driver} carries it")
        return
    cls = gpu_cls[0]
    for e in extended_resource_name_errors(ern):
        fail(where, f"DRA: {describe(cls)}: extendedResourceName {ern!r} {e}: the API server refuses the class")
    if ern.startswith("tessera.io/"):
        fail(where, f"DRA: {describe(cls)}: maps {ern!r}, which Tessera's webhook hands to the Tessera scheduler")
    if cls.get("apiVersion") != "resource.k8s.io/v1":
        fail(where, f"DRA: {describe(cls)} is {cls.get('apiVersion')}: extendedResourceName needs resource.k8s.io/v1")
    releases = ern_schema_releases()
    since = API_SINCE[("resource.k8s.io/v1", "DeviceClass")]
    with_field = [v for v in KUBE_VERSIONS if "resource.k8s.io/v1" in releases[v]]
    serving = [v for v in KUBE_VERSIONS if vtuple(v) >= since]
    if with_field != serving:
        fail(where, f"DRA: DeviceClass resource.k8s.io/v1 has spec.extendedResourceName in {with_field}, "
                    f"but is served in {serving}: the chart's v1-only rule no longer holds")
    # The older versions, in the releases that serve them but lack the field: refused by
    # their strict schema (the reason the chart renders the field only as v1).
    lacking = []
    for older in ("resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"):
        for v in KUBE_VERSIONS:
            if vtuple(v) < API_SINCE[(older, "DeviceClass")] or older in releases[v]:
                continue
            val = k8s_validator(older, "DeviceClass", v)
            checked["schema validations"] += 1
            replay = {**cls, "apiVersion": older, "spec": {**(cls.get("spec") or {}), "extendedResourceName": ern}}
            if val is None or not any("extendedResourceName" in e.message for e in val.iter_errors(replay)):
                fail(where, f"DRA: Kubernetes {v} accepts {describe(cls)} with extendedResourceName as {older}, "
                            f"which the chart refuses: revisit the v1-only rule")
            lacking.append((vtuple(v), f"{v} {older.rsplit('/', 1)[1]}"))
    # Where the class's pods come from: a stock pod asking the name goes to no webhook.
    hooks = [w for o in objs if o["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
             for w in o.get("webhooks") or []]
    pod = sample_pod("stock-ern", "default", {ern: "1"})
    request = {"operation": "CREATE", "resource": "pods", "namespace": "default", "name": "stock-ern"}
    sent = [w["name"] for w in hooks if webhook_sends(w, {"kubernetes.io/metadata.name": "default"}, request, pod, None, where)]
    if sent:
        fail(where, f"DRA: a stock pod asking {ern} is sent to {sent}: the mapping serves the default scheduler's pods")
    print(f"ok   {where}: DRA extended resource {ern!r} on {describe(cls)} only; the field is in the "
          f"v1 DeviceClass schema of {with_field[0]}..{with_field[-1]} (every release serving v1), unknown to "
          f"{', '.join(x for _, x in sorted(lacking))}; a stock pod asking it goes to no webhook")


def check_dra_extended_resource_names():
    """The chart's name rule against IsExtendedResourceName (extended_resource_name_errors),
    one render per ERN_SAMPLES name: valid names render (tessera.io/* and nvidia.com/mig-*
    excepted: refused by the chart's own rules), invalid ones are refused."""
    where = "chart[DRA extendedResourceName rule]"
    agreed = 0
    for name in ERN_SAMPLES:
        valid = not extended_resource_name_errors(name)
        own_rule = name.startswith("tessera.io/") or name.startswith("nvidia.com/mig-")
        values = {"nodeAgent": {"dra": {"enabled": True, "extendedResourceName": name}}}
        try:
            with helm.Config(namespace=NAMESPACE) as cfg:
                cfg.install(str(CHART), RELEASE, values, namespace=NAMESPACE, dry_run="client")
            refused, why = False, ""
        except helm.HelmError as e:
            refused, why = True, str(e)
        if valid and not own_rule and refused:
            fail(where, f"{name!r} is a valid extended resource name, yet the chart refuses it: {why[:200]}")
        elif not valid and not refused:
            fail(where, f"{name!r} is not a valid extended resource name "
                        f"({'; '.join(extended_resource_name_errors(name))}), yet the chart renders it")
        elif own_rule and valid and not refused:
            fail(where, f"{name!r} renders, but the chart must refuse tessera.io/* and MIG profile names")
        else:
            agreed += 1
    print(f"ok   {where}: {agreed}/{len(ERN_SAMPLES)} sample names accepted or refused as the API server "
          f"(IsExtendedResourceName) and the chart's own rules say")


def check_chart():
    helps = {}
    if TESSERA_BIN:
        helps = {"scheduler": help_flags("scheduler"), "node-agent": help_flags("node-agent"),
                 "estimator": help_flags("estimator"), "kueue-admission": help_flags("kueue-admission")}
        print(f"flags: checked against {TESSERA_BIN}")
    else:
        print("flags: SKIP (no tessera binary: set TESSERA_BIN or build -p tessera)")
    defaults_cfg = None
    for name, values in SCENARIOS.items():
        where = f"chart[{name}]"
        lint(values, where)
        manifest = render(values, where)
        if manifest is None:
            continue
        objs = load_docs(manifest, where)
        if not objs:
            fail(where, "renders nothing")
        for o in objs:
            schema_check(o, where)
            check_object(o, where)
        check_references(objs, where, values)
        check_flags(objs, where, helps)
        cms = [o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in (o.get("data") or {})]
        mode = (values.get("scheduler") or {}).get("mode", "extender")
        if mode == "extender":
            if len(cms) != 1:
                fail(where, "extender mode renders no kube-scheduler ConfigMap")
            else:
                cfg_docs = load_docs(cms[0]["data"]["config.yaml"], f"{where} config.yaml")
                if len(cfg_docs) == 1:
                    cfg = cfg_docs[0]
                    check_scheduler_config(cfg, f"{where} config.yaml")
                    ext = tessera_extender(cfg, f"{where} config.yaml")
                    # kube-scheduler runs in Tessera's pod and calls it on loopback, where
                    # the tessera container's --listen must be.
                    listens = [a.split("=", 1)[1] for o in objs if o["kind"] == "Deployment"
                               for c in o["spec"]["template"]["spec"]["containers"]
                               for a in (c.get("args") or []) if a.startswith("--listen=")]
                    if ext:
                        want = [f"http://{l}" for l in listens if l.startswith("127.0.0.1:")]
                        if ext["urlPrefix"].rstrip("/") not in want:
                            fail(where, f"extender urlPrefix {ext['urlPrefix']!r} is not the tessera container's loopback --listen ({listens})")
                    if name == "defaults":
                        defaults_cfg = cfg
        elif cms:
            fail(where, "standalone mode renders a kube-scheduler ConfigMap")
        check_dashboard_configmaps(objs, where, values)
        check_webhook_scoping(objs, where, values)
        check_scheduler_availability(objs, where, values)
        check_signing_keys(objs, where, values)
        check_gitops_render(values, where, manifest)
        check_monitoring(objs, where, values)
        check_agent_update_strategy(objs, where, values)
        check_rbac(objs, where)
        check_estimator(objs, where, values)
        check_kueue_admission(objs, where, values)
        check_dra(objs, where, values)
        check_dra_extended_resource(objs, where, values)
        if name.startswith("GPU Operator coexistence"):
            check_gpu_operator(objs, where, values)
        kinds = sorted({o["kind"] for o in objs})
        print(f"ok   {where}: {len(objs)} objects ({', '.join(kinds)})")
    for name, (values, phrase) in MUST_FAIL.items():
        try:
            with helm.Config(namespace=NAMESPACE) as cfg:
                cfg.install(str(CHART), RELEASE, values, namespace=NAMESPACE, dry_run="client")
            fail(f"chart[{name}]", "rendered, but must be refused")
        except helm.HelmError as e:
            if phrase in str(e):
                print(f"ok   chart[{name}]: refused as it must be")
            else:
                fail(f"chart[{name}]", f"refused for another reason: {e}")
    check_dra_extended_resource_names()
    return defaults_cfg


def check_examples(crds, chart_cfg):
    for f in sorted(EXAMPLES.glob("*.yaml")):
        where = str(f.relative_to(ROOT))
        for obj in load_docs(f.read_text(), where):
            kind = obj.get("kind")
            if kind == "KubeSchedulerConfiguration":
                check_scheduler_config(obj, where)
                tessera_extender(obj, where)
                if chart_cfg is not None:
                    for k in ("profiles", "extenders"):
                        if obj.get(k) != chart_cfg.get(k):
                            fail(where, f"{k} differ from the chart's default render (release {RELEASE!r}, namespace {NAMESPACE!r})")
            elif (obj.get("apiVersion"), kind) in crds:
                check_custom_object(obj, crds, where)
            else:
                schema_check(obj, where)
                check_object(obj, where)
            print(f"ok   {where}: {describe(obj)}")


def exported_metrics():
    """Metric names in the node agent's and the scheduler's sources: literal names, and
    prometheus-client registrations under Registry::with_prefix (with the series suffixes
    counters and histograms add)."""
    base = set()
    for crate in ("tessera-node", "tessera-k8s"):
        for src in (ROOT / "crates" / crate / "src").rglob("*.rs"):
            text = src.read_text()
            base |= set(re.findall(r'"((?:DCGM_FI_[A-Z0-9_]+)|(?:tessera_[a-z0-9_]+))"', text))
            for prefix in re.findall(r'with_prefix\(\s*"([a-z0-9_]+)"', text):
                base |= {f"{prefix}_{n}" for n in re.findall(r'\.register\(\s*"([a-z0-9_]+)"', text)}
    return {n + sfx for n in base for sfx in ("", "_total", "_bucket", "_sum", "_count")}


PROMQL_WORDS = {"sum", "avg", "min", "max", "count", "by", "without", "or", "and", "unless", "on",
                "ignoring", "vector", "rate", "irate", "increase", "label_values", "bool", "topk",
                "bottomk", "group_left", "group_right", "offset", "histogram_quantile", "clamp_min",
                "clamp_max", "abs", "time", "delta", "deriv", "changes", "resets", "avg_over_time",
                "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "quantile", "stddev",
                "absent", "label_replace", "query_result"}


def check_dashboards():
    exported = exported_metrics()
    for f in sorted(DASHBOARDS.glob("*.json")):
        where = str(f.relative_to(ROOT))
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            fail(where, f"invalid JSON: {e}")
            continue
        for k in ("title", "uid", "panels", "schemaVersion"):
            if k not in d:
                fail(where, f"no {k!r}")
        variables = {v.get("name") for v in (d.get("templating") or {}).get("list") or []}
        ids, exprs = [], []

        def walk(panels):
            for p in panels:
                ids.append(p.get("id"))
                if p.get("type") != "row":
                    if "gridPos" not in p:
                        fail(where, f"panel {p.get('id')} has no gridPos")
                    ds = p.get("datasource") or {}
                    if ds.get("uid") not in ("${datasource}", "$datasource"):
                        fail(where, f"panel {p.get('id')} does not use the $datasource variable")
                for t in p.get("targets") or []:
                    exprs.append((p.get("id"), t.get("expr", "")))
                walk(p.get("panels") or [])

        walk(d.get("panels") or [])
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup or None in ids:
            fail(where, f"panel ids must be unique and set (duplicates: {dup})")
        for v in (d.get("templating") or {}).get("list") or []:
            q = v.get("query")
            exprs.append((f"variable {v.get('name')}", q.get("query", "") if isinstance(q, dict) else ""))
        for pid, expr in exprs:
            # Where dcgm-exporter runs too, every GPU has two copies of each DCGM_FI_*
            # series (its and the agent's, unless monitoring.dropDcgmSeries): a panel
            # must take one per GPU before it counts, sums or averages.
            if "DCGM_FI_" in expr and not str(pid).startswith("variable ") \
                    and not re.search(r"\bmax by \(UUID\b", expr):
                fail(where, f"{pid}: {expr!r} reads DCGM_FI_* without one series per GPU (max by (UUID, ...)): double-counts beside dcgm-exporter")
            # dcgm-exporter renamed its node label Hostname -> hostname (2026-05); deployed
            # exporters still write Hostname. A query that names the node must read both.
            if "DCGM_FI_" in expr and re.search(r"\bhostname\b", expr) \
                    and not re.search(r"\bHostname\b", expr):
                fail(where, f"{pid}: {expr!r} names the node by hostname only: older dcgm-exporters write Hostname (label_replace it)")
            for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expr):
                if var not in variables and not var.startswith("__"):
                    fail(where, f"{pid}: uses undefined variable ${var}")
            stripped = re.sub(r'"[^"]*"', '""', expr)
            stripped = re.sub(r"\{[^}]*\}", "{}", stripped)
            stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)
            stripped = re.sub(r"label_values\(([^,]*),[^)]*\)", r"(\1)", stripped)
            for ident in re.findall(r"\b[A-Za-z_][A-Za-z0-9_:]*\b", stripped):
                if ident in PROMQL_WORDS or ident.isdigit():
                    continue
                if ident not in exported:
                    fail(where, f"{pid}: queries {ident!r}, which no Tessera component exports")
        print(f"ok   {where}: {len(ids)} panels, {len(exprs)} queries")


# ---------------------------------------------------------------- Dockerfile
def check_dockerfile():
    """Item 1, without a Docker daemon: every path the build stage COPYs from the
    context exists and survives .dockerignore; the binaries copied out of target/ are
    the workspace's [[bin]]s in the directory of the profile the same RUN builds; the
    runtime stage runs as a non-root user; and the chart's container args start with
    a subcommand of that ENTRYPOINT."""
    where = "Dockerfile"
    path = ROOT / "Dockerfile"
    if not path.exists():
        fail(where, "missing (item 1: the image the chart installs)")
        return
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    stages = [l for l in lines if l.upper().startswith("FROM ")]
    if len(stages) < 2:
        fail(where, "expected a multi-stage build (a build stage and a runtime stage)")
    runtime = stages[-1].split()[1]
    if not re.match(r"(gcr\.io/distroless/|scratch$|cgr\.dev/chainguard/(static|glibc-dynamic))", runtime):
        fail(where, f"runtime image {runtime!r} is neither distroless nor static")
    ignore = ROOT / ".dockerignore"
    patterns = [l.strip() for l in ignore.read_text().splitlines()
                if l.strip() and not l.startswith("#")] if ignore.exists() else []

    def ignored(rel):
        out = False
        for pat in patterns:
            neg = pat.startswith("!")
            pat = pat.lstrip("!").rstrip("/")
            regex = "^" + re.escape(pat).replace(r"\*\*", ".*").replace(r"\*", "[^/]*") + "(/.*)?$"
            if re.match(regex, rel):
                out = not neg
        return out

    bins = set()
    for cargo in (ROOT / "crates").glob("*/Cargo.toml"):
        bins |= set(re.findall(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"', cargo.read_text()))
    profile = None
    for l in lines:
        m = re.search(r"cargo build\b.*", l)
        if m:
            pm = re.search(r"--profile[ =](\S+)", m.group(0))
            profile = pm.group(1) if pm else ("release" if "--release" in m.group(0) else "debug")
            if "--locked" not in m.group(0):
                fail(where, "cargo build without --locked: the image would not build the Cargo.lock it ships")
            copied = re.findall(r"target/([^/\s]+)/([A-Za-z0-9_-]+)", l)
            for prof_dir, binary in copied:
                want_dir = "debug" if profile == "dev" else profile
                if prof_dir != want_dir:
                    fail(where, f"copies target/{prof_dir}/{binary}, but builds with --profile {profile} (target/{want_dir})")
                if binary not in bins:
                    fail(where, f"copies {binary}, which no crate's [[bin]] builds ({sorted(bins)})")
            if {b for _, b in copied} != {"tessera", "kubectl-tessera"}:
                fail(where, f"the image must hold tessera and kubectl-tessera, copies {[b for _, b in copied]}")
    if profile is None:
        fail(where, "no `cargo build` in the build stage")
    for l in lines:
        if l.upper().startswith("COPY ") and "--from=" not in l:
            for src in l.split()[1:-1]:
                if src.startswith("--"):
                    continue
                if not (ROOT / src).exists():
                    fail(where, f"COPY {src}: not in the repository")
                elif ignored(src):
                    fail(where, f"COPY {src}: excluded by .dockerignore")
    # What the build reads beyond its COPYs: build scripts' ../../ paths must be copied.
    for build_rs in (ROOT / "crates").glob("*/build.rs"):
        for rel in re.findall(r'"\.\./\.\./([A-Za-z0-9_-]+)"', build_rs.read_text()):
            if not any(l.upper().startswith("COPY ") and f" {rel}" in l for l in lines):
                fail(where, f"{build_rs.relative_to(ROOT)} reads {rel}/, which the Dockerfile does not COPY")
    users = [l.split()[1] for l in lines[lines.index(stages[-1]):] if l.upper().startswith("USER ")]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        fail(where, "the runtime stage must set a non-root USER")
    entry = [l for l in lines if l.upper().startswith("ENTRYPOINT")]
    if not entry or "tessera" not in entry[-1]:
        fail(where, "ENTRYPOINT must be the tessera binary (the chart passes only args)")
    print(f"ok   {where}: {len(stages)} stages, runtime {runtime}, profile {profile}, user {users[-1] if users else None}")


print(f"helm SDK {helm.helm_sdk_version()} (helm-python-sdk), Kubernetes schemas {', '.join(KUBE_VERSIONS)}")
crds = check_crds()
chart_cfg = check_chart()
check_examples(crds, chart_cfg)
check_dashboards()
check_dockerfile()
print(f"{checked['objects']} objects, {checked['schema validations']} schema validations, {len(failures)} failures")
if failures:
    print(f"{len(failures)} failed:")
    for f in failures:
        print(f"  {f}")
    sys.exit(1)
print("deploy/ is valid")
PY
