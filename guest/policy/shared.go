package policy

import (
	"fmt"
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// belowShared refuses a secret, the mesh files (at meshDir, if the
// container gets them), or a mount that is not a virtio-fs share, whose
// path is the destination of a shared mount of the container or lies
// below it. The host serves a share's directory entries: when it replaces
// the one a mount sits on, virtio-fs revalidation drops the entry
// (d_invalidate), which detaches the mounts on and below it, and the
// container reads the host's files where it expects the secret, its mesh
// key and trust bundle, the tmpfs or the guest's copy.
//
// resolve, when set, gives each path as the container's root resolves it
// (ResolvedShares); nil compares the paths as written.
func (k *checker) belowShared(rule *policyapi.Container, ms []specs.Mount, kinds []policyapi.MountKind, secretPaths map[string][]string, meshDir string, resolve func(string) string) {
	if resolve == nil {
		resolve = func(p string) string { return p }
	}
	// shown names a path, and where the root's symlinks take it.
	shown := func(written, resolved string) string {
		if written == resolved {
			return fmt.Sprintf("%q", written)
		}
		return fmt.Sprintf("%q (%q in the container's root, through its image's symlinks)", written, resolved)
	}
	var shared, sharedAs []string
	for i, m := range ms {
		if i < len(kinds) && kinds[i] == policyapi.KindShared && cleanAbs(m.Destination) {
			shared = append(shared, resolve(m.Destination))
			sharedAs = append(sharedAs, m.Destination)
		}
	}
	if len(shared) == 0 {
		return
	}
	below := func(p string) string {
		for i, s := range shared {
			if under(p, s) { // the destination itself too
				return shown(sharedAs[i], s)
			}
		}
		return ""
	}
	const hint = "the host serves a shared mount's entries: replacing the one a mount sits on makes the guest's virtio-fs revalidation detach it, and the container reads host content in its place"
	for i, m := range ms {
		if i < len(kinds) && kinds[i] == policyapi.KindShared || !cleanAbs(m.Destination) {
			continue
		}
		dst := resolve(m.Destination)
		if s := below(dst); s != "" {
			kind := policyapi.MountKind("")
			if i < len(kinds) {
				kind = kinds[i]
			}
			d := k.deny(fmt.Sprintf("mounts[%d].destination", i), fmt.Sprintf("%s (%s)", shown(m.Destination, dst), kind), "", "")
			d.Reason = "at or below the shared (virtio-fs) mount on " + s
			d.Hint = hint
		}
	}
	for i, sec := range rule.Secrets {
		paths, fetched := secretPaths[sec.Resource]
		if !fetched {
			continue // not mounted
		}
		if sec.Path != "" {
			paths = []string{sec.Path} // the agent binds each entry there
		}
		for _, p := range paths {
			if p == "" {
				continue
			}
			clean := path.Clean("/" + p)
			if s := below(resolve(clean)); s != "" {
				d := k.deny("secret "+sec.Resource, shown(p, resolve(clean)), fmt.Sprintf("%s.secrets[%d]", k.key, i), "")
				d.Reason = "at or below the shared (virtio-fs) mount on " + s
				d.Hint = hint
			}
		}
	}
	if meshDir == "" {
		return
	}
	if s := below(resolve(meshDir)); s != "" {
		d := k.deny("mesh files", shown(meshDir, resolve(meshDir)), "mesh.containers", "")
		d.Reason = "at or below the shared (virtio-fs) mount on " + s
		d.Hint = hint
	}
}

// ResolvedShares checks c's mounts once more with its root in place:
// crun mounts each destination inside the root, following the image's
// symlinks, so where /var/run links to /run a tmpfs on /run/x/cache lands
// in the share on /var/run/x, which the paths as written do not show.
// resolve gives a path as the root resolves it. The check of r
// (CreateContainer's, belowShared) is run on the resolved paths of the
// mounts, secrets and mesh files, when any resolves elsewhere.
func (e *Evaluator) ResolvedShares(c *Container, r *CreateContainer, resolve func(string) string) error {
	if !e.Governs() || !c.Governed() || c.rule == noRule || r.Spec == nil {
		return nil
	}
	cache := map[string]string{}
	res := func(p string) string {
		if v, ok := cache[p]; ok {
			return v
		}
		v := path.Clean(resolve(p))
		cache[p] = v
		return v
	}
	paths := []string{r.MeshDir}
	for _, m := range r.Spec.Mounts {
		paths = append(paths, m.Destination)
	}
	for _, ps := range r.SecretPaths {
		paths = append(paths, ps...)
	}
	for _, sec := range c.rule.Secrets {
		paths = append(paths, sec.Path)
	}
	if !slices.ContainsFunc(paths, func(p string) bool {
		q := path.Clean("/" + p)
		return p != "" && res(q) != q
	}) {
		return nil
	}
	meshDir := ""
	if slices.Contains(r.MeshInto, c.Identity.Name) {
		meshDir = r.MeshDir
	}
	k := &checker{req: "CreateContainer", name: c.Identity.Name, id: r.ID, key: c.key}
	k.belowShared(c.rule, r.Spec.Mounts, r.MountKinds, r.SecretPaths, meshDir, res)
	return e.decide(k.ds)
}
