package policygen

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// gen generates one workload's document.
type gen struct {
	o        Options
	in       *input
	w        *workload
	warnings []string
	// p is the plan of the document written, for check.
	p *plan
	// loaded are the images read from layouts, by layout and reference;
	// used are the keys of Options.Images and Layouts used, by every
	// workload.
	loaded map[string]*Image
	used   map[string]bool
}

func (g *gen) warn(format string, a ...any) {
	g.warnings = append(g.warnings, fmt.Sprintf(format, a...))
}

// rule is one container's rule and the comments written with it.
type rule struct {
	// name is the CRI container name; "" for the sandbox.
	name  string
	about []string
	c     policyapi.Container
	env   []envEntry
	// notes are end-of-line comments: "working_dir", "uid", or a list
	// entry, "mounts[2]".
	notes map[string]string
}

func (r *rule) note(key, format string, a ...any) {
	if r.notes == nil {
		r.notes = map[string]string{}
	}
	r.notes[key] = fmt.Sprintf(format, a...)
}

// Well-known paths the kubelet and containerd mount.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	terminationLog    = "/dev/termination-log"
)

// image is the config given for an image reference, or for a container:
// in Options.Images, else read from the layout Options.Layouts names.
func (g *gen) image(ref, container string) (*Image, error) {
	keys := []string{ref}
	if container != "" {
		keys = append(keys, container)
	}
	for _, k := range keys {
		if img := g.o.Images[k]; img != nil {
			g.use(k)
			return img, nil
		}
	}
	for _, k := range keys {
		if p, ok := g.o.Layouts[k]; ok {
			g.use(k)
			if img := g.loaded[p+"\x00"+ref]; img != nil {
				return img, nil
			}
			img, err := LoadImage(p, ref)
			if err != nil {
				return nil, err
			}
			if g.loaded == nil {
				g.loaded = map[string]*Image{}
			}
			g.loaded[p+"\x00"+ref] = img
			return img, nil
		}
	}
	return nil, nil
}

func (g *gen) use(key string) {
	if g.used == nil {
		g.used = map[string]bool{}
	}
	g.used[key] = true
}

// pin warns about, or with Options.Strict refuses, an image not pinned
// by digest.
func (g *gen) pin(who, ref string) error {
	if pinnedDigest(ref) != "" {
		return nil
	}
	if g.o.Strict {
		return fmt.Errorf("%s: image %q is not pinned by digest (--strict): write it as NAME@sha256:DIGEST", who, ref)
	}
	g.warn("%s: IMAGE %q IS NOT PINNED BY DIGEST: the policy pins the name, and whoever serves that name chooses what runs under it; write NAME@sha256:DIGEST (--strict refuses it)", who, ref)
	return nil
}

// pinLayers pins the image's layers in r (policy Container.Layers), or
// warns that the container's files are not pinned (refuses with
// Options.Strict, unless the guest pulls and verifies the image itself).
func (g *gen) pinLayers(r *rule, who, ref string, img *Image, pulled bool) error {
	if img == nil || len(img.Layers) == 0 {
		how := "only its config is known"
		if img == nil {
			how = "no image was given"
		} else if img.Layers != nil {
			how = "the image has no layers"
		}
		if g.o.Strict && !pulled {
			return fmt.Errorf("%s: the files of image %q are not pinned (%s; --strict): the guest would run whatever root the host attaches; give --image %s=LAYOUT with the image's layers (`c8s-measure image` prints them)", who, ref, how, ref)
		}
		g.warn("%s: THE FILES OF IMAGE %q ARE NOT PINNED (%s): the rule has no layers, so the guest runs whatever root the host attaches; give --image %s=LAYOUT with the image's layers (`c8s-measure image` prints them; --strict refuses this)", who, ref, how, ref)
		return nil
	}
	r.c.Layers = slices.Clone(img.Layers)
	for i := range img.Layers {
		if i < len(img.LayerBlobs) {
			b := img.LayerBlobs[i]
			r.note(fmt.Sprintf("layers[%d]", i), "layer %d of %d: blob %s, %s, %d bytes", i+1, len(img.Layers), b.Digest, b.MediaType, b.Size)
		}
	}
	return nil
}

