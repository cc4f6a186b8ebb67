{{/* Chart name, overridable. */}}
{{- define "dra-plugin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix of every object. */}}
{{- define "dra-plugin.fullname" -}}
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

{{- define "dra-plugin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-plugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-plugin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dra-plugin.labels" -}}
helm.sh/chart: {{ include "dra-plugin.chart" . }}
{{ include "dra-plugin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dra-plugin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-plugin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dra-plugin.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Comma list of the enabled vendors, as the VENDORS variable wants it. */}}
{{- define "dra-plugin.vendors" -}}
{{- $v := list }}
{{- if .Values.intel.enabled }}{{ $v = append $v "intel" }}{{ end }}
{{- if .Values.nvidia.enabled }}{{ $v = append $v "nvidia" }}{{ end }}
{{- if .Values.amd.enabled }}{{ $v = append $v "amd" }}{{ end }}
{{- join "," $v }}
{{- end }}

{{/* "true" when the container runs privileged (see values.yaml securityContext). */}}
{{- define "dra-plugin.privileged" -}}
{{- $p := .Values.securityContext.privileged }}
{{- if eq (toString $p) "auto" }}
{{- ternary "true" "false" (.Values.nvidia.enabled | default false) }}
{{- else }}
{{- ternary "true" "false" (eq (toString $p) "true") }}
{{- end }}
{{- end }}

{{/* "true" when the host's / is mounted at /host (see values.yaml hostRoot). */}}
{{- define "dra-plugin.hostRoot" -}}
{{- $m := toString .Values.hostRoot.mount }}
{{- if eq $m "auto" }}
{{- $nvidiaSlash := and .Values.nvidia.enabled (eq .Values.nvidia.driverRoot "/") }}
{{- ternary "true" "false" (or (eq (include "dra-plugin.privileged" .) "true") $nvidiaSlash) }}
{{- else }}
{{- ternary "true" "false" (eq $m "true") }}
{{- end }}
{{- end }}

{{/* NVIDIA_DRIVER_ROOT as the container sees it; empty when NVIDIA has no driver root. */}}
{{- define "dra-plugin.nvidiaDriverRoot" -}}
{{- if and .Values.nvidia.enabled .Values.nvidia.driverRoot }}
{{- if eq (clean .Values.nvidia.driverRoot) "/" }}/host{{ else }}{{ clean .Values.nvidia.driverRoot }}{{ end }}
{{- end }}
{{- end }}

{{/* NVIDIA toolkit CDI dirs, cleaned and without repeats (the NVIDIA_TOOLKIT_CDI_DIRS value). */}}
{{- define "dra-plugin.toolkitCdiDirs" -}}
{{- $out := list }}
{{- range .Values.nvidia.toolkitCdiDirs }}
{{- if not (has (clean .) $out) }}
{{- $out = append $out (clean .) }}
{{- end }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/* Refuse value combinations the plugin would reject at start. */}}
{{- define "dra-plugin.validate" -}}
{{- if not (or .Values.intel.enabled .Values.nvidia.enabled .Values.amd.enabled) }}
{{- fail "enable at least one vendor: intel.enabled, nvidia.enabled or amd.enabled" }}
{{- end }}
{{- $seen := dict }}
{{- range $vendor := list "intel" "nvidia" "amd" }}
{{- $v := index $.Values $vendor }}
{{- if $v.enabled }}
{{- if hasKey $seen $v.driverName }}
{{- fail (printf "%s.driverName and %s.driverName must differ (both %q)" (get $seen $v.driverName) $vendor $v.driverName) }}
{{- end }}
{{- $_ := set $seen $v.driverName $vendor }}
{{- end }}
{{- end }}
{{- if and .Values.nvidia.enabled (eq (clean .Values.nvidia.driverRoot) "/") (ne (include "dra-plugin.hostRoot" .) "true") }}
{{- fail "nvidia.driverRoot \"/\" is read through the host root: hostRoot.mount must not be false" }}
{{- end }}
{{- if and .Values.nvidia.enabled .Values.nvidia.mps.enabled (ne (include "dra-plugin.privileged" .) "true") }}
{{- fail "nvidia.mps.enabled needs a privileged plugin (it mounts the daemons' tmpfs with Bidirectional propagation): securityContext.privileged must not be false" }}
{{- end }}
{{- if and .Values.nvidia.enabled .Values.nvidia.sharing.mps (not .Values.nvidia.mps.enabled) }}
{{- fail "nvidia.sharing.mps needs nvidia.mps.enabled (the daemons run as Deployments)" }}
{{- end }}
{{- if and .Values.nvidia.enabled .Values.nvidia.sharing.mps (ne .Values.nvidia.sharing.mode "shared") }}
{{- fail "nvidia.sharing.mps needs nvidia.sharing.mode \"shared\"" }}
{{- end }}
{{- if ge (int .Values.shutdownGraceSeconds) (int .Values.terminationGracePeriodSeconds) }}
{{- fail "shutdownGraceSeconds must be below terminationGracePeriodSeconds" }}
{{- end }}
{{- /* The plugin's sockets carry the pod's UID (36 bytes, POD_UID: the rolling update's
names); a unix socket path holds at most 107 bytes, so a long kubelet root dir would make
every pod exit at start (seen on a node whose kubelet root was
/var/lib/dra-plugin-node/kubelet). */}}
{{- $uid := "00000000-0000-0000-0000-000000000000" }}
{{- range $vendor := list "intel" "nvidia" "amd" }}
{{- $v := index $.Values $vendor }}
{{- if $v.enabled }}
{{- $reg := printf "%s/%s-%s-reg.sock" (clean $.Values.kubelet.registrarDir) $v.driverName $uid }}
{{- $dra := printf "%s/%s/dra-%s.sock" (clean $.Values.kubelet.pluginsDir) $v.driverName $uid }}
{{- range $sock := list $reg $dra }}
{{- if gt (len $sock) 107 }}
{{- fail (printf "the plugin's socket %s (a pod UID in its name) would be %d bytes; unix sockets allow at most 107: shorten kubelet.registrarDir, kubelet.pluginsDir or %s.driverName" $sock (len $sock) $vendor) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* JSON list of the enabled vendors' DRA driver names (the admission policy's CEL). Every
vendor section of values.yaml with `enabled` and `driverName` counts. */}}
{{- define "dra-plugin.driverNames" -}}
{{- $names := list }}
{{- range $key := list "intel" "nvidia" "amd" }}
{{- $v := index $.Values $key }}
{{- if and $v (kindIs "map" $v) $v.enabled $v.driverName }}
{{- $names = append $names $v.driverName }}
{{- end }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/* The container environment the chart sets (a YAML list): the env twins of the plugin's
flags. The DaemonSet adds extraEnv, which replaces any of these by name. */}}
{{- define "dra-plugin.env" -}}
{{- $hostRoot := eq (include "dra-plugin.hostRoot" .) "true" }}
{{- $nvidiaRoot := include "dra-plugin.nvidiaDriverRoot" . }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- /* Per-pod socket names, so the old and the new pod coexist during a rolling update. */}}
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: VENDORS
  value: {{ include "dra-plugin.vendors" . | quote }}
{{- if .Values.intel.enabled }}
- name: INTEL_DRIVER_NAME
  value: {{ .Values.intel.driverName | quote }}
