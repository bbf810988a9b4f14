package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// notLinked are packages the shim must not link (issue 18: every pod runs
// a shim, and what it links it maps and partly touches; a package's
// registered protobuf descriptors and init work cost heap as well). Each
// is a path, or a path prefix ending in "/", with where the work went.
var notLinked = map[string]string{
	// Attestation verification runs in the short-lived c8s-verify.
	"github.com/c8s-dev/c8s/launcher/attest": "verification runs in c8s-verify",
	"github.com/go-jose/":                    "verification runs in c8s-verify",
	// The key broker's client side is launcher/broker/relay.
	"github.com/c8s-dev/c8s/launcher/broker": "the shim only relays (launcher/broker/relay)",
	// launcher/ctrdimage speaks CRI's ImageFsInfo on the wire (crifs.go).
	"k8s.io/cri-api/": "launcher/ctrdimage decodes ImageFsInfo itself",
	// shim/task's GPU admission asks the kubelet which devices are held
	// (launcher/node/deviceplugin/podres); the device plugin server and
	// the kubelet's deviceplugin API are the node agent's.
	"github.com/c8s-dev/c8s/launcher/node/deviceplugin": "the shim only asks which devices are held (deviceplugin/podres)",
	"k8s.io/kubelet/pkg/apis/deviceplugin/":             "the device plugin server is the node agent's",
	// shim/podnet speaks the few rtnetlink and tc messages it needs itself
	// (rtnl.go).
	"github.com/vishvananda/netlink": "shim/podnet speaks rtnetlink itself",
	// Kata's govmm and virtcontainers types pulled go-openapi, govalidator
	// and mongo's bson.
	"github.com/kata-containers/kata-containers/src/runtime/pkg/govmm":            "QEMU is driven by launcher/vm",
	"github.com/kata-containers/kata-containers/src/runtime/virtcontainers/types": "QEMU is driven by launcher/vm",
	"github.com/go-openapi/":            "pulled by Kata's virtcontainers",
	"github.com/asaskevich/govalidator": "pulled by Kata's virtcontainers",
	"go.mongodb.org/":                   "pulled by Kata's virtcontainers",
}

// TestShimDoesNotLink lists the shim's dependencies with go list and
// fails on any package of notLinked, naming who imports it.
func TestShimDoesNotLink(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	importers := map[string][]string{}
	var deps []string
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ":")
		deps = append(deps, pkg)
		for _, i := range strings.Fields(imports) {
			importers[i] = append(importers[i], pkg)
		}
	}
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages; the shim has hundreds", len(deps))
	}
	for _, pkg := range deps {
		for banned, why := range notLinked {
			if pkg == banned || strings.HasSuffix(banned, "/") && strings.HasPrefix(pkg, banned) ||
				!strings.HasSuffix(banned, "/") && strings.HasPrefix(pkg, banned+"/") && !allowedBelow(banned, pkg) {
				t.Errorf("the shim links %s (imported by %s): it must not (%s)", pkg, strings.Join(importers[pkg], ", "), why)
			}
		}
	}
}

// allowedBelow says whether pkg, a package below banned, is one the shim
// may link: the small pieces split out for it.
func allowedBelow(banned, pkg string) bool {
	switch pkg {
	case "github.com/c8s-dev/c8s/launcher/attest/verdict", // the verdict c8s-verify returns
		"github.com/c8s-dev/c8s/launcher/broker/relay",             // the KBS relay
		"github.com/c8s-dev/c8s/launcher/node/deviceplugin/podres": // which devices are held
		return true
	}
	return false
}

// notLinkedSymbols are functions the shim's binary must not contain: what
// a package it needs drags in when one of its heavy parts is used.
var notLinkedSymbols = map[string]string{
	// http.Client and http.Transport bring HTTP/2, proxies and TLS
	// dialling; launcher/migrate's Client speaks HTTP/1.1 itself
	// (client.go), and gRPC's use of net/http does not need them.
	"net/http.(*Transport).RoundTrip": "launcher/migrate's Client speaks HTTP/1.1 itself",
	"net/http.(*Client).Do":           "launcher/migrate's Client speaks HTTP/1.1 itself",
	// TLS between nodes (migration) is dialled by the node's own
	// `c8s-launcher serve`, which relays for the shim (launcher/migrate
	// relay.go): the shim neither handshakes nor loads the node's key.
	// (gRPC's credentials link the package, not the handshake.)
	"crypto/tls.(*Conn).Handshake":       "the node's c8s-launcher serve relays TLS for the shim",
	"crypto/tls.(*Conn).clientHandshake": "the node's c8s-launcher serve relays TLS for the shim",
	"crypto/tls.LoadX509KeyPair":         "the shim never loads the node's migration key",
}

// TestShimBinaryDoesNotContain builds the shim as make build does and
// fails on any symbol of notLinkedSymbols in it.
func TestShimBinaryDoesNotContain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shim")
	}
	shim := filepath.Join(t.TempDir(), "containerd-shim-c8s-v2")
	build := exec.Command("go", "build", "-trimpath", "-o", shim, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "tool", "nm", shim).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	syms := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 3 {
			syms[f[2]] = true
		}
	}
	if !syms["main.main"] {
		t.Fatalf("go tool nm lists no main.main in %s", shim)
	}
	for sym, why := range notLinkedSymbols {
		if syms[sym] {
			t.Errorf("the shim contains %s: it must not (%s); `go build -ldflags=-dumpdep` shows who reaches it", sym, why)
		}
	}
}
