// Package packaging holds the files c8s installs on a node: the containerd
// drop-in that registers the runtime handler and the default c8s config.
// Their rendered forms are golden-tested here.
package packaging
