{{/*
The alert rules of this release: every selector names the release's own jobs
(the metrics Services, which Prometheus names the scrape jobs after) and
namespace, so a nameOverride or a second release in another namespace pages
for itself. The PrometheusRule renders them and k8s/prometheusrule.yaml is
rendered from the chart. Runbooks: docs/operators/runbooks.md.
*/}}
{{- define "outbox-relay.alertGroups" -}}
{{- $relays := printf "job=\"%s-metrics\", namespace=\"%s\"" (include "outbox-relay.fullname" .) .Release.Namespace -}}
{{- $controller := printf "job=\"%s-controller-metrics\", namespace=\"%s\"" (include "outbox-relay.fullname" .) .Release.Namespace -}}
{{- $runbooks := "https://github.com/outbox-relay/outbox-relay/blob/main/docs/operators/runbooks.md" -}}
- name: outbox-relay
  rules:
    # The buried gauge counts what the table holds, so it catches a topic's
    # first burial even when its series is born at 1 (a new topic, a new
    # pod), and pod restarts do not reset it.
    - alert: OutboxMessagesBuried
      expr: |
        max by (namespace, topic) (outbox_buried_messages{ {{- $relays -}} })
          > (
            max by (namespace, topic) (outbox_buried_messages{ {{- $relays -}} } offset 10m)
              or
            max by (namespace, topic) (outbox_buried_messages{ {{- $relays -}} }) * 0
          )
      labels:
        severity: warning
      annotations:
        summary: "Messages of topic {{ "{{" }} $labels.topic {{ "}}" }} were buried"
        description: >-
          Messages of topic {{ "{{" }} $labels.topic {{ "}}" }} were buried in the last 10 minutes
          ({{ "{{" }} $value {{ "}}" }} buried now): they will not be delivered until someone
          requeues them. `outbox buried list --topic {{ "{{" }} $labels.topic {{ "}}" }}` shows
          them and why.
        runbook_url: {{ $runbooks }}#outboxmessagesburied
    - alert: OutboxBuriedMessagesUnattended
      expr: max by (namespace, topic) (outbox_buried_messages{ {{- $relays -}} }) > 0
      for: 2h
      labels:
        severity: info
      annotations:
        summary: "Buried messages of topic {{ "{{" }} $labels.topic {{ "}}" }} wait for an operator"
        description: >-
          {{ "{{" }} $value {{ "}}" }} buried messages of topic {{ "{{" }} $labels.topic {{ "}}" }}
          have waited for over two hours: requeue them once the cause is fixed, or purge them.
        runbook_url: {{ $runbooks }}#outboxburiedmessagesunattended
    - alert: OutboxMessagesDropped
      expr: |
        sum by (namespace, topic, reason) (increase(outbox_dropped_total{ {{- $relays -}} }[10m])) > 0
          or
        (
          sum by (namespace, topic, reason) (outbox_dropped_total{ {{- $relays -}} }) > 0
            unless
          sum by (namespace, topic, reason) (outbox_dropped_total{ {{- $relays -}} } offset 10m)
        )
      labels:
        severity: warning
      annotations:
        summary: "Messages of topic {{ "{{" }} $labels.topic {{ "}}" }} were dropped ({{ "{{" }} $labels.reason {{ "}}" }})"
        description: >-
          Messages of topic {{ "{{" }} $labels.topic {{ "}}" }} were acked unsent in the last 10
          minutes because they were {{ "{{" }} $labels.reason {{ "}}" }} when their turn came:
          their recipients got nothing. Deliveries are running late.
        runbook_url: {{ $runbooks }}#outboxmessagesdropped
    - alert: OutboxBacklogStale
      expr: max by (namespace, topic) (outbox_oldest_pending_age_seconds{ {{- $relays -}} }) > 900
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: "Topic {{ "{{" }} $labels.topic {{ "}}" }} has a message waiting for over 15 minutes"
        description: >-
          The oldest pending message of topic {{ "{{" }} $labels.topic {{ "}}" }} is
          {{ "{{" }} $value | humanizeDuration {{ "}}" }} old: the topic is paused, its handler
          keeps failing, no relay serves it, or the relays cannot keep up.
        runbook_url: {{ $runbooks }}#outboxbacklogstale
    # A snapshot held open (a report, pg_dump, a standby's feedback, a session
    # idle in transaction, a prepared transaction) keeps vacuum from removing
    # what the outbox deleted: every claim walks past it, and the relays fall
    # behind after a few minutes at a high rate.
    - alert: OutboxSnapshotHeld
      expr: max by (namespace) (outbox_oldest_snapshot_age_seconds{ {{- $relays -}} }) > 300
      for: 2m
      labels:
        severity: warning
      annotations:
        summary: "A snapshot held for over 5 minutes keeps the outbox from being vacuumed"
        description: >-
          The oldest snapshot in the outbox's database is
          {{ "{{" }} $value | humanizeDuration {{ "}}" }} old: nothing the relays deleted since
          it began can be vacuumed, so claims slow down and the tables grow. The runbook's
          query names the session that holds it.
        runbook_url: {{ $runbooks }}#outboxsnapshotheld
    # A key's first message is buried (on a topic that blocks) or keeps
    # failing: the key's later messages wait, however healthy the topic looks.
    - alert: OutboxKeyBlocked
      expr: max by (namespace, topic) (outbox_oldest_blocked_key_age_seconds{ {{- $relays -}} }) > 600
      for: 5m
      labels:
        severity: warning
      annotations:
        summary: "Keys of topic {{ "{{" }} $labels.topic {{ "}}" }} are blocked"
        description: >-
          A key of topic {{ "{{" }} $labels.topic {{ "}}" }} has waited
          {{ "{{" }} $value | humanizeDuration {{ "}}" }} behind a buried or failing first
          message: its later messages are not delivered. `outbox keys blocked --topic
          {{ "{{" }} $labels.topic {{ "}}" }}` names the keys and their heads.
        runbook_url: {{ $runbooks }}#outboxkeyblocked
    # Fires within about two minutes: with the defaults a failing message is
    # buried after eight attempts in about two minutes, and this should say
    # so while there is still time to pause the topic.
    - alert: OutboxDeliveriesFailing
      expr: |
        sum by (namespace, topic) (rate(outbox_retried_total{ {{- $relays -}} }[2m]))
          /
        (sum by (namespace, topic) (rate(outbox_retried_total{ {{- $relays -}} }[2m]))
          + sum by (namespace, topic) (rate(outbox_delivered_total{ {{- $relays -}} }[2m])))
          > 0.5
      for: 1m
      labels:
        severity: warning
      annotations:
        summary: "Most deliveries of topic {{ "{{" }} $labels.topic {{ "}}" }} fail"
        description: >-
          {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the delivery attempts of topic
          {{ "{{" }} $labels.topic {{ "}}" }} failed over the last 2 minutes; messages are buried
          once they run out of attempts. Pause the topic if the receiver will be down for long.
        runbook_url: {{ $runbooks }}#outboxdeliveriesfailing
    - alert: OutboxDatabaseUnreachable
      expr: max by (namespace) (outbox_database_up{ {{- $relays -}} }) == 0
      for: 2m
      labels:
        severity: critical
      annotations:
        summary: "No outbox relay reaches the database"
        description: >-
          Every relay of {{ "{{" }} $labels.namespace {{ "}}" }} has failed to reach PostgreSQL
          for 2 minutes: nothing is delivered, and the backlog gauges are frozen.
        runbook_url: {{ $runbooks }}#outboxdatabaseunreachable
    - alert: OutboxRelaysNotPolling
      expr: time() - max by (namespace) (outbox_last_poll_timestamp_seconds{ {{- $relays -}} }) > 300
      for: 2m
      labels:
        severity: critical
      annotations:
        summary: "No outbox relay has claimed messages for 5 minutes"
        description: >-
          The relays of {{ "{{" }} $labels.namespace {{ "}}" }} are scraped but none has claimed
          for {{ "{{" }} $value | humanizeDuration {{ "}}" }}: a stuck loop or a database that
          hangs rather than refuses.
        runbook_url: {{ $runbooks }}#outboxrelaysnotpolling
    - alert: OutboxRelaysAbsent
      expr: absent(up{ {{- $relays -}} } == 1)
      for: 5m
      labels:
        severity: critical
        namespace: {{ .Release.Namespace }}
      annotations:
        summary: "No outbox relay of {{ include "outbox-relay.fullname" . }} is up"
        description: >-
          Prometheus has scraped no healthy relay of release {{ .Release.Name }} in namespace
          {{ .Release.Namespace }} for 5 minutes: nothing is being delivered, and the other
          outbox alerts cannot fire.
        runbook_url: {{ $runbooks }}#outboxrelaysabsent
    {{- if .Values.controller.enabled }}
    - alert: OutboxControllerAbsent
      expr: absent(up{ {{- $controller -}} } == 1)
      for: 10m
      labels:
        severity: warning
        namespace: {{ .Release.Namespace }}
      annotations:
        summary: "The OutboxTopic controller of {{ include "outbox-relay.fullname" . }} is down"
        description: >-
          Prometheus has scraped no controller of release {{ .Release.Name }} in namespace
          {{ .Release.Namespace }} for 10 minutes: `kubectl edit outboxtopic` changes nothing
          until it is back (relays keep delivering with the registry as it is).
        runbook_url: {{ $runbooks }}#outboxcontrollerabsent
    {{- end }}
{{- end }}
