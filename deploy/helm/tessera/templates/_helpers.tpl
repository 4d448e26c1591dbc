{{- define "tessera.name" -}}tessera{{- end -}}

{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tessera" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tessera.selector" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.serviceAccount" -}}{{ include "tessera.fullname" . }}-scheduler{{- end -}}

{{- define "tessera.signingSecret" -}}
{{- /* The node agent's DaemonSet mounts the same Secret by this default name (key `key`). */ -}}
{{- .Values.signingKey.existingSecret | default (printf "%s-allocation-key" .Release.Name) -}}
{{- end -}}

{{- define "tessera.tlsSecret" -}}
{{- .Values.webhook.existingTlsSecret | default (printf "%s-webhook-tls" (include "tessera.fullname" .)) -}}
{{- end -}}

{{- define "tessera.service" -}}{{ include "tessera.fullname" . }}-scheduler{{- end -}}

{{- /*
The schedulerNames whose pods Tessera judges: scheduler.schedulerName, then
scheduler.serveSchedulerNames, as a CEL list of strings.
*/ -}}
{{- define "tessera.celSchedulerNames" -}}
{{- $names := prepend (.Values.scheduler.serveSchedulerNames | default list) .Values.scheduler.schedulerName -}}
[{{ range $i, $n := $names }}{{ if $i }}, {{ end }}{{ squote $n }}{{ end }}]
{{- end -}}

{{- /*
CEL: some container or init container of the pod in `object` asks (requests or
limits) a resource whose name starts with one of the prefixes in the dict's
"prefixes". Every field is guarded with has(): a matchCondition that errors is
treated by the API server as failurePolicy, which would refuse the pod.
*/ -}}
{{- define "tessera.celAsks" -}}
{{- $any := list -}}
{{- range .prefixes -}}
{{- $any = append $any (printf "r.startsWith('%s')" .) -}}
{{- end -}}
{{- $r := join " || " $any -}}
{{- $one := printf "has(c.resources) && ((has(c.resources.requests) && c.resources.requests.exists(r, %s)) || (has(c.resources.limits) && c.resources.limits.exists(r, %s)))" $r $r -}}
((has(object.spec.containers) && object.spec.containers.exists(c, {{ $one }})) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $one }})))
{{- end -}}
