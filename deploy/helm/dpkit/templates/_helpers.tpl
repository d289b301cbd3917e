{{- define "dpkit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dpkit.labels" -}}
app.kubernetes.io/part-of: dpkit
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "dpkit.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The image of a plugin with the DRA front: the full binary. */}}
{{- define "dpkit.draImage" -}}
{{- printf "%s:%s" .Values.dra.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* "true" when plugin p (a values.plugins entry) has the DRA front. */}}
{{- define "dpkit.hasDRA" -}}
{{- if has "dra" (.fronts | default (list "deviceplugin")) -}}true{{- end -}}
{{- end -}}

{{/* "true" when an enabled plugin has the DRA front. */}}
{{- define "dpkit.anyDRA" -}}
{{- range $name, $p := .Values.plugins }}{{ if and $p.enabled (include "dpkit.hasDRA" $p) }}true{{ end }}{{ end -}}
{{- end -}}

{{/* "true" when a plugin is enabled: the plugins' ServiceAccount, metrics
Service and ServiceMonitor exist only then (the exporter has its own). */}}
{{- define "dpkit.anyPlugin" -}}
{{- range $name, $p := .Values.plugins }}{{ if $p.enabled }}true{{ end }}{{ end -}}
{{- end -}}

{{- define "dpkit.requireOnePlugin" -}}
{{- $any := false -}}
{{- range $name, $p := .Values.plugins }}{{ if $p.enabled }}{{ $any = true }}{{ end }}{{ end -}}
{{- if .Values.exporter.enabled }}{{ $any = true }}{{ end -}}
{{- if not $any -}}
{{- fail "no plugin enabled: set plugins.generic.enabled, plugins.amdgpu.enabled or plugins.nvidia.enabled (or exporter.enabled) to true" -}}
{{- end -}}
{{- end -}}

{{/* The exporter's image: the full binary, for its API server reads. */}}
{{- define "dpkit.exporterImage" -}}
{{- printf "%s:%s" .Values.exporter.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
