{{- /*
Fills in what the values lack from this chart's defaults, keys missing at any depth only:
`helm upgrade --reuse-values` gives the templates the earlier release's values alone, which lack
every value added since. (Sprig's `merge` would also turn a `false` or `0` the user set into the
default: it takes them for empty.) Called as (list .Values defaults).
*/ -}}
{{- define "zklock.fillDefaults" -}}
{{- $values := index . 0 -}}
{{- range $key, $default := index . 1 -}}
{{- if not (hasKey $values $key) -}}
{{- $_ := set $values $key (deepCopy $default) -}}
{{- else if and (kindIs "map" $default) (kindIs "map" (index $values $key)) -}}
{{- include "zklock.fillDefaults" (list (index $values $key) $default) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of the chart, overridable. */}}
{{- define "zklock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "zklock.fullname" -}}
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

{{- define "zklock.zookeeperName" -}}
{{- printf "%s-zookeeper" (include "zklock.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "zklock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: zklock
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "zklock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zklock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "zklock.zookeeperSelectorLabels" -}}
app.kubernetes.io/name: {{ include "zklock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: zookeeper
{{- end -}}

{{- define "zklock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "zklock.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /*
A repository on the registry `imageRegistry` names, if it names one: the repository's own
registry (its first part, when that has a '.' or ':' or is localhost) is replaced, and a Docker
Hub repository (no registry) moves under it. Called as (list $ repository).
*/ -}}
{{- define "zklock.repository" -}}
{{- $root := index . 0 -}}
{{- $repository := index . 1 -}}
{{- with $root.Values.imageRegistry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- else -}}
{{- $repository -}}
{{- end -}}
{{- end -}}

{{- define "zklock.image" -}}
{{- $repository := include "zklock.repository" (list . .Values.image.repository) -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "zklock.zookeeperImage" -}}
{{- printf "%s:%s" (include "zklock.repository" (list . .Values.zookeeper.bundled.image.repository)) .Values.zookeeper.bundled.image.tag -}}
{{- end -}}

{{- /* The containers' securityContext unless the values give one. */ -}}
{{- define "zklock.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The connect string the operator uses: the existing ensemble, or the bundled one's Service. */}}
{{- define "zklock.zkConnect" -}}
{{- $servers := .Values.zookeeper.connectString -}}
{{- if .Values.zookeeper.bundled.enabled -}}
{{- $servers = printf "%s.%s.svc:2181" (include "zklock.zookeeperName" .) .Release.Namespace -}}
{{- end -}}
{{- printf "%s%s" $servers .Values.zookeeper.chroot -}}
{{- end -}}

{{/* The Lease lives in the release namespace, named by leaderElection.leaseName. */}}
{{- define "zklock.leaseName" -}}{{ .Values.leaderElection.leaseName | default "zklock-leader" }}{{- end -}}

{{/* The token floor's ConfigMap beside the Lease (src/controller/token_floor.rs floor_configmap). */}}
{{- define "zklock.tokenFloorName" -}}
{{- $lease := include "zklock.leaseName" . -}}
{{- if eq $lease "zklock-leader" }}zklock-token-floor{{ else }}{{ $lease }}-token-floor{{ end -}}
{{- end -}}

{{/* The leader epoch's admission policy, its binding and its parameter (a ConfigMap in the
release namespace) share one name. */}}
{{- define "zklock.fencingName" -}}{{ include "zklock.fullname" . }}-fencing{{- end -}}
{{- define "zklock.epochPolicyName" -}}{{ include "zklock.fullname" . }}-leader-epoch{{- end -}}
{{- define "zklock.epochPolicy" -}}{{ and .Values.leaderElection.enabled .Values.leaderElection.epochPolicy }}{{- end -}}

{{- /*
Cluster-scoped objects of a release (the epoch policy and its binding) are owned by the release's
namespace, so that deleting the namespace instead of running `helm uninstall` takes them along: a
binding whose parameter went with its namespace would refuse every status write in the namespaces
it covers. `lookup` reads the namespace's UID on install and upgrade; `helm template` (no cluster)
renders no owner.
*/ -}}
{{- define "zklock.ownedByReleaseNamespace" -}}
{{- with (lookup "v1" "Namespace" "" .Release.Namespace) }}
ownerReferences:
  - apiVersion: v1
    kind: Namespace
    name: {{ .metadata.name }}
    uid: {{ .metadata.uid }}
{{- end }}
{{- end -}}

{{/*
The operator's ZooKeeper credentials, as YAML: `secret` and `key` (none without credentials),
`contenderKey`, `contenders` (listed or anyone) and `generated` (the chart makes the Secret).
*/}}
{{- define "zklock.zkAuth" -}}
{{- $a := .Values.zookeeper.auth }}
{{- $generated := and .Values.zookeeper.bundled.enabled $a.generate (not $a.existingSecret) }}
{{- $secret := "" }}
{{- $key := $a.key }}
{{- $contenderKey := $a.contenderKey }}
{{- if $a.existingSecret }}
{{- $secret = $a.existingSecret }}
{{- else if $generated }}
{{- $secret = printf "%s-auth" (include "zklock.zookeeperName" .) }}
{{- $key = "operator" }}
{{- end }}
{{- $contenders := $a.contenders | default (ternary "listed" "anyone" (ne $secret "")) }}
{{- if and $generated (eq $contenders "listed") }}
{{- $contenderKey = "contender" }}
{{- end }}
{{- if and $generated $a.previousKey }}
{{- fail "zookeeper.auth.previousKey rotates the credentials of an existingSecret; the operator's generated credentials (zookeeper.auth.generate) are not rotated in place: move them into a Secret of your own and give existingSecret first (docs/operations.md: rotating ZooKeeper credentials)" }}
{{- end }}
{{- if and (eq $contenders "listed") (not $secret) }}
{{- fail "zookeeper.auth.contenders=listed needs credentials: set zookeeper.auth.existingSecret (or, with the bundled ensemble, zookeeper.auth.generate)" }}
{{- end }}
{{- if and $contenderKey (ne $contenders "listed") }}
{{- fail "zookeeper.auth.contenderKey names the credentials of listed contenders: set zookeeper.auth.contenders=listed with it" }}
{{- end }}
secret: {{ $secret | quote }}
key: {{ $key | quote }}
contenderKey: {{ $contenderKey | quote }}
contenders: {{ $contenders }}
generated: {{ $generated }}
{{- end -}}

{{/* OpenShift assigns each namespace's pods a UID and group of its own range (its restricted
SCC refuses others): there, the chart names none. */}}
{{- define "zklock.openshift" -}}{{ if .Capabilities.APIVersions.Has "security.openshift.io/v1" }}true{{ end }}{{- end -}}

{{/* The operator's pod securityContext: the value's, else the image's user 65532 (on OpenShift,
the namespace's). */}}
{{- define "zklock.podSecurityContext" -}}
{{- with .Values.podSecurityContext }}
{{- toYaml . }}
{{- else -}}
runAsNonRoot: true
{{- if not (include "zklock.openshift" .) }}
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{/*
A pod of the operator's image that runs one `zklock` command as ServiceAccount $sa (hooks: the
pre-delete check, helm test). Called with (list $ $sa $args).
*/}}
{{- define "zklock.commandPod" -}}
{{- $ := index . 0 }}
serviceAccountName: {{ index . 1 }}
automountServiceAccountToken: true
enableServiceLinks: false
restartPolicy: Never
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "zklock.podSecurityContext" $ | nindent 2 }}
{{- with $.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: zklock
    image: {{ include "zklock.image" $ | quote }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    args:
      {{- range index . 2 }}
      - {{ . | quote }}
      {{- end }}
    env:
      - name: POD_NAME
        valueFrom: { fieldRef: { fieldPath: metadata.name } }
      - name: POD_UID
        valueFrom: { fieldRef: { fieldPath: metadata.uid } }
    resources:
      requests: { cpu: 10m, memory: 32Mi }
      limits: { memory: 128Mi }
    securityContext:
      {{- with $.Values.securityContext }}
      {{- toYaml . | nindent 6 }}
      {{- else }}
      {{- include "zklock.containerSecurityContext" $ | nindent 6 }}
      {{- end }}
{{- end -}}
