{{/* Names: "vidrec-api" etc. for a release named vidrec (as the kustomize base). */}}
{{- define "vidrec.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "vidrec.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: vidrec
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector of one component's pods: {{ include "vidrec.selector" (list . "api") }} */}}
{{- define "vidrec.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "vidrec.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vidrec.secretName" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "vidrec.fullname" .)) -}}
{{- end -}}

{{- define "vidrec.registryClaim" -}}
{{- .Values.registry.existingClaim | default (printf "%s-registry" (include "vidrec.fullname" .)) -}}
{{- end -}}

{{/* What both workloads mount and read: settings, keys, the registry, scratch space. */}}
{{- define "vidrec.envFrom" -}}
- configMapRef:
    name: {{ include "vidrec.fullname" . }}-settings
- secretRef:
    name: {{ include "vidrec.secretName" . }}
{{- end -}}

{{- define "vidrec.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Restart the pods when the settings or the keys change (kubectl apply does not). */}}
{{- define "vidrec.checksums" -}}
checksum/settings: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/api-keys: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}
