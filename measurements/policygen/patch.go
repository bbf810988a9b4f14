package policygen

import (
	"bytes"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/c8s-dev/c8s/guest/api/initdata"
)

// Patch returns the YAML stream data with each workload of results
// annotated with its init data (io.c8s.initdata on the pod: the Pod's
// metadata, a controller's pod template), as genpolicy annotates a
// workload with its policy. Other documents are kept as they are; the
// annotated ones keep their comments, though yaml.v3 re-indents them.
func Patch(data []byte, results []Result) ([]byte, error) {
	in, err := parseInput(data)
	if err != nil {
		return nil, err
	}
	byDoc := map[int]*Result{}
	for i := range results {
		byDoc[results[i].Doc] = &results[i]
	}
	var out bytes.Buffer
	first := true
	for i, doc := range in.docs {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if !first {
			out.WriteString("---\n")
		}
		first = false
		r := byDoc[i]
		if r == nil {
			out.Write(doc)
			if !bytes.HasSuffix(doc, []byte("\n")) {
				out.WriteString("\n")
			}
			continue
		}
		patched, err := annotate(doc, r)
		if err != nil {
			return nil, fmt.Errorf("YAML document %d (%s %s): %w", i+1, r.Kind, r.Name, err)
		}
		out.Write(patched)
	}
	return out.Bytes(), nil
}

// annotate sets the init data annotation on one workload's pod.
func annotate(doc []byte, r *Result) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, err
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("not a YAML mapping")
	}
	var path []string
	switch r.Kind {
	case "Pod":
		path = []string{"metadata", "annotations"}
	case "CronJob":
		path = []string{"spec", "jobTemplate", "spec", "template", "metadata", "annotations"}
	default:
		path = []string{"spec", "template", "metadata", "annotations"}
	}
	n := root.Content[0]
	for _, k := range path {
		n = child(n, k)
	}
	set(n, initdata.Annotation, r.Annotation)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// child returns the mapping under key k of mapping n, made if absent or
// null.
func child(n *yaml.Node, k string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == k {
			v := n.Content[i+1]
			if v.Kind != yaml.MappingNode {
				*v = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			}
			return v
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, v)
	return v
}

// set sets key k of mapping n to the string v.
func set(n *yaml.Node, k, v string) {
	val := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == k {
			n.Content[i+1] = val
			return
		}
	}
	n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, val)
}
