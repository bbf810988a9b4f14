package broker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// ResourcePolicy is the owner's resource policy: which attested workloads
// may read which resources. The owner writes it (c8s-launcher kbs
// --resource-policy FILE); nothing in it comes from the node. It is TOML,
// or JSON with the same keys when the file name ends in .json; unknown
// keys are refused, so that a misspelt restriction is not silently
// dropped.
//
//	# A workload: what an attested pod must show to be it. Every field
//	# given must hold; at least one of init_data, init_data_files,
//	# measurements or tdx is required.
//	[workloads.db-app]
//	tee = ["snp", "sim"]                # any of "snp", "tdx", "sim"; absent: any
//	init_data = ["3f2a…"]               # init data digests: SNP HOST_DATA (64 hex
//	                                    # digits) or TDX MRCONFIGID (96), as
//	                                    # initdata.Digest / DigestTDX compute them
//	init_data_files = ["db-app.toml"]   # or the documents (relative to this file);
//	                                    # both digests are taken
//	measurements = ["9c1e…"]            # SNP (and sim) launch digests (96 hex digits)
//	min_tcb = { bl = 3, tee = 0, snp = 20, ucode = 200 }  # SNP REPORTED_TCB, per component
//	min_tee_tcb_svn = "0300…"           # TDX TEE_TCB_SVN (32 hex digits), per byte
//	allow_debug = false                 # default: a debug guest is refused
//	allow_host_rootfs = false           # true: the broker accepts this workload's
//	                                    # init data (init_data, init_data_files)
//	                                    # though rules of its [policy] pin no layers,
//	                                    # so the node supplies those containers'
//	                                    # files (the owner trusts it with them)
//	gpu = { count = 1 }                 # verified GPU evidence required (gpu.go)
//	[[workloads.db-app.tdx]]            # TDX launch identities, any of
//	mrtd = "…"                          # 96 hex digits
//	rtmrs = ["", "…", "…", ""]          # RTMR0-3; "" is not checked
//
//	# A rule: a resource, or a pattern, and the workloads that may read it.
//	[[resources]]
//	name = "db-password"                # for messages (default: the path)
//	path = "default/key/db-password"    # REPO/TYPE/TAG; "*" stands for one whole
//	                                    # segment: "default/*/db-password"
//	workloads = ["db-app"]
//
// A resource is released when a rule whose path matches it names a
// workload the session attested as. No matching rule: refused (default
// deny). A refusal names the resource, each matching rule and workload,
// and the field that failed, with the value the evidence showed.
//
// Measurements here narrow the launch reference values (which say what a
// genuine pod is at all, --reference-values) to the images a workload may
// run; min_tcb and allow_debug narrow the attestation policy's. A field
// for the other TEE (min_tcb on a TDX pod, min_tee_tcb_svn or tdx on an
// SNP one) refuses: a rule is never weaker than it reads.
type ResourcePolicy struct {
	Workloads map[string]*Workload `toml:"workloads" json:"workloads"`
	Rules     []*Rule              `toml:"resources" json:"resources"`
	// Mesh gives workloads their identities in the attested mesh
	// (meshpolicy.go): which certificates the mesh CA issues to whom.
	Mesh *MeshPolicy `toml:"mesh" json:"mesh"`
}

