package labels

import "strings"

// LabelTrustWithheld is set, to the reason (a Kubernetes reason: letters
// only), on a node that falls below the pod owners' policy (its chip or
// TCB revoked, or its TCB below the minimum); AnnotationTrustWithheld
// says why in a sentence. See Withhold.
const (
	LabelTrustWithheld      = "c8s.io/trust-withheld"
	AnnotationTrustWithheld = "c8s.io/trust-withheld"
)

// teeLabels are the labels that say pod VMs of a TEE can run here.
var teeLabels = []string{LabelSNP, LabelTDX, LabelSim}

// Withhold returns d for a node that falls below policy for reason: it
// advertises no pod VM capacity (every extended resource at 0, the
// c8s.io/tee.* labels gone, so neither the RuntimeClasses' node selectors
// nor their resource requests place a pod here) and carries
// LabelTrustWithheld. The trust pool, the trust shape, the taint and the
// Node Feature Discovery labels stay: they describe the hardware, not
// whether it is trusted.
func Withhold(d Desired, reason string) Desired {
	out := Desired{Labels: map[string]string{}, Taint: d.Taint}
	for k, v := range d.Labels {
		out.Labels[k] = v
	}
	for _, k := range teeLabels {
		delete(out.Labels, k)
	}
	if !validValue(reason) || reason == "" {
		reason = "BelowPolicy"
	}
	out.Labels[LabelTrustWithheld] = reason
	for _, r := range d.Resources {
		r.Count = 0
		out.Resources = append(out.Resources, r)
	}
	return out
}

// WithheldAnnotation returns the merge patch of the node's annotations
// that records message (empty: not withheld) in AnnotationTrustWithheld,
// or nil when the annotation already says so.
func WithheldAnnotation(current map[string]string, message string) map[string]any {
	message = strings.TrimSpace(message)
	cur, has := current[AnnotationTrustWithheld]
	switch {
	case message == "" && has:
		return map[string]any{AnnotationTrustWithheld: nil}
	case message != "" && cur != message:
		return map[string]any{AnnotationTrustWithheld: message}
	}
	return nil
}
