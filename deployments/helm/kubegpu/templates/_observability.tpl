{{/* kubegpu's alert rules, as the PrometheusRule's spec; tests/deploy/test_observability.py runs promtool
on them. "rule": .Values.observability.prometheusRule. */}}
{{- define "kubegpu.alertGroups" -}}
groups:
  - name: kubegpu
    rules:
      - alert: KubegpuXidOnAllocatedGpu
        # dcgm-exporter's last-XID series, with the holder's labels from PodResources.
        expr: max by (Hostname, gpu, UUID, namespace, pod, container) (DCGM_FI_DEV_XID_ERRORS{pod!=""}) > 0
        labels:
          severity: critical
        annotations:
          summary: XID {{`{{ $value }}`}} on GPU {{`{{ $labels.gpu }}`}} of {{`{{ $labels.Hostname }}`}}, held by {{`{{ $labels.namespace }}`}}/{{`{{ $labels.pod }}`}}
          description: The GPU reported an XID error while a pod holds it; the pod's work on it may be lost. See the XID catalog (kubegpu explain, docs/troubleshooting.md) for what the code means and whether the GPU needs a reset.
      - alert: KubegpuDevicesUnhealthy
        expr: kubegpu_device_healthy == 0
        for: {{ .rule.unhealthyFor }}
        labels:
          severity: warning
        annotations:
          summary: GPU {{`{{ $labels.uuid }}`}} ({{`{{ $labels.resource }}`}}) has been unhealthy for {{ .rule.unhealthyFor }}
          description: The plugin reports the device Unhealthy to the kubelet, so no new pod gets it. kubegpu doctor on the node says why (XID, lost GPU, pending row remap).
      - alert: KubegpuGpuHeldIdle
        expr: kubegpu_device_idle_seconds > {{ .rule.idleHeldSeconds }}
        labels:
          severity: info
        annotations:
          summary: '{{`{{ $labels.namespace }}`}}/{{`{{ $labels.pod }}`}} has held GPU {{`{{ $labels.gpu }}`}} without using it for {{`{{ $value | humanizeDuration }}`}}'
          description: The GPU's utilisation has not risen above the plugin's --idle-threshold since the pod took it or for longer than {{ .rule.idleHeldSeconds }} s. Another workload could use it.
      - alert: KubegpuPluginNotRegistered
        expr: kubegpu_registered == 0
        for: {{ .rule.notRegisteredFor }}
        labels:
          severity: critical
        annotations:
          summary: The device plugin on {{`{{ $labels.node }}`}} is not registered for {{`{{ $labels.resource }}`}}
          description: The kubelet does not know the plugin's resource, so no pod can get these GPUs on that node. The plugin's /readyz and log say why (kubelet restarting, registration failing).
      - alert: KubegpuConfigReloadFailed
        expr: kubegpu_config_last_reload_successful == 0
        labels:
          severity: warning
        annotations:
          summary: The device plugin on {{`{{ $labels.node }}`}} failed to apply a new config
          description: The last config reload failed and the plugin keeps serving the previous config; kubegpu_config_reload_failures_total says why and the plugin's log names the problem.
{{- end -}}

{{/* The plugin's GPU telemetry settings (observability in values.yaml), with the HTTP endpoint. */}}
{{- define "kubegpu.telemetryEnv" -}}
# The Hostname label of the GPU telemetry (dcgm-exporter's): the node, not the pod.
- name: KUBEGPU_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- with .Values.observability }}
{{- if not (kindIs "invalid" .metricsInterval) }}
- name: KUBEGPU_METRICS_INTERVAL_SECONDS
  value: {{ .metricsInterval | quote }}
{{- end }}
{{- if not (kindIs "invalid" .idleThreshold) }}
- name: KUBEGPU_IDLE_THRESHOLD
  value: {{ .idleThreshold | quote }}
{{- end }}
{{- if .hostProc }}
- name: KUBEGPU_PROC_ROOT
  value: /host/proc
{{- end }}
{{- end }}
{{- end -}}