// Workload is what an attested pod must show to be one of the owner's
// workloads (ResourcePolicy).
type Workload struct {
	TEE           []string      `toml:"tee" json:"tee"`
	InitData      []attest.Hex  `toml:"init_data" json:"init_data"`
	InitDataFiles []string      `toml:"init_data_files" json:"init_data_files"`
	Measurements  []attest.Hex  `toml:"measurements" json:"measurements"`
	TDX           []TDXIdentity `toml:"tdx" json:"tdx"`
	MinTCB        *TCB          `toml:"min_tcb" json:"min_tcb"`
	// MinTCBByLine is the minimum SNP TCB per product line ("Milan",
	// "Genoa", "Turin"), whose patch levels are numbered apart: a line's
	// entry stands in for MinTCB for its evidence. With entries, evidence
	// of a line that has none is judged by MinTCB, or refused without it.
	MinTCBByLine map[string]*TCB `toml:"min_tcb_by_line" json:"min_tcb_by_line"`
	MinTeeTCBSVN attest.Hex      `toml:"min_tee_tcb_svn" json:"min_tee_tcb_svn"`
	AllowDebug   bool            `toml:"allow_debug" json:"allow_debug"`
	// SNPGuestPolicy, when set, is an SNP guest policy (e.g. 0x1830000)
	// whose restrictions the evidence's GUEST_POLICY and PLATFORM_INFO
	// must have: SMT off unless it allows SMT, and each of SINGLE_SOCKET,
	// MEM_AES_256_XTS, RAPL_DIS, CIPHERTEXT_HIDING, PAGE_SWAP_DISABLE and
	// the ABI version it sets (attest.CheckSNPRequiredPolicy).
	SNPGuestPolicy uint64 `toml:"snp_guest_policy" json:"snp_guest_policy"`
	// TDAttributes and XFAM, when set, are the TD_ATTRIBUTES and XFAM (8
	// bytes each, as in the quote) a TDX pod must have been launched with.
	TDAttributes attest.Hex `toml:"td_attributes" json:"td_attributes"`
	XFAM         attest.Hex `toml:"xfam" json:"xfam"`
	// AllowHostRootfs accepts the workload's init data documents though
	// rules of their [policy] bind no image (Broker.AllowHostRootfsPods,
	// for these documents only). Requires init_data or init_data_files.
	AllowHostRootfs bool `toml:"allow_host_rootfs" json:"allow_host_rootfs"`
	// GPU, when set, requires verified GPU evidence (gpu.go).
	GPU *GPURequirement `toml:"gpu" json:"gpu"`

	name    string
	digests []attest.Hex // InitData and the digests of InitDataFiles
}

// TDXIdentity is one TDX launch identity: MRTD and the RTMRs (an empty
// entry is not checked).
type TDXIdentity struct {
	MRTD  attest.Hex   `toml:"mrtd" json:"mrtd"`
	RTMRs []attest.Hex `toml:"rtmrs" json:"rtmrs"`
}

// TCB is a minimum SNP TCB, component by component, compared with the
// evidence's TCB read in its own product line's layout. FMC is Turin's
// and later lines' only: evidence of earlier lines has none to judge.
type TCB struct {
	FMC   uint8 `toml:"fmc" json:"fmc"`
	BL    uint8 `toml:"bl" json:"bl"`
	TEE   uint8 `toml:"tee" json:"tee"`
	SNP   uint8 `toml:"snp" json:"snp"`
	UCode uint8 `toml:"ucode" json:"ucode"`
}

// in is t as a minimum for evidence of product line.
func (t TCB) in(line string) snpext.TCB {
	min := snpext.TCB{Line: line, FMC: t.FMC, Bootloader: t.BL, TEE: t.TEE, SNP: t.SNP, Microcode: t.UCode}
	if !snpext.HasFMC(line) {
		min.FMC = 0
	}
	return min
}

// Rule maps a resource, or a pattern of them, to the workloads that may
// read it.
type Rule struct {
	Name      string   `toml:"name" json:"name"`
	Path      string   `toml:"path" json:"path"`
	Workloads []string `toml:"workloads" json:"workloads"`
}