- name: INTEL_SHARING
  value: {{ .Values.intel.sharing.mode | quote }}
- name: INTEL_SHARES
  value: {{ .Values.intel.sharing.shares | quote }}
- name: INTEL_VFIO
  value: {{ .Values.intel.vfio.enabled | quote }}
- name: INTEL_HANG_THRESHOLD
  value: {{ .Values.intel.hangThreshold | quote }}
- name: INTEL_HANG_WINDOW_SECONDS
  value: {{ .Values.intel.hangWindowSeconds | quote }}
{{- end }}
{{- if .Values.nvidia.enabled }}
- name: NVIDIA_DRIVER_NAME
  value: {{ .Values.nvidia.driverName | quote }}
- name: NVIDIA_SHARING
  value: {{ .Values.nvidia.sharing.mode | quote }}
- name: NVIDIA_SHARES
  value: {{ .Values.nvidia.sharing.shares | quote }}
- name: NVIDIA_SHARED_MEMORY
  value: {{ .Values.nvidia.sharing.memory | default false | quote }}
- name: NVIDIA_VFIO
  value: {{ .Values.nvidia.vfio.enabled | quote }}
- name: NVIDIA_MIG_PARTITIONS
  value: {{ .Values.nvidia.migPartitions.enabled | quote }}
