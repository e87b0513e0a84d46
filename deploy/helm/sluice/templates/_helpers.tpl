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
{{- if .Values.adminToken.enabled }}
{{- $admin := deepCopy (default dict $cfg.admin) }}
{{- $_ = set $admin "token_env" .Values.adminToken.env }}
{{- $_ = set $cfg "admin" $admin }}
{{- end }}
{{- if include "sluice.metricsListen" . }}
{{- $admin := deepCopy (default dict $cfg.admin) }}
{{- $_ = set $admin "metrics_listen" (printf "0.0.0.0:%v" .Values.ports.metrics) }}
{{- $_ = set $cfg "admin" $admin }}
{{- end }}
{{- if .Values.rls.enabled }}
{{- $rls := dict "listen" (printf "0.0.0.0:%v" .Values.ports.rls) }}
{{- if .Values.rls.envoyConfig }}
{{- $_ = set $rls "envoy_config" (keys .Values.rls.envoyConfig | sortAlpha) }}
{{- end }}
{{- if .Values.rls.quota }}
{{- $_ = set $rls "quota" .Values.rls.quota }}
{{- end }}
{{- $_ = set $cfg "rls" $rls }}
{{- else }}
{{- $_ = unset $cfg "rls" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
sluice.metricsListen: "true" when the configuration has admin.metrics_listen (then on
ports.metrics), which the admin token implies: Prometheus scrapes /metrics there without it.
*/}}
{{- define "sluice.metricsListen" -}}
{{- if .Values.adminToken.enabled }}true
{{- else if and (kindIs "map" .Values.config) (kindIs "map" .Values.config.admin) }}
{{- if .Values.config.admin.metrics_listen }}true{{ end }}
{{- end }}
{{- end }}

{{/* sluice.adminTokenSecret: the Secret holding the admin token: adminToken.existingSecret, or the chart's. */}}
{{- define "sluice.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "sluice.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/* sluice.memoryStore: "true" when the configuration asks for the memory store explicitly. */}}
{{- define "sluice.memoryStore" -}}
{{- if and (kindIs "map" .Values.config) (kindIs "map" .Values.config.store) }}
{{- if eq (toString .Values.config.store.type) "memory" }}true{{ end }}
{{- end }}
{{- end }}

{{/*
sluice.scrape: where Prometheus reads /metrics, as "port scheme": the plain metrics_listen port
when there is one, else the admin port, over HTTPS when adminTLS is on.
*/}}
{{- define "sluice.scrape" -}}
{{- if include "sluice.metricsListen" . }}metrics http
{{- else if .Values.adminTLS.existingSecret }}admin https
{{- else }}admin http
{{- end }}
{{- end }}

{{/* sluice.onError: the configuration's store.on_error, fail-closed when unset. */}}
{{- define "sluice.onError" -}}
{{- $store := dict }}
{{- if and (kindIs "map" .Values.config) (kindIs "map" .Values.config.store) }}{{ $store = .Values.config.store }}{{ end }}
{{- default "fail-closed" $store.on_error }}
{{- end }}

{{/*
sluice.readinessPath: probes.readinessPath, or by the failure mode: /readyz (503 while the store
cannot decide) with fail-closed, where a pod without its store refuses every request anyway;
/healthz with fail-open and local, where a pod still answers in a defined way during a Redis
outage and must stay in the Service (with /readyz every pod would leave it at once).
*/}}
{{- define "sluice.readinessPath" -}}
{{- if .Values.probes.readinessPath }}{{ .Values.probes.readinessPath }}
{{- else if has (include "sluice.onError" .) (list "fail-open" "local") }}/healthz
{{- else }}/readyz
{{- end }}
{{- end }}

{{/* sluice.seconds: a Go duration ("30s", "1m30s", "500ms") as whole seconds, rounded up. */}}
{{- define "sluice.seconds" -}}
{{- $ms := 0.0 }}
{{- range regexFindAll "[0-9.]+(ms|h|m|s)" (toString .) -1 }}
{{- $n := float64 (regexFind "^[0-9.]+" .) }}
{{- $unit := regexFind "(ms|h|m|s)$" . }}
{{- $ms = addf $ms (mulf $n (get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit)) }}
{{- end }}
{{- ceil (divf $ms 1000) | int }}
{{- end }}

