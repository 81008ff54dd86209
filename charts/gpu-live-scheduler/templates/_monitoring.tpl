{{/*
The alert rules of files/alerts.yaml with the chart's values applied: the ${name} thresholds
filled in, alerts named in prometheusRule.disabled left out (and GpuScorerInflightAccountingOff
when scorer.podWatch is false: the scorer then runs without in-flight accounting by choice),
prometheusRule.for and alertLabels applied, and a runbook_url per alert. The PrometheusRule's
spec, and (rendered with the chart's defaults) prometheus/gpu-live-scheduler.rules.yaml.
*/}}
{{- define "gls.alertRules" -}}
{{- $v := .Values.prometheusRule -}}
{{- $timeout := .Values.scheduler.extender.httpTimeout -}}
{{- $agentStale := include "gls.scorer.staleAfterSeconds" . -}}
{{- if not (kindIs "invalid" $v.agentStaleAfterSeconds) -}}
{{- $agentStale = $v.agentStaleAfterSeconds -}}
{{- end -}}
{{- $params := dict
  "agentStaleAfterSeconds" $agentStale
  "staleAfterSeconds" (include "gls.scorer.staleAfterSeconds" .)
  "staleNodesFraction" $v.staleNodesFraction
  "relistsPerHour" $v.relistsPerHour
  "httpTimeout" $timeout
  "latencyThresholdSeconds" (mulf $v.latencyFractionOfTimeout (include "gls.durationSeconds" $timeout))
-}}
{{- $text := .Files.Get "files/alerts.yaml" -}}
{{- range $name, $value := $params -}}
{{- $text = replace (printf "${%s}" $name) (toString $value) $text -}}
{{- end -}}
{{- with regexFind "\\$\\{[^}]*\\}" $text -}}
{{- fail (printf "files/alerts.yaml: no value for %s" .) -}}
{{- end -}}
{{- $left := $v.disabled -}}
{{- if not .Values.scorer.podWatch -}}
{{- $left = append $left "GpuScorerInflightAccountingOff" -}}
{{- end -}}
{{- $names := list -}}
{{- $groups := list -}}
{{- range (fromYaml $text).groups -}}
{{- $rules := list -}}
{{- range .rules -}}
{{- $names = append $names .alert -}}
{{- if not (has .alert $left) -}}
{{- $rule := deepCopy . -}}
{{- with get $v.for .alert -}}
{{- $_ := set $rule "for" . -}}
{{- end -}}
{{- $_ := set $rule "labels" (merge (deepCopy $v.alertLabels) (default (dict) .labels)) -}}
{{- $_ := set $rule.annotations "runbook_url" (printf "%s#%s" $v.runbookBaseUrl (lower .alert)) -}}
{{- $rules = append $rules $rule -}}
{{- end -}}
{{- end -}}
{{- if $rules -}}
{{- $groups = append $groups (dict "name" .name "rules" $rules) -}}
{{- end -}}
{{- end -}}
{{- range concat $v.disabled (keys $v.for | sortAlpha) -}}
{{- if not (has . $names) -}}
{{- fail (printf "prometheusRule: %q is not an alert of this chart (alerts: %s)" . (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/* Seconds in a Go duration ("2s", "500ms", "1m30s"), as a number. */}}
{{- define "gls.durationSeconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" . -1 -}}
{{- $number := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf (float64 $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The scorer's stale-after in seconds: its own value, or three agent heartbeats. */}}
{{- define "gls.scorer.staleAfterSeconds" -}}
{{- if kindIs "invalid" .Values.scorer.staleAfterSeconds -}}
{{- mulf 3 .Values.agent.heartbeatSeconds -}}
{{- else -}}
{{- .Values.scorer.staleAfterSeconds -}}
{{- end -}}
{{- end -}}