func exactAll(ss []string) []policyapi.Pattern {
	if len(ss) == 0 {
		return nil
	}
	out := make([]policyapi.Pattern, len(ss))
	for i, s := range ss {
		out[i] = exact(s)
	}
	return out
}

func (r *rule) setWorkingDir(wd, how string) {
	if wd == "" {
		wd, how = "/", "containerd's default"
	}
	p := exact(wd)
	r.c.WorkingDir = &p
	if how != "" {
		r.note("working_dir", "%s", how)
	}
}

func (r *rule) setUser(u user) {
	uid, gid := u.uid, u.gid
	r.c.UID, r.c.GID = &uid, &gid
	if u.how != "" {
		r.note("gid", "%s", u.how)
	}
}

// container is the rule of container c of the pod (where says which
// list it is in).
func (g *gen) container(c *corev1.Container, where string) (*rule, error) {
	r := &rule{name: c.Name, about: []string{fmt.Sprintf("%s %s.", where, c.Name)}}
	if err := g.pin("container "+c.Name, c.Image); err != nil {
		return nil, err
	}
	r.c.Image = exact(c.Image)
	img, err := g.image(c.Image, c.Name)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	if img == nil {
		g.warn("container %s: no image config (--image %s=LAYOUT): its env is taken to be only containerd's default PATH, and its STOPSIGNAL SIGTERM; an image that sets other variables is refused at CreateContainer", c.Name, c.Image)
	}
	_, pulled := g.o.Pull[c.Name]
	if err := g.pinLayers(r, "container "+c.Name, c.Image, img, pulled); err != nil {
		return nil, err
	}
	if err := g.pull(r, c.Name, c.Image); err != nil {
		return nil, err
	}
	var missing []error
	env, lookup, err := g.env(c, img)
	if err != nil {
		return nil, err
	}
	r.env = env
	if err := g.args(r, c, img, lookup); err != nil {
		missing = append(missing, err)
	}
	switch {
	case c.WorkingDir != "":
		r.setWorkingDir(c.WorkingDir, "")
	case img != nil:
		how := "the image's WORKDIR"
		if img.Config.WorkingDir == "" {
			how = ""
		}
		r.setWorkingDir(img.Config.WorkingDir, how)
	default:
		missing = append(missing, fmt.Errorf("cannot pin the working dir of container %s: the pod spec gives no workingDir and no image config was given; pass --image %s=LAYOUT or set workingDir", c.Name, c.Image))
	}
	if err := g.user(r, c, img); err != nil {
		missing = append(missing, err)
	}
	if err := errors.Join(missing...); err != nil {
		return nil, err
	}
	if err := g.security(r, c); err != nil {
		return nil, err
	}
	r.c.VMNamespaces = g.vmNamespaces()
	if sp := g.w.spec.ShareProcessNamespace; sp != nil && *sp {
		r.c.SharePIDNamespace = true
		r.note("share_pid_namespace", "shareProcessNamespace: the pod's containers share the sandbox's PID namespace")
	}
	r.c.UserNamespace = g.w.spec.HostUsers != nil && !*g.w.spec.HostUsers
	mounts, err := g.mounts(r, c, img)
	if err != nil {
		return nil, err
	}
	r.c.Mounts = mounts
	g.exec(r, c)
	if err := g.signals(r, c, img); err != nil {
		return nil, err
	}
	r.c.Logs = !g.o.NoLogs
	r.c.Stdin = c.Stdin
	r.c.TTY = c.TTY
	r.c.ExecStdin = slices.Contains(g.o.ExecStdin, c.Name)
	for _, s := range g.o.Secrets {
		if s.Container == c.Name {
			r.c.Secrets = append(r.c.Secrets, policyapi.Secret{Resource: s.Resource, Path: s.Path})
		}
	}
	g.warnBelowShared(c.Name, &r.c)
	return r, nil
}

