#!/usr/bin/env bash
# make conformance: critest's CRI validation suite against a private
# containerd, once with c8s as the default runtime and once with runc, in
# the same run; prints the pass/fail/skip counts side by side and every test
# whose result differs.
#
# Needs `make deps tools image build` (the Makefile target runs them) and root.
# There is no registry access here, so the images critest pulls are served
# by a local registry (Debian's docker-registry on 127.0.0.1) that
# containerd's registry config uses as the mirror of registry.k8s.io and
# gcr.io. They are all the busybox test image (tests/cmd/mkbusyboximage,
# every applet hard-linked) under the names critest expects; the web
# servers are busybox httpd standing in for nginx and httpd, and the
# image with a group of its own has that group. Images whose content a
# test checks otherwise (a fixed digest, a USER, the nonewprivs binary,
# distinct images under distinct names) are not rebuilt here, so those
# tests fail on both runtimes alike.
#
# Environment: C8S_CONFORMANCE_FOCUS (a ginkgo focus regexp, default all),
# C8S_CONFORMANCE_RUNTIMES (default "c8s runc"), C8S_REGISTRY_PORT (5123),
# C8S_CONFORMANCE_OUT (reports and logs; default _output/conformance),
# C8S_CONFORMANCE_TIMEOUT (per runtime, a ginkgo duration; default 90m: with
# TCG a pod VM's test takes ~40 s here, the suite about an hour). When the
# time runs out ginkgo stops, and the specs it did not reach count as
# skipped ("ran" tells how many ran).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=$ROOT/_output/tools/bin
IMAGE=$ROOT/_output/image
PORT=${C8S_REGISTRY_PORT:-5123}
REG=127.0.0.1:$PORT
# Bridge, CNI network and subnet follow the port, so that two runs on one
# host (different C8S_REGISTRY_PORTs) do not share a network.
BRIDGE=c8sconf$PORT
SUBNET=10.$((PORT % 200 + 20)).0.0/16
RUNTIMES=${C8S_CONFORMANCE_RUNTIMES:-c8s runc}
FOCUS=${C8S_CONFORMANCE_FOCUS:-}
TIMEOUT=${C8S_CONFORMANCE_TIMEOUT:-90m}

for f in "$TOOLS/containerd" "$TOOLS/ctr" "$TOOLS/critest" "$TOOLS/cni/bridge" \
	"$ROOT/bin/containerd-shim-c8s-v2" "$IMAGE/vmlinuz" "$IMAGE/initrd.img"; do
	[[ -e $f ]] || { echo "conformance: $f is missing: run make tools build image" >&2; exit 1; }
done
command -v docker-registry >/dev/null || { echo "conformance: docker-registry not found: run make deps" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "conformance: containerd needs root" >&2; exit 1; }

