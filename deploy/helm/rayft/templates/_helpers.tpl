{{/* The run's name as a DNS-1123 label of at most 40 characters, as `rayft k8s render` names it. */}}
{{- define "rayft.name" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower (toString .Values.name)) "-" | trimAll "-" | trunc 40 | trimAll "-" | default "rayft" -}}
{{- end -}}

{{- define "rayft.labels" -}}
app.kubernetes.io/name: rayft
app.kubernetes.io/instance: {{ include "rayft.name" . }}
{{- end -}}

{{- define "rayft.metadata" -}}
namespace: {{ .Release.Namespace }}
labels:
  {{- include "rayft.labels" . | nindent 2 }}
{{- end -}}

{{/* Whether storage_path is a URI (s3://, gs://...) rather than a path on the claim. */}}
{{- define "rayft.remote" -}}
{{- if regexMatch "^[A-Za-z][A-Za-z0-9+.-]*://" (toString .Values.storage_path) }}true{{ end -}}
{{- end -}}

{{/* Worker pods: scaling.num_workers / k8s.workers_per_pod; fails when it does not divide. */}}
{{- define "rayft.workerPods" -}}
{{- $workers := max (int .Values.scaling.num_workers) 1 -}}
{{- $perPod := int .Values.k8s.workers_per_pod -}}
{{- if mod $workers $perPod -}}
{{- fail (printf "k8s.workers_per_pod=%d does not divide scaling.num_workers=%d; set k8s.workers_per_pod to a divisor of %d (1 puts each worker in its own pod)" $perPod $workers $workers) -}}
{{- end -}}
{{- div $workers $perPod -}}
{{- end -}}

{{/* Whole GPUs of one worker pod; fails on a fraction. */}}
{{- define "rayft.gpus" -}}
{{- $resources := .Values.scaling.resources_per_worker | default dict -}}
{{- $perWorker := 0.0 -}}
{{- if hasKey $resources "GPU" -}}
{{- $perWorker = float64 (get $resources "GPU") -}}
{{- else if and (kindIs "bool" .Values.scaling.use_gpu) .Values.scaling.use_gpu -}}
{{- $perWorker = 1.0 -}}
{{- end -}}
{{- if and (kindIs "bool" .Values.scaling.use_gpu) (not .Values.scaling.use_gpu) -}}
{{- $perWorker = 0.0 -}}
{{- end -}}
{{- $total := mulf $perWorker (int .Values.k8s.workers_per_pod) -}}
{{- if ne (floor $total) $total -}}
{{- fail (printf "scaling.resources_per_worker.GPU=%v x k8s.workers_per_pod=%v is %v GPUs per pod, but Kubernetes gives a pod whole GPUs (nvidia.com/gpu); set scaling.resources_per_worker.GPU to a whole number, or k8s.workers_per_pod so that the product is one" $perWorker .Values.k8s.workers_per_pod $total) -}}
{{- end -}}
{{- int $total -}}
{{- end -}}

{{/* CPU of one worker pod: resources_per_worker.CPU (1) x workers_per_pod, millicores when fractional. */}}
{{- define "rayft.cpu" -}}
{{- $resources := .Values.scaling.resources_per_worker | default dict -}}
{{- $cpu := mulf (get $resources "CPU" | default 1.0) (int .Values.k8s.workers_per_pod) -}}
{{- if eq (floor $cpu) $cpu }}{{ int $cpu }}{{ else }}{{ int (round (mulf $cpu 1000) 0) }}m{{ end -}}
{{- end -}}

{{/* Memory of one worker pod: resources_per_worker.memory (bytes) or k8s.memory_per_worker, x workers_per_pod. */}}
{{- define "rayft.memory" -}}
{{- $resources := .Values.scaling.resources_per_worker | default dict -}}
{{- $perPod := int .Values.k8s.workers_per_pod -}}
{{- if get $resources "memory" -}}
{{- int64 (mulf (get $resources "memory") $perPod) -}}
{{- else if eq $perPod 1 -}}
{{- .Values.k8s.memory_per_worker -}}
{{- else -}}
{{- $number := regexFind "^[0-9.]+" .Values.k8s.memory_per_worker -}}
{{- $scaled := mulf $number $perPod -}}
{{- if eq (floor $scaled) $scaled }}{{ int64 $scaled }}{{ else }}{{ $scaled }}{{ end }}{{ trimPrefix $number .Values.k8s.memory_per_worker -}}
{{- end -}}
{{- end -}}

