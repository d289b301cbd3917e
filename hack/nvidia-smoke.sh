#!/usr/bin/env bash
# dpkit's NVIDIA plugin on this machine's GPUs, start to finish, in about
# three minutes: what the driver shows, discovery under an emulated kubelet
# (dpkit up, dpkit admit), dpkit verify on the device plugin front (the
# envvar/device-specs, cdi and time-sliced configs), and, with a control
# plane (etcd and kube-apiserver v1.37.0), dpkit verify --dra on the DRA
# front, the ResourceSlice it publishes, and a claim for one GPU allocated
# and prepared through dpkit up --kubeconfig. docs/plugins/nvidia.md has
# what it showed on an H100 and an H200.
#
#   bash hack/nvidia-smoke.sh OUT                  on the GPU machine
#   HOST_ROOT=pkg/discovery/testdata/hosts/dgx-h100 bash hack/nvidia-smoke.sh OUT
#                                                  the same on the fixture host
#
# Each step's output goes to OUT/<step>.txt and a summary to stdout. dpkit,
# dpkit-cluster and controlplane (test/controlplane/cmd/controlplane) come
# from $DPKIT_BIN, else are built into a temporary directory; etcd and
# kube-apiserver from $DPKIT_CONTROLPLANE_BIN, else from
# hack/build-controlplane.sh. A step that fails is reported and the next one
# runs; everything started is stopped on exit.
set -uo pipefail
out="${1:?usage: hack/nvidia-smoke.sh OUT}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

if [[ -z "${DPKIT_BIN:-}" ]]; then
  DPKIT_BIN="$work/bin"
  for c in ./cmd/dpkit ./cmd/dpkit-cluster ./test/controlplane/cmd/controlplane; do
    CGO_ENABLED=0 go build -o "$DPKIT_BIN/" "$c" || exit 1
  done
fi
export PATH="$DPKIT_BIN:$PATH"
host=()
if [[ -n "${HOST_ROOT:-}" ]]; then
  HOST_ROOT="$(cd "$HOST_ROOT" && pwd)"
  host=(--sysfs-root "$HOST_ROOT/sys" --dev-root "$HOST_ROOT/dev" --proc-root "$HOST_ROOT/proc")
fi
proc="${HOST_ROOT:-}/proc"
sys="${HOST_ROOT:-}/sys"

failed=()
# step NAME CMD...: runs CMD with its output in OUT/NAME.txt.
step() {
  local name="$1"
  shift
  local start=$SECONDS
  if "$@" >"$out/$name.txt" 2>&1; then
    echo "ok    $name ($((SECONDS - start))s)"
  else
    echo "FAIL  $name ($((SECONDS - start))s, exit $?): see $name.txt"
    failed+=("$name")
  fi
}

# wait_for FILE TEXT SECONDS: until TEXT appears in FILE.
wait_for() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "no \"$2\" in $1 after $3s:"; cat "$1"; return 1; }
    sleep 0.2
  done
}