// Attested is what a session's verified evidence and measured init data
// show: the workload a resource rule is checked against.
type Attested struct {
	// TEE is "snp", "tdx" or "sim" (SNP-format evidence under the node's
	// simulated root).
	TEE string
	// Reference names the owner's reference values the launch matched.
	Reference string
	// Measurement is the SNP launch digest; MRTD and RTMRs the TDX ones.
	Measurement attest.Hex
	MRTD        attest.Hex
	RTMRs       []attest.Hex
	// InitDataDigest is the evidence's HOST_DATA (SNP) or MRCONFIGID (TDX).
	InitDataDigest attest.Hex
	// TCB is the SNP REPORTED_TCB and LaunchTCB its LAUNCH_TCB, both in
	// the layout of TCBLine, the evidence's product line; TeeTCBSVN the
	// TDX TEE_TCB_SVN.
	TCB, LaunchTCB uint64
	TCBLine        string
	TeeTCBSVN      attest.Hex
	// Debug is set for a guest launched debuggable.
	Debug bool
	// GuestPolicy and PlatformInfo are the SNP report's GUEST_POLICY and
	// PLATFORM_INFO; TDAttributes and XFAM the TDX quote's.
	GuestPolicy, PlatformInfo uint64
	TDAttributes, XFAM        attest.Hex
	// InitData is the measured document the pod sent (nil: none sent,
	// under AllowUnconfinedHost only).
	InitData *initdata.InitData
	// HostRootfs is set when InitData was accepted only through a
	// workload's allow_host_rootfs: rules of its [policy] leave their
	// containers' files to the node. Only workloads that set
	// allow_host_rootfs themselves are then this pod.
	HostRootfs bool
	// GPUs are the GPUs whose attestation reports the session verified
	// (additional evidence, gpu.go).
	GPUs []GPUClaims
}

// LoadResourcePolicy reads a resource policy file (ResourcePolicy); its
// init_data_files are read relative to it.
func LoadResourcePolicy(path string) (*ResourcePolicy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("resource policy: %w", err)
	}
	p, err := ParseResourcePolicy(b, strings.HasSuffix(path, ".json"), filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("resource policy %s: %w", path, err)
	}
	return p, nil
}

// ParseResourcePolicy decodes a resource policy (JSON when isJSON, else
// TOML) and validates it; dir is where init_data_files are.
func ParseResourcePolicy(data []byte, isJSON bool, dir string) (*ResourcePolicy, error) {
	var p ResourcePolicy
	if isJSON {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
	} else {
		dec := toml.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			var se *toml.StrictMissingError
			if errors.As(err, &se) && len(se.Errors) > 0 {
				row, _ := se.Errors[0].Position()
				return nil, fmt.Errorf("unknown key %s (line %d): see ResourcePolicy for the keys", strings.Join(se.Errors[0].Key(), "."), row)
			}
			return nil, err
		}
	}
	if err := p.validate(dir); err != nil {
		return nil, err
	}
	return &p, nil
}

const (
	hostDataSize = 32
	digestSize   = 48
	tcbSVNSize   = 16
)

func (p *ResourcePolicy) validate(dir string) error {
	if len(p.Rules) == 0 && p.Mesh == nil {
		return fmt.Errorf("no [[resources]] rules: the broker would release nothing")
	}
	for _, name := range slices.Sorted(maps.Keys(p.Workloads)) {
		w := p.Workloads[name]
		if w == nil {
			return fmt.Errorf("workload %q is empty", name)
		}
		w.name = name
		if err := w.validate(dir); err != nil {
			return fmt.Errorf("workload %q: %w", name, err)
		}
	}
	for i, r := range p.Rules {
		if r.Name == "" {
			r.Name = r.Path
		}
		if err := validPattern(r.Path); err != nil {
			return fmt.Errorf("resources[%d] (%s): %w", i, r.Name, err)
		}
		if len(r.Workloads) == 0 {
			return fmt.Errorf("resources[%d] (%s): no workloads: name the workloads that may read it", i, r.Name)
		}
		for _, w := range r.Workloads {
			if p.Workloads[w] == nil {
				return fmt.Errorf("resources[%d] (%s): workload %q is not defined under [workloads]", i, r.Name, w)
			}
		}
	}
	return p.Mesh.validate(p)
}

