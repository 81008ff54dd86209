{{/*
Names, labels and the few derived values that more than one template needs.
*/}}

{{- define "gls.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name; component names append a suffix, so keep room for it. */}}
{{- define "gls.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gls.agent.fullname" -}}{{ include "gls.fullname" . }}-agent{{- end -}}
{{- define "gls.scorer.fullname" -}}{{ include "gls.fullname" . }}-scorer{{- end -}}
{{- define "gls.scheduler.fullname" -}}{{ include "gls.fullname" . }}-scheduler{{- end -}}

{{- define "gls.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gls.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "root" $ "component" "agent"). */}}
{{- define "gls.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gls.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gls.componentLabels" -}}
{{ include "gls.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The one image both binaries ship in; a digest wins over a tag. */}}
{{- define "gls.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
kube-scheduler must not be newer than the API server and should match its minor version, so an
empty tag means the cluster's own version (vendor suffixes such as -eks-... dropped).
*/}}
{{- define "gls.scheduler.image" -}}
{{- $img := .Values.scheduler.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else if $img.tag -}}
{{- printf "%s:%s" $img.repository $img.tag -}}
{{- else -}}
{{- $v := regexFind "[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- printf "%s:v%s" $img.repository $v -}}
{{- end -}}
{{- end -}}

{{/* The annotation prefix with exactly one trailing slash, as both binaries normalise it. */}}
{{- define "gls.annotationPrefix" -}}
{{- printf "%s/" (trimSuffix "/" .Values.annotationPrefix) -}}
{{- end -}}

{{- define "gls.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "gls.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gls.scorer.serviceAccountName" -}}
{{- if .Values.scorer.serviceAccount.create -}}
{{- default (include "gls.scorer.fullname" .) .Values.scorer.serviceAccount.name -}}
{{- else -}}
{{- required "scorer.serviceAccount.name is required when scorer.serviceAccount.create is false" .Values.scorer.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gls.scheduler.serviceAccountName" -}}
{{- if .Values.scheduler.serviceAccount.create -}}
{{- default (include "gls.scheduler.fullname" .) .Values.scheduler.serviceAccount.name -}}
{{- else -}}
{{- required "scheduler.serviceAccount.name is required when scheduler.serviceAccount.create is false" .Values.scheduler.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gls.scheduler.leaseName" -}}
{{- default (include "gls.scheduler.fullname" .) .Values.scheduler.leaderElection.resourceName -}}
{{- end -}}

{{/* Whether a tenant profile chooses by namespace labels: the scorer then watches Namespaces. */}}
{{- define "gls.scorer.readsNamespaces" -}}
{{- range (.Values.scorer.policy.profiles | default list) -}}
{{- if hasKey . "namespace-selector" -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the scorer talks to the API server at all: its Node watch (names-only mode), its
Pod watch (in-flight accounting), its Namespace watch (profiles chosen by namespace labels) or
its DRA watch. (Full-node mode's learning Node watch needs the Pod watch, so it is covered.)
Only then does it get RBAC and a service account token. */}}
{{- define "gls.scorer.needsApi" -}}
{{- if or .Values.scorer.nodeCache .Values.scorer.podWatch (include "gls.scorer.readsNamespaces" .) .Values.scorer.dra.enabled -}}true{{- end -}}
{{- end -}}

{{- define "gls.scorer.sidecar" -}}
{{- if eq .Values.scorer.mode "sidecar" -}}true{{- end -}}
{{- end -}}

{{/* Path prefix with a leading slash and no trailing one ("" for the root). */}}
{{- define "gls.scorer.pathPrefix" -}}
{{- $p := trimSuffix "/" (trimPrefix "/" .Values.scorer.pathPrefix) -}}
{{- if $p -}}/{{ $p }}{{- end -}}
{{- end -}}

{{- define "gls.scorer.host" -}}
{{- if include "gls.scorer.sidecar" . -}}
{{- "127.0.0.1" -}}
{{- else -}}
{{- printf "%s.%s.svc" (include "gls.scorer.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* What kube-scheduler puts before "/<verb>" when it calls the extender. */}}
{{- define "gls.scorer.urlPrefix" -}}
{{- $scheme := ternary "https" "http" .Values.scorer.tls.enabled -}}
{{- printf "%s://%s:%d%s" $scheme (include "gls.scorer.host" .) (int .Values.scorer.port) (include "gls.scorer.pathPrefix" .) -}}
{{- end -}}

{{- define "gls.scorer.tlsServerName" -}}
{{- if .Values.scorer.tls.serverName -}}
{{- .Values.scorer.tls.serverName -}}
{{- else if include "gls.scorer.sidecar" . -}}
{{- "localhost" -}}
{{- else -}}
{{- include "gls.scorer.host" . -}}
{{- end -}}
{{- end -}}

{{/* The Secrets with the scorer's serving certificate and the scheduler's client certificate:
as set, or, when cert-manager issues them, named after the release. */}}
{{- define "gls.scorer.tlsSecretName" -}}
{{- if .Values.scorer.tls.secretName -}}
{{- .Values.scorer.tls.secretName -}}
{{- else if .Values.scorer.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "gls.scorer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gls.scorer.tlsClientSecretName" -}}
{{- if .Values.scorer.tls.clientSecretName -}}
{{- .Values.scorer.tls.clientSecretName -}}
{{- else if .Values.scorer.tls.certManager.enabled -}}
{{- printf "%s-extender-client-tls" (include "gls.scheduler.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Mount points inside the containers. */}}
{{- define "gls.scorer.tlsDir" -}}/etc/gpu-scorer/tls{{- end -}}
{{- define "gls.scorer.policyDir" -}}/etc/gpu-scorer/policy{{- end -}}
{{- define "gls.scheduler.configDir" -}}/etc/kubernetes/gpu-scheduler{{- end -}}
{{- define "gls.scheduler.tlsDir" -}}/etc/kubernetes/gpu-scheduler/extender-tls{{- end -}}

{{/* Where the kubelet's pod-resources directory is mounted in the agent container. */}}
{{- define "gls.agent.podResourcesDir" -}}/var/lib/kubelet/pod-resources{{- end -}}

{{/* Environment of the agent: GPU_AGENT_<FLAG_UPPER_SNAKE>, as `gpu-agent run` reads it. */}}
{{- define "gls.agent.config" -}}
GPU_AGENT_SOURCE: {{ .Values.agent.source | quote }}
GPU_AGENT_SAMPLE_INTERVAL_S: {{ .Values.agent.sampleIntervalSeconds | toString | quote }}
GPU_AGENT_MIN_WRITE_INTERVAL_S: {{ .Values.agent.minWriteIntervalSeconds | toString | quote }}
GPU_AGENT_HEARTBEAT_S: {{ .Values.agent.heartbeatSeconds | toString | quote }}
GPU_AGENT_ANNOTATION_PREFIX: {{ include "gls.annotationPrefix" . | quote }}
GPU_AGENT_METRICS_PORT: {{ .Values.agent.metricsPort | toString | quote }}
GPU_AGENT_LOG_LEVEL: {{ .Values.agent.logLevel | quote }}
GPU_AGENT_LOG_FORMAT: {{ .Values.agent.logFormat | quote }}
GPU_AGENT_POD_RESOURCES: {{ .Values.agent.podResources.enabled | toString | quote }}
GPU_AGENT_DRA_TAINTS: {{ .Values.agent.dra.enabled | toString | quote }}
{{- if .Values.agent.dra.enabled }}
GPU_AGENT_DRA_DRIVER: {{ .Values.agent.dra.driver | quote }}
{{- end }}
{{- if .Values.agent.podResources.enabled }}
GPU_AGENT_POD_RESOURCES_SOCKET: {{ printf "%s/kubelet.sock" (include "gls.agent.podResourcesDir" .) | quote }}
{{- end }}
{{- if and .Values.agent.podResources.enabled .Values.agent.podUsage.processAttribution }}
GPU_AGENT_PROCESS_ATTRIBUTION: "true"
{{- end }}
{{- if eq .Values.agent.source "simulated" }}
GPU_AGENT_SIMULATED_GPUS: {{ .Values.agent.simulated.gpus | toString | quote }}
GPU_AGENT_SIMULATED_MODEL: {{ .Values.agent.simulated.model | quote }}
GPU_AGENT_SEED: {{ .Values.agent.simulated.seed | toString | quote }}
{{- end }}
{{- end -}}

{{/* The GPU resource the scorer counts pods by: its policy's gpu_resource_name, else the
scorer's own default. */}}
{{- define "gls.scorer.gpuResourceName" -}}
{{- get .Values.scorer.policy "gpu_resource_name" | default "nvidia.com/gpu" -}}
{{- end -}}

{{/* A CEL condition on a Pod `object`: a container or an init container names one of the
resources (a JSON list of names) in its requests or its limits, as kube-scheduler decides which
pods go to an extender (managedResources) and as the scorer's Pod watch counts GPU pods. */}}
{{- define "gls.podRequestsCel" -}}
(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, has(c.resources) && ((has(c.resources.requests) && c.resources.requests.exists(r, r in {{ . }})) || (has(c.resources.limits) && c.resources.limits.exists(r, r in {{ . }}))))
{{- end -}}

{{/* Whether the GPU pods are labelled and the scorer's Pod watches select by the label
("true" or empty). */}}
{{- define "gls.gpuPodLabel.enabled" -}}
{{- if and .Values.scorer.enabled .Values.scorer.gpuPodLabel.enabled -}}true{{- end -}}
{{- end -}}

{{/* The label the admission policy sets on GPU pods, and the selector the scorer watches by. */}}
{{- define "gls.gpuPodLabel.key" -}}
{{- printf "%sgpu-pod" (include "gls.annotationPrefix" .) -}}
{{- end -}}
{{- define "gls.gpuPodLabel.selector" -}}
{{- printf "%s=true" (include "gls.gpuPodLabel.key" .) -}}
{{- end -}}

{{/* Environment of the scorer: GPU_SCORER_<FLAG_UPPER_SNAKE>, as `gpu-scorer serve` reads it. */}}
{{/* Trust only the agent's writes: by default exactly when only the agent may write them. */}}
{{- define "gls.scorer.requireAgentWriter" -}}
{{- if kindIs "bool" .Values.scorer.requireAgentWriter -}}
{{- .Values.scorer.requireAgentWriter | toString -}}
{{- else -}}
{{- .Values.gpuDataPolicy.enabled | toString -}}
{{- end -}}
{{- end -}}

{{- define "gls.scorer.config" -}}
GPU_SCORER_HOST: {{ .Values.scorer.host | quote }}
GPU_SCORER_PORT: {{ .Values.scorer.port | toString | quote }}
GPU_SCORER_METRICS_PORT: {{ .Values.scorer.metricsPort | toString | quote }}
GPU_SCORER_PATH_PREFIX: {{ default "/" (include "gls.scorer.pathPrefix" .) | quote }}
GPU_SCORER_NODE_CACHE: {{ .Values.scorer.nodeCache | toString | quote }}
GPU_SCORER_POD_WATCH: {{ .Values.scorer.podWatch | toString | quote }}
{{- if include "gls.gpuPodLabel.enabled" . }}
GPU_SCORER_POD_LABEL_SELECTOR: {{ include "gls.gpuPodLabel.selector" . | quote }}
{{- end }}
{{- if not .Values.scorer.nodeCache }}
GPU_SCORER_OWN_LOAD_NODE_WATCH: {{ .Values.scorer.ownLoadNodeWatch | toString | quote }}
{{- end }}
GPU_SCORER_DRA: {{ .Values.scorer.dra.enabled | toString | quote }}
{{- if .Values.scorer.dra.enabled }}
GPU_SCORER_DRA_DRIVER: {{ .Values.scorer.dra.driver | quote }}
GPU_SCORER_DRA_DEVICE_CLASSES: {{ join "," .Values.scorer.dra.deviceClasses | quote }}
GPU_SCORER_DRA_EXTENDED_RESOURCE: {{ .Values.scorer.dra.extendedResource | toString | quote }}
{{- end }}
GPU_SCORER_LOG_LEVEL: {{ .Values.scorer.logLevel | quote }}
GPU_SCORER_ANNOTATION_PREFIX: {{ include "gls.annotationPrefix" . | quote }}
GPU_SCORER_STALE_AFTER_S: {{ include "gls.scorer.staleAfterSeconds" . | quote }}
GPU_SCORER_REQUIRE_AGENT_WRITER: {{ include "gls.scorer.requireAgentWriter" . | quote }}
{{- if .Values.scorer.policy }}
GPU_SCORER_POLICY_FILE: {{ printf "%s/policy.json" (include "gls.scorer.policyDir" .) | quote }}
{{- end }}
{{- if .Values.scorer.tls.enabled }}
GPU_SCORER_TLS_CERT_FILE: {{ printf "%s/tls.crt" (include "gls.scorer.tlsDir" .) | quote }}
GPU_SCORER_TLS_KEY_FILE: {{ printf "%s/tls.key" (include "gls.scorer.tlsDir" .) | quote }}
{{- if .Values.scorer.tls.clientAuth }}
GPU_SCORER_TLS_CLIENT_CA_FILE: {{ printf "%s/ca.crt" (include "gls.scorer.tlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Probes of the scorer, on its plain-HTTP metrics port: kubelet presents no client
certificate, so with mutual TLS on the extender port that is where /readyz stays reachable. */}}
{{- define "gls.scorer.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.scorer.livenessProbe | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.scorer.readinessProbe | nindent 2 }}
{{- end -}}

{{/* The scorer container, shared by the Deployment and the scheduler's sidecar. */}}
{{- define "gls.scorer.container" -}}
- name: scorer
  image: {{ include "gls.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["gpu-scorer"]
  args:
    - serve
    {{- range .Values.scorer.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  envFrom:
    - configMapRef:
        name: {{ include "gls.scorer.fullname" . }}
  {{- with .Values.scorer.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: http
      containerPort: {{ .Values.scorer.port }}
      protocol: TCP
    - name: metrics
      containerPort: {{ .Values.scorer.metricsPort }}
      protocol: TCP
  {{- include "gls.scorer.probes" . | trim | nindent 2 }}
  resources:
    {{- toYaml .Values.scorer.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.scorer.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- if .Values.scorer.policy }}
    - name: scorer-policy
      mountPath: {{ include "gls.scorer.policyDir" . }}
      readOnly: true
    {{- end }}
    {{- if .Values.scorer.tls.enabled }}
    - name: scorer-tls
      mountPath: {{ include "gls.scorer.tlsDir" . }}
      readOnly: true
    {{- end }}
{{- end -}}

{{- define "gls.scorer.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- if .Values.scorer.policy }}
- name: scorer-policy
  configMap:
    name: {{ include "gls.scorer.fullname" . }}-policy
{{- end }}
{{- if .Values.scorer.tls.enabled }}
- name: scorer-tls
  secret:
    secretName: {{ required "scorer.tls.secretName (or scorer.tls.certManager.enabled) is required when scorer.tls.enabled is true" (include "gls.scorer.tlsSecretName" .) }}
{{- end }}
{{- end -}}

{{/* Fail early on combinations that cannot work. */}}
{{- define "gls.validate" -}}
{{- if and (include "gls.scorer.sidecar" .) (not .Values.scheduler.enabled) -}}
{{- fail "scorer.mode=sidecar runs the scorer inside the chart's kube-scheduler pod: set scheduler.enabled=true, or scorer.mode=deployment" -}}
{{- end -}}
{{- if and .Values.scorer.tls.clientAuth (not .Values.scorer.tls.enabled) -}}
{{- fail "scorer.tls.clientAuth needs scorer.tls.enabled=true" -}}
{{- end -}}
{{- if and .Values.scorer.tls.clientAuth .Values.scheduler.enabled (not (include "gls.scorer.tlsClientSecretName" .)) -}}
{{- fail "scorer.tls.clientAuth needs scorer.tls.clientSecretName (or scorer.tls.certManager.enabled): the Secret with the client certificate (tls.crt, tls.key) kube-scheduler presents to the scorer" -}}
{{- end -}}
{{- if and .Values.scorer.tls.certManager.enabled (not .Values.scorer.tls.certManager.issuerRef.name) -}}
{{- fail "scorer.tls.certManager.enabled needs scorer.tls.certManager.issuerRef.name: the cert-manager Issuer or ClusterIssuer that signs both certificates" -}}
{{- end -}}
{{- $profiles := dict -}}
{{- range $index, $profile := (.Values.scorer.policy.profiles | default list) -}}
{{- if eq .name "default" -}}
{{- fail (printf "scorer.policy.profiles[%d]: the name \"default\" stands for the top-level policy (the namespaces no profile matches); give the profile a name of its own" $index) -}}
{{- end -}}
{{- if hasKey $profiles .name -}}
{{- fail (printf "scorer.policy.profiles: the name %q is used twice; each profile needs a name of its own (the scorer's metrics and logs name the profile a pod got)" .name) -}}
{{- end -}}
{{- $_ := set $profiles .name true -}}
{{- end -}}
{{- range $policy := list "requireScheduler" "restrictScheduler" -}}
{{- $actions := index $.Values.schedulerGuard $policy "validationActions" -}}
{{- if and (has "Deny" $actions) (has "Warn" $actions) -}}
{{- fail (printf "schedulerGuard.%s.validationActions: Deny and Warn cannot be combined (the API server refuses such a binding): [Deny] or [Deny, Audit] to refuse, [Warn, Audit] to warn" $policy) -}}
{{- end -}}
{{- end -}}
{{- if and (include "gls.gpuPodLabel.enabled" .) (not .Values.scorer.podWatch) -}}
{{- fail "scorer.gpuPodLabel narrows the scorer's Pod watch to the labelled GPU pods, and scorer.podWatch=false turns that watch off: set scorer.podWatch=true, or scorer.gpuPodLabel.enabled=false" -}}
{{- end -}}
{{- if and (include "gls.guard.enabled" .) (not .Values.schedulerGuard.namespaceSelector) (gt (len .Values.scheduler.name) 63) -}}
{{- fail (printf "schedulerGuard: the default opt-in label %sscheduler=%s needs a label value of at most 63 characters: set schedulerGuard.namespaceSelector" (include "gls.annotationPrefix" .) .Values.scheduler.name) -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------------ the schedulerName guard */}}

{{/* Whether either guard policy is rendered: they guard this chart's own kube-scheduler. */}}
{{- define "gls.guard.enabled" -}}
{{- if and .Values.scheduler.enabled (or .Values.schedulerGuard.requireScheduler.enabled .Values.schedulerGuard.restrictScheduler.enabled) -}}true{{- end -}}
{{- end -}}

{{/* The namespaces that opt in to the chart's scheduler, as JSON: schedulerGuard.namespaceSelector,
or by default those labelled <annotationPrefix>/scheduler=<scheduler.name>. */}}
{{- define "gls.guard.namespaceSelector" -}}
{{- if .Values.schedulerGuard.namespaceSelector -}}
{{- .Values.schedulerGuard.namespaceSelector | toJson -}}
{{- else -}}
{{- dict "matchLabels" (dict (printf "%sscheduler" (include "gls.annotationPrefix" .)) .Values.scheduler.name) | toJson -}}
{{- end -}}
{{- end -}}

{{/* The opt-in selector in kubectl's -l syntax, for messages: `k=v,k2 in (a,b),k3,!k4`. */}}
{{- define "gls.guard.selectorText" -}}
{{- $selector := include "gls.guard.namespaceSelector" . | fromJson -}}
{{- $terms := list -}}
{{- range $key, $value := ($selector.matchLabels | default dict) -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range ($selector.matchExpressions | default list) -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms .key -}}
{{- else -}}
{{- $terms = append $terms (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{/* The opt-in selector as a CEL condition on `variables.labels` (a namespace's labels), with
Kubernetes' meaning of each operator: NotIn and DoesNotExist hold for a label that is absent.
Label keys and values cannot hold quotes or backslashes, so their JSON strings are CEL strings. */}}
{{- define "gls.guard.selectorCel" -}}
{{- $selector := include "gls.guard.namespaceSelector" . | fromJson -}}
{{- $terms := list -}}
{{- range $key, $value := ($selector.matchLabels | default dict) -}}
{{- $terms = append $terms (printf "(%s in variables.labels && variables.labels[%s] == %s)" (toJson $key) (toJson $key) (toJson $value)) -}}
{{- end -}}
{{- range ($selector.matchExpressions | default list) -}}
{{- $key := toJson .key -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "(%s in variables.labels && variables.labels[%s] in %s)" $key $key (toJson .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "!(%s in variables.labels && variables.labels[%s] in %s)" $key $key (toJson .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms (printf "%s in variables.labels" $key) -}}
{{- else -}}
{{- $terms = append $terms (printf "!(%s in variables.labels)" $key) -}}
{{- end -}}
{{- end -}}
{{- join " && " $terms -}}
{{- end -}}

{{/* Whether the guard holds pods with ResourceClaims to the scheduler ("true" or empty):
schedulerGuard.requireScheduler.resourceClaims, or with it null, scorer.dra.enabled. */}}
{{- define "gls.guard.claims" -}}
{{- $claims := .Values.schedulerGuard.requireScheduler.resourceClaims -}}
{{- if kindIs "invalid" $claims -}}
{{- if .Values.scorer.dra.enabled -}}true{{- end -}}
{{- else if $claims -}}true{{- end -}}
{{- end -}}

{{/* The GPU resources whose pods the guard holds to the scheduler, as a JSON list: the scorer's
GPU resource and every resource kube-scheduler sends to the scorer (managedResources). */}}
{{- define "gls.guard.gpuResources" -}}
{{- $names := list (include "gls.scorer.gpuResourceName" .) -}}
{{- range .Values.scheduler.extender.managedResources -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/*
The KubeSchedulerConfiguration: one profile under its own schedulerName, the scorer registered as
an extender, and a leader-election Lease of its own (never kube-system/kube-scheduler).
*/}}
{{- define "gls.scheduler.config" -}}
{{- $ext := .Values.scheduler.extender -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: {{ .Values.scheduler.leaderElection.enabled }}
  resourceLock: leases
  resourceName: {{ include "gls.scheduler.leaseName" . }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ .Values.scheduler.name }}
extenders:
  - urlPrefix: {{ include "gls.scorer.urlPrefix" . | quote }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ $ext.weight }}
    # Must match the scorer's mode: names only when it keeps its own Node cache.
    nodeCacheCapable: {{ .Values.scorer.nodeCache }}
    ignorable: {{ $ext.ignorable }}
    httpTimeout: {{ $ext.httpTimeout }}
    enableHTTPS: {{ .Values.scorer.tls.enabled }}
    {{- if .Values.scorer.tls.enabled }}
    tlsConfig:
      serverName: {{ include "gls.scorer.tlsServerName" . | quote }}
      caFile: {{ include "gls.scheduler.tlsDir" . }}/ca/ca.crt
      {{- if .Values.scorer.tls.clientAuth }}
      certFile: {{ include "gls.scheduler.tlsDir" . }}/client/tls.crt
      keyFile: {{ include "gls.scheduler.tlsDir" . }}/client/tls.key
      {{- end }}
    {{- end }}
    {{- if .Values.scorer.dra.enabled }}
    # No managedResources: kube-scheduler sends an extender that has them only the pods whose
    # containers request one (HTTPExtender.IsInterested), never a pod that asks through claims.
    {{- else }}
    managedResources:
      {{- toYaml $ext.managedResources | nindent 6 }}
    {{- end }}
{{- end -}}
