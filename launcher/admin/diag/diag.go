// Package diag runs the node checks behind `c8s-launcher check`: can this
// host run c8s pod VMs, and for which TEE? Each check yields pass, warn or
// fail, a one-line detail and, unless it passed, a one-line remediation
// hint.
//
// Severity follows the TEE the node is checked for (Options.TEE, by default
// hypervisor.tee of the config): a missing piece that TEE needs is a fail;
// the same gap for another TEE, or something optional (IGVM, migration, the
// kubelet), is a warn. A sim node without working KVM warns, since pod VMs
// then run under TCG.
//
// Every host file is read under Options.Root, so the checks run against
// fixture trees (testdata/) as against the live host ("/"). Paths in the
// report are host paths, never root-prefixed.
//
// # JSON schema (c8s.io/check/v1)
//
// `c8s-launcher check --json` prints one object; fields are only ever
// added to this schema, never renamed or removed:
//
//	{
//	  "schema":  "c8s.io/check/v1",
//	  "tee":     "sim" | "snp" | "tdx",    // the TEE severities were judged for
//	  "summary": {"pass": N, "warn": N, "fail": N},
//	  "checks": [                          // always in the order of IDs below
//	    {
//	      "id":     "kvm.probe",           // stable identifier
//	      "title":  "KVM runs a guest",    // human label
//	      "status": "pass" | "warn" | "fail",
//	      "detail": "…",                   // one line: what was found
//	      "hint":   "…",                   // one line: what to do (absent on pass)
//	      "facts":  {"key": "value"}       // optional machine-readable findings
//	    }
//	  ]
//	}
//
// The check IDs, in order: cpu.virt, kvm.device, kvm.probe, qemu.binary,
// qemu.snp, qemu.tdx, qemu.igvm, qemu.migration, firmware, snp.host,
// tdx.host, image, image.digest, containerd.socket, containerd.handler,
// kubelet.socket.
package diag

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/manifest"
)

// Schema identifies the JSON report format.
const Schema = "c8s.io/check/v1"

// Status is the outcome of one check.
type Status string

// Statuses.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check's outcome.
type Result struct {
	ID     string            `json:"id"`
	Title  string            `json:"title"`
	Status Status            `json:"status"`
	Detail string            `json:"detail"`
	Hint   string            `json:"hint,omitempty"`
	Facts  map[string]string `json:"facts,omitempty"`
}

// Summary counts results by status.
type Summary struct {
	Pass int `json:"pass"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
}

// Report is the outcome of all checks.
type Report struct {
	Schema  string   `json:"schema"`
	TEE     string   `json:"tee"`
	Summary Summary  `json:"summary"`
	Checks  []Result `json:"checks"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return r.Summary.Fail > 0 }

// Default host paths.
const (
	DefaultContainerdAddress = "/run/containerd/containerd.sock"
	DefaultKubeletSocket     = "/var/lib/kubelet/device-plugins/kubelet.sock"
	DefaultFirmware          = "/usr/share/ovmf/OVMF.fd"
	DefaultQGSSocket         = "/var/run/tdx-qgs/qgs.socket"
	DefaultImageDir          = "/usr/local/share/c8s"
)

// ProbeFunc decides whether KVM runs guests, as accel.Choose does for
// hypervisor.accel = "auto". cacheDir is empty when the cache must not be
// used.
type ProbeFunc func(ctx context.Context, qemu, kernel, cacheDir string) (accel.Result, error)

// Options says what to check and where.
type Options struct {
	// Root is the host's filesystem root ("/" or empty for the live host).
	Root string
	// Config is the effective c8s configuration.
	Config config.Config
	// TEE is the TEE severities are judged for (default Config.Hypervisor.TEE).
	TEE string
	// ImageDir holds the guest image and manifest.json (default: the
	// directory of hypervisor.kernel, else DefaultImageDir).
	ImageDir string
	// ContainerdAddress is containerd's socket (default DefaultContainerdAddress).
	ContainerdAddress string
	// ContainerdConfig is containerd's main config (default ctrdconfig.DefaultPath).
	ContainerdConfig string
	// KubeletSocket is the kubelet's device plugin socket (default DefaultKubeletSocket).
	KubeletSocket string
	// NoCache makes the KVM probe ignore and not write the cached result.
	NoCache bool
	// Probe runs the KVM probe. Nil means accel.Choose on the live host;
	// with another Root the probe is not run (warn) unless Probe is set.
	Probe ProbeFunc
}

