package policygen

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// knownSandboxImage is the configuration of the sandbox images
// registry.k8s.io/pause 3.9 to 3.10.1, ENTRYPOINT ["/pause"], USER
// 65535:65535, built FROM scratch with the default PATH; none has an
// /etc/passwd.
func knownSandboxImage(ref string) *Image {
	bare := strings.SplitN(ref, "@", 2)[0]
	switch bare {
	case "registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10.1":
		img := &Image{Source: "built in (" + bare + ")"}
		img.Config.Entrypoint = []string{"/pause"}
		img.Config.User = "65535:65535"
		img.Config.Env = []string{defaultPath}
		return img
	}
	return nil
}

// sandbox is the rule of the pod's sandbox (pause) container, as
// containerd's podsandbox controller specifies it.
func (g *gen) sandbox() (*rule, error) {
	ref := g.o.SandboxImage
	r := &rule{about: []string{"The pod's sandbox (pause) container: the node's sandbox image (containerd's", "pinned_images.sandbox; c8s-measure policy --sandbox-image)."}}
	if err := g.pin("the sandbox", ref); err != nil {
		return nil, err
	}
	img, err := g.image(ref, "")
	if err != nil {
		return nil, fmt.Errorf("the sandbox: %w", err)
	}
	if img == nil {
		img = knownSandboxImage(ref)
	}
	if img == nil {
		return nil, fmt.Errorf("cannot pin the sandbox container: no image config for sandbox image %s; pass --image %s=LAYOUT", ref, ref)
	}
	r.c.Image = exact(ref)
	if err := g.pinLayers(r, "the sandbox", ref, img, false); err != nil {
		return nil, err
	}
	args := append(slices.Clone(img.Config.Entrypoint), img.Config.Cmd...)
	if len(args) == 0 {
		return nil, fmt.Errorf("sandbox image %s has neither entrypoint nor cmd: containerd refuses it", ref)
	}
	r.c.Args = exactAll(args)
	var l envList
	for _, e := range img.Config.Env {
		l.setRaw(e, "")
	}
	r.env = l.entries
	r.setWorkingDir(img.Config.WorkingDir, "")
	sc := g.w.spec.SecurityContext
	if sc == nil {
		sc = &corev1.PodSecurityContext{}
	}
	userstr := ""
	switch {
	case sc.RunAsUser != nil:
		userstr = strconv.FormatInt(*sc.RunAsUser, 10)
		if sc.RunAsGroup != nil {
			userstr += ":" + strconv.FormatInt(*sc.RunAsGroup, 10)
		}
	case sc.RunAsGroup != nil:
		return nil, errors.New("securityContext.runAsGroup without runAsUser: containerd refuses the sandbox (user group is specified without user)")
	default:
		userstr = img.Config.User
	}
	u, _, err := resolveUser(userstr, img)
	if err != nil {
		return nil, fmt.Errorf("the sandbox: %w", err)
	}
	r.setUser(u)
	r.c.ReadOnlyRoot = true
	r.c.VMNamespaces = g.vmNamespaces()
	var sysctls []string
	for _, s := range sc.Sysctls {
		sysctls = append(sysctls, dotted(s.Name)+"="+s.Value)
	}
	if !g.w.spec.HostNetwork {
		for _, d := range []struct{ key, value, why string }{
			{"net.ipv4.ip_unprivileged_port_start", "0", "containerd's enable_unprivileged_ports"},
			{"net.ipv4.ping_group_range", "0 2147483647", "containerd's enable_unprivileged_icmp"},
		} {
			if !slices.ContainsFunc(sc.Sysctls, func(s corev1.Sysctl) bool { return dotted(s.Name) == d.key }) {
				r.note(fmt.Sprintf("sysctls[%d]", len(sysctls)), "%s", d.why)
				sysctls = append(sysctls, d.key+"="+d.value)
			}
		}
	}
	r.c.Sysctls = exactAll(sysctls)
	return r, nil
}

// dotted is a sysctl name as the kubelet passes it: with "." separators
// (ConvertSysctlVariableToDotsSeparator).
func dotted(name string) string {
	i := strings.IndexAny(name, "./")
	if i < 0 || name[i] == '.' {
		return name
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, name)
}

// vmNamespaces are the namespaces the pod shares with the VM.
func (g *gen) vmNamespaces() []string {
	var ns []string
	if g.w.spec.HostPID {
		ns = append(ns, "pid")
	}
	if g.w.spec.HostNetwork {
		ns = append(ns, "network")
	}
	if g.w.spec.HostIPC {
		ns = append(ns, "ipc")
	}
	return ns
}