// warnBelowShared warns of a secret or a mount that is not a virtio-fs
// share below a shared mount's destination: the host can detach it
// (virtio-fs revalidation of the entry it sits on), and the guest refuses
// the container (guest/policy).
func (g *gen) warnBelowShared(name string, c *policyapi.Container) {
	var shared []string
	for _, m := range c.Mounts {
		if m.Kind == policyapi.KindShared && !m.Destination.IsRegex() {
			shared = append(shared, path.Clean(string(m.Destination)))
		}
	}
	below := func(p string) string {
		p = path.Clean("/" + p)
		for _, s := range shared {
			if p != s && strings.HasPrefix(p, strings.TrimSuffix(s, "/")+"/") {
				return s
			}
		}
		return ""
	}
	const why = "the host can detach it by replacing the share's entry it sits on, and show its own files there; the guest refuses CreateContainer: put it elsewhere"
	for _, m := range c.Mounts {
		if m.Kind == policyapi.KindShared || m.Destination.IsRegex() {
			continue
		}
		if s := below(string(m.Destination)); s != "" {
			g.warn("container %s: the %s mount on %s is below the shared (virtio-fs) mount on %s: %s", name, m.Kind, m.Destination, s, why)
		}
	}
	for _, sec := range c.Secrets {
		if sec.Path == "" {
			continue
		}
		if s := below(sec.Path); s != "" {
			g.warn("container %s: secret %s at %s is below the shared (virtio-fs) mount on %s: %s", name, sec.Resource, sec.Path, s, why)
		}
	}
}

// args is process.args by Kubernetes' and containerd's rules: command
// replaces the image's entrypoint, and with it its cmd; args replace the
// cmd; $(VAR) references are expanded.
func (g *gen) args(r *rule, c *corev1.Container, img *Image, lookup func(string) (value, bool)) error {
	var command, args []value
	for _, s := range c.Command {
		command = append(command, expand(s, lookup))
	}
	for _, s := range c.Args {
		args = append(args, expand(s, lookup))
	}
	if len(command) == 0 {
		if img == nil {
			return fmt.Errorf("cannot pin the args of container %s: the pod spec gives no command and no image config was given; pass --image %s=LAYOUT or set command", c.Name, c.Image)
		}
		if len(args) == 0 {
			for _, s := range img.Config.Cmd {
				args = append(args, exactValue(s))
			}
		}
		if ep := img.Config.Entrypoint; len(ep) != 1 || ep[0] != "" {
			for _, s := range ep {
				command = append(command, exactValue(s))
			}
		}
	}
	all := append(command, args...)
	if len(all) == 0 {
		return fmt.Errorf("container %s has no command: neither the pod spec nor image %s gives one (containerd: no command specified)", c.Name, c.Image)
	}
	for i, v := range all {
		if v.exact {
			r.c.Args = append(r.c.Args, exact(v.s))
			continue
		}
		r.c.Args = append(r.c.Args, policyapi.Pattern(policyapi.RegexPrefix+v.s))
		r.note(fmt.Sprintf("args[%d]", i), "a $(VAR) whose value is a pattern")
		g.warn("container %s: ARGS[%d] IS A PATTERN (%s): a $(VAR) in the command whose value the generator cannot know (a Secret's, a field the node or the cluster fills in) lets the host choose that part of the command line; pin the variable's value or keep it out of the command", c.Name, i, v.s)
	}
	return nil
}

