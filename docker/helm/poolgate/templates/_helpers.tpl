{{/* The prefix of every object's name: the release's name (or fullnameOverride). */}}
{{- define "poolgate.prefix" -}}
{{- .Values.fullnameOverride | default .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object's metadata. */}}
{{- define "poolgate.labels" -}}
app.kubernetes.io/part-of: poolgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* An image docker/ builds: registry prefix, name, tag. Call with (list $ "poolgate-cpu"). */}}
{{- define "poolgate.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s%s:%s" $root.Values.image.registry (index . 1) $root.Values.image.tag -}}
{{- end -}}

{{/* The enabled backends, in workers.order (a JSON list); fails on a name that is not a backend, and on an
enabled backend the order leaves out. */}}
{{- define "poolgate.backends" -}}
{{- $known := .Values.workers.backends -}}
{{- range .Values.workers.order -}}
{{- if not (hasKey $known .) }}{{ fail (printf "workers.order names %q, not a backend (cpu, cuda, rocm, xpu)" .) }}{{ end -}}
{{- end -}}
{{- $enabled := list -}}
{{- range $name, $b := $known -}}
{{- if and $b.enabled (not (has $name $.Values.workers.order)) }}
{{- fail (printf "workers.order must list the enabled backend %q" $name) }}
{{- end -}}
{{- end -}}
{{- range .Values.workers.order -}}
{{- if (index $known .).enabled }}{{ $enabled = append $enabled . }}{{ end -}}
{{- end -}}
{{- if not $enabled }}{{ fail "enable at least one of workers.backends" }}{{ end -}}
{{- toJson $enabled -}}
{{- end -}}

{{/* The gateway's config file when several backends are enabled: one pool per backend, in order. */}}
{{- define "poolgate.config" -}}
# The gateway's config (poolgate serve --config): one model, a pool per enabled backend, tried in this order.
host = "0.0.0.0"
port = {{ .Values.gateway.port }}
worker_token_file = "/var/run/secrets/poolgate/{{ .Values.workerToken.key }}"
{{- if .Values.gateway.grpcPort }}
grpc_port = {{ .Values.gateway.grpcPort }}
{{- end }}
{{- range (include "poolgate.backends" . | fromJsonArray) }}
{{- $b := index $.Values.workers.backends . }}

[[models]]
name = {{ $.Values.model | quote }}
backend = {{ . | quote }}
{{- if $b.maxInFlightPerWorker }}
max_in_flight_per_worker = {{ $b.maxInFlightPerWorker }}
{{- end }}

[[models.remote]]
url = "dns+tcp://{{ include "poolgate.prefix" $ }}-workers-{{ . }}:{{ $.Values.workers.port }}"
{{- end }}
{{- end -}}