{{/* Refuse what `rayft k8s render` refuses: storage the pods cannot share, credentials in plain env. */}}
{{- define "rayft.check" -}}
{{- $path := toString .Values.storage_path -}}
{{- $pods := add1 (int (include "rayft.workerPods" .)) -}}
{{- if hasPrefix "file://" $path -}}
{{- fail (printf "storage_path=%q is a file:// URI, which each pod resolves on its own disk; use the plain path on a shared claim (storage_path=/mnt/rayft/runs k8s.storage.claim_name=CLAIM) or an object store URI (storage_path=s3://bucket/runs)" $path) -}}
{{- end -}}
{{- if not (include "rayft.remote" .) -}}
{{- if not .Values.k8s.storage.claim_name -}}
{{- fail (printf "storage_path=%q is a local path, but the job runs %d pods and each would write its own copy; set k8s.storage.claim_name to a ReadWriteMany PersistentVolumeClaim (add k8s.storage.create=true to render one), or use a URI storage_path (storage_path=s3://bucket/runs)" $path $pods) -}}
{{- end -}}
{{- if not (isAbs $path) -}}
{{- fail (printf "storage_path=%q is relative, and a pod's working directory is not where a Ray job runs; use an absolute path on the volume, e.g. storage_path=/mnt/rayft/%s" $path $path) -}}
{{- end -}}
{{- end -}}
{{- range $name, $value := .Values.k8s.env -}}
{{- if regexMatch "(?i)(TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY)" $name -}}
{{- fail (printf "k8s.env: [%q] hold credentials and would be written into the manifests in plain text; put them in a Secret and set k8s.secret_name=NAME k8s.secret_env=[%s] instead" $name $name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.k8s.secret_env (not .Values.k8s.secret_name) -}}
{{- fail "k8s.secret_env is set but k8s.secret_name is unset; set k8s.secret_name to the Secret that holds them" -}}
{{- end -}}
{{- end -}}

{{/* A Ray container: the image, its environment (credentials by reference), mounts and resources. */}}
{{- define "rayft.container" -}}
{{- $root := .root -}}
- name: {{ .name }}
  image: {{ $root.Values.k8s.image | quote }}
  imagePullPolicy: {{ $root.Values.k8s.image_pull_policy }}
  resources:
    requests:
      {{- toYaml .limits | nindent 6 }}
    limits:
      {{- toYaml .limits | nindent 6 }}
  volumeMounts:
    - name: rayft-config
      mountPath: /etc/rayft
      readOnly: true
    - name: dshm
      mountPath: /dev/shm
    {{- if and $root.Values.k8s.storage.claim_name (not (include "rayft.remote" $root)) }}
    - name: rayft-storage
      mountPath: {{ $root.Values.storage_path }}
    {{- end }}
  {{- if or $root.Values.k8s.env $root.Values.k8s.secret_env }}
  env:
    {{- range $name := keys ($root.Values.k8s.env | default dict) | sortAlpha }}
    - name: {{ $name }}
      value: {{ get $root.Values.k8s.env $name | toString | quote }}
    {{- end }}
    {{- range $name := $root.Values.k8s.secret_env }}
    - name: {{ $name }}
      valueFrom:
        secretKeyRef:
          name: {{ $root.Values.k8s.secret_name }}
          key: {{ $name }}
    {{- end }}
  {{- end }}
{{- end -}}

{{/* A pod template: labels, the container, the config and storage volumes, the service account. */}}
{{- define "rayft.podTemplate" -}}
{{- $root := .root -}}
metadata:
  labels:
    {{- include "rayft.labels" $root | nindent 4 }}
spec:
  containers:
    {{- include "rayft.container" . | nindent 4 }}
  volumes:
    - name: rayft-config
      configMap:
        name: {{ include "rayft.name" $root }}-config
    - name: dshm
      emptyDir:
        medium: Memory
    {{- if and $root.Values.k8s.storage.claim_name (not (include "rayft.remote" $root)) }}
    - name: rayft-storage
      persistentVolumeClaim:
        claimName: {{ $root.Values.k8s.storage.claim_name }}
    {{- end }}
  {{- with $root.Values.k8s.service_account }}
  serviceAccountName: {{ . }}
  {{- end }}
{{- end -}}