func (w *Workload) validate(dir string) error {
	for _, t := range w.TEE {
		if t != "snp" && t != "tdx" && t != "sim" {
			return fmt.Errorf("tee %q: want snp, tdx or sim", t)
		}
	}
	for _, d := range w.InitData {
		if len(d) != hostDataSize && len(d) != digestSize {
			return fmt.Errorf("init_data %s is %d bytes: want 32 (SNP HOST_DATA) or 48 (TDX MRCONFIGID)", d, len(d))
		}
		w.digests = append(w.digests, d)
	}
	for _, f := range w.InitDataFiles {
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		doc, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("init_data_files: %w", err)
		}
		if _, err := initdata.Parse(doc); err != nil {
			return fmt.Errorf("init_data_files %s: %w", f, err)
		}
		snp, tdx := initdata.Digest(doc), initdata.DigestTDX(doc)
		w.digests = append(w.digests, snp[:], tdx[:])
	}
	for _, m := range w.Measurements {
		if len(m) != digestSize {
			return fmt.Errorf("measurements %s is %d bytes, want 48", m, len(m))
		}
	}
	for i, id := range w.TDX {
		if len(id.MRTD) != digestSize {
			return fmt.Errorf("tdx[%d].mrtd is %d bytes, want 48", i, len(id.MRTD))
		}
		if len(id.RTMRs) > 4 {
			return fmt.Errorf("tdx[%d].rtmrs: %d entries, TDX has 4", i, len(id.RTMRs))
		}
		for j, r := range id.RTMRs {
			if len(r) != 0 && len(r) != digestSize {
				return fmt.Errorf("tdx[%d].rtmrs[%d] is %d bytes, want 48 or empty", i, j, len(r))
			}
		}
	}
	for line, t := range w.MinTCBByLine {
		if line != snpext.Milan && line != snpext.Genoa && line != snpext.Turin {
			return fmt.Errorf("min_tcb_by_line.%s: want Milan, Genoa or Turin", line)
		}
		if t == nil {
			return fmt.Errorf("min_tcb_by_line.%s: empty", line)
		}
	}
	if len(w.MinTeeTCBSVN) != 0 && len(w.MinTeeTCBSVN) != tcbSVNSize {
		return fmt.Errorf("min_tee_tcb_svn is %d bytes, want 16", len(w.MinTeeTCBSVN))
	}
	if err := w.validateLaunch(); err != nil {
		return err
	}
	if w.AllowHostRootfs && len(w.digests) == 0 {
		return fmt.Errorf("allow_host_rootfs names the init data documents whose containers may run the node's root file systems: give init_data or init_data_files")
	}
	if len(w.digests) == 0 && len(w.Measurements) == 0 && len(w.TDX) == 0 {
		return fmt.Errorf("pins neither init data nor a launch measurement, so any attested pod would be it: give init_data, init_data_files, measurements or tdx")
	}
	if w.GPU != nil {
		return w.GPU.validate()
	}
	return nil
}

// validPattern checks a rule's path: REPO/TYPE/TAG, each segment a name
// or "*".
func validPattern(p string) error {
	segs := strings.Split(p, "/")
	if len(segs) != 3 {
		return fmt.Errorf("path %q: want REPO/TYPE/TAG (three segments, \"*\" for any one)", p)
	}
	for _, s := range segs {
		switch {
		case s == "*":
		case s == "" || s == "." || s == "..":
			return fmt.Errorf("path %q: segment %q is not allowed", p, s)
		case strings.Contains(s, "*"):
			return fmt.Errorf("path %q: \"*\" stands for a whole segment only, not part of one (%q)", p, s)
		}
	}
	return nil
}

// matches reports whether the rule's path covers resource (REPO/TYPE/TAG).
func (r *Rule) matches(resource string) bool {
	want, got := strings.Split(r.Path, "/"), strings.Split(resource, "/")
	if len(want) != len(got) {
		return false
	}
	for i := range want {
		if want[i] != "*" && want[i] != got[i] {
			return false
		}
	}
	return true
}

