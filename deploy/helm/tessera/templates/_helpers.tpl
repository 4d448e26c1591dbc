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