facts() {
  uname -a
  id
  echo "--- /proc/driver/nvidia/version"
  cat "$proc/driver/nvidia/version"
  for d in "$proc"/driver/nvidia/gpus/*; do
    echo "--- $d/information"
    cat "$d/information"
    b="$(basename "$d")"
    echo "numa_node: $(cat "$sys/bus/pci/devices/${b,,}/numa_node" 2>&1)"
  done
  echo "--- device nodes"
  ls -l "${HOST_ROOT:-}"/dev/nvidia* 2>&1
  if command -v nvidia-smi >/dev/null; then
    echo "--- nvidia-smi"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,uuid,pci.bus_id,memory.total,driver_version,mig.mode.current,compute_cap --format=csv
    echo "--- nvidia-smi mig -lgip"
    nvidia-smi mig -lgip 2>&1
    echo "--- nvidia-smi topo -m"
    nvidia-smi topo -m 2>&1
  fi
}
step facts facts

cat >"$work/gpu-pod.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: gpu, namespace: default, uid: 5a1e0000-0000-4000-8000-000000000001}
spec:
  containers:
  - name: cuda
    image: cuda
    resources: {limits: {nvidia.com/gpu: 1}}
EOF

# start_up CONFIG [FLAGS...]: dpkit up in the background (up_pid), ready.
start_up() {
  local cfg="$1" log="$work/up.log"
  rm -rf "$work/up-root"
  dpkit up --config "$cfg" --root "$work/up-root" ${HOST_ROOT:+--host-root "$HOST_ROOT"} "${@:2}" >"$log" 2>&1 &
  up_pid=$!
  pids+=("$up_pid")
  wait_for "$log" "ready:" 30 || return 1
  cat "$log"
}
stop_up() {
  kill -TERM "$up_pid" && wait "$up_pid"
}
up() {
  start_up "$1" || return 1
  echo "--- dpkit get devices"
  DPKIT_ROOT="$work/up-root" dpkit get devices || return 1
  echo "--- dpkit admit -f gpu-pod.yaml"
  DPKIT_ROOT="$work/up-root" dpkit admit -f "$work/gpu-pod.yaml" || return 1
  if [[ -d "$work/cdi" ]]; then
    echo "--- the CDI spec"
    cat "$work"/cdi/*
  fi
  stop_up
}

# verify NAME CONFIG: dpkit verify on the device plugin front of CONFIG.
verify() {
  dpkit verify -o wide -- dpkit plugin -c "$1" "${host[@]}" --plugin-dir '{plugin-dir}' --registration kubelet
}
cat >"$work/cdi.yaml" <<EOF
apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- nvidia: {deviceListStrategy: [cdi], cdiKind: dpkit.io/gpu, cdiSpecDir: $work/cdi}
EOF
cat >"$work/replicas.yaml" <<'EOF'
apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- nvidia: {replicas: 4, failRequestsGreaterThanOne: true}
EOF
step up up examples/nvidia.yaml
step up-cdi up "$work/cdi.yaml"
step verify verify examples/nvidia.yaml
step verify-cdi verify "$work/cdi.yaml"
step verify-replicas verify "$work/replicas.yaml"

# The control plane, for the DRA front.
controlplane --scheduler=false --controller-manager=false --env-file "$work/env" >"$work/cp.log" 2>&1 &
pids+=("$!")
step controlplane wait_for "$work/env" KUBECONFIG 120
# shellcheck disable=SC1091
source "$work/env"

cat >"$work/dra-only.yaml" <<'EOF'
apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- nvidia: {deviceListStrategy: [envvar, device-specs]}
  fronts: [dra]
EOF
step verify-dra dpkit verify --dra -o wide -- dpkit plugin -c "$work/dra-only.yaml" "${host[@]}"

# kapi METHOD PATH [FILE]: the API server's REST API with the admin's
# certificate (no kubectl needed).
kapi() {
  local k="$work/kapi"
  if [[ ! -f "$k.crt" ]]; then
    mkdir -p "$k"
    sed -n 's/^ *certificate-authority-data: //p' "$KUBECONFIG" | base64 -d >"$k.ca"
    sed -n 's/^ *client-certificate-data: //p' "$KUBECONFIG" | base64 -d >"$k.crt"
    sed -n 's/^ *client-key-data: //p' "$KUBECONFIG" | base64 -d >"$k.key"
  fi
  local server
  server="$(sed -n 's/^ *server: //p' "$KUBECONFIG")"
  curl -sS --fail-with-body --cacert "$k.ca" --cert "$k.crt" --key "$k.key" -X "$1" \
    -H 'Content-Type: application/yaml' -H 'Accept: application/yaml' ${3:+--data-binary "@$3"} "$server$2"
}

cat >"$work/claim.yaml" <<'EOF'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one-gpu, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
EOF
cat >"$work/claim-pod.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: claim-gpu, namespace: default, uid: 5a1e0000-0000-4000-8000-000000000002}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: one-gpu}]
  containers:
  - name: cuda
    image: cuda
    resources: {claims: [{name: gpu}]}
EOF
dra() {
  local node="${NODE:-$(hostname)}"
  dpkit deviceclass --config examples/nvidia-dra.yaml >"$work/classes.yaml" || return 1
  cat "$work/classes.yaml"
  kapi POST /apis/resource.k8s.io/v1/deviceclasses "$work/classes.yaml" >/dev/null || return 1
  kapi POST /api/v1/nodes <(printf 'apiVersion: v1\nkind: Node\nmetadata: {name: %s}\n' "$node") >/dev/null || return 1
  echo "--- dpkit up"
  NODE_NAME="$node" start_up examples/nvidia-dra.yaml --kubeconfig "$KUBECONFIG" --node-name "$node" || return 1
  echo "--- the ResourceSlice"
  local deadline=$((SECONDS + 60))
  until dpkit get slices --kubeconfig "$KUBECONFIG" -o yaml >"$work/slices.yaml" 2>&1 && grep -q "gpu.nvidia.com" "$work/slices.yaml"; do
    ((SECONDS < deadline)) || { cat "$work/slices.yaml" "$work/up.log"; return 1; }
    sleep 0.5
  done
  cat "$work/slices.yaml"
  kapi GET /apis/resource.k8s.io/v1/resourceslices || return 1
  kapi POST /apis/resource.k8s.io/v1/namespaces/default/resourceclaims "$work/claim.yaml" >/dev/null || return 1
  echo "--- dpkit admit -f claim-pod.yaml"
  DPKIT_ROOT="$work/up-root" dpkit admit -f "$work/claim-pod.yaml" || return 1
  echo "--- dpkit get claims"
  dpkit get claims --kubeconfig "$KUBECONFIG" --root "$work/up-root" || return 1
  stop_up
}
step dra dra

echo
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
echo "all steps passed; outputs in $out"