// InitDataDigests returns every init data digest the policy's workloads
// pin: the owner's documents, which the broker accepts as pinned.
func (p *ResourcePolicy) InitDataDigests() []attest.Hex {
	var out []attest.Hex
	for _, name := range slices.Sorted(maps.Keys(p.Workloads)) {
		out = append(out, p.Workloads[name].digests...)
	}
	return out
}

// AllowsHostRootfs reports whether a workload with allow_host_rootfs pins
// init data document doc (by its SNP or TDX digest). False for a nil
// policy.
func (p *ResourcePolicy) AllowsHostRootfs(doc []byte) bool {
	if p == nil {
		return false
	}
	snp, tdx := initdata.Digest(doc), initdata.DigestTDX(doc)
	for _, w := range p.Workloads {
		if w.AllowHostRootfs && (containsHex(w.digests, snp[:]) || containsHex(w.digests, tdx[:])) {
			return true
		}
	}
	return false
}

// Denial is a resource request the policy, or the pod's own measured
// document, refused.
type Denial struct {
	Resource string
	// Reasons say, per rule and workload checked, which field failed.
	Reasons []string
}

func (d *Denial) Error() string {
	return fmt.Sprintf("resource %s refused: %s", d.Resource, strings.Join(d.Reasons, "; "))
}

// Allow returns nil if a rule covering resource names a workload a
// matches, or a *Denial naming each rule and workload and what failed.
func (p *ResourcePolicy) Allow(resource string, a *Attested) error {
	d := &Denial{Resource: resource}
	for _, r := range p.Rules {
		if !r.matches(resource) {
			continue
		}
		for _, name := range r.Workloads {
			why := p.Workloads[name].check(a)
			if why == "" {
				return nil
			}
			d.Reasons = append(d.Reasons, fmt.Sprintf("%s: not in resource policy rule %q (workload %q)", why, r.Name, name))
		}
	}
	if len(d.Reasons) == 0 {
		d.Reasons = []string{"no rule in the resource policy covers it (default deny): add a [[resources]] rule naming the workloads that may read it"}
	}
	return d
}

// check returns "" if a is this workload, or the first field that is not
// as the workload says, with the value a shows.
func (w *Workload) check(a *Attested) string {
	if a.HostRootfs && !w.AllowHostRootfs {
		return "init data whose [policy] leaves containers' files to the node (accepted through another workload's allow_host_rootfs): the workload does not set allow_host_rootfs"
	}
	if len(w.TEE) > 0 && !slices.Contains(w.TEE, a.TEE) {
		return fmt.Sprintf("TEE %s: the workload runs on %s", a.TEE, strings.Join(w.TEE, ", "))
	}
	if a.Debug && !w.AllowDebug {
		return "a debug guest (the host can read its memory): the workload does not set allow_debug"
	}
	tdx := a.TEE == kbsapi.TeeTDX
	if len(w.Measurements) > 0 {
		if tdx {
			return "TEE tdx: the workload pins SNP measurements, give tdx identities instead"
		}
		if !containsHex(w.Measurements, a.Measurement) {
			return fmt.Sprintf("launch measurement %s: not one of the workload's measurements", a.Measurement)
		}
	}
	if len(w.TDX) > 0 {
		if !tdx {
			return fmt.Sprintf("TEE %s: the workload pins TDX identities, give measurements instead", a.TEE)
		}
		if why := w.checkTDX(a); why != "" {
			return why
		}
	}
	if len(w.digests) > 0 && !containsHex(w.digests, a.InitDataDigest) {
		field := "HOST_DATA"
		if tdx {
			field = "MRCONFIGID"
		}
		return fmt.Sprintf("init data digest %s (%s): not one of the workload's init_data", a.InitDataDigest, field)
	}
	if w.MinTCB != nil || len(w.MinTCBByLine) > 0 {
		if tdx {
			return "TEE tdx: the workload's min_tcb is an SNP TCB, give min_tee_tcb_svn instead"
		}
		want, key := w.MinTCB, "min_tcb"
		if t := w.MinTCBByLine[a.TCBLine]; t != nil {
			want, key = t, "min_tcb_by_line."+a.TCBLine
		}
		if want == nil {
			return fmt.Sprintf("%s evidence: the workload's min_tcb_by_line names no minimum for %s, and it has no min_tcb", a.TCBLine, a.TCBLine)
		}
		min := want.in(a.TCBLine)
		for _, f := range []struct {
			name string
			raw  uint64
		}{{"TCB", a.TCB}, {"LAUNCH_TCB", a.LaunchTCB}} {
			if got := snpext.DecomposeTCB(f.raw, a.TCBLine); !got.AtLeast(min) {
				return fmt.Sprintf("%s %s: below the workload's %s %s (in the %s layout)", f.name, got, key, min, a.TCBLine)
			}
		}
	}
	if len(w.MinTeeTCBSVN) > 0 {
		if !tdx {
			return fmt.Sprintf("TEE %s: the workload's min_tee_tcb_svn is a TDX TCB, give min_tcb instead", a.TEE)
		}
		if len(a.TeeTCBSVN) != tcbSVNSize {
			return fmt.Sprintf("TEE_TCB_SVN %s: not 16 bytes", a.TeeTCBSVN)
		}
		for i := range w.MinTeeTCBSVN {
			if a.TeeTCBSVN[i] < w.MinTeeTCBSVN[i] {
				return fmt.Sprintf("TEE_TCB_SVN %s: component %d is below the workload's min_tee_tcb_svn %s", a.TeeTCBSVN, i, w.MinTeeTCBSVN)
			}
		}
	}
	if why := w.checkLaunch(a); why != "" {
		return why
	}
	if w.GPU != nil {
		return w.GPU.check(a.GPUs)
	}
	return ""
}