// user pins uid and gid as the kubelet and containerd choose them: the
// kubelet passes runAsUser, else the image's user (its uid, or its name,
// never its group), else 0; containerd resolves a name, and a uid without
// runAsGroup, in the image's /etc/passwd.
func (g *gen) user(r *rule, c *corev1.Container, img *Image) error {
	var runAsUser, runAsGroup *int64
	var nonRoot *bool
	if sc := g.w.spec.SecurityContext; sc != nil {
		runAsUser, runAsGroup, nonRoot = sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			runAsUser = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			runAsGroup = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
	}
	userstr := ""
	switch {
	case runAsUser != nil:
		userstr = strconv.FormatInt(*runAsUser, 10)
	case img == nil:
		return fmt.Errorf("cannot pin the user of container %s: the pod spec gives no runAsUser and no image config was given; pass --image %s=LAYOUT or set securityContext.runAsUser", c.Name, c.Image)
	default:
		userstr = strings.SplitN(img.Config.User, ":", 2)[0]
		if userstr == "" {
			userstr = "0"
		}
	}
	if runAsGroup != nil {
		userstr += ":" + strconv.FormatInt(*runAsGroup, 10)
	}
	u, assumed, err := resolveUser(userstr, img)
	if err != nil {
		return fmt.Errorf("container %s: %w", c.Name, err)
	}
	if nonRoot != nil && *nonRoot {
		if _, err := strconv.Atoi(strings.SplitN(userstr, ":", 2)[0]); err != nil {
			g.warn("container %s: runAsNonRoot with the image's user name %q: the kubelet refuses to start it (it cannot verify a name is not root); set runAsUser", c.Name, userstr)
		} else if u.uid == 0 {
			g.warn("container %s: runAsNonRoot, but it runs as uid 0: the kubelet refuses to start it", c.Name)
		}
	}
	if assumed {
		g.warn("container %s: runAsUser %s without runAsGroup and no image config: gid 0 is assumed; if the image's /etc/passwd gives uid %s another group, CreateContainer is refused (set runAsGroup, or pass --image)", c.Name, userstr, userstr)
	}
	r.setUser(u)
	g.additionalGIDs(r, c, img, userstr) // groups.go
	return nil
}

// security pins capabilities, privileged, no-new-privileges, the
// read-only root and the masked paths.
func (g *gen) security(r *rule, c *corev1.Container) error {
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	if sc.Privileged != nil && *sc.Privileged {
		r.c.Privileged = true
		g.warn("container %s is privileged: every capability, nothing masked, sysfs writable", c.Name)
	} else {
		caps, err := capabilities(sc.Capabilities)
		if err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		r.c.Capabilities = &caps
	}
	r.c.NoNewPrivileges = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	r.c.ReadOnlyRoot = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount && !r.c.Privileged {
		none := []string{}
		r.c.MaskedPaths, r.c.ReadonlyPaths = &none, &none
		r.note("masked_paths", "procMount: Unmasked")
	}
	return nil
}

// capabilities are containerd's defaults with securityContext's add and
// drop applied as its CRI does: "ALL" first, then each name.
func capabilities(sc *corev1.Capabilities) ([]string, error) {
	caps := slices.Clone(policyapi.DefaultCapabilities)
	if sc == nil {
		return caps, nil
	}
	name := func(c corev1.Capability) (string, error) {
		n := "CAP_" + strings.ToUpper(string(c))
		if !slices.Contains(policyapi.AllCapabilities, n) {
			return "", fmt.Errorf("capability %q: containerd makes it %s, which is not a Linux capability (write NET_ADMIN, not CAP_NET_ADMIN)", c, n)
		}
		return n, nil
	}
	isAll := func(c corev1.Capability) bool { return strings.ToUpper(string(c)) == "ALL" }
	if slices.ContainsFunc(sc.Add, isAll) {
		caps = slices.Clone(policyapi.AllCapabilities)
	}
	if slices.ContainsFunc(sc.Drop, isAll) {
		caps = nil
	}
	for _, c := range sc.Add {
		if isAll(c) {
			continue
		}
		n, err := name(c)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(caps, n) {
			caps = append(caps, n)
		}
	}
	for _, c := range sc.Drop {
		if isAll(c) {
			continue
		}
		n, err := name(c)
		if err != nil {
			return nil, err
		}
		caps = slices.DeleteFunc(caps, func(x string) bool { return x == n })
	}
	if caps == nil {
		caps = []string{}
	}
	return caps, nil
}