{{/*
sluice.drainSeconds: how long sluice may take from SIGTERM to its exit: the configuration's
server.shutdown_delay (0 when unset) and server.drain_timeout (30 when unset), in seconds.
*/}}
{{- define "sluice.drainSeconds" -}}
{{- $server := dict }}
{{- if and (kindIs "map" .Values.config) (kindIs "map" .Values.config.server) }}{{ $server = .Values.config.server }}{{ end }}
{{- $drain := 30 }}
{{- if hasKey $server "drain_timeout" }}{{ $drain = int (include "sluice.seconds" $server.drain_timeout) }}{{ end }}
{{- $delay := 0 }}
{{- if hasKey $server "shutdown_delay" }}{{ $delay = int (include "sluice.seconds" $server.shutdown_delay) }}{{ end }}
{{- add $drain $delay }}
{{- end }}

{{/*
sluice.terminationGrace: terminationGracePeriodSeconds, or the preStop sleep, the drain and 5
seconds to exit: the kubelet's SIGKILL comes that long after the pod began terminating, the
preStop sleep included.
*/}}
{{- define "sluice.terminationGrace" -}}
{{- $need := add (int .Values.lifecycle.preStopSleepSeconds) (int (include "sluice.drainSeconds" .)) 5 }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}{{ $need }}
{{- else }}{{ .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
sluice.bytes: a Kubernetes memory quantity (268435456, 256Mi, 1Gi, 500M, 0.5Gi) in bytes; ""
for one it does not read.
*/}}
{{- define "sluice.bytes" -}}
{{- $q := toString . }}
{{- $units := dict "" 1 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?(k|K|M|G|T|Ki|Mi|Gi|Ti)?$" $q }}
{{- mulf (float64 (regexFind "^[0-9.]+" $q)) (get $units (regexFind "[a-zA-Z]*$" $q)) | floor | int64 }}
{{- end }}
{{- end }}

{{/* sluice.pdbSet: "true" when a PodDisruptionBudget field (minAvailable, maxUnavailable) is set. */}}
{{- define "sluice.pdbSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") }}true{{ end }}
{{- end }}

{{/*
sluice.goMemLimit: GOMEMLIMIT in bytes, goMemLimitPercent of the memory limit, so that the
garbage collector works harder before the kernel kills the container; "" without a limit.
*/}}
{{- define "sluice.goMemLimit" -}}
{{- $memory := dig "limits" "memory" "" .Values.resources }}
{{- if and .Values.goMemLimitPercent $memory }}
{{- divf (mulf (float64 (include "sluice.bytes" $memory)) .Values.goMemLimitPercent) 100 | floor | int64 }}
{{- end }}
{{- end }}

{{/* sluice.minReplicas: the fewest pods there are: replicaCount, or autoscaling.minReplicas. */}}
{{- define "sluice.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.minReplicas }}{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{/* sluice.serviceAccountName: the ServiceAccount the pods run as. */}}
{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}{{ default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* sluice.validate fails the render on values that cannot work. */}}
{{- define "sluice.validate" -}}
{{- $cfg := .Values.config }}
{{- if not (kindIs "map" $cfg) }}
{{- fail "config must be a mapping: sluice's configuration (docs/config.md), at least config.upstream" }}
{{- end }}
{{- if not $cfg.upstream }}
{{- fail "config.upstream is required: the URL of your API, where allowed requests go, e.g. --set config.upstream=http://my-api.default:8080" }}
{{- end }}
{{- if not (kindIs "string" $cfg.upstream) }}
{{- fail (printf "config.upstream must be a URL string (e.g. http://my-api.default:8080), not %v" $cfg.upstream) }}
{{- end }}
{{- if regexMatch "^https?://my-api(:8080)?/?$" $cfg.upstream }}
{{- fail (printf "config.upstream %s is the example's placeholder: set the URL of your API, e.g. http://my-api.default:8080" $cfg.upstream) }}
{{- end }}
{{- $memory := include "sluice.memoryStore" . }}
{{- if and (not .Values.redis.addrs) (not .Values.redis.sentinel.master) (not $memory) }}
{{- fail "redis.addrs or redis.sentinel is required: the Redis every replica counts on, e.g. --set 'redis.addrs={redis-master.default:6379}' (without it each pod would count separately); one pod alone may take config.store.type: memory with replicaCount: 1" }}
{{- end }}
{{- if and $memory (or .Values.redis.addrs .Values.redis.sentinel.master) }}
{{- fail "config.store.type: memory and redis.addrs/redis.sentinel exclude each other: leave out config.store.type for the Redis store" }}
{{- end }}
{{- if and $memory (or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled) }}
{{- fail "config.store.type: memory needs replicaCount: 1 and autoscaling.enabled: false: with more pods each would count separately; set redis.addrs or redis.sentinel" }}
{{- end }}
{{- if and .Values.adminTLS.clientCA (not .Values.adminTLS.existingSecret) }}
{{- fail "adminTLS.clientCA needs adminTLS.existingSecret: the kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt (without it the admin port would serve plain HTTP)" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.adminTLS.clientCA (eq (include "sluice.scrape" .) "admin https") }}
{{- $tc := default dict .Values.serviceMonitor.tlsConfig }}
{{- if not (and $tc.cert $tc.keySecret) }}
{{- fail "serviceMonitor with adminTLS.clientCA scrapes /metrics over mTLS: serviceMonitor.tlsConfig needs cert and keySecret (a client certificate of ca.crt), or serve /metrics on the plain metrics port (adminToken.enabled, or config.admin.metrics_listen: on)" }}
{{- end }}
{{- end }}
{{- if hasKey $cfg "tls" }}
{{- fail "config.tls: the chart mounts no certificate for the proxy listener; terminate TLS in front of it (an ingress or load balancer)" }}
{{- end }}
{{- if and (kindIs "map" $cfg.admin) (hasKey $cfg.admin "tls") }}
{{- fail "config.admin.tls: set adminTLS.existingSecret (the chart mounts that Secret and writes admin.tls)" }}
{{- end }}
{{- if hasKey $cfg "rls" }}
{{- fail "config.rls: set rls.enabled, rls.envoyConfig and rls.quota instead (the chart writes the rls section; rls.tls and rls.xds are not supported by the chart)" }}
{{- end }}
{{- if and .Values.adminToken.enabled (not .Values.adminToken.env) }}
{{- fail "adminToken.env is required with adminToken.enabled: the environment variable that carries the token (e.g. SLUICE_ADMIN_TOKEN)" }}
{{- end }}
{{- if and .Values.adminToken.enabled (not .Values.adminToken.secretKey) }}
{{- fail "adminToken.secretKey is required with adminToken.enabled: the Secret's key that holds the token (e.g. token)" }}
{{- end }}
{{- if and .Values.redis.sentinel.master (not .Values.redis.sentinel.addrs) }}
{{- fail "redis.sentinel.master needs redis.sentinel.addrs: the sentinels to ask for the primary" }}
{{- end }}
{{- if and .Values.rls.enabled (not .Values.rls.envoyConfig) (not .Values.rls.quota) }}
{{- fail "rls.enabled needs rls.envoyConfig (at least one envoyproxy/ratelimit file) or rls.quota (the quota service's buckets)" }}
{{- end }}
{{- if hasKey .Values.rls.envoyConfig "sluice.yaml" }}
{{- fail "rls.envoyConfig: \"sluice.yaml\" is the configuration's own file name" }}
{{- end }}
{{- $replicas := int (include "sluice.minReplicas" .) }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "autoscaling.maxReplicas must be at least autoscaling.minReplicas" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if $pdb.enabled }}
{{- $min := include "sluice.pdbSet" $pdb.minAvailable }}
{{- $max := include "sluice.pdbSet" $pdb.maxUnavailable }}
{{- if and $min $max }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" }}
{{- end }}
{{- if $min }}
{{- $v := toString $pdb.minAvailable }}
{{- if hasSuffix "%" $v }}
{{- if ge (int (trimSuffix "%" $v)) 100 }}
{{- fail "podDisruptionBudget.minAvailable must be less than 100%, or no pod may ever be evicted (node drains block)" }}
{{- end }}
{{- else if ge (int $v) $replicas }}
{{- fail "podDisruptionBudget.minAvailable must be less than replicaCount (autoscaling.minReplicas with autoscaling), or no pod may ever be evicted (node drains block)" }}
{{- end }}
{{- end }}
{{- if $max }}
{{- if lt (int (trimSuffix "%" (toString $pdb.maxUnavailable))) 1 }}
{{- fail "podDisruptionBudget.maxUnavailable must be at least 1 (or 1%), or no pod may ever be evicted (node drains block)" }}
{{- end }}
{{- end }}
{{- end }}
{{- if lt (int (include "sluice.terminationGrace" .)) (add (int .Values.lifecycle.preStopSleepSeconds) (int (include "sluice.drainSeconds" .))) }}
{{- fail (printf "terminationGracePeriodSeconds %v is shorter than lifecycle.preStopSleepSeconds (%v) and server.drain_timeout (%vs): requests in flight would be killed; leave it null to compute it" .Values.terminationGracePeriodSeconds .Values.lifecycle.preStopSleepSeconds (include "sluice.drainSeconds" .)) }}
{{- end }}
{{- $memory := dig "limits" "memory" "" .Values.resources }}
{{- if and .Values.goMemLimitPercent $memory (not (include "sluice.bytes" $memory)) }}
{{- fail (printf "resources.limits.memory %q: not a quantity the chart reads for GOMEMLIMIT (write it as 256Mi, 1Gi or bytes), or set goMemLimitPercent: 0" (toString $memory)) }}
{{- end }}
{{- end }}
