{{/* Names, labels and shared pieces of the waltz chart. */}}

{{- define "waltz.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "waltz.fullname" -}}
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

{{- define "waltz.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: include "waltz.selectorLabels" (list $ "storage") */}}
{{- define "waltz.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "waltz.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "waltz.labels" -}}
{{- $ := index . 0 -}}
{{ include "waltz.selectorLabels" . }}
helm.sh/chart: {{ include "waltz.chart" $ }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/part-of: waltz
{{- end -}}

{{- define "waltz.storage.fullname" -}}{{ include "waltz.fullname" . }}-storage{{- end -}}
{{- define "waltz.storage.headless" -}}{{ include "waltz.fullname" . }}-storage-headless{{- end -}}
{{- define "waltz.server.fullname" -}}{{ include "waltz.fullname" . }}-server{{- end -}}
{{- define "waltz.zookeeper.fullname" -}}{{ include "waltz.fullname" . }}-zookeeper{{- end -}}

{{/* The DNS name of storage node $i: the identity it registers with and the servers connect to. */}}
{{- define "waltz.storage.host" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "waltz.storage.fullname" $) (index . 1) (include "waltz.storage.headless" $) $.Release.Namespace $.Values.clusterDomain -}}
{{- end -}}

{{- define "waltz.zookeeper.connectString" -}}
{{- if .Values.zookeeper.enabled -}}
{{- $hosts := list -}}
{{- range $i, $_ := until (int .Values.zookeeper.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d.%s-headless.%s.svc.%s:%d" (include "waltz.zookeeper.fullname" $) $i (include "waltz.zookeeper.fullname" $) $.Release.Namespace $.Values.clusterDomain (int $.Values.zookeeper.port)) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- else -}}
{{- required "zookeeper.connectString is required when zookeeper.enabled is false" .Values.zookeeper.connectString -}}
{{- end -}}
{{- end -}}

{{- define "waltz.cluster.root" -}}
{{- default (printf "/waltz/%s" (include "waltz.fullname" .)) .Values.cluster.root -}}
{{- end -}}

{{- define "waltz.image" -}}
{{- $image := index . 0 -}}
{{- $ := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{- define "waltz.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "waltz.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An init container that makes sure the cluster exists in ZooKeeper: the services refuse to start without it.
     It creates an empty cluster when there is none (racing peers: one creates, the others then find it), so
     pods get ready without the provisioning Job, which `helm install --wait` runs only after they are ready;
     the Job then registers the storage nodes and assigns the partitions. */}}
{{- define "waltz.ensureCluster" -}}
- name: ensure-cluster
  image: {{ include "waltz.image" (list .image .root) }}
  imagePullPolicy: {{ .image.pullPolicy }}
  command: ["/bin/sh", "-c"]
  args:
    - |
      w="waltz --zookeeper $WALTZ_ZOOKEEPER --root $WALTZ_ROOT --timeout 5"
      until $w cluster show-key >/dev/null 2>&1 || $w cluster create -n "$WALTZ_CLUSTER_NAME" -p "$WALTZ_PARTITIONS"; do
        echo "waiting for ZooKeeper at $WALTZ_ZOOKEEPER"; sleep 3
      done
  env: {{- include "waltz.clusterEnv" .root | nindent 4 }}
  securityContext: {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources: {{- toYaml .root.Values.provisioning.resources | nindent 4 }}
{{- end -}}

{{/* Where and what the cluster is, for the waltz CLI in init containers and the provisioning Job. */}}
{{- define "waltz.clusterEnv" -}}
- name: WALTZ_ZOOKEEPER
  value: {{ include "waltz.zookeeper.connectString" . | quote }}
- name: WALTZ_ROOT
  value: {{ include "waltz.cluster.root" . | quote }}
- name: WALTZ_CLUSTER_NAME
  value: {{ .Values.cluster.name | quote }}
- name: WALTZ_PARTITIONS
  value: {{ .Values.cluster.partitions | quote }}
- name: WALTZ_REPLICAS
  value: {{ .Values.cluster.replicationFactor | quote }}
{{- end -}}

{{/* TLS (tls.enabled): where each pod finds its role's Secret, and the configuration keys naming the files. */}}
{{- define "waltz.tls.dir" -}}/etc/waltz-tls{{- end -}}

{{/* The tls.* keys of a service or CLI configuration file. */}}
{{- define "waltz.tls.config" -}}
{{- if .Values.tls.enabled -}}
tls.certFile: {{ include "waltz.tls.dir" . }}/tls.crt
tls.keyFile: {{ include "waltz.tls.dir" . }}/tls.key
tls.caFile: {{ include "waltz.tls.dir" . }}/ca.crt
{{- end }}
{{- end -}}

{{/* The read-only volume of a role's Secret: include "waltz.tls.volume" (list $ "server") */}}
{{- define "waltz.tls.volume" -}}
{{- $ := index . 0 -}}
{{- $role := index . 1 -}}
{{- if $.Values.tls.enabled -}}
- name: tls
  secret:
    secretName: {{ required (printf "tls.secrets.%s is required when tls.enabled is true" $role) (index $.Values.tls.secrets $role) }}
    # Readable by the pod's group (fsGroup) only.
    defaultMode: 288
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end -}}

{{- define "waltz.tls.mount" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  mountPath: {{ include "waltz.tls.dir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* A component's kubelet gRPC probes: readiness asks "" (ready), startup and liveness ask "<service>/live".
     Kubelet's gRPC probe cannot present a client certificate: with TLS on they ask the plaintext health port.
     include "waltz.probes" (list $ <service port> <health port> "<grpc service>" <startup failureThreshold>) */}}
{{- define "waltz.probes" -}}
{{- $ := index . 0 -}}
{{- $port := ternary (index . 2) (index . 1) $.Values.tls.enabled -}}
{{- $live := printf "%s/live" (index . 3) -}}
startupProbe:
  grpc:
    port: {{ $port }}
    service: {{ $live }}
  periodSeconds: 2
  failureThreshold: {{ index . 4 }}
readinessProbe:
  grpc:
    port: {{ $port }}
    service: ""
  periodSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ $port }}
    service: {{ $live }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}
