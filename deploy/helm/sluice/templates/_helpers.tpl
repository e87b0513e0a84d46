{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: fullnameOverride, or <release>-<chart> unless the release already holds the chart's name. */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
sluice.config: the configuration file, values.config with what the chart decides written over
it: the listen addresses on every interface at the chart's ports (the probes, the Service and the
annotations use the same ports), the Redis store from values.redis, and the rls files.
*/}}
{{- define "sluice.config" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%v" .Values.ports.proxy) }}
{{- $_ = set $cfg "admin_listen" (printf "0.0.0.0:%v" .Values.ports.admin) }}
{{- if or .Values.redis.addrs .Values.redis.sentinel.master }}
{{- $store := deepCopy (default dict $cfg.store) }}
{{- $_ = set $store "type" "redis" }}
{{- if .Values.redis.sentinel.master }}
{{- $sentinel := dict "master" .Values.redis.sentinel.master "addrs" .Values.redis.sentinel.addrs }}
{{- if .Values.redis.sentinel.existingSecret }}
{{- $_ = set $sentinel "password_env" .Values.redis.sentinel.passwordEnv }}
{{- end }}
{{- $_ = set $store "sentinel" $sentinel }}
{{- $_ = unset $store "addrs" }}
{{- else }}
{{- $_ = set $store "addrs" .Values.redis.addrs }}
{{- $_ = unset $store "sentinel" }}
{{- end }}
{{- $_ = unset $store "url" }}
{{- if .Values.redis.existingSecret }}
{{- $_ = set $store "password_env" .Values.redis.passwordEnv }}
{{- $_ = unset $store "password" }}
{{- end }}
{{- $_ = set $cfg "store" $store }}
{{- end }}
{{- if .Values.adminTLS.existingSecret }}
{{- $admin := deepCopy (default dict $cfg.admin) }}
{{- $tls := dict "cert_file" "/etc/sluice-admin-tls/tls.crt" "key_file" "/etc/sluice-admin-tls/tls.key" }}
{{- if .Values.adminTLS.clientCA }}
{{- $_ = set $tls "client_ca_file" "/etc/sluice-admin-tls/ca.crt" }}
{{- end }}
{{- $_ = set $admin "tls" $tls }}
{{- $_ = set $cfg "admin" $admin }}
{{- end }}
{{- if .Values.rls.enabled }}
{{- $rls := dict "listen" (printf "0.0.0.0:%v" .Values.ports.rls) "envoy_config" (keys .Values.rls.envoyConfig | sortAlpha) }}
{{- $_ = set $cfg "rls" $rls }}
{{- else }}
{{- $_ = unset $cfg "rls" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* sluice.validate fails the render on values that cannot work. */}}
{{- define "sluice.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.redis.addrs) (not .Values.redis.sentinel.master) }}
{{- fail "replicaCount > 1 needs redis.addrs or redis.sentinel: without the redis store each pod counts separately" }}
{{- end }}
{{- if and .Values.redis.sentinel.master (not .Values.redis.sentinel.addrs) }}
{{- fail "redis.sentinel.master needs redis.sentinel.addrs: the sentinels to ask for the primary" }}
{{- end }}
{{- if and .Values.rls.enabled (not .Values.rls.envoyConfig) }}
{{- fail "rls.enabled needs rls.envoyConfig: at least one envoyproxy/ratelimit file" }}
{{- end }}
{{- if hasKey .Values.rls.envoyConfig "sluice.yaml" }}
{{- fail "rls.envoyConfig: \"sluice.yaml\" is the configuration's own file name" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if $pdb.enabled }}
{{- if and (hasKey $pdb "minAvailable") (hasKey $pdb "maxUnavailable") }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" }}
{{- end }}
{{- if and (hasKey $pdb "minAvailable") (ge (int $pdb.minAvailable) (int .Values.replicaCount)) }}
{{- fail "podDisruptionBudget.minAvailable must be less than replicaCount, or no pod may ever be evicted (node drains block)" }}
{{- end }}
{{- if and (hasKey $pdb "maxUnavailable") (lt (int $pdb.maxUnavailable) 1) }}
{{- fail "podDisruptionBudget.maxUnavailable must be at least 1, or no pod may ever be evicted (node drains block)" }}
{{- end }}
{{- end }}
{{- end }}