func (o *Options) setDefaults() {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.TEE == "" {
		o.TEE = o.Config.Hypervisor.TEE
	}
	if o.ImageDir == "" {
		o.ImageDir = DefaultImageDir
		if k := o.Config.Hypervisor.Kernel; k != "" {
			o.ImageDir = dirOf(k)
		}
	}
	if o.ContainerdAddress == "" {
		o.ContainerdAddress = DefaultContainerdAddress
	}
	if o.ContainerdConfig == "" {
		o.ContainerdConfig = ctrdconfig.DefaultPath
	}
	if o.KubeletSocket == "" {
		o.KubeletSocket = DefaultKubeletSocket
	}
	if o.Probe == nil && o.live() {
		o.Probe = func(ctx context.Context, qemu, kernel, cacheDir string) (accel.Result, error) {
			return accel.Choose(ctx, accel.Auto, qemu, kernel, cacheDir)
		}
	}
}

func (o *Options) live() bool { return o.Root == "" || o.Root == "/" }

// path returns where host path p is under the root.
func (o *Options) path(p string) string { return ctrdconfig.RootJoin(o.Root, p) }

// unroot removes the root prefix from paths in a message.
func (o *Options) unroot(msg string) string {
	if o.live() {
		return msg
	}
	return strings.ReplaceAll(msg, strings.TrimSuffix(o.Root, "/"), "")
}

// readFile reads host path p under the root.
func (o *Options) readFile(p string) ([]byte, error) { return os.ReadFile(o.path(p)) }

// exists reports whether host path p exists under the root.
func (o *Options) exists(p string) bool {
	_, err := os.Stat(o.path(p))
	return err == nil
}

// dialUnix connects to the unix socket at host path p under the root.
func (o *Options) dialUnix(ctx context.Context, p string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", o.path(p))
	if err != nil {
		return err
	}
	return c.Close()
}

// severity is Fail when the checked TEE is one of tees, else Warn.
func (o *Options) severity(tees ...string) Status {
	for _, t := range tees {
		if o.TEE == t {
			return Fail
		}
	}
	return Warn
}

// state is what checks share: facts found by earlier checks.
type state struct {
	o            *Options
	qemu         string // host path of the QEMU binary, "" if missing
	qemuResolved bool
	qemuHelp     string             // output of qemu -help, "" if QEMU does not run
	objects      map[string]bool    // QOM types QEMU knows
	containerdUp bool               // containerd answered on its socket
	manifest     *manifest.Manifest // the verified image manifest
	disc         *discovery.Result
	discErr      error
}

type check struct {
	id, title string
	run       func(ctx context.Context, s *state) Result
}

// checks lists every check in report order.
var checks = []check{
	{"cpu.virt", "CPU virtualization", checkCPU},
	{"kvm.device", "KVM device", checkKVMDevice},
	{"kvm.probe", "KVM runs a guest", checkKVMProbe},
	{"qemu.binary", "QEMU", checkQEMU},
	{"qemu.snp", "QEMU SEV-SNP support", checkQEMUSNP},
	{"qemu.tdx", "QEMU TDX support", checkQEMUTDX},
	{"qemu.igvm", "QEMU IGVM support", checkQEMUIGVM},
	{"qemu.migration", "QEMU incoming migration", checkQEMUMigration},
	{"firmware", "Firmware", checkFirmware},
	{"snp.host", "SEV-SNP host enablement", checkSNPHost},
	{"tdx.host", "TDX host enablement", checkTDXHost},
	{"image", "Guest image", checkImage},
	{"image.digest", "Expected launch digest", checkImageDigest},
	{"containerd.socket", "containerd reachable", checkContainerdSocket},
	{"containerd.handler", "c8s handlers in containerd", checkContainerdHandler},
	{"kubelet.socket", "kubelet device plugin socket", checkKubelet},
}

// IDs returns the check IDs in report order.
func IDs() []string {
	ids := make([]string, len(checks))
	for i, c := range checks {
		ids[i] = c.id
	}
	return ids
}

// Run runs every check.
func Run(ctx context.Context, o Options) *Report {
	o.setDefaults()
	s := &state{o: &o}
	rep := &Report{Schema: Schema, TEE: o.TEE, Checks: []Result{}}
	for _, c := range checks {
		r := c.run(ctx, s)
		r.ID, r.Title = c.id, c.title
		if r.Status == Pass {
			r.Hint = ""
		}
		switch r.Status {
		case Pass:
			rep.Summary.Pass++
		case Warn:
			rep.Summary.Warn++
		default:
			r.Status = Fail
			rep.Summary.Fail++
		}
		rep.Checks = append(rep.Checks, r)
	}
	return rep
}

// WriteJSON writes the report as indented JSON (the c8s.io/check/v1 schema).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes one line per check, a hint line under each that did not
// pass, and a summary line.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-4s  %-18s  %s: %s\n", strings.ToUpper(string(c.Status)), c.ID, c.Title, c.Detail)
		if c.Hint != "" {
			fmt.Fprintf(&b, "      %-18s  hint: %s\n", "", c.Hint)
		}
	}
	fmt.Fprintf(&b, "checked for tee=%s: %d pass, %d warn, %d fail\n", r.TEE, r.Summary.Pass, r.Summary.Warn, r.Summary.Fail)
	_, err := io.WriteString(w, b.String())
	return err
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "/"
}