- name: NVIDIA_CDI_STRATEGY
  value: {{ .Values.nvidia.cdiStrategy | quote }}
- name: NVIDIA_TOOLKIT_CDI_DIRS
  value: {{ include "dra-plugin.toolkitCdiDirs" . | quote }}
{{- if $nvidiaRoot }}
- name: NVIDIA_DRIVER_ROOT
  value: {{ $nvidiaRoot | quote }}
{{- end }}
{{- if .Values.nvidia.mps.enabled }}
{{- /* MPS control daemons run as Deployments in our own namespace, from our image. */}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NVIDIA_MPS_IMAGE
  value: {{ include "dra-plugin.image" . | quote }}
{{- $mpsSecrets := list }}
{{- range (.Values.nvidia.mps.imagePullSecrets | default .Values.imagePullSecrets) }}
{{- $mpsSecrets = append $mpsSecrets .name }}
{{- end }}
{{- if $mpsSecrets }}
- name: NVIDIA_MPS_IMAGE_PULL_SECRETS
  value: {{ join "," $mpsSecrets | quote }}
{{- end }}
- name: NVIDIA_MPS_READY_TIMEOUT
  value: {{ .Values.nvidia.mps.readyTimeoutSeconds | quote }}
- name: NVIDIA_SHARES_MPS
  value: {{ .Values.nvidia.sharing.mps | default false | quote }}
{{- end }}
{{- end }}
{{- if .Values.amd.enabled }}
- name: AMD_DRIVER_NAME
  value: {{ .Values.amd.driverName | quote }}
- name: AMD_RAS_POLL_SECONDS
  value: {{ .Values.amd.rasPollSeconds | quote }}
- name: AMD_SHARING
  value: {{ .Values.amd.sharing.mode | quote }}
- name: AMD_SHARES
  value: {{ .Values.amd.sharing.shares | quote }}
- name: AMD_VFIO
  value: {{ .Values.amd.vfio.enabled | quote }}
- name: AMD_PARTITION_MODES
  value: {{ .Values.amd.partitionModes.enabled | quote }}
{{- end }}
- name: KUBELET_REGISTRAR_DIRECTORY_PATH
  value: {{ .Values.kubelet.registrarDir | quote }}
- name: KUBELET_PLUGINS_DIRECTORY_PATH
  value: {{ .Values.kubelet.pluginsDir | quote }}
- name: CDI_ROOT
  value: {{ .Values.cdi.root | quote }}
- name: CDI_MAX_VERSION
  value: {{ .Values.cdi.maxVersion | quote }}
- name: DEVICE_METADATA
  value: {{ include "dra-plugin.deviceMetadata" . | quote }}
{{- if $hostRoot }}
- name: HOST_ROOT
  value: "/host"
{{- end }}
- name: TAINT_EFFECT
  value: {{ .Values.health.taintEffect | quote }}
- name: METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: TELEMETRY_INTERVAL_SECONDS
  value: {{ .Values.metrics.telemetryIntervalSeconds | quote }}
- name: SHUTDOWN_GRACE_SECONDS
  value: {{ .Values.shutdownGraceSeconds | quote }}
- name: LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
{{- end }}

{{/*
DEVICE_METADATA: cdi.deviceMetadata, where "auto" means on for Kubernetes 1.37+ (KEP-5304
beta) as `helm install` sees the cluster (or --kube-version for `helm template`).
*/}}
{{- define "dra-plugin.deviceMetadata" -}}
{{- $v := .Values.cdi.deviceMetadata -}}
{{- if eq (toString $v) "auto" -}}
{{- semverCompare ">=1.37.0-0" .Capabilities.KubeVersion.Version -}}
{{- else -}}
{{- toString $v -}}
{{- end -}}
{{- end }}

{{- /* NVIDIA's DeviceClass selector for one device type: (list driverName type). */}}
{{- define "dra-plugin.nvidiaSelector" -}}
{{- $driver := index . 0 -}}
device.driver == '{{ $driver }}' && device.attributes['{{ $driver }}'].type == '{{ index . 1 }}'
{{- end }}
