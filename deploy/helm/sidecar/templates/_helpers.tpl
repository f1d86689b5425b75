{{- define "sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sidecar.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sidecar.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sidecar.tokenSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "sidecar.fullname" .)) -}}
{{- end -}}

{{- define "sidecar.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "sidecar.fullname" .)) -}}
{{- end -}}

{{- /* The Service's DNS name: what clients dial and what the certificate must name. */ -}}
{{- define "sidecar.serviceHost" -}}
{{- printf "%s.%s.svc" (include "sidecar.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- /* SIDECAR_IMAGES from images.names: NAME=REF pairs, by name. Setting the variables in
config as well would give the daemon two values: refused. */ -}}
{{- define "sidecar.images" -}}
{{- range $k := list "SIDECAR_IMAGES" "SIDECAR_DEFAULT_IMAGE" "SIDECAR_IMAGE_STORE_BYTES" "SIDECAR_ROOT_IMAGES" "SIDECAR_SNAPSHOT_MAX_AGE" -}}
{{- if hasKey $.Values.config $k -}}
{{- fail (printf "images: %s is set by images.names/default/storeBytes/root/snapshotMaxAge; remove it from config" $k) -}}
{{- end -}}
{{- end -}}
{{- $pairs := list -}}
{{- range $name, $ref := .Values.images.names -}}
{{- $pairs = append $pairs (printf "%s=%s" $name $ref) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
