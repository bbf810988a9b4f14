//go:build tools

// Package kubernetes pins the Kubernetes components that the c8s end-to-end
// tests on a real cluster run: etcd, kube-apiserver, kube-controller-manager
// (for the Deployment test), kube-scheduler and kubelet. hack/build-tools.sh
// builds them from this module, at the k8s.io/kubernetes version required
// here, into the tools output directory.
//
// It is a module of its own, apart from ../ (containerd), so that the two
// dependency graphs do not move each other's versions. k8s.io/kubernetes
// refers to its staging modules by relative paths; the replace block points
// each at its published release of the same minor version.
package kubernetes

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
