package initdata

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// checkPolicy validates the [policy] section against the rest of the
// document: the secrets it mounts are [[kbs.secrets]] resources, and exec
// is stated per container, not by agent_policy.allow_exec.
func (d *InitData) checkPolicy() error {
	if d.Policy == nil {
		return nil
	}
	if d.Agent.AllowExec != nil {
		return errors.New("init data: agent_policy.allow_exec does not apply with a [policy] section: list the commands the host may exec in policy.containers.NAME.exec")
	}
	resources := make([]string, len(d.KBS.Secrets))
	for i, s := range d.KBS.Secrets {
		resources[i] = s.Resource
	}
	if err := d.Policy.Validate(resources); err != nil {
		return fmt.Errorf("init data: %w", err)
	}
	return nil
}

// PolicyGoverns reports whether the document has a [policy] section, under
// which the agent refuses whatever it does not allow.
func (d *InitData) PolicyGoverns() bool { return d.Policy != nil }

// HostCanRunCode reports whether the host can run code of its choosing in
// the pod under this document, and so read back whatever the pod holds,
// such as the secrets a key broker releases to it or the key of a mesh
// certificate; reason says why, naming the rules, for a relying party's
// refusal.
//
// True without a [policy] section, whatever agent_policy.allow_exec says:
// CreateContainer is then unrestricted and the pod's secrets are mounted
// into every container, so the host creates one that prints them and
// reads its stdout. True with a [policy] in audit mode, which only logs
// what it would refuse. Under an enforced [policy] the host creates only
// the containers, and execs only the argv lists, the owner wrote; it is
// still true where a rule leaves what those run to the host: a rule that
// does not bind its container's file system to the owner's image
// (HostRootfsRules: the host supplies the root, and its /bin/sh runs under
// the owner's argv), and the other shapes hostcode.go lists (a host share
// over the program or the system's code, a loader or shell-startup
// variable of the host's, a script that is a pattern, a shell reading the
// host's stdin). A rule as loose as image = "re:.*" with its layers pinned
// runs the owner's files, and is the owner's choice.
func (d *InitData) HostCanRunCode() (bool, string) {
	return d.HostCanRunCodeWith(HostCodeOptions{})
}

// HostCanRunCodeWith is HostCanRunCode without what o says the owner
// accepts.
func (d *InitData) HostCanRunCodeWith(o HostCodeOptions) (bool, string) {
	switch {
	case d.Policy == nil:
		return true, "the init data has no [policy] section, so CreateContainer is unrestricted and every container gets the pod's secrets: the host can create a container that prints them and read its output, whatever agent_policy.allow_exec says"
	case d.Policy.Audit:
		return true, "the init data's [policy] is in audit mode (policy.audit = true): the agent only logs what it would refuse, so the host can create or exec what it likes and read the secrets back"
	}
	var reasons []string
	if keys := d.HostRootfsRules(); len(keys) > 0 && !o.AcceptHostRootfs {
		reasons = append(reasons, hostRootfsReason(keys))
	}
	for _, r := range rules(d.Policy) {
		reasons = append(reasons, ruleHostCode(r)...)
	}
	if len(reasons) > 0 {
		return true, strings.Join(reasons, "; ")
	}
	return false, "the init data's [policy] is enforced and binds every container to the owner's image: the host may create and exec only what the owner's rules allow"
}

// knownKeysAt lists the keys the TOML document of v may have in the table
// at key's parent, following v's struct tags through tables, arrays of
// tables and maps (whose keys are names). False when key's parent is not
// a table of v.
func knownKeysAt(v any, key []string) ([]string, bool) {
	t := reflect.TypeOf(v)
	for _, k := range key[:len(key)-1] {
		t = deref(t)
		switch t.Kind() {
		case reflect.Map:
			t = t.Elem() // k is a name
			continue
		case reflect.Struct:
		default:
			return nil, false
		}
		f, ok := fieldByTag(t, k)
		if !ok {
			return nil, false
		}
		t = f.Type
	}
	t = deref(t)
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	var keys []string
	for i := range t.NumField() {
		if tag := strings.Split(t.Field(i).Tag.Get("toml"), ",")[0]; tag != "" && tag != "-" {
			keys = append(keys, tag)
		}
	}
	sort.Strings(keys)
	return keys, true
}

// deref strips pointers and slices (arrays of tables).
func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	return t
}

func fieldByTag(t reflect.Type, tag string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if strings.Split(t.Field(i).Tag.Get("toml"), ",")[0] == tag {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

// unknownPolicyKey explains an unknown key of the [policy] section: its
// name and the keys its table has.
func unknownPolicyKey(v any, key []string) (string, bool) {
	if len(key) < 2 || key[0] != "policy" {
		return "", false
	}
	known, ok := knownKeysAt(v, key)
	if !ok {
		return "", false
	}
	return fmt.Sprintf("unknown key %s (known in %s: %s)", strings.Join(key, "."), strings.Join(key[:len(key)-1], "."), strings.Join(known, ", ")), true
}
