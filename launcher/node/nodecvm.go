package node

import (
	"context"
	"fmt"
	"time"

	"github.com/c8s-dev/c8s/launcher/node/cvm"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// DefaultNodeCVMInterval is how often a node-as-CVM attests itself again
// after a successful verification; a failed one is retried at every
// reconciliation.
const DefaultNodeCVMInterval = 10 * time.Minute

// selfAttest is the node-as-CVM state kept between reconciliations.
type selfAttest struct {
	tee      string
	attester *cvm.Attester
	last     *cvm.Result
}

// nodeCVMAnnotations returns the c8s.io/node-cvm.* annotations the node
// should carry: none when it is not a CVM, else the last verification,
// refreshed when it is older than the interval or failed.
func (a *Agent) nodeCVMAnnotations(ctx context.Context, c discovery.NodeCVMInfo) (map[string]string, *cvm.Result) {
	if c.TEE == "" {
		a.cvm = selfAttest{}
		return nil, nil
	}
	now := time.Now()
	if a.Now != nil {
		now = a.Now()
	}
	interval := a.NodeCVMInterval
	if interval <= 0 {
		interval = DefaultNodeCVMInterval
	}
	if a.cvm.tee != c.TEE {
		a.cvm = selfAttest{tee: c.TEE}
	}
	if l := a.cvm.last; l != nil && l.Verified && now.Sub(l.At) < interval {
		return l.Annotations(), l
	}
	var res cvm.Result
	if a.cvm.attester == nil {
		att, err := a.NodeCVM(c)
		switch {
		case err != nil:
			res = cvm.Result{TEE: c.TEE, Err: fmt.Errorf("setting up self-attestation: %w", err)}
		case att == nil:
			res = cvm.Result{TEE: c.TEE, Err: fmt.Errorf("no evidence source for a %s guest", c.TEE)}
		default:
			a.cvm.attester = att
		}
	}
	if a.cvm.attester != nil {
		res = a.cvm.attester.Attest(ctx, c.TEE)
	}
	a.cvm.last = &res
	return res.Annotations(), &res
}
