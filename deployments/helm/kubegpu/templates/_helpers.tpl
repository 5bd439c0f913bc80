{{- define "kubegpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name alone when it already contains the chart name (release "kubegpu" -> "kubegpu"). */}}
{{- define "kubegpu.fullname" -}}
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

{{- define "kubegpu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "kubegpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kubegpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Callers add app.kubernetes.io/component, so the DaemonSets' selectors never overlap. */}}
{{- define "kubegpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubegpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kubegpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The ConfigMap of plugin configs: config.name, or the chart's own for config.map; "" for none. */}}
{{- define "kubegpu.configMapName" -}}
{{- if .Values.config.name }}
{{- .Values.config.name }}
{{- else if .Values.config.map }}
{{- printf "%s-configs" (include "kubegpu.fullname" .) }}
{{- end }}
{{- end }}

{{/* Helpers that answer a yes/no question print "true" or nothing, so `if include ...` reads as it says. */}}
{{- define "kubegpu.hasConfigMap" -}}
{{- if include "kubegpu.configMapName" . }}true{{ end }}
{{- end }}

{{/* NVIDIA's rule: any MIG strategy but none may be in force, whether set here or in a config file. */}}
{{- define "kubegpu.migPossible" -}}
{{- if .Values.migStrategy }}
{{- if ne .Values.migStrategy "none" }}true{{ end }}
{{- else if include "kubegpu.hasConfigMap" . }}true
{{- end }}
{{- end }}

{{/* NVIDIA's rule for SYS_ADMIN: MIG possible, or a device list strategy that may include volume-mounts. */}}
{{- define "kubegpu.requiresCapSysAdmin" -}}
{{- if include "kubegpu.migPossible" . }}true
{{- else if .Values.deviceListStrategy }}
{{- if contains "volume-mounts" .Values.deviceListStrategy }}true{{ end }}
{{- else if include "kubegpu.hasConfigMap" . }}true
{{- end }}
{{- end }}

{{/* NVIDIA's rule for volume-mounts, applied to CDI: a cdi-annotations or cdi-cri device list strategy may be
in force, set here or (deviceListStrategy unset) by a config file. The plugin then writes CDI specs, which
the container runtime reads from the host's /var/run/cdi. */}}
{{- define "kubegpu.cdiPossible" -}}
{{- if .Values.deviceListStrategy }}
{{- if contains "cdi-" .Values.deviceListStrategy }}true{{ end }}
{{- else if include "kubegpu.hasConfigMap" . }}true
{{- end }}
{{- end }}

{{/* The image's non-root user (USER in the Dockerfile), for the containers that need no uid 0. */}}
{{- define "kubegpu.nonRootUser" -}}
65532
{{- end }}

{{/* Container security context of the node daemons: the value verbatim, else NVIDIA's rules (kubegpu
keeps the root filesystem read-only and privilege escalation off wherever NVIDIA drops capabilities).
Arguments: root, securityContext (the value), passDeviceSpecs (privileged with compatWithCPUManager: the
plugin, which passes every device node's spec; the labels daemon passes none). */}}
{{- define "kubegpu.securityContext" -}}
{{- if .securityContext }}
{{- toYaml .securityContext }}
{{- else if and .passDeviceSpecs .root.Values.compatWithCPUManager }}
privileged: true
{{- else }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- if include "kubegpu.requiresCapSysAdmin" .root }}
  add: [SYS_ADMIN]
  {{- end }}
{{- end }}
{{- end }}

{{/*
The config-manager, as an init container (oneshot: the first config is in place before
the daemon starts) or a sidecar (follows the node label and sends the daemon SIGHUP). Env vars are
NVIDIA's config-manager's. It needs no capabilities: it reads Nodes from the API, the ConfigMap volume, and
points a symlink in the shared emptyDir (mode 0777) at the selected config.
Arguments: root, name, oneshot, process (the process to signal; "" for none).
*/}}
{{- define "kubegpu.configManager" -}}
- name: {{ .name }}
  image: {{ include "kubegpu.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: [kubegpu, config-manager]
  env:
    - name: ONESHOT
      value: {{ .oneshot | quote }}
    - name: KUBECONFIG
      value: ""
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: NODE_LABEL
      value: nvidia.com/device-plugin.config
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ .root.Values.config.default | quote }}
    - name: FALLBACK_STRATEGIES
      value: {{ join "," .root.Values.config.fallbackStrategies | quote }}
    - name: SEND_SIGNAL
      value: {{ ne .process "" | quote }}
    - name: SIGNAL
      value: {{ if .process }}"1"{{ else }}""{{ end }}
    {{- if .process }}
    # Matched like NVIDIA's, against argv[0] and, for a Python program, its script or `-m` module.
    {{- end }}
    - name: PROCESS_TO_SIGNAL
      value: {{ .process | quote }}
  securityContext:
    {{- if .process }}
    # The pod's user (uid 0), as the daemon it signals: without CAP_KILL a process may signal only
    # processes of its own uid, and a non-root container holds no capabilities (none are ambient).
    {{- else }}
    # Signals nothing: the image's non-root user.
    runAsNonRoot: true
    runAsUser: {{ include "kubegpu.nonRootUser" .root }}
    runAsGroup: {{ include "kubegpu.nonRootUser" .root }}
    {{- end }}
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
    - name: config
      mountPath: /config
  {{- with .root.Values.configManager.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* Pod-level settings shared by the node daemons, with the service account of the config-manager. */}}
{{- define "kubegpu.podSpecCommon" -}}
{{ include "kubegpu.podSpecBase" . }}
{{- if include "kubegpu.hasConfigMap" . }}
serviceAccountName: {{ include "kubegpu.fullname" . }}-service-account
{{- else }}
# Nothing here talks to the API server: no token in the pod.
automountServiceAccountToken: false
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the node daemons, but the service account. */}}
{{- define "kubegpu.podSpecBase" -}}
{{- if .Values.priorityClassName }}
priorityClassName: {{ .Values.priorityClassName }}
{{- end }}
{{- if .Values.runtimeClassName }}
runtimeClassName: {{ .Values.runtimeClassName }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The labels daemon publishes its labels as the node's NodeFeature object through the API server
(gfd.useNodeFeatureAPI, GFD's default), rather than into NFD's features.d directory on the host. */}}
{{- define "kubegpu.labelsUseAPI" -}}
{{- if and .Values.gfd.enabled .Values.gfd.useNodeFeatureAPI }}true{{ end }}
{{- end }}

{{/* The labels pods call the API server: for the NodeFeature object, or with the config-manager. They
get their own service account, so that only they may write NodeFeatures. */}}
{{- define "kubegpu.labelsServiceAccount" -}}
{{- if and .Values.gfd.enabled (or (include "kubegpu.labelsUseAPI" .) (include "kubegpu.hasConfigMap" .)) }}
{{- include "kubegpu.fullname" . }}-labels
{{- end }}
{{- end }}

{{- define "kubegpu.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "kubegpu.podAnnotations" -}}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- if .Values.config.map }}
# Rolls the pods when the chart's configs change (the sidecar would also pick them up, more slowly).
checksum/config: {{ .Values.config.map | toJson | sha256sum }}
{{- end }}
{{- end }}

{{/* health.address is a loopback address: the kubelet's httpGet probes, which connect to the pod's IP,
cannot reach it, so the probes run inside the container. */}}
{{- define "kubegpu.healthOnLoopback" -}}
{{- $address := .Values.health.address }}
{{- if kindIs "string" $address }}
{{- if or (hasPrefix "127." $address) (eq $address "::1") (eq $address "localhost") }}true{{ end }}
{{- end }}
{{- end }}

{{/* An exec probe that GETs one path of the HTTP endpoint on a loopback address; any answer but 2xx (or
none) fails it with the URL, the error and the endpoint's own explanation. No proxy: the env may name one.
Arguments: root, path. */}}
{{- define "kubegpu.loopbackProbe" -}}
{{- $address := .root.Values.health.address }}
{{- $host := ternary (printf "[%s]" $address) $address (contains ":" $address) }}
exec:
  command:
    - python
    - -c
    - |
      import sys, urllib.request
      url = sys.argv[1]
      try:
          urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=4).close()
      except OSError as err:
          body = err.read().decode(errors="replace") if hasattr(err, "read") else ""
          sys.exit(f"GET {url}: {err}\n{body}")
    - http://{{ $host }}:{{ .root.Values.health.port }}{{ .path }}
{{- end }}

{{/* The DRA driver's service account: the one subject of its RBAC and of the ResourceSlice policy. */}}
{{- define "kubegpu.draServiceAccount" -}}
{{- include "kubegpu.fullname" . }}-dra
{{- end }}

{{/* The resource.k8s.io version of the DeviceClasses: the newest the cluster serves (v1 from 1.34,
v1beta2 in 1.33, v1beta1 in 1.32); v1 when helm cannot ask (helm template without --api-versions).
A DeviceClass's spec is the same in all three. */}}
{{- define "kubegpu.resourceAPIVersion" -}}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" }}resource.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2/DeviceClass" }}resource.k8s.io/v1beta2
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1/DeviceClass" }}resource.k8s.io/v1beta1
{{- else }}resource.k8s.io/v1
{{- end }}
{{- end }}
