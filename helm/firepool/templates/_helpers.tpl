{{/* The chart's name, at most 63 characters (a DNS label). */}}
{{- define "firepool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects' name: RELEASE-firepool, or RELEASE when it already says firepool. */}}
{{- define "firepool.fullname" -}}
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

{{/* Labels every object of the release carries. */}}
{{- define "firepool.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "firepool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* What selects the broker's pod (the Deployment, the Service, the NetworkPolicies). */}}
{{- define "firepool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "firepool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "firepool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "firepool.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace the broker's pods live in. */}}
{{- define "firepool.podNamespace" -}}
{{- default .Release.Namespace .Values.kubernetes.podNamespace -}}
{{- end -}}

{{- define "firepool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "firepool.podImage" -}}
{{- printf "%s:%s" .Values.podImage.repository (default .Chart.AppVersion .Values.podImage.tag) -}}
{{- end -}}

{{/* The URL pods fetch packages from. */}}
{{- define "firepool.publicUrl" -}}
{{- default (printf "http://%s.%s.svc:%d" (include "firepool.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.broker.publicUrl -}}
{{- end -}}

{{/* The catalog as the broker reads it: each pool's template gets podImage when it names
no image of its own. */}}
{{- define "firepool.catalog" -}}
{{- $catalog := deepCopy .Values.catalog -}}
{{- $pools := dict -}}
{{- range $sku, $spec := $catalog.pools -}}
{{- $pool := deepCopy $spec -}}
{{- $template := default (dict) $pool.template -}}
{{- $_ := set $template "image" (default (include "firepool.podImage" $) $template.image) -}}
{{- $_ := set $pool "template" $template -}}
{{- $_ := set $pools $sku $pool -}}
{{- end -}}
{{- $_ := set $catalog "pools" $pools -}}
{{- toYaml $catalog -}}
{{- end -}}
