{{/* The image reference: the digest when pinned, else the tag. */}}
{{- define "confide.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ required "image.tag is required (or image.digest)" .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* A pod volume from a value (secretName, configMap, persistentVolumeClaim or hostPath); args: list NAME VALUE WHAT. */}}
{{- define "confide.volume" -}}
{{- $name := index . 0 -}}{{- $v := index . 1 -}}{{- $what := index . 2 -}}
- name: {{ $name }}
{{- if $v.secretName }}
  secret:
    secretName: {{ $v.secretName }}
{{- else if $v.configMap }}
  configMap:
    name: {{ $v.configMap }}
{{- else if $v.persistentVolumeClaim }}
  persistentVolumeClaim:
    claimName: {{ $v.persistentVolumeClaim }}
{{- else if $v.hostPath }}
  hostPath:
    path: {{ $v.hostPath }}
    type: Directory
{{- else }}
{{- fail (printf "%s is required: give it secretName, configMap, persistentVolumeClaim or hostPath" $what) }}
{{- end }}
{{- end -}}

{{/* What every container shares: read-only root, no privileges, user 10001. */}}
{{- define "confide.securityContext" -}}
securityContext:
  runAsUser: 10001
  runAsGroup: 10001
  runAsNonRoot: true
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
{{- end -}}

{{/* Scratch space of a read-only container: /tmp and /run/confide (the health check's state). */}}
{{- define "confide.scratchVolumes" -}}
- name: tmp
  emptyDir: {}
- name: run
  emptyDir: {}
{{- end -}}
{{- define "confide.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: run
  mountPath: /run/confide
{{- end -}}

{{- define "confide.health" -}}
livenessProbe:
  exec:
    command: [/usr/bin/python3, -m, confide, container, health]
  initialDelaySeconds: 20
  periodSeconds: 15
  timeoutSeconds: 10
readinessProbe:
  exec:
    command: [/usr/bin/python3, -m, confide, container, health]
  initialDelaySeconds: 5
  periodSeconds: 5
  timeoutSeconds: 10
{{- end -}}

{{- define "confide.metricsAnnotations" -}}
{{- $port := index . 1 -}}
{{- if (index . 0).Values.metrics.enabled }}
annotations:
  prometheus.io/scrape: "true"
  prometheus.io/port: {{ $port | quote }}
{{- end }}
{{- end -}}
