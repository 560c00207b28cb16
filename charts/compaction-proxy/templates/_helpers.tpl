{{/*
Chart name, truncated to the 63 characters Kubernetes names allow.
*/}}
{{- define "compaction-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: fullnameOverride, else <release>-<chart> (or just
<release> when it already contains the chart name).
*/}}
{{- define "compaction-proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "compaction-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "compaction-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compaction-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "compaction-proxy.labels" -}}
helm.sh/chart: {{ include "compaction-proxy.chart" . }}
{{ include "compaction-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "compaction-proxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Name of the ConfigMap holding config.toml (also what a sidecar mounts).
*/}}
{{- define "compaction-proxy.configMapName" -}}
{{- include "compaction-proxy.fullname" . }}
{{- end }}

{{/*
TOML rendering of plain values.

Scalars (strings, numbers, bools) and lists of scalars are rendered with
toJson, whose output for those types is valid TOML: strings become basic
strings with JSON escapes (all valid in TOML), whole numbers stay integers
(Helm reads YAML numbers as float64; toJson prints 16777216, not 1.6e+07),
lists become inline arrays. Maps become [tables], non-empty lists of maps
[[arrays of tables]]. Null values are left out.

Entry point: include "compaction-proxy.toml" .Values.config
*/}}

{{/* A key: bare when it only holds bare-key characters, else quoted. */}}
{{- define "compaction-proxy.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}
{{- . -}}
{{- else -}}
{{- toJson . -}}
{{- end -}}
{{- end -}}

{{/* "true" when the value is a non-empty list whose first item is a map. */}}
{{- define "compaction-proxy.toml.isTableArray" -}}
{{- if kindIs "slice" . -}}
{{- if gt (len .) 0 -}}
{{- if kindIs "map" (first .) -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One table. Arguments (a dict):
  table  the map to render
  path   list of already-rendered keys leading to it (empty for the root)
  header "[...]" or "[[...]]" line to print first, or "" for none
  always print the header even when the table has no scalar keys
         (needed for each [[array-of-tables]] item)
  order  optional list of keys to render first, in that order
Scalar keys come first (TOML requires them before any sub-table), then the
sub-tables. A [table] header is printed only when the table has scalar keys
or is empty ([tenants.policies] with no entries); otherwise the sub-tables'
headers define it implicitly.
*/}}
{{- define "compaction-proxy.toml.table" -}}
{{- $table := .table -}}
{{- $path := .path -}}
{{- $order := .order | default (list) -}}
{{- $keys := list -}}
{{- range $order -}}
{{- if hasKey $table . -}}{{- $keys = append $keys . -}}{{- end -}}
{{- end -}}
{{- range $k, $_ := $table -}}
{{- if not (has $k $order) -}}{{- $keys = append $keys $k -}}{{- end -}}
{{- end -}}
{{- $scalars := list -}}
{{- range $k := $keys -}}
{{- $v := index $table $k -}}
{{- if not (or (kindIs "map" $v) (kindIs "invalid" $v) (include "compaction-proxy.toml.isTableArray" $v)) -}}
{{- $scalars = append $scalars $k -}}
{{- end -}}
{{- end -}}
{{- if and .header (or .always $scalars (eq (len $table) 0)) }}

{{ .header }}
{{- end -}}
{{- range $k := $scalars }}
{{ include "compaction-proxy.toml.key" $k }} = {{ toJson (index $table $k) }}
{{- end -}}
{{- range $k := $keys -}}
{{- $v := index $table $k -}}
{{- $sub := append $path (include "compaction-proxy.toml.key" $k) -}}
{{- if kindIs "map" $v -}}
{{- include "compaction-proxy.toml.table" (dict "table" $v "path" $sub "header" (printf "[%s]" (join "." $sub))) -}}
{{- else if include "compaction-proxy.toml.isTableArray" $v -}}
{{- range $item := $v -}}
{{- include "compaction-proxy.toml.table" (dict "table" $item "path" $sub "header" (printf "[[%s]]" (join "." $sub)) "always" true) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "compaction-proxy.toml" -}}
# Rendered by the compaction-proxy Helm chart from .Values.config.
{{- include "compaction-proxy.toml.table" (dict "table" . "path" (list) "header" "" "order" (list "server" "upstream" "policies" "routes" "tenants")) }}
{{- end -}}
