package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Rlimit bounds one resource limit of a container's processes
// (process.rlimits):
//
//	rlimits = [{ type = "RLIMIT_NOFILE", max = 65536 }]
//
// A process may have the limit with a hard value of at most Max (the
// soft value is at most the hard one). A type that neither the rule nor,
// without rlimits, DefaultRlimits names is refused: raising
// RLIMIT_MEMLOCK, RLIMIT_NPROC or RLIMIT_RTPRIO lets a container take the
// VM from the agent, and RLIMIT_STACK unlimited switches the process to
// the legacy mmap layout. Lowering a limit is the host's to do (it can
// deny service anyway). RLIMIT_CORE is always 0 (guest/spec).
type Rlimit struct {
	// Type is the limit's name as in OCI specs: "RLIMIT_NOFILE".
	Type string `toml:"type"`
	// Max bounds the hard limit.
	Max uint64 `toml:"max"`
}

// Rlimits are the resource limits a rule may bound (Linux's, as OCI
// names them).
var Rlimits = []string{
	"RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE",
	"RLIMIT_LOCKS", "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
	"RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_RTPRIO",
	"RLIMIT_RTTIME", "RLIMIT_SIGPENDING", "RLIMIT_STACK",
}

// DefaultRlimits are the limits a container may set when its rule lists
// none: RLIMIT_NOFILE, which containerd sets in every spec (1024) and
// nodes commonly raise, up to 1048576 (Linux's default fs.nr_open).
var DefaultRlimits = []Rlimit{{Type: "RLIMIT_NOFILE", Max: 1 << 20}}

// DefaultUmask is the least restrictive umask a process may have when its
// rule has none: files it creates are not writable by the group and
// others (the runtime's own default). A process without a umask in its
// spec gets this one.
const DefaultUmask = 0o022

// AllowedRlimits returns the limits the rule allows.
func (c *Container) AllowedRlimits() []Rlimit {
	if c.Rlimits == nil {
		return DefaultRlimits
	}
	return c.Rlimits
}

// validateProcess checks the process fields of the rule at key.
func validateProcess(key string, c *Container) error {
	var errs []error
	if c.Umask != nil && *c.Umask > 0o777 {
		errs = append(errs, fmt.Errorf("%s.umask: %#o is not a umask (0 to 0o777)", key, *c.Umask))
	}
	seen := map[string]bool{}
	for i, r := range c.Rlimits {
		switch {
		case !slices.Contains(Rlimits, r.Type):
			errs = append(errs, fmt.Errorf("%s.rlimits[%d].type: %q is not one of %s", key, i, r.Type, strings.Join(Rlimits, ", ")))
		case seen[r.Type]:
			errs = append(errs, fmt.Errorf("%s.rlimits[%d].type: %s is bounded twice", key, i, r.Type))
		}
		seen[r.Type] = true
	}
	return errors.Join(errs...)
}

// validateVolume checks a mount's emptyDir volume name.
func (m Mount) validateVolume() error {
	switch {
	case m.Volume == "":
		return nil
	case m.Kind != KindEmptyDir:
		return fmt.Errorf("volume: only an emptydir mount names its volume (this one is %s)", m.Kind)
	case !m.Volume.IsRegex() && (strings.Contains(string(m.Volume), "/") || m.Volume == "." || m.Volume == ".."):
		return fmt.Errorf("volume %q: not a volume name", m.Volume)
	}
	if err := m.Volume.Validate(); err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	return nil
}
