package policygen

import (
	"bufio"
	"bytes"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// additionalGIDs pins process.user.additionalGids as containerd's CRI
// writes them: the process's gid, the image's /etc/group entries that
// list the user (by the name its /etc/passwd gives the uid, or userstr
// itself when it is not a bare uid: "1000:1000" matches no group), unless
// supplementalGroupsPolicy is Strict, and the pod's supplementalGroups
// and fsGroup (the kubelet passes both). Without the image's config it
// is left unpinned, with a warning, unless supplementalGroupsPolicy is
// Strict: then the pod spec alone decides.
func (g *gen) additionalGIDs(r *rule, c *corev1.Container, img *Image, userstr string) {
	sc := g.w.spec.SecurityContext
	// Strict: the image's /etc/group does not count, the pod spec says all.
	strict := sc != nil && sc.SupplementalGroupsPolicy != nil && *sc.SupplementalGroupsPolicy == corev1.SupplementalGroupsPolicyStrict
	if (img == nil && !strict) || r.c.GID == nil {
		g.warn("container %s: no image config (--image %s=LAYOUT): its supplementary groups (additional_gids) are not pinned; the host may add any group to its process", c.Name, c.Image)
		return
	}
	gids := []uint32{*r.c.GID}
	if !strict && img.UserDB != nil {
		passwd, group, err := img.UserDB()
		if err == nil {
			name := userstr
			if uid, err := strconv.ParseUint(userstr, 10, 32); err == nil {
				name = ""
				if e, ok := lookupPasswd(passwd, func(e passwdEntry) bool { return e.uid == uint32(uid) }); ok {
					name = e.name
				}
			}
			gids = append(gids, memberGroups(group, name)...)
		}
	}
	if sc != nil {
		for _, s := range sc.SupplementalGroups {
			gids = append(gids, uint32(s))
		}
		if sc.FSGroup != nil {
			gids = append(gids, uint32(*sc.FSGroup))
		}
	}
	slices.Sort(gids)
	gids = slices.Compact(gids)
	r.c.AdditionalGIDs = &gids
}

// memberGroups returns the gids of the /etc/group entries that list user
// as a member (not the user's own group by name), as containerd reads
// them.
func memberGroups(group []byte, user string) []uint32 {
	if user == "" {
		return nil
	}
	var out []uint32
	sc := bufio.NewScanner(bytes.NewReader(group))
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) < 4 || f[0] == user || strings.HasPrefix(f[0], "#") {
			continue
		}
		if !slices.Contains(strings.Split(f[3], ","), user) {
			continue
		}
		if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			out = append(out, uint32(gid))
		}
	}
	return out
}
