package policygen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// user is a resolved process user.
type user struct {
	uid, gid uint32
	// how says where they come from, for the rule's comment.
	how string
}

// resolveUser does what containerd's oci.WithUser does with userstr
// ("UID", "NAME", "UID:GID", "NAME:GROUP", ...) on the image's root
// filesystem: names are looked up in its /etc/passwd and /etc/group, and a
// numeric user alone takes its group from /etc/passwd (0 when the image
// does not list it). img nil means the image is not known: a name is
// refused, and a numeric user alone gets group 0 with a warning (assumed
// set).
func resolveUser(userstr string, img *Image) (u user, assumed bool, err error) {
	if userstr == "" {
		return user{how: "containerd's default, root"}, false, nil
	}
	parts := strings.Split(userstr, ":")
	if len(parts) > 2 {
		return user{}, false, fmt.Errorf("user %q: want UID, NAME, UID:GID or NAME:GROUP", userstr)
	}
	num := func(s string) (uint32, bool) {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v > math.MaxInt32 {
			return 0, false
		}
		return uint32(v), true
	}
	db := func() (passwd, group []byte, err error) {
		if img == nil {
			return nil, nil, errNoImage
		}
		if img.UserDB == nil {
			return nil, nil, nil
		}
		return img.UserDB()
	}
	uid, uidNum := num(parts[0])
	if len(parts) == 1 {
		passwd, _, err := db()
		if uidNum {
			if errors.Is(err, errNoImage) {
				return user{uid: uid, how: "group 0 assumed"}, true, nil
			}
			if err != nil {
				return user{}, false, err
			}
			if e, ok := lookupPasswd(passwd, func(e passwdEntry) bool { return e.uid == uid }); ok {
				return user{uid: uid, gid: e.gid, how: "group from the image's /etc/passwd"}, false, nil
			}
			return user{uid: uid}, false, nil
		}
		if err != nil {
			return user{}, false, fmt.Errorf("user %q: %w", userstr, err)
		}
		e, ok := lookupPasswd(passwd, func(e passwdEntry) bool { return e.name == parts[0] })
		if !ok {
			return user{}, false, fmt.Errorf("user %q is not in the image's /etc/passwd: containerd cannot start the container", userstr)
		}
		return user{uid: e.uid, gid: e.gid, how: "the image's /etc/passwd"}, false, nil
	}
	gid, gidNum := num(parts[1])
	if uidNum && gidNum {
		return user{uid: uid, gid: gid}, false, nil
	}
	passwd, group, err := db()
	if err != nil {
		return user{}, false, fmt.Errorf("user %q: %w", userstr, err)
	}
	if !uidNum {
		e, ok := lookupPasswd(passwd, func(e passwdEntry) bool { return e.name == parts[0] })
		if !ok {
			return user{}, false, fmt.Errorf("user %q is not in the image's /etc/passwd: containerd cannot start the container", parts[0])
		}
		uid = e.uid
	}
	if !gidNum {
		g, ok := lookupGroup(group, parts[1])
		if !ok {
			return user{}, false, fmt.Errorf("group %q is not in the image's /etc/group: containerd cannot start the container", parts[1])
		}
		gid = g
	}
	return user{uid: uid, gid: gid, how: "names from the image's /etc/passwd and /etc/group"}, false, nil
}

// errNoImage is resolveUser's lookup without an image.
var errNoImage = errors.New("a user name needs the image's /etc/passwd: pass the image with --image, or set runAsUser and runAsGroup")

type passwdEntry struct {
	name     string
	uid, gid uint32
}

// lookupPasswd returns the first /etc/passwd entry that match accepts.
func lookupPasswd(passwd []byte, match func(passwdEntry) bool) (passwdEntry, bool) {
	sc := bufio.NewScanner(bytes.NewReader(passwd))
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) < 4 || strings.HasPrefix(f[0], "#") {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if e := (passwdEntry{f[0], uint32(uid), uint32(gid)}); match(e) {
			return e, true
		}
	}
	return passwdEntry{}, false
}

// lookupGroup returns the gid of the /etc/group entry called name.
func lookupGroup(group []byte, name string) (uint32, bool) {
	sc := bufio.NewScanner(bytes.NewReader(group))
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) < 3 || f[0] != name {
			continue
		}
		if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			return uint32(gid), true
		}
	}
	return 0, false
}
