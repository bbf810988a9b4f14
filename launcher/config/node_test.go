package config

import (
	"strings"
	"testing"
)

func TestNodeTableDefaultsAndOverrides(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != (Node{Taint: DefaultTaint}) {
		t.Fatalf("default node table = %+v", c.Node)
	}
	c, err = Parse([]byte("[node]\nsim_slots = 2\ntrust_pool = \"ci\"\ntaint = \"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != (Node{SimSlots: 2, TrustPool: "ci"}) {
		t.Fatalf("node table = %+v", c.Node)
	}
	if _, err := Parse([]byte("[node]\nsim_slot = 2\n")); err == nil || !strings.Contains(err.Error(), `"node.sim_slot"`) {
		t.Fatalf("misspelt key: %v", err)
	}
}

func TestNodeSimSlotsValidated(t *testing.T) {
	c := validConfig(t)
	c.Node.SimSlots = -1
	if err := c.Validate(); err != nil {
		t.Fatalf("sim_slots = -1 (none) rejected: %v", err)
	}
	c.Node.SimSlots = -2
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "node.sim_slots -2") {
		t.Fatalf("sim_slots = -2: %v", err)
	}
}
