package podnet

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/internal/netnsdo"
)

// The kernel's refusals come back as their errno (Close tells a qdisc
// already gone, ENOENT/EINVAL, from a real failure), a missing interface
// is ENODEV, and a dump lists what the namespace holds.
func TestRTNLErrorsAndDumps(t *testing.T) {
	pod, _ := podNamespaces(t)
	err := netnsdo.Do(pod, func() error {
		c, err := openRTNL()
		if err != nil {
			return err
		}
		defer c.Close()
		eth0, err := c.linkByName("eth0")
		if err != nil {
			return err
		}
		if eth0.Kind != "veth" || eth0.MTU != 1400 || eth0.MAC.String() != podMAC.String() {
			t.Errorf("eth0 = %+v, want a veth with MTU 1400 and MAC %s", eth0, podMAC)
		}
		if _, err := c.linkByName("nope0"); !errors.Is(err, unix.ENODEV) {
			t.Errorf("linkByName of a missing interface: %v, want ENODEV", err)
		}
		if err := c.delIngress(eth0.Index); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("deleting a missing ingress qdisc: %v, want EINVAL or ENOENT", err)
		}
		if err := c.addIngress(eth0.Index); err != nil {
			return err
		}
		if err := c.addIngress(eth0.Index); !errors.Is(err, unix.EEXIST) {
			t.Errorf("adding the ingress qdisc twice: %v, want EEXIST", err)
		}
		if err := c.addRedirect(eth0.Index, 1<<30); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
			t.Errorf("a redirect to a missing interface: %v, want the kernel's refusal", err)
		}
		return c.delIngress(eth0.Index)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestParseMessagesRefusesBadLengths(t *testing.T) {
	msg := make([]byte, unix.SizeofNlMsghdr)
	msg[0] = 0xff // a length past the datagram
	if _, err := parseMessages(msg); err == nil {
		t.Fatal("parseMessages accepted a message longer than its datagram")
	}
	msg[0] = 4 // shorter than a header
	if _, err := parseMessages(msg); err == nil {
		t.Fatal("parseMessages accepted a message shorter than its header")
	}
}
