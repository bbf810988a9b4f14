// Package admin is the node management API of c8s pods (admin.proto):
// each pod's shim serves it on its ttrpc socket beside containerd's task
// service, and c8s-launcher calls it. It is the shim's API, so it lives
// with the shim, as the agent's API lives in guest/api: a leaf of
// generated code that imports nothing of c8s, so the launcher may import
// it without depending on the shim.
package admin
