//go:build !amd64

package discovery

// HostCPUID is nil where there is no x86 CPUID: discovery then relies on
// sysfs alone.
var HostCPUID CPUIDFunc