// mounts are the mounts container c may have beyond the standard ones.
func (g *gen) mounts(r *rule, c *corev1.Container, img *Image) ([]policyapi.Mount, error) {
	if len(c.VolumeDevices) > 0 {
		return nil, fmt.Errorf("container %s: volumeDevices (raw block device %s) are never given to a container in a pod VM", c.Name, c.VolumeDevices[0].DevicePath)
	}
	var out []policyapi.Mount
	add := func(m policyapi.Mount, format string, a ...any) {
		if format != "" {
			r.note(fmt.Sprintf("mounts[%d]", len(out)), format, a...)
		}
		out = append(out, m)
	}
	dests := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		dest := path.Clean(vm.MountPath)
		dests[dest] = true
		v := g.volume(vm.Name)
		if v == nil {
			return nil, fmt.Errorf("container %s: volumeMounts %s names no volume of the pod", c.Name, vm.Name)
		}
		kinds, ro, note, err := g.volumeKind(c, v)
		if err != nil {
			return nil, err
		}
		if vm.SubPath != "" || vm.SubPathExpr != "" {
			// The kubelet binds a sub-path from its volume-subpaths
			// directory: a host path, shared, or a small file passed by
			// value.
			kinds = []policyapi.MountKind{policyapi.KindShared, policyapi.KindFile}
			note += ", a sub-path"
			if v.EmptyDir != nil {
				g.warn("container %s: volume %s: a sub-path of an emptyDir is bound from the host (shared), not kept in guest memory", c.Name, vm.Name)
			}
		}
		for _, k := range kinds {
			m := policyapi.Mount{Destination: exact(dest), Kind: k, ReadOnly: ro || vm.ReadOnly}
			if k == policyapi.KindEmptyDir {
				m.Volume = exact(vm.Name) // the kubelet's directory is the volume's name
			}
			add(m, "volume %s: %s", vm.Name, note)
		}
	}
	automount := g.w.spec.AutomountServiceAccountToken == nil || *g.w.spec.AutomountServiceAccountToken
	if automount && !dests[serviceAccountDir] {
		add(policyapi.Mount{Destination: serviceAccountDir, Kind: policyapi.KindShared, ReadOnly: true}, "the service account token (automountServiceAccountToken)")
	}
	if p := c.TerminationMessagePath; p != "" && path.Clean(p) != terminationLog {
		dests[path.Clean(p)] = true
		add(policyapi.Mount{Destination: exact(path.Clean(p)), Kind: policyapi.KindFile}, "terminationMessagePath")
	}
	if img != nil {
		// containerd binds a directory of the node at each VOLUME of the
		// image that no CRI mount covers.
		for _, v := range sortedKeys(img.Config.Volumes) {
			dest := path.Clean("/" + v)
			if dests[dest] {
				continue
			}
			g.warn("container %s: the image's VOLUME %s is a directory of the node, shared over virtio-fs: the host reads and writes it (mount a volume there to choose)", c.Name, dest)
			add(policyapi.Mount{Destination: exact(dest), Kind: policyapi.KindShared}, "the image's VOLUME")
		}
	}
	return out, nil
}

func (g *gen) volume(name string) *corev1.Volume {
	for i := range g.w.spec.Volumes {
		if g.w.spec.Volumes[i].Name == name {
			return &g.w.spec.Volumes[i]
		}
	}
	return nil
}

