package packaging

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"sigs.k8s.io/yaml"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
)

// runtimeClass mirrors node.k8s.io/v1 RuntimeClass field by field (JSON
// names as in k8s.io/api/node/v1); decoding is strict, so a misspelt or
// misplaced field fails the test.
type runtimeClass struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Handler  string `json:"handler"`
	Overhead *struct {
		PodFixed map[string]string `json:"podFixed"`
	} `json:"overhead"`
	Scheduling *struct {
		NodeSelector map[string]string `json:"nodeSelector"`
		Tolerations  []toleration      `json:"tolerations"`
	} `json:"scheduling"`
}

// toleration mirrors core/v1 Toleration.
type toleration struct {
	Key               string `json:"key"`
	Operator          string `json:"operator"`
	Value             string `json:"value"`
	Effect            string `json:"effect"`
	TolerationSeconds *int64 `json:"tolerationSeconds"`
}

// quantity is the resource.Quantity syntax this file uses.
var quantity = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$`)

// keyResource is the extended resource one pod VM of each TEE holds.
var keyResource = map[string]string{
	"sim": labels.ResourceSimSlot,
	"snp": labels.ResourceSNPASID,
	"tdx": labels.ResourceTDXKey,
}

// teeLabel is the node label the node agent sets where the TEE is usable.
var teeLabel = map[string]string{
	"sim": labels.LabelSim,
	"snp": labels.LabelSNP,
	"tdx": labels.LabelTDX,
}

func TestRuntimeClasses(t *testing.T) {
	out, err := Render("kubernetes/runtimeclasses.yaml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "kubernetes/runtimeclasses.yaml", out)

	handlers := dropInHandlers(t)
	taint, err := labels.ParseTaint(config.DefaultTaint)
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(out, "\n---\n")
	if len(docs) != len(config.TEENames) {
		t.Fatalf("%d RuntimeClasses, want one per TEE (%v)", len(docs), config.TEENames)
	}
	seen := map[string]bool{}
	for i, doc := range docs {
		var rc runtimeClass
		if err := yaml.UnmarshalStrict([]byte(doc), &rc); err != nil {
			t.Fatalf("document %d is not a RuntimeClass: %v", i, err)
		}
		tee := strings.TrimPrefix(rc.Metadata.Name, "c8s-")
		seen[tee] = true
		t.Run(rc.Metadata.Name, func(t *testing.T) {
			if rc.APIVersion != "node.k8s.io/v1" || rc.Kind != "RuntimeClass" {
				t.Fatalf("%s/%s", rc.APIVersion, rc.Kind)
			}
			if _, known := keyResource[tee]; !known || rc.Handler != rc.Metadata.Name {
				t.Fatalf("name %q handler %q: want c8s-<tee> for both", rc.Metadata.Name, rc.Handler)
			}
			// The handler is registered in containerd, with a config of
			// that TEE that the launcher loads.
			cfgPath, ok := handlers[rc.Handler]
			if !ok {
				t.Fatalf("handler %q is not in the containerd drop-in", rc.Handler)
			}
			name, ok := strings.CutPrefix(cfgPath, "/etc/")
			if !ok {
				t.Fatalf("handler %s ConfigPath %s is not under the sysconf dir", rc.Handler, cfgPath)
			}
			rendered, err := Render(name, paths)
			if err != nil {
				t.Fatalf("handler %s: ConfigPath %s is not a packaged file: %v", rc.Handler, cfgPath, err)
			}
			golden(t, name, rendered)
			cfg, err := config.Parse([]byte(rendered))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if cfg.Hypervisor.TEE != tee {
				t.Fatalf("%s has tee = %q, want %q", name, cfg.Hypervisor.TEE, tee)
			}
			if rc.Scheduling == nil || len(rc.Scheduling.NodeSelector) != 1 || rc.Scheduling.NodeSelector[teeLabel[tee]] != "true" {
				t.Fatalf("nodeSelector = %+v, want %s=true", rc.Scheduling, teeLabel[tee])
			}
			want := toleration{Key: taint.Key, Operator: "Equal", Value: taint.Value, Effect: taint.Effect}
			if len(rc.Scheduling.Tolerations) != 1 || fmt.Sprint(rc.Scheduling.Tolerations[0]) != fmt.Sprint(want) {
				t.Fatalf("tolerations = %+v, want %+v (the default taint)", rc.Scheduling.Tolerations, want)
			}
			if rc.Overhead == nil {
				t.Fatal("no overhead")
			}
			pf := rc.Overhead.PodFixed
			for k, v := range pf {
				if !quantity.MatchString(v) {
					t.Errorf("overhead %s = %q is not a quantity", k, v)
				}
			}
			// The memory overhead is the per-pod host cost discovery
			// sizes sim slots with.
			if want := fmt.Sprintf("%dMi", discovery.DefaultSlotOverheadMiB); pf["memory"] != want {
				t.Errorf("overhead memory = %q, want %s", pf["memory"], want)
			}
			if pf["cpu"] == "" {
				t.Error("no cpu overhead")
			}
			if pf[keyResource[tee]] != "1" || len(pf) != 3 {
				t.Errorf("overhead = %v, want memory, cpu and one %s", pf, keyResource[tee])
			}
		})
	}
	for _, tee := range config.TEENames {
		if !seen[tee] {
			t.Errorf("no RuntimeClass c8s-%s", tee)
		}
	}
}

// dropInHandlers returns the handlers of the packaged containerd drop-in
// and their ConfigPath.
func dropInHandlers(t *testing.T) map[string]string {
	t.Helper()
	out, err := Render("containerd/c8s.toml", paths)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					RuntimeType string            `toml:"runtime_type"`
					Options     map[string]string `toml:"options"`
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if err := toml.NewDecoder(bytes.NewReader([]byte(out))).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for name, rt := range cfg.Plugins["io.containerd.cri.v1.runtime"].Containerd.Runtimes {
		if rt.RuntimeType != "io.containerd.c8s.v2" {
			t.Errorf("handler %s has runtime_type %q", name, rt.RuntimeType)
		}
		m[name] = filepath.Clean(rt.Options["ConfigPath"])
	}
	return m
}

func TestEveryHandlerConfigIsPackaged(t *testing.T) {
	handlers := dropInHandlers(t)
	if len(handlers) != len(Configs) {
		t.Fatalf("%d handlers %v, %d packaged configs %v", len(handlers), handlers, len(Configs), Configs)
	}
	for h, path := range handlers {
		name := strings.TrimPrefix(path, "/etc/")
		if !slices.Contains(Configs, name) {
			t.Errorf("handler %s uses %s, which is not in Configs", h, path)
		}
		rendered, err := Render(name, paths)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.Parse([]byte(rendered)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