// checkTDX matches a's MRTD and RTMRs against the workload's identities.
func (w *Workload) checkTDX(a *Attested) string {
	for _, id := range w.TDX {
		if string(id.MRTD) != string(a.MRTD) {
			continue
		}
		ok := true
		for i, r := range id.RTMRs {
			if len(r) != 0 && (i >= len(a.RTMRs) || string(r) != string(a.RTMRs[i])) {
				ok = false
			}
		}
		if ok {
			return ""
		}
	}
	return fmt.Sprintf("MRTD %s with RTMRs %s: not one of the workload's tdx identities", a.MRTD, hexList(a.RTMRs))
}

func containsHex(list []attest.Hex, v attest.Hex) bool {
	return slices.ContainsFunc(list, func(h attest.Hex) bool { return string(h) == string(v) })
}

func hexList(l []attest.Hex) string {
	s := make([]string, len(l))
	for i, h := range l {
		s[i] = h.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// NamedSecret checks the second binding, independent of any resource
// policy: a pod gets only the resources its own measured init data names
// in [[kbs.secrets]].
//
// Why a second check rather than one the resource policy subsumes: the
// resource policy is written per workload and may be broad (a pattern,
// a rule that pins a launch measurement but no init data, a workload
// shared by several documents), while the document is the narrowest
// statement of what this pod needs and is measured into the evidence.
// Checking both means a broad owner rule never gives a pod more than it
// declared, and a compromised component in a pod (or a document that
// mounts some secrets into some containers only) cannot pull the other
// secrets a shared workload rule would allow. It holds without a
// resource policy as well, where the pinned documents' [[kbs.secrets]]
// are the only statement of who reads what.
func NamedSecret(resource string, a *Attested) error {
	if a.InitData == nil {
		return &Denial{Resource: resource, Reasons: []string{"the attestation carried no init data, so the broker cannot see which resources the pod's measured document names in [[kbs.secrets]]"}}
	}
	for _, s := range a.InitData.KBS.Secrets {
		if p, err := s.ResourcePath(); err == nil && p == resource {
			return nil
		}
	}
	return &Denial{Resource: resource, Reasons: []string{fmt.Sprintf("not among the [[kbs.secrets]] of the pod's measured init data (digest %s): a pod gets only the resources its own document names", a.InitDataDigest)}}
}