// volumeKind says what kind of mount a volume is in the guest, whether
// the kubelet mounts it read-only, and a note.
func (g *gen) volumeKind(c *corev1.Container, v *corev1.Volume) ([]policyapi.MountKind, bool, string, error) {
	shared := []policyapi.MountKind{policyapi.KindShared}
	switch vs := v.VolumeSource; {
	case vs.ConfigMap != nil:
		return shared, true, "configMap " + vs.ConfigMap.Name, nil
	case vs.Secret != nil:
		return shared, true, "secret " + vs.Secret.SecretName, nil
	case vs.DownwardAPI != nil:
		return shared, true, "downwardAPI", nil
	case vs.Projected != nil:
		return shared, true, "projected", nil
	case vs.EmptyDir != nil:
		// A guest started as a TEE keeps every emptyDir in its memory.
		return []policyapi.MountKind{policyapi.KindEmptyDir}, false, "emptyDir, in guest memory", nil
	case vs.Image != nil:
		return nil, false, "", fmt.Errorf("container %s: volume %s is an image volume, which c8s does not give a pod VM", c.Name, v.Name)
	case vs.HostPath != nil:
		g.warn("container %s: volume %s is the node's %s: content the host reads and writes, not confidential", c.Name, v.Name, vs.HostPath.Path)
		return shared, false, "hostPath " + vs.HostPath.Path, nil
	}
	g.warn("container %s: volume %s is storage the node mounts and shares over virtio-fs: the host reads and writes it", c.Name, v.Name)
	return shared, false, "node storage", nil
}

// exec is the argv the host may exec: the pod's exec probes and
// lifecycle hooks, which the kubelet runs, and Options.Exec.
func (g *gen) exec(r *rule, c *corev1.Container) {
	add := func(argv []policyapi.Pattern, why string) {
		if len(argv) == 0 || slices.ContainsFunc(r.c.Exec, func(x []policyapi.Pattern) bool { return slices.Equal(x, argv) }) {
			return
		}
		r.note(fmt.Sprintf("exec[%d]", len(r.c.Exec)), "%s", why)
		r.c.Exec = append(r.c.Exec, argv)
	}
	for _, p := range []struct {
		why   string
		probe *corev1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
		if p.probe != nil && p.probe.Exec != nil {
			// The kubelet expands $(VAR) in a probe's command with the
			// env as written, not in a hook's.
			var argv []string
			for _, a := range p.probe.Exec.Command {
				argv = append(argv, expand(a, staticEnv(c)).s)
			}
			add(exactAll(argv), p.why)
		}
	}
	if lc := c.Lifecycle; lc != nil {
		if lc.PostStart != nil && lc.PostStart.Exec != nil {
			add(exactAll(lc.PostStart.Exec.Command), "lifecycle.postStart")
		}
		if lc.PreStop != nil && lc.PreStop.Exec != nil {
			add(exactAll(lc.PreStop.Exec.Command), "lifecycle.preStop")
		}
	}
	for _, argv := range g.o.Exec[c.Name] {
		add(argv, "--allow-exec")
	}
}

// signals adds the container's stop signal (lifecycle.stopSignal, else
// the image's STOPSIGNAL), which containerd sends to stop it, to the
// signals the host may send when the defaults lack it.
func (g *gen) signals(r *rule, c *corev1.Container, img *Image) error {
	stop := ""
	if img != nil {
		stop = img.Config.StopSignal
	}
	if lc := c.Lifecycle; lc != nil && lc.StopSignal != nil {
		stop = string(*lc.StopSignal)
	}
	if stop == "" {
		return nil
	}
	n, err := policyapi.ParseSignal(stop)
	if err != nil {
		return fmt.Errorf("container %s: stop signal: %w", c.Name, err)
	}
	if slices.Contains(r.c.AllowedSignals(), n) {
		return nil
	}
	sigs := append(slices.Clone(policyapi.DefaultSignals), stop)
	r.c.Signals = &sigs
	r.note("signals", "containerd stops it with %s", stop)
	return nil
}
