package labels

import "encoding/json"

// MergePatch renders p as a JSON merge patch (RFC 7386) for the Node
// object: labels to set, labels to remove as null, the owned-labels
// annotation, and, when they changed, the whole spec.taints list (a merge
// patch replaces lists). It returns nil for an empty patch.
func (p Patch) MergePatch() ([]byte, error) {
	if p.Empty() {
		return nil, nil
	}
	meta := map[string]any{}
	labels := map[string]any{}
	for k, v := range p.SetLabels {
		labels[k] = v
	}
	for _, k := range p.RemoveLabels {
		labels[k] = nil
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	if p.OwnedChanged {
		var v any = p.OwnedLabels
		if p.OwnedLabels == "" {
			v = nil
		}
		meta["annotations"] = map[string]any{OwnedLabelsAnnotation: v}
	}
	doc := map[string]any{}
	if len(meta) > 0 {
		doc["metadata"] = meta
	}
	if p.TaintsChanged {
		taints := p.Taints
		if taints == nil {
			taints = []Taint{}
		}
		doc["spec"] = map[string]any{"taints": taints}
	}
	return json.Marshal(doc)
}
