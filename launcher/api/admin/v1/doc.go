// Package admin is the node management API of c8s pods (admin.proto):
// each pod's shim serves it on its ttrpc socket beside containerd's task
// service, and c8s-launcher calls it. It lives with the launcher so that
// dependencies keep pointing from the shim to the launcher.
package admin
