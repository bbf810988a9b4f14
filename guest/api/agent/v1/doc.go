// Package agent is the host↔guest API of c8s: the ttrpc services that
// c8s-agent serves inside the pod VM and the shim calls, generated from
// agent.proto by `make protos`.
package agent
