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

{{- define "dpkit.requireOnePlugin" -}}
{{- $any := false -}}
{{- range $name, $p := .Values.plugins }}{{ if $p.enabled }}{{ $any = true }}{{ end }}{{ end -}}
{{- if not $any -}}
{{- fail "no plugin enabled: set plugins.generic.enabled, plugins.amdgpu.enabled or plugins.nvidia.enabled to true" -}}
{{- end -}}
{{- end -}}
