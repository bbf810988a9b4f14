// Command mkbusyboximage writes the busybox test image as an OCI image layout
// tarball, ready for `ctr images import`:
//
//	mkbusyboximage OUT.tar [--name REF] [--busybox PATH] [--cmd "sleep 2147483647"] [--all-applets] [--hardlinks] [--user U] [--passwd LINE] [--group LINE]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkbusyboximage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkbusyboximage", flag.ContinueOnError)
	name := fs.String("name", ociimage.DefaultName, "image reference recorded in the index")
	busybox := fs.String("busybox", ociimage.DefaultBusybox, "static busybox binary to put in the image")
	allApplets := fs.Bool("all-applets", false, "link every applet `busybox --list` names, not just the common ones")
	user := fs.String("user", "", "the image's default user (config User)")
	var passwd, group []string
	fs.Func("passwd", "a `LINE` to add to /etc/passwd (repeatable)", func(l string) error { passwd = append(passwd, l); return nil })
	fs.Func("group", "a `LINE` to add to /etc/group (repeatable)", func(l string) error { group = append(group, l); return nil })
	hardLinks := fs.Bool("hardlinks", false, "link the applets with hard links, as the upstream busybox image does, not symbolic links")
	cmd := fs.String("cmd", "", "the image's default command: split at spaces, or a JSON array (default: sh); e.g. \"sleep 2147483647\" for a pause image")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mkbusyboximage OUT.tar [--name REF] [--busybox PATH] [--cmd CMD] [--all-applets] [--hardlinks] [--user U] [--passwd LINE] [--group LINE]")
		fs.PrintDefaults()
	}
	// Accept flags before and after the output path.
	if err := fs.Parse(args); err != nil {
		return err
	}
	var out string
	if fs.NArg() > 0 {
		out = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return err
		}
	}
	if out == "" || fs.NArg() != 0 {
		fs.Usage()
		return fmt.Errorf("want exactly one output path")
	}
	argv := strings.Fields(*cmd)
	if strings.HasPrefix(strings.TrimSpace(*cmd), "[") {
		argv = nil
		if err := json.Unmarshal([]byte(*cmd), &argv); err != nil {
			return fmt.Errorf("--cmd %q is not a JSON array of strings: %v", *cmd, err)
		}
	}
	var applets []string
	if *allApplets {
		list, err := exec.Command(*busybox, "--list").Output()
		if err != nil {
			return fmt.Errorf("list the applets of %s: %v", *busybox, err)
		}
		applets = strings.Fields(string(list))
	}
	return ociimage.WriteFile(out, ociimage.Options{Name: *name, Busybox: *busybox, Cmd: argv, Applets: applets, HardLinks: *hardLinks,
		User: *user, Passwd: passwd, Group: group})
}
