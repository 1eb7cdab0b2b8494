{{/* Names and labels, the prometheus-community way. */}}
{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "outbox-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "outbox-relay.selector" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "outbox-relay.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Whole seconds of a duration like 30s, 2m, 1m30s, 1h or plain seconds. */}}
{{- define "outbox-relay.seconds" -}}
{{- $text := toString . -}}
{{- $total := 0 -}}
{{- if regexMatch "^[0-9]+$" $text -}}
{{- $total = atoi $text -}}
{{- else -}}
{{- range regexFindAll "[0-9]+(ms|h|m|s)" $text -1 -}}
{{- if hasSuffix "ms" . -}}
{{- else if hasSuffix "h" . -}}{{- $total = add $total (mul (atoi (trimSuffix "h" .)) 3600) -}}
{{- else if hasSuffix "m" . -}}{{- $total = add $total (mul (atoi (trimSuffix "m" .)) 60) -}}
{{- else -}}{{- $total = add $total (atoi (trimSuffix "s" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- define "outbox-relay.gracePeriod" -}}
{{- $timeout := include "outbox-relay.seconds" .Values.relay.timeout | atoi -}}
{{- $grace := .Values.relay.terminationGracePeriodSeconds | default (add $timeout 15) | int -}}
{{- if le $grace $timeout -}}
{{- fail (printf "relay.terminationGracePeriodSeconds (%d) must exceed relay.timeout (%ds): in-flight deliveries need time to finish" $grace $timeout) -}}
{{- end -}}
{{- $grace -}}
{{- end -}}

{{- define "outbox-relay.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else if .Values.dev.enabled -}}
{{- printf "%s-dev-database" (include "outbox-relay.fullname" .) -}}
{{- else -}}
{{- printf "%s-database" (include "outbox-relay.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Environment every outbox container shares: the database and logs. */}}
{{- define "outbox-relay.commonEnv" -}}
- name: OUTBOX_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "outbox-relay.databaseSecret" . | quote }}
      key: {{ .Values.database.secretKey | quote }}
{{ include "outbox-relay.sharedEnv" . }}
{{- end -}}

{{/*
The migrate hook's environment: its own credentials (an owner role, with DDL
rights the relays never need) when migrations.existingSecret names them.
*/}}
{{- define "outbox-relay.migrateEnv" -}}
- name: OUTBOX_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.migrations.existingSecret | default (include "outbox-relay.databaseSecret" .) | quote }}
      key: {{ .Values.migrations.secretKey | default .Values.database.secretKey | quote }}
{{ include "outbox-relay.sharedEnv" . }}
{{- end -}}

{{- define "outbox-relay.sharedEnv" -}}
- name: OUTBOX_POOL_SIZE
  value: {{ .Values.database.poolSize | quote }}
- name: OUTBOX_LOG_FORMAT
  value: {{ .Values.relay.logFormat | quote }}
- name: OUTBOX_LEASE
  value: {{ .Values.relay.lease | quote }}
- name: OUTBOX_TIMEOUT
  value: {{ .Values.relay.timeout | quote }}
{{- with .Values.webhook.allow }}
- name: OUTBOX_WEBHOOK_ALLOW
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.nats.allow }}
- name: OUTBOX_NATS_ALLOW
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.amqp.allow }}
- name: OUTBOX_AMQP_ALLOW
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.redis.allow }}
- name: OUTBOX_REDIS_ALLOW
  value: {{ join "," . | quote }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/*
The kopf peering object of this release's controller: release-scoped, so two
releases (even cluster-wide ones) never share one.
*/}}
{{- define "outbox-relay.peering" -}}
{{- .Values.controller.peering | default (list .Release.Namespace (include "outbox-relay.fullname" .) | compact | join "-") | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
OUTBOX_CONTROLLER_GRANTS: controller.grants, plus the release namespace's
grant of each default OutboxTopic's topic (the chart's own resources).
*/}}
{{- define "outbox-relay.grants" -}}
{{- $grants := list -}}
{{- if .Values.defaultTopics.enabled -}}
{{- range .Values.defaultTopics.items -}}
{{- $grants = append $grants (printf "%s=%s" $.Release.Namespace .spec.topic) -}}
{{- end -}}
{{- end -}}
{{- range .Values.controller.grants -}}
{{- $grants = append $grants (printf "%s=%s%s" (.namespace | default $.Release.Namespace) .topics (ternary ":reroute" "" (.reroute | default false))) -}}
{{- end -}}
{{- join "," $grants -}}
{{- end }}