WORK=$(mktemp -d /tmp/c8s-conf.XXXXXX)
OUT=${C8S_CONFORMANCE_OUT:-$ROOT/_output/conformance}
mkdir -p "$OUT"
pids=()
daemons=()
cleanup() {
	for d in "${daemons[@]}"; do "$WORK/c8s-containerd" stop --dir "$d" || true; done
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	# Shims and QEMUs of the daemons carry $WORK in their command lines.
	for p in $(pgrep -f -- "$WORK/" || true); do kill -9 "$p" 2>/dev/null || true; done
	grep -o " $WORK/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	ip link del "$BRIDGE" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

# --- local registry ---------------------------------------------------------
cat >"$WORK/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $WORK/registry}}
http: {addr: $REG}
EOF
docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://$REG/v2/" >/dev/null && break; sleep 0.1; done
curl -sf "http://$REG/v2/" >/dev/null || { cat "$WORK/registry.log"; echo "conformance: registry did not start on $REG" >&2; exit 1; }

mkdir -p "$WORK/certs.d/registry.k8s.io" "$WORK/certs.d/gcr.io"
for r in registry.k8s.io gcr.io; do
	cat >"$WORK/certs.d/$r/hosts.toml" <<EOF
server = "https://$r"
[host."http://$REG"]
  capabilities = ["pull", "resolve"]
EOF
done

# --- CNI: a bridge network for the pods that do not use the host's ----------
mkdir -p "$WORK/cni"
cat >"$WORK/cni/10-c8s-conformance.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "c8s-conformance-$PORT", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF

# A private copy of the guest image: a rebuild of _output/image during the
# (long) run must not change what the pods boot and attest against.
mkdir -p "$WORK/image"
cp "$IMAGE"/vmlinuz "$IMAGE"/initrd.img "$IMAGE"/rootfs.img "$IMAGE"/manifest.json "$WORK/image/"
cat >"$WORK/c8s.toml" <<EOF
[hypervisor]
virtio_fs_daemon = "/usr/lib/qemu/virtiofsd"
kernel = "$WORK/image/vmlinuz"
initrd = "$WORK/image/initrd.img"
[runtime]
state_dir = "$WORK/c8s"
EOF

# start_containerd NAME DEFAULT_RUNTIME: a private daemon in $WORK/NAME,
# through the harness the Go tests use (tests/cmd/c8s-containerd); its
# socket is $WORK/NAME/containerd.sock.
(cd "$ROOT" && go build -o "$WORK/c8s-containerd" ./tests/cmd/c8s-containerd)
start_containerd() {
	local d=$WORK/$1
	cat >"$WORK/containerd-$1.toml" <<EOF
[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE (as in this sandbox) runc cannot lower
  # oom_score_adj below containerd's: keep the sandbox's at containerd's.
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = '$2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]
  runtime_type = 'io.containerd.c8s.v2'
  # As the packaged drop-in: the node's devices mean nothing in the pod VM,
  # and the guest refuses its own (guest/spec/devices.go).
  privileged_without_host_devices = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s.options]
    ConfigPath = '$WORK/c8s.toml'
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['$TOOLS/cni']
  conf_dir = '$WORK/cni'
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '$WORK/certs.d'
EOF
	"$WORK/c8s-containerd" start --dir "$d" --cri --extra-config "$WORK/containerd-$1.toml" --tools-bin "$TOOLS" \
		--path-prefix "$ROOT/bin" --log "$OUT/containerd-$1.log" >/dev/null || {
		echo "conformance: containerd $1 did not start" >&2
		exit 1
	}
	daemons+=("$d")
}
stop_containerd() { # NAME
	"$WORK/c8s-containerd" stop --dir "$WORK/$1" || true
	local keep=() d
	for d in "${daemons[@]}"; do [[ $d == "$WORK/$1" ]] || keep+=("$d"); done
	daemons=("${keep[@]}")
}
# ctr warns about cgroup v1 on every call; keep its other messages.
ctr_seed() { "$TOOLS/ctr" --address "$WORK/seed/containerd.sock" --namespace seed "$@" 2> >(grep -v DEPRECATION >&2); }

# --- images: the busybox test image under every name critest pulls --------
echo "== images into the local registry $REG"
(cd "$ROOT" && go build -o "$WORK/mkbusyboximage" ./tests/cmd/mkbusyboximage)
start_containerd seed runc
# Applets are hard links, as in the upstream busybox image (masking
# /bin/ls must not mask every applet).
mk() { "$WORK/mkbusyboximage" "$@" --all-applets --hardlinks; }
mk "$WORK/busybox.tar" --name docker.io/c8s/busybox:conformance
mk "$WORK/pause.tar" --name docker.io/c8s/pause:conformance --cmd "sleep 2147483647"
# The web servers are busybox httpd serving a page. The nginx stand-in
# behaves as nginx where critest looks: pid 1's command line names the
# "nginx: master process" and /var/run/nginx.pid holds its pid (the pid
# namespace tests read both). The httpd stand-in logs a line naming
# itself, as httpd does (the container log test looks for it).
web() { # PORT
	printf '["sh", "-c", "mkdir -p /www && echo ok >/www/index.html && exec busybox httpd -f -p %s -h /www"]' "$1"
}
nginx='["sh", "-c", "trap '"'"'kill $srv; exit 0'"'"' TERM INT; mkdir -p /var/run /www && echo $$ >/var/run/nginx.pid && echo ok >/www/index.html; busybox httpd -f -p 80 -h /www & srv=$!; wait", "nginx: master process nginx -g daemon off;"]'
httpd='["sh", "-c", "mkdir -p /www && echo ok >/www/index.html && echo httpd: serving /www on port 80 >&2 && exec busybox httpd -f -p 80 -h /www"]'
mk "$WORK/nginx.tar" --name docker.io/c8s/nginx:conformance --cmd "$nginx"
mk "$WORK/httpd.tar" --name docker.io/c8s/httpd:conformance --cmd "$httpd"
mk "$WORK/web12003.tar" --name docker.io/c8s/web:12003 --cmd "$(web 12003)"
# critest's image whose default user (1000) belongs to a group of the
# image's own (50000): the SupplementalGroupsPolicy tests.
mk "$WORK/groups.tar" --name docker.io/c8s/groups:conformance --user 1000 \
	--passwd "default-user:x:1000:1000:default-user:/:/bin/sh" \
	--group "default-user:x:1000:" --group "group-defined-in-image:x:50000:default-user"
for t in busybox pause nginx httpd web12003 groups; do
	ctr_seed images import "$WORK/$t.tar" >/dev/null
done
push() { # LOCAL REMOTE-PATH
	ctr_seed images push --plain-http "$REG/$2" "$1" >/dev/null
}
push docker.io/c8s/pause:conformance pause:3.10.1
push docker.io/c8s/busybox:conformance e2e-test-images/busybox:1.29-2
push docker.io/c8s/nginx:conformance e2e-test-images/nginx:1.14-2
push docker.io/c8s/httpd:conformance e2e-test-images/httpd:2.4.39-4
staging=k8s-staging-cri-tools
for ref in test-image-1:latest test-image-2:latest test-image-3:latest test-image-tags:1 test-image-tags:2 \
	test-image-tags:3 test-image-latest:latest test-image-tag:test test-image-tag:all; do
	push docker.io/c8s/busybox:conformance "$staging/$ref"
done
push docker.io/c8s/web:12003 "$staging/hostnet-nginx-amd64:latest"
push docker.io/c8s/groups:conformance "$staging/test-image-predefined-group:latest"
echo "served: registry.k8s.io/{pause:3.10.1,e2e-test-images/{busybox:1.29-2,nginx:1.14-2,httpd:2.4.39-4}}," \
	"gcr.io/$staging/{test-image-{1,2,3,tags,latest,tag,predefined-group},hostnet-nginx-amd64}"

# --- critest, once per runtime ---------------------------------------------
declare -A ran passed failed skipped secs
for rt in $RUNTIMES; do
	echo "== critest with $rt as the default runtime"
	start_containerd "$rt" "$rt"
	args=(--runtime-endpoint "unix://$WORK/$rt/containerd.sock" --image-endpoint "unix://$WORK/$rt/containerd.sock"
		--ginkgo.no-color --ginkgo.junit-report "$OUT/$rt.xml" --ginkgo.timeout "$TIMEOUT")
	[[ -n $FOCUS ]] && args+=(--ginkgo.focus "$FOCUS")
	start=$SECONDS
	(cd "$WORK" && "$TOOLS/critest" "${args[@]}") >"$OUT/$rt.log" 2>&1 || true
	secs[$rt]=$((SECONDS - start))
	summary=$(grep -E '[0-9]+ Passed \| [0-9]+ Failed' "$OUT/$rt.log" | tail -1 || true)
	ran[$rt]=$(grep -oE 'Ran [0-9]+ of [0-9]+ Specs' "$OUT/$rt.log" | tail -1 | sed -E 's/Ran ([0-9]+) of ([0-9]+).*/\1\/\2/' || true)
	passed[$rt]=$(sed -nE 's/.* ([0-9]+) Passed.*/\1/p' <<<"$summary")
	failed[$rt]=$(sed -nE 's/.* ([0-9]+) Failed.*/\1/p' <<<"$summary")
	skipped[$rt]=$(sed -nE 's/.* ([0-9]+) Skipped.*/\1/p' <<<"$summary")
	[[ -n $summary ]] || { tail -40 "$OUT/$rt.log"; echo "conformance: critest with $rt gave no summary" >&2; }
	# Names of the specs that ran, and of those that failed, from the junit report.
	for st in failed passed; do
		grep -oE '<testcase name="[^"]*"[^>]*status="'$st'"' "$OUT/$rt.xml" 2>/dev/null |
			sed -E 's/<testcase name="\[It\] ([^"]*)".*/\1/' | sort >"$OUT/$rt.$st" || true
	done
	sort "$OUT/$rt.failed" "$OUT/$rt.passed" >"$OUT/$rt.ran"
	stop_containerd "$rt"
done

echo
printf '%-10s %8s %8s %8s %8s %8s\n' runtime ran passed failed skipped seconds
for rt in $RUNTIMES; do
	printf '%-10s %8s %8s %8s %8s %8s\n' "$rt" "${ran[$rt]:-?}" "${passed[$rt]:-?}" "${failed[$rt]:-?}" "${skipped[$rt]:-?}" "${secs[$rt]}"
done
set -- $RUNTIMES
if [[ $# == 2 ]]; then
	echo
	# Differences among the specs that ran on both.
	echo "== failed with $1, passed with $2:"
	comm -12 "$OUT/$1.failed" "$OUT/$2.passed" | sed 's/^/  /'
	echo "== failed with $2, passed with $1:"
	comm -12 "$OUT/$2.failed" "$OUT/$1.passed" | sed 's/^/  /'
	echo "== failed with both (images or host features missing here, see the logs):"
	comm -12 "$OUT/$1.failed" "$OUT/$2.failed" | sed 's/^/  /'
fi
echo "reports and critest logs: $OUT"
