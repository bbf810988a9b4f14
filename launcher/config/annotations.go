package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kata-containers/kata-containers/src/runtime/virtcontainers/pkg/annotations"
)

// annotationSetters maps an allowlist name to the Kata annotation it
// enables and how its value is applied.
var annotationSetters = map[string]struct {
	key   string
	apply func(h *Hypervisor, value string) error
}{
	"default_vcpus": {annotations.DefaultVCPUs, func(h *Hypervisor, v string) error {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if err != nil || n < 1 || n > MaxVCPUs {
			return fmt.Errorf("want an integer 1..%d", MaxVCPUs)
		}
		h.DefaultVCPUs = uint32(n)
		return nil
	}},
	"default_memory": {annotations.DefaultMemory, func(h *Hypervisor, v string) error {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if err != nil || n < MinMemoryMiB || n > MaxMemoryMiB {
			return fmt.Errorf("want an integer number of MiB %d..%d", MinMemoryMiB, MaxMemoryMiB)
		}
		h.DefaultMemoryMiB = uint32(n)
		return nil
	}},
	"kernel_params": {annotations.KernelParams, func(h *Hypervisor, v string) error {
		v = strings.TrimSpace(v)
		if strings.ContainsAny(v, "\x00\n") {
			return fmt.Errorf("kernel parameters must be one line")
		}
		if v == "" {
			return nil
		}
		if h.KernelParams == "" {
			h.KernelParams = v
		} else {
			h.KernelParams += " " + v
		}
		return nil
	}},
}

// AnnotationNames lists the names hypervisor.enable_annotations accepts.
func AnnotationNames() []string { return sortedKeys(annotationSetters) }

// WithAnnotations returns a copy of c with the allowlisted pod annotations
// applied. Annotations that are not allowlisted or not known are ignored;
// an allowlisted annotation with an invalid value is an error naming it.
func (c Config) WithAnnotations(ann map[string]string) (Config, error) {
	out := c
	out.Hypervisor.EnableAnnotations = append([]string(nil), c.Hypervisor.EnableAnnotations...)
	// Apply in a fixed order so that errors and results are deterministic.
	for _, name := range AnnotationNames() {
		if !contains(c.Hypervisor.EnableAnnotations, name) {
			continue
		}
		s := annotationSetters[name]
		v, ok := ann[s.key]
		if !ok {
			continue
		}
		if err := s.apply(&out.Hypervisor, v); err != nil {
			return c, fmt.Errorf("annotation %s=%q: %v", s.key, v, err)
		}
	}
	return out, nil
}
